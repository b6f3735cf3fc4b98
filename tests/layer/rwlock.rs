//! The layer as a reader-writer lock (`LockLayerBuilder::read_write`):
//! safe methods share the key, the others take it alone, a waiting write
//! stops new reads, across instances (two routers on one store stand for
//! two instances); 409 with `Retry-After` and a problem body on
//! contention, 503 when the store fails, the settings' checks. On the
//! memory store and on one real Redis.

use crate::support;

use support::RedisServer;
use support::http::{Gate, join, send, spawn_send};

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::{Method, Request, StatusCode};
use tower_redis_lock::{
    KeyFrom, LockGuard, LockLayer, LockLayerBuilder, LockStore, Locker, MemoryStore, RedisStore,
    RwMode,
};

fn request(method: Method, uri: &str) -> Request<Body> {
    Request::builder()
        .method(method)
        .uri(uri)
        .body(Body::empty())
        .unwrap()
}

/// The methods whose handlers started, in order.
type Started = Arc<Mutex<Vec<Method>>>;

/// Two "instances" of one document service: routers over their own lockers
/// on one store, GET, HEAD and PUT, POST and DELETE on `/docs/{doc}`,
/// whose handlers wait at `gate`; `mode` sets the layer up.
fn instances<S: LockStore + Clone>(
    store: S,
    wait: Duration,
    gate: &Gate,
    mode: impl Fn(LockLayerBuilder<S>) -> LockLayerBuilder<S>,
) -> ([Router; 2], [Locker<S>; 2], Started) {
    let started = Started::default();
    let lockers = [0, 1].map(|_| {
        Locker::builder(store.clone())
            .lease(Duration::from_secs(10))
            .wait_timeout(wait)
            .build()
            .unwrap()
    });
    let apps = [0, 1].map(|i| {
        let layer = mode(
            LockLayer::builder(lockers[i].clone(), KeyFrom::path_param::<String>("doc"))
                .namespace("docs"),
        )
        .build()
        .unwrap();
        let (gate, started) = (gate.clone(), started.clone());
        let handler = move |method: Method, guard: LockGuard| async move {
            started.lock().unwrap().push(method);
            gate.pass().await;
            assert!(guard.is_held());
            "done"
        };
        Router::new().route(
            "/docs/{doc}",
            get(handler.clone())
                .options(handler.clone())
                .put(handler.clone())
                .post(handler.clone())
                .delete(handler)
                .route_layer(layer),
        )
    });
    (apps, lockers, started)
}

async fn reads_share_writes_are_alone<S: LockStore + Clone>(store: S) {
    let (gate, mut gates) = Gate::new();
    let (apps, _, _) = instances(store, Duration::ZERO, &gate, |b| b.read_write());
    let uri = "/docs/readme";
    // Three reads (the safe methods), over both instances, at once.
    let r1 = spawn_send(&apps[0], request(Method::GET, uri));
    let go1 = gates.started().await;
    let r2 = spawn_send(&apps[1], request(Method::HEAD, uri));
    let go2 = gates.started().await;
    let r3 = spawn_send(&apps[1], request(Method::OPTIONS, uri));
    let go3 = gates.started().await;
    // A write is refused while they read: 409, Retry-After, problem+json.
    for method in [Method::PUT, Method::POST, Method::DELETE] {
        let refused = send(&apps[1], request(method.clone(), uri)).await;
        refused.problem(StatusCode::CONFLICT);
        assert!(refused.retry_after() >= 1, "{method}: {refused:?}");
    }
    assert!(gates.none_started(), "a write ran beside reads");
    for go in [go1, go2, go3] {
        go.send(()).unwrap();
    }
    let (a, b) = (join(r1).await, join(r2).await);
    assert_eq!((a.status, b.status), (StatusCode::OK, StatusCode::OK));
    assert_eq!(join(r3).await.status, StatusCode::OK);

    // A write alone; reads refused meanwhile.
    let w = spawn_send(&apps[0], request(Method::PUT, uri));
    let go = gates.started().await;
    for app in &apps {
        send(app, request(Method::GET, uri))
            .await
            .problem(StatusCode::CONFLICT);
    }
    // Another document is not locked by this one.
    let other = spawn_send(&apps[1], request(Method::GET, "/docs/other"));
    gates.started().await.send(()).unwrap();
    assert_eq!(join(other).await.status, StatusCode::OK);
    go.send(()).unwrap();
    let w = join(w).await;
    assert_eq!(w.status, StatusCode::OK);
    // The write minted a token above the reads'; a later read carries it.
    assert!(w.fencing() > a.fencing().max(b.fencing()));
    let r = spawn_send(&apps[1], request(Method::GET, uri));
    gates.started().await.send(()).unwrap();
    let r = join(r).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(
        r.fencing() >= w.fencing(),
        "read {} after write {}",
        r.fencing(),
        w.fencing()
    );
}

#[tokio::test]
async fn memory_reads_share_and_writes_are_alone() {
    reads_share_writes_are_alone(MemoryStore::new()).await;
}

#[tokio::test]
async fn redis_reads_share_and_writes_are_alone() {
    let server = RedisServer::start();
    reads_share_writes_are_alone(RedisStore::from_url(&server.url()).unwrap()).await;
    assert_eq!(server.keys_besides_counters(), Vec::<String>::new());
}

/// A write that waits on one instance stops a read that arrives on the
/// other: when the first read ends, the write runs before it.
#[tokio::test]
async fn a_waiting_write_goes_before_a_later_read_on_another_instance() {
    let server = RedisServer::start();
    let store = RedisStore::from_url(&server.url()).unwrap();
    let (gate, mut gates) = Gate::new();
    let (apps, lockers, started) =
        instances(store, Duration::from_secs(10), &gate, |b| b.read_write());
    let uri = "/docs/readme";
    let key = tower_redis_lock::LockKey::new("docs", "readme").unwrap();
    let first = spawn_send(&apps[0], request(Method::GET, uri));
    let let_first_go = gates.started().await;
    let write = spawn_send(&apps[1], request(Method::PUT, uri));
    assert!(
        support::eventually(Duration::from_secs(5), async || lockers[1]
            .has_waiters(&key))
        .await
    );
    let later = spawn_send(&apps[0], request(Method::GET, uri));
    assert!(
        support::eventually(Duration::from_secs(5), async || lockers[0]
            .has_waiters(&key))
        .await
    );
    assert!(gates.none_started(), "a request ran beside the first read");
    let_first_go.send(()).unwrap();
    assert_eq!(join(first).await.status, StatusCode::OK);
    gates.started().await.send(()).unwrap();
    assert_eq!(join(write).await.status, StatusCode::OK);
    gates.started().await.send(()).unwrap();
    assert_eq!(join(later).await.status, StatusCode::OK);
    assert_eq!(
        *started.lock().unwrap(),
        [Method::GET, Method::PUT, Method::GET],
        "the later read went before the waiting write"
    );
}

/// The user's map: here POST (a query) is shared.
#[tokio::test]
async fn the_user_maps_methods_to_sides() {
    let (gate, mut gates) = Gate::new();
    let (apps, _, _) = instances(MemoryStore::new(), Duration::ZERO, &gate, |b| {
        b.read_write_by(|m: &Method| {
            if m == Method::GET || m == Method::POST {
                RwMode::Read
            } else {
                RwMode::Write
            }
        })
    });
    let uri = "/docs/readme";
    let a = spawn_send(&apps[0], request(Method::POST, uri));
    let go_a = gates.started().await;
    let b = spawn_send(&apps[1], request(Method::POST, uri));
    let go_b = gates.started().await;
    send(&apps[0], request(Method::DELETE, uri))
        .await
        .problem(StatusCode::CONFLICT);
    go_a.send(()).unwrap();
    go_b.send(()).unwrap();
    assert_eq!(join(a).await.status, StatusCode::OK);
    assert_eq!(join(b).await.status, StatusCode::OK);
}

/// The contention status is the user's (409 or 423); store trouble is 503
/// with Retry-After, as for the lock, and the handler does not run.
#[tokio::test]
async fn the_status_is_settable_and_a_store_failure_is_503() {
    let store = MemoryStore::new();
    let (gate, mut gates) = Gate::new();
    let (apps, _, _) = instances(store.clone(), Duration::ZERO, &gate, |b| {
        b.read_write().contention_status(StatusCode::LOCKED)
    });
    let w = spawn_send(&apps[0], request(Method::PUT, "/docs/a"));
    let go = gates.started().await;
    send(&apps[1], request(Method::GET, "/docs/a"))
        .await
        .problem(StatusCode::LOCKED);
    go.send(()).unwrap();
    join(w).await;
    store.fail_next_calls(1);
    let res = send(&apps[1], request(Method::GET, "/docs/a")).await;
    res.problem(StatusCode::SERVICE_UNAVAILABLE);
    assert!(res.retry_after() >= 1);
    assert!(gates.none_started());
}

/// Bad settings are refused by `build`, before any request.
#[test]
fn bad_settings_are_refused_by_build() {
    let layer = || {
        LockLayer::builder(
            Locker::new(MemoryStore::new()),
            KeyFrom::path_param::<String>("doc"),
        )
        .namespace("docs")
        .read_write()
    };
    let err = layer().concurrency_limit(3).build().unwrap_err();
    assert_eq!(err.setting(), "read_write");
    let err = layer()
        .idempotent(tower_redis_lock::Idempotency::new())
        .build()
        .unwrap_err();
    assert_eq!(err.setting(), "read_write");
    let err = layer()
        .contention_status(StatusCode::TOO_MANY_REQUESTS)
        .build()
        .unwrap_err();
    assert_eq!(err.setting(), "contention_status");
    assert!(layer().build().is_ok());
}

/// Two reader-writer layers on one key (a layer inside a layer): a read
/// inside a write re-enters the write (one token, one release); a write
/// inside a read is refused at once as misconfigured (500), never a wait
/// for itself, and leaves nothing held.
#[tokio::test]
async fn nested_layers_reenter_down_and_refuse_an_upgrade() {
    let store = MemoryStore::new();
    let locker = Locker::builder(store.clone())
        .wait_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let layer = |mode: RwMode| {
        LockLayer::builder(locker.clone(), KeyFrom::path_param::<String>("doc"))
            .namespace("docs")
            .read_write_by(move |_: &Method| mode)
            .build()
            .unwrap()
    };
    let route = |outer: RwMode, inner: RwMode| {
        Router::new()
            .route(
                "/docs/{doc}",
                get(|guard: LockGuard| async move {
                    guard.fencing_token().unwrap().get().to_string()
                }),
            )
            .layer(layer(inner))
            .layer(layer(outer))
    };
    let read_in_write = send(
        &route(RwMode::Write, RwMode::Read),
        request(Method::GET, "/docs/a"),
    )
    .await;
    assert_eq!(read_in_write.status, StatusCode::OK, "{read_in_write:?}");
    assert_eq!(read_in_write.text(), read_in_write.fencing().to_string());
    assert_eq!(
        store.rw_held(&tower_redis_lock::LockKey::new("docs", "a").unwrap()),
        (0, false, 0)
    );

    let started = std::time::Instant::now();
    let upgrade = send(
        &route(RwMode::Read, RwMode::Write),
        request(Method::GET, "/docs/a"),
    )
    .await;
    upgrade.problem(StatusCode::INTERNAL_SERVER_ERROR);
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "it waited for itself"
    );
    assert_eq!(
        store.rw_held(&tower_redis_lock::LockKey::new("docs", "a").unwrap()),
        (0, false, 0)
    );
}
