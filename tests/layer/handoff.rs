//! Hand-off to background work (`HandOff`): a webhook answered `202
//! Accepted` at once while a worker keeps the lock, then stores the final
//! answer that later deliveries get replayed — in the same process (a
//! spawned task) on the memory store and on Redis, and in another process
//! (the test binary run again as the worker) on Redis. A duplicate
//! meanwhile gets 409 or waits for the final answer; a worker that dies
//! (task aborted, process killed) lets the next delivery run.

use crate::support;

use support::http::{Reply, join, send, spawn_send};
use support::{RedisServer, eventually, harness_name, kill_and_reap, spawn_dying_with_test};

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::routing::post;
use http::header::LOCATION;
use http::{HeaderName, Request, StatusCode};
use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, timeout};
use tower_redis_lock::{
    ExportedHandOff, HandOff, Idempotency, KeyFrom, LockGuard, LockKey, LockLayer, LockStore,
    Locker, MemoryStore, Record, RedisStore,
};

/// Upper bound on every wait for a condition; reached only on failure.
const LIMIT: Duration = Duration::from_secs(10);
const DELIVERY: HeaderName = HeaderName::from_static("x-delivery");
/// Short, so that a test outlives a few leases.
const LEASE: Duration = Duration::from_millis(800);
const NS: &str = "hooks";
/// Set in the worker process: the exported hand-off (JSON).
const JOB_ENV: &str = "HANDOFF_TEST_JOB";
/// Set in the worker process: the Redis URL.
const REDIS_ENV: &str = "HANDOFF_TEST_REDIS";

// ---------------------------------------------------------------------------
// The app: a webhook route whose handler hands its work off
// ---------------------------------------------------------------------------

/// What the test tells a waiting worker.
#[derive(Debug)]
enum Verdict {
    Finish,
    Release,
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// A task of this process does the work.
    Spawn,
    /// The work goes to another process: the handler exports it.
    Export,
}

struct Hooks {
    mode: Mode,
    runs: AtomicU64,
    /// Spawn: each worker reports here, then waits for its verdict.
    workers: mpsc::UnboundedSender<oneshot::Sender<Verdict>>,
    /// Spawn: the workers' tasks, to abort one.
    tasks: Mutex<Vec<tokio::task::AbortHandle>>,
    /// Export: the exported work, as JSON.
    jobs: mpsc::UnboundedSender<String>,
}

async fn hook(State(h): State<Arc<Hooks>>, handoff: HandOff) -> (StatusCode, String) {
    let run = h.runs.fetch_add(1, Ordering::SeqCst) + 1;
    match h.mode {
        Mode::Spawn => {
            let workers = h.workers.clone();
            let task = tokio::spawn(async move {
                let (tx, rx) = oneshot::channel();
                let _ = workers.send(tx);
                match rx.await {
                    Ok(Verdict::Finish) => {
                        let _ = handoff.finish(final_answer(run, "task")).await;
                    }
                    Ok(Verdict::Release) | Err(_) => {
                        let _ = handoff.release().await;
                    }
                }
            });
            h.tasks.lock().unwrap().push(task.abort_handle());
        }
        Mode::Export => {
            let job = serde_json::to_string(&handoff.export().unwrap()).unwrap();
            let _ = h.jobs.send(job);
        }
    }
    (StatusCode::ACCEPTED, format!("accepted, run {run}"))
}

/// The worker's final answer: 201 with where the report is.
fn final_answer(run: u64, by: &str) -> (StatusCode, [(HeaderName, String); 1], String) {
    (
        StatusCode::CREATED,
        [(LOCATION, format!("/reports/{run}"))],
        format!("report {run} by the {by}"),
    )
}

struct App {
    router: Router,
    hooks: Arc<Hooks>,
    workers: mpsc::UnboundedReceiver<oneshot::Sender<Verdict>>,
    jobs: mpsc::UnboundedReceiver<String>,
}

fn app<St: LockStore + Clone>(store: &St, mode: Mode, wait: Duration) -> (App, Locker<St>) {
    let (workers_tx, workers) = mpsc::unbounded_channel();
    let (jobs_tx, jobs) = mpsc::unbounded_channel();
    let hooks = Arc::new(Hooks {
        mode,
        runs: AtomicU64::new(0),
        workers: workers_tx,
        tasks: Mutex::new(Vec::new()),
        jobs: jobs_tx,
    });
    let locker = Locker::builder(store.clone())
        .lease(LEASE)
        .wait_timeout(wait)
        .build()
        .unwrap();
    let layer = LockLayer::builder(locker.clone(), KeyFrom::header(DELIVERY))
        .namespace(NS)
        .idempotent(Idempotency::new())
        .build()
        .unwrap();
    let router = Router::new()
        .route("/hook", post(hook).route_layer(layer))
        .with_state(hooks.clone());
    (
        App {
            router,
            hooks,
            workers,
            jobs,
        },
        locker,
    )
}

impl App {
    fn runs(&self) -> u64 {
        self.hooks.runs.load(Ordering::SeqCst)
    }

    async fn worker(&mut self) -> oneshot::Sender<Verdict> {
        timeout(LIMIT, self.workers.recv())
            .await
            .expect("no worker started")
            .unwrap()
    }
}

fn delivery(id: &str, body: &'static str) -> Request<Body> {
    Request::post("/hook")
        .header(DELIVERY, id)
        .body(Body::from(body))
        .unwrap()
}

async fn record<St: LockStore>(store: &St, id: &str) -> Option<Record> {
    let raw = store
        .read_record(&LockKey::new(NS, id).unwrap())
        .await
        .unwrap()?;
    Some(Record::decode(raw).unwrap())
}

/// The answer of a handed-off delivery: 202 at once, with the lock's
/// fencing token, never a replay.
fn accepted(r: &Reply, run: u64) -> u64 {
    assert_eq!(r.status, StatusCode::ACCEPTED, "{r:?}");
    assert_eq!(r.text(), format!("accepted, run {run}"));
    assert!(!r.replayed());
    r.fencing()
}

/// The worker's stored answer, replayed: what the worker gave, the run's
/// fencing token.
fn replay_of(r: &Reply, run: u64, by: &str, token: u64) {
    assert!(r.replayed(), "{r:?}");
    assert_eq!(r.status, StatusCode::CREATED);
    assert_eq!(
        r.header("location"),
        Some(format!("/reports/{run}").as_str())
    );
    assert_eq!(r.text(), format!("report {run} by the {by}"));
    assert_eq!(r.fencing(), token);
}

// ---------------------------------------------------------------------------
// In the same process, on every store
// ---------------------------------------------------------------------------

macro_rules! on_every_store {
    ($($name:ident),* $(,)?) => {
        mod memory_store {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::MemoryStore::new()).await
                }
            )*
        }
        mod redis_store {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let server = super::RedisServer::start();
                    super::$name(super::RedisStore::from_url(&server.url()).unwrap()).await
                }
            )*
        }
    };
}

on_every_store!(
    a_handed_off_delivery_is_answered_at_once_and_its_worker_stores_the_final_answer,
    a_duplicate_that_waits_gets_the_workers_final_answer,
    a_worker_that_is_aborted_or_releases_lets_the_next_delivery_run,
);

async fn a_handed_off_delivery_is_answered_at_once_and_its_worker_stores_the_final_answer<
    St: LockStore + Clone,
>(
    store: St,
) {
    let (mut app, _) = app(&store, Mode::Spawn, Duration::ZERO);
    // Answered while the work has not even started.
    let first = send(&app.router, delivery("d1", "{}")).await;
    let token = accepted(&first, 1);
    let worker = app.worker().await;
    assert!(record(&store, "d1").await.is_none(), "the 202 was stored");

    // Meanwhile, well past the lease the handler's answer began under: the
    // worker keeps the lock renewed, and a duplicate gets 409.
    tokio::time::sleep_until(Instant::now() + 2 * LEASE).await;
    let dup = send(&app.router, delivery("d1", "{}")).await;
    dup.problem(StatusCode::CONFLICT);
    assert!(dup.retry_after() >= 1);

    worker.send(Verdict::Finish).unwrap();
    assert!(eventually(LIMIT, async || record(&store, "d1").await.is_some()).await);
    let later = send(&app.router, delivery("d1", "{}")).await;
    replay_of(&later, 1, "task", token);
    // The request's fingerprint went with the work: another payload under
    // the same key is still refused.
    send(&app.router, delivery("d1", "{\"other\":1}"))
        .await
        .problem(StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(app.runs(), 1);
}

async fn a_duplicate_that_waits_gets_the_workers_final_answer<St: LockStore + Clone>(store: St) {
    let (mut app, locker) = app(&store, Mode::Spawn, LIMIT);
    let token = accepted(&send(&app.router, delivery("d2", "{}")).await, 1);
    let worker = app.worker().await;
    let dup = spawn_send(&app.router, delivery("d2", "{}"));
    let key = LockKey::new(NS, "d2").unwrap();
    assert!(eventually(LIMIT, async || locker.has_waiters(&key)).await);
    worker.send(Verdict::Finish).unwrap();
    replay_of(&join(dup).await, 1, "task", token);
    assert_eq!(app.runs(), 1);
}

async fn a_worker_that_is_aborted_or_releases_lets_the_next_delivery_run<St: LockStore + Clone>(
    store: St,
) {
    let (mut app, _) = app(&store, Mode::Spawn, Duration::ZERO);
    let first = accepted(&send(&app.router, delivery("d3", "{}")).await, 1);
    let _worker = app.worker().await;
    // The task dies (aborted): its HandOff is dropped, and with it the lock.
    app.hooks.tasks.lock().unwrap()[0].abort();
    let mut second = None;
    assert!(
        eventually(LIMIT, async || {
            let r = send(&app.router, delivery("d3", "{}")).await;
            let ran = r.status == StatusCode::ACCEPTED;
            second = ran.then_some(r);
            ran
        })
        .await
    );
    let second = accepted(&second.unwrap(), 2);
    assert!(second > first);
    assert!(record(&store, "d3").await.is_none());

    // A worker that releases stores nothing either: the next one runs at once.
    app.worker().await.send(Verdict::Release).unwrap();
    let mut third = None;
    assert!(
        eventually(LIMIT, async || {
            let r = send(&app.router, delivery("d3", "{}")).await;
            let ran = r.status == StatusCode::ACCEPTED;
            third = ran.then_some(r);
            ran
        })
        .await
    );
    accepted(&third.unwrap(), 3);
    assert!(record(&store, "d3").await.is_none());
    app.worker().await.send(Verdict::Finish).unwrap();
    assert!(eventually(LIMIT, async || record(&store, "d3").await.is_some()).await);
}

// ---------------------------------------------------------------------------
// The extractor's edges (memory store)
// ---------------------------------------------------------------------------

/// A request's lock is handed off once; a route without a lock layer has
/// none to hand off (500, a wiring mistake); a `HandOff` dropped unfinished
/// releases the lock even while a clone of its guard lives; a plain (not idempotent) lock
/// layer's hand-off stores nothing and frees the key when it finishes.
#[tokio::test]
async fn a_lock_is_handed_off_once_and_only_where_there_is_one() {
    async fn twice(
        first: HandOff,
        second: Result<HandOff, tower_redis_lock::MissingHandOff>,
    ) -> StatusCode {
        assert!(second.is_err(), "handed off twice");
        first.release().await.unwrap();
        StatusCode::OK
    }
    async fn plain(handoff: HandOff) -> StatusCode {
        tokio::spawn(async move {
            assert!(handoff.finish(StatusCode::OK).await.unwrap());
        });
        StatusCode::ACCEPTED
    }
    let keep: Arc<Mutex<Option<LockGuard>>> = Arc::default();
    let kept = keep.clone();
    let dropped = move |guard: LockGuard, handoff: HandOff| async move {
        *kept.lock().unwrap() = Some(guard);
        tokio::spawn(async move { drop(handoff) });
        StatusCode::ACCEPTED
    };
    let store = MemoryStore::new();
    let locker = Locker::new(store.clone());
    let plain_layer = |ns: &str| {
        LockLayer::builder(locker.clone(), KeyFrom::header(DELIVERY))
            .namespace(ns)
            .build()
            .unwrap()
    };
    let router = Router::new()
        .route("/twice", post(twice).route_layer(plain_layer("twice")))
        .route("/plain", post(plain).route_layer(plain_layer("plain")))
        .route(
            "/dropped",
            post(dropped).route_layer(plain_layer("dropped")),
        )
        .route("/unlocked", post(|_h: HandOff| async { StatusCode::OK }));
    let req = |path: &str| {
        Request::post(path)
            .header(DELIVERY, "p1")
            .body(Body::empty())
            .unwrap()
    };
    assert_eq!(send(&router, req("/twice")).await.status, StatusCode::OK);
    let unlocked = send(&router, req("/unlocked")).await;
    let p = unlocked.problem(StatusCode::INTERNAL_SERVER_ERROR);
    assert!(p["detail"].as_str().unwrap().contains("LockLayer"), "{p}");

    let dropped = send(&router, req("/dropped")).await;
    assert_eq!(dropped.status, StatusCode::ACCEPTED);
    // Dropped while a clone of its guard lives on: released all the same.
    let key = LockKey::new("dropped", "p1").unwrap();
    assert!(eventually(LIMIT, async || !store.is_locked(&key)).await);
    assert_eq!(
        send(&router, req("/dropped")).await.status,
        StatusCode::ACCEPTED
    );
    drop(keep.lock().unwrap().take());

    let first = send(&router, req("/plain")).await;
    assert_eq!(first.status, StatusCode::ACCEPTED);
    let key = LockKey::new("plain", "p1").unwrap();
    assert!(eventually(LIMIT, async || !store.is_locked(&key)).await);
    assert!(store.read_record(&key).await.unwrap().is_none());
    assert_eq!(
        send(&router, req("/plain")).await.status,
        StatusCode::ACCEPTED
    );
}

// ---------------------------------------------------------------------------
// Across processes, on Redis: the worker is this test binary run again
// ---------------------------------------------------------------------------

/// The worker process: resumes the exported hand-off from its environment,
/// says `RESUMED`, then finishes when told `finish` on stdin (or releases
/// when stdin ends), and says `FINISHED`.
fn run_worker_process(job: String) {
    let url = std::env::var(REDIS_ENV).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async move {
        let locker = Locker::builder(RedisStore::from_url(&url).unwrap())
            .lease(LEASE)
            .build()
            .unwrap();
        let exported: ExportedHandOff = serde_json::from_str(&job).unwrap();
        let handoff = exported.resume(&locker).await.unwrap();
        println!("RESUMED");
        std::io::stdout().flush().unwrap();
        let mut line = String::new();
        let read = tokio::task::spawn_blocking(move || {
            let _ = std::io::stdin().read_line(&mut line);
            line
        });
        if read.await.unwrap().trim() == "finish" {
            assert!(
                handoff
                    .finish(final_answer(1, "worker process"))
                    .await
                    .unwrap()
            );
        } else {
            handoff.release().await.unwrap();
        }
        println!("FINISHED");
        std::io::stdout().flush().unwrap();
    });
}

/// A worker process, its stdin, and the lines it says.
struct WorkerProcess {
    child: Child,
    said: std::sync::mpsc::Receiver<String>,
}

impl WorkerProcess {
    fn start(test: &str, job: &str, server: &RedisServer) -> WorkerProcess {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args([
            harness_name(module_path!(), test).as_str(),
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(JOB_ENV, job)
        .env(REDIS_ENV, server.url())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
        let mut child = spawn_dying_with_test(cmd).unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let (tx, said) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                // libtest may print "test name ... " before it on the line.
                for word in ["RESUMED", "FINISHED"] {
                    if line.contains(word) {
                        let _ = tx.send(word.to_owned());
                    }
                }
            }
        });
        WorkerProcess { child, said }
    }

    /// Waits (on a blocking thread) until the worker says `word`.
    async fn says(&self, word: &str) {
        let said = tokio::task::block_in_place(|| self.said.recv_timeout(Duration::from_secs(30)));
        assert_eq!(
            said.as_deref(),
            Ok(word),
            "the worker process did not say {word}"
        );
    }

    fn tell(&mut self, line: &str) {
        let stdin = self.child.stdin.as_mut().unwrap();
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        kill_and_reap(&mut self.child);
    }
}

/// The web process exports the work and answers 202; the worker process
/// resumes it, keeps the lock renewed past the lease (a duplicate gets
/// 409), and stores the final answer every later delivery gets.
#[test]
fn a_worker_process_resumes_the_handed_off_work_and_stores_its_final_answer() {
    if let Ok(job) = std::env::var(JOB_ENV) {
        return run_worker_process(job);
    }
    const TEST: &str = "a_worker_process_resumes_the_handed_off_work_and_stores_its_final_answer";
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let server = RedisServer::start();
        let store = RedisStore::from_url(&server.url()).unwrap();
        let (mut app, _) = app(&store, Mode::Export, Duration::ZERO);
        let token = accepted(&send(&app.router, delivery("x1", "{}")).await, 1);
        let job = app.jobs.recv().await.unwrap();
        let mut worker = WorkerProcess::start(TEST, &job, &server);
        worker.says("RESUMED").await;
        // Two leases on, only the worker process's renewals keep it.
        tokio::time::sleep_until(Instant::now() + 2 * LEASE).await;
        send(&app.router, delivery("x1", "{}"))
            .await
            .problem(StatusCode::CONFLICT);
        worker.tell("finish");
        worker.says("FINISHED").await;
        let later = send(&app.router, delivery("x1", "{}")).await;
        replay_of(&later, 1, "worker process", token);
        send(&app.router, delivery("x1", "[]"))
            .await
            .problem(StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(app.runs(), 1);
    });
}

/// A worker process killed while it holds the work: the lock lapses at
/// its lease (nobody renews it), and the next delivery runs.
#[test]
fn a_worker_process_that_dies_lets_the_lock_lapse_and_the_next_delivery_runs() {
    if let Ok(job) = std::env::var(JOB_ENV) {
        return run_worker_process(job);
    }
    const TEST: &str = "a_worker_process_that_dies_lets_the_lock_lapse_and_the_next_delivery_runs";
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let server = RedisServer::start();
        let store = RedisStore::from_url(&server.url()).unwrap();
        let (mut app, _) = app(&store, Mode::Export, Duration::ZERO);
        let first = accepted(&send(&app.router, delivery("x2", "{}")).await, 1);
        let job = app.jobs.recv().await.unwrap();
        let mut worker = WorkerProcess::start(TEST, &job, &server);
        worker.says("RESUMED").await;
        tokio::time::sleep_until(Instant::now() + 2 * LEASE).await;
        send(&app.router, delivery("x2", "{}"))
            .await
            .problem(StatusCode::CONFLICT);

        worker.child.kill().unwrap(); // SIGKILL: nothing released
        worker.child.wait().unwrap();
        let killed = Instant::now();
        let mut next = None;
        assert!(
            eventually(LIMIT, async || {
                let r = send(&app.router, delivery("x2", "{}")).await;
                let ran = r.status == StatusCode::ACCEPTED;
                next = ran.then_some(r);
                ran
            })
            .await
        );
        let lapsed_after = killed.elapsed();
        eprintln!("the next delivery ran {lapsed_after:?} after the worker process died");
        assert!(
            lapsed_after <= LEASE + Duration::from_millis(500),
            "the next delivery ran {lapsed_after:?} after the worker died"
        );
        assert!(accepted(&next.unwrap(), 2) > first);
        assert!(record(&store, "x2").await.is_none());
        // (The second run's export is left to lapse.)
        let _ = app.jobs.recv().await.unwrap();
    });
}

/// A Tower service (not an axum handler: those cannot fail) that hands
/// its lock off and then fails: the failure is the service's own, and the
/// lock stays the work's, which finishes it.
#[tokio::test]
async fn a_service_that_fails_after_handing_off_leaves_the_lock_to_the_work() {
    use axum::extract::FromRequestParts;
    use tower::{Layer, ServiceExt};

    let store = MemoryStore::new();
    let layer = LockLayer::builder(Locker::new(store.clone()), KeyFrom::header(DELIVERY))
        .namespace("failing")
        .idempotent(Idempotency::new())
        .build()
        .unwrap();
    let (go_tx, go) = oneshot::channel::<()>();
    let go = Arc::new(Mutex::new(Some(go)));
    let (done_tx, done) = oneshot::channel();
    let done_tx = Arc::new(Mutex::new(Some(done_tx)));
    let service = tower::service_fn(move |req: Request<Body>| {
        let (go, done_tx) = (go.clone(), done_tx.clone());
        async move {
            let (mut parts, _) = req.into_parts();
            let handoff = HandOff::from_request_parts(&mut parts, &()).await.unwrap();
            let go = go.lock().unwrap().take().unwrap();
            let done_tx = done_tx.lock().unwrap().take().unwrap();
            tokio::spawn(async move {
                let _ = go.await;
                let _ = done_tx.send(handoff.finish(StatusCode::OK).await.unwrap());
            });
            Err::<axum::response::Response, _>(std::io::Error::other("failed after the hand-off"))
        }
    });
    let failed = layer
        .layer(service)
        .oneshot(delivery("f1", "{}"))
        .await
        .unwrap_err();
    assert_eq!(failed.to_string(), "failed after the hand-off");
    let key = LockKey::new("failing", "f1").unwrap();
    assert!(store.is_locked(&key), "the layer released the work's lock");
    go_tx.send(()).unwrap();
    assert!(
        timeout(LIMIT, done).await.unwrap().unwrap(),
        "the work's finish stored nothing"
    );
    assert!(store.read_record(&key).await.unwrap().is_some());
}
