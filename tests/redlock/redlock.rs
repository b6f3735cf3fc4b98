//! Redlock over five independent `redis-server` processes: a minority
//! frozen keeps working, a majority frozen fails closed.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::{Request, StatusCode};
use support::{RedisServer, stores};
use tower::ServiceExt;
use tower_redis_lock::{Error, KeyFrom, LockKey, LockLayer, Locker, RedlockStore};

fn servers(n: usize) -> Vec<RedisServer> {
    let handles: Vec<_> = (0..n)
        .map(|_| std::thread::spawn(RedisServer::start))
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

/// A short command timeout, so that frozen nodes cost little; 100 ms was
/// too short once for three thawed nodes to answer on a loaded machine
/// (CI's six-thread Valkey pass beside other builds).
fn redlock(servers: &[RedisServer]) -> RedlockStore {
    stores::redlock_over(servers, Duration::from_millis(400))
}

/// Many tasks on one key; counts overlaps of the critical section.
async fn contend(locker: &Locker<RedlockStore>, tasks: usize, rounds: usize) -> (u32, u32) {
    let key = LockKey::new("redlock", "shared").unwrap();
    let inside = Arc::new(AtomicU32::new(0));
    let overlaps = Arc::new(AtomicU32::new(0));
    let grants = Arc::new(AtomicU32::new(0));
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let (l, k) = (locker.clone(), key.clone());
        let (inside, overlaps, grants) = (inside.clone(), overlaps.clone(), grants.clone());
        handles.push(tokio::spawn(async move {
            for _ in 0..rounds {
                let g = l.acquire(&k).await.unwrap();
                if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                tokio::task::yield_now().await;
                inside.fetch_sub(1, Ordering::SeqCst);
                grants.fetch_add(1, Ordering::SeqCst);
                g.release().await.unwrap();
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    (
        overlaps.load(Ordering::SeqCst),
        grants.load(Ordering::SeqCst),
    )
}

fn locker(store: RedlockStore) -> Locker<RedlockStore> {
    Locker::builder(store)
        .lease(Duration::from_secs(10))
        .wait_timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_hold_with_two_of_five_nodes_frozen() {
    let nodes = servers(5);
    let l = locker(redlock(&nodes));
    let (overlaps, grants) = contend(&l, 4, 50).await;
    assert_eq!((overlaps, grants), (0, 200));

    nodes[0].freeze();
    nodes[3].freeze();
    let (overlaps, grants) = contend(&l, 4, 10).await;
    nodes[0].thaw();
    nodes[3].thaw();
    assert_eq!((overlaps, grants), (0, 40));
}

#[tokio::test]
async fn tokens_keep_increasing_when_the_majority_changes() {
    let nodes = servers(5);
    let l = locker(redlock(&nodes));
    let key = LockKey::new("redlock", "tokens").unwrap();
    let mut last = 0;
    // Rotate which two nodes are frozen: every grant sees another majority.
    for round in 0..5 {
        let (a, b) = (round % 5, (round + 2) % 5);
        nodes[a].freeze();
        nodes[b].freeze();
        let g = l.acquire(&key).await;
        nodes[a].thaw();
        nodes[b].thaw();
        let g = g.unwrap();
        assert!(g.fencing_token().unwrap().get() > last, "round {round}");
        last = g.fencing_token().unwrap().get();
        g.release().await.unwrap();
    }
}

#[tokio::test]
async fn three_of_five_frozen_fails_closed() {
    let nodes = servers(5);
    let store = redlock(&nodes);
    let l = locker(store.clone());
    for n in &nodes[..3] {
        n.freeze();
    }
    let res = l
        .try_acquire(&LockKey::new("redlock", "down").unwrap())
        .await;
    assert!(matches!(res, Err(Error::Unavailable { .. })), "{res:?}");

    // Through the layer: 503, and the handler never runs.
    let ran = Arc::new(AtomicU32::new(0));
    let ran2 = ran.clone();
    let app = Router::new()
        .route(
            "/jobs/{id}",
            post(move || async move {
                ran2.fetch_add(1, Ordering::SeqCst);
                "ran"
            }),
        )
        .layer(LockLayer::new(
            Locker::new(store),
            KeyFrom::path_param::<String>("id"),
        ));
    let res = app
        .oneshot(Request::post("/jobs/1").body(Body::empty()).unwrap())
        .await
        .unwrap();
    for n in &nodes[..3] {
        n.thaw();
    }
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(res.headers().contains_key("retry-after"));
    assert_eq!(ran.load(Ordering::SeqCst), 0);
    // No lock key is left on the nodes that answered.
    for n in &nodes[3..] {
        assert!(
            n.keys().iter().all(|k| !k.ends_with(":lock")),
            "{:?}",
            n.keys()
        );
    }
}
