//! Redlock over several independent Redis primaries.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::join_all;
use tokio::sync::watch;
use tokio::time::Instant;

use super::{AcquireOutcome, LockStore, ReleaseWatch, Renewal};
use crate::error::ConfigError;
use crate::locker::drift;
use crate::{Error, FencingToken, LockKey, Operation, OwnerToken, RedisStore};

/// The Redlock algorithm over N independent Redis primaries (use 5, or 3).
///
/// * a grant asks every node in parallel and holds when a majority
///   (N/2 + 1) granted within the validity `lease − elapsed − (lease/100 +
///   2 ms)`; otherwise it releases everywhere and reports the lock held (or
///   the store unavailable, when too few nodes answered to ever reach a
///   majority — the layer then fails closed);
/// * renewals and releases go to every node; a renewal holds when a
///   majority extended;
/// * waiters subscribe on every node and wake on any release.
///
/// Give each node a short command timeout
/// ([`RedisStore::with_command_timeout`], e.g. 50 ms): a silent node then
/// costs one timeout per attempt instead of the whole lease.
///
/// # Fencing, and what Redlock cannot promise
///
/// Each node mints its own token (`max(last + 1, TIME µs)`); the grant's
/// token is the largest of the majority's, written back to every granting
/// node's counter. Any two majorities share a node, so tokens increase
/// *while a majority keeps its data*. They do not survive more than a
/// minority losing state: a node restarted without persistence forgets its
/// locks and counters, and must stay out of service for at least one
/// maximum lease (or run with `appendfsync always`). Redlock also leans on
/// bounded clock drift and process pauses (Kleppmann's critique): the lease
/// validity is a local estimate, so protect the resource with the fencing
/// token, and prefer one primary with Sentinel and `WAIT` when you need
/// ordered tokens across failures.
#[derive(Clone, Debug)]
pub struct RedlockStore {
    nodes: Arc<[RedisStore]>,
    quorum: usize,
}

impl RedlockStore {
    /// Redlock over `nodes` (at least 1; use an odd number, 3 or 5).
    pub fn new(nodes: Vec<RedisStore>) -> Result<Self, ConfigError> {
        if nodes.is_empty() {
            return Err(ConfigError::new("nodes", "need at least one node"));
        }
        let quorum = nodes.len() / 2 + 1;
        Ok(RedlockStore {
            nodes: nodes.into(),
            quorum,
        })
    }

    /// How many nodes must agree.
    pub fn quorum(&self) -> usize {
        self.quorum
    }

    /// The nodes.
    pub fn nodes(&self) -> &[RedisStore] {
        &self.nodes
    }

    fn no_quorum(&self, op: Operation, key: &LockKey, answered: usize) -> Error {
        Error::Unavailable {
            op,
            key: Some(key.clone()),
            source: format!(
                "only {answered} of {} Redlock nodes answered; {} needed",
                self.nodes.len(),
                self.quorum
            )
            .into(),
        }
    }

    async fn release_everywhere(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
    ) -> Vec<Result<bool, Error>> {
        join_all(self.nodes.iter().map(|n| n.release(key, owner))).await
    }
}

impl LockStore for RedlockStore {
    fn instance_id(&self) -> usize {
        Arc::as_ptr(&self.nodes).cast::<()>() as usize
    }

    async fn acquire(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        lease: Duration,
    ) -> Result<AcquireOutcome, Error> {
        let start = Instant::now();
        let answers = join_all(self.nodes.iter().map(|n| n.acquire(key, owner, lease))).await;
        let elapsed = start.elapsed();
        let mut granted: Vec<(usize, FencingToken)> = Vec::new();
        let mut held: Vec<Option<Duration>> = Vec::new();
        for (i, a) in answers.iter().enumerate() {
            match a {
                Ok(AcquireOutcome::Granted(t)) => granted.push((i, *t)),
                Ok(AcquireOutcome::Held { remaining }) => held.push(*remaining),
                Ok(AcquireOutcome::Completed(_)) | Err(_) => {}
            }
        }
        let valid = lease.saturating_sub(elapsed).saturating_sub(drift(lease));
        if granted.len() >= self.quorum && !valid.is_zero() {
            let token = granted
                .iter()
                .map(|&(_, t)| t)
                .max()
                .unwrap_or(FencingToken::new(0));
            // Write the token back so the next majority, which shares a node
            // with this one, mints a larger one.
            join_all(
                granted
                    .iter()
                    .map(|&(i, _)| self.nodes[i].raise_fence(key, token)),
            )
            .await;
            return Ok(AcquireOutcome::Granted(token));
        }
        // No majority (or no time left): undo everywhere, owner-checked.
        self.release_everywhere(key, owner).await;
        if granted.len() + held.len() < self.quorum {
            return Err(self.no_quorum(Operation::Acquire, key, granted.len() + held.len()));
        }
        Ok(AcquireOutcome::Held {
            remaining: held.into_iter().flatten().min(),
        })
    }

    async fn extend(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        lease: Duration,
    ) -> Result<bool, Error> {
        let answers = join_all(self.nodes.iter().map(|n| n.extend(key, owner, lease))).await;
        let ok = answers.iter().filter(|a| matches!(a, Ok(true))).count();
        let answered = answers.iter().filter(|a| a.is_ok()).count();
        if ok >= self.quorum {
            Ok(true)
        } else if answered >= self.quorum {
            Ok(false)
        } else {
            Err(self.no_quorum(Operation::Extend, key, answered))
        }
    }

    async fn extend_many(&self, renewals: &[Renewal]) -> Result<Vec<bool>, Error> {
        let per_node = join_all(self.nodes.iter().map(|n| n.extend_many(renewals))).await;
        let answered = per_node.iter().filter(|a| a.is_ok()).count();
        let mut ok = vec![0usize; renewals.len()];
        for answers in per_node.iter().flatten() {
            for (count, &extended) in ok.iter_mut().zip(answers) {
                *count += usize::from(extended);
            }
        }
        if answered < self.quorum && ok.iter().any(|&n| n < self.quorum) {
            return Err(Error::Unavailable {
                op: Operation::Extend,
                key: None,
                source: format!(
                    "only {answered} of {} Redlock nodes answered",
                    self.nodes.len()
                )
                .into(),
            });
        }
        Ok(ok.into_iter().map(|n| n >= self.quorum).collect())
    }

    async fn release(&self, key: &LockKey, owner: &OwnerToken) -> Result<bool, Error> {
        let answers = self.release_everywhere(key, owner).await;
        let released = answers.iter().filter(|a| matches!(a, Ok(true))).count();
        if released == 0 && answers.iter().all(|a| a.is_err()) {
            return Err(self.no_quorum(Operation::Release, key, 0));
        }
        Ok(released >= self.quorum)
    }

    async fn finish(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        record: Bytes,
        retention: Duration,
    ) -> Result<bool, Error> {
        let answers = join_all(
            self.nodes
                .iter()
                .map(|n| n.finish(key, owner, record.clone(), retention)),
        )
        .await;
        let stored = answers.iter().filter(|a| matches!(a, Ok(true))).count();
        if stored < self.quorum {
            // Not on a majority: take the lock down everywhere; the record
            // may survive on a minority, where reads still find it.
            self.release_everywhere(key, owner).await;
        }
        Ok(stored >= self.quorum)
    }

    async fn read_record(&self, key: &LockKey) -> Result<Option<Bytes>, Error> {
        let answers = join_all(self.nodes.iter().map(|n| n.read_record(key))).await;
        let answered = answers.iter().filter(|a| a.is_ok()).count();
        if let Some(found) = answers.iter().flatten().flatten().next() {
            return Ok(Some(found.clone()));
        }
        if answered < self.quorum {
            return Err(self.no_quorum(Operation::Acquire, key, answered));
        }
        Ok(None)
    }

    async fn subscribe(&self, key: &LockKey) -> Result<ReleaseWatch, Error> {
        let watches: Vec<ReleaseWatch> = join_all(self.nodes.iter().map(|n| n.subscribe(key)))
            .await
            .into_iter()
            .flatten()
            .filter(ReleaseWatch::is_active)
            .collect();
        if watches.is_empty() {
            return Ok(ReleaseWatch::never());
        }
        // One watch that fires when any node announces a release.
        let (tx, rx) = watch::channel(0u64);
        let forward = tokio::spawn(async move {
            let mut watches = watches;
            loop {
                let any = futures_util::future::select_all(
                    watches.iter_mut().map(|w| Box::pin(w.released())),
                );
                any.await;
                if tx.is_closed() {
                    return;
                }
                tx.send_modify(|n| *n = n.wrapping_add(1));
            }
        });
        Ok(ReleaseWatch::new(rx).with_guard(AbortOnDrop(forward)))
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
