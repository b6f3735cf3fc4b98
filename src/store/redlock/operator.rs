//! The operator's calls over Redlock's nodes: who holds a lock (the
//! majority view), a namespace's held locks, and an operator's release
//! that raises the fence on every node.

use std::time::{Duration, SystemTime};

use futures_util::future::join_all;

use super::RedlockStore;
use crate::error::{Error, Operation};
use crate::key::LockKey;
use crate::store::holder::{ForcedRelease, HolderInfo, HolderPage, ListCursor};
use crate::token::FencingToken;

impl RedlockStore {
    /// Asks every node who holds `key` and answers the majority view: the
    /// holder that a quorum of nodes shows (the lock is held only there),
    /// else nobody. Of that quorum: the token is the grant's (by the
    /// grant's rule: the quorum-th largest when every node shows the
    /// holder, else the largest),
    /// the lease left the quorum-th longest (the lock stands until fewer
    /// than a quorum hold it), the grant time the earliest, waiters
    /// marked on any node. Too few answers: unavailable.
    pub(super) async fn inspect_majority(
        &self,
        key: &LockKey,
    ) -> Result<Option<HolderInfo>, Error> {
        let answers = join_all(self.nodes.iter().map(|n| n.inspect_script(key))).await;
        let (seen, errors): (Vec<_>, Vec<_>) = answers.into_iter().partition(Result::is_ok);
        if seen.len() < self.quorum {
            let errors: Vec<Error> = errors.into_iter().filter_map(Result::err).collect();
            return Err(self.no_quorum(Operation::Inspect, key, seen.len(), &errors));
        }
        let held: Vec<HolderInfo> = seen.into_iter().filter_map(|a| a.ok().flatten()).collect();
        let q = self.quorum;
        let Some(first) = held
            .iter()
            .find(|h| held.iter().filter(|o| o.holder == h.holder).count() >= q)
        else {
            return Ok(None);
        };
        let agreeing: Vec<&HolderInfo> = held.iter().filter(|h| h.holder == first.holder).collect();
        let quorum_th = |mut v: Vec<u64>| {
            v.sort_unstable_by(|a, b| b.cmp(a));
            v.get(q - 1).copied()
        };
        // The grant's rule: the quorum-th largest when every node granted,
        // else the largest (which the grant wrote back).
        let tokens: Vec<u64> = agreeing
            .iter()
            .filter_map(|h| h.fencing_token.map(FencingToken::get))
            .collect();
        let token = if agreeing.len() == self.nodes.len() {
            quorum_th(tokens)
        } else {
            tokens.into_iter().max()
        }
        .map(FencingToken::new);
        let remaining = quorum_th(
            agreeing
                .iter()
                .filter_map(|h| h.remaining.map(|r| r.as_millis() as u64))
                .collect(),
        )
        .map(Duration::from_millis);
        let granted_at: Option<SystemTime> = agreeing.iter().filter_map(|h| h.granted_at).min();
        Ok(Some(HolderInfo {
            key: key.clone(),
            holder: first.holder,
            label: agreeing.iter().find_map(|h| h.label.clone()),
            fencing_token: token,
            granted_at,
            remaining,
            waiters: agreeing.iter().any(|h| h.waiters),
        }))
    }

    /// A page of `namespace`'s held locks: the first node's scan (the
    /// cursor is its), each lock then inspected on every node (the
    /// majority view). A lock held on a quorum is on at least one node of
    /// every quorum, but not always on the first node: with the first
    /// node down or missing a grant, the listing can miss locks. Listed
    /// from the node that answers, in order: the first that does.
    pub(super) async fn list_majority(
        &self,
        namespace: &str,
        cursor: &ListCursor,
        count: usize,
    ) -> Result<HolderPage, Error> {
        let mut last = None;
        for node in self.nodes.iter() {
            match node.list_scan(namespace, cursor, count).await {
                Ok(page) => {
                    let views =
                        join_all(page.locks.iter().map(|h| self.inspect_majority(&h.key))).await;
                    let mut locks = Vec::with_capacity(views.len());
                    for v in views {
                        if let Some(h) = v? {
                            locks.push(h);
                        }
                    }
                    return Ok(HolderPage {
                        locks,
                        next: page.next,
                    });
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| Error::Unavailable {
            op: Operation::List,
            key: None,
            source: "no Redlock node".into(),
        }))
    }

    /// Removes `key` on every node and raises the fence: each node's
    /// counter is raised to a fresh token, then every node to the largest
    /// of them, so that every node mints above it (a grant's token is one
    /// of those the nodes minted). Released when a quorum answered; the
    /// fence is answered only when every node took it (a node that missed
    /// it could mint below it and be part of the next quorum).
    pub(super) async fn force_release_everywhere(
        &self,
        key: &LockKey,
    ) -> Result<ForcedRelease, Error> {
        let answers = join_all(self.nodes.iter().map(|n| n.force_release_script(key))).await;
        let ok: Vec<ForcedRelease> = answers
            .iter()
            .filter_map(|a| a.as_ref().ok().copied())
            .collect();
        if ok.len() < self.quorum {
            let errors: Vec<Error> = answers.into_iter().filter_map(Result::err).collect();
            return Err(self.no_quorum(Operation::ForceRelease, key, ok.len(), &errors));
        }
        let released = ok.iter().any(|r| r.released);
        let Some(fence) = ok.iter().filter_map(|r| r.fence).max() else {
            return Ok(ForcedRelease {
                released,
                fence: None,
            });
        };
        let raised = join_all(self.nodes.iter().map(|n| n.raise_fence(key, fence, None))).await;
        let everywhere = ok.len() == self.nodes.len() && raised.iter().all(Result::is_ok);
        if !everywhere {
            tracing::warn!(
                key = %key,
                "force release: not every Redlock node raised its fence; no fence token answered"
            );
        }
        Ok(ForcedRelease {
            released,
            fence: everywhere.then_some(fence),
        })
    }
}
