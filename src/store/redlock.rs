//! Redlock over several independent Redis primaries.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::{BoxFuture, join_all, select_all};
use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use super::holder::{ForcedRelease, HolderInfo, HolderPage, ListCursor};
use super::{
    AcquireOutcome, Ask, Grant, LeaseKind, LockStore, OperatorStore, ReleaseWatch, Renewal,
};
use crate::error::ConfigError;
use crate::error::{Error, Operation};
use crate::key::LockKey;
use crate::store::redis::RedisStore;
use crate::token::OwnerToken;
use quorum::{gather, tally};

/// The Redlock algorithm over N independent Redis primaries (use 5, or 3).
///
/// * a grant asks every node in parallel and holds when a majority
///   (N/2 + 1) granted within the validity `lease − elapsed − (lease/100 +
///   2 ms)`, `elapsed` measured when the majority answered (nothing done
///   after that, such as waiting for the other nodes, turns a grant made
///   in time into a refusal); otherwise it releases everywhere and reports
///   the lock held when other owners hold it, or the store unavailable
///   when too few nodes answered to ever reach a majority, or when the
///   majority granted only after the validity (nobody holds the lock: it
///   is no contention, the nodes are too slow for the lease) — the layer
///   then fails closed. It answers as soon as a
///   majority granted (or too many refused): the nodes still working
///   finish in the background, where a late grant of a lock that counts
///   stays (the release goes to every node, behind it on that node's
///   connection) and one of a lock that does not count is released at
///   once, owner-checked;
/// * renewals, releases and finishes go to every node and answer at a
///   majority (a renewal holds when a majority extended; each renewal of
///   a batch is decided on its own): the other nodes do theirs in the
///   background, so a frozen minority holds none of them back;
/// * an owner-checked write (extend, release, finish) answers `Ok(true)` on
///   a majority of yes, `Ok(false)` ("not the owner") only when definite
///   refusals leave no majority possible, and otherwise
///   [`Error::Unavailable`]: the watchdog retries a renewal and the lease
///   deadline decides, a release is retried by the guard. Each renewal of
///   a [`renew_many`](LockStore::renew_many) batch is judged on its own;
/// * a grant, or a finish, that does not count is undone on every node
///   (owner-checked); nodes that did not answer are tried again in the
///   background until the lease (for a finish, up to a minute) is over —
///   a frozen node runs queued commands late;
/// * a finish stores the record with its writer's owner token; one that
///   misses its majority deletes the records it wrote (never a later
///   holder's). [`read_record`](LockStore::read_record) replays a record
///   only when a majority holds the same bytes, answers `None` when that
///   is impossible, and `Unavailable` when too few nodes answered to tell;
/// * waiters subscribe on every node and wake on any release; the
///   subscription answers at a quorum (a slow node joins when it answers).
///
/// Give each node a short command timeout
/// ([`RedisStoreBuilder::command_timeout`](crate::RedisStoreBuilder::command_timeout), e.g. 50 ms): a silent node then
/// costs one timeout per attempt instead of the whole lease.
///
/// # Fencing, and what Redlock cannot promise
///
/// Each node mints its own token (`max(last + 1, TIME µs)`). The token
/// counts only once a majority holds a counter at least as large, so that
/// the next majority, which shares a node with it, mints above it:
///
/// * when every node granted with a fresh mint (the usual case: the grant
///   waits for the nodes after the majority's answers as long again as the
///   majority took, and at most half the validity left), the token is the
///   majority-th largest mint: a majority
///   minted it or more, and the nodes that minted it or less are enough to
///   share one with the majority of the last counted token, so it is above
///   that one. Nothing is written back;
/// * otherwise the token is the largest of the majority's, written back to
///   the counters of the granting nodes that minted less (it counts once a
///   majority acknowledged it, the node that minted it included); short of
///   that, or when the acknowledgements come only after the validity, the
///   grant is undone and the acquire answers [`Error::Unavailable`];
/// * a re-entry (the same owner asking again, as a retried attempt whose
///   answer was lost would) answers its grant's token when every node
///   answers it: it waits for all of them, up to half its validity. Each
///   node answers its counter; with all of them, the rule above gives the
///   grant's token back, and with fewer it cannot be told apart from
///   them. With a node silent past that wait, it answers the largest
///   counter of the majority, written back: at least its grant's token,
///   and below every later holder's. On every Redis store the counters are
///   per fencing bucket, so a re-entry after another lock of the same
///   bucket was granted, or asked for while held (an attempt that finds a
///   lock held may raise the counter to the node's clock), answers a
///   larger token (still valid for the hold). A guard's own re-entry ([`LockGuard::reenter`](crate::LockGuard::reenter))
///   sends nothing to the store and always keeps the token.
///
/// Any two majorities share a node, so tokens increase
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

mod grant;
mod operator;
mod quorum;
mod undo;

/// How long an undone finish keeps trying nodes that did not answer.
const UNDO_FOR: Duration = Duration::from_secs(60);

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

    /// [`RedisStore::check`] on every node at once: `Ok` when a quorum of
    /// them answers (the store can grant), else the first node's error
    /// among those that failed. A node the store refuses
    /// ([`Error::Config`]: an evicting `maxmemory-policy`, scripting
    /// unavailable) fails the check even with a quorum of others: it is
    /// not an outage that passes, but a setting to fix (or, for the
    /// policy, to opt out of on that node's builder).
    pub async fn check(&self) -> Result<(), Error> {
        let answers =
            futures_util::future::join_all(self.nodes.iter().map(RedisStore::check)).await;
        let (refused, answers): (Vec<_>, Vec<_>) = answers
            .into_iter()
            .partition(|a| matches!(a, Err(Error::Config(_))));
        if let Some(refused) = refused.into_iter().next() {
            return refused;
        }
        let ok = answers.iter().filter(|a| a.is_ok()).count();
        if ok >= self.quorum {
            return Ok(());
        }
        match answers.into_iter().find_map(Result::err) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// The nodes.
    pub fn nodes(&self) -> &[RedisStore] {
        &self.nodes
    }

    /// Too few nodes answered: [`Error::Auth`] when a node refused the
    /// credentials (the cause of that failure, not the count, is what to
    /// fix), else [`Error::Unavailable`]; either names the first such
    /// node error with its causes.
    fn no_quorum<'a>(
        &self,
        op: Operation,
        key: &LockKey,
        answered: usize,
        errors: impl IntoIterator<Item = &'a Error>,
    ) -> Error {
        let errors: Vec<&Error> = errors.into_iter().collect();
        let auth = errors.iter().find(|e| matches!(e, Error::Auth { .. }));
        let mut text = format!(
            "only {answered} of {} Redlock nodes answered; {} needed",
            self.nodes.len(),
            self.quorum
        );
        if let Some(e) = auth.or(errors.first()) {
            let mut cause: Option<&dyn std::error::Error> = Some(*e);
            while let Some(c) = cause {
                text.push_str(": ");
                text.push_str(&c.to_string());
                cause = c.source();
            }
        }
        let key = Some(key.clone());
        let source = text.into();
        if auth.is_some() {
            Error::Auth { op, key, source }
        } else {
            Error::Unavailable { op, key, source }
        }
    }

    /// A grant that counted (`what` happened on a majority) only after
    /// `took`, past its validity (`lease` minus drift): nobody holds the
    /// lock, so it is no contention; the store is too slow for this lease.
    fn too_late(&self, key: &LockKey, what: &str, took: Duration, lease: Duration) -> Error {
        Error::Unavailable {
            op: Operation::Acquire,
            key: Some(key.clone()),
            source: format!(
                "{what} on a majority of the Redlock nodes only after {took:?}, \
                 past the validity of the {lease:?} lease"
            )
            .into(),
        }
    }

    /// Runs the owner-checked write `op` on every node at once and answers
    /// `(yes, no)` once a quorum said yes or refusals leave none possible
    /// (or every node answered); the other nodes finish in the background,
    /// so a frozen minority holds the answer back by nothing.
    async fn at_quorum<F>(&self, op: impl Fn(RedisStore) -> F) -> (usize, usize)
    where
        F: Future<Output = Result<bool, Error>> + Send + 'static,
    {
        let (n, q) = (self.nodes.len(), self.quorum);
        let (answers, stragglers) = gather(self.indexed(), op, |a| {
            let (yes, no) = tally(a.iter().map(|(_, r)| r));
            yes >= q || no > n - q
        })
        .await;
        quorum::in_background(stragglers, |_, _| async {});
        tally(answers.iter().map(|(_, r)| r))
    }

    /// The verdict on an owner-checked write (extend, release, finish)
    /// from `yes` nodes that did it and `no` nodes that definitely refused
    /// (not the owner): `true` on a quorum of yes, `false` only when the
    /// refusals leave no quorum possible, and otherwise "unavailable" — too
    /// few answers to tell; the caller retries and the lease deadline
    /// decides.
    fn verdict(&self, op: Operation, key: &LockKey, yes: usize, no: usize) -> Result<bool, Error> {
        if yes >= self.quorum {
            Ok(true)
        } else if no > self.nodes.len() - self.quorum {
            Ok(false)
        } else {
            Err(Error::Unavailable {
                op,
                key: Some(key.clone()),
                source: format!(
                    "{yes} of {} Redlock nodes agreed and {no} refused; {} needed either way",
                    self.nodes.len(),
                    self.quorum
                )
                .into(),
            })
        }
    }
}

impl LockStore for RedlockStore {
    fn instance_id(&self) -> usize {
        Arc::as_ptr(&self.nodes).cast::<()>() as usize
    }

    async fn check(&self) -> Result<(), Error> {
        RedlockStore::check(self).await
    }

    async fn grant(&self, grant: Grant<'_>) -> Result<AcquireOutcome, Error> {
        let (key, owner, lease) = (grant.key, grant.owner, grant.lease);
        let Ask::Lock { replay } = grant.ask else {
            return Err(super::unsupported_kind(grant.kind()));
        };
        let outcome = self.grant_lock(key, owner, lease, grant.label).await?;
        if replay {
            super::replay_after_grant(self, key, owner, outcome).await
        } else {
            Ok(outcome)
        }
    }

    async fn renew(
        &self,
        kind: LeaseKind,
        key: &LockKey,
        owner: &OwnerToken,
        lease: Duration,
    ) -> Result<bool, Error> {
        if kind != LeaseKind::Lock {
            return Err(super::unsupported_kind(kind));
        }
        let (k, o) = (key.clone(), owner.clone());
        let (yes, no) = self
            .at_quorum(move |node| {
                let (k, o) = (k.clone(), o.clone());
                async move { node.renew(LeaseKind::Lock, &k, &o, lease).await }
            })
            .await;
        self.verdict(Operation::Extend, key, yes, no)
    }

    /// On every node at once, each node's step owner-checked: of two
    /// callers handing the same owner over, at most one gets a quorum.
    async fn transfer(
        &self,
        key: &LockKey,
        from: &OwnerToken,
        to: &OwnerToken,
        lease: Duration,
    ) -> Result<bool, Error> {
        let (k, f, t) = (key.clone(), from.clone(), to.clone());
        let (yes, no) = self
            .at_quorum(move |node| {
                let (k, f, t) = (k.clone(), f.clone(), t.clone());
                async move { node.transfer(&k, &f, &t, lease).await }
            })
            .await;
        self.verdict(Operation::Extend, key, yes, no)
    }

    async fn renew_many(&self, renewals: &[Renewal]) -> Vec<Result<bool, Error>> {
        // Decided once every renewal of the batch is (a quorum of yes, or
        // refusals leaving none possible); the other nodes renew in the
        // background.
        let (n, q) = (self.nodes.len(), self.quorum);
        let batch: Arc<[Renewal]> = renewals.into();
        let each = |per_node: &[(usize, Vec<Result<bool, Error>>)], i: usize| {
            tally(per_node.iter().filter_map(|(_, answers)| answers.get(i)))
        };
        let (per_node, stragglers) = gather(
            self.indexed(),
            move |node| {
                let batch = batch.clone();
                async move { node.renew_many(&batch).await }
            },
            |a| {
                (0..renewals.len()).all(|i| {
                    let (yes, no) = each(a, i);
                    yes >= q || no > n - q
                })
            },
        )
        .await;
        quorum::in_background(stragglers, |_, _| async {});
        renewals
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let (yes, no) = each(&per_node, i);
                self.verdict(Operation::Extend, &r.key, yes, no)
            })
            .collect()
    }

    async fn release(
        &self,
        kind: LeaseKind,
        key: &LockKey,
        owner: &OwnerToken,
    ) -> Result<bool, Error> {
        if kind != LeaseKind::Lock {
            return Err(super::unsupported_kind(kind));
        }
        // Decided at a quorum of yes, or when refusals leave none possible;
        // the other nodes release in the background.
        let (k, o) = (key.clone(), owner.clone());
        let (yes, no) = self
            .at_quorum(move |node| {
                let (k, o) = (k.clone(), o.clone());
                async move { node.release(LeaseKind::Lock, &k, &o).await }
            })
            .await;
        self.verdict(Operation::Release, key, yes, no)
    }

    async fn finish(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        record: Bytes,
        retention: Duration,
    ) -> Result<bool, Error> {
        // Decided at a quorum, like a release: a node still working stores
        // the record and releases in the background (a finish that
        // counted), or has it taken back by the undo below, which is
        // queued behind it on that node's connection and retried.
        let (k, o) = (key.clone(), owner.clone());
        let (yes, no) = self
            .at_quorum(move |node| {
                let (k, o, record) = (k.clone(), o.clone(), record.clone());
                async move { node.finish_marked(&k, &o, record, retention).await }
            })
            .await;
        if yes < self.quorum {
            // Not on a majority: take back the record wherever it may have
            // been written (owner-checked: never a later holder's), and the
            // lock with it. Nodes that do not answer are tried again for a
            // while: one may run the queued finish late.
            let every: Vec<usize> = (0..self.nodes.len()).collect();
            let until = Instant::now() + retention.min(UNDO_FOR);
            self.undo(&every, key, owner, true, until).await;
        }
        self.verdict(Operation::Release, key, yes, no)
    }

    async fn read_record(&self, key: &LockKey) -> Result<Option<Bytes>, Error> {
        let answers = join_all(self.nodes.iter().map(|n| n.read_record(key))).await;
        let answered = answers.iter().filter(|a| a.is_ok()).count();
        // A record counts only where a quorum holds it (a finish that
        // missed its quorum is no completed work). The same bytes on a
        // quorum: replay them. Every record missing from more nodes than a
        // quorum allows: none. Otherwise too few nodes answered to tell.
        let found: Vec<&Bytes> = answers.iter().flatten().flatten().collect();
        let mut undecided = false;
        for candidate in &found {
            let holders = found.iter().filter(|r| **r == *candidate).count();
            if holders >= self.quorum {
                return Ok(Some((*candidate).clone()));
            }
            if answered - holders <= self.nodes.len() - self.quorum {
                undecided = true;
            }
        }
        if undecided || answered <= self.nodes.len() - self.quorum {
            let errors = answers.iter().filter_map(|a| a.as_ref().err());
            return Err(self.no_quorum(Operation::Acquire, key, answered, errors));
        }
        Ok(None)
    }

    async fn subscribe(&self, key: &LockKey) -> Result<ReleaseWatch, Error> {
        // One watch that fires when any node announces a release. It is
        // handed out once a quorum of nodes answered the subscription (a
        // grant needs a quorum, so a release that matters frees one of
        // those); a frozen node joins in the background when it answers,
        // instead of holding the waiter back by a command timeout.
        let (tx, rx) = watch::channel(0u64);
        let released = ReleaseWatch::new(rx);
        let (ready_tx, ready) = oneshot::channel::<bool>();
        let mut pending: FuturesUnordered<BoxFuture<'static, Result<ReleaseWatch, Error>>> = self
            .nodes
            .iter()
            .map(|node| {
                let (node, key) = (node.clone(), key.clone());
                Box::pin(async move { node.subscribe(&key).await }) as BoxFuture<'static, _>
            })
            .collect();
        let quorum = self.quorum;
        let forward = tokio::spawn(async move {
            let mut watches: Vec<ReleaseWatch> = Vec::new();
            let (mut answered, mut ready_tx) = (0, Some(ready_tx));
            loop {
                if answered >= quorum || pending.is_empty() {
                    if let Some(ready) = ready_tx.take() {
                        let _ = ready.send(!watches.is_empty() || !pending.is_empty());
                    }
                    if watches.is_empty() && pending.is_empty() {
                        return;
                    }
                }
                let any = async {
                    if watches.is_empty() {
                        std::future::pending::<()>().await;
                    }
                    select_all(watches.iter_mut().map(|w| Box::pin(w.released()))).await;
                };
                tokio::select! {
                    Some(answer) = pending.next(), if !pending.is_empty() => {
                        answered += 1;
                        if let Ok(w) = answer && w.is_active() {
                            watches.push(w);
                        }
                    }
                    () = any => {
                        tx.send_modify(|n| *n = n.wrapping_add(1));
                    }
                    () = tx.closed() => return,
                }
            }
        });
        let forward = AbortOnDrop(forward);
        match ready.await {
            Ok(true) => Ok(released.with_guard(forward)),
            _ => Ok(ReleaseWatch::never()),
        }
    }
}

impl OperatorStore for RedlockStore {
    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, Error> {
        self.inspect_majority(key).await
    }

    async fn list(
        &self,
        namespace: &str,
        cursor: &ListCursor,
        count: usize,
    ) -> Result<HolderPage, Error> {
        self.list_majority(namespace, cursor, count).await
    }

    async fn force_release(&self, key: &LockKey) -> Result<ForcedRelease, Error> {
        self.force_release_everywhere(key).await
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
