//! After an outage nothing stays stuck: what abandoned calls may have left
//! in the store is undone once it answers, and the store's health recovers
//! without traffic.
//!
//! A call whose answer never came (its future dropped, its command timed
//! out) may still run on the server later: a frozen Redis runs the queued
//! `EVALSHA` of an attempt its client gave up on when it resumes, and the
//! key would stay held by nobody for a whole lease. Each such call leaves
//! an [`Undo`] with the locker's [`Recovery`], which runs it owner-checked
//! in one background task, retried with backoff (50 ms doubling to 1 s)
//! until the store answers. An undo that found nothing to undo is run
//! once more [`SETTLE`] later: the command it undoes may sit in the buffer
//! of a connection the client has since given up (a timeout replaces the
//! connection), which a resuming server may read after the new
//! connection's undo, in the same turn of its event loop or the next.
//!
//! The same task probes the store ([`LockStore::check`]) while the last
//! acquire found it down, so that [`Locker::status`](super::Locker::status)
//! recovers when the store does, not at the next successful acquire; and
//! after a round that failed, the undos wait for that probe to answer, so
//! an outage costs one call a round, not one per undo. An undo that keeps
//! failing while the store answers (a key of the wrong type) is given up
//! after [`STRIKES`] rounds, logged.
//!
//! The task runs on a runtime of the locker's; when that runtime shuts
//! down (the futures it drops abandon their calls as it goes: a waiting
//! writer's mark is one), or there is none, the task's drop hands what is
//! left to a thread of its own, with its own runtime, for at most
//! [`RESCUE_LIMIT`] (see [`Running`]): only a process that dies leaves its
//! undos to the leases' ends.
//!
//! Bounded: at most [`CAP`] undos wait at once (more are dropped, logged
//! once per outage: their grants expire at their lease end).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{self, StreamExt};
use tokio::runtime::Handle;

use super::health::Health;
use crate::error::{Chain, Error};
use crate::key::LockKey;
use crate::store::{BoxStore, LeaseKind, LockStore};
use crate::sync::lock;
use crate::token::OwnerToken;

/// Most undos kept waiting for the store at once.
pub(crate) const CAP: usize = 65_536;
/// First pause between two rounds that found the store failing; doubles up
/// to [`PAUSE_MAX`].
const PAUSE_FIRST: Duration = Duration::from_millis(50);
/// Longest pause between two rounds: the store is probed, and what waits
/// undone, at least this often.
const PAUSE_MAX: Duration = Duration::from_secs(1);
/// How long after an undo found nothing it is run again, once (see the
/// module's docs).
pub(crate) const SETTLE: Duration = Duration::from_millis(250);
/// Rounds an undo may fail while the store answers its check before it is
/// given up.
const STRIKES: u8 = 8;
/// Undos in flight at once.
const AT_ONCE: usize = 32;

/// What an abandoned call may have left in the store, and how to take it
/// back, owner-checked.
#[derive(Debug, Clone)]
pub(crate) enum Undo {
    /// A grant of a lease of `kind` to `owner`: release it.
    Grant {
        kind: LeaseKind,
        key: LockKey,
        owner: OwnerToken,
    },
    /// A waiting writer's mark: withdraw it.
    Mark { key: LockKey, waiter: OwnerToken },
    /// A hand-off of an exported lease to `taker`: hand it back to
    /// `exporter`, so that a retry of the resume still finds it.
    HandBack {
        key: LockKey,
        taker: OwnerToken,
        exporter: OwnerToken,
        lease: Duration,
    },
}

impl Undo {
    /// Runs the undo: `Ok(true)` when it took something back.
    async fn run(&self, store: &BoxStore) -> Result<bool, Error> {
        match self {
            Undo::Grant { kind, key, owner } => store.release(*kind, key, owner).await,
            Undo::Mark { key, waiter } => store.release(LeaseKind::WriterMark, key, waiter).await,
            Undo::HandBack {
                key,
                taker,
                exporter,
                lease,
            } => store.transfer(key, taker, exporter, *lease).await,
        }
    }

    fn key(&self) -> &LockKey {
        match self {
            Undo::Grant { key, .. } | Undo::Mark { key, .. } | Undo::HandBack { key, .. } => key,
        }
    }
}

/// An undo waiting for the store.
struct Leftover {
    undo: Undo,
    /// A failure came before it (the call's, or a try of the undo): what
    /// it takes back was granted late, and is counted in the log line that
    /// ends the recovery.
    suspect: bool,
    /// Rounds in which it failed although the store answered its check.
    strikes: u8,
}

/// A locker's health and its undos: one per locker, shared by its clones,
/// guards and background tasks.
pub(crate) struct Recovery {
    store: BoxStore,
    pub(crate) health: Health,
    state: std::sync::Mutex<State>,
}

#[derive(Default)]
struct State {
    waiting: VecDeque<Leftover>,
    /// Whether the background task runs (it clears this as it ends, or is
    /// dropped with its runtime).
    running: bool,
    /// Undos dropped at the cap since the last round that emptied the queue.
    dropped: u64,
    /// Undos that took something back after a failure, since the queue was
    /// last empty (logged then).
    recovered: u64,
}

impl Recovery {
    pub(crate) fn new(store: BoxStore) -> Self {
        Recovery {
            store,
            health: Health::default(),
            state: std::sync::Mutex::default(),
        }
    }

    /// Takes back, in the background, what an abandoned call may have left
    /// in the store. `suspect`: the call failed (rather than being
    /// dropped), so that what is taken back was granted late. Run by a
    /// task on the current runtime, else on `runtime`; with neither (or
    /// one shutting down), on a thread of its own (see [`Running`]).
    pub(crate) fn abandon(self: &Arc<Self>, undo: Undo, suspect: bool, runtime: Option<&Handle>) {
        {
            let mut state = lock(&self.state);
            if state.waiting.len() >= CAP {
                state.dropped += 1;
                if state.dropped == 1 {
                    tracing::warn!(
                        key = %undo.key(),
                        cap = CAP,
                        "too many abandoned lock calls wait for the store: the grants of \
                         further ones, if any, are left to expire at their lease end"
                    );
                }
                return;
            }
            state.waiting.push_back(Leftover {
                undo,
                suspect,
                strikes: 0,
            });
        }
        self.ensure_running(runtime);
    }

    /// What an acquire (or a check) answered: the store's health, logged
    /// when it changes. While it is down, the store is probed in the
    /// background until it answers.
    pub(crate) fn saw<T>(self: &Arc<Self>, answer: &Result<T, Error>) {
        self.health.saw(answer);
        if self.health.is_down() {
            self.ensure_running(None);
        }
    }

    /// How many undos wait for the store.
    pub(crate) fn waiting(&self) -> usize {
        lock(&self.state).waiting.len()
    }

    fn ensure_running(self: &Arc<Self>, runtime: Option<&Handle>) {
        {
            let mut state = lock(&self.state);
            if state.running {
                return;
            }
            state.running = true;
        }
        // (Not spawned, or spawned on a runtime that is shutting down, the
        // task is dropped unrun: `Running`'s drop hands its work on.)
        let task = Running::new(self.clone(), false).run();
        spawn_detached(runtime, task);
    }
}

/// How long a rescue (see [`Running`]'s drop) may take.
pub(crate) const RESCUE_LIMIT: Duration = Duration::from_secs(5);

/// The background task's hold on its recovery: clears `running` however
/// the task ends. Dropped unfinished — its runtime shut down (an undo of a
/// future that runtime dropped, a waiting writer's mark among them, is
/// abandoned as it goes), or it was never spawned: no runtime at all —
/// with undos left, it hands them to a rescue: a thread of its own that
/// runs them on a current-thread runtime for at most [`RESCUE_LIMIT`].
/// What the rescue does not get to lapses at its lease end, as everything
/// does when the process itself dies.
struct Running {
    recovery: Arc<Recovery>,
    /// The task ended by itself (and cleared `running` then).
    finished: bool,
    /// This is a rescue: dropped unfinished, it hands nothing on.
    rescue: bool,
    /// The undos of the round in flight (put back if the task is dropped).
    in_flight: Vec<Undo>,
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let mut state = lock(&self.recovery.state);
        for undo in self.in_flight.drain(..) {
            if state.waiting.len() < CAP {
                state.waiting.push_back(Leftover {
                    undo,
                    suspect: true,
                    strikes: 0,
                });
            }
        }
        if self.rescue || state.waiting.is_empty() {
            state.running = false;
            return;
        }
        // (`running` stays set: the rescue runs them.)
        let waiting = state.waiting.len();
        drop(state);
        rescue(self.recovery.clone(), waiting);
    }
}

/// Runs the undos of a recovery whose task has no runtime left on a thread
/// of its own (see [`Running`]).
fn rescue(recovery: Arc<Recovery>, waiting: usize) {
    tracing::debug!(
        waiting,
        "the lock recovery's runtime is gone; taking its undos back on a thread of its own"
    );
    let on_thread = recovery.clone();
    let spawned = std::thread::Builder::new()
        .name("lock-recovery".into())
        .spawn(move || {
            let run = Running::new(on_thread.clone(), true).run();
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            let done = match rt {
                // (The timer made inside: it needs the runtime's clock.)
                Ok(rt) => rt
                    .block_on(async { tokio::time::timeout(RESCUE_LIMIT, run).await })
                    .is_ok(),
                Err(_) => {
                    drop(run);
                    false
                }
            };
            let left = on_thread.waiting();
            if !done && left > 0 {
                tracing::warn!(
                    left,
                    "abandoned lock calls not taken back before their runtime went: \
                     what they left lapses at its lease end"
                );
            }
        });
    if spawned.is_err() {
        lock(&recovery.state).running = false;
    }
}

impl Running {
    fn new(recovery: Arc<Recovery>, rescue: bool) -> Self {
        Running {
            recovery,
            finished: false,
            rescue,
            in_flight: Vec::new(),
        }
    }

    async fn run(mut self) {
        let recovery = &self.recovery;
        let r = &**recovery;
        let mut pause = PAUSE_FIRST;
        // Whether the last round failed: then the store is asked first
        // (one call), and the undos wait until it answers, so that an
        // outage costs one call a round, not one per undo.
        let mut troubled = false;
        loop {
            self.in_flight.clear();
            let batch: Vec<Leftover> = {
                let mut state = lock(&r.state);
                if state.waiting.is_empty() {
                    if state.recovered > 0 || state.dropped > 0 {
                        tracing::info!(
                            released_late = std::mem::take(&mut state.recovered),
                            dropped = std::mem::take(&mut state.dropped),
                            "abandoned lock calls taken back: their keys are free again"
                        );
                    }
                    // Nothing to undo, and the store is up (or nobody is
                    // left to ask: the locker and its guards are gone; or
                    // this is a rescue, which only undoes).
                    if !r.health.is_down() || Arc::strong_count(recovery) == 1 || self.rescue {
                        state.running = false;
                        self.finished = true;
                        return;
                    }
                }
                state.waiting.drain(..).collect()
            };
            self.in_flight = batch.iter().map(|left| left.undo.clone()).collect();
            let healthy = if batch.is_empty() || troubled || r.health.is_down() {
                let up = probe(r).await;
                if up && !batch.is_empty() {
                    // The store answers: an undo that fails now fails for
                    // its own key.
                    undo_all(r, batch, true).await
                } else {
                    requeue(r, batch);
                    up
                }
            } else {
                undo_all(r, batch, false).await
            };
            troubled = !healthy;
            if healthy {
                pause = PAUSE_FIRST;
            } else {
                // Jitter in [pause/2, pause].
                let nap = pause / 2 + pause.mul_f64(fastrand::f64() / 2.0);
                tokio::time::sleep(nap).await;
                pause = (pause * 2).min(PAUSE_MAX);
            }
        }
    }
}

/// Puts undos back in the queue (within the cap).
fn requeue(r: &Recovery, again: Vec<Leftover>) {
    let mut state = lock(&r.state);
    for left in again {
        if state.waiting.len() < CAP {
            state.waiting.push_back(left);
        } else {
            state.dropped += 1;
        }
    }
}

/// Asks the store whether it answers; an answer ends the outage.
async fn probe(r: &Recovery) -> bool {
    match r.store.check().await {
        Ok(()) => {
            r.health.saw(&Ok(()));
            true
        }
        Err(e) => {
            tracing::trace!(error = %Chain(&e), "lock store still unavailable");
            false
        }
    }
}

/// Runs a batch of undos; those that fail wait for the next round, but
/// one that has failed [`STRIKES`] times while the store answered its
/// check (`checked`: a key of the wrong type, a script the server refuses)
/// is given up, logged. Whether every one was answered.
async fn undo_all(r: &Recovery, batch: Vec<Leftover>, checked: bool) -> bool {
    let answers: Vec<(Leftover, Result<bool, Error>)> = stream::iter(batch)
        .map(|left| async move {
            let answer = left.undo.run(&r.store).await;
            (left, answer)
        })
        .buffer_unordered(AT_ONCE)
        .collect()
        .await;
    let mut again = Vec::new();
    let mut confirm = Vec::new();
    let mut answered = false;
    for (left, answer) in answers {
        match answer {
            Ok(took) => {
                answered = true;
                if !took {
                    // Perhaps only not yet: see the module's docs.
                    confirm.push(left.undo);
                } else if left.suspect {
                    lock(&r.state).recovered += 1;
                }
            }
            Err(e) => {
                let strikes = left.strikes + u8::from(checked);
                if strikes >= STRIKES {
                    tracing::warn!(
                        key = %left.undo.key(),
                        error = %Chain(&e),
                        "taking back an abandoned lock call keeps failing while the store \
                         answers; given up: what it left lapses at its lease end"
                    );
                    continue;
                }
                tracing::debug!(key = %left.undo.key(), error = %Chain(&e), "undo of an abandoned lock call failed; retrying");
                again.push(Leftover {
                    undo: left.undo,
                    suspect: true,
                    strikes,
                });
            }
        }
    }
    if answered {
        r.health.saw(&Ok(()));
    }
    if !confirm.is_empty() {
        tokio::time::sleep(SETTLE).await;
        let answers: Vec<(Undo, Result<bool, Error>)> = stream::iter(confirm)
            .map(|undo| async move {
                let answer = undo.run(&r.store).await;
                (undo, answer)
            })
            .buffer_unordered(AT_ONCE)
            .collect()
            .await;
        for (undo, answer) in answers {
            match answer {
                Ok(true) => lock(&r.state).recovered += 1,
                Ok(false) => {}
                Err(_) => again.push(Leftover {
                    undo,
                    suspect: true,
                    strikes: 0,
                }),
            }
        }
    }
    let healthy = again.is_empty();
    requeue(r, again);
    healthy
}

/// Spawns `fut` on the current runtime, else on `fallback`. Returns false
/// if there was neither.
pub(crate) fn spawn_detached<F>(fallback: Option<&Handle>, fut: F) -> bool
where
    F: Future<Output = ()> + Send + 'static,
{
    if let Ok(rt) = Handle::try_current() {
        drop(rt.spawn(fut));
        return true;
    }
    match fallback {
        // (A runtime that has shut down drops the task unrun.)
        Some(rt) => {
            drop(rt.spawn(fut));
            true
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;
    use crate::engine::test_support::{Counting, key};
    use crate::store::{AcquireOutcome, LockStoreExt};

    fn recovery() -> (Arc<Recovery>, Arc<Counting>) {
        let store = Arc::new(Counting::default());
        let r = Arc::new(Recovery::new(BoxStore::from_arc(store.clone())));
        (r, store)
    }

    fn grant_undo(owner: &OwnerToken) -> Undo {
        Undo::Grant {
            kind: LeaseKind::Lock,
            key: key("undo"),
            owner: owner.clone(),
        }
    }

    /// Whether the store grants the undo's key to `owner` now (a grant the
    /// server runs late, or a free key).
    async fn granted(store: &Counting, owner: &OwnerToken) -> bool {
        let lease = Duration::from_secs(30);
        let answer = store.inner.acquire(&key("undo"), owner, lease).await;
        matches!(answer, Ok(AcquireOutcome::Granted(_)))
    }

    /// Waits (in paused time) until `cond`, for at most `limit`.
    async fn within(limit: Duration, cond: impl Fn() -> bool) -> bool {
        let end = tokio::time::Instant::now() + limit;
        while !cond() {
            if tokio::time::Instant::now() >= end {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        true
    }

    #[tokio::test(start_paused = true)]
    async fn an_undo_waits_through_an_outage_and_takes_a_late_grant_back() {
        let (r, store) = recovery();
        let owner = OwnerToken::generate();
        store.down.store(true, Ordering::SeqCst);
        r.abandon(grant_undo(&owner), true, None);
        // A minute of outage: the undo waits, however long.
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(r.waiting(), 1);
        // The server runs the abandoned grant as it resumes.
        assert!(granted(&store, &owner).await);
        store.down.store(false, Ordering::SeqCst);
        // Within the longest pause between two rounds.
        assert!(within(PAUSE_MAX + Duration::from_millis(50), || r.waiting() == 0).await);
        let other = OwnerToken::generate();
        assert!(granted(&store, &other).await);
    }

    #[tokio::test(start_paused = true)]
    async fn an_undo_that_finds_nothing_is_run_once_more_after_the_settle() {
        let (r, store) = recovery();
        let owner = OwnerToken::generate();
        r.abandon(grant_undo(&owner), false, None);
        assert!(
            within(Duration::from_millis(100), || store
                .releases
                .load(Ordering::SeqCst)
                == 1)
            .await
        );
        // The grant runs late, after the first undo found nothing.
        assert!(granted(&store, &owner).await);
        assert!(within(SETTLE * 2, || store.releases.load(Ordering::SeqCst) == 2).await);
        let other = OwnerToken::generate();
        assert!(granted(&store, &other).await);
        // Then nothing more is sent.
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(store.releases.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn undos_are_bounded_while_the_store_is_down() {
        let (r, store) = recovery();
        store.down.store(true, Ordering::SeqCst);
        for _ in 0..CAP + 10 {
            r.abandon(grant_undo(&OwnerToken::generate()), true, None);
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(r.waiting(), CAP);
        store.down.store(false, Ordering::SeqCst);
        assert!(within(Duration::from_secs(60), || r.waiting() == 0).await);
    }

    #[tokio::test(start_paused = true)]
    async fn an_undo_that_keeps_failing_while_the_store_answers_is_given_up() {
        let (r, store) = recovery();
        store.refuse_releases.store(true, Ordering::SeqCst);
        r.abandon(grant_undo(&OwnerToken::generate()), false, None);
        assert!(within(Duration::from_secs(60), || r.waiting() == 0).await);
        let tries = store.releases.load(Ordering::SeqCst);
        assert!(tries <= usize::from(STRIKES) + 1, "{tries} tries");
        tokio::time::sleep(Duration::from_secs(600)).await;
        assert_eq!(
            store.releases.load(Ordering::SeqCst),
            tries,
            "still retrying"
        );
        assert!(within(Duration::from_millis(100), || !lock(&r.state).running).await);
    }

    #[tokio::test(start_paused = true)]
    async fn an_outage_costs_one_call_a_round_not_one_per_undo() {
        let (r, store) = recovery();
        store.down.store(true, Ordering::SeqCst);
        for _ in 0..100 {
            r.abandon(grant_undo(&OwnerToken::generate()), true, None);
        }
        // A minute of outage: about 60 rounds at the longest pause.
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(r.waiting(), 100);
        let calls = store.calls.load(Ordering::SeqCst);
        assert!(calls <= 100 + 100, "{calls} calls to a store that is down");
        store.down.store(false, Ordering::SeqCst);
        assert!(within(PAUSE_MAX + SETTLE * 2, || r.waiting() == 0).await);
    }

    #[tokio::test(start_paused = true)]
    async fn the_store_is_probed_while_down_and_seen_up_again() {
        let (r, store) = recovery();
        store.down.store(true, Ordering::SeqCst);
        let down: Result<(), Error> = store.check().await;
        r.saw(&down);
        assert!(r.health.is_down());
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert!(r.health.is_down(), "seen up while the store fails");
        store.down.store(false, Ordering::SeqCst);
        assert!(
            within(PAUSE_MAX + Duration::from_millis(50), || !r
                .health
                .is_down())
            .await
        );
        // The probe ends with the outage.
        assert!(within(Duration::from_millis(100), || !lock(&r.state).running).await);
    }
}
