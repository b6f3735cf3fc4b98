//! The Redis store behind Sentinel: one primary, one replica and three
//! sentinels, all real processes; failovers forced by `SENTINEL FAILOVER`
//! and by freezing the primary.

mod support;
use support::stores::redis_name;

use std::time::Duration;

use support::topology::SentinelSet;
use tokio::time::timeout;
use tower_redis_lock::{Error, LockKey, Locker, RedisStore, RedisStoreBuilder, ReplicaShortfall};

fn builder(set: &SentinelSet) -> RedisStoreBuilder {
    let urls = set.sentinel_urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    RedisStore::sentinel_builder(&urls, &set.master_name)
        .command_timeout(Duration::from_millis(300))
}

fn store(set: &SentinelSet) -> RedisStore {
    builder(set).build().unwrap()
}

fn key(id: &str) -> LockKey {
    LockKey::new("sentinel", id).unwrap()
}

/// Tries until a grant succeeds (errors are expected while the failover is
/// under way).
async fn acquire_eventually(l: &Locker<RedisStore>, k: &LockKey) -> tower_redis_lock::LockGuard {
    let mut last = None;
    support::eventually_some(Duration::from_secs(30), async || {
        l.try_acquire(k).await.map_err(|e| last = Some(e)).ok()
    })
    .await
    .unwrap_or_else(|| panic!("no grant after the failover: {last:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_grants_follow_a_failover_and_tokens_never_go_backwards() {
    let set = SentinelSet::start();
    let st = builder(&set)
        .wait_replicas(1, Duration::from_millis(200), ReplicaShortfall::Fail)
        .build()
        .unwrap();
    let l = Locker::builder(st)
        .lease(Duration::from_secs(5))
        .build()
        .unwrap();
    let k = key("follow");
    let mut last = 0;
    for _ in 0..5 {
        let g = l.try_acquire(&k).await.unwrap();
        assert!(g.fencing_token().unwrap().get() > last);
        last = g.fencing_token().unwrap().get();
        g.release().await.unwrap();
    }
    let old_port = set.primary.port();
    let new_port = set.failover();
    assert_ne!(new_port, old_port);

    let g = acquire_eventually(&l, &k).await;
    assert!(
        g.fencing_token().unwrap().get() > last,
        "token went backwards"
    );
    // The grant is on the new primary.
    let new_primary = set.server_on_port(new_port).unwrap();
    assert!(
        new_primary
            .keys()
            .contains(&redis_name("sentinel", "follow", "lock")),
        "{:?}",
        new_primary.keys()
    );
    assert!(g.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_refuses_a_grant_the_replica_did_not_get() {
    let set = SentinelSet::start();
    let st = builder(&set)
        .wait_replicas(1, Duration::from_millis(100), ReplicaShortfall::Fail)
        .build()
        .unwrap();
    let l = Locker::new(st);
    set.replica.freeze();
    let res = l.try_acquire(&key("unreplicated")).await;
    set.replica.thaw();
    match res {
        Err(Error::Unavailable { source, .. }) => {
            assert!(
                source.to_string().contains("replicas acknowledged"),
                "{source}"
            )
        }
        other => panic!("{other:?}"),
    }
    // The refused grant was taken back.
    assert!(
        set.primary.keys().iter().all(|k| !k.ends_with(":lock")),
        "{:?}",
        set.primary.keys()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_grant_missed_the_new_primary_is_told_it_lost() {
    let set = SentinelSet::start();
    let l = Locker::builder(store(&set))
        .lease(Duration::from_secs(3))
        .build()
        .unwrap();
    let k = key("missed");
    // The grant reaches the primary only: the replica is frozen.
    set.replica.freeze();
    let g = l.try_acquire(&k).await.unwrap();
    let old_token = g.fencing_token().unwrap();
    // Now the primary goes silent and the replica is promoted.
    set.primary.freeze();
    set.replica.thaw();
    let new_port = set.wait_for_master_change(set.primary.port());
    assert_eq!(new_port, set.replica.port());
    // The replication stream may already have been sitting in the frozen
    // replica's socket buffer, in which case the promoted replica has the
    // grant and the holder rightly keeps it. Otherwise the holder must be
    // told it lost.
    let lock_key = redis_name("sentinel", "missed", "lock");
    if set.replica.keys().contains(&lock_key) {
        let counter = set
            .replica
            .cmd(&["GET", &redis_name("sentinel", "missed", "fence")])
            .as_string()
            .unwrap();
        assert_eq!(counter, old_token.get().to_string());
        // No second grant while it is there (the holder may or may not have
        // flipped to lost meanwhile, depending on how long the failover took).
        assert!(l.try_acquire(&k).await.unwrap_err().is_contended());
        let _ = g.release().await;
        set.primary.thaw();
        return;
    }
    timeout(Duration::from_secs(30), g.lost())
        .await
        .expect("the old holder was never told");
    assert!(!g.is_held());
    // The new primary grants the key, with a larger token.
    let g2 = acquire_eventually(&l, &k).await;
    assert!(g2.fencing_token().unwrap() > old_token);
    set.primary.thaw();
    assert!(g2.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_waiting_for_replicas_holds_up_no_other_command() {
    let set = SentinelSet::start();
    // WAIT may take up to 8 s here; the store's other commands must not
    // queue behind it.
    let st = builder(&set)
        .command_timeout(Duration::from_secs(10))
        .wait_replicas(1, Duration::from_secs(8), ReplicaShortfall::Proceed)
        .build()
        .unwrap();
    let l = Locker::new(st);
    let held = l.try_acquire(&key("held")).await.unwrap();

    set.replica.freeze();
    let waiting = {
        let l = l.clone();
        tokio::spawn(async move { l.try_acquire(&key("waiting")).await })
    };
    // The grant is written and its WAIT is blocked on the primary.
    let blocked = || {
        set.primary
            .cmd(&["INFO", "clients"])
            .as_string()
            .unwrap()
            .lines()
            .any(|l| l.trim() == "blocked_clients:1")
    };
    assert!(support::wait_until(Duration::from_secs(10), blocked));

    // Renewal, release and the grant of a free key all answer while the
    // WAIT is still blocked.
    held.extend().await.unwrap();
    assert!(held.release().await.unwrap());
    let other = Locker::new(store(&set));
    // Another key is granted meanwhile (the guard dropped at once).
    drop(other.try_acquire(&key("other")).await.unwrap());
    assert!(
        !waiting.is_finished(),
        "the WAIT ended before the other commands answered"
    );
    assert!(blocked());

    waiting.abort();
    set.replica.thaw();
}

/// Issue 22 B4: a frozen first Sentinel costs a lookup nothing. The other
/// Sentinels answer at once, so a store whose command timeout (300 ms) is
/// below redis-rs' own per-Sentinel response timeout (500 ms) connects and
/// grants within a few of its own command timeouts, whatever the list
/// order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_first_sentinel_does_not_keep_a_short_timeout_store_from_connecting() {
    let set = SentinelSet::start();
    set.sentinels[0].freeze();
    let command_timeout = Duration::from_millis(300);
    let st = builder(&set)
        .command_timeout(command_timeout)
        .build()
        .unwrap();
    let l = Locker::new(st);
    // Each try is bounded by the command timeout; a few tries leave room
    // for a loaded machine, not for a 500 ms wait per lookup.
    let bound = command_timeout * 4;
    let started = std::time::Instant::now();
    let mut last = None;
    let g = support::eventually_some(bound, async || {
        l.try_acquire(&key("frozen-sentinel"))
            .await
            .map_err(|e| last = Some(e))
            .ok()
    })
    .await
    .unwrap_or_else(|| panic!("no grant within {bound:?}: {last:?}"));
    assert!(
        started.elapsed() < bound + command_timeout,
        "{:?}",
        started.elapsed()
    );
    // Later connections (after the store forgets its connection) look up
    // again, still past the frozen Sentinel.
    assert!(g.release().await.unwrap());
    set.sentinels[0].thaw();
}
