//! The Redis store on a real three-primary Redis Cluster.

use crate::kinds::Take;
use crate::support;
use support::logs::Logs;
use support::stores::redis_name;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use support::topology::Cluster;
use support::{RedisServer, eventually};
use tower_redis_lock::{Acquired, Error, LockKey, Locker, Record, RedisStore, ReplicaShortfall};

fn store(cluster: &Cluster) -> RedisStore {
    let urls = cluster.urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    RedisStore::cluster(&urls).unwrap()
}

fn locker(cluster: &Cluster, lease_ms: u64, wait_ms: u64) -> Locker<RedisStore> {
    Locker::builder(store(cluster))
        .lease(Duration::from_millis(lease_ms))
        .wait_timeout(Duration::from_millis(wait_ms))
        .poll_interval(Duration::from_millis(5))
        .build()
        .unwrap()
}

/// The lowest slot `node` owns (the first a reshard from it moves).
fn first_slot(cluster: &Cluster, node: usize) -> u16 {
    let (first, _, _) = cluster
        .slot_ranges()
        .into_iter()
        .filter(|&(_, _, owner)| owner == node)
        .min()
        .unwrap();
    first
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_keys_across_every_node_without_crossslot() {
    let cluster = Cluster::start(3);
    let l = locker(&cluster, 10_000, 0);
    let mut tasks = Vec::new();
    for t in 0..16 {
        let l = l.clone();
        tasks.push(tokio::spawn(async move {
            let mut last = 0;
            for i in 0..125 {
                let key = LockKey::new("cl", format!("k{t}-{i}")).unwrap();
                let g = l.try_acquire(&key).await.unwrap();
                last = last.max(g.fencing_token().unwrap().get());
                assert!(g.release().await.unwrap());
            }
            last
        }));
    }
    for t in tasks {
        assert!(t.await.unwrap() > 0);
    }
    // Every node took part, and nothing is left but fencing counters: one
    // per bucket of the namespace used, never one per id.
    for (i, node) in cluster.nodes.iter().enumerate() {
        assert!(node.command_calls("evalsha") > 0, "node {i} saw no lock");
    }
    let keys = cluster.keys_total();
    assert!(keys.iter().all(|k| k.ends_with("}:fence")), "{keys:?}");
    assert!(keys.len() <= 1_024, "{} counters for 2,000 ids", keys.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contention_and_waking_work_on_every_slot() {
    let cluster = Cluster::start(3);
    let l = locker(&cluster, 10_000, 20_000);
    let overlaps = Arc::new(AtomicU32::new(0));
    let mut tasks = Vec::new();
    // Three keys (spread over slots), four contenders each.
    for k in 0..3 {
        let inside = Arc::new(AtomicU32::new(0));
        for _ in 0..4 {
            let (l, inside, overlaps) = (l.clone(), inside.clone(), overlaps.clone());
            let key = LockKey::new("cl", format!("hot-{k}")).unwrap();
            tasks.push(tokio::spawn(async move {
                for _ in 0..40 {
                    let g = l.acquire(&key).await.unwrap();
                    if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    tokio::task::yield_now().await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    g.release().await.unwrap();
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(overlaps.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_migration_under_load_loses_no_lock() {
    let cluster = Cluster::start(3);
    // A 3 s lease, renewed every second: a reshard on a loaded machine may
    // hold renewals up for a while (a 600 ms lease was lost so once, on
    // Valkey, beside the other CI lanes), and what this test asks is that
    // the migration itself loses nothing.
    let l = locker(&cluster, 3_000, 0);
    // Locks whose slots are among the first ones node 0 owns: a reshard of
    // 200 slots from node 0 moves them.
    let first = first_slot(&cluster, 0);
    let mut ids = Vec::new();
    let mut i = 0;
    while ids.len() < 5 {
        let id = format!("mig-{i}");
        let slot = cluster.slot_of(&redis_name("cl", &id, "lock"));
        if (first..first + 200).contains(&slot) {
            ids.push(id);
        }
        i += 1;
    }
    let mut guards = Vec::new();
    for id in &ids {
        guards.push(l.acquire(&LockKey::new("cl", id).unwrap()).await.unwrap());
    }
    cluster.reshard(0, 1, 200);
    for id in &ids {
        let slot = cluster.slot_of(&redis_name("cl", id, "lock"));
        assert_eq!(cluster.node_for_slot(slot), 1, "{id} did not move");
    }
    // Hold across at least two renewals of every lock on its new node.
    let before = cluster.nodes[1].command_calls("evalsha");
    let want = before + 2 * ids.len() as u64;
    let renewed = support::wait_until(Duration::from_secs(15), || {
        cluster.nodes[1].command_calls("evalsha") >= want
    });
    let states: Vec<(bool, bool)> = guards.iter().map(|g| (g.is_held(), g.is_lost())).collect();
    assert!(
        renewed,
        "not renewed twice each on the new node; (held, lost) per lock: {states:?}"
    );
    for (g, id) in guards.iter().zip(&ids) {
        assert!(g.is_held(), "{id} lost after the migration");
        assert!(!g.is_lost());
        let other = l.try_acquire(&LockKey::new("cl", id).unwrap()).await;
        assert!(other.unwrap_err().is_contended(), "{id} granted twice");
    }
    for g in guards {
        assert!(g.release().await.unwrap());
    }
}

/// Bound on each condition wait below.
const LIMIT: Duration = Duration::from_secs(10);

/// A locker whose waiters only a release notification wakes within a
/// test: they wait up to an hour and, as the lease is two, nap at least
/// half an hour between polls.
fn notified_locker(cluster: &Cluster) -> Locker<RedisStore> {
    notified(store(cluster))
}

fn notified(store: RedisStore) -> Locker<RedisStore> {
    Locker::builder(store)
        .lease(Duration::from_secs(7200))
        .wait_timeout(Duration::from_secs(3600))
        .poll_interval(Duration::from_secs(3600))
        .build()
        .unwrap()
}

/// What a waiter got, if it got it within [`LIMIT`]; else the release
/// notification did not reach it.
async fn granted(waiter: Waiter) -> Acquired {
    match tokio::time::timeout(LIMIT, waiter).await {
        Ok(joined) => joined.unwrap().unwrap(),
        Err(_) => panic!("the waiter was not woken by the release"),
    }
}

type Waiter = tokio::task::JoinHandle<Result<Acquired, tower_redis_lock::Error>>;

/// A key `cl:<prefix><n>` whose slot node `node` owns and, if given, lies
/// in `slots`.
fn key_on(
    cluster: &Cluster,
    node: usize,
    slots: Option<std::ops::Range<u16>>,
    prefix: &str,
) -> LockKey {
    (0..1_000_000)
        .map(|n| format!("{prefix}{n}"))
        .find(|id| {
            let slot = cluster.slot_of(&redis_name("cl", id, "lock"));
            slots.as_ref().is_none_or(|r| r.contains(&slot)) && cluster.node_for_slot(slot) == node
        })
        .map(|id| LockKey::new("cl", id).unwrap())
        .expect("no key of the namespace hashes into those slots")
}

/// Clients subscribed to the shard channel `channel` on `node`.
fn shard_subscribers(node: &RedisServer, channel: &str) -> i64 {
    node.cmd(&["PUBSUB", "SHARDNUMSUB", channel])
        .as_array()
        .unwrap()[1]
        .as_int()
        .unwrap()
}

/// Starts `waiters` waiting for `k` (held elsewhere) and returns once the
/// waiter is subscribed on `node` and has tried again after subscribing, so
/// that from then on only a notification wakes it.
async fn start_waiting(waiters: &Locker<RedisStore>, k: &LockKey, node: &RedisServer) -> Waiter {
    let channel = waiters.store().release_channel(k);
    let tries = node.command_calls("evalsha");
    let waiter = {
        let (l, k) = (waiters.clone(), k.clone());
        tokio::spawn(async move { l.acquire_or_replay(&k).await })
    };
    // Its first try, then its try after subscribing.
    assert!(
        eventually(LIMIT, async || {
            shard_subscribers(node, &channel) == 1 && node.command_calls("evalsha") >= tries + 2
        })
        .await,
        "{k}: the waiter did not subscribe on port {}",
        node.port()
    );
    waiter
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_and_finish_wake_waiters_by_sharded_notification_on_every_primary() {
    let cluster = Cluster::start(3);
    // Separate stores: a release by the holder cannot wake the waiter
    // in-process, only through Redis.
    let holders = locker(&cluster, 120_000, 0);
    let waiters = notified_locker(&cluster);
    wake_on_every_primary(&cluster, (&holders, &waiters), "wake").await;
}

/// The same without fencing (the release's flags say only "Cluster").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_fencing_release_and_finish_wake_waiters_by_sharded_notification() {
    let cluster = Cluster::start(3);
    let unfenced = || {
        let urls = cluster.urls();
        let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
        RedisStore::cluster_builder(&urls)
            .fencing(false)
            .build()
            .unwrap()
    };
    let holders = Locker::builder(unfenced())
        .lease(Duration::from_secs(120))
        .build()
        .unwrap();
    let waiters = notified(unfenced());
    wake_on_every_primary(&cluster, (&holders, &waiters), "plain-wake").await;
}

/// On each primary, a waiter of `waiters` is woken by the notification of
/// a release, then of a finish, by `holders`.
async fn wake_on_every_primary(
    cluster: &Cluster,
    (holders, waiters): (&Locker<RedisStore>, &Locker<RedisStore>),
    prefix: &str,
) {
    let mut record = Record::new(http::StatusCode::CREATED);
    record = record.with_body(bytes::Bytes::from_static(b"done"));
    for node in 0..cluster.nodes.len() {
        let owner = &cluster.nodes[node];
        for finish in [false, true] {
            let k = key_on(cluster, node, None, &format!("{prefix}-{finish}-"));
            let holder = holders.acquire(&k).await.unwrap();
            let waiter = start_waiting(waiters, &k, owner).await;
            if finish {
                assert!(
                    holder
                        .finish(record.encode(), Duration::from_secs(60))
                        .await
                        .unwrap()
                );
            } else {
                assert!(holder.release().await.unwrap());
            }
            match granted(waiter).await {
                Acquired::Completed(got) if finish => {
                    assert_eq!(Record::decode(got), Some(record.clone()))
                }
                Acquired::Locked(g) if !finish => assert!(g.release().await.unwrap()),
                other => panic!("{k} on node {node}, finish {finish}: {other:?}"),
            }
            // The subscription went with the last waiter.
            let channel = waiters.store().release_channel(&k);
            assert!(
                eventually(LIMIT, async || shard_subscribers(owner, &channel) == 0).await,
                "{channel} still subscribed on node {node}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_woken_after_the_slot_of_its_key_moves_to_another_node() {
    let cluster = Cluster::start(3);
    let holders = locker(&cluster, 120_000, 0);
    let waiters = notified_locker(&cluster);
    // A key among the first slots of node 0, which the reshard moves to 1.
    let first = first_slot(&cluster, 0);
    // 200 slots: one namespace's locks use 1,024 hash tags (its fencing
    // buckets), so a narrow range of slots may hold none of them.
    let k = key_on(&cluster, 0, Some(first..first + 200), "moving-");
    let channel = waiters.store().release_channel(&k);
    let holder = holders.acquire(&k).await.unwrap();
    let waiter = start_waiting(&waiters, &k, &cluster.nodes[0]).await;

    cluster.reshard(0, 1, 200);
    let slot = cluster.slot_of(&waiters.store().lock_key(&k));
    assert_eq!(cluster.node_for_slot(slot), 1, "{k} did not move");
    // Node 0 dropped the subscription; it is renewed on node 1.
    assert!(
        eventually(LIMIT, async || {
            shard_subscribers(&cluster.nodes[1], &channel) == 1
                && shard_subscribers(&cluster.nodes[0], &channel) == 0
        })
        .await,
        "{channel} was not subscribed again on the new owner"
    );
    assert!(holder.is_held());
    assert!(holder.release().await.unwrap());
    match granted(waiter).await {
        Acquired::Locked(g) => assert!(g.release().await.unwrap()),
        other => panic!("{other:?}"),
    }
    assert!(
        eventually(LIMIT, async || shard_subscribers(
            &cluster.nodes[1],
            &channel
        ) == 0)
        .await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_pubsub_connection_wakes_its_waiters_and_is_subscribed_again() {
    let cluster = Cluster::start(3);
    let holders = locker(&cluster, 120_000, 0);
    let waiters = notified_locker(&cluster);
    let node = &cluster.nodes[2];
    let k = key_on(&cluster, 2, None, "killed-");
    let channel = waiters.store().release_channel(&k);
    let holder = holders.acquire(&k).await.unwrap();
    let waiter = start_waiting(&waiters, &k, node).await;

    let tries = node.command_calls("evalsha");
    let killed = node.cmd(&["CLIENT", "KILL", "TYPE", "pubsub"]);
    assert_eq!(killed.as_int(), Some(1), "{killed:?}");
    // A release could have been missed: the waiter tries again at once
    // (the lock is held for 120 s and it polls every 60 s), and its
    // subscription comes back.
    assert!(
        eventually(LIMIT, async || {
            node.command_calls("evalsha") > tries && shard_subscribers(node, &channel) == 1
        })
        .await,
        "the waiter was not woken, or not subscribed again"
    );
    assert!(holder.release().await.unwrap());
    match granted(waiter).await {
        Acquired::Locked(g) => assert!(g.release().await.unwrap()),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_of_one_store_share_a_subscription_that_ends_with_the_last() {
    let cluster = Cluster::start(3);
    let holders = locker(&cluster, 120_000, 0);
    let shared = store(&cluster);
    // Two lockers (two local queues) on one store: one notifier.
    let (first, second) = (notified(shared.clone()), notified(shared.clone()));
    let node = &cluster.nodes[1];
    let k = key_on(&cluster, 1, None, "shared-");
    let channel = shared.release_channel(&k);
    let holder = holders.acquire(&k).await.unwrap();
    let one = start_waiting(&first, &k, node).await;
    let two = start_waiting(&second, &k, node).await;
    assert_eq!(shard_subscribers(node, &channel), 1);

    // The first leaves; the second is still notified.
    one.abort();
    assert!(one.await.unwrap_err().is_cancelled());
    assert!(!first.has_waiters(&k));
    assert!(holder.release().await.unwrap());
    let Acquired::Locked(g) = granted(two).await else {
        panic!("no record was stored");
    };
    assert!(
        eventually(LIMIT, async || shard_subscribers(node, &channel) == 0).await,
        "{channel} still subscribed after its last waiter left"
    );
    assert!(g.release().await.unwrap());
}

#[tokio::test]
async fn without_sharded_pubsub_releases_still_work_and_waiters_poll() {
    // Nodes that know neither SSUBSCRIBE nor SPUBLISH, as before Redis 7.
    let cluster = Cluster::start_with(
        3,
        &[
            "--rename-command",
            "SSUBSCRIBE",
            "",
            "--rename-command",
            "SPUBLISH",
            "",
        ],
    );
    let (logs, _guard) = Logs::capture();
    let holders = locker(&cluster, 120_000, 0);
    // Polls every 5 ms.
    let waiters = locker(&cluster, 120_000, 20_000);
    let k = key_on(&cluster, 0, None, "polling-");
    let holder = holders.acquire(&k).await.unwrap();
    let waiter = {
        let (l, k) = (waiters.clone(), k.clone());
        tokio::spawn(async move { l.acquire_or_replay(&k).await })
    };
    assert!(
        eventually(LIMIT, async || logs.text().contains("waiters poll")).await,
        "no log line about the fallback: {}",
        logs.text()
    );
    assert!(waiters.has_waiters(&k));
    // The release script's SPUBLISH fails; the release does not.
    assert!(holder.release().await.unwrap());
    match granted(waiter).await {
        Acquired::Locked(g) => assert!(g.release().await.unwrap()),
        other => panic!("{other:?}"),
    }
    // Said once per store, not once per waiter.
    let k = key_on(&cluster, 1, None, "polling-");
    let holder = holders.acquire(&k).await.unwrap();
    let waiter = {
        let (l, k) = (waiters.clone(), k.clone());
        tokio::spawn(async move { l.acquire(&k).await })
    };
    assert!(eventually(LIMIT, async || waiters.has_waiters(&k)).await);
    assert!(holder.release().await.unwrap());
    assert!(waiter.await.unwrap().unwrap().release().await.unwrap());
    assert_eq!(
        logs.text().matches("waiters poll").count(),
        1,
        "{}",
        logs.text()
    );
}

/// `id` of the first `cl:<prefix><n>` whose lock is in a slot that `node`
/// owns and that is none of `not`, with that slot.
fn id_on(cluster: &Cluster, node: usize, not: &[u16], prefix: &str) -> (String, u16) {
    (0..1_000_000)
        .map(|n| format!("{prefix}{n}"))
        .map(|id| {
            let slot = cluster.slot_of(&redis_name("cl", &id, "lock"));
            (id, slot)
        })
        .find(|(_, slot)| !not.contains(slot) && cluster.node_for_slot(*slot) == node)
        .expect("no key of the namespace hashes into those slots")
}

/// A locker on `cluster` with the command timeout and lease given.
fn timed_locker(
    cluster: &Cluster,
    command_timeout: Duration,
    lease: Duration,
) -> Locker<RedisStore> {
    let urls = cluster.urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let st = RedisStore::cluster_builder(&urls)
        .command_timeout(command_timeout)
        .build()
        .unwrap();
    Locker::builder(st).lease(lease).build().unwrap()
}

/// With one primary frozen, a MOVED reply (a slot moved
/// between two healthy primaries behind the store's back) makes the
/// cluster client refresh its slot map, which asks every node; the frozen
/// one never answers. Every node connection has a response timeout, so the
/// refresh ends, a lock on a healthy node keeps being renewed across
/// several leases, and grants on healthy slots keep answering within the
/// command timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_node_and_a_moved_reply_stall_no_healthy_slot() {
    // Healthy slots stay served while a node is down.
    let cluster = Cluster::start_with(3, &["--cluster-require-full-coverage", "no"]);
    // 1 s, and half of it as slack below: a healthy grant answers in a few
    // ms, one held up by the frozen node in one command timeout, and a
    // loaded machine adds a few hundred ms to either (500 ms with 100 ms
    // of slack failed once at load average 8-11).
    let command_timeout = Duration::from_secs(1);
    let lease = Duration::from_secs(3);
    let l = timed_locker(&cluster, command_timeout, lease);

    let (held_id, held_slot) = id_on(&cluster, 0, &[], "held");
    let (moved_id, moved_slot) = id_on(&cluster, 0, &[held_slot], "moved");
    let (frozen_id, _) = id_on(&cluster, 2, &[], "frozen");
    let key = |id: &str| LockKey::new("cl", id).unwrap();
    // The store has a connection to every node, the frozen one included.
    let held = l.try_acquire(&key(&held_id)).await.unwrap();
    assert!(
        l.try_acquire(&key(&frozen_id))
            .await
            .unwrap()
            .release()
            .await
            .unwrap()
    );
    let ids = cluster.node_ids();
    let slot = moved_slot.to_string();
    assert_eq!(
        cluster.nodes[0]
            .cmd(&["CLUSTER", "COUNTKEYSINSLOT", &slot])
            .as_int(),
        Some(0)
    );

    cluster.nodes[2].freeze();
    // Move the (empty) slot from node 0 to node 1 behind the store's back:
    // its next call there is answered MOVED.
    for (node, args) in [
        (1, ["CLUSTER", "SETSLOT", &slot, "IMPORTING", &ids[0]]),
        (0, ["CLUSTER", "SETSLOT", &slot, "MIGRATING", &ids[1]]),
        (1, ["CLUSTER", "SETSLOT", &slot, "NODE", &ids[1]]),
        (0, ["CLUSTER", "SETSLOT", &slot, "NODE", &ids[1]]),
    ] {
        let reply = cluster.nodes[node].cmd(&args);
        assert_eq!(
            reply.as_string().as_deref(),
            Some("OK"),
            "{args:?}: {reply:?}"
        );
    }
    let moved_calls = cluster.nodes[1].command_calls("evalsha");
    let g = l.try_acquire(&key(&moved_id)).await.unwrap();
    assert!(cluster.nodes[1].command_calls("evalsha") > moved_calls);
    assert!(g.release().await.unwrap());

    // For two leases, grants on healthy slots answer (each within the
    // command timeout: the store bounds every call by it) and the held
    // lock is renewed.
    let started = tokio::time::Instant::now();
    let mut n = 0;
    while started.elapsed() < lease * 2 {
        for node in [0, 1] {
            let (id, _) = id_on(&cluster, node, &[], &format!("healthy{n}-"));
            let t = tokio::time::Instant::now();
            let g = l
                .try_acquire(&key(&id))
                .await
                .unwrap_or_else(|e| panic!("grant {n} on node {node}: {e:?}"));
            assert!(
                t.elapsed() <= command_timeout + command_timeout / 2,
                "grant {n} on node {node} took {:?}",
                t.elapsed()
            );
            assert!(g.release().await.unwrap());
            n += 1;
        }
        assert!(held.is_held(), "the healthy lock was lost after {n} grants");
    }
    held.extend().await.unwrap();
    assert!(held.is_held());
    cluster.nodes[2].thaw();
    assert!(held.release().await.unwrap());
}

/// When a primary freezes and its replica takes over, the
/// store follows: a frozen primary answers neither an error nor a
/// redirect, so the store refreshes its view of the cluster when calls
/// time out on it. Once every healthy node names the new primary, a grant
/// of a key of that slot succeeds within `FOLLOW_BOUND`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_follows_a_replica_that_takes_over_from_a_frozen_primary() {
    use support::topology::{Role, role};
    let cluster = Cluster::start_with_replicas(
        3,
        1,
        &[
            "--cluster-require-full-coverage",
            "no",
            // Replicas sync at once, and one may take over however long
            // its link has been down.
            "--repl-diskless-sync-delay",
            "0",
            "--cluster-replica-validity-factor",
            "0",
        ],
    );
    let l = timed_locker(&cluster, Duration::from_millis(500), Duration::from_secs(5));
    let replicas = cluster.replica_indices();
    let primary = (0..cluster.nodes.len())
        .find(|i| !replicas.contains(i))
        .unwrap();
    let replica = replicas
        .iter()
        .copied()
        .find(|&r| {
            matches!(role(&cluster.nodes[r]),
                Ok(Role::Replica { master_port, .. }) if master_port == cluster.nodes[primary].port())
        })
        .expect("a replica of the primary");
    let (id, slot) = id_on(&cluster, primary, &[], "failover");
    let k = LockKey::new("cl", &id).unwrap();
    // The store knows the slot's primary, and its notifications work: a
    // waiter on the same store is woken by another process's release.
    assert!(l.try_acquire(&k).await.unwrap().release().await.unwrap());
    let waiting = Locker::builder(l.store().clone())
        .wait_timeout(Duration::from_secs(20))
        .poll_interval(Duration::from_secs(60))
        .build()
        .unwrap();
    let before = woken_after_release(&waiting, &cluster, primary, &k).await;
    assert!(
        before < Duration::from_secs(1),
        "woken {before:?} after the release"
    );

    let linked = || matches!(role(&cluster.nodes[replica]), Ok(Role::Replica { state, .. }) if state == "connected");
    assert!(support::wait_until(Duration::from_secs(10), linked));
    cluster.nodes[primary].freeze();
    // Calls keep coming meanwhile, and time out (the store cannot know
    // yet); they stop once the promotion is seen.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let caller = {
        let (l, k, stop) = (l.clone(), k.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                if let Ok(g) = l.try_acquire(&k).await {
                    let _ = g.release().await;
                }
            }
        })
    };
    // Wait for the healthy nodes to name the replica as the slot's owner.
    let healthy: Vec<usize> = (0..cluster.nodes.len()).filter(|&i| i != primary).collect();
    let replica_port = cluster.nodes[replica].port();
    let owner_is_replica = || {
        healthy
            .iter()
            .all(|&i| cluster.owner_port_per(i, slot) == Ok(replica_port))
    };
    assert!(
        support::wait_until(Duration::from_secs(30), owner_is_replica),
        "the replica never took over\n{}",
        cluster.diagnostics()
    );
    stop.store(true, Ordering::Relaxed);
    caller.await.unwrap();
    let promoted = std::time::Instant::now();
    let mut last = None;
    let g = support::eventually_some(FOLLOW_BOUND, async || {
        l.try_acquire(&k).await.map_err(|e| last = Some(e)).ok()
    })
    .await
    .unwrap_or_else(|| panic!("no grant within {FOLLOW_BOUND:?} of the promotion: {last:?}"));
    assert!(
        cluster.nodes[replica]
            .keys()
            .contains(&redis_name("cl", &id, "lock"))
    );
    assert!(promoted.elapsed() < FOLLOW_BOUND);
    assert!(g.release().await.unwrap());

    // Its release notifications follow too: a waiter of the slot (polling
    // only once a minute), subscribed before the failover, is woken after
    // it by a release in another process, not by its poll near the end of
    // the holder's lease. (The sharded pub/sub connection kept sending the
    // slot's subscriptions to the frozen process: woken after 4.7 s of an
    // 8 s lease.)
    let after = woken_after_release(&waiting, &cluster, replica, &k).await;
    assert!(
        after < Duration::from_secs(1),
        "woken {after:?} after the release: by its poll, not the notification"
    );
    cluster.nodes[primary].thaw();
}

/// How long after another process's release `waiting` gets `k`, which it
/// waits for (the holder holds an 8 s lease); `owner` is the node of the
/// key's slot.
async fn woken_after_release(
    waiting: &Locker<RedisStore>,
    cluster: &Cluster,
    owner: usize,
    k: &LockKey,
) -> Duration {
    let other = timed_locker(cluster, Duration::from_millis(500), Duration::from_secs(8));
    let held = support::eventually_some(FOLLOW_BOUND, async || other.try_acquire(k).await.ok())
        .await
        .expect("another process's grant");
    let waiter = {
        let (w, k) = (waiting.clone(), k.clone());
        tokio::spawn(async move { w.acquire(&k).await })
    };
    assert!(eventually(Duration::from_secs(5), async || waiting.has_waiters(k)).await);
    // The waiter subscribes on the slot's primary, `owner` (without the
    // fix, it never does after the failover: the wake-up below tells).
    let channel = redis_name("cl", k.id(), "released");
    let subscribed = || {
        let n = cluster.nodes[owner].cmd(&["PUBSUB", "SHARDNUMSUB", &channel]);
        n.as_array().and_then(|a| a.get(1)).and_then(|v| v.as_int()) == Some(1)
    };
    let _ = support::wait_until(Duration::from_secs(5), subscribed);
    let released = std::time::Instant::now();
    assert!(held.release().await.unwrap());
    let got = waiter.await.unwrap().expect("the waiter's grant");
    let woken = released.elapsed();
    assert!(got.release().await.unwrap());
    woken
}

/// How soon after a promotion the store follows (with a 500 ms command
/// timeout): a few timed-out calls, then one refresh.
const FOLLOW_BOUND: Duration = Duration::from_secs(3);

/// `MIGRATE`s `keys` from node `from` to node `to` (no `REPLACE`: a key
/// the store wrote on `to` meanwhile would be in the way, and the move
/// would fail as it would for `redis-cli --cluster reshard`).
fn migrate(cluster: &Cluster, from: usize, to: usize, keys: &[String]) {
    let port = cluster.nodes[to].port().to_string();
    let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
    args.extend(keys.iter().map(String::as_str));
    let reply = cluster.nodes[from].cmd(&args);
    assert_eq!(
        reply.as_string().as_deref(),
        Some("OK"),
        "{args:?}: {reply:?}"
    );
}

/// The keys node `node` has in `slot`.
fn keys_in_slot(cluster: &Cluster, node: usize, slot: u16) -> Vec<String> {
    let slot = slot.to_string();
    let reply = cluster.nodes[node].cmd(&["CLUSTER", "GETKEYSINSLOT", &slot, "1000"]);
    reply
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_string().unwrap())
        .collect()
}

/// `CLUSTER SETSLOT slot <args>` on node `node`.
fn setslot(cluster: &Cluster, node: usize, slot: u16, args: &[&str]) {
    let slot = slot.to_string();
    let mut all = vec!["CLUSTER", "SETSLOT", &slot];
    all.extend_from_slice(args);
    let reply = cluster.nodes[node].cmd(&all);
    assert_eq!(
        reply.as_string().as_deref(),
        Some("OK"),
        "{all:?}: {reply:?}"
    );
}

/// A 3-node cluster, a locker on it (500 ms command timeout, 30 s lease),
/// a key on node 0 named from `prefix`, and its lock's slot: the start of
/// each slot-migration test.
fn migration_case(prefix: &str) -> (Cluster, Locker<RedisStore>, LockKey, u16) {
    let cluster = Cluster::start(3);
    let l = timed_locker(
        &cluster,
        Duration::from_millis(500),
        Duration::from_secs(30),
    );
    let k = key_on(&cluster, 0, None, prefix);
    let slot = cluster.slot_of(&redis_name("cl", k.id(), "lock"));
    (cluster, l, k, slot)
}

/// Starts moving `slot` from node 0 to node 1 (`SETSLOT … IMPORTING` on
/// the node it goes to, then `MIGRATING` on the node it leaves), as
/// `redis-cli --cluster reshard` does; no key is moved yet.
fn begin_move(cluster: &Cluster, slot: u16) {
    let ids = cluster.node_ids();
    setslot(cluster, 1, slot, &["IMPORTING", &ids[0]]);
    setslot(cluster, 0, slot, &["MIGRATING", &ids[1]]);
}

fn token(g: &tower_redis_lock::LockGuard) -> u64 {
    g.fencing_token().unwrap().get()
}

/// A slot migrates (`SETSLOT … MIGRATING/IMPORTING`, its keys moved by
/// `MIGRATE` in two steps, then `SETSLOT … NODE`) while a lock of it is
/// held and waited for. A free lock of the slot is granted during the move
/// (within the command timeout, where the slot goes), the held one is
/// never granted to anyone else, before, during or after, its renewals and
/// release work, its waiter gets it, and the fencing tokens of the locks
/// of one bucket (one counter, left on the node the slot leaves until it
/// is moved) keep rising across the move. No grant writes a name on the
/// importing node that is still on the other one: every `MIGRATE` (without
/// `REPLACE`) succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_are_granted_and_stay_exclusive_while_their_slot_migrates() {
    let cluster = Cluster::start(3);
    // A grant held back by TRYAGAIN runs into this and fails: the move is
    // what the test is about, not the machine's load (500 ms once failed a
    // waiter's try after the move, in CI's Valkey pass on six threads).
    let command_timeout = Duration::from_secs(2);
    let holders = timed_locker(&cluster, command_timeout, Duration::from_secs(3));
    let others = timed_locker(&cluster, command_timeout, Duration::from_secs(3));
    let held = key_on(&cluster, 0, None, "mig-held-");
    let fence = redis_name("cl", held.id(), "fence");
    // Ids of the held lock's bucket: one fencing counter for all.
    let same_bucket = |prefix: &str| {
        (0..)
            .map(|n| format!("{prefix}{n}"))
            .find(|id| redis_name("cl", id, "fence") == fence)
            .map(|id| LockKey::new("cl", id).unwrap())
            .unwrap()
    };
    let (free, during, after, quiet, done) = (
        same_bucket("mig-free-"),
        same_bucket("mig-during-"),
        same_bucket("mig-after-"),
        same_bucket("mig-quiet-"),
        same_bucket("mig-done-"),
    );
    let slot = cluster.slot_of(&fence);
    let ids = cluster.node_ids();
    let mut tokens = Vec::new();
    let g = holders.try_acquire(&free).await.unwrap();
    tokens.push(token(&g));
    assert!(g.release().await.unwrap());
    let h = holders.try_acquire(&held).await.unwrap();
    tokens.push(token(&h));
    // Completed: its record stays on node 0 until the keys move.
    let record = Record::new(http::StatusCode::CREATED).encode();
    let f = holders.try_acquire(&done).await.unwrap();
    tokens.push(token(&f));
    assert!(f.finish(record.clone(), LIMIT * 6).await.unwrap());
    // Held without a waiter: released during the move, on node 0.
    let q = holders.try_acquire(&quiet).await.unwrap();
    tokens.push(token(&q));
    let waiting = Locker::builder(others.store().clone())
        .lease(Duration::from_secs(3))
        .wait_timeout(Duration::from_secs(20))
        .poll_interval(Duration::from_millis(100))
        .build()
        .unwrap();
    let waiter = {
        let (w, k) = (waiting.clone(), held.clone());
        tokio::spawn(async move { w.acquire(&k).await })
    };
    let waited = redis_name("cl", held.id(), "waited");
    assert!(eventually(LIMIT, async || cluster.nodes[0].keys().contains(&waited)).await);
    let contended = async |k: &LockKey| {
        let got = others.try_acquire(k).await;
        assert!(got.unwrap_err().is_contended(), "{k} granted twice");
    };

    begin_move(&cluster, slot);
    // A free lock is granted during the move, where the slot goes.
    let t = std::time::Instant::now();
    let g = others
        .try_acquire(&free)
        .await
        .unwrap_or_else(|e| panic!("no grant in the migrating slot: {e:?}"));
    assert!(t.elapsed() < command_timeout, "{:?}", t.elapsed());
    tokens.push(token(&g));
    assert!(
        cluster.nodes[1]
            .keys()
            .contains(&redis_name("cl", free.id(), "lock"))
    );
    contended(&held).await;
    // A replay finds the record on node 0 (the grant runs on node 1, which
    // cannot know it): never a second run of completed work.
    match others.acquire_or_replay(&done).await.unwrap() {
        Acquired::Completed(got) => assert_eq!(got, record),
        Acquired::Locked(_) => panic!("{done} granted again while its record is on node 0"),
    }

    // The counter moves first: the held lock is still on node 0.
    migrate(&cluster, 0, 1, std::slice::from_ref(&fence));
    contended(&held).await;
    contended(&quiet).await;
    let quiet_lock = redis_name("cl", quiet.id(), "lock");
    assert!(cluster.nodes[0].keys().contains(&quiet_lock));
    assert!(q.release().await.unwrap());
    assert!(!cluster.nodes[0].keys().contains(&quiet_lock));
    let d = others.try_acquire(&during).await.unwrap();
    tokens.push(token(&d));
    assert!(d.release().await.unwrap());
    assert!(g.release().await.unwrap());
    // Then the rest: the held lock and its waited-for mark.
    migrate(&cluster, 0, 1, &keys_in_slot(&cluster, 0, slot));
    assert!(keys_in_slot(&cluster, 0, slot).is_empty());
    contended(&held).await;
    h.extend().await.unwrap();
    for node in [1, 0, 2] {
        setslot(&cluster, node, slot, &["NODE", &ids[1]]);
    }
    contended(&held).await;
    let a = others.try_acquire(&after).await.unwrap();
    tokens.push(token(&a));
    assert!(a.release().await.unwrap());
    assert!(h.is_held());
    assert!(h.release().await.unwrap());
    let w = tokio::time::timeout(LIMIT, waiter)
        .await
        .expect("the waiter did not get the lock")
        .unwrap()
        .unwrap();
    tokens.push(token(&w));
    assert!(w.release().await.unwrap());
    assert!(
        tokens.windows(2).all(|p| p[0] < p[1]),
        "tokens of one bucket fell: {tokens:?}"
    );
}

/// A store made while the first node of its seed list is frozen (it
/// accepts connections and never answers) reads the slot map from the
/// others: its first call, a grant on a healthy node's slot, answers
/// within the command timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_store_whose_first_seed_is_frozen_connects_through_the_others() {
    let cluster = Cluster::start_with(3, &["--cluster-require-full-coverage", "no"]);
    // 1 s: what the grant through the healthy seeds takes on a loaded
    // machine stays below it; one that waits for the frozen seed does not.
    let command_timeout = Duration::from_secs(1);
    let (id, _) = id_on(&cluster, 1, &[], "seed");
    cluster.nodes[0].freeze();
    let l = timed_locker(&cluster, command_timeout, Duration::from_secs(5));
    let t = std::time::Instant::now();
    let g = l
        .try_acquire(&LockKey::new("cl", &id).unwrap())
        .await
        .unwrap_or_else(|e| panic!("no grant with the first seed frozen: {e:?}"));
    let took = t.elapsed();
    assert!(took < command_timeout, "the first grant took {took:?}");
    assert!(g.release().await.unwrap());
    cluster.nodes[0].thaw();
}

/// A cluster of three primaries with a replica each, whose replicas take
/// over at once (see the follow test above), and a primary with its
/// replica, linked.
fn failover_cluster() -> (Cluster, usize, usize) {
    use support::topology::{Role, role};
    let cluster = Cluster::start_with_replicas(
        3,
        1,
        &[
            "--cluster-require-full-coverage",
            "no",
            "--repl-diskless-sync-delay",
            "0",
            "--cluster-replica-validity-factor",
            "0",
        ],
    );
    let replicas = cluster.replica_indices();
    let primary = (0..cluster.nodes.len())
        .find(|i| !replicas.contains(i))
        .unwrap();
    let replica = replicas
        .iter()
        .copied()
        .find(|&r| {
            matches!(role(&cluster.nodes[r]),
                Ok(Role::Replica { master_port, .. }) if master_port == cluster.nodes[primary].port())
        })
        .expect("a replica of the primary");
    let linked = || matches!(role(&cluster.nodes[replica]), Ok(Role::Replica { state, .. }) if state == "connected");
    assert!(support::wait_until(LIMIT, linked));
    (cluster, primary, replica)
}

/// Whether every node but `not` names `port` as the owner of `slot`.
fn owner_named(cluster: &Cluster, not: usize, slot: u16, port: u16) -> bool {
    (0..cluster.nodes.len())
        .filter(|&i| i != not)
        .all(|i| cluster.owner_port_per(i, slot) == Ok(port))
}

/// An idle store follows a failover: no call is made (so none times out)
/// while a frozen primary's replica takes over; the store's periodic
/// refresh reads the slot map afresh within its interval, and its next
/// call is granted on the new primary within the command timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_store_follows_a_failover_by_its_periodic_refresh() {
    let (cluster, primary, replica) = failover_cluster();
    // 1 s: every healthy grant below must answer within it, many of them
    // on a loaded machine (500 ms left little room).
    let command_timeout = Duration::from_secs(1);
    let every = Duration::from_secs(1);
    let urls = cluster.urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let store = RedisStore::cluster_builder(&urls)
        .command_timeout(command_timeout)
        .topology_refresh(every)
        .build()
        .unwrap();
    let l = Locker::builder(store.clone())
        .lease(Duration::from_secs(5))
        .build()
        .unwrap();
    let (id, slot) = id_on(&cluster, primary, &[], "idle");
    let k = LockKey::new("cl", &id).unwrap();
    assert!(l.try_acquire(&k).await.unwrap().release().await.unwrap());

    let replicas = cluster.replica_indices();
    let healthy = (0..cluster.nodes.len())
        .find(|i| !replicas.contains(i) && *i != primary)
        .unwrap();
    let (healthy_id, _) = id_on(&cluster, healthy, &[], "healthy");
    let healthy_key = LockKey::new("cl", &healthy_id).unwrap();

    cluster.nodes[primary].freeze();
    // Until the replica takes over, refreshes meet the frozen primary; a
    // healthy slot's grants never wait for them.
    let frozen = std::time::Instant::now();
    let port = cluster.nodes[replica].port();
    while !owner_named(&cluster, primary, slot, port) {
        assert!(
            frozen.elapsed() < Duration::from_secs(30),
            "no takeover\n{}",
            cluster.diagnostics()
        );
        let t = std::time::Instant::now();
        let g = l.try_acquire(&healthy_key).await.unwrap();
        assert!(t.elapsed() < command_timeout, "{:?}", t.elapsed());
        assert!(g.release().await.unwrap());
    }
    let promoted = std::time::Instant::now();
    let bound = every + command_timeout;
    assert!(
        eventually(bound * 2, async || store
            .slot_map_read_at()
            .is_some_and(|at| at > promoted))
        .await,
        "the store did not read the slot map within {:?} of the promotion",
        bound * 2
    );
    let t = std::time::Instant::now();
    let g = l
        .try_acquire(&k)
        .await
        .unwrap_or_else(|e| panic!("the first call after the refresh: {e:?}"));
    assert!(t.elapsed() < command_timeout);
    assert!(
        cluster.nodes[replica]
            .keys()
            .contains(&redis_name("cl", &id, "lock"))
    );
    assert!(g.release().await.unwrap());
    cluster.nodes[primary].thaw();
}

/// Holds a lock of a slot of node `from` and queues a waiter for it (in
/// another store, polling once a minute), while `CLUSTER FAILOVER [FORCE]`
/// on node `to`, its replica, makes `to` the primary. A third store tries
/// the lock all along and never gets it; the holder keeps it (renewed
/// afterwards on `to`), and its release wakes the waiter: returns how long
/// after the release.
async fn failover_with_locks(
    cluster: &Cluster,
    from: usize,
    to: usize,
    force: bool,
    prefix: &str,
) -> Duration {
    let command_timeout = Duration::from_millis(500);
    let holders = timed_locker(cluster, command_timeout, Duration::from_secs(3));
    let contenders = timed_locker(cluster, command_timeout, Duration::from_secs(3));
    let waiting = Locker::builder(
        timed_locker(cluster, command_timeout, LIMIT)
            .store()
            .clone(),
    )
    .wait_timeout(LIMIT * 2)
    .poll_interval(Duration::from_secs(60))
    .build()
    .unwrap();
    let (id, slot) = id_on(cluster, from, &[], prefix);
    let k = LockKey::new("cl", &id).unwrap();
    let h = holders.try_acquire(&k).await.unwrap();
    let waiter = {
        let (w, k) = (waiting.clone(), k.clone());
        tokio::spawn(async move { w.acquire(&k).await })
    };
    let waited = redis_name("cl", &id, "waited");
    // The grant and the waiter's mark are on the replica too (`FORCE`
    // takes over without waiting for the primary: what the replica lacks
    // is lost, as in a crash).
    let lock = redis_name("cl", &id, "lock");
    assert!(
        eventually(LIMIT, async || {
            let keys = cluster.nodes[to].keys();
            keys.contains(&lock) && keys.contains(&waited)
        })
        .await
    );
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let contender = {
        let (c, k, stop) = (contenders.clone(), k.clone(), stop.clone());
        tokio::spawn(async move {
            let mut tries = 0;
            while !stop.load(Ordering::Relaxed) {
                if let Ok(g) = c.try_acquire(&k).await {
                    panic!("{k} granted to a second holder: {:?}", g.fencing_token());
                }
                tries += 1;
                tokio::task::yield_now().await;
            }
            tries
        })
    };
    // Every node knows `to` as `from`'s replica (a manual failover asks
    // `from` and the other primaries; one that does not know yet lets it
    // time out).
    let ids = cluster.node_ids();
    let known = || {
        cluster.nodes.iter().all(|n| {
            n.try_cmd(&["CLUSTER", "NODES"]).is_ok_and(|r| {
                r.as_string().unwrap_or_default().lines().any(|l| {
                    l.starts_with(&ids[to]) && l.contains("slave") && l.contains(&ids[from])
                })
            })
        })
    };
    assert!(support::wait_until(LIMIT, known));
    let mut args = vec!["CLUSTER", "FAILOVER"];
    if force {
        args.push("FORCE");
    }
    let reply = cluster.nodes[to].cmd(&args);
    assert_eq!(reply.as_string().as_deref(), Some("OK"), "{reply:?}");
    let port = cluster.nodes[to].port();
    assert!(
        eventually(Duration::from_secs(20), async || owner_named(
            cluster,
            usize::MAX,
            slot,
            port
        ))
        .await,
        "{args:?}: node {to} did not take over\n{}",
        cluster.diagnostics()
    );
    h.extend().await.unwrap();
    assert!(h.is_held());
    stop.store(true, Ordering::Relaxed);
    assert!(contender.await.unwrap() > 0);
    assert!(cluster.nodes[to].keys().contains(&lock));
    let released = std::time::Instant::now();
    assert!(h.release().await.unwrap());
    let got = tokio::time::timeout(LIMIT, waiter)
        .await
        .expect("the waiter was not woken")
        .unwrap()
        .unwrap();
    let woken = released.elapsed();
    assert!(got.release().await.unwrap());
    woken
}

/// `CLUSTER FAILOVER` and then `CLUSTER FAILOVER FORCE` (back) while a
/// lock is held and a waiter queued: the lock is never granted to a second
/// holder, the holder keeps it, and the waiter is woken within the
/// holder's lease (3 s) of the release, not by its once-a-minute poll: a
/// waiter tries again when the lease it learned ends at the latest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_failover_keeps_held_locks_and_wakes_waiters() {
    let (cluster, primary, replica) = failover_cluster();
    let graceful = failover_with_locks(&cluster, primary, replica, false, "graceful").await;
    let forced = failover_with_locks(&cluster, replica, primary, true, "forced").await;
    for woken in [graceful, forced] {
        assert!(
            woken < Duration::from_millis(3500),
            "woken {woken:?} after the release"
        );
    }
}

/// With one primary frozen, acquires on its slots fail while those on the
/// others succeed, one after the other: that is one outage to the logs (an
/// ERROR when it starts, a WARN when the store answers), not an ERROR and
/// a WARN per pair of requests; `Locker::status` still follows the last
/// acquire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_outage_is_not_an_error_line_per_request() {
    // Alone in its process: it counts log lines that other tests of the
    // binary cause too.
    if !tokio::task::block_in_place(|| {
        support::in_own_process(
            module_path!(),
            "a_partial_outage_is_not_an_error_line_per_request",
        )
    }) {
        return;
    }
    let cluster = Cluster::start_with(3, &["--cluster-require-full-coverage", "no"]);
    let (logs, _guard) = Logs::capture();
    // 1 s: the healthy try after a frozen one may wait for a quarter of it
    // (the client's own slot-map read, which asks the frozen node too).
    let (l, frozen, healthy) = frozen_and_healthy(&cluster, Duration::from_secs(1), "flap").await;
    cluster.nodes[2].freeze();
    for round in 0..5 {
        l.try_acquire(&frozen)
            .await
            .expect_err("an acquire on the frozen primary answered");
        assert!(!l.status().store_up, "{round}");
        let g = l.try_acquire(&healthy).await.unwrap();
        assert!(l.status().store_up, "{round}");
        assert!(g.release().await.unwrap());
    }
    cluster.nodes[2].thaw();

    let started = logs.lines_with("acquires fail until it answers again");
    let ended = logs.lines_with("lock store answers again");
    assert_eq!(started.len(), 1, "{}", logs.text());
    assert_eq!(ended.len(), 1, "{}", logs.text());
}

/// A locker on a 3-node cluster that serves the slots it still has, and a
/// key on node 2 (to freeze) and one on node 0, both tried once so that
/// the store has connections to every node.
async fn frozen_and_healthy(
    cluster: &Cluster,
    timeout: Duration,
    tag: &str,
) -> (Locker<RedisStore>, LockKey, LockKey) {
    let l = timed_locker(cluster, timeout, Duration::from_secs(30));
    let key = |id: &str| LockKey::new("cl", id).unwrap();
    let frozen = key(&id_on(cluster, 2, &[], &format!("{tag}-frozen")).0);
    let healthy = key(&id_on(cluster, 0, &[], &format!("{tag}-healthy")).0);
    for k in [&frozen, &healthy] {
        assert!(l.try_acquire(k).await.unwrap().release().await.unwrap());
    }
    (l, frozen, healthy)
}

/// A frozen primary costs the calls on its own slots, not the others': the
/// first grant on a healthy slot right after a frozen node's timeout waits
/// at most two node timeouts (a quarter of the command timeout each: the
/// client's own slot-map read and reconnect, which ask the frozen node),
/// never for a new cluster connection (a seed query, connections and a
/// `CONFIG GET` that each waited on the frozen node: 2-4 node timeouts,
/// 3 or 4 in about half the rounds, before the slot map was read in the
/// background). Six rounds: the old path passed all six about 1 run in 60.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_primary_costs_a_healthy_slot_at_most_two_node_timeouts() {
    let cluster = Cluster::start_with(3, &["--cluster-require-full-coverage", "no"]);
    let timeout = Duration::from_secs(2);
    let (l, frozen, healthy) = frozen_and_healthy(&cluster, timeout, "cost").await;
    cluster.nodes[2].freeze();
    for round in 0..6 {
        l.try_acquire(&frozen)
            .await
            .expect_err("an acquire on the frozen primary answered");
        let started = std::time::Instant::now();
        let g = l.try_acquire(&healthy).await;
        let took = started.elapsed();
        let g = g.unwrap_or_else(|e| panic!("round {round}: the healthy grant failed: {e:?}"));
        // Under three node timeouts (margin for a loaded machine: two
        // took 1.006 s once in CI's six-thread Valkey pass).
        assert!(
            took < timeout * 3 / 4,
            "round {round}: the healthy grant waited {took:?} (command timeout {timeout:?})"
        );
        assert!(g.release().await.unwrap());
    }
    cluster.nodes[2].thaw();
}

/// A request that completes while its slot migrates (its lock on the node
/// the slot leaves, its record not yet written) keeps its record: the
/// finish stores it and releases, and a duplicate gets the record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_completed_while_its_slot_migrates_keeps_its_record() {
    let (cluster, l, k, slot) = migration_case("mig-finish-");
    let ids = cluster.node_ids();
    let g = match l.acquire_or_replay(&k).await.unwrap() {
        Acquired::Locked(g) => g,
        other => panic!("{other:?}"),
    };
    begin_move(&cluster, slot);
    let record = Record::new(http::StatusCode::CREATED).encode();
    let finished = g.finish(record, LIMIT * 6).await;
    assert!(matches!(finished, Ok(true)), "{finished:?}");
    match l.acquire_or_replay(&k).await.unwrap() {
        Acquired::Completed(_) => {}
        other => panic!("the record was lost: {other:?}"),
    }
    // The move ends (every `MIGRATE` finds its names free), and the record
    // is still there.
    let left = keys_in_slot(&cluster, 0, slot);
    if !left.is_empty() {
        migrate(&cluster, 0, 1, &left);
    }
    for node in 0..3 {
        setslot(&cluster, node, slot, &["NODE", &ids[1]]);
    }
    match l.acquire_or_replay(&k).await.unwrap() {
        Acquired::Completed(_) => {}
        other => panic!("the record was lost after the move: {other:?}"),
    }
}

/// A first request whose slot is moving, with no record anywhere, is
/// granted: the grant runs where the slot goes (its lock is nowhere yet),
/// answers that the record may be on the node the slot leaves, the store
/// reads it there, finds none and asks again saying so (acquire.lua's `m`
/// flag), and the second answer grants. Without the flag every answer is
/// the same, and the request fails after three.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_request_whose_slot_is_moving_is_granted() {
    let (cluster, l, k, slot) = migration_case("mig-first-");
    begin_move(&cluster, slot);
    let g = match l.acquire_or_replay(&k).await {
        Ok(Acquired::Locked(g)) => g,
        other => panic!("a first request while its slot moves: {other:?}"),
    };
    // Granted where the slot goes: the lock is on the importing node.
    let lock = redis_name("cl", k.id(), "lock");
    assert_eq!(keys_in_slot(&cluster, 1, slot), vec![lock]);
    assert!(g.release().await.unwrap());
}

/// A duplicate of a request completed before its slot began to move gets
/// the record, not a second run: its lock is nowhere, so its grant runs
/// where the slot goes, which has no record yet; the grant answers that
/// the record may be on the node the slot leaves, and the store reads it
/// there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_whose_record_has_not_moved_yet_gets_it() {
    let (cluster, l, k, slot) = migration_case("mig-dup-");
    let g = match l.acquire_or_replay(&k).await.unwrap() {
        Acquired::Locked(g) => g,
        other => panic!("{other:?}"),
    };
    let record = Record::new(http::StatusCode::CREATED).encode();
    assert!(matches!(g.finish(record, LIMIT * 6).await, Ok(true)));
    let record_name = redis_name("cl", k.id(), "record");
    assert!(keys_in_slot(&cluster, 0, slot).contains(&record_name));
    begin_move(&cluster, slot);
    match l.acquire_or_replay(&k).await {
        Ok(Acquired::Completed(_)) => {}
        other => panic!("a duplicate ran again while its record had not moved: {other:?}"),
    }
    // Nothing was granted where the slot goes.
    assert!(keys_in_slot(&cluster, 1, slot).is_empty());
}

/// A key of namespace `cl` named from `prefix` whose fencing bucket's
/// counter is `fence`: a key of the same slot.
fn same_bucket(fence: &str, prefix: &str) -> LockKey {
    (0..)
        .map(|n| format!("{prefix}{n}"))
        .find(|id| redis_name("cl", id, "fence") == fence)
        .map(|id| LockKey::new("cl", id).unwrap())
        .unwrap()
}

/// Whether `got` is a refusal because the key is held (`what` says which).
fn refused(got: Result<tower_redis_lock::LockGuard, Error>, what: &str) {
    match got {
        Err(e) if e.is_contended() => {}
        Err(e) => panic!("{what}: an error, not a refusal: {e:?}"),
        Ok(_) => panic!("{what}: granted"),
    }
}

/// What the rest of a slot's move does (`MIGRATE`s of every name node 0
/// still has, each finding it free on node 1, then `SETSLOT … NODE`).
fn end_move(cluster: &Cluster, slot: u16) {
    let left = keys_in_slot(cluster, 0, slot);
    if !left.is_empty() {
        migrate(cluster, 0, 1, &left);
    }
    let ids = cluster.node_ids();
    for node in [1, 0, 2] {
        setslot(cluster, node, slot, &["NODE", &ids[1]]);
    }
}

/// A key's reader-writer lock while its slot migrates (`SETSLOT …
/// MIGRATING/IMPORTING`, its names moved by `MIGRATE` one at a time, then
/// `SETSLOT … NODE`), as a lock is above: a key nobody used is read and
/// written where the slot goes; one read or written before the move keeps
/// its holders apart wherever each of its names is (a write refused beside
/// a reader, a read beside a writer), and is written or read again once
/// they are gone; no grant writes a name on the importing node that is
/// still on the other one (every `MIGRATE` succeeds). The grant used to
/// declare its three names (readers, writer, writers waiting): the node
/// the slot leaves answered `TRYAGAIN`, or `ASK` and the importing node
/// `TRYAGAIN`, and no read or write of the slot was granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_and_writes_are_granted_and_kept_apart_while_their_slot_migrates() {
    let cluster = Cluster::start(3);
    let command_timeout = Duration::from_secs(2);
    let lease = Duration::from_secs(30);
    let a = timed_locker(&cluster, command_timeout, lease);
    let b = timed_locker(&cluster, command_timeout, lease);
    let fresh = key_on(&cluster, 0, None, "rw-fresh-");
    let fence = redis_name("cl", fresh.id(), "fence");
    let (read, written) = (
        same_bucket(&fence, "rw-read-"),
        same_bucket(&fence, "rw-written-"),
    );
    let slot = cluster.slot_of(&fence);
    let name = |k: &LockKey, suffix: &str| redis_name("cl", k.id(), suffix);
    let on = |node: usize, n: String| cluster.nodes[node].keys().contains(&n);
    // Held before the move (their names on node 0): a reader of one key,
    // the writer of another.
    let reader = a.rwlock(&read).unwrap().try_read().await.unwrap();
    let writer = a.rwlock(&written).unwrap().try_write().await.unwrap();

    begin_move(&cluster, slot);
    // A key nobody used: read by two, then written, where the slot goes.
    let rw = b.rwlock(&fresh).unwrap();
    let r1 = rw
        .try_read()
        .await
        .unwrap_or_else(|e| panic!("no read in the migrating slot: {e:?}"));
    let r2 = a.rwlock(&fresh).unwrap().try_read().await.unwrap();
    assert!(on(1, name(&fresh, "rw-readers")));
    refused(rw.try_write().await, "a write beside two readers");
    assert!(r1.release().await.unwrap());
    assert!(r2.release().await.unwrap());
    let w = rw
        .try_write()
        .await
        .unwrap_or_else(|e| panic!("no write in the migrating slot: {e:?}"));
    assert!(on(1, name(&fresh, "rw-writer")));
    refused(
        a.rwlock(&fresh).unwrap().try_read().await,
        "a read beside a writer",
    );
    refused(
        a.rwlock(&fresh).unwrap().try_write().await,
        "a second writer",
    );
    assert!(w.release().await.unwrap());

    // Read before the move, its readers on node 0: read again there, not
    // written; written before the move, its writer on node 0: neither.
    let (read_b, written_b) = (b.rwlock(&read).unwrap(), b.rwlock(&written).unwrap());
    let r3 = read_b.try_read().await.unwrap();
    refused(read_b.try_write().await, "a write beside readers on node 0");
    refused(
        written_b.try_read().await,
        "a read beside a writer on node 0",
    );
    refused(
        written_b.try_write().await,
        "a write beside a writer on node 0",
    );
    // The readers move first: read again on node 1, still not written.
    migrate(&cluster, 0, 1, &[name(&read, "rw-readers")]);
    let r4 = read_b.try_read().await.unwrap();
    refused(read_b.try_write().await, "a write beside readers on node 1");
    for g in [reader, r3, r4] {
        assert!(g.release().await.unwrap());
    }
    let w = read_b
        .try_write()
        .await
        .unwrap_or_else(|e| panic!("no write once the readers left: {e:?}"));
    assert!(on(1, name(&read, "rw-writer")));
    refused(
        a.rwlock(&read).unwrap().try_read().await,
        "a read beside a writer on node 1",
    );
    assert!(w.release().await.unwrap());
    // The writer on node 0 released: read where the slot goes.
    assert!(writer.release().await.unwrap());
    let r5 = written_b
        .try_read()
        .await
        .unwrap_or_else(|e| panic!("no read once the writer left: {e:?}"));
    refused(written_b.try_write().await, "a write beside a reader");

    end_move(&cluster, slot);
    refused(
        written_b.try_write().await,
        "a write beside a reader, after the move",
    );
    assert!(r5.release().await.unwrap());
    let w = written_b.try_write().await.unwrap();
    assert!(w.release().await.unwrap());
}

/// A key's semaphore while its slot migrates: a key nobody used grants its
/// permits where the slot goes, one held before the move grants its others
/// on the node that has its permits, before and after they move; never
/// more than its count, and every `MIGRATE` succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_are_granted_and_counted_while_their_slot_migrates() {
    let (cluster, l, fresh, slot) = migration_case("sem-fresh-");
    let other = timed_locker(
        &cluster,
        Duration::from_millis(500),
        Duration::from_secs(30),
    );
    let held = same_bucket(&redis_name("cl", fresh.id(), "fence"), "sem-held-");
    let permits = |k: &LockKey| redis_name("cl", k.id(), "permits");
    let first = l.semaphore(&held, 2).unwrap().try_acquire().await.unwrap();

    begin_move(&cluster, slot);
    let sem = other.semaphore(&fresh, 2).unwrap();
    let p1 = sem
        .try_acquire()
        .await
        .unwrap_or_else(|e| panic!("no permit in the migrating slot: {e:?}"));
    let p2 = sem.try_acquire().await.unwrap();
    refused(sem.try_acquire().await, "a third permit of two");
    assert!(cluster.nodes[1].keys().contains(&permits(&fresh)));
    let sem = other.semaphore(&held, 2).unwrap();
    let second = sem.try_acquire().await.unwrap();
    refused(sem.try_acquire().await, "a third permit of two, on node 0");
    migrate(&cluster, 0, 1, &[permits(&held)]);
    refused(sem.try_acquire().await, "a third permit of two, on node 1");
    assert!(first.release().await.unwrap());
    let third = sem.try_acquire().await.unwrap();
    refused(
        sem.try_acquire().await,
        "a third permit of two, after a release",
    );

    end_move(&cluster, slot);
    for g in [p1, p2, second, third] {
        assert!(g.release().await.unwrap());
    }
}

/// Multi-key locks of one slot while it migrates: granted together where
/// the slot's names are on both nodes (the grant declares one lock, and
/// leaves a migrating slot to the one-by-one path), and released together
/// while their locks are on both nodes (each lock the script does not find
/// where it runs is released alone). The scripts used to declare every
/// lock: the node the slot leaves answered `TRYAGAIN`, or `ASK` and the
/// importing node `TRYAGAIN`, and neither call was served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_key_locks_are_granted_and_released_while_their_slot_migrates() {
    let (cluster, l, k1, slot) = migration_case("all-fresh-");
    let fence = redis_name("cl", k1.id(), "fence");
    let k2 = same_bucket(&fence, "all-fresh-b-");
    let (k3, k4) = (
        same_bucket(&fence, "all-held-"),
        same_bucket(&fence, "all-held-b-"),
    );
    let lock = |k: &LockKey| redis_name("cl", k.id(), "lock");
    let before = l.try_acquire_all(&[k3.clone(), k4.clone()]).await.unwrap();

    begin_move(&cluster, slot);
    let during = l
        .try_acquire_all(&[k1.clone(), k2.clone()])
        .await
        .unwrap_or_else(|e| panic!("no multi-key grant in the migrating slot: {e:?}"));
    assert!(cluster.nodes[1].keys().contains(&lock(&k1)));
    let err = l
        .try_acquire_all(&[k2.clone(), k3.clone()])
        .await
        .unwrap_err();
    assert!(err.is_contended(), "{err:?}");
    // One lock of the first grant moves: its locks are on both nodes.
    migrate(&cluster, 0, 1, &[lock(&k3)]);
    assert!(before.release().await.unwrap());
    assert!(during.release().await.unwrap());
    for k in [&k1, &k2, &k3, &k4] {
        for node in 0..3 {
            assert!(!cluster.nodes[node].keys().contains(&lock(k)), "{k} left");
        }
    }
    let again = l
        .try_acquire_all(&[k3.clone(), k4.clone()])
        .await
        .unwrap_or_else(|e| panic!("no multi-key grant after a release: {e:?}"));
    end_move(&cluster, slot);
    assert!(again.release().await.unwrap());
}

/// An operator's forced release while the lock's slot migrates: of a lock
/// on the node the slot leaves whose bucket's counter moved already, and
/// of a lock granted where the slot goes while the counter is still on
/// the other node. Each is released and answers a fence above the lock's
/// token, and the counter is never written beside itself: the move's
/// `MIGRATE`s succeed. (The first answered an error, the lock deleted;
/// the second wrote the counter where the slot goes, and the `MIGRATE`
/// of the counter failed.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_release_while_its_slot_migrates_answers_a_fence() {
    let (cluster, l, leaving, slot) = migration_case("force-leaving-");
    let fence = redis_name("cl", leaving.id(), "fence");
    let arriving = same_bucket(&fence, "force-arriving-");
    let lock = |k: &LockKey| redis_name("cl", k.id(), "lock");
    let on_0 = l.try_acquire(&leaving).await.unwrap();

    begin_move(&cluster, slot);
    let on_1 = l.try_acquire(&arriving).await.unwrap();
    assert!(cluster.nodes[1].keys().contains(&lock(&arriving)));
    let forced = l.force_release(&arriving, "test").await.unwrap();
    assert!(forced.released, "{forced:?}");
    assert!(forced.fence.unwrap() > on_1.fencing_token().unwrap());
    assert!(
        !cluster.nodes[1].keys().contains(&fence),
        "the counter written where the slot goes"
    );
    migrate(&cluster, 0, 1, std::slice::from_ref(&fence));
    let forced = l.force_release(&leaving, "test").await.unwrap();
    assert!(forced.released, "{forced:?}");
    assert!(forced.fence.unwrap() > on_0.fencing_token().unwrap());
    assert!(!cluster.nodes[0].keys().contains(&lock(&leaving)));
    end_move(&cluster, slot);
}

/// A store on `cluster` that waits, after each grant, for one replica of
/// the lock's primary within `wait`.
fn waiting_store(cluster: &Cluster, wait: Duration, on: ReplicaShortfall) -> RedisStore {
    let urls = cluster.urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    RedisStore::cluster_builder(&urls)
        .command_timeout(wait + Duration::from_secs(2))
        .wait_replicas(1, wait, on)
        .build()
        .unwrap()
}

/// `wait_replicas` on a Cluster: the `WAIT` goes to the primary of the
/// lock's slot, over the connection that wrote the grant. A grant its
/// replica did not get is refused and taken back; one it did get is on
/// the replica when the acquire answers. (A `WAIT` sent to any other node
/// would count writes that connection never made, and pass at once.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_wait_a_grant_is_confirmed_by_its_own_primarys_replica() {
    let (cluster, primary, replica) = failover_cluster();
    let l = Locker::new(waiting_store(
        &cluster,
        Duration::from_millis(300),
        ReplicaShortfall::Fail,
    ));
    let (id, _) = id_on(&cluster, primary, &[], "wait-");
    let k = LockKey::new("cl", &id).unwrap();
    let lock = redis_name("cl", &id, "lock");

    cluster.nodes[replica].freeze();
    let refused = l.try_acquire(&k).await;
    cluster.nodes[replica].thaw();
    match refused {
        Err(Error::Unavailable { source, .. }) => {
            assert!(
                source.to_string().contains("replicas acknowledged"),
                "{source}"
            );
        }
        other => panic!("a grant its replica did not get: {other:?}"),
    }
    assert!(
        !cluster.nodes[primary].keys().contains(&lock),
        "the refused grant was not taken back"
    );

    // Linked again: a grant is on the replica as soon as it is answered.
    let linked = || {
        matches!(support::topology::role(&cluster.nodes[replica]),
            Ok(support::topology::Role::Replica { state, .. }) if state == "connected")
    };
    assert!(support::wait_until(LIMIT, linked));
    let g = eventually_ok(|| l.try_acquire(&k)).await;
    assert!(
        cluster.nodes[replica].keys().contains(&lock),
        "a confirmed grant is not on the replica"
    );
    assert!(g.release().await.unwrap());
}

/// A grant's `WAIT` blocks only the cluster connection of its own: while
/// it waits for a frozen replica, a lock of the same primary is renewed,
/// released and granted at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_wait_a_grant_waiting_for_replicas_holds_up_no_other_command() {
    let (cluster, primary, replica) = failover_cluster();
    let l = Locker::new(waiting_store(
        &cluster,
        Duration::from_secs(8),
        ReplicaShortfall::Proceed,
    ));
    let key = |id: &str| LockKey::new("cl", id).unwrap();
    let (held_id, _) = id_on(&cluster, primary, &[], "held-");
    let (waiting_id, _) = id_on(&cluster, primary, &[], "waiting-");
    let held = l.try_acquire(&key(&held_id)).await.unwrap();
    // The shared connection (grants go over connections of their own).
    held.extend().await.unwrap();

    cluster.nodes[replica].freeze();
    let waiting = {
        let (l, k) = (l.clone(), key(&waiting_id));
        tokio::spawn(async move { l.try_acquire(&k).await })
    };
    let blocked = || {
        cluster.nodes[primary]
            .cmd(&["INFO", "clients"])
            .as_string()
            .unwrap()
            .lines()
            .any(|l| l.trim() == "blocked_clients:1")
    };
    assert!(support::wait_until(LIMIT, blocked));
    // Renewal and release on the store's shared connection, and a grant of
    // another store (this one's would wait for the frozen replica too).
    held.extend().await.unwrap();
    assert!(held.release().await.unwrap());
    let other = timed_locker(&cluster, Duration::from_secs(2), Duration::from_secs(30));
    drop(other.try_acquire(&key(&held_id)).await.unwrap());
    assert!(
        !waiting.is_finished(),
        "the WAIT ended before the other commands answered"
    );
    assert!(blocked());
    waiting.abort();
    cluster.nodes[replica].thaw();
}

/// Tries `f` until it answers `Ok` (a replica relinking may refuse a
/// grant or two meanwhile), within [`LIMIT`].
async fn eventually_ok<T, E: std::fmt::Debug, F: std::future::Future<Output = Result<T, E>>>(
    f: impl Fn() -> F,
) -> T {
    let until = std::time::Instant::now() + LIMIT;
    loop {
        match f().await {
            Ok(v) => return v,
            Err(e) if std::time::Instant::now() > until => panic!("{e:?}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// What a takeover in the middle of grants left (see
/// [`takeover_in_the_middle_of_grants`]).
struct Takeover {
    /// Keys tried, and leases granted.
    tries: u32,
    granted: usize,
    /// Granted leases that are not on the new primary.
    missing: usize,
    /// Holders beyond a key's capacity once another store has taken what
    /// it can of each granted key (their leases all valid).
    over: usize,
}

/// `take` of fresh keys of one slot (its lock, or every permit of its
/// semaphore), one key every 10 ms, while the slot's replica is cut off
/// (frozen, its link killed: every later write is one it misses), then
/// the primary is frozen and the replica takes over (`CLUSTER FAILOVER
/// TAKEOVER`). The store waits for the replica with `wait`, or not at all.
async fn takeover_in_the_middle_of_grants(take: Take, wait: Option<ReplicaShortfall>) -> Takeover {
    let (cluster, primary, replica) = failover_cluster();
    let store = match wait {
        Some(on) => waiting_store(&cluster, Duration::from_millis(300), on),
        None => store(&cluster),
    };
    let l = Locker::builder(store)
        .lease(Duration::from_secs(60))
        .build()
        .unwrap();
    // Keys of the primary's slots (one `CLUSTER KEYSLOT` each): enough for
    // a key every 10 ms until well after the takeover.
    let ranges = cluster.slot_ranges();
    let on_primary = |slot: u16| {
        ranges
            .iter()
            .any(|&(first, last, node)| node == primary && (first..=last).contains(&slot))
    };
    let ids: Vec<String> = (0..)
        .map(|n| format!("takeover-{n}"))
        .filter(|id| on_primary(cluster.slot_of(&redis_name("cl", id, "lock"))))
        .take(600)
        .collect();
    let slot = cluster.slot_of(&redis_name("cl", &ids[0], "lock"));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (tries, grants) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let granter = {
        let (l, ids, stop) = (l.clone(), ids.clone(), stop.clone());
        let (tries, grants) = (tries.clone(), grants.clone());
        tokio::spawn(async move {
            let mut held = Vec::new();
            let mut tick = tokio::time::interval(Duration::from_millis(10));
            for id in ids {
                tick.tick().await;
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let (guards, _) = take.all(&l, &LockKey::new("cl", &id).unwrap()).await;
                grants.fetch_add(guards.len() as u32, Ordering::Relaxed);
                if !guards.is_empty() {
                    held.push((id, guards));
                }
                tries.fetch_add(1, Ordering::Relaxed);
            }
            held
        })
    };
    assert!(support::wait_until(LIMIT, || grants
        .load(Ordering::Relaxed)
        >= 10));
    // The replica cut off: frozen, and the primary's link to it killed.
    cluster.nodes[replica].freeze();
    let unlinked = || {
        let _ = cluster.nodes[primary].try_cmd(&["CLIENT", "KILL", "TYPE", "replica"]);
        cluster.nodes[primary]
            .cmd(&["INFO", "replication"])
            .as_string()
            .unwrap_or_default()
            .lines()
            .any(|l| l.trim() == "connected_slaves:0")
    };
    assert!(support::wait_until(LIMIT, unlinked));
    let cut_at = tries.load(Ordering::Relaxed);
    assert!(support::wait_until(LIMIT, || tries.load(Ordering::Relaxed) >= cut_at + 3));
    cluster.nodes[primary].freeze();
    cluster.nodes[replica].thaw();
    let reply = cluster.nodes[replica].cmd(&["CLUSTER", "FAILOVER", "TAKEOVER"]);
    assert_eq!(reply.as_string().as_deref(), Some("OK"), "{reply:?}");
    let port = cluster.nodes[replica].port();
    assert!(
        eventually(LIMIT, async || owner_named(&cluster, primary, slot, port)).await,
        "no takeover\n{}",
        cluster.diagnostics()
    );
    stop.store(true, Ordering::Relaxed);
    let held = granter.await.unwrap();
    let new_primary = &cluster.nodes[replica];
    let other = timed_locker(&cluster, Duration::from_secs(2), Duration::from_secs(30));
    let (mut missing, mut over) = (0, 0);
    for (id, guards) in &held {
        let name = redis_name("cl", id, take.suffix());
        let there = match take {
            Take::Lock => usize::from(new_primary.keys().contains(&name)),
            Take::Permits(_) => new_primary.cmd(&["ZCARD", &name]).as_int().unwrap() as usize,
        };
        missing += guards.len().saturating_sub(there);
        let (again, refused) = take.all(&other, &LockKey::new("cl", id).unwrap()).await;
        // Every try answered (a refusal for want of a free lease, not an
        // outage, which would count nothing).
        assert!(refused.iter().all(Error::is_contended), "{id}: {refused:?}");
        over += (guards.len() + again.len()).saturating_sub(take.capacity());
    }
    let run = Takeover {
        tries: tries.load(Ordering::Relaxed),
        granted: held.iter().map(|(_, g)| g.len()).sum(),
        missing,
        over,
    };
    eprintln!(
        "{take:?}, wait {wait:?}: {} leases answered of {} keys tried, {} not on the new \
         primary, {} holders beyond capacity",
        run.granted, run.tries, run.missing, run.over
    );
    cluster.nodes[primary].thaw();
    run
}

/// `wait_replicas` across a failover on a Cluster: locks taken on one
/// primary's slots while its replica is cut off, then a takeover (see
/// [`takeover_in_the_middle_of_grants`]). Every grant the store answered
/// is on the new primary, and another store gets none of them: no second
/// holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_wait_a_takeover_in_the_middle_of_grants_gives_no_second_holder() {
    let run = takeover_in_the_middle_of_grants(Take::Lock, Some(ReplicaShortfall::Fail)).await;
    assert!(run.granted >= 10, "{} grants", run.granted);
    assert_eq!(run.missing, 0, "grants answered and not on the new primary");
    assert_eq!(run.over, 0, "second holders");
}

/// The same with every permit of semaphores of 2: each permit answered
/// is on the new primary, and no key has more than 2 holders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_wait_a_takeover_in_the_middle_of_permit_grants_admits_no_more_than_n() {
    let run =
        takeover_in_the_middle_of_grants(Take::Permits(2), Some(ReplicaShortfall::Fail)).await;
    assert!(run.granted >= 10, "{} permits", run.granted);
    assert_eq!(
        run.missing, 0,
        "permits answered and not on the new primary"
    );
    assert_eq!(run.over, 0, "holders beyond 2 per key");
}

/// Without the wait, the permits granted while the replica was cut off
/// are answered, lost in the takeover and granted again: more than 2
/// holders of a key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_wait_a_takeover_in_the_middle_of_permit_grants_admits_more_than_n() {
    let run = takeover_in_the_middle_of_grants(Take::Permits(2), None).await;
    assert!(run.missing > 0, "no permit was lost in the takeover");
    assert!(run.over > 0, "no key had more than 2 holders");
}
