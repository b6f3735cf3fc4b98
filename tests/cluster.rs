//! The Redis store on a real three-primary Redis Cluster.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use support::topology::Cluster;
use tower_redis_lock::{LockKey, Locker, RedisStore};

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
                last = last.max(g.fencing_token().get());
                assert!(g.release().await.unwrap());
            }
            last
        }));
    }
    for t in tasks {
        assert!(t.await.unwrap() > 0);
    }
    // Every node took part, and nothing is left but fencing counters.
    for (i, node) in cluster.nodes.iter().enumerate() {
        assert!(node.command_calls("evalsha") > 0, "node {i} saw no lock");
    }
    let keys = cluster.keys_total();
    assert!(keys.iter().all(|k| k.ends_with(":fence")), "{keys:?}");
    assert_eq!(keys.len(), 2000);
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
    let l = locker(&cluster, 600, 0);
    // Locks whose slots are among the first ones node 0 owns: a reshard of
    // 200 slots from node 0 moves them.
    let (first, _, _) = cluster
        .slot_ranges()
        .into_iter()
        .filter(|&(_, _, node)| node == 0)
        .min()
        .unwrap();
    let mut ids = Vec::new();
    let mut i = 0;
    while ids.len() < 5 {
        let id = format!("mig-{i}");
        let slot = cluster.slot_of(&format!("{{cl:{id}}}"));
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
        let slot = cluster.slot_of(&format!("{{cl:{id}}}"));
        assert_eq!(cluster.node_for_slot(slot), 1, "{id} did not move");
    }
    // Hold across at least two renewals of every lock on its new node.
    let before = cluster.nodes[1].command_calls("evalsha");
    let want = before + 2 * ids.len() as u64;
    assert!(support::wait_until(Duration::from_secs(10), || {
        cluster.nodes[1].command_calls("evalsha") >= want
    }));
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
