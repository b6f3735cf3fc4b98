//! Idempotent processing in the layer, with a plain handler: which answers
//! are stored, what a replay carries, bodies over the stored-body limit,
//! fingerprints, and a holder that lost its lock.
//!
//! Every behaviour is written once, generic over the store, and run on the
//! memory store and on a real `redis-server` from the test support
//! (`on_every_store!`). What needs Redis itself (deleting a lock key under a
//! running handler) runs on Redis only.

use crate::support;
use support::stores::redis_name;

use support::http::{Reply, join, send, spawn_send};

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Query, State};
use axum::response::Response;
use axum::routing::post;
use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE, SET_COOKIE};
use http::{HeaderName, HeaderValue, Request, StatusCode};
use sha2::{Digest, Sha256};
use support::RedisServer;
use tokio::sync::{mpsc, oneshot};
use tokio::time::timeout;
use tower_redis_lock::{
    Fingerprint, Idempotency, KeyFrom, LockKey, LockLayer, LockStore, Locker, MemoryStore, Record,
    RedisStore,
};

/// Upper bound on every wait for a condition; reached only on failure.
const LIMIT: Duration = Duration::from_secs(10);
const KEY_HEADER: HeaderName = HeaderName::from_static("idempotency-key");
const X_RUN: HeaderName = HeaderName::from_static("x-run");
const X_TRACE: HeaderName = HeaderName::from_static("x-trace");

// ---------------------------------------------------------------------------
// Stores
// ---------------------------------------------------------------------------

/// A store, and the Redis server behind it (kept alive as long as the store).
struct Backend<St> {
    store: St,
    server: Option<RedisServer>,
}

fn memory() -> Backend<MemoryStore> {
    Backend {
        store: MemoryStore::new(),
        server: None,
    }
}

fn redis() -> Backend<RedisStore> {
    let server = RedisServer::start();
    Backend {
        store: RedisStore::from_url(&server.url()).unwrap(),
        server: Some(server),
    }
}

impl<St: LockStore + Clone> Backend<St> {
    /// The completed record of `ns:id`, decoded.
    async fn record(&self, ns: &str, id: &str) -> Option<Record> {
        let key = LockKey::new(ns, id).unwrap();
        let raw = self.store.read_record(&key).await.unwrap()?;
        Some(Record::decode(raw).expect("a record this version reads"))
    }
}

/// Runs each listed `async fn name(Backend<St>)` once per store.
macro_rules! on_every_store {
    ($($name:ident),* $(,)?) => {
        mod memory_store {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::memory()).await
                }
            )*
        }
        mod redis_store {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::redis()).await
                }
            )*
        }
    };
}

on_every_store!(
    repeated_and_framing_header_names_are_not_replayed,
    stored_statuses_follow_the_policy,
    replays_carry_the_chosen_headers_only,
    a_body_over_the_stored_limit_is_stored_as_status_only,
    fingerprints_refuse_or_ignore_a_different_body,
    an_in_flight_duplicate_gets_409_and_later_the_replay,
    a_response_body_that_fails_stores_nothing,
    keys_scoped_per_client_never_replay_another_clients_record,
    a_created_answer_is_replayed_with_where_and_what_it_created,
    a_json_fingerprint_ignores_whitespace_and_member_order_only,
    the_idempotency_key_header_follows_the_draft,
    a_json_fingerprint_tells_apart_what_the_handler_tells_apart,
    a_replay_without_its_body_has_no_validator_of_that_body,
);

// ---------------------------------------------------------------------------
// The handler
// ---------------------------------------------------------------------------

/// A plain handler that counts its runs. Query parameters:
///
/// * `status=N`: answer N (default 200);
/// * `len=N&chunk=M`: answer N bytes of [`pattern`], streamed M at a time
///   (default: `{"run": <run>}`);
/// * `fail`: the streamed body fails after its first chunk;
/// * `hold`: report through the gate channel and wait until let go.
///
/// Headers: `Content-Type: application/json`, `x-run: <run>`, `x-trace`,
/// two `Set-Cookie`, `Cache-Control`.
#[derive(Default)]
struct Handler {
    runs: AtomicU64,
    gates: Mutex<Option<mpsc::UnboundedSender<oneshot::Sender<()>>>>,
}

impl Handler {
    fn runs(&self) -> u64 {
        self.runs.load(Ordering::SeqCst)
    }
}

fn pattern(len: usize) -> Bytes {
    (0..len)
        .map(|i| (i % 251) as u8)
        .collect::<Vec<u8>>()
        .into()
}

async fn handle(
    State(h): State<Arc<Handler>>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let run = h.runs.fetch_add(1, Ordering::SeqCst) + 1;
    if q.contains_key("hold") {
        let (tx, rx) = oneshot::channel();
        let gates = h.gates.lock().unwrap().clone();
        if let Some(gates) = gates {
            let _ = gates.send(tx);
        }
        let _ = rx.await;
    }
    let status = q.get("status").map_or(200, |s| s.parse().unwrap());
    let body = match q.get("len") {
        None => Body::from(format!("{{\"run\":{run}}}")),
        Some(len) => {
            let data = pattern(len.parse().unwrap());
            let chunk: usize = q
                .get("chunk")
                .map_or(data.len().max(1), |c| c.parse().unwrap());
            let mut frames: Vec<Result<Bytes, std::io::Error>> = data
                .chunks(chunk)
                .map(|c| Ok(Bytes::copy_from_slice(c)))
                .collect();
            if q.contains_key("fail") {
                frames.truncate(1);
                frames.push(Err(std::io::Error::other("the upstream went away")));
            }
            Body::from_stream(futures_util::stream::iter(frames))
        }
    };
    let mut res = Response::new(body);
    *res.status_mut() = StatusCode::from_u16(status).unwrap();
    let h = res.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    h.insert(X_RUN, HeaderValue::from(run));
    h.insert(X_TRACE, HeaderValue::from_static("trace-abc"));
    h.append(SET_COOKIE, HeaderValue::from_static("a=1"));
    h.append(SET_COOKIE, HeaderValue::from_static("b=2"));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    res
}

/// `POST /items` under an idempotent layer in namespace `ns`, keyed on
/// `Idempotency-Key`, and the handler behind it with its gate channel.
fn idempotent_app<St: LockStore + Clone>(
    b: &Backend<St>,
    ns: &str,
    idem: Idempotency,
) -> (
    Router,
    Arc<Handler>,
    mpsc::UnboundedReceiver<oneshot::Sender<()>>,
) {
    let (tx, rx) = mpsc::unbounded_channel();
    let handler = Arc::new(Handler {
        gates: Mutex::new(Some(tx)),
        ..Handler::default()
    });
    let layer = LockLayer::builder(Locker::new(b.store.clone()), KeyFrom::header(KEY_HEADER))
        .expose_lock_key(true)
        .namespace(ns)
        .idempotent(idem)
        .build()
        .unwrap();
    let router = Router::new()
        .route("/items", post(handle).layer(layer))
        .with_state(handler.clone());
    (router, handler, rx)
}

fn req(key: &str, query: &str, body: &'static str) -> Request<Body> {
    Request::post(format!("/items?{query}"))
        .header(KEY_HEADER, key)
        .body(Body::from(body))
        .unwrap()
}

async fn gate(rx: &mut mpsc::UnboundedReceiver<oneshot::Sender<()>>) -> oneshot::Sender<()> {
    timeout(LIMIT, rx.recv())
        .await
        .expect("the handler did not start")
        .unwrap()
}

// ---------------------------------------------------------------------------
// Behaviour on every store
// ---------------------------------------------------------------------------

async fn stored_statuses_follow_the_policy<St: LockStore + Clone>(b: Backend<St>) {
    let (app, handler, _gates) = idempotent_app(&b, "statuses", Idempotency::new());
    // (status, stored by the default policy)
    let cases = [
        (200, true),
        (201, true),
        (202, true),
        (400, true),
        (404, true),
        (410, true),
        (422, true),
        (408, false),
        (409, false),
        (425, false),
        (429, false),
        (500, false),
        (502, false),
        (503, false),
    ];
    for (code, stored) in cases {
        let key = format!("k{code}");
        let query = format!("status={code}");
        let make = || req(&key, &query, "{}");
        let runs = handler.runs();
        let first = send(&app, make()).await;
        assert_eq!(first.status.as_u16(), code, "{first:?}");
        assert!(!first.replayed());
        assert!(first.headers.contains_key("fencing-token"));
        assert_eq!(handler.runs(), runs + 1);

        let record = b.record("statuses", &key).await;
        let second = send(&app, make()).await;
        assert_eq!(second.status.as_u16(), code, "{second:?}");
        if stored {
            let record = record.unwrap_or_else(|| panic!("{code} was not stored"));
            assert_eq!(record.status().as_u16(), code);
            assert_eq!(record.body(), &first.body);
            assert!(!record.body_omitted());
            assert!(second.replayed(), "{code}: {second:?}");
            assert_eq!(second.body, first.body, "{code}");
            assert_eq!(handler.runs(), runs + 1, "{code} ran again");
        } else {
            assert!(record.is_none(), "{code} was stored");
            assert!(!second.replayed(), "{code}: {second:?}");
            assert_ne!(second.body, first.body, "{code}");
            assert_eq!(handler.runs(), runs + 2, "{code} did not run again");
            assert!(b.record("statuses", &key).await.is_none());
        }
    }

    // A custom policy: only 201.
    let (app, handler, _gates) = idempotent_app(
        &b,
        "custom",
        Idempotency::new().store_when(|s| s == StatusCode::CREATED),
    );
    for (code, stored) in [(201, true), (200, false), (500, false)] {
        let key = format!("c{code}");
        let query = format!("status={code}");
        let make = || req(&key, &query, "{}");
        let runs = handler.runs();
        send(&app, make()).await;
        let second = send(&app, make()).await;
        assert_eq!(second.replayed(), stored, "{code}");
        assert_eq!(handler.runs(), runs + 2 - u64::from(stored), "{code}");
    }
}

async fn replays_carry_the_chosen_headers_only<St: LockStore + Clone>(b: Backend<St>) {
    // Default: the representation headers (Content-Type here), the
    // answer's own (Cache-Control here) and the run's fencing token; not
    // x-trace, x-run or Set-Cookie.
    let (plain, _, _gates) = idempotent_app(&b, "plain", Idempotency::new());
    let first = send(&plain, req("k", "status=201", "{}")).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(first.all(&SET_COOKIE), ["a=1", "b=2"]);
    assert_eq!(first.all(&X_TRACE), ["trace-abc"]);
    let replay = send(&plain, req("k", "status=201", "{}")).await;
    assert!(replay.replayed());
    assert_eq!(replay.status, StatusCode::CREATED);
    assert_eq!(replay.body, first.body);
    // (axum adds Content-Length from the body's exact size.)
    let mut names: Vec<&str> = replay
        .headers
        .keys()
        .map(|n| n.as_str())
        .filter(|n| *n != "content-length")
        .collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "cache-control",
            "content-type",
            "fencing-token",
            "idempotent-replayed"
        ],
        "{replay:?}"
    );
    assert_eq!(replay.all(&CONTENT_TYPE), ["application/json"]);
    // The token of the run that answered, not a new one.
    assert_eq!(replay.fencing(), first.fencing());

    // Chosen: x-trace and every Set-Cookie value, in order, besides the
    // defaults; not x-run (per run).
    let (chosen, _, _gates) = idempotent_app(
        &b,
        "chosen",
        Idempotency::new().replay_headers([CONTENT_TYPE, X_TRACE, SET_COOKIE]),
    );
    let first = send(&chosen, req("k", "", "{}")).await;
    let replay = send(&chosen, req("k", "", "{}")).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body);
    assert_eq!(replay.all(&CONTENT_TYPE), ["application/json"]);
    assert_eq!(replay.all(&X_TRACE), ["trace-abc"]);
    assert_eq!(replay.all(&SET_COOKIE), ["a=1", "b=2"]);
    assert!(replay.all(&X_RUN).is_empty());
    assert_eq!(replay.all(&CACHE_CONTROL), ["no-store"]);
    assert_eq!(replay.fencing(), first.fencing());
    let record = b.record("chosen", "k").await.unwrap();
    let stored: Vec<(&str, &str)> = record
        .headers()
        .iter()
        .map(|(n, v)| (n.as_str(), v.to_str().unwrap()))
        .collect();
    assert_eq!(
        stored,
        [
            ("content-type", "application/json"),
            ("cache-control", "no-store"),
            ("fencing-token", first.header("fencing-token").unwrap()),
            ("x-trace", "trace-abc"),
            ("set-cookie", "a=1"),
            ("set-cookie", "b=2"),
        ]
    );

    // None chosen: the defaults are still kept, nothing else.
    let (bare, _, _gates) = idempotent_app(&b, "bare", Idempotency::new().replay_headers([]));
    send(&bare, req("k", "", "{}")).await;
    let replay = send(&bare, req("k", "", "{}")).await;
    assert!(replay.replayed());
    assert_eq!(
        replay.all(&CONTENT_TYPE),
        ["application/json"],
        "{replay:?}"
    );
    assert!(replay.all(&X_TRACE).is_empty(), "{replay:?}");
}

async fn repeated_and_framing_header_names_are_not_replayed<St: LockStore + Clone>(b: Backend<St>) {
    let idem = Idempotency::new().max_stored_body(4).replay_headers([
        CONTENT_TYPE,
        CONTENT_TYPE,
        http::header::CONTENT_LENGTH,
    ]);
    let (app, _handler, _gates) = idempotent_app(&b, "framing", idem);
    let make = || {
        Request::post("/items?status=201&len=10")
            .header(KEY_HEADER, "k")
            .header(http::header::CONTENT_LENGTH, "0")
            .body(Body::empty())
            .unwrap()
    };
    send(&app, make()).await;
    let record = b.record("framing", "k").await.expect("stored");
    assert!(record.body_omitted());
    let names: Vec<&str> = record.headers().iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        ["content-type", "cache-control", "fencing-token"],
        "each name once, no framing headers"
    );
    let replay = send(&app, make()).await;
    assert!(replay.replayed());
    assert_eq!(replay.all(&CONTENT_TYPE), ["application/json"]);
    assert!(replay.body.is_empty());
}

async fn a_body_over_the_stored_limit_is_stored_as_status_only<St: LockStore + Clone>(
    b: Backend<St>,
) {
    const MAX: usize = 16;
    let (app, handler, _gates) = idempotent_app(&b, "big", Idempotency::new().max_stored_body(MAX));
    // (key, length, chunk, stored whole)
    let cases = [
        ("exact", MAX, MAX, true),
        ("exact-chunked", MAX, 3, true),
        ("one-over", MAX + 1, MAX + 1, false),
        ("streamed", 1000, 10, false),
        ("one-big-chunk", 1000, 1000, false),
    ];
    for (key, len, chunk, whole) in cases {
        let make = || {
            Request::post(format!("/items?status=201&len={len}&chunk={chunk}"))
                .header(KEY_HEADER, key)
                .body(Body::empty())
                .unwrap()
        };
        let runs = handler.runs();
        // The first answer always carries the whole body.
        let first = send(&app, make()).await;
        assert_eq!(first.status, StatusCode::CREATED, "{key}");
        assert_eq!(
            first.body,
            pattern(len),
            "{key}: the first answer lost bytes"
        );

        let record = b.record("big", key).await.expect("stored");
        assert_eq!(record.status(), StatusCode::CREATED, "{key}");
        assert_eq!(record.body_omitted(), !whole, "{key}");
        let replay = send(&app, make()).await;
        assert!(replay.replayed(), "{key}");
        assert_eq!(replay.status, StatusCode::CREATED, "{key}");
        assert_eq!(replay.all(&CONTENT_TYPE), ["application/json"], "{key}");
        if whole {
            assert_eq!(record.body(), &pattern(len), "{key}");
            assert_eq!(replay.body, pattern(len), "{key}");
        } else {
            assert!(
                record.body().is_empty(),
                "{key}: {} bytes stored",
                record.body().len()
            );
            assert!(replay.body.is_empty(), "{key}");
        }
        assert_eq!(handler.runs(), runs + 1, "{key} ran again");
    }
}

async fn fingerprints_refuse_or_ignore_a_different_body<St: LockStore + Clone>(b: Backend<St>) {
    // Default: SHA-256 of the body; another body with the key is refused.
    let (strict, handler, _gates) = idempotent_app(&b, "strict", Idempotency::new());
    let first = send(&strict, req("k", "", r#"{"amount":1}"#)).await;
    assert_eq!(first.status, StatusCode::OK);
    let record = b.record("strict", "k").await.unwrap();
    assert_eq!(
        record.fingerprint(),
        Some(&<[u8; 32]>::from(Sha256::digest(br#"{"amount":1}"#)))
    );
    let p = send(&strict, req("k", "", r#"{"amount":2}"#))
        .await
        .problem(StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(p["lock_key"], "strict:k", "{p}");
    let same = send(&strict, req("k", "", r#"{"amount":1}"#)).await;
    assert!(same.replayed());
    assert_eq!(same.body, first.body);
    assert_eq!(handler.runs(), 1);

    // Fingerprint::None: any request with the key gets the stored answer.
    let (loose, handler, _gates) = idempotent_app(
        &b,
        "loose",
        Idempotency::new().fingerprint(Fingerprint::None),
    );
    let first = send(&loose, req("k", "", r#"{"amount":1}"#)).await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(b.record("loose", "k").await.unwrap().fingerprint(), None);
    for other in [r#"{"amount":2}"#, "", "not even json"] {
        let r = send(&loose, req("k", "", other)).await;
        assert!(r.replayed(), "{other:?}: {r:?}");
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.body, first.body);
    }
    assert_eq!(handler.runs(), 1);
}

async fn an_in_flight_duplicate_gets_409_and_later_the_replay<St: LockStore + Clone>(
    b: Backend<St>,
) {
    let (app, handler, mut gates) = idempotent_app(&b, "inflight", Idempotency::new());
    let first = spawn_send(&app, req("k", "hold&status=201", "{}"));
    let open = gate(&mut gates).await;
    let dup = send(&app, req("k", "status=201", "{}")).await;
    let p = dup.problem(StatusCode::CONFLICT);
    assert_eq!(p["lock_key"], "inflight:k", "{p}");
    assert!(dup.headers.contains_key("retry-after"));
    // The 409 is the layer's, not stored over the running request.
    assert!(b.record("inflight", "k").await.is_none());
    open.send(()).unwrap();
    let first = join(first).await;
    assert_eq!(first.status, StatusCode::CREATED);
    let later = send(&app, req("k", "status=201", "{}")).await;
    assert!(later.replayed());
    assert_eq!(later.body, first.body);
    assert_eq!(handler.runs(), 1);
}

async fn a_response_body_that_fails_stores_nothing<St: LockStore + Clone>(b: Backend<St>) {
    let (app, handler, _gates) = idempotent_app(&b, "broken", Idempotency::new());
    let broken = send(&app, req("k", "len=100&chunk=10&fail", "{}")).await;
    broken.problem(StatusCode::BAD_GATEWAY);
    assert!(b.record("broken", "k").await.is_none());
    // The key is free at once, and the retry runs.
    let retry = send(&app, req("k", "len=100&chunk=10", "{}")).await;
    assert_eq!(retry.status, StatusCode::OK);
    assert!(!retry.replayed());
    assert_eq!(retry.body, pattern(100));
    assert_eq!(handler.runs(), 2);
    assert!(send(&app, req("k", "", "{}")).await.replayed());
}

// ---------------------------------------------------------------------------
// Redis only: a holder whose lock was taken over
// ---------------------------------------------------------------------------

/// The fencing token of the holder of a Redis lock: the lock's counter
/// (`…:fence`) holds the last token minted, while the lock (`…:lock`) exists.
fn lock_token(server: &RedisServer, key: &str) -> Option<u64> {
    server.cmd(&["GET", key]).as_string()?;
    // `<prefix>:{<ns>:<bucket>}:<id>:lock` → the bucket's `…}:fence`.
    let tag_end = key.find('}').unwrap();
    let counter = format!("{}:fence", &key[..=tag_end]);
    server
        .cmd(&["GET", &counter])
        .as_string()
        .map(|t| t.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_lock_was_stolen_cannot_store_its_record() {
    let b = redis();
    let server = b.server.as_ref().unwrap();
    let (app, handler, mut gates) = idempotent_app(&b, "stolen", Idempotency::new());
    let fencing = |r: &Reply| -> u64 {
        r.headers["fencing-token"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap()
    };

    // The former holder finishes while the new one still runs, then after
    // the new one has finished: either way its answer is not stored, and it
    // neither frees the new holder's lock nor overwrites its record.
    for (id, loser_first) in [("a", true), ("b", false)] {
        let lock = redis_name("stolen", id, "lock");
        let record = redis_name("stolen", id, "record");
        let runs = handler.runs();

        let old = spawn_send(&app, req(id, "hold", "{}"));
        let old_gate = gate(&mut gates).await;
        let old_token = lock_token(server, &lock).unwrap();
        // The lease is lost (as after a long pause): the key is taken over.
        assert_eq!(server.cmd(&["DEL", &lock]).as_int(), Some(1));

        let new = spawn_send(&app, req(id, "hold", "{}"));
        let new_gate = gate(&mut gates).await;
        let new_token = lock_token(server, &lock).unwrap();
        assert!(new_token > old_token);

        let (old, new) = if loser_first {
            old_gate.send(()).unwrap();
            let old = join(old).await;
            // Not stored, and the new holder's lock is untouched.
            assert!(b.record("stolen", id).await.is_none(), "{id}");
            assert_eq!(lock_token(server, &lock), Some(new_token), "{id}");
            new_gate.send(()).unwrap();
            (old, join(new).await)
        } else {
            new_gate.send(()).unwrap();
            let new = join(new).await;
            assert!(server.cmd(&["EXISTS", &record]).as_int() == Some(1));
            old_gate.send(()).unwrap();
            (join(old).await, new)
        };

        // Each client got its own handler's answer.
        for (r, token) in [(&old, old_token), (&new, new_token)] {
            assert_eq!(r.status, StatusCode::OK, "{id}: {r:?}");
            assert!(!r.replayed(), "{id}: {r:?}");
            assert_eq!(fencing(r), token, "{id}");
        }
        assert_ne!(old.body, new.body);
        // The record is the new holder's, and so is every replay.
        let stored = b.record("stolen", id).await.unwrap();
        assert_eq!(
            stored.body(),
            &new.body,
            "{id}: the former holder's answer was stored"
        );
        let replay = send(&app, req(id, "", "{}")).await;
        assert!(replay.replayed(), "{id}");
        assert_eq!(replay.body, new.body, "{id}");
        assert_eq!(server.cmd(&["EXISTS", &lock]).as_int(), Some(0), "{id}");
        assert_eq!(handler.runs(), runs + 2, "{id}");
    }
}

/// With a client scope, the same `Idempotency-Key` from two clients is two
/// records: B never gets A's stored response (another client's data), A
/// still gets its replay, and a request without a client is refused before
/// any store call.
async fn keys_scoped_per_client_never_replay_another_clients_record<St: LockStore + Clone>(
    b: Backend<St>,
) {
    const CLIENT: HeaderName = HeaderName::from_static("x-client");
    let (app, handler, _gates) = idempotent_app(
        &b,
        "scoped",
        Idempotency::new().scope(KeyFrom::header(CLIENT)),
    );
    let from = |client: Option<&str>| {
        let mut r = req("shared-key", "", "{}");
        if let Some(client) = client {
            r.headers_mut()
                .insert(CLIENT, HeaderValue::from_str(client).unwrap());
        }
        r
    };

    let a = send(&app, from(Some("a"))).await;
    assert_eq!(a.status, StatusCode::OK);
    assert!(!a.replayed());
    let b_first = send(&app, from(Some("b"))).await;
    assert_eq!(b_first.status, StatusCode::OK);
    assert!(!b_first.replayed(), "B got A's record: {b_first:?}");
    assert_ne!(b_first.body, a.body, "B's own run answers B");
    assert_eq!(handler.runs(), 2);

    // Each gets its own replay.
    let a_again = send(&app, from(Some("a"))).await;
    assert!(a_again.replayed());
    assert_eq!(a_again.body, a.body);
    let b_again = send(&app, from(Some("b"))).await;
    assert!(b_again.replayed());
    assert_eq!(b_again.body, b_first.body);
    assert_eq!(handler.runs(), 2);

    // A principal that spells another's (principal, key) pair differently
    // is still another client: `a:` + `b` is not `a` + `:b`.
    let tricky = send(&app, from(Some("a:shared-key"))).await;
    assert!(!tricky.replayed());
    assert_eq!(handler.runs(), 3);

    // No client: 400, no run, no record under the bare key.
    send(&app, from(None))
        .await
        .problem(StatusCode::BAD_REQUEST);
    assert_eq!(handler.runs(), 3);
    assert!(b.record("scoped", "shared-key").await.is_none());
}

/// A replayed `201 Created` still says where and what it created
/// (`Location`, `ETag`, `Last-Modified`, `Link`) and with which token;
/// never the first answer's `Date` (a replay is sent now) nor, unasked,
/// its cookies.
async fn a_created_answer_is_replayed_with_where_and_what_it_created<St: LockStore + Clone>(
    b: Backend<St>,
) {
    let layer = LockLayer::builder(Locker::new(b.store.clone()), KeyFrom::header(KEY_HEADER))
        .namespace("created")
        .idempotent(Idempotency::new())
        .build()
        .unwrap();
    let runs = Arc::new(AtomicU64::new(0));
    let app = Router::new().route(
        "/orders",
        post({
            let runs = runs.clone();
            move || async move {
                let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
                (
                    StatusCode::CREATED,
                    [
                        ("location", format!("/orders/{run}")),
                        ("etag", format!("\"v{run}\"")),
                        ("last-modified", "Wed, 25 Nov 2026 00:00:00 GMT".to_owned()),
                        ("link", format!("</orders/{run}/items>; rel=\"items\"")),
                        ("date", "Wed, 25 Nov 2026 00:00:00 GMT".to_owned()),
                        ("set-cookie", "session=abc".to_owned()),
                    ],
                    "created",
                )
            }
        })
        .layer(layer),
    );
    let make = || {
        Request::post("/orders")
            .header(KEY_HEADER, "order-1")
            .body(Body::empty())
            .unwrap()
    };
    let first = send(&app, make()).await;
    assert_eq!(first.status, StatusCode::CREATED);
    let replay = send(&app, make()).await;
    assert!(replay.replayed());
    assert_eq!(replay.status, StatusCode::CREATED);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    for name in ["location", "etag", "last-modified", "link", "fencing-token"] {
        assert_eq!(
            replay.header(name),
            first.header(name),
            "{name}: {replay:?}"
        );
        assert!(replay.header(name).is_some(), "{name}");
    }
    assert_eq!(replay.header("location"), Some("/orders/1"));
    assert_eq!(replay.header("date"), None, "{replay:?}");
    assert_eq!(replay.header("set-cookie"), None, "{replay:?}");
}

/// `Fingerprint::Json`: the same JSON with other whitespace or member order
/// is the same request (replayed); another value is not (422), and `1.0`
/// is not `1`. The default `Body` fingerprint tells every byte apart.
async fn a_json_fingerprint_ignores_whitespace_and_member_order_only<St: LockStore + Clone>(
    b: Backend<St>,
) {
    let (json, handler, _gates) = idempotent_app(
        &b,
        "json-fp",
        Idempotency::new().fingerprint(Fingerprint::Json),
    );
    let first = send(&json, req("k", "", r#"{"amount":1,"currency":"eur"}"#)).await;
    assert_eq!(first.status, StatusCode::OK);
    for same in [
        r#"{ "currency" : "eur", "amount" : 1 }"#,
        "{\n  \"amount\": 1,\n  \"currency\": \"eur\"\n}",
    ] {
        let r = send(&json, req("k", "", same)).await;
        assert!(r.replayed(), "{same}: {r:?}");
        assert_eq!(r.body, first.body);
    }
    for other in [
        r#"{"amount":2,"currency":"eur"}"#,
        r#"{"amount":1.0,"currency":"eur"}"#,
        r#"{"amount":1}"#,
    ] {
        send(&json, req("k", "", other))
            .await
            .problem(StatusCode::UNPROCESSABLE_ENTITY);
    }
    assert_eq!(handler.runs(), 1);

    let (bytes, _, _gates) = idempotent_app(&b, "bytes-fp", Idempotency::new());
    send(&bytes, req("k", "", r#"{"amount":1}"#)).await;
    send(&bytes, req("k", "", r#"{ "amount": 1 }"#))
        .await
        .problem(StatusCode::UNPROCESSABLE_ENTITY);
}

/// `KeyFrom::idempotency_key()`: the quoted (Structured Field) and bare
/// spellings of one key are one record; a missing, malformed, repeated or
/// over-long key is 400 with a problem body, before any store call (no
/// Redis key written, no run).
async fn the_idempotency_key_header_follows_the_draft<St: LockStore + Clone>(b: Backend<St>) {
    let layer = LockLayer::builder(Locker::new(b.store.clone()), KeyFrom::idempotency_key())
        .namespace("draft")
        .idempotent(Idempotency::new())
        .build()
        .unwrap();
    let runs = Arc::new(AtomicU64::new(0));
    let app = Router::new().route(
        "/payments",
        post({
            let runs = runs.clone();
            move || async move { format!("run {}", runs.fetch_add(1, Ordering::SeqCst) + 1) }
        })
        .layer(layer),
    );
    let with = |values: &[&str]| {
        let mut r = Request::post("/payments");
        for v in values {
            r = r.header(KEY_HEADER, *v);
        }
        r.body(Body::from("{}")).unwrap()
    };

    let long = "k".repeat(256);
    for bad in [
        &[][..],
        &[r#""unterminated"#],
        &["two words"],
        &[r#""a"b"#],
        &["a", "b"],
        &[long.as_str()],
    ] {
        let r = send(&app, with(bad)).await;
        r.problem(StatusCode::BAD_REQUEST);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    if let Some(server) = &b.server {
        assert_eq!(server.dbsize(), 0, "{:?}", server.keys());
    }

    let quoted = send(&app, with(&[r#""8e03978e-40d5""#])).await;
    assert_eq!(quoted.status, StatusCode::OK);
    assert!(!quoted.replayed());
    let bare = send(&app, with(&["8e03978e-40d5"])).await;
    assert!(bare.replayed(), "{bare:?}");
    assert_eq!(bare.body, quoted.body);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// `Fingerprint::Json` never makes two requests the handler reads apart
/// one: integers past 64 bits (serde_json reads a `u128` exactly; a
/// `Value` rounds both to one `f64`), and a member named twice (a derived
/// struct refuses the body, a `Value` keeps the last) are another request
/// (422), not a replay of the first's answer.
async fn a_json_fingerprint_tells_apart_what_the_handler_tells_apart<St: LockStore + Clone>(
    b: Backend<St>,
) {
    let (json, handler, _gates) = idempotent_app(
        &b,
        "json-fp-exact",
        Idempotency::new().fingerprint(Fingerprint::Json),
    );
    let first = send(&json, req("big", "", r#"{"id":18446744073709551617}"#)).await;
    assert_eq!(first.status, StatusCode::OK);
    // The same number, spaced otherwise: the same request.
    // (Such a body is fingerprinted byte for byte.)
    let same = send(&json, req("big", "", r#"{"id":18446744073709551617}"#)).await;
    assert!(same.replayed(), "{same:?}");
    let other = send(&json, req("big", "", r#"{"id":18446744073709551618}"#)).await;
    assert_eq!(
        other.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "another id got the first one's answer: {other:?}"
    );

    let first = send(&json, req("dup", "", r#"{"amount":1}"#)).await;
    assert_eq!(first.status, StatusCode::OK);
    let twice = send(&json, req("dup", "", r#"{"amount":100,"amount":1}"#)).await;
    assert_eq!(
        twice.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "a body naming a member twice got the first one's answer: {twice:?}"
    );

    // A member's name escaped otherwise is the same member.
    let first = send(&json, req("esc", "", r#"{"id":1}"#)).await;
    assert_eq!(first.status, StatusCode::OK);
    let escaped = send(&json, req("esc", "", r#"{"\u0069d":1}"#)).await;
    assert!(escaped.replayed(), "{escaped:?}");
    assert_eq!(handler.runs(), 3);
}

/// A record stored without its body (over `max_stored_body`) is replayed
/// with an empty body: never with the `ETag` of the bytes it no longer
/// has (a cache would keep the empty body under that validator and answer
/// `304` for it), while where it is (`Location`) is still said.
async fn a_replay_without_its_body_has_no_validator_of_that_body<St: LockStore + Clone>(
    b: Backend<St>,
) {
    let layer = LockLayer::builder(Locker::new(b.store.clone()), KeyFrom::header(KEY_HEADER))
        .namespace("created-big")
        .idempotent(Idempotency::new().max_stored_body(1))
        .build()
        .unwrap();
    let app = Router::new().route(
        "/orders",
        post(|| async {
            (
                StatusCode::CREATED,
                [("location", "/orders/1"), ("etag", "\"v1\"")],
                "created",
            )
        })
        .layer(layer),
    );
    let make = || {
        Request::post("/orders")
            .header(KEY_HEADER, "order-big")
            .body(Body::empty())
            .unwrap()
    };
    let first = send(&app, make()).await;
    assert_eq!(first.header("etag"), Some("\"v1\""));
    let replay = send(&app, make()).await;
    assert!(replay.replayed(), "{replay:?}");
    assert!(replay.body.is_empty(), "{replay:?}");
    assert_eq!(replay.header("location"), Some("/orders/1"), "{replay:?}");
    assert_eq!(replay.header("etag"), None, "{replay:?}");
}
