//! The watchdog against a reference model: random sequences of grants
//! (some with a hold cap), extends by the holder, releases, locks lost
//! behind the holder's back, renewals that stall, fail or panic, and time
//! passing, on a paused clock. After every 5 ms of virtual time:
//!
//! - a lease the watchdog still calls valid is held in the store (never
//!   valid longer than the TTL the store set);
//! - a lease is renewed or reported lost by its deadline (within the
//!   timer's 1 ms rounding), and never reported lost before its deadline
//!   unless the store said "not owner";
//! - a lease granted while the store was healthy, or still valid well
//!   after it healed, and neither capped nor taken away, is never lost;
//! - nothing is renewed after its release;
//! - the task looks at its table a bounded number of times per step (a
//!   task that loops without sleeping fails here, it cannot hang the test).

use crate::store::LeaseKind;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use proptest::prelude::*;
use tokio::runtime::Handle;
use tokio::time::Instant;

use super::super::lease::Lease;
use super::super::test_support::{Counting, grant, key};
use super::Watchdog;
use crate::store::LockStore;

/// Time moves in steps of this size, and the runtime runs between steps.
const STEP: Duration = Duration::from_millis(5);
/// Renewals due within this of each other share a batch.
const WINDOW: Duration = Duration::from_millis(8);
/// Yields after each step: a task that loops without sleeping loops about
/// this many times per step.
const SETTLE: usize = 64;

#[derive(Debug, Clone)]
enum Op {
    Grant {
        lease_ms: u64,
        cap_ms: Option<u64>,
    },
    /// The holder renews itself (`LockGuard::extend`), the i-th lease.
    Extend(usize),
    /// Released (or its guard dropped).
    Release(usize),
    /// The lock vanishes from the store; its holder is not told.
    Steal(usize),
    Stall(bool),
    Fail(bool),
    Panic(bool),
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    let lease = prop::sample::select(vec![100u64, 900, 3_000, 30_000]);
    let cap = prop::option::weighted(0.3, prop::sample::select(vec![250u64, 1_200, 5_000]));
    prop_oneof![
        3 => (lease, cap).prop_map(|(lease_ms, cap_ms)| Op::Grant { lease_ms, cap_ms }),
        2 => any::<usize>().prop_map(Op::Extend),
        2 => any::<usize>().prop_map(Op::Release),
        1 => any::<usize>().prop_map(Op::Steal),
        1 => any::<bool>().prop_map(Op::Stall),
        1 => any::<bool>().prop_map(Op::Fail),
        1 => any::<bool>().prop_map(Op::Panic),
        6 => (1u64..1_500).prop_map(Op::Advance),
    ]
}

/// What the model knows of one lease.
struct Held {
    lease: Arc<Lease>,
    capped: bool,
    released: bool,
    /// The store no longer holds it for this owner (taken away).
    stolen: bool,
    /// Must never be lost: no store trouble since it was granted or since
    /// the store healed with plenty of its validity left.
    survives: bool,
    /// Renewals the store had been sent for it when it was released.
    extends_at_release: usize,
}

struct World {
    store: Arc<Counting>,
    watchdog: Watchdog,
    held: Vec<Held>,
    stall: bool,
    fail: bool,
    panic: bool,
    next: usize,
}

impl World {
    fn trouble(&self) -> bool {
        self.stall || self.fail || self.panic
    }

    fn pick(&mut self, i: usize) -> Option<&mut Held> {
        let live: Vec<usize> = (0..self.held.len())
            .filter(|&j| !self.held[j].released)
            .collect();
        if live.is_empty() {
            return None;
        }
        let j = live[i % live.len()];
        Some(&mut self.held[j])
    }

    /// The store's health changed: leases lose their guarantee while it is
    /// in trouble, and get it back when it heals with enough validity left
    /// for a retry (its pause, the coalescing window, the timer's rounding).
    fn health_changed(&mut self, was_in_trouble: bool) {
        let now = Instant::now();
        let trouble = self.trouble();
        for h in &mut self.held {
            if trouble {
                h.survives = false;
            } else if was_in_trouble && !h.capped && !h.stolen && h.lease.is_active() {
                let pause = (h.lease.lease / 12).min(Duration::from_secs(1));
                let margin = pause + WINDOW + STEP + Duration::from_millis(2);
                h.survives = h.lease.valid_until() > now + margin;
            }
        }
    }

    async fn apply(&mut self, op: &Op) {
        match *op {
            Op::Grant { lease_ms, cap_ms } => {
                if self.held.len() >= 12 {
                    return;
                }
                let k = key(&format!("model-{}", self.next));
                self.next += 1;
                let cap = cap_ms.map(Duration::from_millis);
                let lease =
                    grant(&self.store.inner, &k, Duration::from_millis(lease_ms), cap).await;
                assert!(
                    lease.valid_until() > Instant::now(),
                    "a fresh grant is not valid (lease {lease_ms} ms, cap {cap_ms:?} ms)"
                );
                self.watchdog.add(lease.clone());
                let survives = !self.trouble() && cap.is_none();
                self.held.push(Held {
                    lease,
                    capped: cap.is_some(),
                    released: false,
                    stolen: false,
                    survives,
                    extends_at_release: 0,
                });
            }
            Op::Extend(i) => {
                let store = self.store.clone();
                let Some(h) = self.pick(i) else { return };
                let l = h.lease.clone();
                if !l.is_active() {
                    return;
                }
                // As `LockGuard::extend` does (straight to the store: the
                // holder's own call, not the watchdog's batch).
                let started = Instant::now();
                let ask = l.renewal_at(started);
                if ask.is_zero() {
                    return;
                }
                if store
                    .inner
                    .renew(LeaseKind::Lock, &l.key, &l.owner, ask)
                    .await
                    .unwrap()
                {
                    l.renewed(started, ask);
                } else {
                    assert!(h.stolen, "an extend of a lock still ours was refused");
                    l.mark_lost(super::LossReason::NotOwner);
                }
            }
            Op::Release(i) => {
                let (store, watchdog) = (self.store.clone(), self.watchdog.clone());
                let Some(h) = self.pick(i) else { return };
                // As a guard does: out of the table, then the release.
                watchdog.remove(h.lease.id);
                h.lease.mark_released();
                h.released = true;
                h.extends_at_release = store.extends_of(&h.lease.key);
                let _ = store
                    .inner
                    .release(LeaseKind::Lock, &h.lease.key, &h.lease.owner)
                    .await;
            }
            Op::Steal(i) => {
                let store = self.store.clone();
                let Some(h) = self.pick(i) else { return };
                store.inner.lose(&h.lease.key);
                h.stolen = true;
                h.survives = false;
            }
            Op::Stall(on) => {
                let was = self.trouble();
                self.stall = on;
                self.store.stall(on);
                self.health_changed(was);
            }
            Op::Fail(on) => {
                let was = self.trouble();
                self.fail = on;
                self.store.fail_extends.store(on, Ordering::SeqCst);
                self.health_changed(was);
            }
            Op::Panic(on) => {
                let was = self.trouble();
                self.panic = on;
                self.store.panic_extends.store(on, Ordering::SeqCst);
                self.health_changed(was);
            }
            Op::Advance(ms) => {
                let until = Instant::now() + Duration::from_millis(ms);
                while Instant::now() < until {
                    self.step().await;
                }
                return;
            }
        }
        settle().await;
        self.check(0);
    }

    /// One step of time, then the checks.
    async fn step(&mut self) {
        let looks = || self.watchdog.shared.looks.load(Ordering::Relaxed);
        let before = looks();
        tokio::time::advance(STEP).await;
        settle().await;
        self.check(looks() - before);
    }

    fn check(&self, looks: usize) {
        let now = Instant::now();
        let mut unreleased = 0;
        for h in &self.held {
            let l = &h.lease;
            let key = &l.key;
            if h.released {
                assert_eq!(
                    self.store.extends_of(key),
                    h.extends_at_release,
                    "{key} renewed after its release"
                );
                continue;
            }
            unreleased += 1;
            if l.is_valid_now() && !h.stolen {
                assert!(
                    self.store.inner.is_locked(key),
                    "{key} valid for {:?} more, but the store let it go",
                    l.valid_for()
                );
            }
            if l.is_active() {
                assert!(
                    now < l.valid_until() + Duration::from_millis(1),
                    "{key} neither renewed nor reported lost by its deadline"
                );
            }
            if l.lost.is_cancelled() {
                assert!(
                    h.stolen || l.valid_until() <= now,
                    "{key} reported lost {:?} before its deadline",
                    l.valid_until() - now
                );
                assert!(!h.survives, "{key} lost although the store was healthy");
            }
        }
        assert!(self.watchdog.renewing() <= unreleased);
        let bound = 2 + 2 * unreleased;
        assert!(
            looks <= bound,
            "{looks} looks in one {STEP:?} step with {unreleased} leases"
        );
    }
}

async fn settle() {
    for _ in 0..SETTLE {
        tokio::task::yield_now().await;
    }
}

fn run(ops: &[Op]) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        let store = Arc::new(Counting::default());
        let watchdog = Watchdog::start(store.clone(), &Handle::current(), 4, WINDOW);
        let mut world = World {
            store,
            watchdog,
            held: Vec::new(),
            stall: false,
            fail: false,
            panic: false,
            next: 0,
        };
        for op in ops {
            world.apply(op).await;
        }
        // Heal, then let every lease run its course.
        for op in [
            Op::Stall(false),
            Op::Fail(false),
            Op::Panic(false),
            Op::Advance(7_000),
        ] {
            world.apply(&op).await;
        }
    });
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 32,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn the_watchdog_keeps_the_models_promises(ops in prop::collection::vec(op(), 1..40)) {
        run(&ops);
    }
}
