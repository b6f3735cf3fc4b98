//! Drop guards for store calls whose answer has not arrived, and the
//! background task that ends a lock. `Drop` never blocks: it spawns.
//!
//! * [`PendingAttempt`]: an acquire (or a resume's hand-off) whose future
//!   was dropped, or that failed, may still have been granted, now or when
//!   a frozen server resumes: its undo goes to the locker's
//!   [`Recovery`](super::recovery::Recovery).
//! * [`PendingEnd`]: a release or finish whose future was dropped (or that
//!   failed) goes on in the background, retried until the store answers or
//!   the lease is over (then with the locker's undos, until the store
//!   answers); this process's waiters are woken once it lands.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::runtime::Handle;
use tokio::time::Instant;
use tracing::Instrument;

use super::lease::Lease;
use super::queue::Queues;
use super::recovery::{Recovery, Undo, spawn_detached};
use crate::error::{Chain, Error};
use crate::key::LockKey;
use crate::store::{BoxStore, LeaseKind, LockStore};
use crate::time::far_add;
use crate::token::OwnerToken;

/// First pause between two tries of a failed release; doubles up to
/// [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(50);
/// Longest pause between two tries of a failed release.
const RETRY_MAX: Duration = Duration::from_secs(1);

/// A store call whose answer has not arrived (an acquire attempt, a
/// resume's hand-off). If the future holding it is dropped (client gone,
/// timeout), or the call fails, it may still have been carried out, or be
/// carried out later by a server that resumes: its [`Undo`] goes to the
/// locker's [`Recovery`], which runs it owner-checked once the store
/// answers. (Spawned on the current runtime, or on the call's own if the
/// future is dropped outside any runtime.)
pub(crate) struct PendingAttempt<'a> {
    /// What to undo, borrowed: built into an [`Undo`] only when needed
    /// (an answered attempt, the usual case, copies nothing).
    armed: Option<UndoOf<'a>>,
    /// The call itself failed (rather than being dropped).
    failed: bool,
    recovery: &'a Arc<Recovery>,
    runtime: &'a Handle,
}

impl<'a> PendingAttempt<'a> {
    pub(crate) fn new(recovery: &'a Arc<Recovery>, undo: UndoOf<'a>, runtime: &'a Handle) -> Self {
        PendingAttempt {
            armed: Some(undo),
            failed: false,
            recovery,
            runtime,
        }
    }

    /// The call answered: nothing to undo.
    pub(crate) fn disarm(mut self) {
        self.armed = None;
    }

    /// The call failed: undo, and confirm an answer of "nothing to undo"
    /// (see [`Recovery`]).
    pub(crate) fn failed(mut self) {
        self.failed = true;
    }
}

impl Drop for PendingAttempt<'_> {
    fn drop(&mut self) {
        if let Some(undo) = self.armed.take() {
            let undo = match undo {
                UndoOf::Grant(kind, key, owner) => Undo::Grant {
                    kind,
                    key: key.clone(),
                    owner: owner.clone(),
                },
                UndoOf::HandBack {
                    key,
                    taker,
                    exporter,
                    lease,
                } => Undo::HandBack {
                    key: key.clone(),
                    taker: taker.clone(),
                    exporter: exporter.clone(),
                    lease,
                },
            };
            self.recovery.abandon(undo, self.failed, Some(self.runtime));
        }
    }
}

/// What a [`PendingAttempt`] undoes (see [`Undo`]), borrowed from the call.
pub(crate) enum UndoOf<'a> {
    /// A grant of a lease of this kind to this owner.
    Grant(LeaseKind, &'a LockKey, &'a OwnerToken),
    /// A resume's hand-off of an exported lease.
    HandBack {
        key: &'a LockKey,
        taker: &'a OwnerToken,
        exporter: &'a OwnerToken,
        lease: Duration,
    },
}

/// How a lock is ended.
pub(crate) enum EndOp {
    /// Compare-and-delete.
    Release,
    /// Store a completed record and release, in one step; release alone if
    /// that did not store it.
    Finish { record: Bytes, retention: Duration },
}

/// What ending a lock needs; every hold of one grant has a copy.
#[derive(Clone)]
pub(crate) struct Ending {
    pub(crate) lease: Arc<Lease>,
    pub(crate) store: BoxStore,
    /// Where a release that never got an answer goes on.
    pub(crate) recovery: Arc<Recovery>,
    /// This process's waiters, woken right after a release.
    pub(crate) local: Queues,
    /// The runtime the lock was granted on: where background releases go
    /// when the guard is dropped outside any runtime.
    pub(crate) runtime: Option<Handle>,
}

impl Ending {
    /// Ends the lock in a task of the caller's runtime, or of the runtime
    /// that granted it when there is no current runtime (and it is still
    /// running). With neither, the lease expires on its own.
    pub(crate) fn spawn(&self, op: EndOp, pause_first: bool) {
        let job = end_lock(
            self.lease.clone(),
            self.store.clone(),
            self.recovery.clone(),
            self.local.clone(),
            op,
            pause_first,
        );
        let job = job.instrument(self.lease.release_span("background"));
        if !spawn_detached(self.runtime.as_ref(), job) {
            tracing::warn!(
                key = %self.lease.key,
                fencing_token = self.lease.token.ok().map(crate::token::FencingToken::get),
                "no runtime left to release the lock on; the lease will expire on its own"
            );
        }
    }
}

/// A release or finish whose answer has not arrived. If its future is
/// dropped (timeout layer, client gone), the same operation goes on in the
/// background; on a store error it is retried there. Costs nothing (no
/// spawn) when the answer arrives.
pub(crate) struct PendingEnd<'a> {
    ending: &'a Ending,
    pub(crate) op: Option<EndOp>,
    pause_first: bool,
}

impl<'a> PendingEnd<'a> {
    pub(crate) fn arm(ending: &'a Ending, op: EndOp) -> Self {
        PendingEnd {
            ending,
            op: Some(op),
            pause_first: false,
        }
    }

    /// The store answered: nothing left to do.
    pub(crate) fn disarm(&mut self) {
        self.op = None;
    }

    /// The store failed just now: retry in the background after a pause.
    pub(crate) fn retry_later(mut self) {
        self.pause_first = true;
    }
}

impl Drop for PendingEnd<'_> {
    fn drop(&mut self) {
        if let Some(op) = self.op.take() {
            self.ending.spawn(op, self.pause_first);
        }
    }
}

pub(crate) fn trace_release(l: &Lease, res: &Result<bool, Error>) {
    if let Ok(owned) = res {
        tracing::Span::current().record("owned", owned);
    }
    match res {
        Ok(owned) => tracing::debug!(
            key = %l.key,
            fencing_token = l.token.ok().map(crate::token::FencingToken::get),
            owned,
            held_ms = l.acquired_at.elapsed().as_millis() as u64,
            "lock released"
        ),
        Err(e) => {
            crate::observe::store_error(e);
            tracing::warn!(
                key = %l.key,
                fencing_token = l.token.ok().map(crate::token::FencingToken::get),
                error = %Chain(e),
                "lock release failed; retrying in the background"
            )
        }
    }
}

/// Ends a lock whose hold is over: runs `op`, then (unless that stored the
/// record) releases with [`release_retrying`] until the lock would have
/// expired by itself (a full lease past its last validity deadline, which
/// also covers a renewal still in flight). Then wakes this process's
/// waiters.
async fn end_lock(
    lease: Arc<Lease>,
    store: BoxStore,
    recovery: Arc<Recovery>,
    local: Queues,
    op: EndOp,
    pause_first: bool,
) {
    let l = &*lease;
    let give_up = far_add(l.valid_until(), l.lease);
    let mut pause_first = pause_first;
    if let EndOp::Finish { record, retention } = op {
        let finish = store.finish(&l.key, &l.owner, record, retention);
        match tokio::time::timeout_at(give_up, finish).await {
            Ok(Ok(true)) => {
                tracing::debug!(key = %l.key, "lock finished in the background");
                local.wake(&l.key);
                return;
            }
            Ok(Ok(false)) | Err(_) => {}
            Ok(Err(e)) => {
                tracing::warn!(key = %l.key, error = %Chain(&e), "storing the completed record failed")
            }
        }
        pause_first = false;
    }
    let res = release_retrying(&store, l, give_up, pause_first).await;
    match res {
        Some(owned) => trace_release(l, &Ok(owned)),
        None => {
            // A renewal the store has queued (a frozen server) may still
            // run, and hold the key a lease from then: the release goes on
            // with the locker's other undos, until the store answers.
            tracing::warn!(
                key = %l.key,
                fencing_token = l.token.ok().map(crate::token::FencingToken::get),
                "lock release kept failing; it is retried until the store answers"
            );
            let undo = Undo::Grant {
                kind: l.kind,
                key: l.key.clone(),
                owner: l.owner.clone(),
            };
            recovery.abandon(undo, true, None);
        }
    }
    local.wake(&l.key);
}

/// Releases `key` (owner-checked), retrying failures with jittered
/// exponential backoff (50 ms doubling to 1 s) until the store answers or
/// `give_up` passes. The answer (whether we still owned it), or `None` if it
/// never came. With `pause_first`, waits one backoff step before the first
/// try (a try just failed).
async fn release_retrying(
    store: &BoxStore,
    l: &Lease,
    give_up: Instant,
    pause_first: bool,
) -> Option<bool> {
    let mut pause = RETRY_FIRST;
    let mut first = !pause_first;
    loop {
        if !first {
            // Jitter in [pause/2, pause].
            let nap = pause / 2 + pause.mul_f64(fastrand::f64() / 2.0);
            if Instant::now() + nap >= give_up {
                return None;
            }
            tokio::time::sleep(nap).await;
            pause = (pause * 2).min(RETRY_MAX);
        }
        first = false;
        let (key, owner) = (&l.key, &l.owner);
        let release = store.release(l.kind, key, owner);
        match tokio::time::timeout_at(give_up, release).await {
            Ok(Ok(owned)) => return Some(owned),
            Ok(Err(e)) => {
                crate::observe::store_error(&e);
                tracing::debug!(key = %key, error = %Chain(&e), "lock release failed; retrying")
            }
            Err(_) => return None,
        }
    }
}
