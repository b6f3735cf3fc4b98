//! Which commands a renewal costs Redis, per server, and that each path
//! keeps every promise of `extend`. The store reads the server at connect
//! (`INFO server`): on Valkey 8.1 and later a lock without fencing is
//! renewed with `SET … IFEQ` (no script); everywhere else, and for a
//! fenced lock, a batch is one call of the batch renewal script. Each test
//! reads the server itself and asserts the path that server must get, so
//! it means something on Redis 7.0 (the script) as on Valkey (`SET`); the
//! `_on_valkey` tests run the `SET` path in every pass, on the Valkey
//! `.ci/run` installs. Real server processes.

use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use support::{RedisServer, eventually};
use tower_redis_lock::{
    AcquireOutcome, LeaseKind, LockKey, LockStore, LockStoreExt, OwnerToken, RedisStore, Renewal,
};

const LEASE: Duration = Duration::from_secs(30);
const SHORT: Duration = Duration::from_secs(5);

fn key(id: impl std::fmt::Display) -> LockKey {
    LockKey::new("paths", id.to_string()).unwrap()
}

fn store(server: &RedisServer, fencing: bool) -> RedisStore {
    RedisStore::builder(&server.url())
        .fencing(fencing)
        .build()
        .unwrap()
}

/// The server as `INFO server` names it (`valkey 9.1.2`, `redis 7.0.15`),
/// and whether it has `SET … IFEQ` (Valkey 8.1 and later), read here
/// apart from the store.
fn server_of(server: &RedisServer) -> (String, bool) {
    let info = server.cmd(&["INFO", "server"]).as_string().unwrap();
    let field = |name: &str| {
        info.lines()
            .find_map(|l| Some(l.trim().strip_prefix(name)?.strip_prefix(':')?.to_owned()))
    };
    let make = field("server_name").unwrap_or_else(|| "redis".into());
    let version = field(&format!("{make}_version")).unwrap();
    let v: Vec<u32> = version.split('.').map(|p| p.parse().unwrap()).collect();
    let ifeq = make == "valkey" && (v[0], v[1]) >= (8, 1);
    (format!("{make} {version}"), ifeq)
}

/// Connects `store` (the round trip that reads the server) and checks it
/// read the server this test reads.
async fn connect(store: &RedisStore, server: &RedisServer) {
    let (k, owner) = (key("warm-up"), OwnerToken::generate());
    store.acquire(&k, &owner, LEASE).await.unwrap();
    assert!(store.release(LeaseKind::Lock, &k, &owner).await.unwrap());
    assert_eq!(store.detected_server(), Some(server_of(server).0));
}

/// The commands Redis ran since the last reset (those scripts ran
/// included), less the tests' own `INFO` and `CONFIG`.
fn ran(server: &RedisServer) -> BTreeMap<String, u64> {
    let mut stats = server.command_stats();
    stats.retain(|name, _| !name.starts_with("info") && !name.starts_with("config"));
    stats
}

fn stats(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
    pairs.iter().map(|&(k, n)| (k.to_owned(), n)).collect()
}

fn renewal(k: &LockKey, owner: &OwnerToken, lease: Duration, kind: LeaseKind) -> Renewal {
    Renewal {
        key: k.clone(),
        owner: owner.clone(),
        lease,
        kind,
    }
}

fn pttl(server: &RedisServer, name: &str) -> i64 {
    server.cmd(&["PTTL", name]).as_int().unwrap()
}

/// The ms left of `owner`'s permit of `permit` (its score is its end, in
/// Unix ms).
fn permit_left(
    server: &RedisServer,
    store: &RedisStore,
    permit: &LockKey,
    owner: &OwnerToken,
) -> f64 {
    let ends: f64 = server
        .cmd(&["ZSCORE", &store.permits_key(permit), owner.as_str()])
        .as_string()
        .unwrap()
        .parse()
        .unwrap();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as f64;
    ends - now_ms
}

/// A batch of lock renewals, fenced and not: the commands it cost, each
/// as the server allows, and every renewal extended.
async fn a_batch_costs_what_its_server_allows(server: &RedisServer) {
    const N: u64 = 6;
    let (_, ifeq) = server_of(server);
    for fencing in [false, true] {
        let store = store(server, fencing);
        connect(&store, server).await;
        let owner = OwnerToken::generate();
        let keys: Vec<LockKey> = (0..N)
            .map(|i| key(format!("batch-{fencing}-{i}")))
            .collect();
        for k in &keys {
            store.acquire(k, &owner, SHORT).await.unwrap();
        }
        let renewals: Vec<Renewal> = keys
            .iter()
            .map(|k| renewal(k, &owner, LEASE, LeaseKind::Lock))
            .collect();
        server.reset_stats();
        let answers = store.renew_many(&renewals).await;
        let expected = match (ifeq, fencing) {
            // One `SET … IFEQ` each, no script.
            (true, false) => stats(&[("set", N)]),
            // One script call for the batch: the lock's `GET` and
            // `PEXPIRE` each (a fenced lock's holder record is in its
            // value: renewed with it, at no command of its own).
            _ => stats(&[("evalsha", 1), ("get", N), ("pexpire", N)]),
        };
        assert_eq!(ran(server), expected, "fencing {fencing}");
        assert!(answers.iter().all(|a| matches!(a, Ok(true))), "{answers:?}");
        for k in &keys {
            assert!(pttl(server, &store.lock_key(k)) > SHORT.as_millis() as i64);
        }
    }
}

#[tokio::test]
async fn a_batch_costs_what_the_test_server_allows() {
    a_batch_costs_what_its_server_allows(&RedisServer::start()).await;
}

#[tokio::test]
async fn a_batch_costs_what_valkey_allows_on_valkey() {
    let valkey = RedisServer::start_valkey(&[]);
    assert!(
        server_of(&valkey).1,
        "{}: no SET IFEQ",
        server_of(&valkey).0
    );
    a_batch_costs_what_its_server_allows(&valkey).await;
}

/// A lock without fencing, on either path: each renewal, alone and in a
/// batch, answers what `extend` promises. The owner's lease is reset;
/// another owner's renewal is refused and writes nothing; a lock that
/// expired is not brought back; a key of the wrong type fails its own
/// renewal only.
async fn renewals_keep_every_promise(server: &RedisServer) {
    let (_, ifeq) = server_of(server);
    let store = store(server, false);
    connect(&store, server).await;
    let (owner, other) = (OwnerToken::generate(), OwnerToken::generate());
    let (mine, theirs, expired, wrong) = (key("mine"), key("theirs"), key("expired"), key("wrong"));
    for k in [&mine, &expired] {
        store.acquire(k, &owner, SHORT).await.unwrap();
    }
    store.acquire(&theirs, &other, SHORT).await.unwrap();
    let hash = store.lock_key(&wrong);
    server.cmd(&["HSET", &hash, "f", "v"]);
    // The expired lock: its lease ran out (Redis deleted it).
    let gone = store.lock_key(&expired);
    server.cmd(&["PEXPIRE", &gone, "1"]);
    assert!(
        eventually(Duration::from_secs(5), async || {
            server.cmd(&["EXISTS", &gone]).as_int() == Some(0)
        })
        .await
    );
    let theirs_before = pttl(server, &store.lock_key(&theirs));

    let batch = [
        renewal(&theirs, &owner, LEASE, LeaseKind::Lock),
        renewal(&wrong, &owner, LEASE, LeaseKind::Lock),
        renewal(&expired, &owner, LEASE, LeaseKind::Lock),
        renewal(&mine, &owner, LEASE, LeaseKind::Lock),
    ];
    server.reset_stats();
    let answers = store.renew_many(&batch).await;
    let top = if ifeq { ("set", 4) } else { ("evalsha", 1) };
    assert_eq!(ran(server).get(top.0), Some(&top.1), "{:?}", ran(server));
    assert_eq!(
        ran(server).contains_key("evalsha"),
        !ifeq,
        "{:?}",
        ran(server)
    );
    assert!(matches!(answers[0], Ok(false)), "{:?}", answers[0]);
    let err = answers[1].as_ref().unwrap_err();
    assert!(err.is_store_failure(), "{err}");
    assert_eq!(err.key(), Some(&wrong));
    assert!(matches!(answers[2], Ok(false)), "{:?}", answers[2]);
    assert!(matches!(answers[3], Ok(true)), "{:?}", answers[3]);
    untouched(
        server,
        &store,
        (&theirs, &other, theirs_before),
        &gone,
        &hash,
    );
    assert!(pttl(server, &store.lock_key(&mine)) > SHORT.as_millis() as i64);

    // One by one (`extend`): the same answers, by the same path.
    server.reset_stats();
    assert!(
        !store
            .renew(LeaseKind::Lock, &theirs, &owner, LEASE)
            .await
            .unwrap()
    );
    let err = store
        .renew(LeaseKind::Lock, &wrong, &owner, LEASE)
        .await
        .unwrap_err();
    assert!(err.is_store_failure(), "{err}");
    assert!(
        !store
            .renew(LeaseKind::Lock, &expired, &owner, LEASE)
            .await
            .unwrap()
    );
    assert!(
        store
            .renew(LeaseKind::Lock, &mine, &owner, LEASE)
            .await
            .unwrap()
    );
    let top = if ifeq { ("set", 4) } else { ("evalsha", 4) };
    assert_eq!(ran(server).get(top.0), Some(&top.1), "{:?}", ran(server));
    assert_eq!(
        ran(server).contains_key("evalsha"),
        !ifeq,
        "{:?}",
        ran(server)
    );
    untouched(
        server,
        &store,
        (&theirs, &other, theirs_before),
        &gone,
        &hash,
    );
    // The refused owner still holds its lock, and can renew it.
    assert!(
        store
            .renew(LeaseKind::Lock, &theirs, &other, LEASE)
            .await
            .unwrap()
    );
    assert!(matches!(
        store.acquire(&theirs, &owner, LEASE).await.unwrap(),
        AcquireOutcome::Held { .. }
    ));
}

/// What refused renewals must leave as it was: another owner's lock (its
/// value and its expiry), the expired lock's absence, the hash.
fn untouched(
    server: &RedisServer,
    store: &RedisStore,
    (theirs, other, pttl_before): (&LockKey, &OwnerToken, i64),
    gone: &str,
    hash: &str,
) {
    let lock = store.lock_key(theirs);
    assert_eq!(
        server.cmd(&["GET", &lock]).as_string().as_deref(),
        Some(other.as_str())
    );
    let left = pttl(server, &lock);
    assert!(left > 0 && left <= pttl_before, "{left} > {pttl_before}");
    assert_eq!(server.cmd(&["EXISTS", gone]).as_int(), Some(0));
    assert_eq!(
        server.cmd(&["HGET", hash, "f"]).as_string().as_deref(),
        Some("v")
    );
}

#[tokio::test]
async fn renewals_keep_every_promise_on_the_test_server() {
    renewals_keep_every_promise(&RedisServer::start()).await;
}

#[tokio::test]
async fn renewals_keep_every_promise_on_valkey() {
    renewals_keep_every_promise(&RedisServer::start_valkey(&[])).await;
}

/// Every kind of lease in one batch: the script renews the permit, the
/// reader and the writer (and the fenced lock) in one call, each with its
/// own answer; a renewal past the script's batch (512) goes in a second
/// call of the same pipeline.
#[tokio::test]
async fn one_script_call_renews_every_kind_and_a_large_batch_is_split() {
    let server = RedisServer::start();
    let store = store(&server, true);
    connect(&store, &server).await;
    let owner = OwnerToken::generate();
    let (lock, permit, read, write) = (
        key("k-lock"),
        key("k-permit"),
        key("k-read"),
        key("k-write"),
    );
    store.acquire(&lock, &owner, SHORT).await.unwrap();
    store
        .acquire_permit(&permit, &owner, 2, SHORT)
        .await
        .unwrap();
    store.acquire_read(&read, &owner, SHORT).await.unwrap();
    store
        .acquire_write(&write, &owner, None, SHORT)
        .await
        .unwrap();
    let stranger = OwnerToken::generate();
    let batch = [
        renewal(&lock, &owner, LEASE, LeaseKind::Lock),
        renewal(&permit, &owner, LEASE, LeaseKind::Permit),
        renewal(&read, &owner, LEASE, LeaseKind::Read),
        renewal(&write, &owner, LEASE, LeaseKind::Write),
        renewal(&permit, &stranger, LEASE, LeaseKind::Permit),
        renewal(&write, &stranger, LEASE, LeaseKind::Write),
    ];
    server.reset_stats();
    let answers: Vec<bool> = store
        .renew_many(&batch)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(answers, [true, true, true, true, false, false]);
    assert_eq!(server.command_calls("evalsha"), 1);
    // A `PEXPIRE` for the lock and one for the writer, no more: the lock's
    // holder record is in its value, and a writer has none (the permits
    // and the reader are renewed with `PEXPIREAT`).
    assert_eq!(server.command_calls("pexpire"), 2);
    assert!(permit_left(&server, &store, &permit, &owner) > SHORT.as_millis() as f64);
    let [readers, _, _] = store.rw_keys(&read);
    assert!(pttl(&server, &readers) > SHORT.as_millis() as i64);
    let [_, writer, _] = store.rw_keys(&write);
    assert!(pttl(&server, &writer) > SHORT.as_millis() as i64);

    // 513 renewals: two calls.
    let many: Vec<Renewal> = (0..513)
        .map(|i| renewal(&key(format!("many-{i}")), &owner, LEASE, LeaseKind::Lock))
        .chain([renewal(&lock, &owner, LEASE, LeaseKind::Lock)])
        .collect();
    server.reset_stats();
    let answers = store.renew_many(&many).await;
    assert_eq!(server.command_calls("evalsha"), 2);
    assert_eq!(answers.len(), 514);
    assert!(answers[..513].iter().all(|a| matches!(a, Ok(false))));
    assert!(matches!(answers[513], Ok(true)), "{:?}", answers[513]);
}

/// Renewals of different leases in one batch: each lease is renewed for
/// its own length, on every path (the batch sends a lease once where all
/// are the same), fenced and not, a lock's as a permit's.
async fn each_renewal_of_a_batch_keeps_its_own_lease(server: &RedisServer) {
    let leases = [10, 300, 60, 120].map(Duration::from_secs);
    for fencing in [false, true] {
        let store = store(server, fencing);
        connect(&store, server).await;
        let owner = OwnerToken::generate();
        let locks: Vec<LockKey> = (0..leases.len())
            .map(|i| key(format!("own-{fencing}-{i}")))
            .collect();
        let permit = key(format!("own-permit-{fencing}"));
        for k in &locks {
            store.acquire(k, &owner, SHORT).await.unwrap();
        }
        store
            .acquire_permit(&permit, &owner, 2, SHORT)
            .await
            .unwrap();
        let mut batch: Vec<Renewal> = locks
            .iter()
            .zip(leases)
            .map(|(k, lease)| renewal(k, &owner, lease, LeaseKind::Lock))
            .collect();
        batch.push(renewal(&permit, &owner, leases[1], LeaseKind::Permit));
        let answers = store.renew_many(&batch).await;
        assert!(answers.iter().all(|a| matches!(a, Ok(true))), "{answers:?}");
        for (k, lease) in locks.iter().zip(leases) {
            let left = pttl(server, &store.lock_key(k));
            let lease = lease.as_millis() as i64;
            assert!(
                left > lease - 5_000 && left <= lease,
                "fencing {fencing}: {left} ms left of a {lease} ms lease"
            );
        }
        let left = permit_left(server, &store, &permit, &owner);
        assert!(
            left > 295_000.0 && left <= 301_000.0,
            "fencing {fencing}: the permit ends in {left} ms, not its 300 s"
        );
    }
}

#[tokio::test]
async fn each_renewal_of_a_batch_keeps_its_own_lease_on_the_test_server() {
    each_renewal_of_a_batch_keeps_its_own_lease(&RedisServer::start()).await;
}

#[tokio::test]
async fn each_renewal_of_a_batch_keeps_its_own_lease_on_valkey() {
    each_renewal_of_a_batch_keeps_its_own_lease(&RedisServer::start_valkey(&[])).await;
}

/// A user that may not run `INFO` (an ACL): the store still connects, names
/// no server, and renews with the script, which every server runs (even a
/// Valkey that has `SET … IFEQ`).
#[tokio::test]
async fn a_server_that_refuses_info_renews_with_the_script() {
    let server = RedisServer::start_valkey(&[]);
    let ok = server.cmd(&[
        "ACL", "SETUSER", "no-info", "on", ">secret", "~*", "&*", "+@all", "-info",
    ]);
    assert_eq!(ok.as_string().as_deref(), Some("OK"), "{ok:?}");
    let url = format!("redis://no-info:secret@127.0.0.1:{}/", server.port());
    let store = RedisStore::builder(&url).fencing(false).build().unwrap();
    let (k, owner) = (key("no-info"), OwnerToken::generate());
    store.acquire(&k, &owner, SHORT).await.unwrap();
    assert_eq!(store.detected_server(), None);
    server.reset_stats();
    let answers = store
        .renew_many(&[renewal(&k, &owner, LEASE, LeaseKind::Lock)])
        .await;
    assert!(matches!(answers[..], [Ok(true)]), "{answers:?}");
    assert_eq!(
        ran(&server),
        stats(&[("evalsha", 1), ("get", 1), ("pexpire", 1)])
    );
}

/// A store that renewed with `SET … IFEQ` on Valkey, whose server is then
/// replaced on the same address by the test server (Redis 7.0 in `cargo
/// test`: no `IFEQ`), as after a failover or a restart on an older
/// version: the call that finds the old connection gone may say so, and
/// the next renewal succeeds, in a form the new server runs (the server
/// is read again with the new connection; until then, the script).
#[tokio::test]
async fn a_renewal_after_the_server_changed_uses_what_the_new_one_runs() {
    let mut valkey = RedisServer::start_valkey(&[]);
    let store = store(&valkey, false);
    let (k, owner) = (key("moved"), OwnerToken::generate());
    store.acquire(&k, &owner, SHORT).await.unwrap();
    assert!(
        store
            .renew(LeaseKind::Lock, &k, &owner, LEASE)
            .await
            .unwrap()
    );
    assert!(
        store
            .detected_server()
            .is_some_and(|s| s.starts_with("valkey")),
        "{:?}",
        store.detected_server()
    );
    valkey.restart_as_test_server();
    valkey.cmd(&["SET", &store.lock_key(&k), owner.as_str(), "PX", "30000"]);
    let first = store.renew(LeaseKind::Lock, &k, &owner, LEASE).await;
    assert!(!matches!(first, Ok(false)), "{first:?}");
    let second = store.renew(LeaseKind::Lock, &k, &owner, LEASE).await;
    assert!(
        matches!(second, Ok(true)),
        "the renewal after the server changed failed: {second:?}"
    );
    assert!(pttl(&valkey, &store.lock_key(&k)) > SHORT.as_millis() as i64);
}
