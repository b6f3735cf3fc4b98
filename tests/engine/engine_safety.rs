//! The engine under cancellation, outages, runtime changes and extreme
//! settings: what a dropped future, a failing or stalled store, a
//! runtime that shuts down or a setting at its bound must never cost a
//! lease.
//!
//! The engine's own logic runs on the memory store (wrapped so that a
//! release, a finish or an acquire can be held at a gate or made to fail),
//! on a paused clock where it helps; claims about Redis run against real
//! `redis-server` processes, frozen with SIGSTOP.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use futures_util::FutureExt;
use http::StatusCode;
use support::{RedisServer, eventually};
use tokio::sync::watch;
use tokio::time::{Instant, timeout};
use tower_redis_lock::{
    AcquireOutcome, Error, Grant, LeaseKind, LockGuard, LockKey, LockStore, Locker, MemoryStore,
    Operation, OwnerToken, Record, RedisStore, ReleaseWatch,
};

fn key(id: &str) -> LockKey {
    LockKey::new("safety", id).unwrap()
}

fn record() -> Record {
    Record::new(StatusCode::CREATED)
}

/// The memory store with gates in front of release and finish, switches
/// that make the next few of them fail as an outage would, and one that
/// makes acquires hang (a frozen server, as seen from a waiter).
#[derive(Clone)]
struct Gated {
    inner: MemoryStore,
    /// `true`: releases wait at the gate.
    release_gate: Arc<watch::Sender<bool>>,
    /// `true`: finishes wait at the gate.
    finish_gate: Arc<watch::Sender<bool>>,
    fail_releases: Arc<AtomicU32>,
    fail_finishes: Arc<AtomicU32>,
    hang_acquires: Arc<AtomicBool>,
    /// Grant, then never answer (the answer is lost on the way).
    hang_after_grant: Arc<AtomicBool>,
    /// Answer "held" without the holder's remaining lease (as a store that
    /// cannot tell).
    no_remaining: Arc<AtomicBool>,
    releases: Arc<AtomicU32>,
}

impl Gated {
    fn new() -> Self {
        Gated {
            inner: MemoryStore::new(),
            release_gate: Arc::new(watch::channel(false).0),
            finish_gate: Arc::new(watch::channel(false).0),
            fail_releases: Arc::default(),
            fail_finishes: Arc::default(),
            hang_acquires: Arc::default(),
            hang_after_grant: Arc::default(),
            no_remaining: Arc::default(),
            releases: Arc::default(),
        }
    }

    fn close_releases(&self, closed: bool) {
        self.release_gate.send_replace(closed);
    }

    fn close_finishes(&self, closed: bool) {
        self.finish_gate.send_replace(closed);
    }
}

fn outage() -> Error {
    Error::Unavailable {
        op: Operation::Release,
        key: None,
        source: "simulated outage".into(),
    }
}

/// Takes one from `n` if it is not zero.
fn take_one(n: &AtomicU32) -> bool {
    n.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| v.checked_sub(1))
        .is_ok()
}

async fn pass(gate: &watch::Sender<bool>) {
    let mut rx = gate.subscribe();
    let _ = rx.wait_for(|closed| !closed).await;
}

impl LockStore for Gated {
    async fn grant(&self, grant: Grant<'_>) -> Result<AcquireOutcome, Error> {
        if self.hang_acquires.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        let outcome = self.inner.grant(grant).await;
        if self.hang_after_grant.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        match outcome {
            Ok(AcquireOutcome::Held { .. }) if self.no_remaining.load(Ordering::SeqCst) => {
                Ok(AcquireOutcome::Held { remaining: None })
            }
            other => other,
        }
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

    async fn release(
        &self,
        kind: LeaseKind,
        key: &LockKey,
        owner: &OwnerToken,
    ) -> Result<bool, Error> {
        self.releases.fetch_add(1, Ordering::SeqCst);
        pass(&self.release_gate).await;
        if take_one(&self.fail_releases) {
            return Err(outage());
        }
        self.inner.release(kind, key, owner).await
    }

    async fn finish(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        record: bytes::Bytes,
        retention: Duration,
    ) -> Result<bool, Error> {
        pass(&self.finish_gate).await;
        if take_one(&self.fail_finishes) {
            return Err(outage());
        }
        self.inner.finish(key, owner, record, retention).await
    }

    async fn read_record(&self, key: &LockKey) -> Result<Option<bytes::Bytes>, Error> {
        self.inner.read_record(key).await
    }

    async fn subscribe(&self, key: &LockKey) -> Result<ReleaseWatch, Error> {
        self.inner.subscribe(key).await
    }
}

/// A locker on `store` with a 30 s lease: every check below that the lock
/// came free is bounded far below it.
fn gated_locker(store: &Gated) -> Locker<Gated> {
    Locker::builder(store.clone())
        .lease(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// Far below the 30 s lease: a lock that comes free within this was
/// released, not expired.
const WELL_BEFORE_LEASE: Duration = Duration::from_secs(5);

/// Starts a local waiter for `k` (waiting longer than the lease) and
/// returns once it waits.
async fn local_waiter(
    locker: &Locker<Gated>,
    k: &LockKey,
) -> tokio::task::JoinHandle<Result<LockGuard, Error>> {
    let (l, k2) = (locker.clone(), k.clone());
    let waiter = tokio::spawn(async move { l.acquire_within(&k2, Duration::from_secs(120)).await });
    assert!(eventually(Duration::from_secs(1), async || locker.has_waiters(k)).await);
    waiter
}

/// The waiter got the lock long before the holder's lease could have run
/// out.
async fn woken_well_before_the_lease(waiter: tokio::task::JoinHandle<Result<LockGuard, Error>>) {
    let got = timeout(WELL_BEFORE_LEASE, waiter)
        .await
        .expect("the local waiter was not woken: the lock stayed held")
        .unwrap();
    assert!(got.unwrap().is_held());
}

// ---- 4: a dropped release or finish still completes ------------------------

#[tokio::test(start_paused = true)]
async fn a_release_dropped_at_any_point_still_releases_and_wakes_the_local_waiter() {
    let store = Gated::new();
    let locker = gated_locker(&store);
    // 0: dropped before its first poll; 1: dropped while the store call is
    // in flight; 2: the same, polled twice.
    for polls in 0..3 {
        let k = key(&format!("release-{polls}"));
        let guard = locker.acquire(&k).await.unwrap();
        let waiter = local_waiter(&locker, &k).await;
        store.close_releases(true);
        let mut release = Box::pin(guard.release());
        for _ in 0..polls {
            assert!((&mut release).now_or_never().is_none());
        }
        drop(release);
        store.close_releases(false);
        woken_well_before_the_lease(waiter).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_finish_dropped_at_any_point_still_completes_and_wakes_the_local_waiter() {
    let store = Gated::new();
    let locker = gated_locker(&store);

    // Dropped while the finish is in flight: it completes in the background
    // (the record is stored) and the lock comes free.
    let k = key("finish-in-flight");
    let guard = locker.acquire(&k).await.unwrap();
    let waiter = local_waiter(&locker, &k).await;
    store.close_finishes(true);
    let rec = record();
    let mut finish = Box::pin(guard.finish(rec.encode(), Duration::from_secs(600)));
    assert!((&mut finish).now_or_never().is_none());
    drop(finish);
    store.close_finishes(false);
    woken_well_before_the_lease(waiter).await;
    assert!(store.inner.read_record(&k).await.unwrap().is_some());

    // The finish failed and its fallback release is in flight when the
    // future is dropped: that release completes in the background.
    let k = key("finish-fallback");
    let guard = locker.acquire(&k).await.unwrap();
    let waiter = local_waiter(&locker, &k).await;
    store.fail_finishes.store(1, Ordering::SeqCst);
    store.close_releases(true);
    let rec = record();
    let mut finish = Box::pin(guard.finish(rec.encode(), Duration::from_secs(600)));
    assert!((&mut finish).now_or_never().is_none());
    drop(finish);
    store.close_releases(false);
    woken_well_before_the_lease(waiter).await;
}

#[tokio::test(start_paused = true)]
async fn a_reentered_lock_dropped_mid_release_of_its_last_hold_is_released() {
    let store = Gated::new();
    let locker = gated_locker(&store);
    let k = key("reentered");
    let outer = locker.acquire(&k).await.unwrap();
    let inner = outer.reenter().unwrap();
    let waiter = local_waiter(&locker, &k).await;
    // The first hold given back sends nothing.
    assert!(inner.release().await.unwrap());
    store.close_releases(true);
    let mut release = Box::pin(outer.release());
    assert!((&mut release).now_or_never().is_none());
    drop(release);
    store.close_releases(false);
    woken_well_before_the_lease(waiter).await;
}

#[tokio::test]
async fn a_release_dropped_while_redis_is_frozen_completes_after_the_thaw() {
    let server = RedisServer::start();
    let locker = redis_locker(&server, Duration::from_secs(30), Duration::ZERO);
    let (k1, k2, k3) = (key("frozen-1"), key("frozen-2"), key("frozen-3"));
    let g1 = locker.acquire(&k1).await.unwrap();
    let g2 = locker.acquire(&k2).await.unwrap();
    let g3 = locker.acquire(&k3).await.unwrap();
    server.freeze();
    // Dropped after one poll, before the command reached the connection.
    assert!(Box::pin(g1.release()).now_or_never().is_none());
    let rec = record();
    let finish = g2.finish(rec.encode(), Duration::from_secs(600));
    assert!(Box::pin(finish).now_or_never().is_none());
    // Dropped while the command waits on the frozen server.
    assert!(
        timeout(Duration::from_millis(100), g3.release())
            .await
            .is_err()
    );
    server.thaw();
    // Lease 30 s: gone long before that, by the background release.
    assert!(
        eventually(WELL_BEFORE_LEASE, async || lock_keys(&server).is_empty()).await,
        "locks left: {:?}",
        lock_keys(&server)
    );
    // The dropped finish was carried out: its record is there.
    assert!(
        server
            .keys()
            .iter()
            .any(|k| k.contains("frozen-2") && k.ends_with(":record")),
        "{:?}",
        server.keys()
    );
}

// ---- 12: a release that fails on a brief outage is retried ------------------

#[tokio::test(start_paused = true)]
async fn failed_releases_are_retried_in_the_background_on_memory() {
    let store = Gated::new();
    let locker = gated_locker(&store);

    // Explicit release: the caller gets the error, the lock still comes free.
    let k = key("retry-release");
    let guard = locker.acquire(&k).await.unwrap();
    let waiter = local_waiter(&locker, &k).await;
    store.fail_releases.store(3, Ordering::SeqCst);
    assert!(guard.release().await.is_err());
    woken_well_before_the_lease(waiter).await;

    // Drop.
    let k = key("retry-drop");
    let guard = locker.acquire(&k).await.unwrap();
    let waiter = local_waiter(&locker, &k).await;
    store.fail_releases.store(3, Ordering::SeqCst);
    drop(guard);
    woken_well_before_the_lease(waiter).await;

    // Finish whose store step and fallback release both fail.
    let k = key("retry-finish");
    let guard = locker.acquire(&k).await.unwrap();
    let waiter = local_waiter(&locker, &k).await;
    store.fail_finishes.store(1, Ordering::SeqCst);
    store.fail_releases.store(3, Ordering::SeqCst);
    assert!(
        guard
            .finish(record().encode(), Duration::from_secs(600))
            .await
            .is_err()
    );
    woken_well_before_the_lease(waiter).await;
}

/// A release that fails although the store answers (its check does: the
/// failure is the key's own) is retried until the lease is over, then
/// with the locker's undos for a few more rounds, then given up: never
/// for ever.
#[tokio::test(start_paused = true)]
async fn release_retries_stop_once_the_release_keeps_failing_while_the_store_answers() {
    let store = Gated::new();
    let locker = gated_locker(&store);
    let guard = locker.acquire(&key("retry-forever")).await.unwrap();
    store.fail_releases.store(u32::MAX, Ordering::SeqCst);
    assert!(guard.release().await.is_err());
    // Ten minutes on the paused clock: 20 leases.
    tokio::time::sleep(Duration::from_secs(600)).await;
    let tries = store.releases.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(
        store.releases.load(Ordering::SeqCst),
        tries,
        "still retrying"
    );
    // Jittered backoff up to 1 s, over at most two leases, then a strike
    // a round with the undos.
    assert!((5..=140).contains(&tries), "{tries} tries");
}

#[tokio::test]
async fn a_release_that_fails_during_a_brief_freeze_is_retried_until_it_lands() {
    let server = RedisServer::start();
    let locker = redis_locker(&server, Duration::from_secs(30), Duration::ZERO);
    let (k1, k2, k3) = (
        key("freeze-release"),
        key("freeze-finish"),
        key("freeze-drop"),
    );
    let g1 = locker.acquire(&k1).await.unwrap();
    let g2 = locker.acquire(&k2).await.unwrap();
    let g3 = locker.acquire(&k3).await.unwrap();
    server.freeze();
    // Each fails after the 500 ms command timeout.
    assert!(g1.release().await.is_err());
    assert!(
        g2.finish(record().encode(), Duration::from_secs(600))
            .await
            .is_err()
    );
    drop(g3);
    // The outage lasts a little longer than that.
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.thaw();
    assert!(
        eventually(WELL_BEFORE_LEASE, async || lock_keys(&server).is_empty()).await,
        "locks left for the rest of their 30 s lease: {:?}",
        lock_keys(&server)
    );
}

#[tokio::test]
async fn a_release_that_fails_while_redis_is_down_is_retried_after_it_is_back() {
    // Persistent, so the restarted server still has the locks.
    let mut server = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let locker = redis_locker(&server, Duration::from_secs(30), Duration::ZERO);
    let (k1, k2, k3) = (key("down-release"), key("down-finish"), key("down-drop"));
    let g1 = locker.acquire(&k1).await.unwrap();
    let g2 = locker.acquire(&k2).await.unwrap();
    let g3 = locker.acquire(&k3).await.unwrap();
    server.stop();
    // Nothing reaches Redis: each call fails at once.
    assert!(g1.release().await.is_err());
    assert!(
        g2.finish(record().encode(), Duration::from_secs(600))
            .await
            .is_err()
    );
    drop(g3);
    // The outage lasts a while: the background releases fail meanwhile.
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.restart();
    assert_eq!(lock_keys(&server).len(), 3, "the restart lost the locks");
    assert!(
        eventually(WELL_BEFORE_LEASE, async || lock_keys(&server).is_empty()).await,
        "locks left for the rest of their 30 s lease: {:?}",
        lock_keys(&server)
    );
}

// ---- 6: a locker outlives the runtime it was first used on -----------------

fn runtime(paused: bool) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(paused)
        .build()
        .unwrap()
}

/// Uses `locker` in a first runtime, drops that runtime, then in a second
/// one: a lock is renewed for several leases (another locker is refused
/// throughout) and a dropped guard is released.
fn outlives_its_first_runtime<S: LockStore + Clone>(
    locker: Locker<S>,
    lease: Duration,
    paused: bool,
    is_free: impl AsyncFn(&LockKey) -> bool,
) {
    let k = key("runtimes");
    let first = runtime(paused);
    first.block_on(async {
        let g = locker.acquire(&k).await.unwrap();
        assert!(g.release().await.unwrap());
    });
    drop(first);

    let second = runtime(paused);
    second.block_on(async {
        let other = Locker::new(locker.store().clone());
        // (A Redis connection opened in the first runtime died with it: the
        // store answers that call with an error and reconnects.)
        let g = support::eventually_some(Duration::from_secs(5), async || {
            locker.acquire(&k).await.ok()
        })
        .await
        .expect("no grant in the second runtime");
        for _ in 0..12 {
            tokio::time::sleep(lease / 3).await;
            assert!(g.is_held(), "not renewed in the second runtime");
            assert!(other.try_acquire(&k).await.unwrap_err().is_contended());
        }
        assert!(locker.renewing() >= 1);
        drop(g);
        // Freed by the dropped guard, long before its lease would end.
        assert!(
            eventually(lease / 2, async || is_free(&k).await).await,
            "a guard dropped in the second runtime was not released"
        );
    });
}

#[test]
fn a_locker_outlives_its_first_runtime_on_memory() {
    let store = MemoryStore::new();
    let locker = Locker::builder(store.clone())
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();
    outlives_its_first_runtime(locker, Duration::from_secs(30), true, async |k| {
        !store.is_locked(k)
    });
}

#[test]
fn a_locker_outlives_its_first_runtime_on_redis() {
    let server = RedisServer::start();
    let locker = redis_locker(&server, Duration::from_secs(1), Duration::ZERO);
    outlives_its_first_runtime(locker, Duration::from_secs(1), false, async |_| {
        lock_keys(&server).is_empty()
    });
}

/// Whether `g` is held and was renewed at least `n` times: its validity
/// runs past the deadline its `n`-th renewal (sent `n` × lease/3 after the
/// grant, or later) gives at the least.
fn renewed(g: &LockGuard, lease: Duration, n: u32) -> bool {
    let margin = lease / 100 + Duration::from_millis(2);
    g.is_held()
        && Instant::now() + g.valid_for() >= g.acquired_at() + lease / 3 * n + lease - margin
}

/// A locker used from two runtimes: each lease is renewed on the runtime
/// it was granted on. When the first runtime shuts down, its lease still
/// held (a guard that outlived it) is reported lost at once, never left
/// unrenewed without a word, and the second runtime's lease is renewed on,
/// with no further grant to start anything.
#[test]
fn each_lease_is_renewed_on_its_own_runtime_and_reported_lost_with_it() {
    let lease = Duration::from_secs(1);
    let locker = Locker::builder(MemoryStore::new())
        .lease(lease)
        .build()
        .unwrap();
    let first = runtime(false);
    let a = first
        .block_on(locker.acquire(&key("own-runtime-a")))
        .unwrap();
    let second = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let b = second
        .block_on(locker.acquire(&key("own-runtime-b")))
        .unwrap();
    assert_eq!(locker.renewing(), 2);
    drop(first);
    assert!(
        a.is_lost(),
        "a lease whose runtime is gone was not reported lost"
    );
    assert_eq!(locker.renewing(), 1);
    let twice = second.block_on(eventually(lease * 5, async || renewed(&b, lease, 2)));
    assert!(twice, "not renewed on its own runtime");
    assert!(b.is_held() && !b.is_lost());
    drop(second);
    assert!(b.is_lost(), "left unrenewed without a word");
    assert_eq!(locker.renewing(), 0);
}

/// A runtime that is kept but no longer driven (a setup runtime) stalls
/// only the leases granted on it: a lock granted on a runtime that runs is
/// renewed there.
#[test]
fn a_lease_is_renewed_while_another_runtime_of_the_locker_idles() {
    // 1 s, renewed every 333 ms: a renewal late by 600 ms on a loaded
    // machine does not end it (300 ms left 200 ms of slack).
    let lease = Duration::from_secs(1);
    let store = MemoryStore::new();
    let locker = Locker::builder(store.clone()).lease(lease).build().unwrap();
    let setup = runtime(false);
    setup.block_on(async {
        let g = locker.acquire(&key("idle-boot")).await.unwrap();
        g.release().await.unwrap();
    });
    let work = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    work.block_on(async {
        let g = locker.acquire(&key("idle-work")).await.unwrap();
        let thrice = eventually(lease * 5, async || renewed(&g, lease, 3)).await;
        assert!(thrice && !g.is_lost(), "not renewed: lost {}", g.is_lost());
        assert!(store.is_locked(&key("idle-work")));
    });
    drop(setup);
}

/// A guard taken on a runtime that then idles and awaited on another: its
/// watchdog cannot run, so nothing renews it, and `lost()` (which watches
/// the deadline on the awaiting runtime) still resolves by the deadline.
#[test]
fn a_guard_whose_runtime_idles_hears_of_its_loss_by_its_deadline() {
    let lease = Duration::from_millis(300);
    let locker = Locker::builder(MemoryStore::new())
        .lease(lease)
        .build()
        .unwrap();
    let setup = runtime(false);
    let g = setup.block_on(locker.acquire(&key("idle-guard"))).unwrap();
    let work = runtime(false);
    work.block_on(async {
        let told = timeout(lease * 4, g.lost()).await.is_ok();
        assert!(told, "lost() pending past the deadline");
        assert!(g.is_lost() && !g.is_held());
    });
    drop(setup);
}

/// A store whose `extend_many` panics when called, before it returns a
/// future: one batch's panic costs no lease (retried like a failure).
#[derive(Clone)]
struct PanicsOnce {
    inner: MemoryStore,
    panics_left: Arc<AtomicU32>,
}

impl LockStore for PanicsOnce {
    async fn grant(&self, grant: Grant<'_>) -> Result<AcquireOutcome, Error> {
        self.inner.grant(grant).await
    }
    async fn renew(
        &self,
        kind: LeaseKind,
        k: &LockKey,
        o: &OwnerToken,
        l: Duration,
    ) -> Result<bool, Error> {
        self.inner.renew(kind, k, o, l).await
    }
    #[allow(clippy::manual_async_fn)]
    fn renew_many(
        &self,
        renewals: &[tower_redis_lock::Renewal],
    ) -> impl Future<Output = Vec<Result<bool, Error>>> + Send {
        let once = |n: u32| n.checked_sub(1);
        if self
            .panics_left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, once)
            .is_ok()
        {
            panic!("test: the store panics while preparing a batch");
        }
        let (renewals, inner) = (renewals.to_vec(), self.inner.clone());
        async move { inner.renew_many(&renewals).await }
    }
    async fn release(&self, kind: LeaseKind, k: &LockKey, o: &OwnerToken) -> Result<bool, Error> {
        self.inner.release(kind, k, o).await
    }
    async fn finish(
        &self,
        k: &LockKey,
        o: &OwnerToken,
        r: bytes::Bytes,
        t: Duration,
    ) -> Result<bool, Error> {
        self.inner.finish(k, o, r, t).await
    }
    async fn read_record(&self, k: &LockKey) -> Result<Option<bytes::Bytes>, Error> {
        self.inner.read_record(k).await
    }
    async fn subscribe(&self, k: &LockKey) -> Result<ReleaseWatch, Error> {
        self.inner.subscribe(k).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_store_whose_extend_many_panics_before_its_future_costs_no_lease() {
    let lease = Duration::from_millis(900);
    let store = PanicsOnce {
        inner: MemoryStore::new(),
        panics_left: Arc::new(AtomicU32::new(1)),
    };
    let locker = Locker::builder(store.clone()).lease(lease).build().unwrap();
    let g = locker.acquire(&key("panics-early")).await.unwrap();
    // The first renewal panics; it is retried, and the lease renewed on.
    let panicked = || store.panics_left.load(Ordering::SeqCst) == 0;
    assert!(
        eventually(lease * 3, async || panicked() && renewed(&g, lease, 2)).await,
        "one panicking batch cost the lease"
    );
    assert!(!g.is_lost() && g.is_held());
}

/// A lease `LockGuard::extend` finds taken leaves the watchdog's table at
/// once, as one its own renewal finds taken does.
#[tokio::test(start_paused = true)]
async fn a_lease_found_lost_by_extend_leaves_the_watchdog() {
    let store = MemoryStore::new();
    let locker = Locker::new(store.clone());
    let g = locker.acquire(&key("lost-by-extend")).await.unwrap();
    assert_eq!(locker.renewing(), 1);
    assert!(store.lose(&key("lost-by-extend")));
    assert!(g.extend().await.is_err());
    assert!(g.is_lost());
    assert_eq!(locker.renewing(), 0, "a lost lease is still in the table");
}

#[test]
fn an_acquire_dropped_outside_any_runtime_is_released_on_its_own_runtime() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let store = Gated::new();
    let locker = gated_locker(&store);
    let k = key("attempt-outside");
    store.hang_after_grant.store(true, Ordering::SeqCst);
    let mut acquire = Box::pin(locker.acquire(&k));
    // Polled in the runtime: granted, the answer never arrives.
    rt.block_on(std::future::poll_fn(|cx| {
        assert!(acquire.as_mut().poll(cx).is_pending());
        std::task::Poll::Ready(())
    }));
    assert!(store.inner.is_locked(&k));
    // Dropped on a thread with no runtime (a future dropped by a shutting
    // down executor, a non-Tokio caller).
    drop(acquire);
    rt.block_on(async {
        assert!(
            eventually(WELL_BEFORE_LEASE, async || !store.inner.is_locked(&k)).await,
            "the granted attempt was left to its 30 s lease"
        );
    });
}

// ---- 11: a wait ends at its deadline whatever the store does ---------------

#[tokio::test(start_paused = true)]
async fn a_wait_ends_at_its_deadline_when_the_store_stops_answering() {
    let store = Gated::new();
    let locker = Locker::builder(store.clone())
        .lease(Duration::from_secs(30))
        .wait_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let k = key("wait-hang");
    let _held = Locker::new(store.clone()).acquire(&k).await.unwrap();
    let start = Instant::now();
    let waiter = {
        let (l, k) = (locker.clone(), k.clone());
        tokio::spawn(async move { l.acquire(&k).await })
    };
    // Past its first try, the store stops answering.
    assert!(eventually(Duration::from_millis(100), async || locker.has_waiters(&k)).await);
    store.hang_acquires.store(true, Ordering::SeqCst);
    let err = timeout(Duration::from_secs(60), waiter)
        .await
        .expect("the wait hung on the store")
        .unwrap()
        .unwrap_err();
    assert!(matches!(err, Error::WaitTimeout { .. }), "{err:?}");
    assert_eq!(start.elapsed(), Duration::from_millis(300));
    assert!(!locker.has_waiters(&k));
}

#[tokio::test]
async fn a_wait_on_a_frozen_redis_ends_at_its_deadline_not_the_command_timeout() {
    let server = RedisServer::start();
    let command_timeout = Duration::from_secs(10);
    let wait = Duration::from_millis(500);
    let store = RedisStore::builder(&server.url())
        .command_timeout(command_timeout)
        .build()
        .unwrap();
    let locker = Locker::builder(store)
        .lease(Duration::from_secs(30))
        .wait_timeout(wait)
        .poll_interval(Duration::from_millis(20))
        .build()
        .unwrap();
    let k = key("wait-frozen");
    let _held = redis_locker(&server, Duration::from_secs(30), Duration::ZERO)
        .acquire(&k)
        .await
        .unwrap();
    let waiter = {
        let (l, k) = (locker.clone(), k.clone());
        tokio::spawn(async move { l.acquire(&k).await })
    };
    // Once it is subscribed, its next step is a try at the store.
    let channel = locker.store().release_channel(&k);
    assert!(
        eventually(Duration::from_secs(2), async || locker.has_waiters(&k)
            && server
                .cmd(&["PUBSUB", "NUMSUB", &channel])
                .as_array()
                .unwrap()[1]
                .as_int()
                .unwrap()
                > 0)
        .await
    );
    server.freeze();
    // Hang guard: far above the 500 ms wait, far below the 10 s command
    // timeout that the old code waited out.
    let res = timeout(command_timeout / 2, waiter).await;
    server.thaw();
    let err = res
        .expect("the wait overran its deadline by a command timeout")
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(err, Error::WaitTimeout { .. } | Error::Unavailable { .. }),
        "{err:?}"
    );
}

// ---- 9: `Duration::MAX` never panics ---------------------------------------

#[tokio::test(start_paused = true)]
async fn a_wait_timeout_of_duration_max_waits_without_panicking() {
    let store = MemoryStore::new();
    let locker = Locker::builder(store.clone())
        .wait_timeout(Duration::MAX)
        .build()
        .unwrap();
    let k = key("wait-max");
    let held = locker.acquire(&k).await.unwrap();
    let waiter = {
        let (l, k) = (locker.clone(), k.clone());
        tokio::spawn(async move { l.acquire(&k).await })
    };
    assert!(eventually(Duration::from_secs(1), async || locker.has_waiters(&k)).await);
    assert!(held.release().await.unwrap());
    assert!(waiter.await.unwrap().unwrap().is_held());
}

#[tokio::test(start_paused = true)]
async fn acquire_within_duration_max_waits_without_panicking() {
    let locker = Locker::new(MemoryStore::new());
    let k = key("within-max");
    let held = locker.acquire(&k).await.unwrap();
    let waiter = {
        let (l, k) = (locker.clone(), k.clone());
        tokio::spawn(async move { l.acquire_within(&k, Duration::MAX).await })
    };
    assert!(eventually(Duration::from_secs(1), async || locker.has_waiters(&k)).await);
    drop(held);
    assert!(waiter.await.unwrap().unwrap().is_held());
    // And on a free key, at once.
    let free = locker
        .acquire_within(&key("within-max-free"), Duration::MAX)
        .await
        .unwrap();
    assert!(free.is_held());
}

#[tokio::test(start_paused = true)]
async fn a_max_hold_of_duration_max_is_no_cap_and_no_panic() {
    let locker = Locker::builder(MemoryStore::new())
        .lease(Duration::from_secs(30))
        .max_hold(Duration::MAX)
        .build()
        .unwrap();
    let g = locker.acquire(&key("hold-max")).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert!(g.is_held());
    g.extend().await.unwrap();
    assert!(g.release().await.unwrap());
}

#[tokio::test(start_paused = true)]
async fn a_poll_interval_of_duration_max_waits_without_panicking() {
    let store = Gated::new();
    store.no_remaining.store(true, Ordering::SeqCst);
    let k = key("poll-max");
    let _held = gated_locker(&store).acquire(&k).await.unwrap();
    let start = Instant::now();
    let err = Locker::builder(store.clone())
        .wait_timeout(Duration::from_secs(5))
        .poll_interval(Duration::MAX)
        .build()
        .unwrap()
        .acquire(&k)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::WaitTimeout { .. }), "{err:?}");
    assert_eq!(start.elapsed(), Duration::from_secs(5));
}

// ---- 13: nothing per key stays behind after a burst ------------------------

/// 10,000 locks held at once, each with a local waiter; then a third
/// released, a third dropped, a third dropped mid-release, and half the
/// waiters cancelled (the others get their lock and drop it).
async fn burst<S: LockStore + Clone>(locker: &Locker<S>, n: usize) -> Vec<LockKey> {
    let keys: Vec<LockKey> = (0..n).map(|i| key(&format!("burst-{i}"))).collect();
    let mut guards = Vec::with_capacity(n);
    for k in &keys {
        guards.push(locker.acquire(k).await.unwrap());
    }
    let waiters: Vec<_> = keys
        .iter()
        .map(|k| {
            let (l, k) = (locker.clone(), k.clone());
            tokio::spawn(async move {
                let _g = l.acquire_within(&k, Duration::from_secs(600)).await;
            })
        })
        .collect();
    assert!(
        eventually(Duration::from_secs(60), async || keys
            .iter()
            .all(|k| locker.has_waiters(k)))
        .await
    );
    assert_eq!(locker.renewing(), n);
    for (i, w) in waiters.iter().enumerate() {
        if i % 2 == 0 {
            w.abort();
        }
    }
    for (i, g) in guards.into_iter().enumerate() {
        match i % 3 {
            0 => {
                let _ = g.release().await;
            }
            1 => drop(g),
            _ => drop(Box::pin(g.release()).now_or_never()),
        }
    }
    for w in waiters {
        let _ = w.await;
    }
    keys
}

#[tokio::test(start_paused = true)]
async fn per_key_structures_are_freed_after_a_burst_of_ten_thousand_locks() {
    let store = MemoryStore::new();
    let locker = Locker::builder(store.clone())
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();
    for _ in 0..2 {
        let keys = burst(&locker, 10_000).await;
        assert!(
            eventually(Duration::from_secs(5), async || locker.renewing() == 0
                && store.held_count() == 0)
            .await,
            "renewing {}, held {}",
            locker.renewing(),
            store.held_count()
        );
        assert!(keys.iter().all(|k| !locker.has_waiters(k)));
    }
}

// ---- helpers (Redis) -------------------------------------------------------

fn redis_locker(server: &RedisServer, lease: Duration, wait: Duration) -> Locker<RedisStore> {
    let store = RedisStore::builder(&server.url())
        .command_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    Locker::builder(store)
        .lease(lease)
        .wait_timeout(wait)
        .build()
        .unwrap()
}

fn lock_keys(server: &RedisServer) -> Vec<String> {
    server
        .keys()
        .into_iter()
        .filter(|k| k.ends_with(":lock"))
        .collect()
}
