//! Redlock answers at a quorum: a frozen minority does not hold back a
//! grant, a release or a refusal, and what it does late is cleaned up.
//! Five real `redis-server` processes; the frozen nodes' commands would
//! time out only after an hour, so only an answer at the quorum can come
//! within the hang guard.

use crate::support;

use std::time::Duration;

use bytes::Bytes;
use support::fault::FaultProxy;
use support::topology::start_independent;
use support::{RedisServer, eventually, stores};
use tokio::time::timeout;
use tower_redis_lock::{
    AcquireOutcome, Error, LeaseKind, LockKey, LockStore, LockStoreExt, Locker, OperatorStore,
    OwnerToken, RedlockStore, Renewal,
};

const HOUR: Duration = Duration::from_secs(3600);
/// A fencing counter far above Redis `TIME` in µs (the token's node).
const AHEAD: &str = "5000000000000000";
/// Only a hang guard.
const GUARD: Duration = Duration::from_secs(30);

fn key(id: &str) -> LockKey {
    LockKey::new("quorum", id).unwrap()
}

/// Connects the store to every node (a connection opened while a node is
/// frozen fails at once, which would decide nothing about the quorum).
async fn connect(store: &RedlockStore) {
    let (k, owner) = (key("warm-up"), OwnerToken::generate());
    let outcome = store.acquire(&k, &owner, HOUR).await.unwrap();
    assert!(matches!(outcome, AcquireOutcome::Granted(_)));
    assert!(store.release(LeaseKind::Lock, &k, &owner).await.unwrap());
    // Every node on its own too: the grant above answers once a majority
    // has, so a node after the quorum may not have connected (or run its
    // first script) yet, and a test that then slows it would pay for that.
    for node in store.nodes() {
        let (k, owner) = (key("warm-up-node"), OwnerToken::generate());
        let outcome = node.acquire(&k, &owner, HOUR).await.unwrap();
        assert!(matches!(outcome, AcquireOutcome::Granted(_)));
        assert!(node.release(LeaseKind::Lock, &k, &owner).await.unwrap());
    }
}

fn exists(servers: &[RedisServer], store: &RedlockStore, k: &LockKey, node: usize) -> bool {
    let lock = store.nodes()[node].lock_key(k);
    servers[node].cmd(&["EXISTS", &lock]).as_int() == Some(1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_minority_holds_back_neither_the_grant_nor_the_release() {
    let servers = start_independent(5);
    let store = stores::redlock_over(&servers, HOUR);
    let (k, owner) = (key("minority"), OwnerToken::generate());
    connect(&store).await;
    servers[3].freeze();
    servers[4].freeze();
    let outcome = timeout(GUARD, store.acquire(&k, &owner, HOUR))
        .await
        .expect("the grant waited for the frozen nodes")
        .unwrap();
    assert!(matches!(outcome, AcquireOutcome::Granted(_)), "{outcome:?}");
    let released = timeout(GUARD, store.release(LeaseKind::Lock, &k, &owner))
        .await
        .expect("the release waited for the frozen nodes");
    assert!(released.unwrap());
    assert!((0..3).all(|i| !exists(&servers, &store, &k, i)));
    // The frozen nodes run the grant, then the release queued behind it:
    // no lock is left behind there.
    servers[3].thaw();
    servers[4].thaw();
    let unlocked = eventually(GUARD, async || {
        (3..5).all(|i| !exists(&servers, &store, &k, i))
    })
    .await;
    assert!(unlocked, "a straggler's grant was left behind");
}

/// The owner-checked writes answer at a quorum too (what else
/// waited for every node): with two nodes of five frozen, a renewal, a
/// batch of renewals and a finish each answer from the other three, and
/// the frozen nodes run theirs when they are back (no lock left there).
/// (They waited for every node, here an hour: the hang guard failed.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_minority_holds_back_no_renewal_and_no_finish() {
    let servers = start_independent(5);
    let store = stores::redlock_over(&servers, HOUR);
    let (k, owner) = (key("renewals"), OwnerToken::generate());
    connect(&store).await;
    let outcome = store.acquire(&k, &owner, HOUR).await.unwrap();
    assert!(matches!(outcome, AcquireOutcome::Granted(_)), "{outcome:?}");
    servers[3].freeze();
    servers[4].freeze();
    let extended = timeout(GUARD, store.renew(LeaseKind::Lock, &k, &owner, HOUR))
        .await
        .expect("the renewal waited for the frozen nodes");
    assert!(extended.unwrap());
    let renewal = Renewal {
        key: k.clone(),
        owner: owner.clone(),
        lease: HOUR,
        kind: tower_redis_lock::LeaseKind::Lock,
    };
    let many = timeout(GUARD, store.renew_many(&[renewal]))
        .await
        .expect("the batch waited for the frozen nodes");
    assert!(matches!(many[..], [Ok(true)]), "{many:?}");
    let finished = timeout(
        GUARD,
        store.finish(&k, &owner, Bytes::from_static(b"done"), HOUR),
    )
    .await
    .expect("the finish waited for the frozen nodes");
    assert!(finished.unwrap());
    servers[3].thaw();
    servers[4].thaw();
    let unlocked = eventually(GUARD, async || {
        (3..5).all(|i| !exists(&servers, &store, &k, i))
    })
    .await;
    assert!(
        unlocked,
        "the queued finish did not release the frozen nodes"
    );
    assert_eq!(
        store.read_record(&k).await.unwrap(),
        Some(Bytes::from_static(b"done"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_grant_of_a_refused_lock_is_released_and_a_later_holder_is_kept() {
    let servers = start_independent(5);
    let store = stores::redlock_over(&servers, HOUR);
    let k = key("refused");
    let (holder, ours) = (OwnerToken::generate(), OwnerToken::generate());
    // Another owner holds the lock on nodes 0..3; nodes 3 and 4 are frozen.
    for (i, s) in servers.iter().enumerate().take(3) {
        let lock = store.nodes()[i].lock_key(&k);
        s.cmd(&["SET", &lock, holder.as_str(), "PX", "3600000"]);
    }
    connect(&store).await;
    servers[3].freeze();
    servers[4].freeze();
    let outcome = timeout(GUARD, store.acquire(&k, &ours, HOUR))
        .await
        .expect("the refusal waited for the frozen nodes")
        .unwrap();
    assert!(
        matches!(outcome, AcquireOutcome::Held { .. }),
        "{outcome:?}"
    );
    // Nodes 3 and 4 grant late; the grant did not count, so they are
    // released there as soon as they answer. The holder keeps its nodes.
    servers[3].thaw();
    servers[4].thaw();
    let released = eventually(GUARD, async || {
        (3..5).all(|i| !exists(&servers, &store, &k, i))
    })
    .await;
    assert!(released, "a late grant that did not count was left behind");
    for (i, s) in servers.iter().enumerate().take(3) {
        let lock = store.nodes()[i].lock_key(&k);
        assert_eq!(s.cmd(&["GET", &lock]).as_string().unwrap(), holder.as_str());
    }
}

/// One acquire makes several attempts while the calls of the earlier ones
/// are still queued on a frozen node. When the node comes back, those
/// late grants do not count and are released in the background — and that
/// release must never take the lock a later attempt of the same acquire
/// was granted. (Found by `history_redlock_3_nodes`: every attempt of an
/// acquire used one owner token, so the late release of attempt 1 deleted
/// attempt 3's lock on the node it had counted, and another worker got a
/// majority while the guard still promised validity.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_earlier_attempts_late_release_never_takes_a_later_attempts_lock() {
    let servers = start_independent(3);
    let store = stores::redlock_over(&servers, HOUR);
    let k = key("attempts");
    let other = OwnerToken::generate();
    connect(&store).await;
    // Another owner holds nodes 0 and 1; node 2 is frozen.
    for node in &store.nodes()[..2] {
        let outcome = node.acquire(&k, &other, HOUR).await.unwrap();
        assert!(matches!(outcome, AcquireOutcome::Granted(_)), "{outcome:?}");
    }
    servers[2].freeze();
    let locker = Locker::builder(store.clone())
        .lease(Duration::from_secs(2))
        .wait_timeout(Duration::from_secs(20))
        .poll_interval(Duration::from_millis(10))
        .build()
        .unwrap();
    let waiter = tokio::spawn({
        let k = k.clone();
        async move { locker.acquire(&k).await }
    });
    // Attempts refused by nodes 0 and 1 (each leaves its call queued on
    // node 2), until node 0 is free: then an attempt is granted there and
    // waits for node 2.
    let lock0 = store.nodes()[0].lock_key(&k);
    // (A refused attempt marks the lock as waited for.)
    let waited0 = store.nodes()[0].waited_key(&k);
    let refused = eventually(GUARD, async || {
        servers[0].cmd(&["EXISTS", &waited0]).as_int() == Some(1)
    })
    .await;
    assert!(refused);
    assert!(
        store.nodes()[0]
            .release(LeaseKind::Lock, &k, &other)
            .await
            .unwrap()
    );
    let taken_on_0 = eventually(GUARD, async || {
        servers[0]
            .cmd(&["GET", &lock0])
            .as_string()
            .is_some_and(|v| v != other.as_str())
    })
    .await;
    assert!(taken_on_0, "no later attempt reached node 0");
    servers[2].thaw();
    let guard = timeout(GUARD, waiter)
        .await
        .expect("the acquire hung")
        .unwrap()
        .expect("the acquire failed");
    assert!(
        store.nodes()[1]
            .release(LeaseKind::Lock, &k, &other)
            .await
            .unwrap()
    );
    // While the guard is held, nobody else gets a majority: the late
    // releases of the earlier attempts (sent as soon as node 2 answered
    // them) must not have freed any node the grant counted.
    let rival = OwnerToken::generate();
    for _ in 0..30 {
        let outcome = store.acquire(&k, &rival, HOUR).await.unwrap();
        assert!(
            !matches!(outcome, AcquireOutcome::Granted(_)),
            "a rival was granted the lock while our guard held it"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(guard.is_held());
    guard.release().await.unwrap();
}

/// Three nodes; node 0 answers at once, node 1 through a proxy that holds
/// its answers back, node 2 directly. Connected while nobody is slow.
async fn one_fast_one_slow_one_direct() -> (Vec<RedisServer>, FaultProxy, RedlockStore) {
    let servers = start_independent(3);
    let proxy = FaultProxy::start(servers[1].addr()).await;
    let urls = [servers[0].url(), proxy.url(), servers[2].url()];
    let store = stores::redlock_over_urls(&urls, HOUR);
    connect(&store).await;
    (servers, proxy, store)
}

/// A grant at a quorum counts its validity from the quorum: three nodes, node 2 frozen, node 1 answering `LATE` late,
/// lease 1.95 × `LATE`. The majority {0, 1} grants with about 0.93 ×
/// `LATE` of validity left (2 s: room for a loaded machine's stalls), so
/// the acquire must hold. (Node 1's counter is far
/// ahead, so that the token's write-back goes to node 0, the fast one: a
/// write-back through the slow node would take the rest of the validity.) (It was refused — `Held {
/// remaining: None }`, a 409 with nobody holding the lock — because the
/// grant waited "as long again" for node 2 and measured the elapsed time
/// only then, by when the wait alone had eaten the validity.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_majority_that_granted_in_time_holds_while_a_minority_is_slow_and_frozen() {
    const LATE: Duration = Duration::from_secs(2);
    let lease = LATE * 39 / 20;
    let (servers, proxy, store) = one_fast_one_slow_one_direct().await;
    let (k, owner) = (key("slow-minority"), OwnerToken::generate());
    let fence = store.nodes()[1].fence_key(&k);
    servers[1].cmd(&["SET", &fence, AHEAD]);
    servers[2].freeze();
    proxy.set_latency(Duration::ZERO, LATE);
    let outcome = timeout(GUARD, store.acquire(&k, &owner, lease))
        .await
        .expect("the grant waited for the frozen node")
        .unwrap();
    assert!(
        matches!(outcome, AcquireOutcome::Granted(_)),
        "a majority granted within the lease, yet: {outcome:?}"
    );
    assert!(exists(&servers, &store, &k, 0) && exists(&servers, &store, &k, 1));
    assert!(store.release(LeaseKind::Lock, &k, &owner).await.unwrap());
    servers[2].thaw();
}

/// A grant whose majority answers only after the lease (nodes 1 and 2
/// answer `LATE` late, the lease is shorter) has no validity left: nobody
/// holds the lock, so it is not contention but an unavailable store
/// (`Unavailable`, a 503), never `Held`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_majority_that_answers_after_the_lease_is_unavailable_not_held() {
    const LATE: Duration = Duration::from_secs(1);
    let servers = start_independent(3);
    let proxies = [
        FaultProxy::start(servers[1].addr()).await,
        FaultProxy::start(servers[2].addr()).await,
    ];
    let urls = [servers[0].url(), proxies[0].url(), proxies[1].url()];
    let store = stores::redlock_over_urls(&urls, HOUR);
    connect(&store).await;
    for p in &proxies {
        p.set_latency(Duration::ZERO, LATE);
    }
    let (k, owner) = (key("too-slow"), OwnerToken::generate());
    let outcome = timeout(GUARD, store.acquire(&k, &owner, LATE / 2))
        .await
        .expect("the grant hung");
    assert!(
        matches!(outcome, Err(Error::Unavailable { .. })),
        "a grant without validity left must be Unavailable: {outcome:?}"
    );
}

/// The token counts only once a majority holds it: node 0's counter is
/// far ahead, so nodes 1 and 2 need the write-back. Node 2 is frozen and
/// node 1 answers `LATE` late: the grant by {0, 1} comes in time (lease
/// 1.5 × `LATE`), but the write-back to node 1 answers only after the
/// lease. The grant counted after its validity: undone, `Unavailable`
/// (a guard handed out then would be lost from the start).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_back_that_ends_after_the_validity_is_no_grant() {
    const LATE: Duration = Duration::from_secs(1);
    let (servers, proxy, store) = one_fast_one_slow_one_direct().await;
    let k = key("slow-write-back");
    let fence = store.nodes()[0].fence_key(&k);
    servers[0].cmd(&["SET", &fence, AHEAD]);
    servers[2].freeze();
    proxy.set_latency(Duration::ZERO, LATE);
    let owner = OwnerToken::generate();
    let outcome = timeout(GUARD, store.acquire(&k, &owner, LATE * 3 / 2))
        .await
        .expect("the grant hung");
    assert!(
        matches!(outcome, Err(Error::Unavailable { .. })),
        "a token that counted after the validity must be no grant: {outcome:?}"
    );
    assert!(!exists(&servers, &store, &k, 0), "not undone on node 0");
    servers[2].thaw();
}

/// The majority view shows the token the grant answered, also when the
/// grant wrote its token back and a node it did not wait for granted
/// later. Node 0's counter is far ahead, node 1 answers `LATE` late: the
/// grant counts {0, 2} at node 0's token, written back to node 2, and
/// node 1 grants afterwards with a token of its own (below node 0's). With
/// all three holding the lock, the view takes the quorum-th largest token,
/// which without the write-back reaching node 2's holder record was node
/// 1's or node 2's, not the guard's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_majority_view_shows_a_written_back_token_after_a_late_node_grants() {
    const LATE: Duration = Duration::from_millis(1500);
    let (servers, proxy, store) = one_fast_one_slow_one_direct().await;
    let k = key("late-node-view");
    let fence = store.nodes()[0].fence_key(&k);
    servers[0].cmd(&["SET", &fence, AHEAD]);
    proxy.set_latency(Duration::ZERO, LATE);
    let owner = OwnerToken::generate();
    let outcome = timeout(GUARD, store.acquire(&k, &owner, HOUR))
        .await
        .expect("the grant hung")
        .unwrap();
    let AcquireOutcome::Granted(token) = outcome else {
        panic!("not granted: {outcome:?}");
    };
    assert!(
        token.get() > AHEAD.parse::<u64>().unwrap(),
        "the grant did not answer node 0's token: {token:?}"
    );
    // Node 1's grant lands after the answer, and is kept (the guard's).
    assert!(
        eventually(GUARD, async || exists(&servers, &store, &k, 1)).await,
        "node 1 never granted"
    );
    proxy.set_latency(Duration::ZERO, Duration::ZERO);
    let seen = store.inspect(&k).await.unwrap().expect("held");
    assert_eq!(seen.fencing_token, Some(token), "the majority view's token");
    assert!(store.release(LeaseKind::Lock, &k, &owner).await.unwrap());
}
