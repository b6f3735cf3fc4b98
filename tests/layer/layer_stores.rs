//! The layer's behaviour, written once and run against every store, the way
//! tower-sessions runs one suite against every session store: the memory
//! store, one Redis, Redlock over 5 primaries, a Redis Cluster of 3
//! primaries and a Sentinel set (fixtures in `support::stores`, real
//! `redis-server` processes on free ports).
//!
//! Topologies take seconds to start, so each store gets one test: it starts
//! its store once and runs every scenario in turn, each in its own task and
//! its own namespace. A failing scenario is reported by name and does not
//! stop the others.
//!
//! What does not depend on the store (key sources, bodies, settings, the
//! service contract) is in `tests/layer.rs`; what a stored record holds, in
//! `tests/idempotency.rs`.

use crate::support;

use support::http::{Gate, Gates, join, post_to, send, spawn_send};
use support::stores;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Extension;
use axum::routing::{MethodRouter, post};
use bytes::Bytes;
use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::BodyExt;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::{Barrier, mpsc};
use tokio::task::JoinError;
use tokio::time::timeout;
use tower::ServiceExt;
use tower_redis_lock::{
    FencingToken, Idempotency, KeyFrom, LockGuard, LockKey, LockLayer, LockStore, Locker,
    OnLockLost,
};

/// Upper bound on every wait for a condition. Reached only when the test
/// fails; a passing run never waits this long.
const LIMIT: Duration = Duration::from_secs(10);
/// Upper bound on one scenario, so that a hung one is reported by name.
const SCENARIO_LIMIT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------
// The suite, per store
// ---------------------------------------------------------------------------

/// One test per store: `name: fixture` (the fixture returns the store and
/// what must stay alive with it).
macro_rules! on_every_store {
    ($($name:ident: $fixture:expr),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let (store, _keep) = $fixture;
                every_scenario(stringify!($name), store).await;
            }
        )*
    };
}

on_every_store!(
    memory: stores::memory(),
    redis: stores::redis(),
    redlock: stores::redlock(5),
    cluster: stores::cluster(),
    sentinel: stores::sentinel(),
    boxed_memory: stores::boxed(stores::memory()),
);

/// `(name, scenario(store.clone()))` for each listed scenario.
macro_rules! scenarios {
    ($store:ident: $($scenario:ident),* $(,)?) => {
        vec![$((stringify!($scenario), $scenario($store.clone()).boxed())),*]
    };
}

async fn every_scenario<St: LockStore + Clone>(store_name: &str, store: St) {
    let scenarios: Vec<(&str, BoxFuture<'static, ()>)> = scenarios!(store:
        contention_answers_409_or_423_with_retry_after_and_the_handler_does_not_run,
        the_fencing_token_is_the_same_everywhere_and_rises_with_every_grant,
        concurrent_duplicates_run_one_at_a_time_and_all_succeed,
        a_panicking_handler_leaves_no_lock_behind,
        a_dropped_response_future_leaves_no_lock_behind,
        a_client_hanging_up_mid_handler_leaves_no_lock_behind,
        hold_until_body_end_keeps_the_lock_until_the_body_ends_or_is_dropped,
        a_lost_lock_aborts_the_handler_with_503_when_asked,
        a_lost_lock_reaches_a_handler_that_keeps_running,
        a_completed_request_is_replayed_not_run_again,
        an_in_flight_duplicate_gets_409_and_later_the_replay,
        a_waiting_duplicate_gets_the_replay_when_the_first_finishes,
        different_keys_run_in_parallel,
        nested_layers_and_the_handler_reenter_one_lock,
    );
    let total = scenarios.len();
    let mut failed = Vec::new();
    for (name, scenario) in scenarios {
        let mut task = tokio::spawn(scenario);
        let why = match timeout(SCENARIO_LIMIT, &mut task).await {
            Ok(Ok(())) => continue,
            Ok(Err(e)) => panic_message(e),
            Err(_) => {
                task.abort();
                format!("did not finish within {SCENARIO_LIMIT:?}")
            }
        };
        failed.push(format!("  {name}: {}", why.replace('\n', "\n    ")));
    }
    assert!(
        failed.is_empty(),
        "{} of {total} scenarios failed on the {store_name} store:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

fn panic_message(e: JoinError) -> String {
    match e.try_into_panic() {
        Ok(panic) => panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "panicked".to_owned()),
        Err(e) => e.to_string(),
    }
}

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// Polls `cond` every 5 ms until it holds or `LIMIT` passes.
///
/// Scenarios run in spawned tasks, so their futures must be `Send`: give
/// `cond` as an `async move` closure that owns what it uses (one that
/// borrows makes the future `Send` for one lifetime only, which the compiler
/// rejects).
async fn eventually(cond: impl AsyncFnMut() -> bool) -> bool {
    support::eventually(LIMIT, cond).await
}

fn key(ns: &str, id: &str) -> LockKey {
    LockKey::new(ns, id).unwrap()
}

/// `POST /jobs/{id}`, the route of every scenario, on `handler` under `layer`.
fn locked<St: LockStore>(layer: LockLayer<St>, handler: MethodRouter) -> Router {
    Router::new().route("/jobs/{id}", handler.route_layer(layer))
}

/// A layer keyed on the `{id}` path parameter in namespace `ns`.
fn layer<St: LockStore>(locker: Locker<St>, ns: &str) -> LockLayer<St> {
    LockLayer::builder(locker, KeyFrom::path_param::<String>("id"))
        .namespace(ns)
        .build()
        .unwrap()
}

/// A handler that waits at `gate` until let go, then answers `then()`.
fn gated(gate: Gate, then: fn() -> &'static str) -> MethodRouter {
    post(move || async move {
        gate.pass().await;
        then()
    })
}

/// A gated handler under a try-lock layer in namespace `ns`.
fn gated_app<St: LockStore>(store: St, ns: &str, then: fn() -> &'static str) -> (Router, Gates) {
    let (gate, gates) = Gate::new();
    (
        locked(layer(Locker::new(store), ns), gated(gate, then)),
        gates,
    )
}

/// Whether `key` can be locked right now; a lock taken to find out is
/// released at once.
async fn lockable<St: LockStore>(probe: &Locker<St>, key: &LockKey) -> bool {
    match probe.try_acquire(key).await {
        Ok(guard) => {
            assert!(guard.release().await.unwrap(), "the probe's lock of {key}");
            true
        }
        Err(e) if e.is_contended() => false,
        Err(e) => panic!("probing {key}: {e}"),
    }
}

/// Waits until `key` can be locked (see [`lockable`]).
async fn eventually_lockable<St: LockStore>(probe: Locker<St>, key: LockKey) -> bool {
    eventually(async move || lockable(&probe, &key).await).await
}

/// Serves `app` on 127.0.0.1 on a free port.
async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

// ---------------------------------------------------------------------------
// Contention
// ---------------------------------------------------------------------------

async fn contention_answers_409_or_423_with_retry_after_and_the_handler_does_not_run<
    St: LockStore + Clone,
>(
    store: St,
) {
    // (namespace, contention status, lease, wait timeout)
    let cases = [
        ("contention-409", None, 30u64, Duration::ZERO),
        (
            "contention-423",
            Some(StatusCode::LOCKED),
            5,
            Duration::ZERO,
        ),
        // A bounded wait that runs out answers like a try-lock.
        ("contention-wait", None, 30, Duration::from_millis(20)),
    ];
    for (ns, status, lease_s, wait) in cases {
        let locker = Locker::builder(store.clone())
            .lease(Duration::from_secs(lease_s))
            .wait_timeout(wait)
            .build()
            .unwrap();
        let mut builder = LockLayer::builder(locker, KeyFrom::path_param::<String>("id"))
            .namespace(ns)
            .expose_lock_key(true);
        if let Some(status) = status {
            builder = builder.contention_status(status);
        }
        let (gate, mut gates) = Gate::new();
        let app = locked(builder.build().unwrap(), gated(gate, || "captured"));

        let holder = spawn_send(&app, post_to("/jobs/o1"));
        let let_go = gates.started().await;
        let r = send(&app, post_to("/jobs/o1")).await;
        let v = r.problem(status.unwrap_or(StatusCode::CONFLICT));
        assert_eq!(v["lock_key"], format!("{ns}:o1"), "{v}");
        // The holder's remaining lease, in whole seconds rounded up. The
        // watchdog renews every lease/3, so it never falls below 2/3 of it.
        let after = r.retry_after();
        assert!(
            after >= lease_s * 2 / 3 && after <= lease_s,
            "{ns}: Retry-After {after} for a lease of {lease_s} s"
        );
        assert!(gates.none_started(), "{ns}: the contender's handler ran");

        let_go.send(()).unwrap();
        let h = join(holder).await;
        assert_eq!(h.status, StatusCode::OK, "{ns}: {h:?}");
        assert_eq!(h.text(), "captured");
        // Released before the answer left: the next request runs.
        let mut next = spawn_send(&app, post_to("/jobs/o1"));
        tokio::select! {
            let_go = gates.started() => let_go.send(()).unwrap(),
            r = &mut next => panic!("{ns}: the next request did not run: {r:?}"),
        }
        assert_eq!(join(next).await.status, StatusCode::OK, "{ns}");
    }
}

// ---------------------------------------------------------------------------
// Fencing tokens
// ---------------------------------------------------------------------------

async fn fencing_handler(guard: LockGuard, Extension(token): Extension<FencingToken>) -> String {
    format!("{} {}", guard.fencing_token().unwrap().get(), token.get())
}

async fn the_fencing_token_is_the_same_everywhere_and_rises_with_every_grant<
    St: LockStore + Clone,
>(
    store: St,
) {
    let app = locked(
        layer(Locker::new(store.clone()), "fencing"),
        post(fencing_handler),
    );
    let probe = Locker::new(store);
    let k = key("fencing", "j1");
    let mut last = 0;
    for round in 0..6 {
        let token = if round == 3 {
            // A grant outside the layer, on the same key: the counter is
            // the store's, so the layer's next token is larger still.
            let guard = probe.try_acquire(&k).await.unwrap();
            let token = guard.fencing_token().unwrap().get();
            assert!(guard.release().await.unwrap());
            token
        } else {
            let r = send(&app, post_to("/jobs/j1")).await;
            assert_eq!(r.status, StatusCode::OK, "round {round}: {r:?}");
            let header = r.fencing();
            let text = r.text();
            let (from_guard, from_extension) = text.split_once(' ').unwrap();
            assert_eq!(from_guard.parse::<u64>().unwrap(), header, "round {round}");
            assert_eq!(
                from_extension.parse::<u64>().unwrap(),
                header,
                "round {round}"
            );
            header
        };
        assert!(token > last, "round {round}: token {token} after {last}");
        last = token;
    }
}

// ---------------------------------------------------------------------------
// Mutual exclusion
// ---------------------------------------------------------------------------

async fn concurrent_duplicates_run_one_at_a_time_and_all_succeed<St: LockStore + Clone>(store: St) {
    const CLIENTS: usize = 16;
    const EACH: usize = 25;
    let locker = Locker::builder(store.clone())
        .wait_timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let inside = Arc::new(AtomicU32::new(0));
    let most_inside = Arc::new(AtomicU32::new(0));
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let handler = {
        let (inside, most_inside, tokens) = (inside.clone(), most_inside.clone(), tokens.clone());
        move |guard: LockGuard| async move {
            let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
            most_inside.fetch_max(now, Ordering::SeqCst);
            tokens
                .lock()
                .unwrap()
                .push(guard.fencing_token().unwrap().get());
            // Give any other request the chance to come in.
            for _ in 0..3 {
                tokio::task::yield_now().await;
            }
            inside.fetch_sub(1, Ordering::SeqCst);
            "done"
        }
    };
    let app = locked(layer(locker, "mutex"), post(handler));

    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move {
                let mut replies = Vec::new();
                for _ in 0..EACH {
                    replies.push(send(&app, post_to("/jobs/o1")).await);
                }
                replies
            })
        })
        .collect();
    for client in clients {
        let replies = timeout(SCENARIO_LIMIT, client)
            .await
            .expect("the requests did not finish")
            .unwrap();
        for r in replies {
            assert_eq!(r.status, StatusCode::OK, "{r:?}");
        }
    }
    assert_eq!(
        most_inside.load(Ordering::SeqCst),
        1,
        "two handlers ran at once"
    );
    let tokens = tokens.lock().unwrap().clone();
    assert_eq!(tokens.len(), CLIENTS * EACH);
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens not strictly increasing in grant order: {tokens:?}"
    );
    let probe = Locker::new(store);
    assert!(lockable(&probe, &key("mutex", "o1")).await);
}

// ---------------------------------------------------------------------------
// No lock left behind
// ---------------------------------------------------------------------------

/// How a request under the lock ends without an answer.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Ending {
    HandlerPanics,
    ResponseFutureDropped,
    ClientHangsUp,
}

fn panics() -> &'static str {
    panic!("handler panicked on purpose")
}

/// Runs a handler under a 30 s lease, ends its request by `ending`, and
/// waits at most `LIMIT` for the key to be free: only a release can free it
/// that soon.
async fn leaves_no_lock_behind<St: LockStore + Clone>(store: St, ns: &str, ending: Ending) {
    let then = match ending {
        Ending::HandlerPanics => panics,
        _ => || "done",
    };
    let (app, mut gates) = gated_app(store.clone(), ns, then);
    let probe = Locker::new(store);
    let k = key(ns, "a");

    let (task, client) = if ending == Ending::ClientHangsUp {
        let mut client = TcpStream::connect(serve(app).await).await.unwrap();
        client
            .write_all(b"POST /jobs/a HTTP/1.1\r\nHost: test\r\nContent-Length: 0\r\n\r\n")
            .await
            .unwrap();
        (None, Some(client))
    } else {
        (Some(tokio::spawn(app.oneshot(post_to("/jobs/a")))), None)
    };
    let mut let_go = gates.started().await;
    assert!(!lockable(&probe, &k).await, "not locked while it runs");
    match ending {
        Ending::HandlerPanics => {
            let_go.send(()).unwrap();
            let task = task.expect("the request runs in a task");
            let err = timeout(LIMIT, task).await.unwrap().unwrap_err();
            assert!(err.is_panic(), "{err}");
        }
        Ending::ResponseFutureDropped | Ending::ClientHangsUp => {
            if let Some(task) = task {
                task.abort();
            }
            drop(client);
            // The handler's end of the gate goes with its future.
            timeout(LIMIT, let_go.closed())
                .await
                .unwrap_or_else(|_| panic!("{ending:?}: the handler's future was not dropped"));
        }
    }
    assert!(
        eventually_lockable(probe, k).await,
        "the key stayed locked after {ending:?}"
    );
}

async fn a_panicking_handler_leaves_no_lock_behind<St: LockStore + Clone>(store: St) {
    leaves_no_lock_behind(store, "panic", Ending::HandlerPanics).await;
}

async fn a_dropped_response_future_leaves_no_lock_behind<St: LockStore + Clone>(store: St) {
    leaves_no_lock_behind(store, "dropped", Ending::ResponseFutureDropped).await;
}

async fn a_client_hanging_up_mid_handler_leaves_no_lock_behind<St: LockStore + Clone>(store: St) {
    leaves_no_lock_behind(store, "hang-up", Ending::ClientHangsUp).await;
}

// ---------------------------------------------------------------------------
// Holding the lock until the response body ends
// ---------------------------------------------------------------------------

/// A layer in namespace `ns`, holding the lock until the response body
/// ends if `hold`, on a handler that answers with a body the test feeds
/// through the sender it receives (one per request that ran).
fn streaming_app<St: LockStore>(
    store: St,
    ns: &str,
    hold: bool,
) -> (Router, mpsc::UnboundedReceiver<mpsc::Sender<Bytes>>) {
    let (senders_tx, senders) = mpsc::unbounded_channel();
    let layer = LockLayer::builder(Locker::new(store), KeyFrom::path_param::<String>("id"))
        .namespace(ns)
        .hold_until_body_end(hold)
        .build()
        .unwrap();
    let handler = post(move || async move {
        let (tx, rx) = mpsc::channel::<Bytes>(1);
        let _ = senders_tx.send(tx);
        Body::from_stream(futures_util::stream::unfold(rx, |mut rx| async move {
            let chunk = rx.recv().await?;
            Some((Ok::<_, Infallible>(chunk), rx))
        }))
    });
    (locked(layer, handler), senders)
}

/// A request's response head, its body, and the sender that feeds the body.
async fn head(
    app: &Router,
    senders: &mut mpsc::UnboundedReceiver<mpsc::Sender<Bytes>>,
) -> (Body, mpsc::Sender<Bytes>) {
    let res = timeout(LIMIT, app.clone().oneshot(post_to("/jobs/f1")))
        .await
        .expect("no response head")
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let tx = senders.try_recv().expect("the handler did not run");
    (res.into_body(), tx)
}

async fn hold_until_body_end_keeps_the_lock_until_the_body_ends_or_is_dropped<
    St: LockStore + Clone,
>(
    store: St,
) {
    let probe = Locker::new(store.clone());

    // By default the lock goes before the head.
    let (app, mut senders) = streaming_app(store.clone(), "body-head", false);
    let _streaming = head(&app, &mut senders).await;
    assert!(
        lockable(&probe, &key("body-head", "f1")).await,
        "locked after the head"
    );

    let (app, mut senders) = streaming_app(store, "body-end", true);
    let k = key("body-end", "f1");
    // The head is out, the body is not over: still locked.
    let (mut body, tx) = head(&app, &mut senders).await;
    assert!(!lockable(&probe, &k).await, "unlocked with the head");
    tx.send(Bytes::from_static(b"chunk")).await.unwrap();
    let frame = timeout(LIMIT, body.frame())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(frame.into_data().unwrap(), "chunk");
    assert!(
        !lockable(&probe, &k).await,
        "unlocked after the first chunk"
    );
    // The body ends (and stays alive): the lock goes.
    drop(tx);
    assert!(timeout(LIMIT, body.frame()).await.unwrap().is_none());
    assert!(
        eventually_lockable(probe.clone(), k.clone()).await,
        "still locked after the body ended"
    );

    // A body dropped before its end (client gone) lets go of the lock too.
    let (body, _tx) = head(&app, &mut senders).await;
    assert!(!lockable(&probe, &k).await, "unlocked with the head");
    drop(body);
    assert!(
        eventually_lockable(probe, k).await,
        "still locked after the body was dropped"
    );
}

// ---------------------------------------------------------------------------
// Lock loss
// ---------------------------------------------------------------------------

/// A locker whose locks end under their holder: the hold cap stops the
/// renewals, whatever the store.
fn losing_locker<St: LockStore>(store: St) -> Locker<St> {
    Locker::builder(store)
        .lease(Duration::from_millis(300))
        .max_hold(Duration::from_millis(600))
        .build()
        .unwrap()
}

async fn a_lost_lock_aborts_the_handler_with_503_when_asked<St: LockStore + Clone>(store: St) {
    let layer = LockLayer::builder(
        losing_locker(store.clone()),
        KeyFrom::path_param::<String>("id"),
    )
    .expose_lock_key(true)
    .namespace("lost-abort")
    .on_lock_lost(OnLockLost::Abort)
    .build()
    .unwrap();
    let (gate, mut gates) = Gate::new();
    // Never let go: only the loss can end it.
    let app = locked(layer, gated(gate, || "finished"));

    let task = spawn_send(&app, post_to("/jobs/a"));
    let mut let_go = gates.started().await;
    let r = join(task).await;
    let v = r.problem(StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(v["lock_key"], "lost-abort:a", "{v}");
    assert!(v["detail"].as_str().unwrap().contains("lost"), "{v}");
    assert!(r.retry_after() >= 1);
    assert!(r.headers.get("fencing-token").is_none(), "{r:?}");
    timeout(LIMIT, let_go.closed())
        .await
        .expect("the handler's future was not dropped");
    let probe = Locker::new(store);
    assert!(eventually_lockable(probe, key("lost-abort", "a")).await);
}

async fn a_lost_lock_reaches_a_handler_that_keeps_running<St: LockStore + Clone>(store: St) {
    let app = locked(
        layer(losing_locker(store), "lost-keep"),
        post(|guard: LockGuard| async move {
            let lost = timeout(LIMIT, guard.lost()).await.is_ok();
            format!("lost={lost} held={}", guard.is_held())
        }),
    );
    let r = send(&app, post_to("/jobs/b")).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(r.text(), "lost=true held=false");
}

// ---------------------------------------------------------------------------
// Idempotent replay
// ---------------------------------------------------------------------------

/// An idempotent layer in namespace `ns` on a handler that counts its runs
/// and answers `201 run <n>`, or `503` with an `x-fail` header. With a
/// gate, the handler waits there first.
fn idempotent_app<St: LockStore>(
    locker: Locker<St>,
    ns: &str,
    gate: Option<Gate>,
) -> (Router, Arc<AtomicU32>) {
    let runs = Arc::new(AtomicU32::new(0));
    let handler = {
        let runs = runs.clone();
        move |headers: HeaderMap| async move {
            let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
            if let Some(gate) = gate {
                gate.pass().await;
            }
            if headers.contains_key("x-fail") {
                (StatusCode::SERVICE_UNAVAILABLE, format!("run {run} failed"))
            } else {
                (StatusCode::CREATED, format!("run {run}"))
            }
        }
    };
    let layer = LockLayer::builder(locker, KeyFrom::path_param::<String>("id"))
        .expose_lock_key(true)
        .namespace(ns)
        .idempotent(Idempotency::new())
        .build()
        .unwrap();
    (locked(layer, post(handler)), runs)
}

fn event(id: &str, body: &'static str) -> Request<Body> {
    Request::post(format!("/jobs/{id}"))
        .body(Body::from(body))
        .unwrap()
}

async fn a_completed_request_is_replayed_not_run_again<St: LockStore + Clone>(store: St) {
    let (app, runs) = idempotent_app(Locker::new(store), "replay", None);
    let first = send(&app, event("e1", r#"{"n":1}"#)).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    assert!(!first.replayed());
    assert!(first.fencing() > 0);

    let again = send(&app, event("e1", r#"{"n":1}"#)).await;
    assert_eq!(again.status, StatusCode::CREATED, "{again:?}");
    assert!(again.replayed(), "{again:?}");
    assert_eq!(again.body, first.body);
    // The token of the run that answered, replayed with its answer.
    assert_eq!(again.fencing(), first.fencing(), "{again:?}");
    // The same key with another body is refused.
    let v = send(&app, event("e1", r#"{"n":2}"#))
        .await
        .problem(StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(v["lock_key"], "replay:e1", "{v}");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran again");

    // A 5xx is not stored: the retry runs, and then it is replayed.
    let failed = Request::post("/jobs/e2")
        .header("x-fail", "1")
        .body(Body::from("{}"))
        .unwrap();
    let failed = send(&app, failed).await;
    assert_eq!(failed.status, StatusCode::SERVICE_UNAVAILABLE, "{failed:?}");
    let retry = send(&app, event("e2", "{}")).await;
    assert_eq!(retry.status, StatusCode::CREATED, "{retry:?}");
    assert!(!retry.replayed());
    assert_eq!(retry.text(), "run 3");
    let again = send(&app, event("e2", "{}")).await;
    assert!(again.replayed(), "{again:?}");
    assert_eq!(again.body, retry.body);
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

async fn an_in_flight_duplicate_gets_409_and_later_the_replay<St: LockStore + Clone>(store: St) {
    let (gate, mut gates) = Gate::new();
    let (app, runs) = idempotent_app(Locker::new(store), "in-flight", Some(gate));
    let first = spawn_send(&app, event("e1", "{}"));
    let let_go = gates.started().await;
    let dup = send(&app, event("e1", "{}")).await;
    let v = dup.problem(StatusCode::CONFLICT);
    assert_eq!(v["lock_key"], "in-flight:e1", "{v}");
    assert!(dup.retry_after() >= 1);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the duplicate ran");

    let_go.send(()).unwrap();
    let first = join(first).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    let later = send(&app, event("e1", "{}")).await;
    assert!(later.replayed(), "{later:?}");
    assert_eq!(later.body, first.body);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

async fn a_waiting_duplicate_gets_the_replay_when_the_first_finishes<St: LockStore + Clone>(
    store: St,
) {
    let locker = Locker::builder(store).wait_timeout(LIMIT).build().unwrap();
    let (gate, mut gates) = Gate::new();
    let (app, runs) = idempotent_app(locker.clone(), "wait-replay", Some(gate));
    let first = spawn_send(&app, event("e1", "{}"));
    let let_go = gates.started().await;
    let dup = spawn_send(&app, event("e1", "{}"));
    let k = key("wait-replay", "e1");
    assert!(
        eventually(async move || locker.has_waiters(&k)).await,
        "the duplicate did not wait"
    );

    let_go.send(()).unwrap();
    let first = join(first).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    let dup = join(dup).await;
    assert_eq!(dup.status, StatusCode::CREATED, "{dup:?}");
    assert!(dup.replayed(), "{dup:?}");
    assert_eq!(dup.body, first.body);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the duplicate ran");
}

// ---------------------------------------------------------------------------
// Different keys
// ---------------------------------------------------------------------------

async fn different_keys_run_in_parallel<St: LockStore + Clone>(store: St) {
    // Each handler waits until both are inside.
    let barrier = Arc::new(Barrier::new(2));
    let app = locked(
        layer(Locker::new(store), "parallel"),
        post(move || async move {
            match timeout(LIMIT, barrier.wait()).await {
                Ok(_) => (StatusCode::OK, "met"),
                Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "alone"),
            }
        }),
    );
    let a = spawn_send(&app, post_to("/jobs/a"));
    let b = spawn_send(&app, post_to("/jobs/b"));
    for r in [join(a).await, join(b).await] {
        assert_eq!(r.status, StatusCode::OK, "{r:?}");
        assert_eq!(r.text(), "met");
    }
}

async fn nested_layers_and_the_handler_reenter_one_lock<St: LockStore + Clone>(store: St) {
    // Two layers on one key (try-lock both) and a handler that locks the
    // key again through a locker on a clone of the store: one grant, three
    // holds, one token; none of them waits for itself.
    let inner_locker = Locker::new(store.clone());
    let probe = Locker::new(store.clone());
    let handler = post(move |guard: LockGuard| {
        let locker = inner_locker.clone();
        async move {
            let again = locker.acquire(guard.key()).await.unwrap();
            assert_eq!(
                again.fencing_token().unwrap(),
                guard.fencing_token().unwrap()
            );
            let holds = again.hold_count();
            again.release().await.unwrap();
            assert!(guard.is_held(), "the layers' holds keep the lock");
            holds.to_string()
        }
    });
    let app = Router::new().route(
        "/jobs/{id}",
        handler
            .route_layer(layer(Locker::new(store.clone()), "reentry"))
            .route_layer(layer(Locker::new(store), "reentry")),
    );
    for _ in 0..2 {
        let r = send(&app, post_to("/jobs/r")).await;
        assert_eq!(r.status, StatusCode::OK, "{r:?}");
        assert_eq!(r.text(), "3");
        // Released with the last hold, before the response went out.
        assert!(lockable(&probe, &key("reentry", "r")).await);
    }
}
