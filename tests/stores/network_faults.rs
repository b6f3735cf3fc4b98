//! Faults of the network between a process and Redis, made by a proxy
//! (`support::fault::FaultProxy`) while the server itself stays healthy:
//! a holder cut off by a partition, a half-open connection, a reset in the
//! middle of an answer, a reset under a held lock and under a grant's
//! answer, an answer that comes after its command gave up.

use crate::support;

use std::time::Duration;

use bytes::Bytes;
use support::fault::FaultProxy;
use support::{RedisServer, eventually};
use tokio::time::{Instant, timeout};
use tower_redis_lock::{
    AcquireOutcome, LockKey, LockStore, LockStoreExt, Locker, OwnerToken, RedisStore,
};

/// The store's command timeout in these tests.
const COMMAND_TIMEOUT: Duration = Duration::from_millis(250);
/// What a bounded call may take beyond the command timeout on a loaded
/// machine.
const SLACK: Duration = Duration::from_millis(250);
/// Hang guard.
const GUARD: Duration = Duration::from_secs(10);

fn key(id: &str) -> LockKey {
    LockKey::new("netfaults", id).unwrap()
}

fn store(url: &str) -> RedisStore {
    RedisStore::builder(url)
        .command_timeout(COMMAND_TIMEOUT)
        .build()
        .unwrap()
}

/// A holder cut off from Redis by a partition (the server is fine, the
/// network between is not) sees `lost()` by its deadline, and a client on
/// the healthy side gets the lock only after that deadline, and after the
/// holder knew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_cut_off_by_a_partition_sees_lost_before_the_other_side_acquires() {
    const LEASE: Duration = Duration::from_millis(600);
    let srv = RedisServer::start();
    let proxy = FaultProxy::start(srv.addr()).await;
    let cut_off = Locker::builder(store(&proxy.url()))
        .lease(LEASE)
        .build()
        .unwrap();
    let healthy = Locker::builder(store(&srv.url()))
        .lease(LEASE)
        .wait_timeout(GUARD)
        .build()
        .unwrap();
    let k = key("partitioned");
    let guard = cut_off.acquire(&k).await.unwrap();
    // Held across a renewal first, so the partition meets a renewed lease.
    let renewed = eventually(GUARD, async || guard.valid_for() > LEASE * 4 / 5).await;
    assert!(renewed && guard.is_held());
    let renewed_at = guard.valid_for();
    let renewal_seen = eventually(GUARD, async || guard.valid_for() > renewed_at).await;
    assert!(renewal_seen, "no renewal before the partition");
    proxy.partition(GUARD * 2);
    // No renewal can land from now on: its request or its answer stalls.
    let deadline = Instant::now() + guard.valid_for();
    let watcher = {
        let guard = guard.clone();
        tokio::spawn(async move {
            guard.lost().await;
            Instant::now()
        })
    };
    let other = timeout(GUARD, healthy.acquire(&k))
        .await
        .expect("the healthy side waited past its guard")
        .expect("the healthy side was refused");
    let other_at = Instant::now();
    let lost_at = timeout(GUARD, watcher).await.unwrap().unwrap();
    assert!(!guard.is_held());
    assert!(
        lost_at <= deadline + Duration::from_millis(50),
        "lost() resolved {:?} after the deadline",
        lost_at - deadline
    );
    assert!(
        lost_at < other_at,
        "the healthy side held the lock {:?} before the cut-off holder knew it had lost it",
        lost_at - other_at
    );
    assert!(
        other_at >= deadline,
        "granted {:?} before the cut-off holder's lease ended",
        deadline - other_at
    );
    other.release().await.unwrap();
    proxy.heal();
}

/// A half-open connection (the proxy keeps it open and carries nothing,
/// for good) holds up no call past the command timeout: acquire, a
/// waiter's wait, release. A call that times out makes the store open a
/// new connection (at most once per command timeout), so the watchdog's
/// renewal lands before the deadline and calls succeed again while the
/// old connection is still silent. (The store kept the silent connection:
/// every call failed, the lease was lost, until TCP gave up on it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_open_connection_holds_no_call_past_the_command_timeout() {
    const LEASE: Duration = Duration::from_millis(900);
    let srv = RedisServer::start();
    let proxy = FaultProxy::start(srv.addr()).await;
    let locker = Locker::builder(store(&proxy.url()))
        .lease(LEASE)
        .wait_timeout(Duration::from_millis(600))
        .build()
        .unwrap();
    let direct = Locker::new(store(&srv.url()));
    let held = locker.acquire(&key("held")).await.unwrap();
    let other = direct.acquire(&key("taken")).await.unwrap();
    // A waiter makes the pub/sub connection before the fault.
    let w = timeout(GUARD, locker.acquire(&key("taken"))).await.unwrap();
    assert!(w.unwrap_err().is_contended());
    proxy.sever();
    let deadline = Instant::now() + held.valid_for();

    let bound = COMMAND_TIMEOUT + SLACK;
    let start = Instant::now();
    let r = timeout(GUARD, locker.acquire(&key("fresh"))).await.unwrap();
    assert!(r.is_err(), "granted over a silent connection: {r:?}");
    assert!(
        start.elapsed() <= bound,
        "acquire took {:?}",
        start.elapsed()
    );

    // The waiter: its tries and its subscription are bounded too.
    let start = Instant::now();
    let r = timeout(GUARD, locker.acquire(&key("taken"))).await.unwrap();
    assert!(r.is_err());
    let waited = start.elapsed();
    assert!(
        waited <= Duration::from_millis(600) + bound,
        "the waiter took {waited:?}"
    );

    // The renewal is not held up either: the watchdog renews over a new
    // connection before the deadline (it was lost there, every renewal
    // sent over the silent connection), and never claims the lease past
    // its deadline without a renewal.
    let renewed = eventually(deadline - Instant::now(), async || {
        held.is_held() && Instant::now() + held.valid_for() > deadline + LEASE / 4
    })
    .await;
    assert!(
        renewed,
        "not renewed by the deadline (lost: {})",
        held.is_lost()
    );

    let start = Instant::now();
    let _ = timeout(GUARD, held.release()).await.unwrap();
    assert!(
        start.elapsed() <= bound,
        "release took {:?}",
        start.elapsed()
    );

    // A new connection: the store works again although the old
    // connection is still open and silent.
    let back = eventually(Duration::from_secs(3), async || {
        locker.acquire(&key("after")).await.is_ok()
    })
    .await;
    assert!(back, "the store kept using the half-open connection");
    other.release().await.unwrap();
}

/// A connection reset in the middle of an answer: the call fails, and the
/// store's next command gets its own answer (the rest of the cut answer is
/// never read as the next one's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_mid_answer_leaves_the_next_command_its_own_answer() {
    let srv = RedisServer::start();
    let proxy = FaultProxy::start(srv.addr()).await;
    let store = store(&proxy.url());
    let records = seed_records(&store, 2).await;
    let (ka, a) = &records[0];
    let (kb, b) = &records[1];
    assert_eq!(store.read_record(ka).await.unwrap().as_ref(), Some(a));
    // 10 bytes of a 1 KB record's answer, then RST.
    proxy.reset_mid_reply(10);
    let cut = timeout(GUARD, store.read_record(ka)).await.unwrap();
    assert!(cut.is_err(), "a cut answer was answered: {cut:?}");
    assert_eq!(proxy.resets_done(), 1);
    let next = eventually_record(&store, kb).await;
    assert_eq!(
        next.as_ref(),
        Some(b),
        "the next command read another answer"
    );
}

/// A reset (RST, the server healthy) costs a holder neither its lock nor
/// a claim: the call that meets the reset connection fails at once, the
/// store opens a new connection at that error (a reset never times out,
/// so no command timeout would replace it), and the watchdog renews over
/// it before the deadline. All the while the holder never claims more of
/// its lease than the server keeps (`valid_for` read after `PTTL`, so it
/// can only be smaller): the renewal that failed counted for nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_costs_a_holder_neither_its_lock_nor_a_false_claim() {
    const LEASE: Duration = Duration::from_millis(600);
    let srv = RedisServer::start();
    let proxy = FaultProxy::start(srv.addr()).await;
    let store = store(&proxy.url());
    let k = key("reset");
    let name = store.lock_key(&k);
    let locker = Locker::builder(store).lease(LEASE).build().unwrap();
    let held = locker.acquire(&k).await.unwrap();
    // Held across a renewal first, so the reset meets a renewed lease.
    let renewed_at = held.valid_for();
    let renewal_seen = eventually(GUARD, async || held.valid_for() > renewed_at).await;
    assert!(renewal_seen, "no renewal before the reset");
    proxy.reset();
    let deadline = Instant::now() + held.valid_for();
    let mut most_over = None::<(Duration, i64)>;
    let renewed = eventually(deadline + LEASE - Instant::now(), async || {
        let pttl = srv.cmd(&["PTTL", &name]).as_int().unwrap();
        let claim = held.valid_for();
        if held.is_held() && Duration::from_millis(pttl.max(0) as u64 + 2) < claim {
            most_over = most_over.max(Some((claim, pttl)));
        }
        held.is_held() && Instant::now() + claim > deadline + LEASE / 4
    })
    .await;
    assert_eq!(
        most_over, None,
        "the holder claimed more of its lease than the server kept (claim, PTTL ms)"
    );
    assert!(
        renewed && Instant::now() < deadline,
        "not renewed by the deadline (lost: {})",
        held.is_lost()
    );
    assert!(proxy.resets_done() >= 1, "nothing was reset");
    assert!(held.release().await.unwrap());
}

/// A grant whose answer is cut by a reset (the script ran and granted; its
/// answer never arrived whole): the acquire fails, and the grant is given
/// back at once, owner-checked, over a new connection, rather than left to
/// hold the key for its whole lease (30 s here) under an owner nobody has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_whose_answer_is_cut_is_given_back_at_once() {
    const LEASE: Duration = Duration::from_secs(30);
    let srv = RedisServer::start();
    let proxy = FaultProxy::start(srv.addr()).await;
    let store = store(&proxy.url());
    let k = key("cut-grant");
    let (lock_name, fence_name) = (store.lock_key(&k), store.fence_key(&k));
    let locker = Locker::builder(store).lease(LEASE).build().unwrap();
    // The connection open (scripts loaded), so that the next answer is the
    // grant's.
    locker.store().check().await.unwrap();
    assert_eq!(srv.cmd(&["EXISTS", &fence_name]).as_int(), Some(0));
    proxy.reset_mid_reply(3);
    let cut = timeout(GUARD, locker.try_acquire(&k)).await.unwrap();
    let err = cut.expect_err("granted on a cut answer");
    assert!(!err.is_contended(), "{err}");
    assert_eq!(proxy.resets_done(), 1);
    // The script ran: it minted a token, so it granted (the key was free).
    assert_eq!(srv.cmd(&["EXISTS", &fence_name]).as_int(), Some(1));
    let given_back = eventually(Duration::from_secs(3), async || {
        srv.cmd(&["EXISTS", &lock_name]).as_int() == Some(0)
    })
    .await;
    assert!(
        given_back,
        "the cut grant still held the key 3 s later (its lease: {LEASE:?})"
    );
    // And the store answers again: the key is ours on the next try.
    let again = timeout(GUARD, locker.try_acquire(&k)).await.unwrap();
    assert!(again.unwrap().release().await.unwrap());
}

/// An answer that arrives after its caller gave up (the call dropped at
/// a timeout of the caller's, the connection kept) is not taken for the
/// answer of the next command on the same connection: the late answer and
/// the next one arrive in order, and each goes to its own command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_answer_is_not_read_as_the_next_commands() {
    const LATE: Duration = Duration::from_millis(750);
    let srv = RedisServer::start();
    let proxy = FaultProxy::start(srv.addr()).await;
    let store = RedisStore::builder(&proxy.url())
        .command_timeout(GUARD)
        .build()
        .unwrap();
    let records = seed_records(&store, 2).await;
    let (ka, _) = &records[0];
    let (kb, b) = &records[1];
    let accepted = proxy.accepted();
    proxy.set_latency(Duration::ZERO, LATE);
    let late = timeout(LATE / 3, store.read_record(ka)).await;
    assert!(late.is_err(), "answered before the latency: {late:?}");
    // Its answer is still on the way; the next answer queues behind it.
    proxy.set_latency(Duration::ZERO, Duration::ZERO);
    let start = Instant::now();
    let next = timeout(GUARD, store.read_record(kb))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        next.as_ref(),
        Some(b),
        "the next command read the late answer"
    );
    assert!(
        start.elapsed() >= LATE / 2,
        "the next answer did not queue behind the late one"
    );
    assert_eq!(proxy.accepted(), accepted, "not the same connection");
}

/// `n` keys, each with a distinct 1 KB completed record.
async fn seed_records(store: &RedisStore, n: usize) -> Vec<(LockKey, Bytes)> {
    let mut out = Vec::new();
    for i in 0..n {
        let k = key(&format!("record-{i}"));
        let owner = OwnerToken::generate();
        let granted = store.acquire(&k, &owner, GUARD).await.unwrap();
        assert!(matches!(granted, AcquireOutcome::Granted(_)));
        let record = Bytes::from(format!("record {i} ").repeat(100));
        assert!(
            store
                .finish(&k, &owner, record.clone(), GUARD)
                .await
                .unwrap()
        );
        out.push((k, record));
    }
    out
}

/// The record of `k` once the store answers at all (it may take a call or
/// two to replace a broken connection).
async fn eventually_record(store: &RedisStore, k: &LockKey) -> Option<Bytes> {
    support::eventually_some(GUARD, async || store.read_record(k).await.ok())
        .await
        .expect("the store never answered again")
}
