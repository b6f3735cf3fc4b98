//! One renewal scheduler per [`Locker`](crate::Locker).
//!
//! Every lease the locker grants is registered here. A single task keeps a
//! timer queue ordered by the next moment each lease needs attention: its
//! renewal time (lease/3 after the last successful renewal started) or, while
//! a renewal is in flight, its validity deadline. When it wakes, it gathers
//! every lease due within a small coalescing window and renews them with
//! [`LockStore::extend_many`] in batches — one pipelined round trip per batch
//! for the Redis stores — instead of one timer task and round trip per lock.
//!
//! The store answers each lease of a batch on its own, and each answer
//! applies to its lease only. Outcomes: "extended" moves the validity
//! deadline forward; "not owner" flips the lease to lost at once; an error
//! leaves the lease as it is and retries soon. If the validity deadline passes with no successful renewal,
//! the lease is flipped to lost at that instant.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::lease::{Lease, LossReason};
use crate::store::{LockStore, Renewal};

/// Messages to the scheduler.
pub(crate) enum Cmd {
    /// Start renewing a freshly granted lease.
    Add(Arc<Lease>),
    /// Stop renewing (released). Sent before the release command.
    Remove(u64),
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

/// A batch's leases (id, lease asked for), when it was sent, and one answer
/// per lease, in the same order.
type BatchResult = (
    Vec<(u64, Duration)>,
    Instant,
    Vec<Result<bool, crate::Error>>,
);

pub(crate) async fn run<S: LockStore>(
    store: Arc<S>,
    mut cmds: mpsc::UnboundedReceiver<Cmd>,
    batch_size: usize,
    window: Duration,
    renewing: Arc<AtomicUsize>,
) {
    let mut entries: HashMap<u64, Entry> = HashMap::new();
    let mut queue: BTreeSet<(Instant, u64)> = BTreeSet::new();
    let mut in_flight: JoinSet<BatchResult> = JoinSet::new();
    // One timer for the task's life, moved only when the next moment that
    // needs attention changes (a grant or release whose renewal comes later
    // than the first one queued does not touch it).
    let timer = tokio::time::sleep_until(Instant::now());
    tokio::pin!(timer);
    let mut armed: Option<Instant> = None;

    loop {
        let next_wake = queue.first().map(|&(t, _)| t);
        if next_wake != armed {
            if let Some(at) = next_wake {
                timer.as_mut().reset(at);
            }
            armed = next_wake;
        }
        tokio::select! {
            biased;
            cmd = cmds.recv() => {
                let Some(cmd) = cmd else {
                    // Every locker and guard is gone, so no lease is left.
                    renewing.store(0, Ordering::Relaxed);
                    return;
                };
                // Everything already sent, in one wake-up.
                apply(cmd, &mut entries, &mut queue);
                while let Ok(cmd) = cmds.try_recv() {
                    apply(cmd, &mut entries, &mut queue);
                }
            },
            Some(done) = in_flight.join_next(), if !in_flight.is_empty() => {
                let Ok((batch, started, results)) = done else { continue };
                let now = Instant::now();
                let mut failed = 0usize;
                let mut first_error = None;
                let mut results = results.into_iter();
                // Each answer applies to its own lease only: one lease's
                // error or refusal never touches another of the batch.
                for (id, applied) in batch {
                    let outcome = results.next().unwrap_or_else(|| {
                        Err(crate::Error::Unavailable {
                            op: crate::Operation::Extend,
                            key: None,
                            source: "the store answered fewer renewals than it was sent".into(),
                        })
                    });
                    let Some(e) = entries.get_mut(&id) else { continue };
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
                            queue.remove(&(e.queued, id));
                            entries.remove(&id);
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
                    let at = e.next_renew.min(e.lease.valid_until());
                    queue.remove(&(e.queued, id));
                    e.queued = at;
                    queue.insert((at, id));
                }
                if let Some(err) = first_error {
                    tracing::warn!(error = %err, failed, "lease renewal failed; retrying");
                }
            }
            () = &mut timer, if armed.is_some() => {}
        }

        // Whatever woke us, handle everything that is due. Renewals due
        // within the coalescing window go out now, together; a deadline
        // counts only once it has passed. Entries waiting for their deadline
        // stay queued untouched, so this loop is finite and the next sleep
        // is always in the future.
        let now = Instant::now();
        if queue.first().is_none_or(|&(at, _)| at > now + window) {
            // Nothing is due (the usual wake-up: a grant or a release).
            renewing.store(entries.len(), Ordering::Relaxed);
            continue;
        }
        let mut due: Vec<(u64, Duration)> = Vec::new();
        let candidates: Vec<(Instant, u64)> =
            queue.range(..=(now + window, u64::MAX)).copied().collect();
        for (at, id) in candidates {
            let Some(e) = entries.get_mut(&id) else {
                queue.remove(&(at, id));
                continue;
            };
            if !e.lease.is_active() || now >= e.lease.valid_until() {
                if e.lease.is_active() {
                    e.lease.mark_lost(LossReason::Expired);
                }
                queue.remove(&(at, id));
                entries.remove(&id);
                continue;
            }
            if e.in_flight
                || e.capped
                || e.next_renew > now + window
                || e.retry_at.is_some_and(|t| t > now)
            {
                // Waiting for a reply, or for the deadline (queued for it
                // because it comes before the next renewal: a renewal
                // shortened by the hold cap). Renewing again now would
                // extend nothing, over and over.
                continue;
            }
            let lease = e.lease.renewal_at(now);
            queue.remove(&(at, id));
            e.queued = e.lease.valid_until();
            queue.insert((e.queued, id));
            if lease < e.lease.drift * 2 {
                // The hold cap is reached: stop renewing and let the lease
                // run out; it is reported lost at its deadline.
                e.capped = true;
                continue;
            }
            e.in_flight = true;
            due.push((id, lease));
        }
        renewing.store(entries.len(), Ordering::Relaxed);
        for chunk in due.chunks(batch_size.max(1)) {
            // Built together, so answer i is about lease i.
            let mut batch = Vec::with_capacity(chunk.len());
            let mut renewals = Vec::with_capacity(chunk.len());
            for &(id, lease) in chunk {
                let Some(e) = entries.get(&id) else { continue };
                batch.push((id, lease));
                renewals.push(Renewal {
                    key: e.lease.key.clone(),
                    owner: e.lease.owner.clone(),
                    lease,
                });
            }
            let store = store.clone();
            in_flight.spawn(async move {
                let started = Instant::now();
                let results = store.extend_many(&renewals).await;
                tracing::trace!(
                    count = renewals.len(),
                    failed = results.iter().filter(|r| r.is_err()).count(),
                    "renewed leases"
                );
                (batch, started, results)
            });
        }
    }
}

/// Starts or stops renewing a lease.
fn apply(cmd: Cmd, entries: &mut HashMap<u64, Entry>, queue: &mut BTreeSet<(Instant, u64)>) {
    match cmd {
        Cmd::Add(lease) => {
            let next_renew = lease.acquired_at + lease.lease / 3;
            let id = lease.id;
            queue.insert((next_renew, id));
            entries.insert(
                id,
                Entry {
                    lease,
                    next_renew,
                    queued: next_renew,
                    in_flight: false,
                    capped: false,
                    retry_at: None,
                },
            );
        }
        Cmd::Remove(id) => {
            if let Some(e) = entries.remove(&id) {
                queue.remove(&(e.queued, id));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{Counting, grant, key};
    use super::*;
    use crate::MemoryStore;
    use crate::time::drift;

    const LEASE: Duration = Duration::from_secs(30);
    const MS: Duration = Duration::from_millis(1);

    struct Running {
        tx: mpsc::UnboundedSender<Cmd>,
        renewing: Arc<AtomicUsize>,
    }

    fn start<S: LockStore>(store: &Arc<S>) -> Running {
        let (tx, rx) = mpsc::unbounded_channel();
        let renewing = Arc::new(AtomicUsize::new(0));
        tokio::spawn(run(store.clone(), rx, 512, LEASE / 12, renewing.clone()));
        Running { tx, renewing }
    }

    #[tokio::test(start_paused = true)]
    async fn renews_every_lease_third_counted_from_the_last_renewal() {
        let store = Arc::new(MemoryStore::new());
        let l = grant(&store, &key("third"), LEASE, None).await;
        let t0 = l.acquired_at;
        let w = start(&store);
        w.tx.send(Cmd::Add(l.clone())).unwrap();

        tokio::time::sleep_until(t0 + LEASE / 3 - MS).await;
        assert_eq!(l.valid_until(), t0 + LEASE - drift(LEASE), "renewed early");
        assert_eq!(w.renewing.load(Ordering::Relaxed), 1);
        tokio::time::sleep_until(t0 + LEASE / 3 + MS).await;
        assert_eq!(l.valid_until(), t0 + LEASE / 3 + LEASE - drift(LEASE));
        tokio::time::sleep_until(t0 + LEASE * 2 / 3 - MS).await;
        assert_eq!(l.valid_until(), t0 + LEASE / 3 + LEASE - drift(LEASE));
        tokio::time::sleep_until(t0 + LEASE * 2 / 3 + MS).await;
        assert_eq!(l.valid_until(), t0 + LEASE * 2 / 3 + LEASE - drift(LEASE));
        // Held for ten leases: still valid, still ours in the store.
        tokio::time::sleep_until(t0 + LEASE * 10).await;
        assert!(l.is_valid_now());
        assert!(store.is_locked(&l.key));
    }

    #[tokio::test(start_paused = true)]
    async fn a_removed_lease_is_not_renewed() {
        let store = Arc::new(MemoryStore::new());
        let l = grant(&store, &key("removed"), LEASE, None).await;
        let t0 = l.acquired_at;
        let w = start(&store);
        w.tx.send(Cmd::Add(l.clone())).unwrap();
        tokio::time::sleep_until(t0 + MS).await;
        w.tx.send(Cmd::Remove(l.id)).unwrap();
        tokio::time::sleep_until(t0 + LEASE / 2).await;
        assert_eq!(l.valid_until(), t0 + LEASE - drift(LEASE));
        assert_eq!(w.renewing.load(Ordering::Relaxed), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn commands_sent_before_the_watchdog_runs_are_all_applied() {
        // Several grants and a release queued while the watchdog task has
        // not run yet: one wake-up takes them all, in order.
        let store = Arc::new(MemoryStore::new());
        let a = grant(&store, &key("queued-a"), LEASE, None).await;
        let b = grant(&store, &key("queued-b"), LEASE, None).await;
        let gone = grant(&store, &key("queued-gone"), LEASE, None).await;
        let w = start(&store);
        for l in [&a, &b, &gone] {
            w.tx.send(Cmd::Add(l.clone())).unwrap();
        }
        w.tx.send(Cmd::Remove(gone.id)).unwrap();
        tokio::time::sleep_until(a.acquired_at + LEASE / 3 - MS).await;
        assert_eq!(w.renewing.load(Ordering::Relaxed), 2);
        tokio::time::sleep_until(b.acquired_at + LEASE / 2).await;
        for l in [&a, &b] {
            assert!(l.valid_until() > l.acquired_at + LEASE, "not renewed");
        }
        assert_eq!(gone.valid_until(), gone.acquired_at + LEASE - drift(LEASE));
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewal_that_finds_another_owner_flips_the_lease_to_lost() {
        let store = Arc::new(MemoryStore::new());
        let l = grant(&store, &key("stolen"), LEASE, None).await;
        let t0 = l.acquired_at;
        let w = start(&store);
        w.tx.send(Cmd::Add(l.clone())).unwrap();
        // Gone behind the watchdog's back.
        assert!(store.release(&l.key, &l.owner).await.unwrap());
        tokio::time::sleep_until(t0 + LEASE / 3 - MS).await;
        assert!(l.is_active());
        tokio::time::sleep_until(t0 + LEASE / 3 + MS).await;
        assert!(!l.is_active());
        assert!(l.lost.is_cancelled());
        assert_eq!(w.renewing.load(Ordering::Relaxed), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_hold_cap_shortens_the_last_renewal_then_stops_renewing() {
        let counting = Arc::new(Counting::default());
        // At 10 s the cap leaves 2 s: one renewal for 2 s, then none.
        let l = grant(
            &counting.inner,
            &key("cap"),
            LEASE,
            Some(Duration::from_secs(12)),
        )
        .await;
        let t0 = l.acquired_at;
        let w = start(&counting);
        w.tx.send(Cmd::Add(l.clone())).unwrap();
        tokio::time::sleep_until(t0 + LEASE / 3 - MS).await;
        // Stepped by hand: a watchdog that kept re-sending this renewal
        // would keep the runtime busy, and paused time would never move.
        tokio::time::advance(MS * 2).await;
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
        assert_eq!(counting.extends(), 1, "the short renewal was sent again");
        let until = t0 + LEASE / 3 + Duration::from_secs(2) - drift(LEASE);
        assert_eq!(l.valid_until(), until);
        // Lost at that deadline, not renewed past it.
        tokio::time::sleep_until(until - MS).await;
        assert!(l.is_active());
        tokio::time::sleep_until(until + MS).await;
        assert!(!l.is_active() && l.lost.is_cancelled());
        assert_eq!(l.valid_until(), until);
        assert_eq!(w.renewing.load(Ordering::Relaxed), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn no_renewal_is_sent_once_the_cap_leaves_less_than_two_drifts() {
        let counting = Arc::new(Counting::default());
        let store = &counting.inner;
        // Lease 30 s, cap 90.5 s: renewals at 10, 20, …, 80 s; at 90 s the
        // cap leaves 0.5 s, under 2 × 302 ms: not worth sending.
        let cap = Duration::from_millis(90_500);
        let l = grant(store, &key("tiny"), LEASE, Some(cap)).await;
        let t0 = l.acquired_at;
        let w = start(&counting);
        w.tx.send(Cmd::Add(l.clone())).unwrap();
        let until = t0 + cap - drift(LEASE);
        tokio::time::sleep_until(t0 + LEASE * 3 - MS).await;
        assert_eq!(l.valid_until(), until, "the 80 s renewal asked for 10.5 s");
        assert!(l.is_active());
        assert!(store.is_locked(&l.key));
        // Nothing sent at 90 s: the store lets the lock go at the cap, and
        // the lease is reported lost at its deadline.
        tokio::time::sleep_until(t0 + cap).await;
        assert!(!store.is_locked(&l.key), "renewed past 90 s");
        assert_eq!(counting.extends(), 8, "renewals at 10, 20, …, 80 s only");
        tokio::time::sleep_until(until + MS).await;
        assert!(l.lost.is_cancelled());
        assert_eq!(w.renewing.load(Ordering::Relaxed), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_store_that_fails_at_once_is_retried_after_a_pause_not_in_a_loop() {
        let store = Arc::new(Counting::default());
        let l = grant(&store.inner, &key("failing"), LEASE, None).await;
        let w = start(&store);
        w.tx.send(Cmd::Add(l.clone())).unwrap();
        store
            .fail_extends
            .store(true, std::sync::atomic::Ordering::SeqCst);
        // Up to the first renewal (not past it: with the bug, time would
        // stop there, the watchdog never idle), and it fails.
        tokio::time::sleep_until(l.acquired_at + LEASE / 3).await;
        // However long the runtime keeps running without time passing, the
        // retry waits for its pause (1 s): nothing more is sent.
        for _ in 0..2_000 {
            tokio::task::yield_now().await;
        }
        assert!(
            store.extends() <= 1,
            "a failed renewal was re-sent at once: {}",
            store.extends()
        );
        // Each pause brings one retry.
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert_eq!(store.extends(), 2);
    }
}
