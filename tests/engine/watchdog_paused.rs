//! Watchdog timing logic on a paused tokio clock (the memory store runs on
//! tokio time, so hours pass in microseconds and nothing depends on load).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tower_redis_lock::{
    AcquireOutcome, Error, Grant, LeaseKind, LockKey, LockStore, LockStoreExt, Locker, MemoryStore,
    OwnerToken, ReleaseWatch, Renewal,
};

/// The memory store, with a switch that makes renewals hang (a frozen
/// server, as seen from the watchdog) and a count of renewal batches.
#[derive(Clone, Default)]
struct Stalling {
    inner: MemoryStore,
    stall: Arc<AtomicBool>,
    batches: Arc<AtomicU32>,
    acquires: Arc<AtomicU32>,
}

impl LockStore for Stalling {
    async fn grant(&self, grant: Grant<'_>) -> Result<AcquireOutcome, Error> {
        self.acquires.fetch_add(1, Ordering::SeqCst);
        self.inner.grant(grant).await
    }

    async fn renew(
        &self,
        kind: LeaseKind,
        key: &LockKey,
        owner: &OwnerToken,
        lease: Duration,
    ) -> Result<bool, Error> {
        self.inner.renew(kind, key, owner, lease).await
    }

    async fn renew_many(&self, renewals: &[Renewal]) -> Vec<Result<bool, Error>> {
        self.batches.fetch_add(1, Ordering::SeqCst);
        if self.stall.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        let mut out = Vec::new();
        for r in renewals {
            out.push(self.inner.renew(r.kind, &r.key, &r.owner, r.lease).await);
        }
        out
    }

    async fn release(
        &self,
        kind: LeaseKind,
        key: &LockKey,
        owner: &OwnerToken,
    ) -> Result<bool, Error> {
        self.inner.release(kind, key, owner).await
    }

    async fn finish(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        record: bytes::Bytes,
        retention: Duration,
    ) -> Result<bool, Error> {
        self.inner.finish(key, owner, record, retention).await
    }

    async fn read_record(&self, key: &LockKey) -> Result<Option<bytes::Bytes>, Error> {
        self.inner.read_record(key).await
    }

    async fn subscribe(&self, key: &LockKey) -> Result<ReleaseWatch, Error> {
        self.inner.subscribe(key).await
    }
}

fn key(id: &str) -> LockKey {
    LockKey::new("paused", id).unwrap()
}

#[tokio::test(start_paused = true)]
async fn renewals_happen_every_third_of_the_lease_in_shared_batches() {
    let store = Stalling::default();
    let locker = Locker::builder(store.clone())
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();
    let guards: Vec<_> = futures_util::future::join_all((0..100).map(|i| {
        let l = locker.clone();
        async move { l.acquire(&key(&format!("k{i}"))).await.unwrap() }
    }))
    .await;
    // Ten minutes: 20 lease lengths.
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert!(guards.iter().all(|g| g.is_held()));
    // One batch per 10 s tick for all 100 leases (at most one extra at the edge).
    let batches = store.batches.load(Ordering::SeqCst);
    assert!((59..=61).contains(&batches), "{batches} batches");
    assert_eq!(locker.renewing(), 100);
}

#[tokio::test(start_paused = true)]
async fn a_stalled_renewal_flips_the_guard_to_lost_at_the_deadline() {
    let store = Stalling::default();
    let locker = Locker::builder(store.clone())
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();
    let g = locker.acquire(&key("stall")).await.unwrap();
    let start = Instant::now();
    store.stall.store(true, Ordering::SeqCst);
    g.lost().await;
    let at = start.elapsed();
    // valid until lease − (lease/100 + 2 ms) after the grant.
    assert_eq!(at, Duration::from_millis(30_000 - 302));
    assert!(!g.is_held());
}

#[tokio::test(start_paused = true)]
async fn the_hold_cap_stops_renewals_without_spinning() {
    let store = Stalling::default();
    let locker = Locker::builder(store.clone())
        .lease(Duration::from_secs(30))
        .max_hold(Duration::from_secs(100))
        .build()
        .unwrap();
    let g = locker.acquire(&key("cap")).await.unwrap();
    let start = Instant::now();
    g.lost().await;
    let at = start.elapsed();
    assert!(
        at >= Duration::from_secs(99) && at <= Duration::from_secs(100),
        "lost after {at:?}"
    );
    // No lease can outlive the cap in the store either.
    let other = OwnerToken::generate();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(matches!(
        store
            .acquire(&key("cap"), &other, Duration::from_secs(1))
            .await
            .unwrap(),
        AcquireOutcome::Granted(_)
    ));
}

/// A renewal is worth sending only if it can outlast its own drift margin:
/// once the cap leaves less than two drifts (here 0.5 s against a drift of
/// 0.302 s), the watchdog sends nothing more and the lease runs out.
#[tokio::test(start_paused = true)]
async fn no_renewal_is_sent_once_the_cap_leaves_less_than_two_drifts() {
    let store = Stalling::default();
    let locker = Locker::builder(store.clone())
        .lease(Duration::from_secs(30))
        .max_hold(Duration::from_millis(90_500))
        .build()
        .unwrap();
    let g = locker.acquire(&key("cap-margin")).await.unwrap();
    let start = Instant::now();
    tokio::time::timeout(Duration::from_secs(200), g.lost())
        .await
        .expect("the lease outlived its cap");
    // Renewals at 10, 20, …, 80 s; at 90 s only 0.5 s of the cap is left.
    assert_eq!(store.batches.load(Ordering::SeqCst), 8);
    // The 80 s renewal asked for the 10.5 s left, valid for 10.5 s less
    // that TTL's own margin (105 + 2 ms).
    assert_eq!(start.elapsed(), Duration::from_millis(90_393));
}

/// A hold cap shorter than the lease's drift margin (250 ms against the
/// 30 s lease's 302 ms): the store holds the lock for the whole 250 ms, so
/// the guard is held from the start and valid for 250 ms less that TTL's
/// own margin (2.5 + 2 ms), then reported lost.
#[tokio::test(start_paused = true)]
async fn a_hold_cap_below_the_leases_margin_is_held_for_the_cap_less_its_own_margin() {
    let store = Stalling::default();
    let locker = Locker::builder(store.clone())
        .max_hold(Duration::from_millis(250))
        .build()
        .unwrap();
    let g = locker.acquire(&key("short-cap")).await.unwrap();
    let start = Instant::now();
    assert!(g.is_held(), "not held from the start");
    assert_eq!(g.valid_for(), Duration::from_micros(245_500));
    g.lost().await;
    // At its deadline (Tokio's timers round up to the next millisecond).
    let at = start.elapsed();
    assert!(
        (Duration::from_micros(245_500)..=Duration::from_millis(246)).contains(&at),
        "lost after {at:?}"
    );
    // The store let it go at the cap, not before.
    assert!(store.inner.is_locked(&key("short-cap")));
    tokio::time::sleep_until(start + Duration::from_millis(250)).await;
    assert!(!store.inner.is_locked(&key("short-cap")));
}

#[tokio::test(start_paused = true)]
async fn a_waiter_polls_no_more_often_than_the_poll_interval() {
    let store = Stalling::default();
    let locker = Locker::builder(store.clone())
        .lease(Duration::from_secs(30))
        .wait_timeout(Duration::from_secs(3))
        .poll_interval(Duration::from_millis(500))
        .build()
        .unwrap();
    let _held = locker.acquire(&key("poll")).await.unwrap();
    let start = Instant::now();
    let before = store.acquires.load(Ordering::SeqCst);
    let err = locker.acquire(&key("poll")).await.unwrap_err();
    assert!(matches!(err, Error::WaitTimeout { .. }), "{err:?}");
    assert_eq!(start.elapsed(), Duration::from_secs(3));
    // A try, a retry after subscribing, then one try per jittered nap of
    // 250..=500 ms over 3 s, plus the last one at the deadline.
    let attempts = store.acquires.load(Ordering::SeqCst) - before;
    assert!((2 + 6..=2 + 13).contains(&attempts), "{attempts} attempts");
}
