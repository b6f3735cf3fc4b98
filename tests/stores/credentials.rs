//! Credentials reach every server: a Sentinel set, a Cluster and Redlock
//! nodes behind `requirepass` and behind an ACL user, every connection
//! (commands, `WAIT`, release notifications); a wrong password is
//! [`Error::Auth`], never a generic "unavailable".
//!
//! (TLS to the data nodes behind Sentinel is in `tests/tls.rs`.)

use crate::support;

use std::time::Duration;

use support::topology::{Cluster, SentinelOptions, SentinelSet};
use support::{RedisServer, eventually};
use tokio::time::timeout;
use tower_redis_lock::{
    DataNodes, Error, LockKey, Locker, RedisStore, RedisStoreBuilder, RedlockStore,
    ReplicaShortfall,
};

const LIMIT: Duration = Duration::from_secs(10);
/// The ACL user of these tests, as `redis-server` args.
const ACL_USER: [&str; 7] = ["--user", "locker", "on", ">lockpw", "~*", "&*", "+@all"];

fn args(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

fn key() -> LockKey {
    LockKey::new("auth", "job-1").unwrap()
}

/// `PUBSUB NUMSUB <channel>`'s count on `server`.
fn numsub(server: &RedisServer, channel: &str) -> i64 {
    let reply = server.cmd(&["PUBSUB", "NUMSUB", channel]);
    reply.as_array().unwrap()[1].as_int().unwrap()
}

/// Grants, shuts out a second owner, and hands the lock to a waiter of
/// another store, which only a release notification wakes: commands and
/// the notification connection. `subscribed(channel)` tells whether the
/// waiter's subscription reached the server.
async fn locks_and_wakes(
    holders: RedisStore,
    waiters: RedisStore,
    subscribed: impl Fn(&str) -> bool,
) {
    let k = key();
    let channel = waiters.release_channel(&k);
    let holders = Locker::builder(holders).build().unwrap();
    let held = timeout(LIMIT, holders.acquire(&k))
        .await
        .expect("the grant hung")
        .unwrap_or_else(|e| panic!("no grant: {e}: {:?}", std::error::Error::source(&e)));
    assert!(holders.try_acquire(&k).await.unwrap_err().is_contended());
    let waiters = support::stores::woken_only_by_notification(waiters);
    let waiter = {
        let (l, k) = (waiters.clone(), k.clone());
        tokio::spawn(async move { l.acquire(&k).await.map(|g| g.fencing_token().unwrap()) })
    };
    assert!(
        eventually(LIMIT, async || waiters.has_waiters(&k)
            && subscribed(&channel))
        .await,
        "the waiter did not subscribe"
    );
    let first = held.fencing_token().unwrap();
    assert!(held.release().await.unwrap());
    let second = timeout(LIMIT, waiter)
        .await
        .expect("the waiter was not woken")
        .unwrap()
        .unwrap();
    assert!(second > first, "{second} after {first}");
}

/// An acquire that must fail: its error, within the limit.
async fn acquire_error(store: RedisStore) -> Error {
    let l = Locker::builder(store).build().unwrap();
    timeout(LIMIT, l.try_acquire(&key()))
        .await
        .expect("the acquire hung")
        .expect_err("a grant with the wrong credentials")
}

/// `err` is `Error::Auth`, its cause the server's refusal of the password.
fn assert_auth(err: &Error) {
    let cause = format!("{:?}", std::error::Error::source(err));
    assert!(matches!(err, Error::Auth { .. }), "{err:?}");
    assert!(cause.contains("AuthenticationFailed"), "{cause}");
}

// --- Sentinel ---

/// Data nodes behind `requirepass pw`, sentinels with `args`/`conf`.
fn sentinel_set(data: &[&str], sentinel_args: &[&str], sentinel_conf: &str) -> SentinelSet {
    let mut data_args = args(&["--requirepass", "pw", "--masterauth", "pw"]);
    data_args.extend(args(data));
    SentinelSet::start_with(&SentinelOptions {
        data_args,
        sentinel_conf: format!("sentinel auth-pass mymaster pw\n{sentinel_conf}"),
        sentinel_args: args(sentinel_args),
        tls_args: Vec::new(),
    })
}

/// The sentinels' URLs with `userinfo` (`:pw`, `user:pw`).
fn sentinel_builder(set: &SentinelSet, userinfo: &str) -> RedisStoreBuilder {
    let urls: Vec<String> = set
        .sentinels
        .iter()
        .map(|s| format!("redis://{userinfo}@127.0.0.1:{}/", s.port()))
        .collect();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    RedisStore::sentinel_builder(&urls, &set.master_name)
}

/// Sentinel and data nodes behind the same `requirepass`, given in the
/// Sentinel URLs only (before, every acquire failed with NOAUTH).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_data_nodes_take_the_password_of_the_sentinel_urls() {
    let set = sentinel_set(&[], &["--requirepass", "pw"], "sentinel sentinel-pass pw");
    // With `WAIT`: its connections authenticate too.
    let holders = sentinel_builder(&set, ":pw")
        .wait_replicas(1, Duration::from_millis(500), ReplicaShortfall::Fail)
        .build()
        .unwrap();
    let waiters = sentinel_builder(&set, ":pw").build().unwrap();
    locks_and_wakes(holders, waiters, |ch| numsub(&set.primary, ch) > 0).await;
}

/// An ACL user on the Sentinels and the data nodes, given in the Sentinel
/// URLs only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_data_nodes_take_the_acl_user_of_the_sentinel_urls() {
    let set = sentinel_set(
        &ACL_USER,
        &["--requirepass", "spw"],
        "user locker on >lockpw ~* &* +@all\nsentinel sentinel-pass spw",
    );
    let holders = sentinel_builder(&set, "locker:lockpw")
        .wait_replicas(1, Duration::from_millis(500), ReplicaShortfall::Fail)
        .build()
        .unwrap();
    let waiters = sentinel_builder(&set, "locker:lockpw").build().unwrap();
    locks_and_wakes(holders, waiters, |ch| numsub(&set.primary, ch) > 0).await;
}

/// Sentinels and data nodes with credentials of their own: the Sentinels'
/// `requirepass` in their URLs, the data nodes' ACL user in `DataNodes`.
/// A wrong data-node password is `Error::Auth`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_data_nodes_have_credentials_of_their_own() {
    let set = sentinel_set(
        &ACL_USER,
        &["--requirepass", "spw"],
        "sentinel sentinel-pass spw",
    );
    let nodes = DataNodes::new().with_auth(Some("locker"), "lockpw");
    let holders = sentinel_builder(&set, ":spw")
        .data_nodes(nodes.clone())
        .wait_replicas(1, Duration::from_millis(500), ReplicaShortfall::Fail)
        .build()
        .unwrap();
    let waiters = sentinel_builder(&set, ":spw")
        .data_nodes(nodes)
        .build()
        .unwrap();
    locks_and_wakes(holders, waiters, |ch| numsub(&set.primary, ch) > 0).await;

    let wrong = sentinel_builder(&set, ":spw")
        .data_nodes(DataNodes::new().with_auth(Some("locker"), "wrong"))
        .build()
        .unwrap();
    assert_auth(&acquire_error(wrong).await);
    // The Sentinels' password alone does not open the data nodes.
    let sentinel_password_only = sentinel_builder(&set, ":spw").build().unwrap();
    assert_auth(&acquire_error(sentinel_password_only).await);
}

#[test]
fn data_node_settings_are_for_sentinel_stores_only() {
    let err = RedisStore::builder("redis://127.0.0.1:6379/")
        .data_nodes(DataNodes::new())
        .build()
        .unwrap_err();
    assert_eq!(err.setting(), "data_nodes");
    let err = RedisStore::sentinel_builder(&["redis://127.0.0.1:26379/"], "m")
        .data_nodes(DataNodes::new().with_database(-1))
        .build()
        .unwrap_err();
    assert_eq!(err.setting(), "data_nodes");
    let err = RedisStore::sentinel_builder(
        &["redis://:a@127.0.0.1:26379/", "redis://:b@127.0.0.1:26380/"],
        "m",
    )
    .build()
    .unwrap_err();
    assert_eq!(err.setting(), "sentinel_urls");
}

// --- Cluster ---

fn cluster_store(cluster: &Cluster, userinfo: &str) -> RedisStore {
    let urls: Vec<String> = cluster
        .nodes
        .iter()
        .map(|n| format!("redis://{userinfo}@127.0.0.1:{}/", n.port()))
        .collect();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    RedisStore::cluster(&urls).unwrap()
}

/// Clients subscribed to the shard channel `channel` on its node.
fn shard_subscribed(cluster: &Cluster, channel: &str) -> bool {
    let node = &cluster.nodes[cluster.node_for_slot(cluster.slot_of(channel))];
    let reply = node.cmd(&["PUBSUB", "SHARDNUMSUB", channel]);
    reply.as_array().unwrap()[1].as_int().unwrap() > 0
}

async fn cluster_locks_and_refuses(extra: &[&str], userinfo: &str) {
    let cluster = Cluster::start_with(3, extra);
    locks_and_wakes(
        cluster_store(&cluster, userinfo),
        cluster_store(&cluster, userinfo),
        |ch| shard_subscribed(&cluster, ch),
    )
    .await;
    let wrong = cluster_store(&cluster, &userinfo.replace("pw", "wrong"));
    assert_auth(&acquire_error(wrong).await);
}

/// Every node behind `requirepass`: the nodes learnt from `CLUSTER SLOTS`
/// get the seed URLs' password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_nodes_take_the_password_of_the_seed_urls() {
    cluster_locks_and_refuses(&["--requirepass", "pw"], ":pw").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_nodes_take_the_acl_user_of_the_seed_urls() {
    let extra = [&["--requirepass", "pw"][..], &ACL_USER].concat();
    cluster_locks_and_refuses(&extra, "locker:lockpw").await;
}

// --- Redlock ---

fn redlock(servers: &[RedisServer], userinfo: &str) -> RedlockStore {
    let nodes = servers
        .iter()
        .map(|s| {
            RedisStore::builder(&format!("redis://{userinfo}@127.0.0.1:{}/", s.port()))
                .command_timeout(Duration::from_secs(1))
                .build()
                .unwrap()
        })
        .collect();
    RedlockStore::new(nodes).unwrap()
}

async fn redlock_locks_and_refuses(extra: &[&str], userinfo: &str) {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start_with(extra)).collect();
    let k = key();
    let l = Locker::builder(redlock(&servers, userinfo))
        .build()
        .unwrap();
    let held = timeout(LIMIT, l.acquire(&k)).await.unwrap().unwrap();
    assert!(l.try_acquire(&k).await.unwrap_err().is_contended());
    assert!(held.release().await.unwrap());

    let wrong = Locker::builder(redlock(&servers, &userinfo.replace("pw", "wrong")))
        .build()
        .unwrap();
    let err = timeout(LIMIT, wrong.try_acquire(&k))
        .await
        .unwrap()
        .unwrap_err();
    assert_auth(&err);
}

#[tokio::test]
async fn redlock_nodes_take_the_password_of_their_urls() {
    redlock_locks_and_refuses(&["--requirepass", "pw"], ":pw").await;
}

#[tokio::test]
async fn redlock_nodes_take_the_acl_user_of_their_urls() {
    let extra = [&["--requirepass", "pw"][..], &ACL_USER].concat();
    redlock_locks_and_refuses(&extra, "locker:lockpw").await;
}

// --- What the boot check refuses in a server's ACL, and what it does not ---

/// A server with the ACL user `locks` (password `pw`, every key and
/// channel) given `rules` besides, and a store logged in as it.
fn acl_store(rules: &[&str]) -> (RedisServer, RedisStore) {
    let server = RedisServer::start();
    let user = [
        &["ACL", "SETUSER", "locks", "on", ">pw", "~*", "&*"][..],
        rules,
    ]
    .concat();
    assert_eq!(server.cmd(&user).as_string().as_deref(), Some("OK"));
    let url = format!("redis://locks:pw@127.0.0.1:{}/", server.port());
    let store = RedisStore::builder(&url)
        .command_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    (server, store)
}

/// `err` and its sources, as a log line shows them.
fn chain(err: &Error) -> String {
    let mut text = err.to_string();
    let mut cause = std::error::Error::source(err);
    while let Some(c) = cause {
        text.push_str(&format!(": {c}"));
        cause = c.source();
    }
    text
}

/// `err` refuses the server for want of scripting, naming the server's
/// `answer`, the commands the store needs and the ACL category.
#[track_caller]
fn assert_no_scripting(err: &Error, answer: &str) {
    assert!(
        matches!(err, Error::Config(c) if c.setting() == "scripting"),
        "{err:?}"
    );
    let text = chain(err);
    for named in [
        "scripting unavailable on this server: ",
        answer,
        "EVAL/EVALSHA/SCRIPT LOAD",
        "(ACL category @scripting)",
    ] {
        assert!(text.contains(named), "names {named:?}: {text}");
    }
}

/// An ACL user without `@scripting` (or only without `SCRIPT LOAD`, which
/// the store sends when it connects) is refused by the check, with an
/// error that names scripting, and by the first lock the same way;
/// nothing is written.
#[tokio::test]
async fn a_user_without_scripting_is_refused_at_the_check() {
    for rules in [&["+@all", "-@scripting"][..], &["+@all", "-script|load"]] {
        let (server, store) = acl_store(rules);
        let err = store.check().await.unwrap_err();
        let answer = "no permissions to run the 'script|load' command";
        assert_no_scripting(&err, answer);
        assert!(!err.is_store_failure(), "a setting to fix: {err:?}");
        assert_no_scripting(&acquire_error(store).await, answer);
        assert_eq!(server.dbsize(), 0, "{rules:?}");
    }
}

/// A server without the scripting commands at all (as a server built
/// without Lua): here `SCRIPT` renamed away, answered `ERR unknown
/// command`.
#[tokio::test]
async fn a_server_without_scripting_commands_is_refused_at_the_check() {
    let server = RedisServer::start_with(&["--rename-command", "SCRIPT", ""]);
    let store = RedisStore::from_url(&server.url()).unwrap();
    assert_no_scripting(
        &store.check().await.unwrap_err(),
        "unknown command 'SCRIPT'",
    );
}

/// The same on a Cluster: every primary loads the scripts when the store
/// connects, and a refusal there is named as on one primary.
#[tokio::test]
async fn a_cluster_without_scripting_commands_is_refused_at_the_check() {
    let cluster = support::topology::Cluster::start_with(3, &["--rename-command", "SCRIPT", ""]);
    let urls = cluster.urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let store = RedisStore::cluster(&urls).unwrap();
    assert_no_scripting(
        &store.check().await.unwrap_err(),
        "unknown command 'SCRIPT'",
    );
}

/// An ACL user without `@admin` (so without `CONFIG`, as on managed
/// services) passes the check: the eviction policy cannot be read, which
/// is no reason to refuse the server; it locks.
#[tokio::test]
async fn a_user_without_config_passes_the_check_and_locks() {
    let (server, store) = acl_store(&["+@all", "-@admin"]);
    let refused = server.cmd(&[
        "ACL",
        "DRYRUN",
        "locks",
        "CONFIG",
        "GET",
        "maxmemory-policy",
    ]);
    assert!(
        refused
            .as_string()
            .is_some_and(|s| s.contains("no permissions")),
        "{refused:?}"
    );
    store.check().await.unwrap();
    let l = Locker::builder(store).build().unwrap();
    let held = timeout(LIMIT, l.try_acquire(&key()))
        .await
        .unwrap()
        .unwrap();
    assert!(held.release().await.unwrap());
}
