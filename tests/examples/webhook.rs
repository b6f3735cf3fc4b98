//! The contract of `examples/webhook/`: every event applied exactly once.
//!
//! The example is compiled into this test (`#[path]` below) and run against
//! a real `redis-server` from the test support (locks, records and the
//! ledger all in Redis), plus one smoke test on the memory store. The
//! assertions count effects in the ledger — "applied once" — not just
//! "answered 200".
//!
//! Deliveries are held, failed or crashed through the example's
//! `before_apply` hook ([`Probe`]); every wait is on a condition (a gate
//! reached, a Redis key gone, a waiter subscribed), bounded by [`LIMIT`].

use crate::support;
use support::stores::redis_name;

use support::http::{Reply, read, send};

#[allow(dead_code)]
#[path = "../../examples/webhook/main.rs"]
mod webhook;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use bytes::Bytes;
use http::{Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use support::{RedisServer, slow};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::{Barrier, mpsc, oneshot};
use tokio::time::timeout;
use tower::ServiceExt;
use tower_redis_lock::{FencingToken, MemoryStore, RedisStore};
use webhook::{Applied, Ledger, Options};

/// Upper bound on every wait for a condition. Reached only when a test
/// fails; a passing run never waits this long.
const LIMIT: Duration = Duration::from_secs(10);
const SECRET: &str = "whsec_test";
const STRIPE: &str = "/webhooks/stripe";
const GITHUB: &str = "/webhooks/github";
const GITHUB_JOBS: &str = "/webhooks/github/jobs";

// ---------------------------------------------------------------------------
// The probe: what each delivery does in the example's `before_apply` hook
// ---------------------------------------------------------------------------

/// What the next delivery of an event does before it applies.
enum Step {
    /// Answer 500 (a downstream failure): nothing applied, nothing stored.
    Fail,
    /// Panic.
    Panic,
    /// Report through [`Probe::held`] and wait until the test lets it go
    /// (or forever, if the test drops the sender... which then shows the
    /// delivery was cancelled).
    Hold,
    /// [`Step::Hold`], then [`Step::Fail`].
    HoldThenFail,
}

/// A held delivery: sending (or dropping) `release` lets it go on.
struct Held {
    id: String,
    release: oneshot::Sender<()>,
}

#[derive(Default)]
struct Probe {
    /// Deliveries that reached the handler, per event id.
    runs: Mutex<HashMap<String, u32>>,
    /// What the next deliveries of an event do; absent: go on at once.
    plan: Mutex<HashMap<String, VecDeque<Step>>>,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    held: Mutex<Option<mpsc::UnboundedSender<Held>>>,
}

/// Counts a delivery in flight while alive (also when its future is
/// dropped or unwinds).
struct InFlight(Arc<Probe>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Probe {
    fn new() -> (Arc<Probe>, mpsc::UnboundedReceiver<Held>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let probe = Probe {
            held: Mutex::new(Some(tx)),
            ..Probe::default()
        };
        (Arc::new(probe), rx)
    }

    fn plan(&self, id: &str, steps: impl IntoIterator<Item = Step>) {
        self.plan
            .lock()
            .unwrap()
            .entry(id.to_owned())
            .or_default()
            .extend(steps);
    }

    fn runs(&self, id: &str) -> u32 {
        self.runs.lock().unwrap().get(id).copied().unwrap_or(0)
    }

    fn total_runs(&self) -> u32 {
        self.runs.lock().unwrap().values().sum()
    }

    fn max_in_flight(&self) -> usize {
        self.max_in_flight.load(Ordering::SeqCst)
    }

    fn hook(self: &Arc<Self>) -> webhook::BeforeApply {
        let probe = self.clone();
        Arc::new(move |id: &str| {
            let probe = probe.clone();
            let id = id.to_owned();
            Box::pin(async move {
                let n = probe.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                probe.max_in_flight.fetch_max(n, Ordering::SeqCst);
                let _in_flight = InFlight(probe.clone());
                *probe.runs.lock().unwrap().entry(id.clone()).or_default() += 1;
                let step = probe
                    .plan
                    .lock()
                    .unwrap()
                    .get_mut(&id)
                    .and_then(VecDeque::pop_front);
                match step {
                    None => Ok(()),
                    Some(Step::Fail) => Err(format!("simulated outage while applying {id}")),
                    Some(Step::Panic) => panic!("simulated crash while applying {id}"),
                    Some(step @ (Step::Hold | Step::HoldThenFail)) => {
                        let (release, rx) = oneshot::channel();
                        let tx = probe.held.lock().unwrap().clone();
                        if let Some(tx) = tx {
                            let _ = tx.send(Held {
                                id: id.clone(),
                                release,
                            });
                        }
                        let _ = rx.await;
                        match step {
                            Step::HoldThenFail => {
                                Err(format!("simulated outage while applying {id}"))
                            }
                            _ => Ok(()),
                        }
                    }
                }
            })
        })
    }
}

/// Waits until a delivery is held inside its handler.
async fn held(rx: &mut mpsc::UnboundedReceiver<Held>) -> Held {
    timeout(LIMIT, rx.recv())
        .await
        .expect("no delivery reached the handler")
        .expect("probe gone")
}

// ---------------------------------------------------------------------------
// Apps, requests, answers
// ---------------------------------------------------------------------------

fn options(probe: &Arc<Probe>) -> Options {
    Options {
        secret: SECRET.to_owned(),
        work: Duration::ZERO,
        before_apply: Some(probe.hook()),
        ..Options::default()
    }
}

fn redis_app(server: &RedisServer, opts: Options) -> Router {
    let store = RedisStore::from_url(&server.url()).unwrap();
    let ledger = Ledger::redis(&server.url()).unwrap();
    webhook::app(store, ledger, opts).unwrap()
}

fn event(id: &str, kind: &str) -> Bytes {
    Bytes::from(
        serde_json::json!({
            "id": id,
            "object": "event",
            "type": kind,
            "data": { "object": { "id": "pi_1", "amount": 2000 } },
        })
        .to_string(),
    )
}

/// A Stripe delivery of `body`, signed now.
fn stripe(body: &Bytes) -> Request<Body> {
    Request::post(STRIPE)
        .header(header::CONTENT_TYPE, "application/json")
        .header(
            "stripe-signature",
            webhook::sign(SECRET, webhook::unix_now(), body),
        )
        .body(Body::from(body.clone()))
        .unwrap()
}

/// A GitHub delivery of `body` with delivery id `delivery`.
fn github(delivery: &str, body: &Bytes) -> Request<Body> {
    Request::post(GITHUB)
        .header(header::CONTENT_TYPE, "application/json")
        .header("x-github-event", "push")
        .header("x-github-delivery", delivery)
        .header("x-hub-signature-256", webhook::sign_github(SECRET, body))
        .body(Body::from(body.clone()))
        .unwrap()
}

/// A GitHub delivery of `body` to the route that hands its work off.
fn github_job(delivery: &str, body: &Bytes) -> Request<Body> {
    let mut req = github(delivery, body);
    *req.uri_mut() = GITHUB_JOBS.parse().unwrap();
    req
}

impl Reply {
    fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {self:?}"))
    }

    /// The handler's own answer (first run, not a replay).
    fn original(&self, id: &str) {
        assert_eq!(self.status, StatusCode::OK, "{self:?}");
        assert!(!self.replayed(), "{self:?}");
        assert_eq!(self.header("content-type"), Some("application/json"));
        assert_eq!(
            self.json(),
            serde_json::json!({ "received": true, "id": id })
        );
    }

    /// A replay of `original`: same status, same bytes, same content type,
    /// marked, with the fencing token of the run that answered.
    fn replay_of(&self, original: &Reply) {
        assert!(self.replayed(), "not a replay: {self:?}");
        assert_eq!(self.status, original.status, "{self:?}");
        assert_eq!(self.body, original.body, "the replay differs");
        assert_eq!(self.header("content-type"), original.header("content-type"));
        assert_eq!(
            self.header("fencing-token"),
            original.header("fencing-token")
        );
        assert!(self.header("fencing-token").is_some(), "{self:?}");
    }
}

/// The ledger as `GET /ledger` shows it.
async fn ledger(app: &Router) -> BTreeMap<String, u64> {
    let r = send(app, Request::get("/ledger").body(Body::empty()).unwrap()).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    serde_json::from_slice(&r.body).unwrap()
}

fn counts(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

/// Serves `app` on 127.0.0.1 on a free port, as the example's `main` does
/// (its server, its default time limits).
async fn serve(app: Router) -> SocketAddr {
    serve_with(app, webhook::DEFAULT_TIMEOUTS).await
}

/// [`serve`] within `timeouts`.
async fn serve_with(app: Router, timeouts: webhook::Timeouts) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(webhook::serve(
        listener,
        app,
        timeouts,
        std::future::pending(),
    ));
    addr
}

/// Sends `req` over its own HTTP/1.1 connection.
async fn send_tcp(addr: SocketAddr, req: Request<Body>) -> Reply {
    let (parts, body) = req.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    let mut req = Request::from_parts(parts, Full::new(body));
    req.headers_mut()
        .insert(header::HOST, addr.to_string().parse().unwrap());
    let exchange = async {
        let stream = TcpStream::connect(addr).await.unwrap();
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        read(sender.send_request(req).await.unwrap()).await
    };
    timeout(LIMIT, exchange).await.expect("no answer over TCP")
}

/// Whether a Redis key exists.
fn exists(server: &RedisServer, key: &str) -> bool {
    server.cmd(&["EXISTS", key]).as_int() == Some(1)
}

/// Polls `cond` every 5 ms until it holds; panics after [`LIMIT`].
async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    assert!(
        support::eventually(LIMIT, async || cond()).await,
        "gave up waiting until {what}"
    );
}

/// Sends `make()` until the answer is not 409 (the key is freed in the
/// background after a crash or a hang-up); returns that answer.
async fn until_not_contended(app: &Router, make: impl Fn() -> Request<Body>) -> Reply {
    let mut last = None;
    support::eventually_some(LIMIT, async || {
        let r = send(app, make()).await;
        if r.status != StatusCode::CONFLICT {
            return Some(r);
        }
        last = Some(r);
        None
    })
    .await
    .unwrap_or_else(|| panic!("the key stayed locked: {last:?}"))
}

// ---------------------------------------------------------------------------
// Stripe
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_duplicates_apply_the_event_once() {
    const N: usize = 50;
    let server = RedisServer::start();
    let (probe, mut holds) = Probe::new();
    let id = "evt_burst";
    probe.plan(id, [Step::Hold]);
    let addr = serve(redis_app(&server, options(&probe))).await;
    let body = event(id, "invoice.paid");

    let barrier = Arc::new(Barrier::new(N));
    let (done, mut replies) = mpsc::unbounded_channel();
    for _ in 0..N {
        let (barrier, done, body) = (barrier.clone(), done.clone(), body.clone());
        tokio::spawn(async move {
            barrier.wait().await;
            let _ = done.send(send_tcp(addr, stripe(&body)).await);
        });
    }
    drop(done);

    // One delivery holds the event; while it does, every duplicate is told
    // to come back later.
    let first = held(&mut holds).await;
    assert_eq!(first.id, id);
    let mut answers = Vec::new();
    while answers.len() < N / 2 {
        let r = timeout(LIMIT, replies.recv()).await.unwrap().unwrap();
        let p = r.problem(StatusCode::CONFLICT);
        assert_eq!(
            p.get("lock_key"),
            None,
            "the default body names no key: {p}"
        );
        assert!(!p["detail"].as_str().unwrap().contains("evt_burst"), "{p}");
        assert!(r.header("retry-after").is_some(), "{r:?}");
        answers.push(r);
    }
    // Let it finish while the rest may still be arriving.
    first.release.send(()).unwrap();
    while let Some(r) = timeout(LIMIT, replies.recv()).await.unwrap() {
        answers.push(r);
    }
    assert_eq!(answers.len(), N);

    let originals: Vec<&Reply> = answers
        .iter()
        .filter(|r| r.status == StatusCode::OK && !r.replayed())
        .collect();
    assert_eq!(originals.len(), 1, "{answers:#?}");
    let original = originals[0];
    original.original(id);
    for r in &answers {
        match r.status {
            StatusCode::OK if r.replayed() => r.replay_of(original),
            StatusCode::OK => {}
            StatusCode::CONFLICT => {
                r.problem(StatusCode::CONFLICT);
            }
            other => panic!("unexpected {other}: {r:?}"),
        }
    }

    // A later duplicate gets the stored answer.
    send_tcp(addr, stripe(&body)).await.replay_of(original);

    assert_eq!(probe.runs(id), 1, "the handler ran more than once");
    assert_eq!(probe.max_in_flight(), 1);
    let app = redis_app(&server, options(&probe));
    assert_eq!(ledger(&app).await, counts(&[(id, 1)]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequential_duplicates_are_replayed_byte_for_byte() {
    let server = RedisServer::start();
    let (probe, _holds) = Probe::new();
    let app = redis_app(&server, options(&probe));
    let id = "evt_seq";
    let body = event(id, "charge.succeeded");

    let first = send(&app, stripe(&body)).await;
    first.original(id);
    assert!(first.fencing() > 0);
    assert!(exists(&server, &redis_name("stripe", "evt_seq", "record")));
    assert!(!exists(&server, &redis_name("stripe", "evt_seq", "lock")));
    for _ in 0..3 {
        // Freshly signed each time, as a real retry would be.
        send(&app, stripe(&body)).await.replay_of(&first);
    }
    assert_eq!(probe.runs(id), 1);
    assert_eq!(ledger(&app).await, counts(&[(id, 1)]));
    // The ledger entry carries the fencing token that wrote it.
    let token = server
        .cmd(&["HGET", "ledger:{webhooks}:evt_seq", "fencing_token"])
        .as_int()
        .unwrap();
    assert_eq!(token as u64, first.fencing());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_first_attempt_is_not_stored_and_the_retry_applies_once() {
    let server = RedisServer::start();
    let (probe, _holds) = Probe::new();
    let app = redis_app(&server, options(&probe));
    let id = "evt_flaky";
    probe.plan(id, [Step::Fail]);
    let body = event(id, "customer.created");

    let failed = send(&app, stripe(&body)).await;
    let p = failed.problem(StatusCode::INTERNAL_SERVER_ERROR);
    assert!(p["detail"].as_str().unwrap().contains("simulated"), "{p}");
    // 5xx is never stored, and the key is free at once.
    assert!(!exists(
        &server,
        &redis_name("stripe", "evt_flaky", "record")
    ));
    assert!(!exists(&server, &redis_name("stripe", "evt_flaky", "lock")));
    assert_eq!(ledger(&app).await, counts(&[]));

    let retry = send(&app, stripe(&body)).await;
    retry.original(id);
    send(&app, stripe(&body)).await.replay_of(&retry);
    assert_eq!(probe.runs(id), 2);
    assert_eq!(ledger(&app).await, counts(&[(id, 1)]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_panic_the_next_delivery_runs_and_applies_once() {
    let server = RedisServer::start();
    let (probe, _holds) = Probe::new();
    let app = redis_app(&server, options(&probe));
    let id = "evt_crash";
    probe.plan(id, [Step::Panic]);
    let body = event(id, "charge.refunded");

    let crashed = {
        let app = app.clone();
        let req = stripe(&body);
        tokio::spawn(async move { app.oneshot(req).await })
    };
    let err = timeout(LIMIT, crashed).await.unwrap().unwrap_err();
    assert!(err.is_panic(), "{err:?}");
    assert_eq!(probe.runs(id), 1);
    assert_eq!(probe.in_flight.load(Ordering::SeqCst), 0);

    // Nothing was stored; the lock is released in the background.
    until("the crashed delivery's lock is released", || {
        !exists(&server, &redis_name("stripe", "evt_crash", "lock"))
    })
    .await;
    assert!(!exists(
        &server,
        &redis_name("stripe", "evt_crash", "record")
    ));
    let retry = until_not_contended(&app, || stripe(&body)).await;
    retry.original(id);
    send(&app, stripe(&body)).await.replay_of(&retry);

    assert_eq!(probe.runs(id), 2);
    assert_eq!(probe.max_in_flight(), 1);
    assert_eq!(ledger(&app).await, counts(&[(id, 1)]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_client_hangs_up_mid_delivery_the_next_one_runs_and_applies_once() {
    let server = RedisServer::start();
    let (probe, mut holds) = Probe::new();
    let app = redis_app(&server, options(&probe));
    let addr = serve(app.clone()).await;
    let id = "evt_gone";
    probe.plan(id, [Step::Hold]);
    let body = event(id, "payout.paid");

    let mut client = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST {STRIPE} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n\
         Stripe-Signature: {}\r\nContent-Length: {}\r\n\r\n",
        webhook::sign(SECRET, webhook::unix_now(), &body),
        body.len()
    );
    client.write_all(head.as_bytes()).await.unwrap();
    client.write_all(&body).await.unwrap();
    let first = held(&mut holds).await;
    assert!(exists(&server, &redis_name("stripe", "evt_gone", "lock")));

    // While it is held, a duplicate is refused and does not run.
    send(&app, stripe(&body))
        .await
        .problem(StatusCode::CONFLICT);

    // The sender gives up: the delivery is cancelled (its hook's receiver is
    // dropped), its lock released, nothing stored.
    drop(client);
    until("the abandoned delivery is cancelled", || {
        first.release.is_closed()
    })
    .await;
    until("the abandoned delivery's lock is released", || {
        !exists(&server, &redis_name("stripe", "evt_gone", "lock"))
    })
    .await;
    assert!(!exists(
        &server,
        &redis_name("stripe", "evt_gone", "record")
    ));
    assert_eq!(ledger(&app).await, counts(&[]));

    let retry = until_not_contended(&app, || stripe(&body)).await;
    retry.original(id);
    send(&app, stripe(&body)).await.replay_of(&retry);
    assert_eq!(probe.runs(id), 2);
    assert_eq!(probe.max_in_flight(), 1, "two deliveries ran at once");
    assert_eq!(ledger(&app).await, counts(&[(id, 1)]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_event_id_with_another_body_is_refused_with_422() {
    let server = RedisServer::start();
    let (probe, _holds) = Probe::new();
    let app = redis_app(&server, options(&probe));
    let id = "evt_reused";
    let body = event(id, "invoice.created");

    let first = send(&app, stripe(&body)).await;
    first.original(id);
    let other = event(id, "invoice.deleted");
    let p = send(&app, stripe(&other))
        .await
        .problem(StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        p.get("lock_key"),
        None,
        "the default body names no key: {p}"
    );
    // The stored answer still serves the original payload.
    send(&app, stripe(&body)).await.replay_of(&first);
    assert_eq!(probe.runs(id), 1);
    assert_eq!(ledger(&app).await, counts(&[(id, 1)]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_the_record_expires_the_event_runs_again() {
    let server = RedisServer::start();
    let (probe, _holds) = Probe::new();
    let app = redis_app(
        &server,
        Options {
            retention: Duration::from_secs(1),
            ..options(&probe)
        },
    );
    let id = "evt_old";
    let body = event(id, "invoice.paid");

    let first = send(&app, stripe(&body)).await;
    first.original(id);
    let ttl = server
        .cmd(&["PTTL", &redis_name("stripe", "evt_old", "record")])
        .as_int()
        .unwrap();
    assert!((1..=1000).contains(&ttl), "record PTTL {ttl}");
    until("the record expires", || {
        !exists(&server, &redis_name("stripe", "evt_old", "record"))
    })
    .await;

    let again = send(&app, stripe(&body)).await;
    again.original(id);
    assert!(again.fencing() > first.fencing());
    assert_eq!(probe.runs(id), 2);
    assert_eq!(ledger(&app).await, counts(&[(id, 2)]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_signatures_are_refused_before_any_redis_work() {
    let server = RedisServer::start();
    let (probe, _holds) = Probe::new();
    let app = redis_app(&server, options(&probe));
    let body = event("evt_forged", "charge.succeeded");
    let now = webhook::unix_now();
    let good = webhook::sign(SECRET, now, &body);
    let v1 = good.split_once(",v1=").unwrap().1.to_owned();

    let cases: Vec<(&str, Option<String>, Bytes)> = vec![
        ("no header", None, body.clone()),
        ("empty header", Some(String::new()), body.clone()),
        ("garbage", Some("not a signature".into()), body.clone()),
        ("no v1", Some(format!("t={now}")), body.clone()),
        ("no t", Some(format!("v1={v1}")), body.clone()),
        (
            "v1 not hex",
            Some(format!("t={now},v1=zz{v1}")),
            body.clone(),
        ),
        (
            "v1 truncated",
            Some(format!("t={now},v1={}", &v1[..32])),
            body.clone(),
        ),
        (
            "wrong secret",
            Some(webhook::sign("whsec_other", now, &body)),
            body.clone(),
        ),
        (
            "tampered body",
            Some(good.clone()),
            event("evt_forged", "charge.refunded"),
        ),
        (
            "timestamp swapped",
            Some(format!("t={},v1={v1}", now - 1)),
            body.clone(),
        ),
        (
            "expired",
            Some(webhook::sign(SECRET, now - 301 - 60, &body)),
            body.clone(),
        ),
        (
            "from the future",
            Some(webhook::sign(SECRET, now + 301 + 60, &body)),
            body.clone(),
        ),
    ];
    for (what, signature, payload) in cases {
        let mut req = Request::post(STRIPE).header(header::CONTENT_TYPE, "application/json");
        if let Some(s) = signature {
            req = req.header("stripe-signature", s);
        }
        let r = send(&app, req.body(Body::from(payload)).unwrap()).await;
        let p = r.problem(StatusCode::BAD_REQUEST);
        assert!(
            p["detail"].as_str().unwrap().contains("stripe-signature"),
            "{what}: {p}"
        );
        assert_eq!(r.header("fencing-token"), None, "{what}");
    }
    // GitHub's scheme likewise.
    let gh = event("push_1", "push");
    for signature in [
        None,
        Some(webhook::sign_github("other", &gh)),
        Some("sha1=00".into()),
    ] {
        let mut req = Request::post(GITHUB).header("x-github-delivery", "d-forged");
        if let Some(s) = signature {
            req = req.header("x-hub-signature-256", s);
        }
        send(&app, req.body(Body::from(gh.clone())).unwrap())
            .await
            .problem(StatusCode::BAD_REQUEST);
    }
    // A body over the limit is refused without being read past it.
    let huge = Bytes::from(vec![b' '; webhook::MAX_BODY + 1]);
    send(
        &app,
        Request::post(STRIPE)
            .header("stripe-signature", webhook::sign(SECRET, now, &huge))
            .body(Body::from(huge.clone()))
            .unwrap(),
    )
    .await
    .problem(StatusCode::PAYLOAD_TOO_LARGE);

    assert_eq!(probe.total_runs(), 0);
    assert_eq!(server.dbsize(), 0, "keys written: {:?}", server.keys());
    for script in ["eval", "evalsha", "set", "get"] {
        assert_eq!(server.command_calls(script), 0, "{script} was called");
    }

    // The correctly signed event does go through (and only then touches Redis).
    send(&app, stripe(&body)).await.original("evt_forged");
    assert!(server.dbsize() > 0);
}

// ---------------------------------------------------------------------------
// GitHub: wait for the first delivery, then replay it
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_github_deliveries_wait_and_the_second_gets_the_replay() {
    let server = RedisServer::start();
    let (probe, mut holds) = Probe::new();
    let app = redis_app(&server, options(&probe));
    let delivery = "72d3162e-cc78-11e3-81ab-4c9367dc0958";
    probe.plan(delivery, [Step::Hold]);
    let body = Bytes::from_static(br#"{"ref":"refs/heads/main","after":"abc123"}"#);

    let spawn = |req: Request<Body>| {
        let app = app.clone();
        tokio::spawn(async move { send(&app, req).await })
    };
    let first = spawn(github(delivery, &body));
    let held_first = held(&mut holds).await;
    let second = spawn(github(delivery, &body));

    // The second waits: it has subscribed to the key's release channel.
    let channel = released_channel(&body);
    until("the second delivery waits for the first", || {
        let reply = server.cmd(&["PUBSUB", "NUMSUB", &channel]);
        let items = reply.as_array().unwrap();
        items[1].as_int().unwrap() >= 1
    })
    .await;
    assert!(!second.is_finished());
    held_first.release.send(()).unwrap();

    let a = timeout(LIMIT, first).await.unwrap().unwrap();
    let b = timeout(LIMIT, second).await.unwrap().unwrap();
    a.original(delivery);
    b.replay_of(&a);
    assert_eq!(probe.runs(delivery), 1);
    assert_eq!(ledger(&app).await, counts(&[(delivery, 1)]));

    // Without a delivery id the request is not GitHub's: 400 before the
    // lock, whatever its body (here an applied one, whose record would
    // otherwise answer).
    let mut req = github(delivery, &body);
    req.headers_mut().remove("x-github-delivery");
    let p = send(&app, req).await.problem(StatusCode::BAD_REQUEST);
    assert!(
        p["detail"].as_str().unwrap().contains("x-github-delivery"),
        "{p}"
    );
    // Keys are per endpoint: a Stripe event with the same id is its own.
    let same_id = event(delivery, "charge.succeeded");
    send(&app, stripe(&same_id)).await.original(delivery);
    assert_eq!(ledger(&app).await, counts(&[(delivery, 2)]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_github_delivery_runs_itself_when_the_first_one_fails() {
    let server = RedisServer::start();
    let (probe, mut holds) = Probe::new();
    let app = redis_app(&server, options(&probe));
    let delivery = "d-fails-first";
    probe.plan(delivery, [Step::HoldThenFail]);
    let body = Bytes::from_static(br#"{"action":"opened","number":7}"#);

    let spawn = |req: Request<Body>| {
        let app = app.clone();
        tokio::spawn(async move { send(&app, req).await })
    };
    let first = spawn(github(delivery, &body));
    let held_first = held(&mut holds).await;
    let second = spawn(github(delivery, &body));
    let channel = released_channel(&body);
    until("the second delivery waits for the first", || {
        let reply = server.cmd(&["PUBSUB", "NUMSUB", &channel]);
        reply.as_array().unwrap()[1].as_int().unwrap() >= 1
    })
    .await;
    held_first.release.send(()).unwrap();

    // The first fails (not stored): the waiter takes the lock and runs.
    let a = timeout(LIMIT, first).await.unwrap().unwrap();
    a.problem(StatusCode::INTERNAL_SERVER_ERROR);
    let b = timeout(LIMIT, second).await.unwrap().unwrap();
    b.original(delivery);
    assert_eq!(probe.runs(delivery), 2);
    assert_eq!(probe.max_in_flight(), 1);
    send(&app, github(delivery, &body)).await.replay_of(&b);
    assert_eq!(ledger(&app).await, counts(&[(delivery, 1)]));
}

// ---------------------------------------------------------------------------
// GitHub jobs: answered 202 at once, the work handed off to a task
// ---------------------------------------------------------------------------

/// The handed-off job's first answer: 202 at once, with the lock's token.
fn accepted(r: &Reply, id: &str) {
    assert_eq!(r.status, StatusCode::ACCEPTED, "{r:?}");
    assert!(!r.replayed(), "{r:?}");
    assert_eq!(r.json(), serde_json::json!({ "accepted": true, "id": id }));
    assert!(r.header("fencing-token").is_some(), "{r:?}");
}

/// The job's final answer, replayed: what the worker's delivery answered,
/// under the fencing token the 202 carried.
fn final_answer_of(r: &Reply, id: &str, first: &Reply) {
    assert!(r.replayed(), "not a replay: {r:?}");
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(r.json(), serde_json::json!({ "received": true, "id": id }));
    assert_eq!(r.header("fencing-token"), first.header("fencing-token"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_github_job_is_accepted_at_once_and_a_duplicate_waits_for_its_final_answer() {
    let server = RedisServer::start();
    let (probe, mut holds) = Probe::new();
    let app = redis_app(&server, options(&probe));
    let delivery = "d-job";
    probe.plan(delivery, [Step::Hold]);
    let body = Bytes::from_static(br#"{"action":"requested","workflow_run":{"id":30}}"#);

    // Answered while the work is still held inside the task.
    let first = send(&app, github_job(delivery, &body)).await;
    accepted(&first, delivery);
    let work = held(&mut holds).await;
    let second = {
        let app = app.clone();
        let req = github_job(delivery, &body);
        tokio::spawn(async move { send(&app, req).await })
    };
    let channel = redis_name("github-jobs", &digest(&body), "released");
    until("the duplicate waits for the job", || {
        let reply = server.cmd(&["PUBSUB", "NUMSUB", &channel]);
        reply.as_array().unwrap()[1].as_int().unwrap() >= 1
    })
    .await;
    assert!(
        ledger(&app).await.is_empty(),
        "applied before the work ended"
    );
    work.release.send(()).unwrap();

    let b = timeout(LIMIT, second).await.unwrap().unwrap();
    final_answer_of(&b, delivery, &first);
    final_answer_of(
        &send(&app, github_job(delivery, &body)).await,
        delivery,
        &first,
    );
    assert_eq!(probe.runs(delivery), 1);
    assert_eq!(ledger(&app).await, counts(&[(delivery, 1)]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_github_job_that_fails_releases_its_lock_and_the_redelivery_runs_it() {
    let server = RedisServer::start();
    let (probe, _holds) = Probe::new();
    let app = redis_app(&server, options(&probe));
    let delivery = "d-job-fails";
    probe.plan(delivery, [Step::Fail]);
    let body = Bytes::from_static(br#"{"action":"requested","workflow_run":{"id":31}}"#);

    accepted(&send(&app, github_job(delivery, &body)).await, delivery);
    // The failed work stored nothing and freed the key: the redelivery
    // runs (once the lock is released; a duplicate meanwhile waits).
    let again = until_not_contended(&app, || github_job(delivery, &body)).await;
    accepted(&again, delivery);
    until("the second run applied", || probe.runs(delivery) == 2).await;
    let mut last = None;
    assert!(
        support::eventually(LIMIT, async || {
            let r = send(&app, github_job(delivery, &body)).await;
            let done = r.replayed();
            last = Some(r);
            done
        })
        .await
    );
    final_answer_of(&last.unwrap(), delivery, &again);
    assert_eq!(probe.runs(delivery), 2);
    assert_eq!(ledger(&app).await, counts(&[(delivery, 1)]));
}

// ---------------------------------------------------------------------------
// Slow clients: the body deadline, the Content-Length check, the request
// timeout. Each test makes one limit short and the others longer than any
// wait here.
// ---------------------------------------------------------------------------

/// Longer than any test waits: a limit that must not be the one that acts.
const NEVER: Duration = Duration::from_secs(600);
/// The one limit under test.
const SHORT: Duration = Duration::from_millis(300);

/// Timeouts read from the environment as the example's `main` does.
fn timeouts(header: Duration, body: Duration, request: Duration) -> webhook::Timeouts {
    let ms = |d: Duration| d.as_millis().to_string();
    webhook::Settings::from_lookup(|name| match name {
        "HEADER_TIMEOUT_MS" => Some(ms(header)),
        "BODY_TIMEOUT_MS" => Some(ms(body)),
        "REQUEST_TIMEOUT_MS" => Some(ms(request)),
        _ => None,
    })
    .unwrap()
    .timeouts
}

/// A signed delivery's head for `body` on `route`, declaring `length`
/// bytes of body.
fn signed_head(route: &str, body: &[u8], length: usize) -> String {
    let signature = if route == STRIPE {
        format!(
            "Stripe-Signature: {}",
            webhook::sign(SECRET, webhook::unix_now(), body)
        )
    } else {
        format!(
            "X-GitHub-Delivery: d-slow\r\nX-Hub-Signature-256: {}",
            webhook::sign_github(SECRET, body)
        )
    };
    format!(
        "POST {route} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n\
         {signature}\r\nContent-Length: {length}\r\n\r\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_shorter_than_declared_gets_408_and_costs_no_redis_work() {
    let server = RedisServer::start();
    let (probe, _holds) = Probe::new();
    let app = redis_app(&server, options(&probe));
    let addr = serve_with(app.clone(), timeouts(NEVER, SHORT, NEVER)).await;
    let body = event("evt_short", "charge.succeeded");

    for route in [STRIPE, GITHUB] {
        // The head promises the whole body; a third of it comes, then
        // nothing, and the connection stays open on our side.
        let mut client = slow::open(addr, signed_head(route, &body, body.len()).as_bytes()).await;
        client.write_all(&body[..body.len() / 3]).await.unwrap();
        let closed = slow::until_closed(&mut client, LIMIT)
            .await
            .unwrap_or_else(|| panic!("{route}: a short body hung its connection"));
        assert_eq!(closed.status(), Some(408), "{route}: {}", closed.text());
        assert!(
            closed.text().contains("did not arrive in time"),
            "{route}: {}",
            closed.text()
        );
    }
    assert_eq!(probe.total_runs(), 0);
    assert_eq!(server.dbsize(), 0, "keys written: {:?}", server.keys());
    // The whole body on time goes through.
    send_tcp(addr, stripe(&body)).await.original("evt_short");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_over_limit_content_length_gets_413_before_the_body_is_read() {
    let server = RedisServer::start();
    let (probe, _holds) = Probe::new();
    let app = redis_app(&server, options(&probe));
    let addr = serve_with(app, timeouts(NEVER, NEVER, NEVER)).await;
    let body = event("evt_huge", "charge.succeeded");

    for route in [STRIPE, GITHUB] {
        // Only the head is sent: an answer can only come from the head.
        let head = signed_head(route, &body, webhook::MAX_BODY + 1);
        let mut client = slow::open(addr, head.as_bytes()).await;
        let closed = slow::until_closed(&mut client, LIMIT)
            .await
            .unwrap_or_else(|| panic!("{route}: waited for an over-limit body"));
        assert_eq!(closed.status(), Some(413), "{route}: {}", closed.text());
    }
    assert_eq!(probe.total_runs(), 0);
    assert_eq!(server.dbsize(), 0, "keys written: {:?}", server.keys());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_past_the_request_timeout_gets_408_and_the_retry_applies_once() {
    let server = RedisServer::start();
    let (probe, mut holds) = Probe::new();
    let app = redis_app(&server, options(&probe));
    let addr = serve_with(app.clone(), timeouts(NEVER, NEVER, SHORT)).await;
    let id = "evt_stuck";
    probe.plan(id, [Step::Hold]);
    let body = event(id, "charge.succeeded");

    // The delivery hangs in its handler, holding the lock, until the
    // request timeout drops it.
    let reply = send_tcp(addr, stripe(&body)).await;
    assert_eq!(reply.status, StatusCode::REQUEST_TIMEOUT, "{reply:?}");
    let stuck = held(&mut holds).await;
    until("the stuck delivery is cancelled", || {
        stuck.release.is_closed()
    })
    .await;
    until("the stuck delivery's lock is released", || {
        !exists(&server, &redis_name("stripe", "evt_stuck", "lock"))
    })
    .await;
    assert!(!exists(
        &server,
        &redis_name("stripe", "evt_stuck", "record")
    ));
    assert_eq!(ledger(&app).await, counts(&[]));

    // Stripe retries; this time it completes, once.
    let retry = until_not_contended(&app, || stripe(&body)).await;
    retry.original(id);
    send(&app, stripe(&body)).await.replay_of(&retry);
    assert_eq!(probe.runs(id), 2);
    assert_eq!(ledger(&app).await, counts(&[(id, 1)]));
}

// ---------------------------------------------------------------------------
// GitHub replays: the delivery id is unsigned, the body is not
// ---------------------------------------------------------------------------

/// Lowercase hex SHA-256 of `body`: the GitHub route's lock id.
fn digest(body: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(body))
}

/// The release channel of the GitHub lock on `body`.
fn released_channel(body: &[u8]) -> String {
    redis_name("github", &digest(body), "released")
}

/// A captured, validly signed delivery is sent again under fresh delivery
/// ids, one after another and then all at once while the first still runs:
/// one effect each time, every replay answered with the first's response.
/// `waiting(body)` tells whether a duplicate waits for the lock on `body`
/// (the store's own signal, where it has one).
async fn replays_with_fresh_delivery_ids_apply_once(
    app: Router,
    probe: Arc<Probe>,
    mut holds: mpsc::UnboundedReceiver<Held>,
    waiting: impl Fn(&[u8]) -> bool,
) {
    const N: usize = 8;
    // One after another.
    let push = Bytes::from_static(br#"{"ref":"refs/heads/main","after":"5f1c0de"}"#);
    let first = send(&app, github("d-original", &push)).await;
    first.original("d-original");
    for i in 0..3 {
        send(&app, github(&format!("d-replay-{i}"), &push))
            .await
            .replay_of(&first);
    }
    assert_eq!(probe.total_runs(), 1, "a replay ran the handler");

    // All at once, while the first delivery of another body still runs.
    let entered = Arc::new(AtomicUsize::new(0));
    let counted = {
        let entered = entered.clone();
        app.clone().layer(axum::middleware::from_fn(
            move |req, next: axum::middleware::Next| {
                entered.fetch_add(1, Ordering::SeqCst);
                next.run(req)
            },
        ))
    };
    let opened = Bytes::from_static(br#"{"action":"opened","number":12}"#);
    probe.plan("d-held", [Step::Hold]);
    let spawn = |req: Request<Body>| {
        let app = counted.clone();
        tokio::spawn(async move { send(&app, req).await })
    };
    let held_first = spawn(github("d-held", &opened));
    let gate = held(&mut holds).await;
    assert_eq!(gate.id, "d-held");
    let replays: Vec<_> = (0..N)
        .map(|i| spawn(github(&format!("d-storm-{i}"), &opened)))
        .collect();
    until("the replays are inside and wait for the lock", || {
        entered.load(Ordering::SeqCst) == N + 1 && waiting(&opened)
    })
    .await;
    assert!(
        replays.iter().all(|r| !r.is_finished()),
        "a replay was answered while the first ran"
    );
    gate.release.send(()).unwrap();
    let first = timeout(LIMIT, held_first).await.unwrap().unwrap();
    first.original("d-held");
    for r in replays {
        timeout(LIMIT, r).await.unwrap().unwrap().replay_of(&first);
    }

    assert_eq!(probe.total_runs(), 2, "a replay ran the handler");
    assert_eq!(probe.max_in_flight(), 1);
    // One entry per body, under the delivery id that applied it.
    assert_eq!(
        ledger(&app).await,
        counts(&[("d-original", 1), ("d-held", 1)])
    );
    // Another body is another delivery, whatever its delivery id says.
    let other = Bytes::from_static(br#"{"ref":"refs/heads/main","after":"5f1c0df"}"#);
    send(&app, github("d-replay-0", &other))
        .await
        .original("d-replay-0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_github_delivery_with_fresh_delivery_ids_applies_once_on_redis() {
    let server = RedisServer::start();
    let (probe, holds) = Probe::new();
    let app = redis_app(&server, options(&probe));
    replays_with_fresh_delivery_ids_apply_once(app, probe, holds, |body| {
        let reply = server.cmd(&["PUBSUB", "NUMSUB", &released_channel(body)]);
        reply.as_array().unwrap()[1].as_int().unwrap() >= 1
    })
    .await;
    // The lock and the record are the body's, not the delivery id's.
    let push = br#"{"ref":"refs/heads/main","after":"5f1c0de"}"#;
    assert!(exists(
        &server,
        &redis_name("github", &digest(push), "record")
    ));
    let keys = server.keys();
    assert!(
        keys.iter()
            .all(|k| !(k.starts_with("trl:") && k.contains("}:d-"))),
        "a key of a delivery id: {keys:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_github_delivery_with_fresh_delivery_ids_applies_once_in_memory() {
    let (probe, holds) = Probe::new();
    let store = MemoryStore::new();
    let app = webhook::app(store.clone(), Ledger::memory(), options(&probe)).unwrap();
    let key = |body: &[u8]| tower_redis_lock::LockKey::new("github", digest(body)).unwrap();
    // The memory store shows the lock held, not its waiters: the replays
    // entered the app while it was held.
    replays_with_fresh_delivery_ids_apply_once(app, probe, holds, |body| {
        store.is_locked(&key(body))
    })
    .await;
}

// ---------------------------------------------------------------------------
// The ledger's fencing rule, and the memory store
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ledger_refuses_writes_with_an_older_fencing_token() {
    let server = RedisServer::start();
    for ledger in [Ledger::memory(), Ledger::redis(&server.url()).unwrap()] {
        let t = FencingToken::new;
        assert_eq!(
            ledger.apply("e", t(10)).await,
            Ok(Applied::Counted { count: 1 })
        );
        // A paused former holder wakes up: refused, count unchanged.
        assert_eq!(
            ledger.apply("e", t(9)).await,
            Ok(Applied::Stale { seen: 10 })
        );
        // The same holder again, and a newer one, are accepted.
        assert_eq!(
            ledger.apply("e", t(10)).await,
            Ok(Applied::Counted { count: 2 })
        );
        assert_eq!(
            ledger.apply("e", t(11)).await,
            Ok(Applied::Counted { count: 3 })
        );
        assert_eq!(ledger.counts().await, Ok(counts(&[("e", 3)])), "{ledger:?}");
    }
}

#[tokio::test]
async fn memory_store_smoke() {
    let (probe, _holds) = Probe::new();
    let app = webhook::app(MemoryStore::new(), Ledger::memory(), options(&probe)).unwrap();

    let body = event("evt_mem", "charge.succeeded");
    let first = send(&app, stripe(&body)).await;
    first.original("evt_mem");
    send(&app, stripe(&body)).await.replay_of(&first);
    send(&app, stripe(&event("evt_mem", "other")))
        .await
        .problem(StatusCode::UNPROCESSABLE_ENTITY);
    let mut forged = stripe(&body);
    forged.headers_mut().insert(
        "stripe-signature",
        webhook::sign("nope", webhook::unix_now(), &body)
            .parse()
            .unwrap(),
    );
    send(&app, forged).await.problem(StatusCode::BAD_REQUEST);

    let push = Bytes::from_static(br#"{"ref":"refs/heads/main"}"#);
    let gh = send(&app, github("d-1", &push)).await;
    gh.original("d-1");
    send(&app, github("d-1", &push)).await.replay_of(&gh);

    assert_eq!(ledger(&app).await, counts(&[("evt_mem", 1), ("d-1", 1)]));
    assert_eq!(probe.total_runs(), 2);
}

#[test]
fn signatures_and_settings() {
    let body = b"{\"id\":\"evt_1\"}";
    let now = 1_700_000_000;
    let header = webhook::sign("s", now, body);
    assert!(header.starts_with(&format!("t={now},v1=")));
    let tol = webhook::TOLERANCE;
    assert_eq!(webhook::verify_stripe("s", &header, body, now, tol), Ok(()));
    assert_eq!(
        webhook::verify_stripe("s", &header, body, now + 300, tol),
        Ok(())
    );
    assert!(webhook::verify_stripe("s", &header, body, now + 301, tol).is_err());
    // While a secret is rolled, several v1 signatures are sent; any may match.
    let old = webhook::sign("old", now, body);
    let rolled = format!("{header},{}", old.split_once(',').unwrap().1);
    assert_eq!(
        webhook::verify_stripe("old", &rolled, body, now, tol),
        Ok(())
    );
    assert_eq!(webhook::verify_stripe("s", &rolled, body, now, tol), Ok(()));
    assert!(webhook::verify_stripe("x", &rolled, body, now, tol).is_err());
    // v0 (Stripe's test scheme) is not accepted on its own.
    let v0 = header.replace("v1=", "v0=");
    assert!(webhook::verify_stripe("s", &v0, body, now, tol).is_err());

    let gh = webhook::sign_github("s", body);
    assert_eq!(webhook::verify_github("s", &gh, body), Ok(()));
    assert!(webhook::verify_github("s", &gh, b"{}").is_err());

    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |name: &str| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    };
    let s = webhook::Settings::from_lookup(env(&[])).unwrap();
    assert_eq!(s.port, 3000);
    assert_eq!(s.redis_url, None);
    assert_eq!(s.secret, webhook::DEFAULT_SECRET);
    assert_eq!(s.work, webhook::DEFAULT_WORK);
    assert_eq!(s.timeouts, webhook::DEFAULT_TIMEOUTS);
    assert!(s.timeouts.request > webhook::GITHUB_WAIT);
    let s = webhook::Settings::from_lookup(env(&[
        ("PORT", "0"),
        ("WORK_MS", " 5 "),
        ("WEBHOOK_SECRET", "whsec_x"),
        ("REDIS_URL", "redis://h/"),
    ]))
    .unwrap();
    assert_eq!(
        (s.port, s.work, s.secret.as_str(), s.redis_url.as_deref()),
        (0, Duration::from_millis(5), "whsec_x", Some("redis://h/"))
    );
    for (name, bad) in [
        ("PORT", "70000"),
        ("PORT", "x"),
        ("WORK_MS", "-1"),
        ("HEADER_TIMEOUT_MS", "0"),
        ("BODY_TIMEOUT_MS", "1.5"),
        ("REQUEST_TIMEOUT_MS", "x"),
    ] {
        let err = webhook::Settings::from_lookup(|n: &str| (n == name).then(|| bad.to_owned()))
            .unwrap_err();
        assert!(err.starts_with(name), "{err}");
    }
}
