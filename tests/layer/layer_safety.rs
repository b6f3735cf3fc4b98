//! The layer never fails open, never stores or streams outside its lock what
//! it should not, and replays byte- and meaning-identical answers:
//!
//! - a path-parameter layer outside routing (around a whole `Router`) answers
//!   400 and never runs a handler unlocked; an idempotent layer needs an
//!   explicit namespace (no records shared between routes, none lost to a
//!   renamed route);
//! - a response body over the stored-body limit is streamed under the lock
//!   and recorded only once it has ended cleanly;
//! - replays keep the representation headers (`Content-Encoding` …) and
//!   the trailers, and records of the previous format still replay;
//! - durations that would overflow on the request path are refused by the
//!   builder;
//! - a re-entered hold is given back when the inner service fails or its
//!   future is dropped.
//!
//! Layer behaviour runs on the memory store; whatever claims a record stored
//! in Redis runs on a real `redis-server` from the test support too.

use crate::support;

use support::RedisServer;
use support::eventually;
use support::http::{Gate, Reply, join, read};

use std::collections::VecDeque;
use std::fmt::Debug;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::response::Response;
use axum::routing::post;
use bytes::Bytes;
use http::header::{CONTENT_ENCODING, CONTENT_LANGUAGE, CONTENT_TYPE};
use http::{HeaderMap, HeaderName, HeaderValue, Request, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use tokio::sync::mpsc;
use tokio::time::timeout;
use tower::{Layer, Service, ServiceExt};
use tower_redis_lock::layer::MAX_RETENTION;
use tower_redis_lock::{
    Idempotency, KeyFrom, LockKey, LockLayer, LockStore, Locker, MemoryStore, OnMissingKey, Record,
    RedisStore,
};

/// Upper bound on every wait for a condition; reached only on failure.
const LIMIT: Duration = Duration::from_secs(10);
const KEY_HEADER: HeaderName = HeaderName::from_static("idempotency-key");
const X_CHECKSUM: HeaderName = HeaderName::from_static("x-checksum");

/// `gzip` of `hello`.
const HELLO_GZ: &[u8] = &[
    0x1f, 0x8b, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0xcb, 0x48, 0xcd, 0xc9, 0xc9, 0x07,
    0x00, 0x86, 0xa6, 0x10, 0x36, 0x05, 0x00, 0x00, 0x00,
];

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// Sends `req` through any service and reads the answer.
async fn call<S, B>(svc: &S, req: Request<Body>) -> Reply
where
    S: Service<Request<Body>, Response = http::Response<B>> + Clone,
    S::Error: Debug,
    B: http_body::Body<Data = Bytes>,
    B::Error: Debug,
{
    let res = timeout(LIMIT, svc.clone().oneshot(req))
        .await
        .expect("no answer")
        .unwrap();
    read(res).await
}

/// A response with its body read frame by frame, trailers kept; a body
/// error is kept too instead of failing the test.
#[derive(Debug)]
struct Full {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
    trailers: Option<HeaderMap>,
    failed: bool,
}

async fn read_full<B>(res: http::Response<B>) -> Full
where
    B: http_body::Body<Data = Bytes>,
{
    let (parts, body) = res.into_parts();
    let mut body = std::pin::pin!(body);
    let mut data = Vec::new();
    let mut trailers = None;
    let mut failed = false;
    while let Some(frame) = timeout(LIMIT, body.frame())
        .await
        .expect("the body did not end")
    {
        match frame {
            Ok(frame) => match frame.into_data() {
                Ok(d) => data.extend_from_slice(&d),
                Err(frame) => trailers = frame.into_trailers().ok(),
            },
            Err(_) => {
                failed = true;
                break;
            }
        }
    }
    Full {
        status: parts.status,
        headers: parts.headers,
        body: Bytes::from(data),
        trailers,
        failed,
    }
}

fn replayed(headers: &HeaderMap) -> bool {
    headers
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true")
}

fn keyed(uri: &str, key: &str) -> Request<Body> {
    Request::post(uri)
        .header(KEY_HEADER, key)
        .body(Body::empty())
        .unwrap()
}

/// Whether `key` is free: a probe takes it and gives it back.
async fn is_free<St: LockStore + Clone>(store: &St, key: &LockKey) -> bool {
    match Locker::new(store.clone()).try_acquire(key).await {
        Ok(guard) => {
            guard.release().await.unwrap();
            true
        }
        Err(_) => false,
    }
}

async fn record<St: LockStore>(store: &St, ns: &str, id: &str) -> Option<Record> {
    let key = LockKey::new(ns, id).unwrap();
    let raw = store.read_record(&key).await.unwrap()?;
    Some(Record::decode(raw).expect("a record this version reads"))
}

fn redis() -> (RedisStore, RedisServer) {
    support::stores::redis()
}

/// Counts a handler's runs, and how many ran at once at most.
#[derive(Clone, Default)]
struct Runs {
    runs: Arc<AtomicUsize>,
    inside: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
}

impl Runs {
    fn enter(&self) {
        self.runs.fetch_add(1, Ordering::SeqCst);
        let now = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
    }
    fn leave(&self) {
        self.inside.fetch_sub(1, Ordering::SeqCst);
    }
    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }
    fn most(&self) -> usize {
        self.most.load(Ordering::SeqCst)
    }
}

/// `POST /orders/{id}`: counts its runs and waits at the gate.
fn orders(runs: Runs, gate: Gate) -> Router {
    Router::new().route(
        "/orders/{id}",
        post(move || {
            let (runs, gate) = (runs.clone(), gate.clone());
            async move {
                runs.enter();
                gate.pass().await;
                runs.leave();
                "done"
            }
        }),
    )
}

fn path_param_layer(store: &MemoryStore) -> LockLayer<MemoryStore> {
    LockLayer::builder(
        Locker::new(store.clone()),
        KeyFrom::path_param::<String>("id"),
    )
    .namespace("orders")
    .build()
    .unwrap()
}

/// Counts error-level events whose message mentions `needle`.
struct CountErrors {
    needle: &'static str,
    seen: Arc<AtomicUsize>,
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for CountErrors {
    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn Debug) {
                if field.name() == "message" {
                    self.0 = format!("{value:?}");
                }
            }
        }
        if *event.metadata().level() != tracing::Level::ERROR {
            return;
        }
        let mut m = Message(String::new());
        event.record(&mut m);
        if m.0.contains(self.needle) {
            self.seen.fetch_add(1, Ordering::SeqCst);
        }
    }
}

// ---------------------------------------------------------------------------
// 2. A path-parameter layer outside routing
// ---------------------------------------------------------------------------

// Current-thread: the counting subscriber is set for this thread only.
#[tokio::test(flavor = "current_thread")]
async fn a_path_param_layer_around_a_whole_router_refuses_and_never_runs_a_handler() {
    use tracing_subscriber::layer::SubscriberExt;
    let logged = Arc::new(AtomicUsize::new(0));
    let subscriber = tracing_subscriber::registry().with(CountErrors {
        needle: "misplaced",
        seen: logged.clone(),
    });
    let _log = tracing::subscriber::set_default(subscriber);

    let store = MemoryStore::new();
    let runs = Runs::default();
    // (No one waits at this gate: a handler that ran would pass at once.)
    let gate = Gate::new().0;
    // The layer sees every request before the router has matched it.
    let app = tower::ServiceBuilder::new()
        .layer(path_param_layer(&store))
        .service(orders(runs.clone(), gate));
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { call(&app, keyed("/orders/1", "-")).await })
        })
        .collect();
    for task in tasks {
        let r = join(task).await;
        let p = r.problem(StatusCode::BAD_REQUEST);
        let detail = p["detail"].as_str().unwrap();
        assert!(detail.contains("route_layer"), "{detail}");
        assert!(detail.contains("outside routing"), "{detail}");
        assert!(!r.headers.contains_key("fencing-token"));
    }
    assert_eq!(logged.load(Ordering::SeqCst), 1, "logged once per layer");
    // And the same through `Layer::layer` on the router, the other spelling
    // (another layer: logged once more).
    let app = path_param_layer(&store).layer(orders(runs.clone(), Gate::new().0));
    for _ in 0..2 {
        call(&app, keyed("/orders/2", "-"))
            .await
            .problem(StatusCode::BAD_REQUEST);
    }
    assert_eq!(logged.load(Ordering::SeqCst), 2, "logged once per layer");
    assert_eq!(runs.runs(), 0, "a handler ran outside the lock");
    assert_eq!(store.held_count(), 0);
}

#[tokio::test]
async fn on_the_routes_the_same_layer_serialises_the_handler() {
    let store = MemoryStore::new();
    let runs = Runs::default();
    let (gate, mut gates) = Gate::new();
    let app = orders(runs.clone(), gate).layer(path_param_layer(&store));
    let first = {
        let app = app.clone();
        tokio::spawn(async move { call(&app, keyed("/orders/1", "-")).await })
    };
    let open = gates.started().await;
    let others: Vec<_> = (0..3)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { call(&app, keyed("/orders/1", "-")).await })
        })
        .collect();
    for task in others {
        join(task).await.problem(StatusCode::CONFLICT);
    }
    open.send(()).unwrap();
    let first = join(first).await;
    assert_eq!(first.status, StatusCode::OK);
    assert!(first.headers.contains_key("fencing-token"));
    assert_eq!(runs.runs(), 1);
    assert_eq!(runs.most(), 1);
    // A request that matches no route reaches a `Router::layer` without a
    // route: refused, not let through.
    let r = call(&app, keyed("/nope", "-")).await;
    r.problem(StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn passing_through_outside_routing_is_an_explicit_choice() {
    let store = MemoryStore::new();
    let runs = Runs::default();
    let layer = LockLayer::builder(
        Locker::new(store.clone()),
        KeyFrom::path_param::<String>("id"),
    )
    .namespace("orders")
    .on_missing_key(OnMissingKey::PassThrough)
    .build()
    .unwrap();
    let app = layer.layer(orders(runs.clone(), Gate::new().0));
    let r = call(&app, keyed("/orders/1", "-")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(
        !r.headers.contains_key("fencing-token"),
        "ran unlocked, as asked"
    );
    assert_eq!(runs.runs(), 1);
}

#[tokio::test]
async fn an_idempotent_layer_needs_an_explicit_namespace() {
    let store = MemoryStore::new();
    let runs = Runs::default();
    let builder = || {
        LockLayer::builder(Locker::new(store.clone()), KeyFrom::header(KEY_HEADER))
            .idempotent(Idempotency::new())
    };
    // Records outlive deploys: a default namespace (the route template)
    // would change with the route, and outside routing there is none.
    let err = builder().build().unwrap_err();
    assert_eq!(err.setting(), "namespace", "{err}");
    let layer = |ns: &str| builder().namespace(ns).build().unwrap();
    // Two routes, one idempotency key.
    let two_routes = |orders: Option<&str>, refunds: Option<&str>| {
        let (o, r) = (runs.clone(), runs.clone());
        let orders_route = post(move || async move {
            o.enter();
            o.leave();
            "order"
        });
        let refunds_route = post(move || async move {
            r.enter();
            r.leave();
            "refund"
        });
        Router::new()
            .route(
                "/orders/{id}",
                match orders {
                    Some(ns) => orders_route.route_layer(layer(ns)),
                    None => orders_route,
                },
            )
            .route(
                "/refunds/{id}",
                match refunds {
                    Some(ns) => refunds_route.route_layer(layer(ns)),
                    None => refunds_route,
                },
            )
    };

    // One namespace around both routes: locks and replays (the key is the
    // client's to scope; the namespace says so on purpose).
    let app = layer("pay").layer(two_routes(None, None));
    let r = call(&app, keyed("/orders/1", "k")).await;
    assert_eq!((r.status, r.text().as_str()), (StatusCode::OK, "order"));
    let again = call(&app, keyed("/orders/1", "k")).await;
    assert!(replayed(&again.headers));
    assert_eq!(runs.runs(), 1);

    // A namespace per route: no cross-replay.
    let app = two_routes(Some("orders"), Some("refunds"));
    let order = call(&app, keyed("/orders/1", "k")).await;
    let refund = call(&app, keyed("/refunds/1", "k")).await;
    assert_eq!(order.text(), "order");
    assert_eq!(refund.text(), "refund");
    assert!(!replayed(&refund.headers));
}

// ---------------------------------------------------------------------------
// 5 and 10. Streaming bodies, representation headers, trailers
// ---------------------------------------------------------------------------

type Chunks = mpsc::UnboundedReceiver<Result<Frame<Bytes>, std::io::Error>>;

/// `POST /s`: answers 200 with the next queued body (each a channel of
/// frames fed by the test), or with `again` when none is queued; counts its
/// runs.
#[derive(Clone, Default)]
struct Streams {
    queue: Arc<Mutex<VecDeque<(HeaderMap, Chunks)>>>,
    runs: Arc<AtomicUsize>,
}

impl Streams {
    /// Queues a body for the next run; the test feeds it with the sender.
    fn next(
        &self,
        headers: HeaderMap,
    ) -> mpsc::UnboundedSender<Result<Frame<Bytes>, std::io::Error>> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.queue.lock().unwrap().push_back((headers, rx));
        tx
    }

    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }
}

async fn stream_handler(State(s): State<Streams>) -> Response {
    s.runs.fetch_add(1, Ordering::SeqCst);
    let Some((headers, rx)) = s.queue.lock().unwrap().pop_front() else {
        return Response::new(Body::from("again"));
    };
    let frames =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|f| (f, rx)) });
    let mut res = Response::new(Body::new(StreamBody::new(frames)));
    *res.headers_mut() = headers;
    res
}

fn stream_app<St: LockStore + Clone>(store: &St, ns: &str, idem: Idempotency) -> (Router, Streams) {
    let streams = Streams::default();
    let layer = LockLayer::builder(Locker::new(store.clone()), KeyFrom::header(KEY_HEADER))
        .namespace(ns)
        .idempotent(idem)
        .build()
        .unwrap();
    let app = Router::new()
        .route("/s", post(stream_handler).route_layer(layer))
        .with_state(streams.clone());
    (app, streams)
}

fn data(b: &'static [u8]) -> Result<Frame<Bytes>, std::io::Error> {
    Ok(Frame::data(Bytes::from_static(b)))
}

fn trailers(checksum: &'static str) -> Result<Frame<Bytes>, std::io::Error> {
    let mut t = HeaderMap::new();
    t.insert(X_CHECKSUM, HeaderValue::from_static(checksum));
    Ok(Frame::trailers(t))
}

macro_rules! on_memory_and_redis {
    ($($name:ident),* $(,)?) => {
        mod memory_store {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name(&tower_redis_lock::MemoryStore::new()).await;
                }
            )*
        }
        mod redis_store {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let (store, _server) = super::redis();
                    super::$name(&store).await;
                }
            )*
        }
    };
}

on_memory_and_redis!(
    an_over_limit_body_that_fails_is_not_stored,
    an_over_limit_body_is_streamed_under_the_lock,
    an_over_limit_body_whose_client_left_is_not_stored,
    replays_keep_content_encoding_and_bytes,
    trailers_reach_the_client_and_the_replay,
);

async fn an_over_limit_body_that_fails_is_not_stored<St: LockStore + Clone>(store: &St) {
    let (app, streams) = stream_app(store, "fail", Idempotency::new().max_stored_body(4));
    let tx = streams.next(HeaderMap::new());
    tx.send(data(b"0123456789")).unwrap();
    tx.send(Err(std::io::Error::other("the disk went away")))
        .unwrap();
    drop(tx);
    let first = read_full(app.clone().oneshot(keyed("/s", "k")).await.unwrap()).await;
    assert_eq!(first.status, StatusCode::OK);
    assert!(first.failed, "the client sees the body fail: {first:?}");
    assert_eq!(&first.body[..], b"0123456789");

    let key = LockKey::new("fail", "k").unwrap();
    assert!(
        eventually(LIMIT, async || is_free(store, &key).await).await,
        "the key stayed locked"
    );
    assert_eq!(
        record(store, "fail", "k").await,
        None,
        "a failed answer was stored"
    );
    // The next delivery runs the handler again.
    let again = read_full(app.clone().oneshot(keyed("/s", "k")).await.unwrap()).await;
    assert!(!replayed(&again.headers), "{again:?}");
    assert_eq!(&again.body[..], b"again");
    assert_eq!(streams.runs(), 2);
}

async fn an_over_limit_body_is_streamed_under_the_lock<St: LockStore + Clone>(store: &St) {
    let (app, streams) = stream_app(store, "big", Idempotency::new().max_stored_body(4));
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    headers.insert(CONTENT_ENCODING, HeaderValue::from_static("identity"));
    let tx = streams.next(headers);
    tx.send(data(b"0123456789")).unwrap();
    let res = app.clone().oneshot(keyed("/s", "k")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let mut body = res.into_body();
    let frame = timeout(LIMIT, body.frame())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(frame.into_data().unwrap(), "0123456789");

    // The body is still flowing: the lock is held, no record yet.
    let dup = read_full(app.clone().oneshot(keyed("/s", "k")).await.unwrap()).await;
    assert_eq!(dup.status, StatusCode::CONFLICT, "{dup:?}");
    assert!(!replayed(&dup.headers));
    assert_eq!(record(store, "big", "k").await, None);

    tx.send(data(b"abc")).unwrap();
    drop(tx);
    let rest = timeout(LIMIT, body.collect()).await.unwrap().unwrap();
    assert_eq!(&rest.to_bytes()[..], b"abc");

    // Once the client has seen the end, the record is there: no waiting.
    let replay = read_full(app.clone().oneshot(keyed("/s", "k")).await.unwrap()).await;
    assert!(replayed(&replay.headers), "{replay:?}");
    assert_eq!(replay.status, StatusCode::OK);
    assert!(replay.body.is_empty());
    assert_eq!(replay.headers[CONTENT_TYPE], "text/plain");
    // No coding of bytes that are not there.
    assert!(!replay.headers.contains_key(CONTENT_ENCODING), "{replay:?}");
    let stored = record(store, "big", "k").await.unwrap();
    assert!(stored.body_omitted());
    assert_eq!(streams.runs(), 1);
}

async fn an_over_limit_body_whose_client_left_is_not_stored<St: LockStore + Clone>(store: &St) {
    let (app, streams) = stream_app(store, "gone", Idempotency::new().max_stored_body(4));
    let tx = streams.next(HeaderMap::new());
    tx.send(data(b"0123456789")).unwrap();
    let res = app.clone().oneshot(keyed("/s", "k")).await.unwrap();
    let mut body = res.into_body();
    timeout(LIMIT, body.frame())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    drop(body); // the client went away mid-body
    let key = LockKey::new("gone", "k").unwrap();
    assert!(
        eventually(LIMIT, async || is_free(store, &key).await).await,
        "the key stayed locked"
    );
    assert_eq!(record(store, "gone", "k").await, None);
    let again = read_full(app.clone().oneshot(keyed("/s", "k")).await.unwrap()).await;
    assert_eq!(&again.body[..], b"again");
    assert_eq!(streams.runs(), 2);
    drop(tx);
}

async fn replays_keep_content_encoding_and_bytes<St: LockStore + Clone>(store: &St) {
    // Default settings: no replay_headers given.
    let (app, streams) = stream_app(store, "gz", Idempotency::new());
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    headers.insert(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    headers.insert(CONTENT_LANGUAGE, HeaderValue::from_static("de"));
    headers.insert("x-other", HeaderValue::from_static("not kept"));
    let tx = streams.next(headers);
    tx.send(data(HELLO_GZ)).unwrap();
    drop(tx);
    let first = read_full(app.clone().oneshot(keyed("/s", "k")).await.unwrap()).await;
    let replay = read_full(app.clone().oneshot(keyed("/s", "k")).await.unwrap()).await;
    assert!(replayed(&replay.headers), "{replay:?}");
    assert_eq!(replay.status, first.status);
    assert_eq!(&first.body[..], HELLO_GZ);
    assert_eq!(replay.body, first.body, "bytes differ");
    for name in [CONTENT_TYPE, CONTENT_ENCODING, CONTENT_LANGUAGE] {
        assert_eq!(
            replay.headers.get(&name),
            first.headers.get(&name),
            "{name} differs: {replay:?}"
        );
    }
    assert!(!replay.headers.contains_key("x-other"));
    assert_eq!(streams.runs(), 1);
}

async fn trailers_reach_the_client_and_the_replay<St: LockStore + Clone>(store: &St) {
    // (key, stored-body limit): the body stored whole, and over the limit.
    for (key, max) in [("whole", 1024), ("over", 2)] {
        let (app, streams) = stream_app(store, "tr", Idempotency::new().max_stored_body(max));
        let tx = streams.next(HeaderMap::new());
        tx.send(data(b"abc")).unwrap();
        tx.send(trailers("c-1")).unwrap();
        drop(tx);
        let first = read_full(app.clone().oneshot(keyed("/s", key)).await.unwrap()).await;
        assert_eq!(&first.body[..], b"abc", "{key}");
        let t = first
            .trailers
            .as_ref()
            .expect("the live answer lost its trailers");
        assert_eq!(t[X_CHECKSUM], "c-1", "{key}");

        let replay = read_full(app.clone().oneshot(keyed("/s", key)).await.unwrap()).await;
        assert!(replayed(&replay.headers), "{key}: {replay:?}");
        let t = replay
            .trailers
            .as_ref()
            .expect("the replay has no trailers");
        assert_eq!(t[X_CHECKSUM], "c-1", "{key}");
        let stored = record(store, "tr", key).await.unwrap();
        assert_eq!(
            stored.trailers(),
            [(X_CHECKSUM, HeaderValue::from_static("c-1"))]
        );
        assert_eq!(stored.body_omitted(), max < 3, "{key}");
        assert_eq!(streams.runs(), 1, "{key}");
    }
}

/// The format-1 blob of a record (before trailers were stored): magic,
/// status, flags, time, header count and fields, body.
fn v1_blob(status: u16, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut b = b"TRL1".to_vec();
    b.extend_from_slice(&status.to_be_bytes());
    b.push(0); // no flags: body kept, no fingerprint
    b.extend_from_slice(&1_700_000_000_000u64.to_be_bytes());
    b.extend_from_slice(&(headers.len() as u16).to_be_bytes());
    for (name, value) in headers {
        b.extend_from_slice(&(name.len() as u16).to_be_bytes());
        b.extend_from_slice(name.as_bytes());
        b.extend_from_slice(&(value.len() as u32).to_be_bytes());
        b.extend_from_slice(value.as_bytes());
    }
    b.extend_from_slice(&(body.len() as u32).to_be_bytes());
    b.extend_from_slice(body);
    b
}

#[test]
fn a_record_of_the_previous_format_decodes_without_trailers() {
    let blob = v1_blob(201, &[("content-type", "application/json")], b"{\"a\":1}");
    let r = Record::decode(Bytes::from(blob.clone())).expect("format 1 is still read");
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(
        r.headers(),
        [(CONTENT_TYPE, HeaderValue::from_static("application/json"))]
    );
    assert_eq!(&r.body()[..], b"{\"a\":1}");
    assert!(r.trailers().is_empty());
    assert_eq!(
        r.created_at(),
        std::time::UNIX_EPOCH + Duration::from_millis(1_700_000_000_000)
    );
    // Cut anywhere, extended, or of an unknown format: refused, no panic.
    for n in 0..blob.len() {
        assert_eq!(Record::decode(Bytes::copy_from_slice(&blob[..n])), None);
    }
    let mut longer = blob.clone();
    longer.push(0);
    assert_eq!(Record::decode(Bytes::from(longer)), None);
    let mut future = blob;
    future[3] = b'9';
    assert_eq!(Record::decode(Bytes::from(future)), None);
    // A huge field count with nothing behind it: refused, no allocation.
    let mut count = b"TRL2".to_vec();
    count.extend_from_slice(&[0, 200, 0]);
    count.extend_from_slice(&0u64.to_be_bytes());
    count.extend_from_slice(&[0xff, 0xff]);
    assert_eq!(Record::decode(Bytes::from(count)), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_of_the_previous_format_in_redis_replay_or_are_refused_cleanly() {
    let (store, server) = redis();
    let (app, streams) = stream_app(&store, "old", Idempotency::new());
    let client = tower_redis_lock::redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let put = async |conn: &mut tower_redis_lock::redis::aio::MultiplexedConnection,
                     id: &str,
                     blob: Vec<u8>| {
        let key = store.record_key(&LockKey::new("old", id).unwrap());
        let _: () = tower_redis_lock::redis::cmd("SET")
            .arg(key)
            .arg(blob)
            .arg("PX")
            .arg(60_000)
            .query_async(conn)
            .await
            .unwrap();
    };
    put(
        &mut conn,
        "v1",
        v1_blob(201, &[("content-type", "application/json")], b"{\"a\":1}"),
    )
    .await;
    let replay = read_full(app.clone().oneshot(keyed("/s", "v1")).await.unwrap()).await;
    assert!(replayed(&replay.headers), "{replay:?}");
    assert_eq!(replay.status, StatusCode::CREATED);
    assert_eq!(replay.headers[CONTENT_TYPE], "application/json");
    assert_eq!(&replay.body[..], b"{\"a\":1}");
    assert!(replay.trailers.is_none());

    // Unknown or damaged: a clean 500, the handler not run, no replay.
    let mut unknown = v1_blob(200, &[], b"x");
    unknown[3] = b'9';
    put(&mut conn, "v9", unknown).await;
    let mut cut = v1_blob(200, &[], b"xyz");
    cut.pop();
    put(&mut conn, "cut", cut).await;
    for id in ["v9", "cut"] {
        let r = call(&app, keyed("/s", id)).await;
        r.problem(StatusCode::INTERNAL_SERVER_ERROR);
    }
    assert_eq!(streams.runs(), 0);
}

// ---------------------------------------------------------------------------
// 9. Durations that would overflow on the request path
// ---------------------------------------------------------------------------

#[tokio::test]
async fn retention_past_the_bound_is_refused_by_the_builder() {
    let store = MemoryStore::new();
    let build = |retention: Duration| {
        LockLayer::builder(Locker::new(store.clone()), KeyFrom::header(KEY_HEADER))
            .namespace("ret")
            .idempotent(Idempotency::new().retention(retention))
            .build()
    };
    for bad in [Duration::MAX, MAX_RETENTION + Duration::from_millis(1)] {
        let err = build(bad).expect_err("an overflowing retention was accepted");
        assert!(err.to_string().contains("retention"), "{err}");
    }
    // The bound itself works on the request path, on memory and on Redis.
    let layer = build(MAX_RETENTION).unwrap();
    let app = Router::new().route("/r", post(|| async { "ok" }).route_layer(layer));
    assert_eq!(call(&app, keyed("/r", "k")).await.status, StatusCode::OK);
    assert!(replayed(&call(&app, keyed("/r", "k")).await.headers));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_longest_retention_stores_in_redis() {
    let (store, server) = redis();
    let layer = LockLayer::builder(Locker::new(store.clone()), KeyFrom::header(KEY_HEADER))
        .namespace("ret")
        .idempotent(Idempotency::new().retention(MAX_RETENTION))
        .build()
        .unwrap();
    let app = Router::new().route("/r", post(|| async { "ok" }).route_layer(layer));
    assert_eq!(call(&app, keyed("/r", "k")).await.status, StatusCode::OK);
    let key = store.record_key(&LockKey::new("ret", "k").unwrap());
    let ttl = server.cmd(&["PTTL", &key]).as_int().unwrap();
    assert!(ttl > 364 * 24 * 3600 * 1000, "record TTL {ttl} ms");
    assert!(replayed(&call(&app, keyed("/r", "k")).await.headers));
}

/// The default retention outlasts the flagship senders' retries: Stripe
/// retries for 3 days, GitHub redelivers the last 3 days.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_default_record_outlasts_three_days_of_retries() {
    let (store, server) = redis();
    let layer = LockLayer::builder(Locker::new(store.clone()), KeyFrom::header(KEY_HEADER))
        .namespace("ret")
        .idempotent(Idempotency::new())
        .build()
        .unwrap();
    let app = Router::new().route("/r", post(|| async { "ok" }).route_layer(layer));
    assert_eq!(call(&app, keyed("/r", "d")).await.status, StatusCode::OK);
    let key = store.record_key(&LockKey::new("ret", "d").unwrap());
    let ttl = server.cmd(&["PTTL", &key]).as_int().unwrap();
    assert!(ttl > 3 * 24 * 3600 * 1000, "record TTL {ttl} ms");
}

// ---------------------------------------------------------------------------
// Re-entry: the extra hold is given back on error and on drop
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_reentered_hold_is_given_back_when_the_inner_service_fails() {
    let store = MemoryStore::new();
    let layer = || {
        LockLayer::builder(Locker::new(store.clone()), KeyFrom::header(KEY_HEADER))
            .namespace("re")
            .build()
            .unwrap()
    };
    let svc = tower::ServiceBuilder::new()
        .layer(layer())
        .layer(layer())
        .service(tower::service_fn(|_req: Request<Body>| async {
            Err::<http::Response<Body>, _>(std::io::Error::other("inner failed"))
        }));
    let err = svc.clone().oneshot(keyed("/x", "k")).await.unwrap_err();
    assert_eq!(err.to_string(), "inner failed");
    let key = LockKey::new("re", "k").unwrap();
    assert!(eventually(LIMIT, async || !store.is_locked(&key)).await);
    assert_eq!(store.held_count(), 0);
}

#[tokio::test]
async fn a_reentered_hold_is_given_back_when_the_request_is_dropped() {
    let store = MemoryStore::new();
    let (gate, mut gates) = Gate::new();
    let layer = || {
        LockLayer::builder(
            Locker::new(store.clone()),
            KeyFrom::path_param::<String>("id"),
        )
        .namespace("re")
        .build()
        .unwrap()
    };
    let app = orders(Runs::default(), gate).layer(layer()).layer(layer());
    let task = {
        let app = app.clone();
        tokio::spawn(async move { call(&app, keyed("/orders/1", "-")).await })
    };
    let _open = gates.started().await;
    task.abort(); // the client went away while the handler ran
    let key = LockKey::new("re", "1").unwrap();
    assert!(
        eventually(LIMIT, async || !store.is_locked(&key)).await,
        "the nested hold kept the lock"
    );
}

/// Two layers on one key: an outer one on the router, an inner idempotent
/// one on the route.
fn nested_idempotent(store: &MemoryStore, outer_idempotent: bool, runs: Runs) -> Router {
    let outer = LockLayer::builder(Locker::new(store.clone()), KeyFrom::header(KEY_HEADER))
        .namespace("pay");
    let outer = if outer_idempotent {
        outer.idempotent(Idempotency::new())
    } else {
        outer
    };
    let inner = LockLayer::builder(Locker::new(store.clone()), KeyFrom::header(KEY_HEADER))
        .namespace("pay")
        .idempotent(Idempotency::new())
        .build()
        .unwrap();
    Router::new()
        .route(
            "/pay",
            post(move || async move {
                runs.enter();
                runs.leave();
                "paid"
            })
            .route_layer(inner),
        )
        .layer(outer.build().unwrap())
}

#[tokio::test]
async fn an_idempotent_layer_inside_a_plain_lock_on_the_same_key_refuses() {
    let store = MemoryStore::new();
    let runs = Runs::default();
    let app = nested_idempotent(&store, false, runs.clone());
    for _ in 0..2 {
        let r = call(&app, keyed("/pay", "k")).await;
        let p = r.problem(StatusCode::INTERNAL_SERVER_ERROR);
        assert!(p["detail"].as_str().unwrap().contains("nested"), "{p}");
    }
    assert_eq!(runs.runs(), 0, "the handler ran without idempotency");
    assert!(eventually(LIMIT, async || store.held_count() == 0).await);

    // Both idempotent: the outer one checks and stores, the inner re-enters.
    let runs = Runs::default();
    let app = nested_idempotent(&store, true, runs.clone());
    let first = call(&app, keyed("/pay", "k2")).await;
    assert_eq!(
        (first.status, first.text().as_str()),
        (StatusCode::OK, "paid")
    );
    let again = call(&app, keyed("/pay", "k2")).await;
    assert!(replayed(&again.headers), "{again:?}");
    assert_eq!(again.text(), "paid");
    assert_eq!(runs.runs(), 1);
}

#[tokio::test]
async fn a_locker_wait_past_the_bound_is_refused_by_the_layer_builder() {
    let store = MemoryStore::new();
    for wait in [Duration::MAX, Duration::from_secs(24 * 3600 + 1)] {
        // (If the locker builder refuses it already, so much the better.)
        let Ok(locker) = Locker::builder(store.clone()).wait_timeout(wait).build() else {
            continue;
        };
        let err = LockLayer::builder(locker, KeyFrom::header(KEY_HEADER))
            .namespace("w")
            .build()
            .expect_err("a wait that overflows on the request path was accepted");
        assert!(err.to_string().contains("wait_timeout"), "{err}");
    }
    let locker = Locker::builder(store.clone())
        .wait_timeout(Duration::from_secs(24 * 3600))
        .build()
        .unwrap();
    let layer = LockLayer::builder(locker, KeyFrom::header(KEY_HEADER))
        .namespace("w")
        .build()
        .unwrap();
    let app = Router::new().route("/w", post(|| async { "ok" }).route_layer(layer));
    assert_eq!(call(&app, keyed("/w", "k")).await.status, StatusCode::OK);
}

// ---------------------------------------------------------------------------
// Keys: one spelling per id, two ids never one key, no repeated sources
// ---------------------------------------------------------------------------

/// A plain tower service (every path reaches it) that waits at the gate,
/// under a layer keyed by `key`.
fn gated_service(
    store: &MemoryStore,
    key: KeyFrom,
    gate: Gate,
) -> tower_redis_lock::layer::Lock<Plain, MemoryStore> {
    let layer = LockLayer::builder(Locker::new(store.clone()), key)
        .namespace("k")
        .build()
        .unwrap();
    layer.layer(Plain::new(tower::service_fn(move |_req: Request<Body>| {
        let gate = gate.clone();
        async move {
            gate.pass().await;
            Ok::<_, std::io::Error>(http::Response::new(Body::from("done")))
        }
    })))
}

type Plain = tower::util::BoxCloneSyncService<Request<Body>, http::Response<Body>, std::io::Error>;

/// Sends `a`, holds it in the handler, sends `b`: whether `b` was refused
/// as a holder of the same key (409) rather than run.
async fn same_key(store: &MemoryStore, key: KeyFrom, a: Request<Body>, b: Request<Body>) -> bool {
    let (gate, mut gates) = Gate::new();
    let svc = gated_service(store, key, gate);
    let first = {
        let svc = svc.clone();
        tokio::spawn(async move { call(&svc, a).await })
    };
    let open_first = gates.started().await;
    let second = {
        let svc = svc.clone();
        tokio::spawn(async move { call(&svc, b).await })
    };
    // Either the second is refused at once, or it reaches the handler.
    let shared = tokio::select! {
        r = second => {
            r.unwrap().problem(StatusCode::CONFLICT);
            true
        }
        open_second = gates.started() => {
            open_second.send(()).unwrap();
            false
        }
    };
    open_first.send(()).unwrap();
    assert_eq!(join(first).await.status, StatusCode::OK);
    shared
}

fn with_header(uri: &str, name: &'static str, values: &[&[u8]]) -> Request<Body> {
    let mut b = Request::post(uri);
    for v in values {
        b = b.header(name, HeaderValue::from_bytes(v).unwrap());
    }
    b.body(Body::empty()).unwrap()
}

#[tokio::test]
async fn two_ids_never_share_a_key_and_one_id_has_one_key() {
    let store = MemoryStore::new();
    let header = || KeyFrom::header(HeaderName::from_static("x-id"));
    // Bytes that are not UTF-8 are not folded into one replacement char.
    assert!(
        !same_key(
            &store,
            header(),
            with_header("/", "x-id", &[b"\xff"]),
            with_header("/", "x-id", &[b"\xfe"]),
        )
        .await,
        "two header ids shared a key"
    );
    // Spellings of one path share its key.
    assert!(
        same_key(
            &store,
            KeyFrom::path(),
            Request::post("/orders/1").body(Body::empty()).unwrap(),
            Request::post("//orders/%31").body(Body::empty()).unwrap(),
        )
        .await,
        "two spellings of one path got two keys"
    );
    assert_eq!(store.held_count(), 0);
}

/// The query key is the value the handler reads: `Query` decodes invalid
/// UTF-8 lossily, so `x%FF` and `x%FE` are one id `x\u{FFFD}` and must be
/// one lock (raw decoded bytes made them two: two runs at once).
#[tokio::test]
async fn query_ids_the_handler_reads_as_one_share_a_lock() {
    let store = MemoryStore::new();
    let post = |uri: &str| Request::post(uri).body(Body::empty()).unwrap();
    for (a, b) in [
        ("/?id=x%FF", "/?id=x%FE"),
        ("/?id=a+b", "/?id=a%20b"),
        ("/?id=%C3%A9", "/?i%64=%c3%a9"),
    ] {
        assert!(
            same_key(&store, KeyFrom::query::<String>("id"), post(a), post(b)).await,
            "{a} and {b} ran at once"
        );
    }
    assert!(
        same_key(
            &store,
            KeyFrom::query::<u64>("id"),
            post("/?id=7"),
            post("/?id=007")
        )
        .await,
        "two spellings of 7 ran at once"
    );
    assert!(
        !same_key(
            &store,
            KeyFrom::query::<String>("id"),
            post("/?id=7"),
            post("/?id=007")
        )
        .await,
        "two strings shared a lock"
    );
    assert_eq!(store.held_count(), 0);
}

#[tokio::test]
async fn a_key_source_given_twice_is_refused() {
    let store = MemoryStore::new();
    // (No one waits at the gate: a handler that ran would pass at once.)
    let svc = gated_service(
        &store,
        KeyFrom::header(HeaderName::from_static("x-id")),
        Gate::new().0,
    );
    let r = call(&svc, with_header("/", "x-id", &[b"a", b"b"])).await;
    let p = r.problem(StatusCode::BAD_REQUEST);
    assert!(
        p["detail"].as_str().unwrap().contains("more than once"),
        "{p}"
    );
    let svc = gated_service(&store, KeyFrom::query::<String>("id"), Gate::new().0);
    for uri in ["/?id=a&id=b", "/?id=a&x=1&id=a"] {
        let r = call(&svc, Request::post(uri).body(Body::empty()).unwrap()).await;
        r.problem(StatusCode::BAD_REQUEST);
    }
    assert_eq!(store.held_count(), 0);
}

/// A JSON request (`Content-Type: application/json`, as axum's `Json`
/// requires).
fn with_body(uri: &str, body: &'static str) -> Request<Body> {
    Request::post(uri)
        .header(CONTENT_TYPE, "application/json")
        .body(Body::from(body))
        .unwrap()
}

/// Sends each request to a layer keyed by `key` whose handler would pass at
/// once: each must be refused with 400 naming `reason`, no handler run, no
/// lock taken.
async fn refused(key: KeyFrom, requests: Vec<Request<Body>>, reason: &str) {
    let store = MemoryStore::new();
    let (gate, mut gates) = Gate::new();
    let svc = gated_service(&store, key, gate);
    for req in requests {
        let uri = req.uri().clone();
        let r = call(&svc, req).await;
        let p = r.problem(StatusCode::BAD_REQUEST);
        let detail = p["detail"].as_str().unwrap();
        assert!(detail.contains(reason), "{uri}: {p}");
        assert!(gates.none_started(), "{uri}: the handler ran");
    }
    assert_eq!(store.held_count(), 0);
}

#[tokio::test]
async fn spellings_of_one_path_share_a_key_and_ambiguous_paths_are_refused() {
    let store = MemoryStore::new();
    let path = |uri: &str| Request::post(uri).body(Body::empty()).unwrap();
    for (a, b) in [
        ("/raw/a", "/raw/%61"),
        ("/raw/a", "/raw//a"),
        ("/raw/%61", "/raw//a"),
        ("/raw/a", "/raw%2Fa"),
    ] {
        assert!(
            same_key(&store, KeyFrom::path(), path(a), path(b)).await,
            "{a} and {b} got two keys"
        );
    }
    for (a, b) in [
        ("/raw/a", "/raw/b"),
        ("/raw/a", "/raw/a/"),
        ("/a%25zz", "/a%25zy"),
    ] {
        assert!(
            !same_key(&store, KeyFrom::path(), path(a), path(b)).await,
            "{a} and {b} shared a key"
        );
    }
    assert_eq!(store.held_count(), 0);
    let dots = [
        "/raw/./a",
        "/raw/%2e%2e/a",
        "/raw/.%2E/a",
        "/raw%2F..%2Fa",
        "/raw/a/..",
    ];
    refused(
        KeyFrom::path(),
        dots.map(path).into(),
        "`.` or `..` segment",
    )
    .await;
    let escapes = ["/raw/a%zz", "/raw/a%", "/raw/a%2"];
    refused(KeyFrom::path(), escapes.map(path).into(), "two hex digits").await;
    // Refused, not a missing key: passing through is no way around it.
    let store = MemoryStore::new();
    let layer = LockLayer::builder(Locker::new(store.clone()), KeyFrom::path())
        .namespace("k")
        .on_missing_key(OnMissingKey::PassThrough)
        .build()
        .unwrap();
    let svc = layer.layer(Plain::new(tower::service_fn(|_req: Request<Body>| async {
        Ok::<_, std::io::Error>(http::Response::new(Body::from("ran")))
    })));
    call(&svc, path("/raw/../a"))
        .await
        .problem(StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn json_ids_key_as_the_handler_reads_them_and_a_member_named_twice_is_refused() {
    let store = MemoryStore::new();
    let id = || KeyFrom::json_pointer::<String>("/id");
    let number = || KeyFrom::json_pointer::<f64>("/id");
    // Spellings of one value share its key.
    for (key, a, b) in [
        (id(), r#"{"id":"ab"}"#, r#"{"id":"a\u0062"}"#),
        (number(), r#"{"id":1.0}"#, r#"{"id":1e0}"#),
        (number(), r#"{"id":1}"#, r#"{"id":10e-1}"#),
        // One `f64` to the handler, so one lock.
        (
            number(),
            r#"{"id":1180591620717411303424}"#,
            r#"{"id":1180591620717411303425}"#,
        ),
    ] {
        assert!(
            same_key(&store, key, with_body("/", a), with_body("/", b)).await,
            "{a} and {b} got two keys"
        );
    }
    for (key, a, b) in [
        (id(), r#"{"id":"a"}"#, r#"{"id":"A"}"#),
        (number(), r#"{"id":1.5}"#, r#"{"id":1.5000000000000002}"#),
        (
            KeyFrom::json_pointer::<u128>("/id"),
            r#"{"id":1180591620717411303424}"#,
            r#"{"id":1180591620717411303425}"#,
        ),
    ] {
        assert!(
            !same_key(&store, key, with_body("/", a), with_body("/", b)).await,
            "{a} and {b} shared a key"
        );
    }
    assert_eq!(store.held_count(), 0);
    let twice = [
        r#"{"id":"a","id":"b"}"#,
        r#"{"id":"a","x":0,"id":"a"}"#,
        r#"{"\u0069d":"a","id":"b"}"#,
    ];
    refused(
        id(),
        twice.map(|b| with_body("/", b)).into(),
        "more than once",
    )
    .await;
    let nested = KeyFrom::json_pointer::<String>("/data/id");
    let twice = [r#"{"data":{"id":"a"},"data":{"id":"b"}}"#];
    refused(
        nested,
        twice.map(|b| with_body("/", b)).into(),
        "more than once",
    )
    .await;
    let not_json = [r#"{"id":"a"} x"#, r#"{"id":"a","x":[1,]}"#];
    refused(
        id(),
        not_json.map(|b| with_body("/", b)).into(),
        "not valid JSON",
    )
    .await;
}

/// A JSON id of another shape than the key's type is refused with the 422
/// axum's `Json` answers, out of range or not text with its 400: no
/// handler, and no store call.
#[tokio::test]
async fn a_json_id_the_handler_cannot_read_is_refused_as_json_refuses_it() {
    let string = || KeyFrom::json_pointer::<String>("/id");
    let int = || KeyFrom::json_pointer::<u64>("/id");
    let float = KeyFrom::json_pointer::<f64>("/id");
    for (key, bad, status, good) in [
        (string(), r#"{"id":7}"#, 422, r#"{"id":"7"}"#),
        (int(), r#"{"id":"7"}"#, 422, r#"{"id":7}"#),
        (int(), r#"{"id":7.0}"#, 422, r#"{"id":7}"#),
        (int(), r#"{"id":-1}"#, 422, r#"{"id":7}"#),
        (float, r#"{"id":1e400}"#, 400, r#"{"id":1e300}"#),
        (string(), r#"{"id":"\ud800"}"#, 400, r#"{"id":"a"}"#),
    ] {
        let store = MemoryStore::new();
        let (gate, mut gates) = Gate::new();
        let svc = gated_service(&store, key, gate);
        // The next store call fails (and uses the failure up).
        store.fail_next_calls(1);
        let r = call(&svc, with_body("/", bad)).await;
        r.problem(StatusCode::from_u16(status).unwrap());
        assert!(gates.none_started(), "{bad}: the handler ran");
        // Still armed: the refusal made no store call.
        let r = call(&svc, with_body("/", good)).await;
        r.problem(StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(store.held_count(), 0, "{bad}");
    }
}

/// A path parameter, query value or extractor input the handler's
/// extractor refuses gets that extractor's status as a problem answer,
/// even with `OnMissingKey::PassThrough`: no handler, and no store call.
#[tokio::test]
async fn a_head_value_the_handler_cannot_read_is_refused_before_any_store_call() {
    let extract = || {
        KeyFrom::extract(|axum::extract::Path((t, id)): axum::extract::Path<(String, u64)>| (t, id))
    };
    for (route, key, bad, good) in [
        (
            "/o/{id}",
            KeyFrom::path_param::<u64>("id"),
            "/o/seven",
            "/o/007",
        ),
        (
            "/o/{id}",
            KeyFrom::path_param::<String>("id"),
            "/o/%FF",
            "/o/x",
        ),
        ("/o", KeyFrom::query::<u64>("id"), "/o?id=-1", "/o?id=%37"),
        ("/o", KeyFrom::query::<u64>("id"), "/o?id=1&id=1", "/o?id=1"),
        ("/{t}/o/{id}", extract(), "/acme/o/x", "/acme/o/7"),
    ] {
        let store = MemoryStore::new();
        let runs = Runs::default();
        let layer = LockLayer::builder(Locker::new(store.clone()), key)
            .namespace("k")
            .on_missing_key(OnMissingKey::PassThrough)
            .build()
            .unwrap();
        let app = Router::new().route(
            route,
            post({
                let runs = runs.clone();
                move || async move {
                    runs.enter();
                    runs.leave();
                    "ran"
                }
            })
            .route_layer(layer),
        );
        // The next store call fails (and uses the failure up).
        store.fail_next_calls(1);
        call(&app, Request::post(bad).body(Body::empty()).unwrap())
            .await
            .problem(StatusCode::BAD_REQUEST);
        assert_eq!(runs.runs(), 0, "{bad}: the handler ran");
        // Still armed: the refusal made no store call.
        call(&app, Request::post(good).body(Body::empty()).unwrap())
            .await
            .problem(StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(runs.runs(), 0, "{good}: the handler ran");
    }
}

#[tokio::test]
async fn json_ids_reach_a_routed_handler_as_keyed() {
    let store = MemoryStore::new();
    // Ids of any JSON kind, read as the handler would read a `Value`.
    let id = KeyFrom::json_pointer::<serde_json::Value>("/id");
    let layer = LockLayer::builder(Locker::new(store.clone()), id)
        .namespace("j")
        .build()
        .unwrap();
    let runs = Runs::default();
    let app = Router::new().route(
        "/j",
        post({
            let runs = runs.clone();
            move || async move {
                runs.enter();
                runs.leave();
                "ok"
            }
        })
        .route_layer(layer),
    );
    for json in [
        r#"{"id":18446744073709551615}"#,
        r#"{"id":-7}"#,
        r#"{"id":"x"}"#,
        r#"{"id":12345678901234567890123}"#,
        r#"{"id":1.5}"#,
    ] {
        assert_eq!(
            call(&app, with_body("/j", json)).await.status,
            StatusCode::OK,
            "{json}"
        );
    }
    assert_eq!(runs.runs(), 5);
    let r = call(&app, with_body("/j", r#"{"id":"a","id":"b"}"#)).await;
    r.problem(StatusCode::BAD_REQUEST);
    assert_eq!(runs.runs(), 5);
}

/// axum's `Json` refuses a body whose `Content-Type` is not JSON (415). A
/// JSON-keyed layer refuses it the same, before any lock: keyed and locked,
/// the handler's 415 was stored by an idempotent layer as the event's
/// outcome, and the sender's corrected delivery got it replayed.
#[tokio::test]
async fn a_json_key_refuses_a_body_json_refuses_by_its_content_type_before_any_lock() {
    #[derive(serde::Deserialize)]
    struct Event {
        id: String,
    }
    let store = tower_redis_lock::MemoryStore::new();
    let layer = tower_redis_lock::LockLayer::builder(
        tower_redis_lock::Locker::new(store.clone()),
        tower_redis_lock::KeyFrom::json_pointer::<String>("/id"),
    )
    .namespace("events")
    .idempotent(tower_redis_lock::Idempotency::new())
    .build()
    .unwrap();
    let app = Router::new().route(
        "/events",
        post(|axum::Json(e): axum::Json<Event>| async move { format!("applied {}", e.id) })
            .route_layer(layer),
    );
    let body = r#"{"id":"evt_1"}"#;
    for content_type in [None, Some("text/plain"), Some("application/jsonx")] {
        let mut req = Request::post("/events");
        if let Some(ct) = content_type {
            req = req.header(CONTENT_TYPE, ct);
        }
        let res = app
            .clone()
            .oneshot(req.body(Body::from(body)).unwrap())
            .await
            .unwrap();
        assert_eq!(
            res.status(),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "{content_type:?}"
        );
        assert_eq!(res.headers()[CONTENT_TYPE], "application/problem+json");
        assert_eq!(store.held_count(), 0);
    }
    for content_type in [
        "application/json",
        "application/vnd.api+json; charset=utf-8",
    ] {
        let res = app
            .clone()
            .oneshot(
                Request::post("/events")
                    .header(CONTENT_TYPE, content_type)
                    .body(Body::from(body))
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{content_type}");
    }
}
