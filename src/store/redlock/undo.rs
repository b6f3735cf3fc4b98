//! Undoing what did not count: a grant short of its quorum, a finish
//! short of its quorum (owner-checked, on every node, retried in the
//! background for nodes that did not answer).

use std::time::Duration;

use futures_util::future::join_all;
use tokio::time::Instant;

use super::RedlockStore;
use crate::error::Error;
use crate::key::LockKey;
use crate::store::LockStore;
use crate::store::redis::RedisStore;
use crate::token::OwnerToken;

impl RedlockStore {
    /// Undoes a grant (or a finish, with `rollback`) that did not count:
    /// owner-checked, on the nodes `on` (indices; every node that may have
    /// granted), now; nodes that did not answer are tried again in the
    /// background until they do or `until` passes (a frozen node keeps the
    /// lock, or runs a queued finish late, after it is back — and a client
    /// may not even send a command queued behind one that timed out).
    pub(super) async fn undo(
        &self,
        on: &[usize],
        key: &LockKey,
        owner: &OwnerToken,
        rollback: bool,
        until: Instant,
    ) {
        let nodes: Vec<&RedisStore> = on.iter().map(|&i| &self.nodes[i]).collect();
        let answers = join_all(
            nodes
                .iter()
                .map(|node| undo_node(node, key, owner, rollback)),
        )
        .await;
        let mut pending: Vec<RedisStore> = nodes
            .into_iter()
            .zip(&answers)
            .filter(|(_, a)| a.is_err())
            .map(|(n, _)| n.clone())
            .collect();
        if pending.is_empty() || Instant::now() >= until {
            return;
        }
        let (key, owner) = (key.clone(), owner.clone());
        tokio::spawn(async move {
            let mut pause = Duration::from_millis(50);
            while !pending.is_empty() && Instant::now() < until {
                tokio::time::sleep(pause.min(until.saturating_duration_since(Instant::now())))
                    .await;
                pause = (pause * 2).min(Duration::from_secs(1));
                let answers = join_all(
                    pending
                        .iter()
                        .map(|node| undo_node(node, &key, &owner, rollback)),
                )
                .await;
                let mut answers = answers.iter();
                pending.retain(|_| answers.next().is_some_and(Result::is_err));
            }
        });
    }
}

/// Undoes a grant on one node (owner-checked): takes back the record it
/// may have written first, with `rollback`, then releases the lock.
async fn undo_node(
    node: &RedisStore,
    key: &LockKey,
    owner: &OwnerToken,
    rollback: bool,
) -> Result<bool, Error> {
    if rollback {
        node.rollback_record(key, owner).await?;
    }
    node.release(crate::store::LeaseKind::Lock, key, owner)
        .await
}
