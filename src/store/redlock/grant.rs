//! A grant: every node asked at once, answered at a quorum; the token
//! written back where it is needed; the stragglers in the background.

use std::time::Duration;

use futures_util::stream::StreamExt;
use tokio::time::Instant;

use super::RedlockStore;
use super::quorum::{self, gather};
use crate::error::{Error, Operation};
use crate::key::LockKey;
use crate::store::holder::HolderLabel;
use crate::store::redis::RedisStore;
use crate::store::{AcquireOutcome, LockStore};
use crate::time::drift;
use crate::token::{FencingToken, OwnerToken};

impl RedlockStore {
    /// The grant: asks every node at once, answers at a quorum.
    pub(super) async fn grant_lock(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        lease: Duration,
        label: Option<&HolderLabel>,
    ) -> Result<AcquireOutcome, Error> {
        let start = Instant::now();
        let label = label.cloned();
        let (n, q) = (self.nodes.len(), self.quorum);
        let (k, o) = (key.clone(), owner.clone());
        // Answer as soon as a quorum granted, or refusals and failures
        // leave no quorum possible.
        let (mut answers, mut stragglers) = gather(
            self.indexed(),
            move |node| {
                let (k, o, l) = (k.clone(), o.clone(), label.clone());
                async move { node.acquire_script(&k, &o, lease, false, l.as_ref()).await }
            },
            |a| {
                let granted = a.iter().filter(|(_, r)| is_granted(r)).count();
                granted >= q || a.len() - granted > n - q
            },
        )
        .await;
        // Validity is judged here, when the quorum answered: what follows
        // (the wait for the other nodes, a write-back) may use what is
        // left of it, never turn a grant made in time into a refusal.
        let at_quorum = Instant::now();
        let valid_until = start + lease.saturating_sub(drift(lease));
        // A quorum of fenced grants: if the other nodes grant too, the
        // token counts without a write-back (see `counted_without_write_back`).
        // Wait for them as long again as the quorum took (about what the
        // write-back round would cost); for a re-entry, whose token is its
        // grant's only when every node answers, as long as it takes. Never
        // longer than half the validity left: a slow node is then a
        // straggler, and the write-back runs as usual.
        let fenced = |a: &Result<(AcquireOutcome, bool), Error>| {
            matches!(a, Ok((AcquireOutcome::Granted(_), _)))
        };
        if !stragglers.is_empty()
            && answers.len() >= q
            && at_quorum < valid_until
            && answers.iter().all(|(_, a)| fenced(a))
        {
            let reentry = answers.iter().any(|(_, a)| matches!(a, Ok((_, true))));
            let half_left = (valid_until - at_quorum) / 2;
            let wait = if reentry {
                half_left
            } else {
                (at_quorum - start).min(half_left)
            };
            let until = at_quorum + wait;
            while let Ok(Some(late)) = tokio::time::timeout_at(until, stragglers.next()).await {
                let more = fenced(&late.1);
                answers.push(late);
                if !more {
                    break;
                }
            }
        }
        // Each node's token: a fresh mint, or where the lock was ours
        // already, its counter (which holds the mint made when it was
        // taken there, see acquire.lua).
        let mut granted: Vec<(usize, FencingToken)> = Vec::new();
        let mut held: Vec<Option<Duration>> = Vec::new();
        // Nodes that granted without fencing (`fencing(false)` on the store builder).
        let mut unfenced = 0;
        for (i, a) in &answers {
            match a {
                Ok((AcquireOutcome::Granted(t), _)) => granted.push((*i, *t)),
                Ok((AcquireOutcome::GrantedUnfenced, _)) => unfenced += 1,
                Ok((AcquireOutcome::Held { remaining }, _)) => held.push(*remaining),
                Ok((AcquireOutcome::Completed(_), _)) | Err(_) => {}
            }
        }
        // Where the grant may have happened (answered granted, or failed);
        // the nodes still working are handled with the stragglers.
        let maybe: Vec<usize> = answers
            .iter()
            .filter(|(_, a)| a.is_err() || is_granted(a))
            .map(|&(i, _)| i)
            .collect();
        let in_time = at_quorum < valid_until;
        let outcome = if unfenced > 0 && granted.len() + unfenced >= q && in_time {
            // Nodes without fencing: the grant has no token (there is none
            // to write back), whatever the other nodes minted.
            Ok(AcquireOutcome::GrantedUnfenced)
        } else if granted.len() >= q && in_time {
            self.count_grant(key, owner, (lease, start), &granted, &maybe)
                .await
        } else if granted.len() + unfenced >= q {
            // A majority granted, but only after the validity: nobody
            // holds the lock (no contention); the store is too slow for
            // this lease. Undone, owner-checked.
            self.undo(&maybe, key, owner, false, start + lease).await;
            Err(self.too_late(key, "granted", at_quorum - start, lease))
        } else {
            // No majority: undo, owner-checked.
            self.undo(&maybe, key, owner, false, start + lease).await;
            let answered = granted.len() + unfenced + held.len();
            if answered < q {
                let errors = answers.iter().filter_map(|(_, a)| a.as_ref().err());
                Err(self.no_quorum(Operation::Acquire, key, answered, errors))
            } else {
                Ok(AcquireOutcome::Held {
                    remaining: held.into_iter().flatten().min(),
                })
            }
        };
        // The nodes that have not answered yet finish in the background. A
        // late grant of a lock that counts is ours like the others (the
        // guard's release goes to every node); of one that does not, it is
        // released there at once (owner-checked: never a later holder's).
        let keep = matches!(
            outcome,
            Ok(AcquireOutcome::Granted(_) | AcquireOutcome::GrantedUnfenced)
        );
        let nodes = self.nodes.clone();
        let (k, o) = (key.clone(), owner.clone());
        quorum::in_background(stragglers, move |i, late| {
            let (node, k, o) = (nodes[i].clone(), k.clone(), o.clone());
            async move {
                if !keep && is_granted(&late) {
                    let _ = node.release(crate::store::LeaseKind::Lock, &k, &o).await;
                }
            }
        });
        outcome
    }

    /// The nodes with their indices, for [`gather`].
    pub(super) fn indexed(&self) -> impl Iterator<Item = (usize, RedisStore)> + '_ {
        self.nodes.iter().cloned().enumerate()
    }

    /// Writes `token` back to the granting nodes whose own counter is below
    /// it, so that the next majority, which shares a node with this one,
    /// mints a larger one; answers how many nodes hold a counter at least
    /// as large, counting at a quorum (the rest finish in the background).
    /// Where the lock is still `owner`'s, the node's holder record takes
    /// the token too, so that the majority view (`inspect`) shows it
    /// whatever a node that grants after this answer minted.
    async fn write_back(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        token: FencingToken,
        granted: &[(usize, FencingToken)],
    ) -> usize {
        let q = self.quorum;
        let at_token = granted.iter().filter(|&&(_, t)| t == token).count();
        if at_token >= q {
            return at_token;
        }
        let below = granted
            .iter()
            .filter(|&&(_, t)| t < token)
            .map(|&(i, _)| (i, self.nodes[i].clone()));
        let (k, o) = (key.clone(), owner.clone());
        let (answers, stragglers) = gather(
            below,
            move |node| {
                let (k, o) = (k.clone(), o.clone());
                async move { node.raise_fence(&k, token, Some(&o)).await }
            },
            |a| at_token + a.iter().filter(|(_, r)| r.is_ok()).count() >= q,
        )
        .await;
        quorum::in_background(stragglers, |_, _| async {});
        at_token + answers.iter().filter(|(_, r)| r.is_ok()).count()
    }

    /// The token of a grant that every node made: the quorum-th largest
    /// of their tokens, which counts as it is, with no write-back. Each
    /// node's token is above what its counter held when the last counted
    /// token T′ was given out: a fresh mint is above the counter; where
    /// the lock was ours already (an earlier attempt of this owner), the
    /// counter holds the mint made when the lock was taken there, which
    /// the holder of T′ had to have let go of first.
    ///
    /// * A quorum of the counters hold it or more (the quorum-th largest
    ///   and those above it): the next majority shares one of those nodes
    ///   and mints above it.
    /// * The nodes whose token is at most it are N − quorum + 1, so they
    ///   share a node with the majority that holds T′ (N − quorum + 1 +
    ///   quorum > N), whose token is above T′: so is this one.
    ///
    /// It is also the token a re-entry by every node answers again, as
    /// long as no other lock of the bucket minted meanwhile (the counters
    /// are the grant's mints) — and after a grant that wrote its token T
    /// back, too: a majority of the counters hold T, so fewer than a
    /// majority are below it or above it, and the quorum-th largest is T. The largest token is not safe here without
    /// a write-back: only the nodes that minted it hold it. The smallest is
    /// not safe at all: it may come from a node outside the last majority.
    /// With fewer than N tokens no choice meets both conditions, and the
    /// write-back decides.
    fn counted_without_write_back(
        &self,
        granted: &[(usize, FencingToken)],
    ) -> Option<FencingToken> {
        let n = self.nodes.len();
        if granted.len() < n {
            return None;
        }
        let mut tokens: Vec<FencingToken> = granted.iter().map(|&(_, t)| t).collect();
        tokens.sort_unstable();
        Some(tokens[n - self.quorum])
    }

    /// A grant on a quorum: its token, once a quorum holds a counter at
    /// least as large (see [`counted_without_write_back`] when every node
    /// granted; otherwise the largest token, written back); undone
    /// otherwise.
    ///
    /// [`counted_without_write_back`]: Self::counted_without_write_back
    async fn count_grant(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        (lease, start): (Duration, Instant),
        granted: &[(usize, FencingToken)],
        maybe: &[usize],
    ) -> Result<AcquireOutcome, Error> {
        if let Some(token) = self.counted_without_write_back(granted) {
            return Ok(AcquireOutcome::Granted(token));
        }
        let token = granted
            .iter()
            .map(|&(_, t)| t)
            .max()
            .unwrap_or(FencingToken::new(0));
        let acks = self.write_back(key, owner, token, granted).await;
        if acks >= self.quorum {
            // The token counts from now: a grant that counts only after
            // its validity would hand out a guard lost from the start.
            if Instant::now() < start + lease.saturating_sub(drift(lease)) {
                return Ok(AcquireOutcome::Granted(token));
            }
            self.undo(maybe, key, owner, false, start + lease).await;
            return Err(self.too_late(
                key,
                "the fencing token written back",
                start.elapsed(),
                lease,
            ));
        }
        self.undo(maybe, key, owner, false, start + lease).await;
        Err(Error::Unavailable {
            op: Operation::Acquire,
            key: Some(key.clone()),
            source: format!(
                "the fencing token reached only {acks} of {} Redlock nodes; {} needed",
                self.nodes.len(),
                self.quorum
            )
            .into(),
        })
    }
}

fn is_granted(answer: &Result<(AcquireOutcome, bool), Error>) -> bool {
    matches!(
        answer,
        Ok((
            AcquireOutcome::Granted(_) | AcquireOutcome::GrantedUnfenced,
            _
        ))
    )
}
