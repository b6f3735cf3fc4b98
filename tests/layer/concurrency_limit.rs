//! The layer as a concurrency limit (`LockLayerBuilder::concurrency_limit`):
//! at most N requests per key at once across instances (two routers on one
//! store stand for two instances), 429 with `Retry-After` and a problem
//! body when no permit frees within the wait, 503 when the store fails, the
//! settings' checks. On the memory store and on one real Redis.

use crate::support;

use support::RedisServer;
use support::http::{Gate, join, post_to, send, spawn_send};

use std::time::Duration;

use axum::Router;
use axum::routing::post;
use http::StatusCode;
use tower_redis_lock::{
    KeyFrom, LockGuard, LockLayer, LockStore, Locker, MemoryStore, OnStoreError, RedisStore,
    RedlockStore,
};

/// Two "instances" of one service: routers over their own lockers on one
/// store, limited to `permits` per tenant, whose handler waits at `gate`.
fn instances<S: LockStore + Clone>(
    store: S,
    permits: u32,
    wait: Duration,
    gate: &Gate,
) -> [Router; 2] {
    [0, 1].map(|_| {
        let locker = Locker::builder(store.clone())
            .lease(Duration::from_secs(10))
            .wait_timeout(wait)
            .build()
            .unwrap();
        let layer = LockLayer::builder(locker, KeyFrom::path_param::<String>("tenant"))
            .namespace("exports")
            .concurrency_limit(permits)
            .build()
            .unwrap();
        let gate = gate.clone();
        Router::new().route(
            "/tenants/{tenant}/export",
            post(move |guard: LockGuard| async move {
                gate.pass().await;
                assert!(guard.is_held());
                "exported"
            })
            .route_layer(layer),
        )
    })
}

async fn at_most_n_per_key_then_429<S: LockStore + Clone>(store: S) {
    let (gate, mut gates) = Gate::new();
    let apps = instances(store, 2, Duration::ZERO, &gate);
    let uri = "/tenants/acme/export";
    let first = spawn_send(&apps[0], post_to(uri));
    let let_first_go = gates.started().await;
    let second = spawn_send(&apps[1], post_to(uri));
    let let_second_go = gates.started().await;

    // A third, on either instance: 429, Retry-After, problem+json.
    for app in &apps {
        let refused = send(app, post_to(uri)).await;
        let problem = refused.problem(StatusCode::TOO_MANY_REQUESTS);
        assert!(refused.retry_after() >= 1, "{refused:?}");
        assert!(
            problem["detail"]
                .as_str()
                .unwrap()
                .contains("too many requests"),
            "{problem}"
        );
    }
    assert!(gates.none_started(), "a third request ran");
    // Another tenant is not limited by this one.
    let other = spawn_send(&apps[0], post_to("/tenants/globex/export"));
    gates.started().await.send(()).unwrap();
    assert_eq!(join(other).await.status, StatusCode::OK);

    let_first_go.send(()).unwrap();
    let a = join(first).await;
    assert_eq!(a.status, StatusCode::OK);
    // A permit is free again: the next request runs.
    let third = spawn_send(&apps[1], post_to(uri));
    gates.started().await.send(()).unwrap();
    let c = join(third).await;
    assert_eq!(c.status, StatusCode::OK);
    let_second_go.send(()).unwrap();
    let b = join(second).await;
    assert_eq!(b.status, StatusCode::OK);
    // Every permit has its own fencing token, rising per key.
    assert!(a.fencing() < b.fencing() && b.fencing() < c.fencing());
}

#[tokio::test]
async fn memory_at_most_n_requests_per_key_then_429() {
    at_most_n_per_key_then_429(MemoryStore::new()).await;
}

#[tokio::test]
async fn redis_at_most_n_requests_per_key_then_429() {
    let server = RedisServer::start();
    at_most_n_per_key_then_429(RedisStore::from_url(&server.url()).unwrap()).await;
    assert!(
        server.keys().iter().all(|k| k.ends_with(":fence")),
        "left behind: {:?}",
        server.keys()
    );
}

/// A request that finds every permit held waits (the locker's wait
/// timeout) and runs as soon as one is released on the other instance.
#[tokio::test]
async fn a_request_waits_for_a_permit_freed_on_another_instance() {
    let server = RedisServer::start();
    let store = RedisStore::from_url(&server.url()).unwrap();
    let (gate, mut gates) = Gate::new();
    let apps = instances(store, 1, Duration::from_secs(5), &gate);
    let uri = "/tenants/acme/export";
    let first = spawn_send(&apps[0], post_to(uri));
    let let_first_go = gates.started().await;
    let waiting = spawn_send(&apps[1], post_to(uri));
    assert!(gates.none_started());
    let_first_go.send(()).unwrap();
    assert_eq!(join(first).await.status, StatusCode::OK);
    gates.started().await.send(()).unwrap();
    assert_eq!(join(waiting).await.status, StatusCode::OK);
}

/// The status is the user's; the Retry-After policy applies as for a lock.
#[tokio::test]
async fn the_refusal_status_is_settable() {
    let store = MemoryStore::new();
    let locker = Locker::new(store);
    let layer = LockLayer::builder(locker, KeyFrom::path_param::<String>("tenant"))
        .concurrency_limit(1)
        .contention_status(StatusCode::SERVICE_UNAVAILABLE)
        .retry_after(tower_redis_lock::RetryAfter::Fixed(Duration::from_secs(7)))
        .build()
        .unwrap();
    let (gate, mut gates) = Gate::new();
    let app = Router::new().route(
        "/t/{tenant}",
        post(move || async move {
            gate.pass().await;
        })
        .route_layer(layer),
    );
    let first = spawn_send(&app, post_to("/t/a"));
    let go = gates.started().await;
    let refused = send(&app, post_to("/t/a")).await;
    refused.problem(StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.retry_after(), 7);
    go.send(()).unwrap();
    join(first).await;
}

/// Store trouble is 503 with Retry-After, as for the lock: never 429,
/// never the handler.
#[tokio::test]
async fn a_store_failure_is_503_not_429() {
    let store = MemoryStore::new();
    let locker = Locker::new(store.clone());
    let layer = LockLayer::builder(locker, KeyFrom::path_param::<String>("tenant"))
        .concurrency_limit(3)
        .build()
        .unwrap();
    let app = Router::new().route(
        "/t/{tenant}",
        post(|| async { unreachable_handler() }).route_layer(layer),
    );
    store.fail_next_calls(1);
    let res = send(&app, post_to("/t/a")).await;
    res.problem(StatusCode::SERVICE_UNAVAILABLE);
    assert!(res.retry_after() >= 1);
}

/// Bad settings are refused by `build`, before any request.
#[test]
fn bad_limits_are_refused_by_build() {
    let layer = |permits: u32| {
        LockLayer::builder(
            Locker::new(MemoryStore::new()),
            KeyFrom::path_param::<String>("tenant"),
        )
        .concurrency_limit(permits)
    };
    for bad in [0, 65_537] {
        let err = layer(bad).build().unwrap_err();
        assert_eq!(err.setting(), "permits", "{bad}");
    }
    let err = layer(4)
        .contention_status(StatusCode::BAD_REQUEST)
        .build()
        .unwrap_err();
    assert_eq!(err.setting(), "contention_status");
    let err = layer(4)
        .namespace("exports")
        .idempotent(tower_redis_lock::Idempotency::new())
        .build()
        .unwrap_err();
    assert_eq!(err.setting(), "concurrency_limit");
    assert!(layer(4).build().is_ok());
}

/// Redlock has no semaphore: the layer is refused when it is built (a
/// `ConfigError` naming permits), never per request; nothing written.
#[tokio::test]
async fn over_redlock_the_layer_is_refused_when_built() {
    let servers = support::topology::start_independent(3);
    let store = support::stores::redlock_over(&servers, Duration::from_millis(500));
    let _: &RedlockStore = &store;
    let built = LockLayer::builder(Locker::new(store), KeyFrom::path_param::<String>("tenant"))
        .concurrency_limit(2)
        .on_store_error(OnStoreError::FailOpen)
        .build();
    let e = built.expect_err("a concurrency limit over Redlock was built");
    assert_eq!(e.setting(), "permits");
    assert!(e.to_string().contains("semaphores"), "{e}");
    for s in &servers {
        assert_eq!(s.dbsize(), 0);
    }
}

/// A handler that must not run.
fn unreachable_handler() -> &'static str {
    panic!("ran without a permit")
}
