//! The watchdog's unit tests: the memory store, a paused clock.

use super::*;
use crate::engine::test_support::{Counting, grant, key};
use crate::store::LeaseKind;
use crate::store::memory::MemoryStore;
use crate::time::drift;

const LEASE: Duration = Duration::from_secs(30);
const MS: Duration = Duration::from_millis(1);

fn start<S: LockStore>(store: &Arc<S>) -> Watchdog {
    Watchdog::start(
        store.clone(),
        &tokio::runtime::Handle::current(),
        512,
        LEASE / 12,
    )
}

#[tokio::test(start_paused = true)]
async fn renews_every_lease_third_counted_from_the_last_renewal() {
    let store = Arc::new(MemoryStore::new());
    let l = grant(&store, &key("third"), LEASE, None).await;
    let t0 = l.acquired_at;
    let w = start(&store);
    w.add(l.clone());

    tokio::time::sleep_until(t0 + LEASE / 3 - MS).await;
    assert_eq!(l.valid_until(), t0 + LEASE - drift(LEASE), "renewed early");
    assert_eq!(w.renewing(), 1);
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
    w.add(l.clone());
    tokio::time::sleep_until(t0 + MS).await;
    w.remove(l.id);
    tokio::time::sleep_until(t0 + LEASE / 2).await;
    assert_eq!(l.valid_until(), t0 + LEASE - drift(LEASE));
    assert_eq!(w.renewing(), 0);
}

#[tokio::test(start_paused = true)]
async fn grants_and_releases_made_before_the_watchdog_runs_all_count() {
    // Several grants and a release made while the watchdog task has
    // not run yet: its first look finds them all.
    let store = Arc::new(MemoryStore::new());
    let a = grant(&store, &key("queued-a"), LEASE, None).await;
    let b = grant(&store, &key("queued-b"), LEASE, None).await;
    let gone = grant(&store, &key("queued-gone"), LEASE, None).await;
    let w = start(&store);
    for l in [&a, &b, &gone] {
        w.add(l.clone());
    }
    w.remove(gone.id);
    tokio::time::sleep_until(a.acquired_at + LEASE / 3 - MS).await;
    assert_eq!(w.renewing(), 2);
    tokio::time::sleep_until(b.acquired_at + LEASE / 2).await;
    for l in [&a, &b] {
        assert!(l.valid_until() > l.acquired_at + LEASE, "not renewed");
    }
    assert_eq!(gone.valid_until(), gone.acquired_at + LEASE - drift(LEASE));
}

#[tokio::test(start_paused = true)]
async fn a_grant_due_before_the_watchdog_meant_to_look_wakes_it() {
    // The watchdog plans to look at the first lease's renewal (10 s);
    // a grant capped at 2 s needs attention long before: it is lost at
    // its own deadline, not when the watchdog would have looked anyway.
    let store = Arc::new(MemoryStore::new());
    let first = grant(&store, &key("first"), LEASE, None).await;
    let w = start(&store);
    w.add(first.clone());
    tokio::time::sleep(MS).await;
    let capped = grant(&store, &key("capped"), LEASE, Some(Duration::from_secs(2))).await;
    w.add(capped.clone());
    let deadline = capped.valid_until();
    assert!(deadline < first.acquired_at + LEASE / 3);
    tokio::time::sleep_until(deadline - MS).await;
    assert!(capped.is_active());
    tokio::time::sleep_until(deadline + MS).await;
    assert!(capped.lost.is_cancelled(), "not told at its deadline");
    assert_eq!(w.renewing(), 1);
}

#[tokio::test(start_paused = true)]
async fn grants_and_releases_in_a_stream_do_not_wake_the_watchdog() {
    let store = Arc::new(MemoryStore::new());
    let w = start(&store);
    let looks = || w.shared.looks.load(Ordering::Relaxed);
    let settle = async || {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    };
    // Short locks, one after the other, 1 ms apart.
    let stream = async |from: usize, n: usize| {
        for i in from..from + n {
            let l = grant(&store, &key(&format!("stream-{i}")), LEASE, None).await;
            w.add(l.clone());
            settle().await;
            w.remove(l.id);
            tokio::time::sleep(MS).await;
        }
    };
    settle().await;
    let idle = looks();
    // The first grant wakes it (nothing was planned); the others do not.
    stream(0, 100).await;
    assert_eq!(looks() - idle, 1, "woken by grants or releases");
    // Its one planned look: the first lease's renewal time. It finds
    // nothing held: the next grant wakes it, and no other does.
    tokio::time::sleep_until(Instant::now() + LEASE / 3).await;
    settle().await;
    let before = looks();
    stream(100, 1_000).await;
    assert!(
        looks() - before <= 1,
        "{} looks for 1,000 short locks",
        looks() - before
    );
    assert_eq!(w.renewing(), 0);
}

#[tokio::test(start_paused = true)]
async fn the_last_handle_gone_ends_the_task() {
    let store = Arc::new(MemoryStore::new());
    let w = start(&store);
    let l = grant(&store, &key("ends"), LEASE, None).await;
    w.add(l.clone());
    tokio::task::yield_now().await;
    // The task holds the store while it runs.
    assert_eq!(Arc::strong_count(&store), 2);
    drop(w);
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        Arc::strong_count(&store),
        1,
        "the task outlived its handles"
    );
}

#[tokio::test(start_paused = true)]
async fn a_renewal_that_finds_another_owner_flips_the_lease_to_lost() {
    let store = Arc::new(MemoryStore::new());
    let l = grant(&store, &key("stolen"), LEASE, None).await;
    let t0 = l.acquired_at;
    let w = start(&store);
    w.add(l.clone());
    // Gone behind the watchdog's back.
    assert!(
        store
            .release(LeaseKind::Lock, &l.key, &l.owner)
            .await
            .unwrap()
    );
    tokio::time::sleep_until(t0 + LEASE / 3 - MS).await;
    assert!(l.is_active());
    tokio::time::sleep_until(t0 + LEASE / 3 + MS).await;
    assert!(!l.is_active());
    assert!(l.lost.is_cancelled());
    assert_eq!(w.renewing(), 0);
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
    w.add(l.clone());
    tokio::time::sleep_until(t0 + LEASE / 3 - MS).await;
    // Stepped by hand: a watchdog that kept re-sending this renewal
    // would keep the runtime busy, and paused time would never move.
    tokio::time::advance(MS * 2).await;
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    assert_eq!(counting.extends(), 1, "the short renewal was sent again");
    // Sent at 10 s + 1 ms (the step above) for what the cap leaves, and
    // valid for that less its own margin (not the 30 s lease's).
    let asked = Duration::from_secs(2) - MS;
    let until = t0 + LEASE / 3 + MS + asked - drift(asked);
    assert_eq!(l.valid_until(), until);
    // Lost at that deadline, not renewed past it.
    tokio::time::sleep_until(until - MS).await;
    assert!(l.is_active());
    tokio::time::sleep_until(until + MS).await;
    assert!(!l.is_active() && l.lost.is_cancelled());
    assert_eq!(l.valid_until(), until);
    assert_eq!(w.renewing(), 0);
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
    w.add(l.clone());
    let last = cap - LEASE * 8 / 3;
    let until = t0 + cap - drift(last);
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
    assert_eq!(w.renewing(), 0);
}

/// Lets the runtime run without moving paused time: a task that loops
/// without sleeping loops once per yield here.
async fn settle() {
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_deadline_moved_while_a_renewal_stalls_is_not_looked_at_in_a_loop() {
    // Lease 900 ms; the watchdog's renewal at 300 ms stalls; the
    // handler keeps the lease valid itself (as `LockGuard::extend`
    // does). The first deadline then passes with the lease valid and a
    // renewal in flight: the task must sleep until the new deadline,
    // not look again at once, forever.
    let store = Arc::new(Counting::default());
    let lease = Duration::from_millis(900);
    let l = grant(&store.inner, &key("stall-extend"), lease, None).await;
    let t0 = l.acquired_at;
    let w = Watchdog::start(store.clone(), &Handle::current(), 512, lease / 12);
    w.add(l.clone());
    store.stall(true);
    tokio::time::advance(lease / 3 + MS).await;
    settle().await;
    assert_eq!(store.extends(), 1, "the renewal at 300 ms was not sent");
    tokio::time::advance(Duration::from_millis(200)).await;
    let sent = Instant::now();
    assert!(
        store
            .inner
            .renew(LeaseKind::Lock, &l.key, &l.owner, lease)
            .await
            .unwrap()
    );
    l.renewed(sent, lease);
    let first_deadline = t0 + lease - drift(lease);
    assert!(l.valid_until() > first_deadline + Duration::from_millis(400));
    tokio::time::sleep_until(first_deadline - MS).await;
    settle().await;
    let before = w.shared.looks.load(Ordering::Relaxed);
    // Past the first deadline, in 10 ms steps, up to 100 ms before the
    // new one: at most one look for the old deadline.
    let mut looks = 0;
    while Instant::now() < l.valid_until() - Duration::from_millis(100) && looks <= 2 {
        tokio::time::advance(Duration::from_millis(10)).await;
        settle().await;
        looks = w.shared.looks.load(Ordering::Relaxed) - before;
    }
    assert!(looks <= 2, "{looks} looks while nothing was due");
    assert!(l.is_active());
    // At the new deadline, with the renewal still stalled: lost.
    tokio::time::sleep_until(l.valid_until() + MS).await;
    assert!(l.lost.is_cancelled());
}

#[tokio::test(start_paused = true)]
async fn a_store_that_panics_while_renewing_is_retried_like_one_that_fails() {
    let store = Arc::new(Counting::default());
    let l = grant(&store.inner, &key("panics"), LEASE, None).await;
    let t0 = l.acquired_at;
    let w = start(&store);
    w.add(l.clone());
    store.panic_extends.store(true, Ordering::SeqCst);
    tokio::time::sleep_until(t0 + LEASE / 3 + MS).await;
    settle().await;
    assert_eq!(store.extends(), 1);
    store.panic_extends.store(false, Ordering::SeqCst);
    // Retried after the pause (1 s), not left in flight for good.
    tokio::time::sleep_until(t0 + LEASE / 3 + Duration::from_millis(1_100)).await;
    settle().await;
    assert_eq!(store.extends(), 2, "the panicked renewal was never retried");
    assert!(l.valid_until() > t0 + LEASE);
    assert_eq!(w.renewing(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_store_that_fails_at_once_is_retried_after_a_pause_not_in_a_loop() {
    let store = Arc::new(Counting::default());
    let l = grant(&store.inner, &key("failing"), LEASE, None).await;
    let w = start(&store);
    w.add(l.clone());
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
