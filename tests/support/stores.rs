//! One fixture per store, for the suites written once and run against every
//! store (`tests/conformance.rs`, `tests/layer_stores.rs`).
//!
//! Each fixture returns the store and whatever must stay alive with it: the
//! `redis-server` processes behind it, killed when that value is dropped.

use std::time::Duration;

use tower_redis_lock::{
    BoxStore, LockStore, Locker, MemoryStore, OperatorStore, RedisStore, RedlockStore,
};

use super::RedisServer;
use super::topology::{Cluster, SentinelSet, start_independent};

/// The in-process store; nothing to keep alive.
pub fn memory() -> (MemoryStore, ()) {
    (MemoryStore::new(), ())
}

/// One Redis primary.
pub fn redis() -> (RedisStore, RedisServer) {
    let server = RedisServer::start();
    let store = RedisStore::from_url(&server.url()).unwrap();
    (store, server)
}

/// Redlock over `primaries` independent Redis primaries (started in parallel).
pub fn redlock(primaries: usize) -> (RedlockStore, Vec<RedisServer>) {
    let servers = start_independent(primaries);
    (redlock_over(&servers, Duration::from_millis(500)), servers)
}

/// Redlock over `servers`, each node's calls bounded by `command_timeout`.
pub fn redlock_over(servers: &[RedisServer], command_timeout: Duration) -> RedlockStore {
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    redlock_over_urls(&urls, command_timeout)
}

/// Redlock over the nodes at `urls` (servers, or
/// [`FaultProxy`](super::fault::FaultProxy)s in front of them), each
/// node's calls bounded by `command_timeout`.
pub fn redlock_over_urls(urls: &[String], command_timeout: Duration) -> RedlockStore {
    let nodes = urls
        .iter()
        .map(|u| {
            RedisStore::builder(u)
                .command_timeout(command_timeout)
                .build()
                .unwrap()
        })
        .collect();
    RedlockStore::new(nodes).unwrap()
}

/// A Redis Cluster of 3 primaries.
pub fn cluster() -> (RedisStore, Cluster) {
    let cluster = Cluster::start(3);
    let urls = cluster.urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    (RedisStore::cluster(&urls).unwrap(), cluster)
}

/// A primary with one replica behind 3 sentinels.
pub fn sentinel() -> (RedisStore, SentinelSet) {
    let set = SentinelSet::start();
    let urls = set.sentinel_urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    (RedisStore::sentinel(&urls, &set.master_name).unwrap(), set)
}

/// `fixture`'s store behind a [`BoxStore`], with what it keeps alive.
pub fn boxed<S: OperatorStore, K>(fixture: (S, K)) -> (BoxStore, K) {
    let (store, keep) = fixture;
    (BoxStore::new(store), keep)
}

/// The Redis name a [`RedisStore`] with the default prefix gives lock
/// `ns:id`'s `suffix` (`lock`, `fence`, `record`, `released`, `waited`,
/// `permits`, `permits-waited`, `rw-readers`, `rw-writer` or `rw-waiting`), from the
/// store's own accessors; `tests/redis_engine.rs` pins the layout itself.
pub fn redis_name(ns: &str, id: &str, suffix: &str) -> String {
    // `from_url` does no I/O: the store is only asked for names.
    let store = RedisStore::from_url("redis://127.0.0.1:1/").expect("a valid URL");
    let key = tower_redis_lock::LockKey::new(ns, id).expect("a valid key");
    match suffix {
        "lock" => store.lock_key(&key),
        "fence" => store.fence_key(&key),
        "record" => store.record_key(&key),
        "released" => store.release_channel(&key),
        "waited" => store.waited_key(&key),
        "permits" => store.permits_key(&key),
        "permits-waited" => store.permits_waited_key(&key),
        "rw-readers" => store.rw_keys(&key)[0].clone(),
        "rw-writer" => store.rw_keys(&key)[1].clone(),
        "rw-waiting" => store.rw_keys(&key)[2].clone(),
        other => panic!("no Redis name with suffix {other:?}"),
    }
}

/// A locker that only a release notification can wake: its lease, wait and
/// poll interval are an hour, so a lost wake-up shows as a hang (which the
/// test's own timeout turns into a failure).
pub fn woken_only_by_notification<St: LockStore>(store: St) -> Locker<St> {
    const HOUR: Duration = Duration::from_secs(3600);
    Locker::builder(store)
        .lease(HOUR)
        .wait_timeout(HOUR)
        .poll_interval(HOUR)
        .build()
        .unwrap()
}
