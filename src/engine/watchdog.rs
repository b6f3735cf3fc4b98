//! One renewal scheduler per [`Locker`](crate::Locker).
//!
//! Every lease the locker grants is registered here: the grant writes it
//! into a table shared with the scheduler's task, the release takes it out,
//! and neither wakes the task (a lease released before its first renewal,
//! the usual short lock, never costs the task anything). The task keeps the
//! table's timer queue ordered by the next moment each lease needs attention: its
//! renewal time (lease/3 after the last successful renewal started) or, while
//! a renewal is in flight, its validity deadline. When it wakes, it gathers
//! every lease due within a small coalescing window and renews them with
//! [`LockStore::renew_many`] in batches — one pipelined round trip per batch
//! for the Redis stores — instead of one timer task and round trip per lock.
//!
//! The store answers each lease of a batch on its own, and each answer
//! applies to its lease only. Outcomes: "extended" moves the validity
//! deadline forward; "not owner" flips the lease to lost at once; an error
//! leaves the lease as it is and retries soon. If the validity deadline passes with no successful renewal,
//! the lease is flipped to lost at that instant.

use std::collections::{BTreeSet, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use futures_util::FutureExt as _;
use tokio::runtime::{Handle, Id};
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::lease::{Lease, LossReason};
use crate::error::Chain;
use crate::store::{LockStore, Renewal};
use crate::sync::lock;

/// The handle of a locker's renewal scheduler, kept by the locker and by
/// every hold.
///
/// A grant puts its lease in the scheduler's table and a release takes it
/// out, each under a short lock, and neither wakes the task: it looks at
/// the table when the first lease of its queue needs attention. A grant
/// wakes it only when its lease needs attention before that (the first
/// lease after a quiet spell, or a hold cap shorter than the others').
#[derive(Clone)]
pub(crate) struct Watchdog {
    shared: Arc<Shared>,
}

struct Shared {
    table: Mutex<Table>,
    /// Wakes the task: a lease due before it meant to look, or the last
    /// handle gone (see `Drop`).
    wake: Arc<Notify>,
    /// The task is gone (its runtime shut down): nothing here is renewed,
    /// and every lease that was is reported lost.
    ended: AtomicBool,
    /// The runtime the task runs on; its leases were granted there.
    runtime: Option<Id>,
    /// How many times the task looked at the table (tests: grants and
    /// releases must not wake it).
    #[cfg(test)]
    looks: std::sync::atomic::AtomicUsize,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Every locker and guard is gone: the task ends.
        self.wake.notify_one();
    }
}

struct Table {
    entries: HashMap<u64, Entry, BuildHasherDefault<IdHash>>,
    /// (when the lease needs attention, id), first first.
    queue: BTreeSet<(Instant, u64)>,
    /// When the task looks at the table next without being woken (`None`:
    /// only when woken). A grant due before it wakes the task.
    next_look: Option<Instant>,
}

/// The hash of a lease id: the locker's own sequence number, never a
/// value from a client, so nothing needs SipHash's defence against chosen
/// keys (it cost about 280 instructions a grant and release). A
/// multiplication by an odd constant spreads consecutive ids over both
/// the high bits (hashbrown's tags) and the low ones (its buckets).
#[derive(Default)]
struct IdHash(u64);

impl Hasher for IdHash {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // (Only `write_u64` is used: ids are `u64`.)
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

struct Entry {
    lease: Arc<Lease>,
    next_renew: Instant,
    queued: Instant,
    in_flight: bool,
    /// The hold cap is reached: no more renewals.
    capped: bool,
    /// After a failed renewal: not before this instant, even if it falls in
    /// the coalescing window (which would resend it at once, in a loop
    /// against a store that fails fast).
    retry_at: Option<Instant>,
}

impl Entry {
    /// When the lease next needs the task: its deadline while a renewal is
    /// in flight or the hold cap is reached; otherwise its renewal time (not
    /// before a retry's pause), or its deadline if that comes first. For a
    /// lease still valid now, always after now.
    fn attention(&self) -> Instant {
        let deadline = self.lease.valid_until();
        if self.in_flight || self.capped {
            return deadline;
        }
        let renew = self
            .retry_at
            .map_or(self.next_renew, |r| r.max(self.next_renew));
        renew.min(deadline)
    }
}

/// A batch's leases (id, lease asked for), when it was sent, and one answer
/// per lease, in the same order.
type BatchResult = (
    Vec<(u64, Duration)>,
    Instant,
    Vec<Result<bool, crate::error::Error>>,
);

impl Watchdog {
    /// Starts a scheduler whose task runs on `runtime`, for the leases
    /// granted there. Renewals due within `window` of each other share a
    /// batch of at most `batch_size`.
    pub(crate) fn start<S: LockStore>(
        store: Arc<S>,
        runtime: &Handle,
        batch_size: usize,
        window: Duration,
    ) -> Watchdog {
        let w = Watchdog {
            shared: Arc::new(Shared::new(Some(runtime.id()))),
        };
        let task = run(
            store,
            // Made here, not in the task: a task dropped before it ever ran
            // (its runtime gone first) must say so too.
            EndedOnDrop(Arc::downgrade(&w.shared)),
            w.shared.wake.clone(),
            batch_size,
            window,
        );
        drop(runtime.spawn(task));
        w
    }

    /// A table with no task (tests of what registers and unregisters).
    #[cfg(test)]
    pub(crate) fn detached() -> Watchdog {
        Watchdog {
            shared: Arc::new(Shared::new(None)),
        }
    }

    /// Whether this scheduler's task runs on `runtime` (and still runs).
    pub(crate) fn serves(&self, runtime: &Handle) -> bool {
        self.shared.runtime == Some(runtime.id()) && !self.is_ended()
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        lock(&self.shared.table)
    }

    /// Starts renewing a freshly granted lease (granted on the task's
    /// runtime). If the task is gone (that runtime is shutting down), the
    /// lease is reported lost at once: nothing will renew it.
    pub(crate) fn add(&self, lease: Arc<Lease>) {
        let next_renew = lease.acquired_at + lease.lease / 3;
        // Its deadline, if that comes first (a hold cap shorter than a
        // third of the lease): lost then, not at the renewal time.
        let at = next_renew.min(lease.valid_until());
        let id = lease.id;
        let wake = {
            let mut t = self.table();
            t.queue.insert((at, id));
            t.entries.insert(
                id,
                Entry {
                    lease,
                    next_renew,
                    queued: at,
                    in_flight: false,
                    capped: false,
                    retry_at: None,
                },
            );
            t.next_look.is_none_or(|look| at < look)
        };
        if wake {
            self.shared.wake.notify_one();
        }
        if self.is_ended() {
            orphan(&self.shared);
        }
    }

    /// Stops renewing (released). Called before the release command.
    pub(crate) fn remove(&self, id: u64) {
        let mut t = self.table();
        if let Some(e) = t.entries.remove(&id) {
            t.queue.remove(&(e.queued, id));
        }
    }

    /// How many leases are being renewed (granted, neither released nor
    /// found lost).
    #[cfg_attr(not(any(test, feature = "test-util")), allow(dead_code))]
    pub(crate) fn renewing(&self) -> usize {
        self.table().entries.len()
    }

    /// No task runs (never started, or its runtime shut down).
    pub(crate) fn is_ended(&self) -> bool {
        self.shared.ended.load(Ordering::Acquire)
    }
}

impl Shared {
    fn new(runtime: Option<Id>) -> Shared {
        Shared {
            table: Mutex::new(Table {
                entries: HashMap::default(),
                queue: BTreeSet::new(),
                next_look: None,
            }),
            wake: Arc::new(Notify::new()),
            ended: AtomicBool::new(false),
            runtime,
            #[cfg(test)]
            looks: Default::default(),
        }
    }
}

/// The task is gone with its runtime: every lease still in the table is
/// reported lost at once (nothing renews it any more, and a lease that
/// silently stops being renewed is what must never happen). A guard that
/// outlived the runtime its lock was granted on sees `lost()` resolve.
fn orphan(shared: &Shared) {
    let orphans: Vec<Arc<Lease>> = {
        let mut t = lock(&shared.table);
        t.queue.clear();
        t.next_look = None;
        t.entries.drain().map(|(_, e)| e.lease).collect()
    };
    for lease in orphans {
        lease.mark_lost(LossReason::Stopped);
    }
}

/// Marks the scheduler ended when its task is dropped (a runtime shutting
/// down drops its tasks), and reports its leases lost.
struct EndedOnDrop(Weak<Shared>);

impl Drop for EndedOnDrop {
    fn drop(&mut self) {
        if let Some(shared) = self.0.upgrade() {
            shared.ended.store(true, Ordering::Release);
            orphan(&shared);
        }
    }
}

async fn run<S: LockStore>(
    store: Arc<S>,
    ended: EndedOnDrop,
    wake: Arc<Notify>,
    batch_size: usize,
    window: Duration,
) {
    let shared = &ended.0;
    let mut in_flight: JoinSet<BatchResult> = JoinSet::new();
    // One timer for the task's life, moved only when the next moment that
    // needs attention changes.
    let timer = tokio::time::sleep_until(Instant::now());
    tokio::pin!(timer);
    let mut armed: Option<Instant> = None;
    loop {
        // Whatever woke us, handle everything that is due, and say when we
        // look next. (The handle is upgraded only here, never across an
        // await: the last locker or guard going away must drop it.)
        let Some(sh) = shared.upgrade() else { return };
        #[cfg(test)]
        sh.looks.fetch_add(1, Ordering::Relaxed);
        let (batches, next) = {
            let mut t = lock(&sh.table);
            let now = Instant::now();
            let due = take_due(&mut t, now, window);
            // With nothing queued, the next grant wakes us, and the ones
            // after it need not: we then plan to look at its renewal.
            let next = t.queue.first().map(|&(at, _)| at);
            t.next_look = next;
            (build_batches(&t, &due, batch_size), next)
        };
        drop(sh);
        for (batch, renewals) in batches {
            let store = store.clone();
            in_flight.spawn(async move {
                let started = Instant::now();
                // A store that panics (in its future, or before it returns
                // one) answers nothing: every renewal of the batch then
                // counts as failed, as any renewal left without an answer
                // does, and is retried after a pause, never left in flight
                // (and never renewed again) for good.
                let results = AssertUnwindSafe(async { store.renew_many(&renewals).await })
                    .catch_unwind()
                    .await
                    .unwrap_or_else(|_| {
                        tracing::error!("the lock store panicked while renewing leases");
                        Vec::new()
                    });
                tracing::trace!(
                    count = renewals.len(),
                    failed = results.iter().filter(|r| r.is_err()).count(),
                    "renewed leases"
                );
                (batch, started, results)
            });
        }
        if next != armed {
            if let Some(at) = next {
                timer.as_mut().reset(at);
            }
            armed = next;
        }
        tokio::select! {
            biased;
            () = wake.notified() => {}
            Some(done) = in_flight.join_next(), if !in_flight.is_empty() => {
                let Ok((batch, started, results)) = done else { continue };
                let Some(sh) = shared.upgrade() else { return };
                apply_results(&mut lock(&sh.table), batch, started, results);
            }
            () = &mut timer, if armed.is_some() => {
                armed = None;
            }
        }
    }
}

/// The leases to renew now (id, lease to ask for): those whose renewal is
/// due within the coalescing window; a deadline counts only once it has
/// passed (the lease is then lost). Entries waiting for their deadline
/// stay queued untouched, so this is finite and the next look is always
/// in the future.
fn take_due(t: &mut Table, now: Instant, window: Duration) -> Vec<(u64, Duration)> {
    let mut due = Vec::new();
    if t.queue.first().is_none_or(|&(at, _)| at > now + window) {
        return due;
    }
    let candidates: Vec<(Instant, u64)> = t
        .queue
        .range(..=(now + window, u64::MAX))
        .copied()
        .collect();
    for (at, id) in candidates {
        let Some(e) = t.entries.get_mut(&id) else {
            t.queue.remove(&(at, id));
            continue;
        };
        // Lost (flipped here if its deadline has passed) or released.
        if e.lease.expire_if_due() || !e.lease.is_active() {
            t.queue.remove(&(at, id));
            t.entries.remove(&id);
            continue;
        }
        if e.in_flight
            || e.capped
            || e.next_renew > now + window
            || e.retry_at.is_some_and(|r| r > now)
        {
            // Waiting for a reply, or for the deadline (queued for it
            // because it comes before the next renewal: a renewal
            // shortened by the hold cap). Renewing again now would
            // extend nothing, over and over. Queued again for when it
            // next needs us, which is after `now`: left at an instant that
            // has passed (a deadline that `LockGuard::extend` moved while
            // a renewal was stalled), it would be the next look, at once,
            // in a loop.
            let next = e.attention();
            if next != at {
                e.queued = next;
                t.queue.remove(&(at, id));
                t.queue.insert((next, id));
            }
            continue;
        }
        let lease = e.lease.renewal_at(now);
        e.queued = e.lease.valid_until();
        let queued = e.queued;
        let capped = lease < e.lease.drift * 2;
        if capped {
            // The hold cap is reached: stop renewing and let the lease
            // run out; it is reported lost at its deadline.
            e.capped = true;
        } else {
            e.in_flight = true;
        }
        t.queue.remove(&(at, id));
        t.queue.insert((queued, id));
        if !capped {
            due.push((id, lease));
        }
    }
    due
}

/// The renewals of `due` in batches of `batch_size`, each with its leases
/// (answer i is about lease i).
/// A batch's leases (id, lease asked for) and their renewals.
type Batch = (Vec<(u64, Duration)>, Vec<Renewal>);

fn build_batches(t: &Table, due: &[(u64, Duration)], batch_size: usize) -> Vec<Batch> {
    due.chunks(batch_size.max(1))
        .map(|chunk| {
            let mut batch = Vec::with_capacity(chunk.len());
            let mut renewals = Vec::with_capacity(chunk.len());
            for &(id, lease) in chunk {
                let Some(e) = t.entries.get(&id) else {
                    continue;
                };
                batch.push((id, lease));
                renewals.push(Renewal {
                    key: e.lease.key.clone(),
                    owner: e.lease.owner.clone(),
                    lease,
                    kind: e.lease.kind,
                });
            }
            (batch, renewals)
        })
        .collect()
}

/// Applies a batch's answers, each to its own lease only: one lease's
/// error or refusal never touches another of the batch.
fn apply_results(
    t: &mut Table,
    batch: Vec<(u64, Duration)>,
    started: Instant,
    results: Vec<Result<bool, crate::error::Error>>,
) {
    let now = Instant::now();
    let mut failed = 0usize;
    let mut first_error = None;
    let mut results = results.into_iter();
    for (id, applied) in batch {
        let outcome = results.next().unwrap_or_else(|| {
            Err(crate::error::Error::Unavailable {
                op: crate::error::Operation::Extend,
                key: None,
                source: "the store gave no answer for this renewal (fewer answers than \
                         renewals, or it panicked)"
                    .into(),
            })
        });
        let Some(e) = t.entries.get_mut(&id) else {
            continue;
        };
        e.in_flight = false;
        match outcome {
            Ok(true) => {
                crate::observe::renewed(now.saturating_duration_since(e.next_renew));
                e.lease.renewed(started, applied);
                e.next_renew = started + e.lease.lease / 3;
                e.retry_at = None;
            }
            Ok(false) => {
                e.lease.mark_lost(LossReason::NotOwner);
                let queued = e.queued;
                t.queue.remove(&(queued, id));
                t.entries.remove(&id);
                continue;
            }
            Err(err) => {
                crate::observe::renewal_failed(&err);
                // Try again soon; the deadline decides if it is lost.
                e.next_renew = now + (e.lease.lease / 12).min(Duration::from_secs(1));
                e.retry_at = Some(e.next_renew);
                failed += 1;
                first_error.get_or_insert(err);
            }
        }
        let at = e.attention();
        let old = std::mem::replace(&mut e.queued, at);
        t.queue.remove(&(old, id));
        t.queue.insert((at, id));
    }
    if let Some(err) = first_error {
        tracing::warn!(error = %Chain(&err), failed, "lease renewal failed; retrying");
    }
}

#[cfg(test)]
mod model;

#[cfg(test)]
mod tests;
