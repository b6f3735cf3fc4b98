//! Redlock safety on real, independent `redis-server` processes: fencing tokens never go backwards across majorities that
//! differ, a token that does not reach a quorum is no grant, and node
//! errors are never turned into "not the owner".

use crate::support;

use std::time::Duration;

use bytes::Bytes;
use support::fault::FaultProxy;
use support::topology::start_independent;
use support::{RedisServer, eventually, eventually_some, stores};
use tower_redis_lock::{
    AcquireOutcome, Error, FencingToken, LeaseKind, LockKey, LockStore, LockStoreExt, OwnerToken,
    RedisStore, RedlockStore, Renewal,
};

/// Far above Redis `TIME` in µs (about 1.8e15 today), below 2^53 so the
/// acquire script's arithmetic stays exact.
const AHEAD: u64 = 5_000_000_000_000_000;
const LEASE: Duration = Duration::from_secs(30);
/// The command timeout of the tests that freeze nodes and wait for their
/// calls to time out: what one node's answer may take before it counts as
/// silent. Their first grant, on connections still opening, must get a
/// quorum of answers within it; 100 ms did not on a loaded machine (load
/// average 8-11: "only 2 of 5 Redlock nodes answered ... within 100 ms").
const SILENT_AFTER: Duration = Duration::from_secs(1);

fn key(id: &str) -> LockKey {
    LockKey::new("redlock-safety", id).unwrap()
}

fn granted(outcome: Result<AcquireOutcome, Error>) -> FencingToken {
    match outcome {
        Ok(AcquireOutcome::Granted(t)) => t,
        other => panic!("expected a grant, got {other:?}"),
    }
}

fn unavailable<T: std::fmt::Debug>(answer: Result<T, Error>) {
    match answer {
        Err(Error::Unavailable { .. }) => {}
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

/// Keeps `node` out of the next majority: someone else holds the lock
/// there, so it answers "held" and mints nothing.
fn occupy(store: &RedlockStore, servers: &[RedisServer], node: usize, k: &LockKey) {
    let lock = store.nodes()[node].lock_key(k);
    servers[node].cmd(&["SET", &lock, "someone-else", "PX", "60000"]);
}

/// Puts the fencing counter of `k`'s bucket far ahead on `nodes` (as if
/// the last counted token had been minted there).
fn fence_ahead(store: &RedlockStore, servers: &[RedisServer], nodes: &[usize], k: &LockKey) {
    for &node in nodes {
        let fence = store.nodes()[node].fence_key(k);
        servers[node].cmd(&["SET", &fence, &AHEAD.to_string()]);
    }
}

fn vacate(store: &RedlockStore, servers: &[RedisServer], node: usize, k: &LockKey) {
    servers[node].cmd(&["DEL", &store.nodes()[node].lock_key(k)]);
}

/// Two of three nodes have a fencing counter far ahead. Grants by the
/// majorities {0,1}, {0,2}, {1,2} and then all three must give strictly
/// increasing tokens: the grant's token is the largest of its majority
/// (not the smallest) and is written back to every granting node (without
/// the write-back, {1,2} would mint the token {0,2} already gave out).
#[tokio::test]
async fn tokens_increase_across_grants_whose_majorities_differ() {
    let servers = start_independent(3);
    let store = stores::redlock_over(&servers, Duration::from_millis(500));
    let k = key("majorities");
    fence_ahead(&store, &servers, &[0, 1], &k);
    let mut tokens = Vec::new();
    for excluded in [Some(2), Some(1), Some(0), None] {
        if let Some(n) = excluded {
            occupy(&store, &servers, n, &k);
        }
        let owner = OwnerToken::generate();
        tokens.push(granted(store.acquire(&k, &owner, LEASE).await));
        assert!(store.release(LeaseKind::Lock, &k, &owner).await.unwrap());
        if let Some(n) = excluded {
            vacate(&store, &servers, n, &k);
        }
    }
    for pair in tokens.windows(2) {
        assert!(
            pair[1] > pair[0],
            "tokens went backwards or repeated: {tokens:?}"
        );
    }
    assert!(tokens[0].get() > AHEAD, "{tokens:?}");
}

/// Every node of five answers the grant, all after one outage, so that the
/// last answer comes right after the quorum's (the store waits for the
/// others as long again as the quorum took): five fresh mints make a
/// token that counts without a write-back, the quorum-th largest.
/// `last`: a node thawed only once the others have granted, so that its
/// answer comes last. Warmed up first, so that each node's connection
/// exists before it is frozen.
async fn grant_by_all_five(
    store: &RedlockStore,
    servers: &[RedisServer],
    k: &LockKey,
    owner: &OwnerToken,
    last: Option<usize>,
) -> FencingToken {
    let warm = (key("all-five-warm-up"), OwnerToken::generate());
    // A 5 s lease: on connections still opening, a node's grant may land
    // after its release (a grant whose answer was lost, which the store
    // contract lets expire at its lease); with the test's 30 s lease the
    // wait below outlasted it once under load.
    granted(
        store
            .acquire(&warm.0, &warm.1, Duration::from_secs(5))
            .await,
    );
    assert!(
        store
            .release(LeaseKind::Lock, &warm.0, &warm.1)
            .await
            .unwrap()
    );
    // The release answers at a quorum; the other nodes' release scripts
    // run in the background, and one that ran after `reset_stats` below
    // was counted as a write-back (seen once under load).
    let warm_locks: Vec<String> = store.nodes().iter().map(|n| n.lock_key(&warm.0)).collect();
    let released_everywhere = eventually(Duration::from_secs(10), async || {
        (0..servers.len()).all(|i| servers[i].cmd(&["EXISTS", &warm_locks[i]]).as_int() == Some(0))
    })
    .await;
    assert!(
        released_everywhere,
        "the warm-up lock is still held somewhere"
    );
    for s in servers {
        s.reset_stats();
        s.freeze();
    }
    let acquire = tokio::spawn({
        let (store, k, owner) = (store.clone(), k.clone(), owner.clone());
        async move { store.acquire(&k, &owner, LEASE).await }
    });
    // The outage: its length is what the quorum takes, and so how long the
    // grant waits for the nodes after the quorum — the window in which
    // `last`, thawed once the others granted, must answer. Five seconds,
    // so that a loaded machine's polling and thawing fit in it (200 ms did
    // not: 6 scripts, a write-back, once in 20 runs; nor did 1 s once, in
    // CI's Valkey pass on six test threads, nor 3 s once, in that pass
    // while helpers built on the same two cores).
    tokio::time::sleep(Duration::from_secs(5)).await;
    let others: Vec<usize> = (0..servers.len()).filter(|&i| Some(i) != last).collect();
    for &i in &others {
        servers[i].thaw();
    }
    if let Some(last) = last {
        let locks: Vec<String> = store.nodes().iter().map(|n| n.lock_key(k)).collect();
        let others_granted = eventually(Duration::from_secs(10), async || {
            others
                .iter()
                .all(|&i| servers[i].cmd(&["EXISTS", &locks[i]]).as_int() == Some(1))
        })
        .await;
        assert!(others_granted);
        servers[last].thaw();
    }
    granted(acquire.await.unwrap())
}

/// Three nodes of five hold counters far ahead (the last token counted
/// there), two are behind. When all five grant, the token is the median of
/// the five mints, above the counted one: neither the smallest nor the
/// second smallest (both minted by the nodes that were behind) may be
/// taken, for they are below what the majority already gave out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_by_every_node_is_above_the_majority_that_counted_last() {
    let servers = start_independent(5);
    let store = stores::redlock_over(&servers, Duration::from_secs(3600));
    let k = key("all-five-above");
    fence_ahead(&store, &servers, &[0, 1, 2], &k);
    let owner = OwnerToken::generate();
    let token = grant_by_all_five(&store, &servers, &k, &owner, None).await;
    assert!(token.get() > AHEAD, "{token:?} is not above {AHEAD}");
    assert!(store.release(LeaseKind::Lock, &k, &owner).await.unwrap());
}

/// A re-entry by the same owner (a lost answer, retried) keeps its token
/// whatever the timing of the answers, as long as every node answers it:
/// a grant by all five (its token the median of five distinct mints,
/// nothing written back), then the same owner again with node 4 answering
/// `LATE` after the other four, far past a wait "as long again" as the
/// quorum took. Four counters alone cannot give the median back (the
/// largest of them is above it), so the re-entry waits for node 4. (It
/// did not: this test failed by chance when node 4's answer
/// landed late; it now lands late on every run.) With node 4 frozen past
/// half the re-entry's validity, the re-entry cannot know the grant's
/// token: it answers the largest of the four counters, written back —
/// never less than its grant. Node 4 sits behind a [`FaultProxy`]
/// holding its answers back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reentry_keeps_its_token_when_an_answer_comes_late() {
    const LATE: Duration = Duration::from_secs(1);
    let servers = start_independent(5);
    let proxy = FaultProxy::start(servers[4].addr()).await;
    let mut urls: Vec<String> = servers[..4].iter().map(RedisServer::url).collect();
    urls.push(proxy.url());
    let store = stores::redlock_over_urls(&urls, Duration::from_secs(3600));
    let k = key("all-five-reentered");
    // Distinct mints, in node order: node i mints AHEAD + 10 i + 1.
    for (i, s) in servers.iter().enumerate() {
        let fence = store.nodes()[i].fence_key(&k);
        s.cmd(&["SET", &fence, &(AHEAD + 10 * i as u64).to_string()]);
    }
    let owner = OwnerToken::generate();
    let first = grant_by_all_five(&store, &servers, &k, &owner, None).await;
    assert_eq!(first.get(), AHEAD + 21, "not the median of five mints");
    proxy.set_latency(Duration::ZERO, LATE);
    let again = granted(store.acquire(&k, &owner, LEASE).await);
    assert_eq!(again, first, "the re-entry did not wait for node 4");
    proxy.set_latency(Duration::ZERO, Duration::ZERO);
    servers[4].freeze();
    let short = Duration::from_secs(2);
    let again = granted(store.acquire(&k, &owner, short).await);
    assert!(again >= first, "{again:?} is below the grant's {first:?}");
    assert!(store.release(LeaseKind::Lock, &k, &owner).await.unwrap());
    servers[4].thaw();
    let next = OwnerToken::generate();
    let later = eventually_some(Duration::from_secs(10), async || {
        match store.acquire(&k, &next, LEASE).await {
            Ok(AcquireOutcome::Granted(t)) => Some(t),
            _ => None,
        }
    })
    .await
    .expect("granted once node 4 has run the queued release");
    assert!(later > again, "{later:?} is not above {again:?}");
}

/// One node of five has a counter far ahead, and answers last. When all
/// five grant, nothing is written back (5 scripts run, the grants), and the
/// token is not that node's (the largest): without a write-back only that
/// node would hold it, and the next majority, without that node, would
/// mint less. The next grant, by the other four, must be larger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_by_every_node_counts_without_a_write_back_and_stays_below_the_next() {
    let servers = start_independent(5);
    let store = stores::redlock_over(&servers, Duration::from_secs(3600));
    let k = key("all-five-durable");
    fence_ahead(&store, &servers, &[0], &k);
    let owner = OwnerToken::generate();
    let first = grant_by_all_five(&store, &servers, &k, &owner, Some(0)).await;
    let scripts: u64 = servers.iter().map(|s| s.command_calls("evalsha")).sum();
    assert_eq!(
        scripts, 5,
        "a write-back ran: the late fifth answer was not waited for"
    );
    assert!(
        first.get() < AHEAD,
        "{first:?}: the largest mint was taken, not the median"
    );
    assert!(store.release(LeaseKind::Lock, &k, &owner).await.unwrap());
    // Node 0 out of the next majority: the other four grant.
    occupy(&store, &servers, 0, &k);
    let next = OwnerToken::generate();
    let second = granted(store.acquire(&k, &next, LEASE).await);
    assert!(second > first, "{second:?} is not above {first:?}");
    assert!(store.release(LeaseKind::Lock, &k, &next).await.unwrap());
}

/// The write-back of the token reaches only one node of five: nodes 2, 3
/// and 4 are frozen while nodes 0 and 1 grant; nodes 0 and 1 are frozen in
/// turn, and node 2, whose counter is far ahead (so the token is its own
/// and the others need the write-back), is thawed: its grant makes the
/// quorum, the write-back to nodes 0 and 1 times out, and the acquire
/// answers Unavailable; once the nodes are back, nothing is left locked.
/// (The acquire answers at a quorum, without waiting for every node, so
/// the window is made by freezing the nodes that need the
/// write-back before the quorum is reached.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_back_short_of_a_quorum_is_no_grant() {
    let servers = start_independent(5);
    let store = stores::redlock_over(&servers, Duration::from_millis(1500));
    let k = key("write-back");
    let owner = OwnerToken::generate();
    fence_ahead(&store, &servers, &[2], &k);
    for s in &servers[2..] {
        s.freeze();
    }
    let acquire = tokio::spawn({
        let (store, k, owner) = (store.clone(), k.clone(), owner.clone());
        async move { store.acquire(&k, &owner, LEASE).await }
    });
    let locks: Vec<String> = store.nodes().iter().map(|n| n.lock_key(&k)).collect();
    let granted_on_two = eventually(Duration::from_secs(10), async || {
        (0..2).all(|i| servers[i].cmd(&["EXISTS", &locks[i]]).as_int() == Some(1))
    })
    .await;
    assert!(granted_on_two);
    assert!(
        !acquire.is_finished(),
        "the acquire answered without a quorum"
    );
    for s in &servers[..2] {
        s.freeze();
    }
    servers[2].thaw();
    unavailable(acquire.await.unwrap());
    for s in &servers {
        s.thaw();
    }
    let unlocked = eventually(Duration::from_secs(10), async || {
        (0..5).all(|i| servers[i].cmd(&["EXISTS", &locks[i]]).as_int() == Some(0))
    })
    .await;
    assert!(
        unlocked,
        "a lock was left behind: {:?}",
        (0..5)
            .map(|i| servers[i].cmd(&["PTTL", &locks[i]]).as_int())
            .collect::<Vec<_>>()
    );
    let other = OwnerToken::generate();
    granted(store.acquire(&k, &other, LEASE).await);
}

/// The nodes that minted the grant's token hold it already: the write-back
/// goes to the others, and only their acknowledgements count on top.
/// Five nodes; 0 and 1 mint the same (largest) token, 2 a smaller one and
/// then fails the write-back only (its script cache holds the grant and
/// release scripts, and loading any other is refused), 3 and 4 are frozen.
/// The token is held by 2 of 5 counters, so the grant must not count —
/// counting 0 and 1 a second time would make it 4 of 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_back_counts_each_node_once() {
    let servers = start_independent(5);
    let store = stores::redlock_over(&servers, Duration::from_secs(3600));
    let k = key("count-once");
    // Connected to every node while all answer.
    let warm = (key("count-once-warm-up"), OwnerToken::generate());
    granted(store.acquire(&warm.0, &warm.1, LEASE).await);
    assert!(
        store
            .release(LeaseKind::Lock, &warm.0, &warm.1)
            .await
            .unwrap()
    );
    fence_ahead(&store, &servers, &[0, 1], &k);
    // Node 2: only the grant and release scripts, and no way to load more.
    servers[2].cmd(&["SCRIPT", "FLUSH"]);
    for src in RedisStore::lock_script_sources() {
        servers[2].cmd(&["SCRIPT", "LOAD", src]);
    }
    let denied = servers[2].cmd(&["ACL", "SETUSER", "default", "-script|load", "-eval"]);
    assert_eq!(denied.as_string().as_deref(), Some("OK"), "{denied:?}");
    servers[3].freeze();
    servers[4].freeze();
    let owner = OwnerToken::generate();
    unavailable(store.acquire(&k, &owner, LEASE).await);
    // Undone where it was granted.
    for (i, s) in servers.iter().enumerate().take(3) {
        let lock = store.nodes()[i].lock_key(&k);
        assert_eq!(s.cmd(&["EXISTS", &lock]).as_int(), Some(0), "node {i}");
    }
    servers[3].thaw();
    servers[4].thaw();
}

/// Five nodes, three frozen: a release cannot tell whether it released,
/// so it says Unavailable (the guard retries), never "not the owner".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_without_a_quorum_of_answers_is_unavailable() {
    let servers = start_independent(5);
    let store = stores::redlock_over(&servers, SILENT_AFTER);
    let k = key("release");
    let owner = OwnerToken::generate();
    granted(store.acquire(&k, &owner, LEASE).await);
    for s in &servers[2..] {
        s.freeze();
    }
    unavailable(store.release(LeaseKind::Lock, &k, &owner).await);
    for s in &servers[2..] {
        s.thaw();
    }
    // A definite answer once they are back: released, or (the frozen
    // nodes ran the queued release first) no longer ours anywhere.
    let answered = support::eventually_some(Duration::from_secs(10), async || {
        store.release(LeaseKind::Lock, &k, &owner).await.ok()
    })
    .await;
    assert!(answered.is_some());
}

/// Two nodes refuse (another owner), two are frozen, one extends: too few
/// answers to call the lease lost. Unavailable, so the watchdog retries and
/// the deadline decides; with three refusals it is definitely lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extend_with_errors_and_refusals_is_not_a_loss() {
    let servers = start_independent(5);
    let store = stores::redlock_over(&servers, SILENT_AFTER);
    let k = key("extend");
    let owner = OwnerToken::generate();
    granted(store.acquire(&k, &owner, LEASE).await);
    for node in [0, 1] {
        occupy(&store, &servers, node, &k);
    }
    servers[3].freeze();
    servers[4].freeze();
    unavailable(store.renew(LeaseKind::Lock, &k, &owner, LEASE).await);
    let many = store
        .renew_many(&[Renewal {
            key: k.clone(),
            owner: owner.clone(),
            lease: LEASE,
            kind: tower_redis_lock::LeaseKind::Lock,
        }])
        .await;
    assert_eq!(many.len(), 1);
    unavailable(many.into_iter().next().unwrap());
    servers[3].thaw();
    servers[4].thaw();

    occupy(&store, &servers, 2, &k);
    assert!(
        !store
            .renew(LeaseKind::Lock, &k, &owner, LEASE)
            .await
            .unwrap()
    );
}

/// A finish that reaches two nodes of five is no completed work: it says
/// Unavailable, takes back what it stored on the two at once, and once the
/// nodes are back no record is replayed — nor from the three frozen ones
/// that may run the queued finish late (the rollback is retried there until
/// they answer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finish_short_of_a_quorum_leaves_no_replayable_record() {
    let servers = start_independent(5);
    let store = stores::redlock_over(&servers, SILENT_AFTER);
    let k = key("finish");
    let owner = OwnerToken::generate();
    granted(store.acquire(&k, &owner, LEASE).await);
    for s in &servers[2..] {
        s.freeze();
    }
    unavailable(
        store
            .finish(
                &k,
                &owner,
                Bytes::from_static(b"done"),
                Duration::from_secs(60),
            )
            .await,
    );
    for s in &servers[2..] {
        s.thaw();
    }
    let records: Vec<String> = store.nodes().iter().map(|n| n.record_key(&k)).collect();
    let locks: Vec<String> = store.nodes().iter().map(|n| n.lock_key(&k)).collect();
    let clean = eventually(Duration::from_secs(10), async || {
        (0..5).all(|i| {
            servers[i].cmd(&["EXISTS", &records[i]]).as_int() == Some(0)
                && servers[i].cmd(&["EXISTS", &locks[i]]).as_int() == Some(0)
        })
    })
    .await;
    assert!(
        clean,
        "a record or lock was left behind: {:?}",
        (0..5)
            .map(|i| (
                servers[i].cmd(&["PTTL", &records[i]]).as_int(),
                servers[i].cmd(&["PTTL", &locks[i]]).as_int()
            ))
            .collect::<Vec<_>>()
    );
    assert_eq!(store.read_record(&k).await.unwrap(), None);
    let other = OwnerToken::generate();
    granted(store.acquire_or_replay(&k, &other, LEASE).await);
}

/// Three of five nodes are down (stopped, so no late finish): the finish
/// says Unavailable and takes its record back from the two that stored it,
/// owner-checked; reads cannot tell with two nodes; once the three are back
/// (empty) there is no record and the key can be taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finish_on_a_minority_takes_its_record_back() {
    let mut servers = start_independent(5);
    let store = stores::redlock_over(&servers, SILENT_AFTER);
    let k = key("finish-stopped");
    let owner = OwnerToken::generate();
    granted(store.acquire(&k, &owner, LEASE).await);
    for s in &mut servers[2..] {
        s.stop();
    }
    unavailable(
        store
            .finish(
                &k,
                &owner,
                Bytes::from_static(b"done"),
                Duration::from_secs(60),
            )
            .await,
    );
    for i in [0, 1] {
        let record = store.nodes()[i].record_key(&k);
        let lock = store.nodes()[i].lock_key(&k);
        assert_eq!(
            servers[i].cmd(&["EXISTS", &record, &lock]).as_int(),
            Some(0)
        );
    }
    unavailable(store.read_record(&k).await);
    for s in &mut servers[2..] {
        s.restart();
    }
    assert_eq!(store.read_record(&k).await.unwrap(), None);
    let other = OwnerToken::generate();
    let token = support::eventually_some(Duration::from_secs(10), async || {
        match store.acquire_or_replay(&k, &other, LEASE).await {
            Ok(AcquireOutcome::Granted(t)) => Some(t),
            Ok(other) => panic!("{other:?}"),
            Err(_) => None,
        }
    })
    .await;
    assert!(token.is_some());
}

/// A record counts only where a quorum holds it: on two nodes of five
/// (what a failed finish whose rollback was lost leaves) it is no record;
/// with two of the other three frozen nobody can tell; on three it is one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_on_a_minority_is_not_replayed() {
    let servers = start_independent(5);
    let store = stores::redlock_over(&servers, SILENT_AFTER);
    let k = key("minority");
    let records: Vec<String> = store.nodes().iter().map(|n| n.record_key(&k)).collect();
    for i in [0, 1] {
        servers[i].cmd(&["SET", &records[i], "stale"]);
    }
    assert_eq!(store.read_record(&k).await.unwrap(), None);
    let owner = OwnerToken::generate();
    granted(store.acquire_or_replay(&k, &owner, LEASE).await);
    assert!(store.release(LeaseKind::Lock, &k, &owner).await.unwrap());

    servers[3].freeze();
    servers[4].freeze();
    unavailable(store.read_record(&k).await);
    servers[3].thaw();
    servers[4].thaw();

    servers[2].cmd(&["SET", &records[2], "stale"]);
    assert_eq!(
        store.read_record(&k).await.unwrap(),
        Some(Bytes::from_static(b"stale"))
    );
}

/// A finish that definitely lost its lock (refused on a majority) is
/// still `Ok(false)`, and a plain release of a lock nobody holds is too.
#[tokio::test]
async fn definite_refusals_are_still_false() {
    let (store, servers) = stores::redlock(5);
    let k = key("refused");
    let owner = OwnerToken::generate();
    granted(store.acquire(&k, &owner, LEASE).await);
    for node in [0, 1, 2] {
        occupy(&store, &servers, node, &k);
    }
    assert!(
        !store
            .finish(&k, &owner, Bytes::from_static(b"x"), Duration::from_secs(5))
            .await
            .unwrap()
    );
    assert_eq!(store.read_record(&k).await.unwrap(), None);
    assert!(!store.release(LeaseKind::Lock, &k, &owner).await.unwrap());
}

/// What a re-entry at the store cannot keep: the counters are per fencing
/// bucket, so once another lock of the same bucket was granted, a re-entry
/// by the same owner answers a larger token than its grant's (on one Redis
/// as on Redlock, as `LockStore::acquire` says) — still valid for the
/// hold: at least its grant's, and below the next holder's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reentry_after_a_bucket_mates_grant_is_still_valid_for_its_hold() {
    async fn check(store: &impl LockStore, a: &LockKey, b: &LockKey) {
        let (oa, ob) = (OwnerToken::generate(), OwnerToken::generate());
        let first = granted(store.acquire(a, &oa, LEASE).await);
        let mate = granted(store.acquire(b, &ob, LEASE).await);
        let again = granted(store.acquire(a, &oa, LEASE).await);
        assert!(
            again >= first && again >= mate,
            "{again:?} < {first:?}, {mate:?}"
        );
        assert!(store.release(LeaseKind::Lock, a, &oa).await.unwrap());
        let next = OwnerToken::generate();
        let later = granted(store.acquire(a, &next, LEASE).await);
        assert!(later > again, "{later:?} is not above {again:?}");
    }
    let (redis, _server) = stores::redis();
    let (redlock, _servers) = stores::redlock(3);
    let a = key("bucket-a");
    let fence = redis.fence_key(&a);
    let b = (0..100_000)
        .map(|i| key(&format!("bucket-b{i}")))
        .find(|k| redis.fence_key(k) == fence)
        .expect("another id of the same fencing bucket");
    check(&redis, &a, &b).await;
    check(&redlock, &a, &b).await;
}
