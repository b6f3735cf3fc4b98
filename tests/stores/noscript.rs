//! Every store call that runs a Lua script still works, and answers what
//! it should, when Redis has lost its scripts (`SCRIPT FLUSH`, as after a
//! restart or a failover to a replica): the call meets `NOSCRIPT`, loads
//! its script and sends itself once more. The cache is flushed before each
//! call, after the store has connected (a new connection loads the usual
//! scripts up front, which would hide the fallback), so that each call
//! meets `NOSCRIPT` itself. Real `redis-server` processes.

use crate::support;

use std::time::Duration;

use bytes::Bytes;
use support::topology::{Cluster, start_independent};
use support::{RedisServer, stores};
use tower_redis_lock::{
    AcquireOutcome, FencingToken, LockKey, LockStore, OwnerToken, RedisStore, Renewal,
    ReplicaShortfall,
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
    assert!(store.release(&warm.0, &warm.1).await.unwrap());
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
/// which would load the usual five).
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
    assert!(!store.release(&k, &other).await.unwrap());
    reloaded(&server, 1);
    assert!(exists(&server, &lock));

    flush_scripts(&server);
    assert!(store.release(&k, &owner).await.unwrap());
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
    assert!(!store.extend(&a, &other, LEASE).await.unwrap());
    reloaded(&server, 1);
    assert!(pttl(&server, &store.lock_key(&a)) <= short.as_millis() as i64);

    flush_scripts(&server);
    assert!(store.extend(&a, &owner, LEASE).await.unwrap());
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
    let answers = store.extend_many(&renewals).await;
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
    let store = RedisStore::builder(&server.url())
        .wait_replicas(1, Duration::from_millis(20), ReplicaShortfall::Proceed)
        .build()
        .unwrap();
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
    // Far above Redis `TIME` in µs, below 2^53 (see tests/redlock_safety.rs).
    const AHEAD: u64 = 5_000_000_000_000_000;
    let servers = start_independent(3);
    let store = stores::redlock_over(&servers, Duration::from_secs(2));
    let nodes = store.nodes();
    for node in nodes {
        connect(node).await;
    }
    let (k, owner) = (key("redlock"), OwnerToken::generate());
    let lost = |i: usize| {
        servers[i].cmd(&["SET", &nodes[i].lock_key(&k), "someone-else", "PX", "60000"]);
    };
    // The majority is {0, 1}: node 2 is held by someone else. Node 0's
    // counter is far ahead, so node 1 needs the write-back.
    lost(2);
    servers[0].cmd(&["SET", &nodes[0].fence_key(&k), &AHEAD.to_string()]);

    servers.iter().for_each(flush_scripts);
    let t = token(store.acquire(&k, &owner, LEASE).await.unwrap());
    assert_eq!(t.get(), AHEAD + 1);
    for (i, s) in servers.iter().enumerate().take(2) {
        assert_eq!(
            get(s, &nodes[i].fence_key(&k)).as_deref(),
            Some(t.get().to_string().as_bytes()),
            "node {i}"
        );
    }

    // Lost on node 1 too: the finish stores its record on node 0 only,
    // which is no quorum, and takes it back there.
    lost(1);
    servers.iter().for_each(flush_scripts);
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
    assert!(store.extend(&k, &owner, LEASE).await.unwrap());
    flush();
    let renewal = Renewal {
        key: k.clone(),
        owner: owner.clone(),
        lease: LEASE,
        kind: tower_redis_lock::LeaseKind::Lock,
    };
    let many = store.extend_many(&[renewal]).await;
    assert!(matches!(many[..], [Ok(true)]), "{many:?}");
    flush();
    assert!(store.release(&k, &owner).await.unwrap());
    for i in frozen {
        cluster.nodes[i].thaw();
    }
}
