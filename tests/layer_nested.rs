//! Nested lock layers on the same key re-enter instead of deadlocking.

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::{Request, StatusCode};
use tower::ServiceExt;
use tower_redis_lock::{FencingToken, KeyFrom, LockGuard, LockLayer, Locker, MemoryStore};

async fn token(guard: LockGuard, fencing: FencingToken) -> String {
    assert_eq!(guard.fencing_token().unwrap(), fencing);
    guard.fencing_token().unwrap().to_string()
}

fn layer(store: &MemoryStore, wait: Duration) -> LockLayer<MemoryStore> {
    let locker = Locker::builder(store.clone())
        .wait_timeout(wait)
        .build()
        .unwrap();
    LockLayer::builder(locker, KeyFrom::path_param::<String>("id"))
        .namespace("orders")
        .build()
        .unwrap()
}

#[tokio::test]
async fn an_inner_layer_on_the_same_key_runs_under_the_outer_lock() {
    let store = MemoryStore::new();
    // The inner layer would wait 5 s for a lock held by the outer one if it
    // did not re-enter; with try-lock it would answer 409.
    let app = Router::new()
        .route("/orders/{id}", post(token))
        .layer(layer(&store, Duration::ZERO))
        .layer(layer(&store, Duration::ZERO));
    let res = app
        .clone()
        .oneshot(Request::post("/orders/7").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let header = res.headers()["fencing-token"].to_str().unwrap().to_owned();
    let body = axum::body::to_bytes(res.into_body(), 1024).await.unwrap();
    assert_eq!(header.as_bytes(), &body[..], "one token for both layers");
    // Released once, by the outer layer.
    assert_eq!(store.held_count(), 0);
    let again = app
        .oneshot(Request::post("/orders/7").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(again.status(), StatusCode::OK);
}

#[tokio::test]
async fn layers_on_different_namespaces_still_lock_separately() {
    let store = MemoryStore::new();
    let other = LockLayer::builder(
        Locker::new(store.clone()),
        KeyFrom::path_param::<String>("id"),
    )
    .namespace("invoices")
    .build()
    .unwrap();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(0usize));
    let seen2 = seen.clone();
    let app = Router::new()
        .route(
            "/orders/{id}",
            post(move |guard: LockGuard| async move {
                *seen2.lock().unwrap() = 2;
                guard.key().to_string()
            }),
        )
        .layer(other)
        .layer(layer(&store, Duration::ZERO));
    let probe = store.clone();
    let res = app
        .oneshot(Request::post("/orders/9").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let body = axum::body::to_bytes(res.into_body(), 1024).await.unwrap();
    // The handler sees the innermost guard.
    assert_eq!(&body[..], b"invoices:9");
    assert_eq!(*seen.lock().unwrap(), 2);
    assert_eq!(probe.held_count(), 0);
}

#[tokio::test]
async fn a_router_wide_layer_refuses_unmatched_paths_instead_of_passing_them() {
    let store = MemoryStore::new();
    let app = Router::new()
        .route("/orders/{id}", post(token))
        .layer(layer(&store, Duration::ZERO));
    // No route, no path parameter: the missing-key answer (the layer cannot
    // tell the router's fallback from a router it wraps whole).
    let res = app
        .clone()
        .oneshot(Request::get("/nope").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    // A matched route still needs its key and is locked.
    let res = app
        .oneshot(Request::post("/orders/1").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert!(res.headers().contains_key("fencing-token"));
}

#[tokio::test]
async fn route_layer_on_the_method_router_leaves_405_unlocked() {
    let store = MemoryStore::new();
    let app = Router::new().route(
        "/orders/{id}",
        post(token).route_layer(layer(&store, Duration::ZERO)),
    );
    let res = app
        .oneshot(Request::get("/orders/1").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert!(!res.headers().contains_key("fencing-token"));
}

#[tokio::test]
async fn nested_layers_count_their_holds_and_the_last_one_releases() {
    let store = MemoryStore::new();
    let probe = store.clone();
    let app = Router::new()
        .route(
            "/orders/{id}",
            post(move |guard: LockGuard| async move {
                // Two layers, two holds of one grant; the lock is still there.
                assert_eq!(probe.held_count(), 1);
                guard.hold_count().to_string()
            }),
        )
        .layer(layer(&store, Duration::ZERO))
        .layer(layer(&store, Duration::ZERO))
        .layer(layer(&store, Duration::ZERO));
    let res = app
        .oneshot(Request::post("/orders/3").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let body = axum::body::to_bytes(res.into_body(), 1024).await.unwrap();
    assert_eq!(&body[..], b"3");
    assert_eq!(store.held_count(), 0);
}

/// A middleware between the layers runs the rest of the request on a task of
/// its own (as `tower::buffer` or a spawning service does): the task-local
/// scope of the outer lock is not there, only the request's extensions.
#[derive(Clone)]
struct Spawned<S>(S);

impl<S> tower::Service<Request<Body>> for Spawned<S>
where
    S: tower::Service<Request<Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let mut inner = self.0.clone();
        Box::pin(async move {
            tokio::spawn(async move { inner.call(req).await })
                .await
                .expect("the spawned request panicked")
        })
    }
}

#[tokio::test]
async fn an_inner_layer_reached_on_another_task_still_re_enters() {
    let store = MemoryStore::new();
    let app = Router::new()
        .route("/orders/{id}", post(token))
        .layer(layer(&store, Duration::ZERO))
        .layer(tower::layer::layer_fn(Spawned))
        .layer(layer(&store, Duration::ZERO));
    let res = app
        .oneshot(Request::post("/orders/9").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(
        res.status(),
        StatusCode::OK,
        "the inner layer waited for its own lock"
    );
    let header = res.headers()["fencing-token"].to_str().unwrap().to_owned();
    let body = axum::body::to_bytes(res.into_body(), 1024).await.unwrap();
    assert_eq!(header.as_bytes(), &body[..], "one token for both layers");
    assert_eq!(store.held_count(), 0);
}
