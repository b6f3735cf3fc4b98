//! One lease's renewal failure never affects another lease:
//! the stores answer each renewal of a batch on its own, and the watchdog
//! applies each answer to its own lease.

use crate::support;

use std::time::Duration;

use support::RedisServer;
use support::topology::Cluster;
use tower_redis_lock::{
    LockGuard, LockKey, LockStore, LockStoreExt, Locker, OwnerToken, RedisStore, Renewal,
};

/// Renewed every 300 ms: a renewal late by 300 ms on a loaded machine (CI
/// runs two test passes at once) does not end a healthy lock.
const LEASE: Duration = Duration::from_millis(900);

fn locker(store: RedisStore) -> Locker<RedisStore> {
    Locker::builder(store)
        .lease(LEASE)
        .wait_timeout(Duration::ZERO)
        .build()
        .unwrap()
}

/// Watches `healthy` for `span`, asserting at every step that each is held;
/// panics with the key of the first one that is not.
async fn stay_held(healthy: &[LockGuard], span: Duration) {
    let until = tokio::time::Instant::now() + span;
    while tokio::time::Instant::now() < until {
        for g in healthy {
            assert!(g.is_held(), "the healthy lock {} was lost", g.key());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Another acquirer is refused every healthy key.
async fn refused(other: &Locker<RedisStore>, healthy: &[LockGuard]) {
    for g in healthy {
        match other.try_acquire(g.key()).await {
            Err(e) if e.is_contended() => {}
            Err(e) => panic!("{}: {e}", g.key()),
            Ok(_) => panic!("{} was granted to a second holder", g.key()),
        }
    }
}

/// Three primaries, two locks on each; one primary frozen. Its locks are
/// reported lost at their deadline; the locks on the other two stay held,
/// renewed, for several leases, and nobody else can take them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_cluster_primary_loses_only_its_own_locks() {
    // Without full coverage the other primaries keep serving their slots
    // once the frozen one is marked failed.
    let cluster = Cluster::start_with(3, &["--cluster-require-full-coverage", "no"]);
    let urls = cluster.urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let store = RedisStore::cluster_builder(&urls)
        .command_timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let l = locker(store.clone());

    let mut per_node: Vec<Vec<LockKey>> = vec![Vec::new(); 3];
    for i in 0.. {
        if per_node.iter().all(|keys| keys.len() >= 2) {
            break;
        }
        let k = LockKey::new("isolation", format!("k{i}")).unwrap();
        let node = cluster.node_for_slot(cluster.slot_of(&store.lock_key(&k)));
        if per_node[node].len() < 2 {
            per_node[node].push(k);
        }
    }
    // Taken together, so their renewals share batches.
    let mut guards: Vec<(usize, LockGuard)> = Vec::new();
    for (node, keys) in per_node.iter().enumerate() {
        for k in keys {
            guards.push((node, l.try_acquire(k).await.unwrap()));
        }
    }

    let frozen = 1;
    cluster.nodes[frozen].freeze();
    let (doomed, healthy): (Vec<_>, Vec<_>) = guards.into_iter().partition(|(n, _)| *n == frozen);
    let healthy: Vec<LockGuard> = healthy.into_iter().map(|(_, g)| g).collect();

    for (_, g) in &doomed {
        tokio::time::timeout(LEASE * 4, g.lost())
            .await
            .unwrap_or_else(|_| panic!("{} on the frozen node was never reported lost", g.key()));
        assert!(!g.is_held());
    }
    stay_held(&healthy, LEASE * 4).await;
    refused(&locker(store.clone()), &healthy).await;
    cluster.nodes[frozen].thaw();
    for g in healthy {
        assert!(g.release().await.unwrap());
    }
}

/// One primary; one lock's key is overwritten with a hash, so its renewal
/// is a server error (WRONGTYPE) in the middle of the pipelined batch: that
/// lease alone is affected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_type_key_fails_only_its_own_renewal() {
    let server = RedisServer::start();
    let store = RedisStore::from_url(&server.url()).unwrap();
    let l = locker(store.clone());
    let keys: Vec<LockKey> = (0..5)
        .map(|i| LockKey::new("isolation", format!("one-{i}")).unwrap())
        .collect();
    let mut guards = Vec::new();
    for k in &keys {
        guards.push(l.try_acquire(k).await.unwrap());
    }
    let broken = guards.remove(2);
    let lock_key = store.lock_key(broken.key());
    server.cmd(&["DEL", &lock_key]);
    server.cmd(&["HSET", &lock_key, "field", "value"]);

    tokio::time::timeout(LEASE * 4, broken.lost())
        .await
        .expect("the lock whose key was overwritten was never reported lost");
    stay_held(&guards, LEASE * 4).await;
    refused(&locker(store.clone()), &guards).await;
    for g in guards {
        assert!(g.release().await.unwrap());
    }
}

/// The store answers a batch per renewal: the wrong-type key's renewal is
/// an error, the others are extended or refused on their own merits.
#[tokio::test]
async fn extend_many_answers_each_renewal_on_its_own() {
    let server = RedisServer::start();
    let store = RedisStore::from_url(&server.url()).unwrap();
    let (a, b) = (OwnerToken::generate(), OwnerToken::generate());
    let keys: Vec<LockKey> = (0..3)
        .map(|i| LockKey::new("isolation", format!("many-{i}")).unwrap())
        .collect();
    for k in &keys {
        store.acquire(k, &a, Duration::from_secs(10)).await.unwrap();
    }
    server.cmd(&["DEL", &store.lock_key(&keys[1])]);
    server.cmd(&["HSET", &store.lock_key(&keys[1]), "f", "v"]);
    let renewal = |k: &LockKey, owner: &OwnerToken| Renewal {
        key: k.clone(),
        owner: owner.clone(),
        lease: Duration::from_secs(20),
        kind: tower_redis_lock::LeaseKind::Lock,
    };
    let answers = store
        .renew_many(&[
            renewal(&keys[0], &a),
            renewal(&keys[1], &a),
            renewal(&keys[2], &b),
            renewal(&keys[2], &a),
        ])
        .await;
    assert_eq!(answers.len(), 4);
    assert!(matches!(answers[0], Ok(true)), "{:?}", answers[0]);
    let err = answers[1].as_ref().unwrap_err();
    assert!(err.is_store_failure(), "{err}");
    assert_eq!(err.key(), Some(&keys[1]));
    assert!(matches!(answers[2], Ok(false)), "{:?}", answers[2]);
    assert!(matches!(answers[3], Ok(true)), "{:?}", answers[3]);
    let pttl = server.cmd(&["PTTL", &store.lock_key(&keys[2])]).as_int();
    assert!(pttl.unwrap() > 10_000, "{pttl:?}");
}

/// A connection that fails takes every renewal of the batch with it: one
/// error per renewal, each naming its own key.
#[tokio::test]
async fn a_dead_connection_fails_every_renewal_of_the_batch() {
    let mut server = RedisServer::start();
    let store = RedisStore::builder(&server.url())
        .command_timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let a = OwnerToken::generate();
    let keys: Vec<LockKey> = (0..3)
        .map(|i| LockKey::new("isolation", format!("dead-{i}")).unwrap())
        .collect();
    for k in &keys {
        store.acquire(k, &a, Duration::from_secs(10)).await.unwrap();
    }
    server.stop();
    let renewals: Vec<Renewal> = keys
        .iter()
        .map(|k| Renewal {
            key: k.clone(),
            owner: a.clone(),
            lease: Duration::from_secs(10),
            kind: tower_redis_lock::LeaseKind::Lock,
        })
        .collect();
    let answers = store.renew_many(&renewals).await;
    assert_eq!(answers.len(), 3);
    for (answer, k) in answers.iter().zip(&keys) {
        let err = answer.as_ref().unwrap_err();
        assert!(err.is_store_failure(), "{err}");
        assert_eq!(err.key(), Some(k));
    }
}
