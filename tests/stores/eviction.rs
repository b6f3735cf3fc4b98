//! A server whose `maxmemory-policy` can evict keys with an expiry can
//! delete a held lock under memory pressure, and let a second holder in. The
//! store reads the policy when it connects and, by default, refuses such a
//! server (`Error::Config` naming the policy and the fix); told to
//! (`EvictionCheck::Log`), it logs an error once and uses it. Real servers
//! throughout.

use crate::support;

use std::time::Duration;

use support::RedisServer;
use support::logs::Logs;
use support::topology::{Cluster, SentinelSet};
use tower_redis_lock::{Error, EvictionCheck, LockKey, Locker, RedisStore};

fn key(id: &str) -> LockKey {
    LockKey::new("evict", id).unwrap()
}

fn locker(store: RedisStore) -> Locker<RedisStore> {
    Locker::builder(store)
        .lease(Duration::from_secs(10))
        .wait_timeout(Duration::ZERO)
        .build()
        .unwrap()
}

/// Locks and releases `key`; the first call after the server dropped the
/// store's connection may fail on the dead connection (the store then
/// opens a new one, and checks the server again).
async fn lock_once(l: &Locker<RedisStore>, key: &LockKey) {
    for _ in 0..3 {
        if let Ok(g) = l.try_acquire(key).await {
            assert!(g.release().await.unwrap());
            return;
        }
    }
    panic!("no grant in three tries");
}

fn store(server: &RedisServer, check: EvictionCheck) -> RedisStore {
    RedisStore::builder(&server.url())
        .command_timeout(Duration::from_secs(2))
        .eviction_check(check)
        .build()
        .unwrap()
}

/// `err` is the refusal of an evicting server: `Error::Config` on the
/// server's `maxmemory-policy`, naming `policy` and both ways out.
#[track_caller]
fn assert_refused(err: &Error, policy: &str) {
    let Error::Config(config) = err else {
        panic!("not a refused setting: {err:?}");
    };
    assert_eq!(config.setting(), "maxmemory-policy", "{err}");
    let text = err.to_string();
    for named in [
        &format!("`{policy}`"),
        "CONFIG SET maxmemory-policy noeviction",
        ".eviction_check(EvictionCheck::Log)",
    ] {
        assert!(text.contains(named), "the refusal names {named}: {text}");
    }
}

#[tokio::test]
async fn an_evicting_server_is_refused_by_default() {
    let server = RedisServer::start_with(&["--maxmemory-policy", "allkeys-lru"]);
    // No `eviction_check` setting: the default refuses.
    let l = locker(RedisStore::from_url(&server.url()).unwrap());
    let err = l.try_acquire(&key("a")).await.unwrap_err();
    assert_refused(&err, "allkeys-lru");
    assert_eq!(
        server.dbsize(),
        0,
        "nothing was written to a refused server"
    );

    // Every policy that evicts keys with an expiry is refused.
    for policy in [
        "volatile-lru",
        "volatile-ttl",
        "allkeys-random",
        "volatile-lfu",
    ] {
        server.cmd(&["CONFIG", "SET", "maxmemory-policy", policy]);
        let err = l.try_acquire(&key("a")).await.unwrap_err();
        assert_refused(&err, policy);
    }
    assert_eq!(server.dbsize(), 0);

    // Fixed on the server: the next call connects, checks again, and locks.
    server.cmd(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    let g = l.try_acquire(&key("a")).await.unwrap();
    assert!(g.release().await.unwrap());
}

#[tokio::test]
async fn opted_out_an_evicting_server_is_logged_once_at_error_level_and_used() {
    // `allkeys-lfu`: no other test of this binary uses it, and the logs are
    // the binary's (see `Logs::global`).
    let server = RedisServer::start_with(&["--maxmemory-policy", "allkeys-lfu"]);
    let logs = Logs::global();
    let l = locker(store(&server, EvictionCheck::Log));
    for _ in 0..3 {
        lock_once(&l, &key("b")).await;
        // Drop the store's connection: the next call opens and checks anew.
        server.cmd(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]);
    }
    let reported = logs.lines_with("maxmemory_policy=allkeys-lfu");
    assert_eq!(
        reported.len(),
        1,
        "one report, not one per connection: {reported:?}"
    );
    assert!(
        reported[0].contains("ERROR") && reported[0].contains("maxmemory-policy"),
        "{reported:?}"
    );
}

#[tokio::test]
async fn a_noeviction_server_is_used_without_a_word() {
    let server = RedisServer::start_with(&["--maxmemory-policy", "noeviction"]);
    let l = locker(store(&server, EvictionCheck::Refuse));
    server.reset_stats();
    let g = l.try_acquire(&key("c")).await.unwrap();
    assert!(g.release().await.unwrap());
    // Checked, and found fine.
    assert_eq!(server.command_calls("config|get"), 1);
}

#[tokio::test]
async fn a_server_that_refuses_config_is_reported_once_and_used() {
    // As on managed services that block `CONFIG`: nothing can be checked,
    // so the store says so once and goes on.
    let server = RedisServer::start();
    server.cmd(&["ACL", "SETUSER", "default", "-config"]);
    let logs = Logs::global();
    let l = locker(store(&server, EvictionCheck::Refuse));
    for _ in 0..2 {
        lock_once(&l, &key("d")).await;
        server.cmd(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]);
    }
    let reported = logs.lines_with("could not read the Redis maxmemory-policy");
    assert_eq!(reported.len(), 1, "{reported:?}");
    assert!(reported[0].contains("WARN"), "{reported:?}");
}

#[tokio::test]
async fn with_the_check_off_the_policy_is_not_read() {
    let server = RedisServer::start_with(&["--maxmemory-policy", "allkeys-lru"]);
    server.reset_stats();
    let l = locker(store(&server, EvictionCheck::Off));
    let g = l.try_acquire(&key("e")).await.unwrap();
    assert!(g.release().await.unwrap());
    assert_eq!(server.command_calls("config|get"), 0);
}

#[tokio::test]
async fn every_primary_of_a_cluster_is_checked() {
    // One node of three evicts: whichever node the check would ask alone,
    // the store must see it.
    let cluster = Cluster::start(3);
    cluster.nodes[2].cmd(&["CONFIG", "SET", "maxmemory-policy", "allkeys-random"]);
    let urls = cluster.urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    // The default refuses, on a Cluster too.
    let l = locker(
        RedisStore::cluster_builder(&urls)
            .command_timeout(Duration::from_secs(2))
            .build()
            .unwrap(),
    );
    let err = l.try_acquire(&key("f")).await.unwrap_err();
    assert_refused(&err, "allkeys-random");
    cluster.nodes[2].cmd(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    let g = l.try_acquire(&key("f")).await.unwrap();
    assert!(g.release().await.unwrap());
}

/// The default refuses behind Sentinel and over a pool too: every store
/// that opens a connection of its own checks the policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_and_pool_stores_refuse_an_evicting_server_by_default() {
    let set = SentinelSet::start();
    set.primary
        .cmd(&["CONFIG", "SET", "maxmemory-policy", "volatile-lru"]);
    let urls = set.sentinel_urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let sentinel = RedisStore::sentinel(&urls, &set.master_name).unwrap();
    assert_refused(&sentinel.check().await.unwrap_err(), "volatile-lru");

    let pool = tower_redis_lock::deadpool_redis::Config::from_url(set.primary.url())
        .create_pool(Some(tower_redis_lock::deadpool_redis::Runtime::Tokio1))
        .unwrap();
    let pooled = RedisStore::new(pool);
    assert_refused(&pooled.check().await.unwrap_err(), "volatile-lru");

    set.primary
        .cmd(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    sentinel.check().await.unwrap();
    pooled.check().await.unwrap();
}

/// `RedisStore::check` finds at boot what the first lock would find: a
/// server that answers (and the connection is then open: the first lock
/// opens no other), an evicting policy (refused by default, passed when
/// opted out), a wrong password, a server that is down (within the command
/// timeout); `RedlockStore::check` asks for a quorum of answering nodes,
/// and fails on any node the store refuses.
#[tokio::test]
async fn a_check_at_boot_finds_what_the_first_lock_would() {
    use tower_redis_lock::{Error, RedlockStore};

    let server = RedisServer::start();
    let s = store(&server, EvictionCheck::Refuse);
    s.check().await.unwrap();
    // The store's one command connection. (A count read at once, not
    // waited on, failed CI once, 2 for 1.)
    assert!(
        server.clients_come_to(1).await,
        "{} clients after the check, not one",
        server.connected_clients()
    );
    let l = locker(s);
    lock_once(&l, &key("boot")).await;
    assert!(
        server.clients_come_to(1).await,
        "the check's connection is not the one used: {} clients",
        server.connected_clients()
    );

    // README's boot code, as it is: `from_url`, then `check`.
    let evicting = RedisServer::start_with(&["--maxmemory-policy", "allkeys-lru"]);
    let err = RedisStore::from_url(&evicting.url())
        .unwrap()
        .check()
        .await
        .unwrap_err();
    assert_refused(&err, "allkeys-lru");
    assert!(!err.is_store_failure(), "a setting to fix, not an outage");
    // Opted out: the check passes (and the policy is logged).
    store(&evicting, EvictionCheck::Log).check().await.unwrap();

    let guarded = RedisServer::start_with(&["--requirepass", "right"]);
    let url = format!("redis://:wrong@127.0.0.1:{}/", guarded.port());
    let err = RedisStore::from_url(&url)
        .unwrap()
        .check()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Auth { .. }), "{err:?}");

    let mut down = RedisServer::start();
    let url = down.url();
    down.stop();
    let s = RedisStore::builder(&url)
        .command_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let started = std::time::Instant::now();
    assert!(s.check().await.unwrap_err().is_store_failure());
    assert!(started.elapsed() < Duration::from_secs(5));

    // Redlock: two of three nodes answering is a quorum; one is not.
    let (a, b) = (RedisServer::start(), RedisServer::start());
    let node = |url: &str| RedisStore::from_url(url).unwrap();
    let two_of_three = RedlockStore::new(vec![node(&a.url()), node(&b.url()), node(&url)]).unwrap();
    two_of_three.check().await.unwrap();
    let one_of_three = RedlockStore::new(vec![node(&a.url()), node(&url), node(&url)]).unwrap();
    assert!(one_of_three.check().await.unwrap_err().is_store_failure());
    // A node the store refuses fails the check, quorum or not; its own
    // builder's opt-out lets it pass.
    let refused =
        RedlockStore::new(vec![node(&a.url()), node(&b.url()), node(&evicting.url())]).unwrap();
    assert_refused(&refused.check().await.unwrap_err(), "allkeys-lru");
    let opted_out = RedlockStore::new(vec![
        node(&a.url()),
        node(&b.url()),
        store(&evicting, EvictionCheck::Log),
    ])
    .unwrap();
    opted_out.check().await.unwrap();
}
