//! Every store call that runs a Lua script still works, and answers what
//! it should, when Redis has lost its scripts (`SCRIPT FLUSH`, as after a
//! restart or a failover to a replica): the call meets `NOSCRIPT`, loads
//! its script and sends itself once more. The cache is flushed before each
//! call, after the store has connected (a new connection loads every
//! script up front, which would hide the fallback), so that each call
//! meets `NOSCRIPT` itself. And the other way round: the first use of
//! every call on a store that has just connected meets no `NOSCRIPT` (see
//! "First uses" below). Real `redis-server` processes.

use crate::support;

use std::time::Duration;

use bytes::Bytes;
use support::topology::{Cluster, start_independent};
use support::{RedisServer, stores};
use tower_redis_lock::{
    AcquireAllOutcome, AcquireOutcome, FencingToken, LeaseKind, ListCursor, LockKey, LockStore,
    LockStoreExt, OperatorStore, OwnerToken, RedisStore, RedlockStore, Renewal, ReplicaShortfall,
};

const LEASE: Duration = Duration::from_secs(30);
const RETENTION: Duration = Duration::from_secs(60);

fn key(id: &str) -> LockKey {
    LockKey::new("noscript", id).unwrap()
}

fn fenced(server: &RedisServer) -> RedisStore {
    RedisStore::builder(&server.url()).build().unwrap()
}

fn unfenced(server: &RedisServer) -> RedisStore {
    RedisStore::builder(&server.url())
        .fencing(false)
        .build()
        .unwrap()
}

/// A store whose grants wait for a replica (there is none: `WAIT`
/// answers 0 after 20 ms, and `Proceed` keeps the grant).
fn waiting_for_a_replica(server: &RedisServer) -> RedisStore {
    RedisStore::builder(&server.url())
        .wait_replicas(1, Duration::from_millis(20), ReplicaShortfall::Proceed)
        .build()
        .unwrap()
}

/// Connects `store` (which loads the usual scripts) with a call of its own,
/// so that a later flush is met by the calls under test.
async fn connect(store: &RedisStore) {
    let warm = (key("warm-up"), OwnerToken::generate());
    let granted = store.acquire(&warm.0, &warm.1, LEASE).await.unwrap();
    assert!(
        matches!(
            granted,
            AcquireOutcome::Granted(_) | AcquireOutcome::GrantedUnfenced
        ),
        "{granted:?}"
    );
    assert!(
        store
            .release(LeaseKind::Lock, &warm.0, &warm.1)
            .await
            .unwrap()
    );
}

/// Empties the server's script cache, and its command counts (for
/// [`reloaded`]).
fn flush_scripts(server: &RedisServer) {
    let ok = server.cmd(&["SCRIPT", "FLUSH"]);
    assert_eq!(ok.as_string().as_deref(), Some("OK"), "{ok:?}");
    server.reset_stats();
}

/// The calls since [`flush_scripts`] loaded `n` scripts: each call met
/// `NOSCRIPT` and loaded its script once (the connection was not reopened,
/// which would load every script).
fn reloaded(server: &RedisServer, n: u64) {
    assert_eq!(
        server.command_calls("script|load"),
        n,
        "{:?}",
        server.command_stats()
    );
}

fn get(server: &RedisServer, name: &str) -> Option<Vec<u8>> {
    match server.cmd(&["GET", name]) {
        support::Reply::Bulk(v) => v,
        other => panic!("GET {name}: {other:?}"),
    }
}

fn exists(server: &RedisServer, name: &str) -> bool {
    server.cmd(&["EXISTS", name]).as_int() == Some(1)
}

fn pttl(server: &RedisServer, name: &str) -> i64 {
    server.cmd(&["PTTL", name]).as_int().unwrap()
}

fn token(outcome: AcquireOutcome) -> FencingToken {
    match outcome {
        AcquireOutcome::Granted(t) => t,
        other => panic!("not granted with a token: {other:?}"),
    }
}

/// Fenced acquire: a grant (with the bucket's counter as its token) and a
/// refusal (the holder's lease left), each after a flush.
#[tokio::test]
async fn a_fenced_acquire_reloads_the_script() {
    let server = RedisServer::start();
    let store = fenced(&server);
    connect(&store).await;
    let (k, owner, other) = (
        key("fenced"),
        OwnerToken::generate(),
        OwnerToken::generate(),
    );

    flush_scripts(&server);
    let t = token(store.acquire(&k, &owner, LEASE).await.unwrap());
    reloaded(&server, 1);
    // The owner token, then the holder record, the grant's token first.
    let value = get(&server, &store.lock_key(&k)).unwrap();
    assert!(value.starts_with(format!("{} {t} ", owner.as_str()).as_bytes()));
    assert_eq!(
        get(&server, &store.fence_key(&k)).as_deref(),
        Some(t.get().to_string().as_bytes())
    );

    flush_scripts(&server);
    match store.acquire(&k, &other, LEASE).await.unwrap() {
        AcquireOutcome::Held {
            remaining: Some(left),
        } => assert!(left > LEASE / 2 && left <= LEASE, "{left:?}"),
        outcome => panic!("not held: {outcome:?}"),
    }
    reloaded(&server, 1);
    // The refused attempt marked the lock as waited for.
    assert!(exists(&server, &store.waited_key(&k)));
}

/// Unfenced acquire: a free lock is a plain `SET` (no script, nothing to
/// reload); a taken one runs the script: a refusal for another owner and a
/// re-entry for the holder, each after a flush.
#[tokio::test]
async fn an_unfenced_acquire_reloads_the_script() {
    let server = RedisServer::start();
    let store = unfenced(&server);
    connect(&store).await;
    let (k, owner, other) = (
        key("unfenced"),
        OwnerToken::generate(),
        OwnerToken::generate(),
    );

    flush_scripts(&server);
    assert_eq!(
        store.acquire(&k, &owner, LEASE).await.unwrap(),
        AcquireOutcome::GrantedUnfenced
    );
    reloaded(&server, 0);

    flush_scripts(&server);
    assert!(matches!(
        store.acquire(&k, &other, LEASE).await.unwrap(),
        AcquireOutcome::Held { remaining: Some(_) }
    ));
    reloaded(&server, 1);

    flush_scripts(&server);
    assert_eq!(
        store.acquire(&k, &owner, LEASE).await.unwrap(),
        AcquireOutcome::GrantedUnfenced
    );
    reloaded(&server, 1);
    assert_eq!(
        get(&server, &store.lock_key(&k)).as_deref(),
        Some(owner.as_str().as_bytes())
    );
    assert!(!exists(&server, &store.fence_key(&k)));
}

/// Acquire-or-replay, finish and the replay of the record, fenced and
/// unfenced (both always run the script), each after a flush.
#[tokio::test]
async fn acquire_or_replay_and_finish_reload_their_scripts() {
    let server = RedisServer::start();
    for (name, store) in [("fenced", fenced(&server)), ("unfenced", unfenced(&server))] {
        connect(&store).await;
        let k = key(&format!("replay-{name}"));
        let (owner, later) = (OwnerToken::generate(), OwnerToken::generate());

        flush_scripts(&server);
        let granted = store.acquire_or_replay(&k, &owner, LEASE).await.unwrap();
        match (name, &granted) {
            ("fenced", AcquireOutcome::Granted(_))
            | ("unfenced", AcquireOutcome::GrantedUnfenced) => {}
            _ => panic!("{name}: not granted: {granted:?}"),
        }
        reloaded(&server, 1);

        flush_scripts(&server);
        let record = Bytes::from_static(b"{\"status\":201}");
        assert!(
            store
                .finish(&k, &owner, record.clone(), RETENTION)
                .await
                .unwrap(),
            "{name}"
        );
        reloaded(&server, 1);
        // Stored for the retention, and the lock released.
        let record_key = store.record_key(&k);
        assert_eq!(get(&server, &record_key).as_deref(), Some(&record[..]));
        let left = pttl(&server, &record_key);
        assert!(left > 0 && left <= RETENTION.as_millis() as i64, "{left}");
        assert!(!exists(&server, &store.lock_key(&k)), "{name}");

        flush_scripts(&server);
        assert_eq!(
            store.acquire_or_replay(&k, &later, LEASE).await.unwrap(),
            AcquireOutcome::Completed(record),
            "{name}"
        );
        reloaded(&server, 1);
        assert!(!exists(&server, &store.lock_key(&k)), "{name}");
    }
}

/// Release by the holder (the lock is gone) and by another owner (refused,
/// the lock stays), each after a flush.
#[tokio::test]
async fn a_release_reloads_the_script() {
    let server = RedisServer::start();
    let store = fenced(&server);
    connect(&store).await;
    let (k, owner, other) = (
        key("release"),
        OwnerToken::generate(),
        OwnerToken::generate(),
    );
    token(store.acquire(&k, &owner, LEASE).await.unwrap());
    let lock = store.lock_key(&k);

    flush_scripts(&server);
    assert!(!store.release(LeaseKind::Lock, &k, &other).await.unwrap());
    reloaded(&server, 1);
    assert!(exists(&server, &lock));

    flush_scripts(&server);
    assert!(store.release(LeaseKind::Lock, &k, &owner).await.unwrap());
    reloaded(&server, 1);
    assert!(!exists(&server, &lock));
    assert!(!exists(&server, &store.waited_key(&k)));
}

/// Renewal, one by one (`extend`) and in a batch (`extend_many`, one
/// pipeline), each after a flush: the holder's lease is renewed, another
/// owner's is refused.
#[tokio::test]
async fn renewals_reload_the_script() {
    let server = RedisServer::start();
    let store = fenced(&server);
    connect(&store).await;
    let short = Duration::from_secs(5);
    let (a, b) = (key("extend-a"), key("extend-b"));
    let (owner, other) = (OwnerToken::generate(), OwnerToken::generate());
    for k in [&a, &b] {
        token(store.acquire(k, &owner, short).await.unwrap());
    }

    flush_scripts(&server);
    assert!(
        !store
            .renew(LeaseKind::Lock, &a, &other, LEASE)
            .await
            .unwrap()
    );
    reloaded(&server, 1);
    assert!(pttl(&server, &store.lock_key(&a)) <= short.as_millis() as i64);

    flush_scripts(&server);
    assert!(
        store
            .renew(LeaseKind::Lock, &a, &owner, LEASE)
            .await
            .unwrap()
    );
    reloaded(&server, 1);
    assert!(pttl(&server, &store.lock_key(&a)) > short.as_millis() as i64);

    flush_scripts(&server);
    let renewals = [
        Renewal {
            key: b.clone(),
            owner: owner.clone(),
            lease: LEASE,
            kind: tower_redis_lock::LeaseKind::Lock,
        },
        Renewal {
            key: a.clone(),
            owner: other.clone(),
            lease: Duration::from_millis(1),
            kind: tower_redis_lock::LeaseKind::Lock,
        },
    ];
    let answers = store.renew_many(&renewals).await;
    let answers: Vec<bool> = answers.into_iter().map(Result::unwrap).collect();
    assert_eq!(answers, [true, false]);
    reloaded(&server, 1);
    assert!(pttl(&server, &store.lock_key(&b)) > short.as_millis() as i64);
    assert!(pttl(&server, &store.lock_key(&a)) > short.as_millis() as i64);
}

/// The grant that `WAIT`s for replicas runs on a connection of its own:
/// there too a flushed cache is reloaded. (No replica: `WAIT` answers 0
/// after its timeout, and `Proceed` keeps the grant.)
#[tokio::test]
async fn a_grant_that_waits_for_replicas_reloads_the_script() {
    let server = RedisServer::start();
    let store = waiting_for_a_replica(&server);
    connect(&store).await;
    let (k, owner, other) = (key("wait"), OwnerToken::generate(), OwnerToken::generate());

    flush_scripts(&server);
    let t = token(store.acquire(&k, &owner, LEASE).await.unwrap());
    reloaded(&server, 1);
    assert_eq!(
        get(&server, &store.fence_key(&k)).as_deref(),
        Some(t.get().to_string().as_bytes())
    );

    flush_scripts(&server);
    assert!(matches!(
        store.acquire(&k, &other, LEASE).await.unwrap(),
        AcquireOutcome::Held { remaining: Some(_) }
    ));
    reloaded(&server, 1);
    // Still the holder's: the owner token, then the grant's token.
    let value = get(&server, &store.lock_key(&k)).unwrap();
    assert!(value.starts_with(format!("{} {t} ", owner.as_str()).as_bytes()));
}

/// Redlock's node calls that only it makes: the fence write-back (a node
/// mints a larger token, and the other granting node is raised to it) and
/// the rollback of a finish short of its quorum (the record taken back
/// where it was stored), each after a flush of every node.
#[tokio::test]
async fn redlock_write_back_and_rollback_reload_their_scripts() {
    let servers = start_independent(3);
    let store = stores::redlock_over(&servers, Duration::from_secs(2));
    for node in store.nodes() {
        connect(node).await;
    }
    write_back_then_rollback(&servers, &store, "redlock", || {
        servers.iter().for_each(flush_scripts);
    })
    .await;
}

/// Over Redlock's `servers`: a grant by the majority {0, 1} (node 2 held
/// by someone else) whose token, minted by node 0 far ahead, is written
/// back to node 1; then, the lock lost on node 1 too, a finish that stores
/// its record on node 0 only, no quorum, and takes it back there. `before`
/// runs before the grant and before the finish.
async fn write_back_then_rollback(
    servers: &[RedisServer],
    store: &RedlockStore,
    id: &str,
    before: impl Fn(),
) {
    // Far above Redis `TIME` in µs, below 2^53 (see tests/redlock_safety.rs).
    const AHEAD: u64 = 5_000_000_000_000_000;
    let nodes = store.nodes();
    let (k, owner) = (key(id), OwnerToken::generate());
    let lost = |i: usize| {
        servers[i].cmd(&["SET", &nodes[i].lock_key(&k), "someone-else", "PX", "60000"]);
    };
    lost(2);
    servers[0].cmd(&["SET", &nodes[0].fence_key(&k), &AHEAD.to_string()]);

    before();
    let t = token(store.acquire(&k, &owner, LEASE).await.unwrap());
    assert_eq!(t.get(), AHEAD + 1);
    for (i, s) in servers.iter().enumerate().take(2) {
        assert_eq!(
            get(s, &nodes[i].fence_key(&k)).as_deref(),
            Some(t.get().to_string().as_bytes()),
            "node {i}"
        );
    }

    lost(1);
    before();
    let finished = store
        .finish(&k, &owner, Bytes::from_static(b"done"), RETENTION)
        .await;
    assert!(!matches!(finished, Ok(true)), "{finished:?}");
    assert!(!exists(&servers[0], &nodes[0].record_key(&k)));
    assert!(!exists(&servers[0], &nodes[0].lock_key(&k)));
    for (i, s) in servers.iter().enumerate().skip(1) {
        assert_eq!(
            get(s, &nodes[i].lock_key(&k)).as_deref(),
            Some(&b"someone-else"[..]),
            "node {i}"
        );
    }
}

/// On a Cluster the script is reloaded where the call goes, the primary
/// of its slot: `SCRIPT LOAD` as a plain command goes to every
/// node the cluster connection knows, so one frozen node failed every
/// reload until the command timeout. Three primaries with a replica
/// each, and a node timeout longer than the test (no failover); after
/// `SCRIPT FLUSH` everywhere, with a replica and the primary of another
/// slot frozen, a grant, a renewal (one and a batch) and a release each
/// meet `NOSCRIPT` and answer (an answer at all is within the command
/// timeout: the store cuts every call there). Fails on the old reload by
/// the frozen primary: the grant times out. (The client holds no
/// connection to replicas, as the store never reads from them, so a
/// frozen replica alone did not stall the old reload either.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_reloads_a_script_only_on_the_calls_primary() {
    let cluster = Cluster::start_with_replicas(3, 1, &["--cluster-node-timeout", "600000"]);
    let urls = cluster.urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let store = RedisStore::cluster_builder(&urls)
        .command_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    connect(&store).await;
    let (k, owner) = (key("cluster-reload"), OwnerToken::generate());
    let home = cluster.node_for_slot(cluster.slot_of(&store.lock_key(&k)));
    let replica = cluster.replica_indices();
    assert_eq!(replica.len(), 3, "{}", cluster.diagnostics());
    let other = (0..cluster.nodes.len())
        .find(|i| *i != home && !replica.contains(i))
        .unwrap();
    let frozen = [replica[0], other];
    let flush = || {
        for (i, node) in cluster.nodes.iter().enumerate() {
            if !frozen.contains(&i) {
                flush_scripts(node);
            }
        }
    };
    flush();
    for i in frozen {
        cluster.nodes[i].freeze();
    }
    let granted = store.acquire(&k, &owner, LEASE).await;
    assert!(
        matches!(granted, Ok(AcquireOutcome::Granted(_))),
        "{granted:?}"
    );
    reloaded(&cluster.nodes[home], 1);
    flush();
    assert!(
        store
            .renew(LeaseKind::Lock, &k, &owner, LEASE)
            .await
            .unwrap()
    );
    flush();
    let renewal = Renewal {
        key: k.clone(),
        owner: owner.clone(),
        lease: LEASE,
        kind: tower_redis_lock::LeaseKind::Lock,
    };
    let many = store.renew_many(&[renewal]).await;
    assert!(matches!(many[..], [Ok(true)]), "{many:?}");
    flush();
    assert!(store.release(LeaseKind::Lock, &k, &owner).await.unwrap());
    for i in frozen {
        cluster.nodes[i].thaw();
    }
}

// First uses. A store's first connection to a server loads every script
// the store runs (in one round trip with it), so that no call's first use
// pays for `NOSCRIPT`, `SCRIPT LOAD` and its `EVALSHA` again: three round
// trips instead of one, which to a far Redlock node (200 ms away) cost a
// 1 s lease its grant. Each test below starts fresh servers (empty script
// caches) and a store that has not connected, runs the first use of every
// call of every kind it has, and counts the `NOSCRIPT` answers the servers
// gave (`INFO errorstats`): none.

/// The `NOSCRIPT` answers `server` gave since it started.
fn noscript_answers(server: &RedisServer) -> u64 {
    server.error_count("NOSCRIPT")
}

/// Whether `outcome` is a grant, fenced or not.
fn is_grant(outcome: &AcquireOutcome) -> bool {
    matches!(
        outcome,
        AcquireOutcome::Granted(_) | AcquireOutcome::GrantedUnfenced
    )
}

/// `owner`'s `kind` lease of `k` renewed twice in one `extend_many` (a
/// batch, the watchdog's call: one script for both on one primary).
async fn renew_in_a_batch<S: LockStore>(
    store: &S,
    k: &LockKey,
    owner: &OwnerToken,
    kind: LeaseKind,
) {
    let renewal = Renewal {
        key: k.clone(),
        owner: owner.clone(),
        lease: LEASE,
        kind,
    };
    let renewed = store.renew_many(&[renewal.clone(), renewal]).await;
    assert!(renewed.iter().all(|r| matches!(r, Ok(true))), "{renewed:?}");
}

/// The lock's calls, each's first use: grant (and a refusal that marks the
/// lock waited for), renewal alone and in a batch, hand-off (`transfer`,
/// as `resume` makes it), inspect, list, release; acquire-or-replay,
/// finish and the replay of the record (`read_record`); force-release;
/// several locks at once. `tag` keeps the keys of one run apart.
async fn first_uses_of_lock_calls<S: OperatorStore>(store: &S, tag: &str) {
    let k = key(&format!("{tag}-lock"));
    let (owner, other, next) = (
        OwnerToken::generate(),
        OwnerToken::generate(),
        OwnerToken::generate(),
    );
    assert!(is_grant(&store.acquire(&k, &owner, LEASE).await.unwrap()));
    assert!(matches!(
        store.acquire(&k, &other, LEASE).await.unwrap(),
        AcquireOutcome::Held { .. }
    ));
    assert!(
        store
            .renew(LeaseKind::Lock, &k, &owner, LEASE)
            .await
            .unwrap()
    );
    renew_in_a_batch(store, &k, &owner, LeaseKind::Lock).await;
    assert!(store.transfer(&k, &owner, &next, LEASE).await.unwrap());
    let held = store.inspect(&k).await.unwrap();
    assert!(held.is_some_and(|h| h.waiters), "inspect");
    store
        .list("noscript", &ListCursor::start(), 10)
        .await
        .unwrap();
    assert!(store.release(LeaseKind::Lock, &k, &next).await.unwrap());

    let r = key(&format!("{tag}-replay"));
    let record = Bytes::from_static(b"{\"status\":201}");
    assert!(is_grant(
        &store.acquire_or_replay(&r, &owner, LEASE).await.unwrap()
    ));
    assert!(
        store
            .finish(&r, &owner, record.clone(), RETENTION)
            .await
            .unwrap()
    );
    assert_eq!(
        store.acquire_or_replay(&r, &other, LEASE).await.unwrap(),
        AcquireOutcome::Completed(record.clone())
    );
    assert_eq!(store.read_record(&r).await.unwrap(), Some(record));

    let f = key(&format!("{tag}-forced"));
    assert!(is_grant(&store.acquire(&f, &owner, LEASE).await.unwrap()));
    assert!(store.force_release(&f).await.unwrap().released);

    let both = [key(&format!("{tag}-all-a")), key(&format!("{tag}-all-b"))];
    let all = store.grant_all(&both, &owner, LEASE, None).await.unwrap();
    assert!(matches!(all, AcquireAllOutcome::Granted(_)), "{all:?}");
    let released = store.release_all(&both, &owner).await.unwrap();
    assert_eq!(released, [true, true]);
}

/// The other kinds' calls, each's first use: a permit (grant, renewal
/// alone and in a batch, release); a reader-writer lock's reader (grant,
/// renewal, release), a writer that finds it read and marks itself
/// waiting, the mark withdrawn, then the writer granted, renewed and
/// released.
async fn first_uses_of_other_kinds<S: LockStore>(store: &S, tag: &str) {
    let p = key(&format!("{tag}-permit"));
    let owner = OwnerToken::generate();
    assert!(is_grant(
        &store.acquire_permit(&p, &owner, 2, LEASE).await.unwrap()
    ));
    assert!(
        store
            .renew(LeaseKind::Permit, &p, &owner, LEASE)
            .await
            .unwrap()
    );
    renew_in_a_batch(store, &p, &owner, LeaseKind::Permit).await;
    assert!(store.release(LeaseKind::Permit, &p, &owner).await.unwrap());

    let rw = key(&format!("{tag}-rw"));
    let (reader, writer, waiter) = (
        OwnerToken::generate(),
        OwnerToken::generate(),
        OwnerToken::generate(),
    );
    assert!(is_grant(
        &store.acquire_read(&rw, &reader, LEASE).await.unwrap()
    ));
    assert!(
        store
            .renew(LeaseKind::Read, &rw, &reader, LEASE)
            .await
            .unwrap()
    );
    assert!(matches!(
        store
            .acquire_write(&rw, &writer, Some(&waiter), LEASE)
            .await
            .unwrap(),
        AcquireOutcome::Held { .. }
    ));
    assert!(
        store
            .release(LeaseKind::WriterMark, &rw, &waiter)
            .await
            .unwrap()
    );
    assert!(store.release(LeaseKind::Read, &rw, &reader).await.unwrap());
    assert!(is_grant(
        &store
            .acquire_write(&rw, &writer, None, LEASE)
            .await
            .unwrap()
    ));
    assert!(
        store
            .renew(LeaseKind::Write, &rw, &writer, LEASE)
            .await
            .unwrap()
    );
    assert!(store.release(LeaseKind::Write, &rw, &writer).await.unwrap());
}

/// No `NOSCRIPT` on `servers`, with which servers gave how many.
fn assert_no_noscript(servers: &[&RedisServer]) {
    let answers: Vec<u64> = servers.iter().map(|s| noscript_answers(s)).collect();
    assert!(
        answers.iter().all(|n| *n == 0),
        "NOSCRIPT answers per server: {answers:?}"
    );
}

/// One primary, fenced and unfenced: every kind's calls.
#[tokio::test]
async fn first_uses_on_one_primary_pay_no_noscript() {
    let server = RedisServer::start();
    for (tag, store) in [("fenced", fenced(&server)), ("unfenced", unfenced(&server))] {
        first_uses_of_lock_calls(&store, tag).await;
        first_uses_of_other_kinds(&store, tag).await;
    }
    assert_no_noscript(&[&server]);
}

/// Grants that wait for replicas run on connections of their own, opened
/// by the first grant: that first grant too finds its script loaded.
#[tokio::test]
async fn first_uses_of_grants_that_wait_for_replicas_pay_no_noscript() {
    let server = RedisServer::start();
    let store = waiting_for_a_replica(&server);
    first_uses_of_lock_calls(&store, "wait").await;
    first_uses_of_other_kinds(&store, "wait").await;
    assert_no_noscript(&[&server]);
}

/// Redlock's nodes, each a store of its own: the lock's calls, and the
/// calls only Redlock makes, the token's write-back (a node mints a larger
/// token, and the other granting node is raised to it) and the rollback of
/// a finish short of its quorum. Fails if the write-back's script is not
/// loaded with the connection (the refused runs of issue 38).
#[tokio::test]
async fn first_uses_on_redlock_nodes_pay_no_noscript() {
    let servers = start_independent(3);
    let store = stores::redlock_over(&servers, Duration::from_secs(2));
    // The write-back's script is the first the store runs on node 1
    // after its grant.
    write_back_then_rollback(&servers, &store, "redlock-first", || {}).await;
    first_uses_of_lock_calls(&store, "redlock").await;
    assert_no_noscript(&servers.iter().collect::<Vec<_>>());
}

/// Behind Sentinel: the primary it names.
#[tokio::test]
async fn first_uses_behind_sentinel_pay_no_noscript() {
    let (store, set) = stores::sentinel();
    first_uses_of_lock_calls(&store, "sentinel").await;
    first_uses_of_other_kinds(&store, "sentinel").await;
    assert_no_noscript(&[set.current_master()]);
}

/// On a Cluster, every primary: the keys of the calls fall in several
/// slots, on every node.
#[tokio::test]
async fn first_uses_on_a_cluster_pay_no_noscript() {
    let cluster = Cluster::start(3);
    let urls = cluster.urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let store = RedisStore::cluster(&urls).unwrap();
    for n in 0..6 {
        first_uses_of_lock_calls(&store, &format!("cluster-{n}")).await;
        first_uses_of_other_kinds(&store, &format!("cluster-{n}")).await;
    }
    let used: Vec<u64> = cluster
        .nodes
        .iter()
        .map(|n| n.command_calls("evalsha"))
        .collect();
    assert!(used.iter().all(|n| *n > 0), "EVALSHA per node: {used:?}");
    assert_no_noscript(&cluster.nodes.iter().collect::<Vec<_>>());
}
