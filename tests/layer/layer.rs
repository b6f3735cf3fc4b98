//! Behaviour of the HTTP layer that does not depend on the store: through
//! `Router::oneshot` and against the `tower_test` mock, on `MemoryStore`;
//! wherever Redis behaviour is claimed, a real `redis-server` started by the
//! test support on a free port.
//!
//! What every store must do under the layer (contention, fencing tokens,
//! mutual exclusion, no lock left behind, lock loss, replay, holding until
//! the body ends) is one suite run against every store: `tests/layer_stores.rs`.

use crate::support;
use support::stores::redis_name;

use support::http::{Gate, Reply, join, post_to, read, send, spawn_send};

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::task::Poll;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Extension;
use axum::routing::{get, post};
use bytes::Bytes;
use futures_util::{FutureExt, StreamExt};
use http::header::CONTENT_TYPE;
use http::{HeaderName, Request, Response, StatusCode};
use support::RedisServer;
use tokio::sync::mpsc;
use tokio::time::timeout;
use tower::{Layer, ServiceExt};
use tower_redis_lock::{
    FencingToken, KeyFrom, LockGuard, LockKey, LockLayer, Locker, MemoryStore, OnLockLost,
    OnMissingKey, OnStoreError, RedisStore,
};

/// Upper bound on every wait for a condition. Reached only when the test
/// fails; a passing run never waits this long.
const LIMIT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// Polls `cond` every 5 ms until it holds or `LIMIT` passes.
async fn eventually(cond: impl AsyncFnMut() -> bool) -> bool {
    support::eventually(LIMIT, cond).await
}

fn lock_key(ns: &str, id: &str) -> LockKey {
    LockKey::new(ns, id).unwrap()
}

fn redis_store(server: &RedisServer) -> RedisStore {
    RedisStore::from_url(&server.url()).unwrap()
}

fn redis_lock_keys(server: &RedisServer) -> Vec<String> {
    server
        .keys()
        .into_iter()
        .filter(|k| k.ends_with(":lock"))
        .collect()
}

/// Flips its flag when dropped: shows that a handler's future was dropped.
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

// ---------------------------------------------------------------------------
// 1. A custom fencing header
// ---------------------------------------------------------------------------

async fn fencing_handler(guard: LockGuard, Extension(token): Extension<FencingToken>) -> String {
    format!("{} {}", guard.fencing_token().unwrap().get(), token.get())
}

#[tokio::test]
async fn a_custom_fencing_header_replaces_the_default() {
    let custom = Router::new()
        .route("/jobs/{id}", post(fencing_handler))
        .layer(
            LockLayer::builder(
                Locker::new(MemoryStore::new()),
                KeyFrom::path_param::<String>("id"),
            )
            .fencing_header(HeaderName::from_static("x-fence"))
            .build()
            .unwrap(),
        );
    let r = send(&custom, post_to("/jobs/j1")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.headers.get("fencing-token").is_none());
    let header = r.fencing_in("x-fence").expect("no x-fence header");
    assert_eq!(r.text(), format!("{header} {header}"));
}

// ---------------------------------------------------------------------------
// 2. Key sources and namespaces
// ---------------------------------------------------------------------------

/// The lock key the handler saw, for one key source and one request.
async fn key_seen(key: KeyFrom, route: &str, req: Request<Body>) -> Reply {
    let app = Router::new()
        .route(
            route,
            post(|guard: LockGuard| async move { guard.key().to_string() }),
        )
        .layer(
            LockLayer::builder(Locker::new(MemoryStore::new()), key)
                .namespace("ns")
                .build()
                .unwrap(),
        );
    send(&app, req).await
}

#[tokio::test]
async fn every_key_source_finds_its_id() {
    let cases: Vec<(KeyFrom, &str, Request<Body>, &str)> = vec![
        (
            KeyFrom::path(),
            "/files/{*rest}",
            post_to("/files/a/b.txt?x=1"),
            "ns:/files/a/b.txt",
        ),
        (
            KeyFrom::path_param::<String>("id"),
            "/orders/{id}/capture",
            post_to("/orders/ord_7/capture"),
            "ns:ord_7",
        ),
        (
            KeyFrom::header(HeaderName::from_static("idempotency-key")),
            "/pay",
            Request::post("/pay")
                .header("idempotency-key", "idem-42")
                .body(Body::empty())
                .unwrap(),
            "ns:idem-42",
        ),
        (
            KeyFrom::query::<String>("event"),
            "/hook",
            post_to("/hook?x=2&event=evt_9"),
            "ns:evt_9",
        ),
        (
            KeyFrom::custom(|p| {
                let tenant = p.headers.get("x-tenant")?.to_str().ok()?;
                Some(format!("{tenant}-{}", p.method))
            }),
            "/t",
            Request::post("/t")
                .header("x-tenant", "acme")
                .body(Body::empty())
                .unwrap(),
            "ns:acme-POST",
        ),
    ];
    for (key, route, req, expected) in cases {
        let what = format!("{key:?}");
        let r = key_seen(key, route, req).await;
        assert_eq!(r.status, StatusCode::OK, "{what}: {}", r.text());
        assert_eq!(r.text(), expected, "{what}");
    }
}

#[tokio::test]
async fn a_json_pointer_key_reads_the_body_and_hands_the_same_bytes_on() {
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let app = Router::new()
        .route(
            "/webhooks/stripe",
            post(move |guard: LockGuard, body: Bytes| async move {
                c.fetch_add(1, Ordering::SeqCst);
                format!(
                    "{}\n{}",
                    guard.key(),
                    String::from_utf8(body.to_vec()).unwrap()
                )
            }),
        )
        .layer(
            LockLayer::builder(
                Locker::new(MemoryStore::new()),
                KeyFrom::json_pointer::<String>("/data/object/id"),
            )
            .namespace("stripe")
            .build()
            .unwrap(),
        );

    // Odd spacing and key order: the handler must get these bytes, not a
    // re-serialisation.
    let sent = "{ \"type\":\"charge.succeeded\",\n  \"data\" : {\"object\": {\"amount\": 100, \"id\" : \"ch_1\"}} }\n";
    let r = send(
        &app,
        Request::post("/webhooks/stripe")
            .header(CONTENT_TYPE, "application/json")
            .body(Body::from(sent))
            .unwrap(),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let text = r.text();
    let (key, body) = text.split_once('\n').unwrap();
    assert_eq!(key, "stripe:ch_1");
    assert_eq!(body, sent);

    // A number is not a `String`: the 422 axum's `Json` would answer, and
    // the handler never runs.
    let r = send(
        &app,
        Request::post("/webhooks/stripe")
            .header(CONTENT_TYPE, "application/json")
            .body(Body::from(r#"{"data":{"object":{"id":42}}}"#))
            .unwrap(),
    )
    .await;
    r.problem(StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// `/a/{id}` waits at the gate, `/b/{id}` answers at once; one layer.
fn two_routes(namespace: Option<&str>, gate: Gate) -> Router {
    let mut builder = LockLayer::builder(
        Locker::new(MemoryStore::new()),
        KeyFrom::path_param::<String>("id"),
    )
    .expose_lock_key(true);
    if let Some(ns) = namespace {
        builder = builder.namespace(ns);
    }
    Router::new()
        .route(
            "/a/{id}",
            post(move || async move {
                gate.pass().await;
                "a"
            }),
        )
        .route(
            "/b/{id}",
            post(|guard: LockGuard| async move { guard.key().to_string() }),
        )
        .layer(builder.build().unwrap())
}

#[tokio::test]
async fn routes_under_one_layer_do_not_contend_unless_they_share_a_namespace() {
    // Default namespace: the matched route.
    let (gate, mut gates) = Gate::new();
    let app = two_routes(None, gate);
    let holder = spawn_send(&app, post_to("/a/1"));
    let let_go = gates.started().await;
    let same_route = send(&app, post_to("/a/1")).await;
    let v = same_route.problem(StatusCode::CONFLICT);
    assert!(v["lock_key"].as_str().unwrap().ends_with(":1"), "{v}");
    let other_route = send(&app, post_to("/b/1")).await;
    assert_eq!(other_route.status, StatusCode::OK, "{}", other_route.text());
    // Its own namespace, derived from its route template.
    let text = other_route.text();
    let (ns, id) = text.rsplit_once(':').unwrap();
    assert_eq!(id, "1");
    assert!(ns.contains('b') && ns != "x", "{text}");
    let_go.send(()).unwrap();
    assert_eq!(join(holder).await.status, StatusCode::OK);

    // One namespace on both routes: they exclude each other.
    let (gate, mut gates) = Gate::new();
    let app = two_routes(Some("x"), gate);
    let holder = spawn_send(&app, post_to("/a/1"));
    let let_go = gates.started().await;
    let other_route = send(&app, post_to("/b/1")).await;
    let v = other_route.problem(StatusCode::CONFLICT);
    assert_eq!(v["lock_key"], "x:1");
    // A different id still runs.
    let other_id = send(&app, post_to("/b/2")).await;
    assert_eq!(other_id.text(), "x:2");
    let_go.send(()).unwrap();
    assert_eq!(join(holder).await.status, StatusCode::OK);
    let after = send(&app, post_to("/b/1")).await;
    assert_eq!(after.text(), "x:1");
}

// ---------------------------------------------------------------------------
// 3. Bodies: limits and bad JSON
// ---------------------------------------------------------------------------

/// A body of `chunks` chunks of `chunk` bytes that counts the bytes pulled.
fn counted_body(chunks: usize, chunk: usize, pulled: Arc<AtomicUsize>) -> Body {
    let stream = futures_util::stream::iter(0..chunks).map(move |i| {
        pulled.fetch_add(chunk, Ordering::SeqCst);
        // `{"id":"x", "pad":"aaaa...` : valid JSON start, never finished.
        let bytes = if i == 0 {
            let mut v = br#"{"id":"x","pad":""#.to_vec();
            v.resize(chunk, b'a');
            v
        } else {
            vec![b'a'; chunk]
        };
        Ok::<_, Infallible>(Bytes::from(bytes))
    });
    Body::from_stream(stream)
}

#[tokio::test]
async fn body_keys_are_read_within_the_limit_and_bad_bodies_never_reach_the_handler() {
    const LIMIT_BYTES: usize = 1024;
    const CHUNK: usize = 512;
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let app = Router::new()
        .route(
            "/hook",
            post(move |body: Bytes| async move {
                c.fetch_add(1, Ordering::SeqCst);
                format!("{} bytes", body.len())
            }),
        )
        .layer(
            LockLayer::builder(
                Locker::new(MemoryStore::new()),
                KeyFrom::json_pointer::<String>("/id"),
            )
            .body_limit(LIMIT_BYTES)
            .build()
            .unwrap(),
        );

    // Within the limit: runs (shows that the handler counter counts).
    let ok = send(
        &app,
        Request::post("/hook")
            .header(CONTENT_TYPE, "application/json")
            .body(Body::from(r#"{"id":"a"}"#))
            .unwrap(),
    )
    .await;
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.text());
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    // Declared too large: refused before a byte is read.
    let pulled = Arc::new(AtomicUsize::new(0));
    let total = 4 * CHUNK;
    let r = send(
        &app,
        Request::post("/hook")
            .header(CONTENT_TYPE, "application/json")
            .header(http::header::CONTENT_LENGTH, total.to_string())
            .body(counted_body(4, CHUNK, pulled.clone()))
            .unwrap(),
    )
    .await;
    r.problem(StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        pulled.load(Ordering::SeqCst),
        0,
        "read a body it had to refuse"
    );

    // Streamed, no Content-Length, far larger than the limit: refused after
    // reading at most the limit plus one chunk.
    let pulled = Arc::new(AtomicUsize::new(0));
    let chunks = 1024; // 512 KiB
    let r = send(
        &app,
        Request::post("/hook")
            .header(CONTENT_TYPE, "application/json")
            .body(counted_body(chunks, CHUNK, pulled.clone()))
            .unwrap(),
    )
    .await;
    r.problem(StatusCode::PAYLOAD_TOO_LARGE);
    let n = pulled.load(Ordering::SeqCst);
    assert!(
        n > 0 && n <= LIMIT_BYTES + CHUNK,
        "pulled {n} of {} bytes with a limit of {LIMIT_BYTES}",
        chunks * CHUNK
    );

    // Not JSON.
    let r = send(
        &app,
        Request::post("/hook")
            .header(CONTENT_TYPE, "application/json")
            .body(Body::from("{not json"))
            .unwrap(),
    )
    .await;
    r.problem(StatusCode::BAD_REQUEST);

    // JSON without the field.
    let r = send(
        &app,
        Request::post("/hook")
            .header(CONTENT_TYPE, "application/json")
            .body(Body::from(r#"{"other":1}"#))
            .unwrap(),
    )
    .await;
    let v = r.problem(StatusCode::BAD_REQUEST);
    assert!(v["detail"].as_str().unwrap().contains("/id"), "{v}");

    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the handler ran on a refused request"
    );
}

// ---------------------------------------------------------------------------
// 4. Missing key; 5. missing layer
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_missing_key_is_400_by_default_and_runs_unlocked_with_pass_through() {
    let calls = Arc::new(AtomicU32::new(0));
    let handler = {
        let calls = calls.clone();
        move |guard: Option<LockGuard>| async move {
            calls.fetch_add(1, Ordering::SeqCst);
            match guard {
                Some(g) => format!("locked {}", g.key()),
                None => "unlocked".to_owned(),
            }
        }
    };
    let key = || KeyFrom::header(HeaderName::from_static("idempotency-key"));
    let reject = Router::new().route("/pay", post(handler.clone())).layer(
        LockLayer::builder(Locker::new(MemoryStore::new()), key())
            .namespace("pay")
            .build()
            .unwrap(),
    );
    let pass = Router::new().route("/pay", post(handler)).layer(
        LockLayer::builder(Locker::new(MemoryStore::new()), key())
            .namespace("pay")
            .on_missing_key(OnMissingKey::PassThrough)
            .build()
            .unwrap(),
    );

    let r = send(&reject, post_to("/pay")).await;
    let v = r.problem(StatusCode::BAD_REQUEST);
    assert!(
        v["detail"].as_str().unwrap().contains("idempotency-key"),
        "{v}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0);

    let r = send(&pass, post_to("/pay")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.text(), "unlocked");
    assert!(r.headers.get("fencing-token").is_none());
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    // With a key, pass-through still locks.
    let with_key = Request::post("/pay")
        .header("idempotency-key", "k1")
        .body(Body::empty())
        .unwrap();
    let r = send(&pass, with_key).await;
    assert_eq!(r.text(), "locked pay:k1");
    assert!(r.fencing_in("fencing-token").is_some());
}

#[tokio::test]
async fn the_guard_extractor_without_the_layer_is_a_500_naming_the_layer() {
    let app = Router::new().route("/x", get(|_g: LockGuard| async { "unreachable" }));
    let r = send(&app, Request::get("/x").body(Body::empty()).unwrap()).await;
    let v = r.problem(StatusCode::INTERNAL_SERVER_ERROR);
    assert!(v["detail"].as_str().unwrap().contains("LockLayer"), "{v}");
}

// ---------------------------------------------------------------------------
// 6. Redis down
// ---------------------------------------------------------------------------

// Multi-threaded: the support's Redis calls block their thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_fails_closed_with_503_or_open_by_choice() {
    let mut server = RedisServer::start();
    let locker = Locker::new(redis_store(&server));
    let calls = Arc::new(AtomicU32::new(0));
    let handler = {
        let calls = calls.clone();
        move |guard: Option<LockGuard>| async move {
            calls.fetch_add(1, Ordering::SeqCst);
            if guard.is_some() {
                "locked"
            } else {
                "unlocked"
            }
        }
    };
    let closed = Router::new()
        .route("/jobs/{id}", post(handler.clone()))
        .layer(
            LockLayer::builder(locker.clone(), KeyFrom::path_param::<String>("id"))
                .namespace("jobs")
                .build()
                .unwrap(),
        );
    let open = Router::new().route("/jobs/{id}", post(handler)).layer(
        LockLayer::builder(locker, KeyFrom::path_param::<String>("id"))
            .namespace("jobs")
            .on_store_error(OnStoreError::FailOpen)
            .build()
            .unwrap(),
    );

    // Up: both lock.
    for app in [&closed, &open] {
        let r = send(app, post_to("/jobs/a")).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        assert_eq!(r.text(), "locked");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    server.stop();
    let r = send(&closed, post_to("/jobs/a")).await;
    r.problem(StatusCode::SERVICE_UNAVAILABLE);
    assert!(r.retry_after() >= 1);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "the handler ran without a lock"
    );

    let r = send(&open, post_to("/jobs/a")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.text(), "unlocked");
    assert!(r.headers.get("fencing-token").is_none());
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

// ---------------------------------------------------------------------------
// 7. A panicking service
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_panicking_service_releases_the_lock() {
    let store = MemoryStore::new();
    // A tower service (not an axum handler), under `catch_unwind`.
    let svc = LockLayer::builder(Locker::new(store.clone()), KeyFrom::path())
        .namespace("svc")
        .build()
        .unwrap()
        .layer(tower::service_fn(|req: Request<Body>| async move {
            if req.headers().contains_key("x-panic") {
                panic!("service panicked on purpose");
            }
            Ok::<_, Infallible>(Response::new(Body::from("fine")))
        }));
    let req = Request::post("/s")
        .header("x-panic", "1")
        .body(Body::empty())
        .unwrap();
    let caught = std::panic::AssertUnwindSafe(svc.clone().oneshot(req))
        .catch_unwind()
        .await;
    assert!(caught.is_err(), "the service did not panic");
    let svc_key = lock_key("svc", "/s");
    assert!(
        eventually(async || {
            let res = svc.clone().oneshot(post_to("/s")).await.unwrap();
            res.status() == StatusCode::OK
        })
        .await,
        "the key stayed locked after the service panicked"
    );
    assert!(!store.is_locked(&svc_key));
}

// ---------------------------------------------------------------------------
// 8. Lock loss on Redis: the key deleted under the handler
// ---------------------------------------------------------------------------

// Multi-threaded: the support's Redis calls block their thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_the_lock_aborts_the_handler_with_503_when_asked() {
    let server = RedisServer::start();
    let locker = Locker::builder(redis_store(&server))
        .lease(Duration::from_secs(1))
        .build()
        .unwrap();
    let dropped = Arc::new(AtomicBool::new(false));
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let app = Router::new()
        .route(
            "/jobs/{id}",
            post({
                let dropped = dropped.clone();
                move || async move {
                    let _flag = DropFlag(dropped);
                    let _ = started_tx.send(());
                    std::future::pending::<()>().await;
                    "finished"
                }
            }),
        )
        .layer(
            LockLayer::builder(locker, KeyFrom::path_param::<String>("id"))
                .namespace("jobs")
                .expose_lock_key(true)
                .on_lock_lost(OnLockLost::Abort)
                .build()
                .unwrap(),
        );

    let task = spawn_send(&app, post_to("/jobs/a"));
    timeout(LIMIT, started.recv()).await.unwrap().unwrap();
    // Renewed every lease/3: the key stays until we delete it.
    assert_eq!(
        redis_lock_keys(&server),
        vec![redis_name("jobs", "a", "lock")]
    );
    assert!(!dropped.load(Ordering::SeqCst));
    assert_eq!(
        server
            .cmd(&["DEL", &redis_name("jobs", "a", "lock")])
            .as_int(),
        Some(1)
    );

    let r = join(task).await;
    let v = r.problem(StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(v["lock_key"], "jobs:a", "{v}");
    assert!(r.retry_after() >= 1);
    assert!(r.headers.get("fencing-token").is_none());
    assert!(
        dropped.load(Ordering::SeqCst),
        "the handler's future was not dropped"
    );
    assert!(redis_lock_keys(&server).is_empty());
}

// Multi-threaded: the support's Redis calls block their thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_the_lock_reaches_a_handler_that_keeps_running() {
    let server = RedisServer::start();
    let locker = Locker::builder(redis_store(&server))
        .lease(Duration::from_secs(1))
        .build()
        .unwrap();
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let app = Router::new()
        .route(
            "/jobs/{id}",
            post(move |guard: LockGuard| async move {
                let _ = started_tx.send(());
                let lost = timeout(LIMIT, guard.lost()).await.is_ok();
                format!("lost={lost} held={}", guard.is_held())
            }),
        )
        .layer(
            LockLayer::builder(locker, KeyFrom::path_param::<String>("id"))
                .namespace("jobs")
                .build()
                .unwrap(),
        );

    let task = spawn_send(&app, post_to("/jobs/b"));
    timeout(LIMIT, started.recv()).await.unwrap().unwrap();
    assert_eq!(
        server
            .cmd(&["DEL", &redis_name("jobs", "b", "lock")])
            .as_int(),
        Some(1)
    );
    let r = join(task).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.text(), "lost=true held=false");
}

// ---------------------------------------------------------------------------
// 9. Service contract
// ---------------------------------------------------------------------------

#[tokio::test]
async fn poll_ready_forwards_the_inner_readiness_and_call_uses_the_ready_service() {
    let store = MemoryStore::new();
    let layer = LockLayer::builder(
        Locker::new(store.clone()),
        KeyFrom::header(HeaderName::from_static("idempotency-key")),
    )
    .namespace("mock")
    .build()
    .unwrap();
    let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let mut svc = tower_test::mock::Spawn::new(layer.layer(mock));

    // Inner not ready: neither are we, and no lock is taken to find out.
    handle.allow(0);
    assert!(svc.poll_ready::<Request<Body>>().is_pending());
    assert_eq!(store.held_count(), 0);
    // Inner ready: we are woken and ready.
    handle.allow(1);
    assert!(svc.is_woken());
    assert!(matches!(
        svc.poll_ready::<Request<Body>>(),
        Poll::Ready(Ok(()))
    ));
    assert_eq!(store.held_count(), 0);

    // The mock panics if `call` reaches a clone that was not made ready.
    let req = Request::post("/x")
        .header("idempotency-key", "k1")
        .body(Body::empty())
        .unwrap();
    let fut = tokio::spawn(svc.call(req));
    let (req, respond) = timeout(LIMIT, handle.next_request())
        .await
        .expect("the inner service was not called")
        .unwrap();
    let guard = req.extensions().get::<LockGuard>().cloned().unwrap();
    let token = *req.extensions().get::<FencingToken>().unwrap();
    assert_eq!(guard.key().as_str(), "mock:k1");
    assert_eq!(guard.fencing_token().unwrap(), token);
    assert!(store.is_locked(guard.key()));
    drop(guard);
    // The allowance was used by that call: the service left in place is not
    // ready until the inner one is.
    assert!(svc.poll_ready::<Request<Body>>().is_pending());

    respond.send_response(Response::new(Body::from("inner")));
    let res = timeout(LIMIT, fut).await.unwrap().unwrap().unwrap();
    let r = read(res).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.text(), "inner");
    assert_eq!(r.fencing_in("fencing-token"), Some(token.get()));
    assert!(!store.is_locked(&lock_key("mock", "k1")));

    // Inner errors on readiness are forwarded as they are.
    handle.send_error("inner broke");
    match svc.poll_ready::<Request<Body>>() {
        Poll::Ready(Err(e)) => assert_eq!(e.to_string(), "inner broke"),
        other => panic!("expected the inner error, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------
// 10. Configuration errors
// ---------------------------------------------------------------------------

#[tokio::test]
async fn bad_settings_are_config_errors() {
    let builder = || LockLayer::builder(Locker::new(MemoryStore::new()), KeyFrom::path());
    let err = builder()
        .contention_status(StatusCode::OK)
        .build()
        .unwrap_err();
    assert_eq!(err.setting(), "contention_status");
    let err = builder()
        .contention_status(StatusCode::SERVICE_UNAVAILABLE)
        .build()
        .unwrap_err();
    assert_eq!(err.setting(), "contention_status");
    assert!(
        builder()
            .contention_status(StatusCode::LOCKED)
            .build()
            .is_ok()
    );
    assert!(
        builder()
            .contention_status(StatusCode::CONFLICT)
            .build()
            .is_ok()
    );

    for ns in ["", "a b", "a:b", "a{b}", &"n".repeat(65)] {
        let err = builder().namespace(ns).build().unwrap_err();
        assert_eq!(err.setting(), "namespace", "{ns:?}");
    }
    assert!(builder().namespace("orders/v2.capture-x_1").build().is_ok());

    let err = builder()
        .hold_until_body_end(true)
        .on_lock_lost(OnLockLost::Abort)
        .build()
        .unwrap_err();
    assert_eq!(err.setting(), "on_lock_lost");
    assert!(builder().hold_until_body_end(true).build().is_ok());
    assert!(builder().on_lock_lost(OnLockLost::Abort).build().is_ok());

    assert_eq!(
        builder().body_limit(0).build().unwrap_err().setting(),
        "body_limit"
    );
}

#[tokio::test]
async fn a_body_digest_key_is_the_sha256_of_the_exact_bytes_handed_on_unchanged() {
    let app = Router::new()
        .route(
            "/webhooks/github",
            post(|guard: LockGuard, body: Bytes| async move {
                format!("{}\n{}", guard.key(), String::from_utf8_lossy(&body))
            }),
        )
        .layer(
            LockLayer::builder(Locker::new(MemoryStore::new()), KeyFrom::body_digest())
                .namespace("github")
                .body_limit(64)
                .build()
                .unwrap(),
        );
    let key_of = async |body: &'static str, delivery: &str| {
        let r = send(
            &app,
            Request::post("/webhooks/github")
                .header("x-github-delivery", delivery)
                .body(Body::from(body))
                .unwrap(),
        )
        .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        let text = r.text();
        let (key, seen) = text.split_once('\n').unwrap();
        assert_eq!(seen, body, "the handler got other bytes");
        key.to_owned()
    };
    let push = "{\"ref\":\"refs/heads/main\",\n \"after\":\"abc\"}";
    // `printf '%s' "$push" | sha256sum`, computed here the same way.
    let digest = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(push.as_bytes()))
    };
    let first = key_of(push, "d-1").await;
    assert_eq!(first, format!("github:{digest}"));
    // The same body under another delivery id: the same key.
    assert_eq!(key_of(push, "d-2").await, first);
    // Another body, even the same JSON spelled otherwise: another key.
    assert_ne!(
        key_of("{\"ref\":\"refs/heads/main\",\"after\":\"abc\"}", "d-1").await,
        first
    );
    assert_ne!(key_of("not json at all", "d-1").await, first);

    // An empty body is no key; an over-limit one is refused on its
    // Content-Length.
    send(&app, post_to("/webhooks/github"))
        .await
        .problem(StatusCode::BAD_REQUEST);
    send(
        &app,
        Request::post("/webhooks/github")
            .header(http::header::CONTENT_LENGTH, "65")
            .body(Body::from(vec![b'x'; 65]))
            .unwrap(),
    )
    .await
    .problem(StatusCode::PAYLOAD_TOO_LARGE);
}

/// The rejection hook answers every refusal of the layer — a missing key
/// (400), contention (409) and an over-limit body (413) here — with the
/// app's own format, given the problem the layer would have answered (the
/// lock key included); a hook body past 64 KiB falls back to the default.
#[tokio::test]
async fn a_rejection_hook_shapes_every_refusal_and_the_default_names_no_key() {
    use axum::Json;
    use tower_redis_lock::Problem;

    let (gate, mut gates) = Gate::new();
    let app = |hook: Option<fn(&Problem) -> axum::response::Response>| {
        let gate = gate.clone();
        let mut b = LockLayer::builder(
            Locker::new(MemoryStore::new()),
            KeyFrom::path_param::<String>("id"),
        )
        .namespace("jobs")
        .body_limit(4);
        if let Some(hook) = hook {
            b = b.on_rejection(hook);
        }
        let held = post(move || async move {
            gate.pass().await;
            "done"
        });
        Router::new()
            .route("/jobs/{id}", held.route_layer(b.build().unwrap()))
            .route(
                "/nokey",
                post(|| async { "unreachable" }).route_layer(
                    LockLayer::builder(
                        Locker::new(MemoryStore::new()),
                        KeyFrom::header(HeaderName::from_static("x-id")),
                    )
                    .namespace("n")
                    .on_rejection(|p: &Problem| {
                        (p.status(), Json(serde_json::json!({ "error": p.detail() })))
                    })
                    .build()
                    .unwrap(),
                ),
            )
            .route(
                "/big/{id}",
                post(|| async { "unreachable" }).route_layer(
                    LockLayer::builder(
                        Locker::new(MemoryStore::new()),
                        KeyFrom::json_pointer::<String>("/id"),
                    )
                    .namespace("big")
                    .body_limit(4)
                    .on_rejection(|p: &Problem| {
                        (p.status(), Json(serde_json::json!({ "error": p.detail() })))
                    })
                    .build()
                    .unwrap(),
                ),
            )
    };
    fn ours(p: &Problem) -> axum::response::Response {
        use axum::response::IntoResponse;
        let mut res = (
            p.status(),
            Json(serde_json::json!({
                "error": p.detail(),
                "key": p.lock_key(),
                "retry_after_s": p.retry_after().map(|d| d.as_secs_f64().ceil() as u64),
            })),
        )
            .into_response();
        res.headers_mut()
            .insert("x-ours", http::HeaderValue::from_static("1"));
        res
    }
    fn huge(p: &Problem) -> axum::response::Response {
        use axum::response::IntoResponse;
        (p.status(), "x".repeat(65 * 1024)).into_response()
    }

    // Contention, with the hook: the app's JSON, the status kept, the key
    // given to the hook.
    let with_hook = app(Some(ours));
    let holder = spawn_send(&with_hook, post_to("/jobs/1"));
    let let_go = gates.started().await;
    let r = send(&with_hook, post_to("/jobs/1")).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{r:?}");
    assert_eq!(r.headers["x-ours"], "1");
    assert_eq!(r.headers[CONTENT_TYPE], "application/json");
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["key"], "jobs:1", "{v}");
    assert!(v["retry_after_s"].as_u64().unwrap() >= 1, "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("another request"),
        "{v}"
    );

    // Without a hook: the default problem, which names no key.
    let plain = app(None);
    let_go.send(()).unwrap();
    assert_eq!(join(holder).await.status, StatusCode::OK);
    let holder = spawn_send(&plain, post_to("/jobs/2"));
    let let_go = gates.started().await;
    let r = send(&plain, post_to("/jobs/2")).await;
    let p = r.problem(StatusCode::CONFLICT);
    assert_eq!(p.get("lock_key"), None, "{p}");
    assert!(!p["detail"].as_str().unwrap().contains("jobs"), "{p}");
    assert!(r.retry_after() >= 1);

    // A hook body over 64 KiB: the default answer instead.
    let too_big = app(Some(huge));
    let holder2 = spawn_send(&too_big, post_to("/jobs/3"));
    let let_go2 = gates.started().await;
    let r = send(&too_big, post_to("/jobs/3")).await;
    r.problem(StatusCode::CONFLICT);
    let_go.send(()).unwrap();
    let_go2.send(()).unwrap();
    assert_eq!(join(holder).await.status, StatusCode::OK);
    assert_eq!(join(holder2).await.status, StatusCode::OK);

    // A missing key (400) and a body over the limit (413) through hooks.
    let r = send(&plain, post_to("/nokey")).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{r:?}");
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert!(v["error"].as_str().unwrap().contains("no lock key"), "{v}");
    let big = Request::post("/big/1")
        .header(CONTENT_TYPE, "application/json")
        .body(Body::from(r#"{"id":"abcdef"}"#))
        .unwrap();
    let r = send(&plain, big).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE, "{r:?}");
    assert_eq!(r.headers[CONTENT_TYPE], "application/json");
}

/// `LockLayer::new` runs the builder's checks: a setting `build` refuses
/// is never left to the request path.
#[test]
#[should_panic(expected = "wait_timeout")]
fn lock_layer_new_refuses_what_the_builder_refuses() {
    let locker = Locker::builder(MemoryStore::new())
        .wait_timeout(Duration::from_secs(25 * 3600))
        .build()
        .unwrap();
    let _ = LockLayer::new(locker, KeyFrom::path_param::<u64>("id"));
}

/// The hook learns why the layer refused (`Problem::kind`), and whatever
/// it answers, the `Retry-After` of a refusal that has one goes out with
/// it: clients that obey it come back when told, not at once.
#[tokio::test]
async fn a_rejection_hook_sees_why_and_cannot_drop_retry_after() {
    use std::sync::{Arc, Mutex};
    use tower_redis_lock::{Problem, ProblemKind};

    let seen: Arc<Mutex<Vec<ProblemKind>>> = Arc::default();
    let store = MemoryStore::new();
    let (gate, mut gates) = Gate::new();
    let layer = {
        let seen = seen.clone();
        LockLayer::builder(Locker::new(store.clone()), KeyFrom::path_param::<u64>("id"))
            .namespace("kinds")
            .on_rejection(move |p: &Problem| {
                seen.lock().unwrap().push(p.kind());
                // A bare answer: no `Retry-After` of its own.
                (p.status(), "refused")
            })
            .build()
            .unwrap()
    };
    let app = Router::new().route(
        "/kinds/{id}",
        post(move || async move {
            gate.pass().await;
            "done"
        })
        .route_layer(layer),
    );

    // Contention: 409 with the layer's Retry-After, though the hook gave none.
    let holder = spawn_send(&app, post_to("/kinds/1"));
    let let_go = gates.started().await;
    let r = send(&app, post_to("/kinds/1")).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{r:?}");
    assert_eq!(r.text(), "refused");
    assert!(r.header("retry-after").is_some(), "{r:?}");
    let_go.send(()).unwrap();
    assert_eq!(join(holder).await.status, StatusCode::OK);

    // A key the handler cannot read: 400, and nothing to retry.
    let r = send(&app, post_to("/kinds/seven")).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{r:?}");
    assert_eq!(r.header("retry-after"), None);

    // The store down: 503 with Retry-After.
    store.fail_next_calls(1);
    let r = send(&app, post_to("/kinds/2")).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{r:?}");
    assert!(r.header("retry-after").is_some(), "{r:?}");

    assert_eq!(
        *seen.lock().unwrap(),
        [
            ProblemKind::Contended,
            ProblemKind::BadKey,
            ProblemKind::StoreUnavailable
        ]
    );

    // A hook's own Retry-After is its choice, and kept as it is.
    let app = Router::new().route(
        "/own/{id}",
        post(|| async { "done" }).route_layer(
            LockLayer::builder(Locker::new(store.clone()), KeyFrom::path_param::<u64>("id"))
                .namespace("own")
                .on_rejection(|p: &Problem| (p.status(), [("retry-after", "120")], "later"))
                .build()
                .unwrap(),
        ),
    );
    store.fail_next_calls(1);
    let r = send(&app, post_to("/own/3")).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{r:?}");
    assert_eq!(r.all(&http::header::RETRY_AFTER), ["120"]);
}

/// `Retry-After` on contention tells clients when the lock is likely free:
/// by default how long this layer's requests have held it lately (1.5 s
/// here: `2`), not the holder's 30 s lease, which it says only before any
/// request went through; `RemainingLease` and `Fixed` say what they name.
#[tokio::test(start_paused = true)]
async fn retry_after_on_contention_follows_the_hold_times_seen() {
    use tower_redis_lock::RetryAfter;

    let app = |policy: Option<RetryAfter>| {
        let locker = Locker::builder(MemoryStore::new())
            .lease(Duration::from_secs(30))
            .build()
            .unwrap();
        let mut b = LockLayer::builder(locker, KeyFrom::path_param::<u64>("id")).namespace("slow");
        if let Some(policy) = policy {
            b = b.retry_after(policy);
        }
        Router::new().route(
            "/slow/{id}",
            post(|| async {
                tokio::time::sleep(Duration::from_millis(1_500)).await;
                "done"
            })
            .route_layer(b.build().unwrap()),
        )
    };
    // The `Retry-After` a request gets while another holds the lock.
    async fn refused_after(app: &Router) -> String {
        let holder = spawn_send(app, post_to("/slow/1"));
        tokio::time::sleep(Duration::from_millis(10)).await;
        let r = send(app, post_to("/slow/1")).await;
        assert_eq!(r.status, StatusCode::CONFLICT, "{r:?}");
        assert_eq!(join(holder).await.status, StatusCode::OK);
        r.header("retry-after").unwrap().to_owned()
    }

    let observed = app(None);
    // Nothing seen yet: the holder's remaining lease.
    assert_eq!(refused_after(&observed).await, "30");
    // One request seen through (1.5 s): 2 s.
    assert_eq!(refused_after(&observed).await, "2");

    let lease = app(Some(RetryAfter::RemainingLease));
    assert_eq!(refused_after(&lease).await, "30");
    assert_eq!(refused_after(&lease).await, "30");

    let fixed = app(Some(RetryAfter::Fixed(Duration::from_secs(5))));
    assert_eq!(refused_after(&fixed).await, "5");
}

/// A `Retry-After` too long to say in seconds is said as the longest one,
/// never as `0` (come back at once): `RetryAfter::Fixed(Duration::MAX)`
/// and a problem of the app's own alike.
#[tokio::test(start_paused = true)]
async fn a_huge_retry_after_never_wraps_to_zero() {
    use tower_redis_lock::{Problem, RetryAfter};

    let p = Problem::new(StatusCode::CONFLICT, "busy").with_retry_after(Duration::MAX);
    let res = axum::response::IntoResponse::into_response(p);
    assert_eq!(res.headers()["retry-after"], u64::MAX.to_string().as_str());

    let layer = LockLayer::builder(
        Locker::new(MemoryStore::new()),
        KeyFrom::path_param::<u64>("id"),
    )
    .namespace("huge")
    .retry_after(RetryAfter::Fixed(Duration::MAX))
    .build()
    .unwrap();
    let app = Router::new().route(
        "/huge/{id}",
        post(|| async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            "done"
        })
        .route_layer(layer),
    );
    let holder = spawn_send(&app, post_to("/huge/1"));
    tokio::time::sleep(Duration::from_millis(10)).await;
    let r = send(&app, post_to("/huge/1")).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{r:?}");
    assert_eq!(join(holder).await.status, StatusCode::OK);
    assert_eq!(
        r.header("retry-after"),
        Some(u64::MAX.to_string().as_str()),
        "{r:?}"
    );
}

/// With `hold_until_body_end`, a request holds its lock until its body has
/// gone out: that is the hold `RetryAfter::Observed` averages (3 s of body
/// after an instant head: `3`, not `1`).
#[tokio::test(start_paused = true)]
async fn retry_after_observed_counts_a_body_held_under_the_lock() {
    let locker = Locker::builder(MemoryStore::new())
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();
    let layer = LockLayer::builder(locker, KeyFrom::path_param::<u64>("id"))
        .namespace("streamed")
        .hold_until_body_end(true)
        .build()
        .unwrap();
    let app = Router::new().route(
        "/streamed/{id}",
        post(|| async {
            let chunks = futures_util::stream::iter([0u8, 1]).then(|i| async move {
                if i == 1 {
                    tokio::time::sleep(Duration::from_secs(3)).await;
                }
                Ok::<_, Infallible>(Bytes::from_static(b"chunk"))
            });
            Body::from_stream(chunks)
        })
        .route_layer(layer),
    );
    async fn refused_after(app: &Router) -> String {
        let holder = spawn_send(app, post_to("/streamed/1"));
        tokio::time::sleep(Duration::from_millis(10)).await;
        let r = send(app, post_to("/streamed/1")).await;
        assert_eq!(r.status, StatusCode::CONFLICT, "{r:?}");
        assert_eq!(join(holder).await.status, StatusCode::OK);
        r.header("retry-after").unwrap().to_owned()
    }
    assert_eq!(refused_after(&app).await, "30");
    // Let the background release of the first hold run.
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(refused_after(&app).await, "3");
}
