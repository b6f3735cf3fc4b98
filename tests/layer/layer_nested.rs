//! Nested lock layers on the same key re-enter instead of deadlocking.

use crate::support;

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::{Request, StatusCode};
use tower::ServiceExt;
use tower_redis_lock::{
    FencingToken, KeyFrom, LockGuard, LockLayer, Locker, MemoryStore, MultiLockLayer,
};

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

/// A lock layer inside a multi-key layer, one of whose keys it locks,
/// reached on a task of its own: the request's `MultiGuard` is the scope it
/// re-enters that key's lease in (as an enclosing lock's guard is), though
/// it would wait 2 s (and answered 409 after them). Its handler sees that
/// key's guard and token; the answer carries the multi-key layer's tokens,
/// once each, in key order.
#[tokio::test]
async fn a_lock_layer_inside_a_multi_key_layer_reached_on_another_task_re_enters() {
    let store = MemoryStore::new();
    let multi = MultiLockLayer::builder(
        Locker::new(store.clone()),
        [
            KeyFrom::path_param::<String>("id"),
            KeyFrom::path_param::<String>("other"),
        ],
    )
    .namespace("orders")
    .build()
    .unwrap();
    let app = Router::new()
        .route("/orders/{id}/{other}", post(token))
        .layer(layer(&store, Duration::from_secs(2)))
        .layer(tower::layer::layer_fn(Spawned))
        .layer(multi);
    let res = app
        .oneshot(Request::post("/orders/1/2").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(
        res.status(),
        StatusCode::OK,
        "the inner layer waited for the multi-key layer's lock"
    );
    let tokens: Vec<String> = res
        .headers()
        .get_all("fencing-token")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect();
    assert_eq!(tokens.len(), 2, "{tokens:?}");
    let body = axum::body::to_bytes(res.into_body(), 1024).await.unwrap();
    assert_eq!(tokens[0].as_bytes(), &body[..], "orders:1's token");
    assert_eq!(store.held_count(), 0);
}

/// An idempotent layer keyed on the `X-Event-Id` header, namespace `events`.
fn idempotent_events(store: &MemoryStore) -> LockLayer<MemoryStore> {
    LockLayer::builder(
        Locker::new(store.clone()),
        KeyFrom::header(http::HeaderName::from_static("x-event-id")),
    )
    .namespace("events")
    .idempotent(tower_redis_lock::Idempotency::new())
    .build()
    .unwrap()
}

/// An idempotent layer around a second lock layer (on another key) that
/// answers contention with 423, or through a rejection hook with a status
/// the store policy would keep: the refusal is sent, never stored, so the
/// next delivery runs the handler instead of getting the refusal replayed
/// for the whole retention.
#[tokio::test]
async fn an_inner_layers_refusal_is_never_stored_by_an_outer_idempotent_layer() {
    use http::HeaderName;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};
    use tower_redis_lock::{LockKey, Problem};

    let hooked = |p: &Problem| (StatusCode::ACCEPTED, format!("later: {}", p.detail()));
    for (name, hook) in [("423", None), ("hook", Some(hooked))] {
        let store = MemoryStore::new();
        let runs = Arc::new(AtomicU32::new(0));
        let seen = runs.clone();
        let mut inner = LockLayer::builder(
            Locker::new(store.clone()),
            KeyFrom::header(HeaderName::from_static("x-account")),
        )
        .namespace("account")
        .contention_status(StatusCode::LOCKED);
        if let Some(hook) = hook {
            inner = inner.on_rejection(hook);
        }
        let outer = idempotent_events(&store);
        let app = Router::new()
            .route(
                "/events",
                post(move || async move {
                    seen.fetch_add(1, Ordering::SeqCst);
                    "applied"
                }),
            )
            .layer(inner.build().unwrap())
            .layer(outer);
        let delivery = || {
            Request::post("/events")
                .header("x-event-id", "evt-1")
                .header("x-account", "acct-1")
                .body(Body::empty())
                .unwrap()
        };
        // Someone else works on the account: the inner layer refuses.
        let busy = Locker::new(store.clone())
            .acquire(&LockKey::new("account", "acct-1").unwrap())
            .await
            .unwrap();
        let refused = app.clone().oneshot(delivery()).await.unwrap();
        let expected = if hook.is_some() {
            StatusCode::ACCEPTED
        } else {
            StatusCode::LOCKED
        };
        assert_eq!(refused.status(), expected, "{name}");
        assert_eq!(runs.load(Ordering::SeqCst), 0);
        assert_eq!(
            store.held_count(),
            1,
            "{name}: only the account's lock is left"
        );
        busy.release().await.unwrap();
        // The redelivery runs the handler: the refusal was not its outcome.
        let ran = app.clone().oneshot(delivery()).await.unwrap();
        assert_eq!(
            ran.status(),
            StatusCode::OK,
            "{name}: the refusal was replayed"
        );
        assert!(ran.headers().get("idempotent-replayed").is_none());
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        // And that outcome is stored: the next one is a replay.
        let replay = app.oneshot(delivery()).await.unwrap();
        assert_eq!(replay.headers()["idempotent-replayed"], "true");
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }
}

/// A handler under an idempotent layer that releases its lock itself: its
/// response goes out as it is, nothing is stored, and the next delivery
/// runs the handler again (the documented opt-out, not a silent loss).
#[tokio::test]
async fn a_handler_that_releases_its_lock_opts_out_of_the_record() {
    // Alone in its process: it counts log lines, and a scoped capture can
    // miss a line another test's thread reaches first.
    if !support::in_own_process(
        module_path!(),
        "a_handler_that_releases_its_lock_opts_out_of_the_record",
    ) {
        return;
    }
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};
    use tower_redis_lock::{LockKey, LockStore};

    let store = MemoryStore::new();
    let runs = Arc::new(AtomicU32::new(0));
    let seen = runs.clone();
    let layer = idempotent_events(&store);
    let app = Router::new()
        .route(
            "/events",
            post(move |guard: LockGuard| async move {
                seen.fetch_add(1, Ordering::SeqCst);
                assert!(guard.release().await.unwrap());
                "handed off"
            }),
        )
        .layer(layer);
    let delivery = || {
        Request::post("/events")
            .header("x-event-id", "evt-2")
            .body(Body::empty())
            .unwrap()
    };
    let (logs, _guard) = support::logs::Logs::capture_at(tracing::Level::DEBUG);
    let first = app.clone().oneshot(delivery()).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert!(first.headers().contains_key("fencing-token"));
    // Said as what it is, not as a lost lock.
    assert_eq!(
        logs.lines_with("the handler released the lock itself")
            .len(),
        1,
        "{}",
        logs.text()
    );
    assert!(logs.lines_with("WARN").is_empty(), "{}", logs.text());
    let key = LockKey::new("events", "evt-2").unwrap();
    assert_eq!(store.read_record(&key).await.unwrap(), None);
    assert_eq!(store.held_count(), 0);
    let second = app.oneshot(delivery()).await.unwrap();
    assert_eq!(second.status(), StatusCode::OK);
    assert!(second.headers().get("idempotent-replayed").is_none());
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}
