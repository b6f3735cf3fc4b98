//! Idempotent requests: the first request for a key (runs the handler and
//! stores its response) against a duplicate (answered from the stored
//! record), through the lock layer with
//! `LockLayer::builder(..).idempotent(Idempotency::new())` on an axum
//! `Router`, called with `tower::ServiceExt::oneshot` (no TCP), on a
//! `redis-server` started by the test support.
//!
//! | case      | one request                                                               |
//! |-----------|---------------------------------------------------------------------------|
//! | `plain`   | the same handler without the layer: no lock, no Redis (baseline)          |
//! | `raw_get` | a handler that answers what one `GET` of a stored ~120-byte value returns, on a redis-rs `MultiplexedConnection`: the least a replay from Redis costs (baseline) |
//! | `first`   | idempotent layer, a key never seen: acquire (`EVALSHA`), handler, store the record and release (`EVALSHA`) |
//! | `replay`  | idempotent layer, a key already completed: the record is answered (`EVALSHA`), the handler does not run |
//!
//! Every request is `POST /charges` with an `Idempotency-Key` header and the
//! same 60-byte JSON body (the default fingerprint hashes it); the handler
//! answers 201 with a small JSON body. Each response body is read to the end.
//!
//! * Criterion group `replay_one_at_a_time`: time per request, one at a time.
//! * After criterion, a loop times 10,000 requests per case one by one
//!   (cases interleaved in rounds of 1,000) for p50/p99, then 32 tasks send
//!   8,000 requests per case (3 interleaved rounds) for throughput, with CPU
//!   per request of this process (`getrusage`) and of `redis-server`
//!   (`INFO cpu`), and the commands Redis ran per request
//!   (`INFO commandstats`).
//!
//! Run with `taskset -c 0 cargo bench --bench replay` (about 40 s).

#[path = "../tests/support/mod.rs"]
mod support;

mod common;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::response::IntoResponse;
use axum::routing::post;
use bytes::Bytes;
use criterion::{Criterion, Throughput};
use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderName, Request, StatusCode};
use http_body_util::BodyExt;
use support::RedisServer;
use tokio::runtime::Runtime;
use tokio::task::JoinSet;
use tower::ServiceExt;
use tower_redis_lock::layer::IDEMPOTENT_REPLAYED;
use tower_redis_lock::redis::{self, aio::MultiplexedConnection};
use tower_redis_lock::{Idempotency, KeyFrom, LockLayer, Locker, RedisStore};

const GROUP: &str = "replay_one_at_a_time";
const KEY_HEADER: HeaderName = HeaderName::from_static("idempotency-key");
const BODY: &str = r#"{"amount":4200,"currency":"eur","customer":"cus_0001"}"#;
const ANSWER: &str = r#"{"id":"ch_1","amount":4200,"currency":"eur","status":"succeeded"}"#;

/// Completed keys that `replay` (and `raw_get`) requests cycle through.
const POOL: usize = 1_000;
/// Requests per case in the percentile loop.
const SAMPLES: usize = 10_000;
/// The percentile loop alternates cases in rounds of this many requests.
const ROUND: usize = 1_000;
/// Tasks in the throughput loop.
const TASKS: usize = 32;
/// Requests per case and round in the throughput loop.
const LOAD: u64 = 8_000;
/// Rounds of the throughput loop.
const LOAD_ROUNDS: usize = 3;

/// Handler runs, to check that replays never run it.
static RUNS: AtomicU64 = AtomicU64::new(0);
/// Ids of `first` requests, never reused.
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

#[derive(Clone, Copy, PartialEq, Eq)]
enum Case {
    Plain,
    RawGet,
    First,
    Replay,
}

impl Case {
    const ALL: [Case; 4] = [Case::Plain, Case::RawGet, Case::First, Case::Replay];

    fn name(self) -> &'static str {
        match self {
            Case::Plain => "plain",
            Case::RawGet => "raw_get",
            Case::First => "first",
            Case::Replay => "replay",
        }
    }
}

/// The handler: answers 201 with a small JSON body.
async fn charge(_body: Bytes) -> impl IntoResponse {
    RUNS.fetch_add(1, Ordering::Relaxed);
    (
        StatusCode::CREATED,
        [(CONTENT_TYPE, "application/json")],
        ANSWER,
    )
}

/// The `raw_get` baseline: one `GET` of the key's stored answer.
async fn raw_get(
    State(conn): State<MultiplexedConnection>,
    headers: HeaderMap,
    _body: Bytes,
) -> impl IntoResponse {
    let id = headers
        .get(KEY_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let stored: Option<Vec<u8>> = redis::cmd("GET")
        .arg(format!("raw:{{charges:{id}}}:record"))
        .query_async(&mut conn.clone())
        .await
        .expect("GET");
    (
        StatusCode::CREATED,
        [(CONTENT_TYPE, "application/json")],
        stored.expect("a stored answer"),
    )
}

struct App {
    plain: Router,
    raw_get: Router,
    locked: Router,
    /// Next index into the pool of completed keys.
    next_replay: AtomicU64,
}

impl App {
    async fn new(url: &str) -> Arc<App> {
        let client = redis::Client::open(url).expect("client");
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("raw connection");
        let layer = LockLayer::builder(
            Locker::new(RedisStore::from_url(url).expect("store")),
            KeyFrom::header(KEY_HEADER),
        )
        .namespace("charges")
        .idempotent(Idempotency::new())
        .build()
        .expect("layer");
        let app = Arc::new(App {
            plain: Router::new().route("/charges", post(charge)),
            raw_get: Router::new()
                .route("/charges", post(raw_get))
                .with_state(conn.clone()),
            locked: Router::new().route("/charges", post(charge)).layer(layer),
            next_replay: AtomicU64::new(0),
        });
        // Complete every pool key once (and store raw_get's answers).
        for i in 0..POOL {
            let id = format!("pool-{i}");
            app.send(Case::First, &id).await;
            let _: () = redis::cmd("SET")
                .arg(format!("raw:{{charges:{id}}}:record"))
                .arg(ANSWER)
                .query_async(&mut conn)
                .await
                .expect("SET");
        }
        for case in Case::ALL {
            app.request(case).await;
        }
        app
    }

    /// One request of `case` with the next suitable key.
    async fn request(&self, case: Case) {
        let id = match case {
            Case::First => format!("first-{}", NEXT_ID.fetch_add(1, Ordering::Relaxed)),
            _ => format!(
                "pool-{}",
                self.next_replay.fetch_add(1, Ordering::Relaxed) % POOL as u64
            ),
        };
        self.send(case, &id).await;
    }

    async fn send(&self, case: Case, id: &str) {
        let router = match case {
            Case::Plain => &self.plain,
            Case::RawGet => &self.raw_get,
            Case::First | Case::Replay => &self.locked,
        };
        let req = Request::post("/charges")
            .header(KEY_HEADER, id)
            .header(CONTENT_TYPE, "application/json")
            .body(Body::from(BODY))
            .expect("request");
        let res = router.clone().oneshot(req).await.expect("infallible");
        assert_eq!(res.status(), StatusCode::CREATED, "{}", case.name());
        let replayed = res.headers().contains_key(IDEMPOTENT_REPLAYED);
        assert_eq!(replayed, case == Case::Replay, "{}", case.name());
        let body = res.into_body().collect().await.expect("body").to_bytes();
        assert_eq!(body.len(), ANSWER.len());
    }

    /// `n` requests of `case`, from `tasks` tasks at once.
    async fn load(self: &Arc<Self>, case: Case, n: u64, tasks: usize) {
        let left = Arc::new(AtomicU64::new(n));
        let mut set = JoinSet::new();
        for _ in 0..tasks {
            let (app, left) = (self.clone(), left.clone());
            set.spawn(async move {
                while left
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |l| l.checked_sub(1))
                    .is_ok()
                {
                    app.request(case).await;
                }
            });
        }
        while let Some(done) = set.join_next().await {
            done.expect("load task");
        }
    }
}

// ---------------------------------------------------------------------------
// Measuring
// ---------------------------------------------------------------------------

/// `INFO commandstats` without the bench's own `INFO` and `CONFIG`:
/// command -> calls.
fn command_calls(server: &RedisServer) -> BTreeMap<String, u64> {
    server
        .command_stats()
        .into_iter()
        .filter(|(name, _)| name != "info" && !name.starts_with("config"))
        .collect()
}

/// What one case cost over the loops.
#[derive(Default)]
struct Totals {
    timings_ns: Vec<u64>,
    loaded: u64,
    load_wall: Duration,
    client_cpu: Duration,
    server_cpu: Duration,
    /// Commands over the percentile loop (`SAMPLES` requests).
    calls: BTreeMap<String, u64>,
}

impl Totals {
    fn percentile(&self, p: f64) -> f64 {
        let rank = ((p / 100.0) * self.timings_ns.len() as f64).ceil() as usize;
        self.timings_ns[rank.clamp(1, self.timings_ns.len()) - 1] as f64 / 1e3
    }

    fn mean(&self) -> f64 {
        self.timings_ns.iter().sum::<u64>() as f64 / self.timings_ns.len() as f64 / 1e3
    }

    fn per_load(&self, d: Duration) -> f64 {
        d.as_secs_f64() * 1e6 / self.loaded.max(1) as f64
    }

    fn calls_per_request(&self, name: Option<&str>) -> f64 {
        let n: u64 = match name {
            Some(name) => self.calls.get(name).copied().unwrap_or(0),
            None => self.calls.values().sum(),
        };
        n as f64 / self.timings_ns.len().max(1) as f64
    }
}

fn percentile_loop(rt: &Runtime, server: &RedisServer, app: &Arc<App>, totals: &mut [Totals]) {
    for round in 0..SAMPLES / ROUND {
        for k in 0..Case::ALL.len() {
            let i = (round + k) % Case::ALL.len();
            let case = Case::ALL[i];
            let before = command_calls(server);
            rt.block_on(async {
                for _ in 0..ROUND {
                    let start = Instant::now();
                    app.request(case).await;
                    totals[i].timings_ns.push(start.elapsed().as_nanos() as u64);
                }
            });
            for (name, calls) in command_calls(server) {
                let delta = calls - before.get(&name).copied().unwrap_or(0);
                if delta > 0 {
                    *totals[i].calls.entry(name).or_default() += delta;
                }
            }
        }
    }
    for t in totals.iter_mut() {
        t.timings_ns.sort_unstable();
    }
}

fn load_loop(rt: &Runtime, server: &RedisServer, app: &Arc<App>, totals: &mut [Totals]) {
    for round in 0..LOAD_ROUNDS {
        for k in 0..Case::ALL.len() {
            let i = (round + k) % Case::ALL.len();
            let server0 = common::server_cpu(server);
            let client0 = common::process_cpu();
            let start = Instant::now();
            rt.block_on(app.load(Case::ALL[i], LOAD, TASKS));
            let t = &mut totals[i];
            t.load_wall += start.elapsed();
            t.client_cpu += common::process_cpu() - client0;
            t.server_cpu += common::server_cpu(server).saturating_sub(server0);
            t.loaded += LOAD;
        }
    }
}

fn print_summary(totals: &[Totals]) {
    let find = |case: Case| &totals[Case::ALL.iter().position(|&c| c == case).unwrap_or(0)];
    let rate = |t: &Totals| t.loaded as f64 / t.load_wall.as_secs_f64();
    println!();
    println!(
        "{GROUP}: {SAMPLES} requests per case one by one (µs); then {TASKS} tasks, {LOAD_ROUNDS} rounds of {LOAD} requests per case"
    );
    println!(
        "{:<8} {:>8} {:>8} {:>8} {:>9} {:>11} {:>10} {:>10} {:>9} {:>9}",
        "case",
        "mean",
        "p50",
        "p99",
        "1/mean/s",
        "req/s (32)",
        "client/req",
        "server/req",
        "evalsha",
        "all cmds"
    );
    for (case, t) in Case::ALL.iter().zip(totals) {
        println!(
            "{:<8} {:>8.2} {:>8.2} {:>8.2} {:>9.0} {:>11.0} {:>10.2} {:>10.2} {:>9.2} {:>9.2}",
            case.name(),
            t.mean(),
            t.percentile(50.0),
            t.percentile(99.0),
            1e6 / t.mean(),
            rate(t),
            t.per_load(t.client_cpu),
            t.per_load(t.server_cpu),
            t.calls_per_request(Some("evalsha")),
            t.calls_per_request(None),
        );
    }
    let (first, replay, raw) = (find(Case::First), find(Case::Replay), find(Case::RawGet));
    println!(
        "replay/first: p50 {:.2}, throughput {:.2}; replay/raw_get: p50 {:.2}, throughput {:.2}",
        replay.percentile(50.0) / first.percentile(50.0),
        rate(replay) / rate(first),
        replay.percentile(50.0) / raw.percentile(50.0),
        rate(replay) / rate(raw),
    );
    for (case, t) in Case::ALL.iter().zip(totals) {
        let mut per = String::new();
        for (name, calls) in &t.calls {
            let _ = write!(
                per,
                "{name} {:.2}, ",
                *calls as f64 / t.timings_ns.len() as f64
            );
        }
        println!(
            "  {:<8} commands per request: {}",
            case.name(),
            per.trim_end_matches(", ")
        );
    }
}

fn criterion_cases(c: &mut Criterion, rt: &Runtime, app: &Arc<App>) {
    let mut group = c.benchmark_group(GROUP);
    group.throughput(Throughput::Elements(1));
    for case in Case::ALL {
        group.bench_function(case.name(), |b| {
            b.to_async(rt).iter_custom(|iters| async move {
                let start = Instant::now();
                for _ in 0..iters {
                    app.request(case).await;
                }
                start.elapsed()
            });
        });
    }
    group.finish();
}

fn main() {
    let server = RedisServer::start();
    let rt = common::runtime();
    let app = rt.block_on(App::new(&server.url()));

    let mut c = Criterion::default()
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1))
        .configure_from_args();
    criterion_cases(&mut c, &rt, &app);
    c.final_summary();

    // `cargo test --benches` runs each benchmark once as a smoke test, and
    // `--profile-time` is for profilers: the loops are for real runs only.
    if common::full_run() {
        let mut totals: Vec<Totals> = Case::ALL.iter().map(|_| Totals::default()).collect();
        let runs_before = RUNS.load(Ordering::Relaxed);
        percentile_loop(&rt, &server, &app, &mut totals);
        load_loop(&rt, &server, &app, &mut totals);
        print_summary(&totals);
        // The handler ran for `plain` and `first` only.
        let expected = 2 * (SAMPLES as u64 + LOAD * LOAD_ROUNDS as u64);
        println!(
            "handler runs: {} (expected {expected}: plain and first only)",
            RUNS.load(Ordering::Relaxed) - runs_before
        );
    }
    drop(app);
    drop(rt);
    drop(server);
}
