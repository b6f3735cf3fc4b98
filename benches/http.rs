//! What the lock layer adds to an HTTP request, over real TCP.
//!
//! One axum router, served by `axum::serve` on 127.0.0.1:0, has the same
//! handler (answers `ok` at once) on three routes:
//!
//! | case            | route            | lock                                         |
//! |-----------------|------------------|----------------------------------------------|
//! | `unlocked`      | `/unlocked/{id}` | none (baseline)                              |
//! | `locked_memory` | `/memory/{id}`   | `LockLayer` on `{id}`, `MemoryStore`         |
//! | `locked_redis`  | `/redis/{id}`    | `LockLayer` on `{id}`, `RedisStore` on a `redis-server` from the test support |
//!
//! Every request is a `POST` with a fresh id, so a locked request does one
//! uncontended acquire and one release (plus the watchdog's bookkeeping).
//! The client is hyper's HTTP/1.1 client on keep-alive connections, in the
//! same process; server, client and the store's connection are tasks on
//! one two-worker tokio runtime (the main thread only waits), and
//! `redis-server` is a separate process.
//!
//! * Criterion group `http_locked_vs_unlocked`: per-request latency, one
//!   request at a time on one connection.
//! * After criterion, a timed loop per case: 8 connections, each sending
//!   2,000 requests back to back (in 4 rounds, cases interleaved), for
//!   throughput (req/s) and per-request p50/p99 under that load; the table
//!   gives locked p50 − unlocked p50 as the added latency.
//!
//! Run with `cargo bench --bench http` (about a minute).

#[path = "../tests/support/mod.rs"]
mod support;

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::post;
use bytes::Bytes;
use criterion::{Criterion, Throughput};
use http::{HeaderValue, Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use support::RedisServer;
use tokio::runtime::Runtime;
use tower_redis_lock::{KeyFrom, LockLayer, LockStore, Locker, MemoryStore, RedisStore};

const GROUP: &str = "http_locked_vs_unlocked";
/// Concurrent connections in the throughput loop.
const CONNECTIONS: usize = 8;
/// Requests per connection and case in the throughput loop.
const REQUESTS: usize = 2_000;
/// The throughput loop runs the cases in this many interleaved rounds.
const ROUNDS: usize = 4;
/// Untimed requests per connection and case before the throughput loop.
const WARM_UP: usize = 200;

/// Ids, never reused within a run.
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

#[derive(Clone, Copy, PartialEq, Eq)]
enum Case {
    Unlocked,
    Memory,
    Redis,
}

impl Case {
    const ALL: [Case; 3] = [Case::Unlocked, Case::Memory, Case::Redis];

    fn name(self) -> &'static str {
        match self {
            Case::Unlocked => "unlocked",
            Case::Memory => "locked_memory",
            Case::Redis => "locked_redis",
        }
    }

    fn route(self) -> &'static str {
        match self {
            Case::Unlocked => "/unlocked",
            Case::Memory => "/memory",
            Case::Redis => "/redis",
        }
    }
}

/// The handler of every case.
async fn small() -> &'static str {
    "ok"
}

fn locked<St: LockStore>(route: &str, namespace: &str, store: St) -> Router {
    let layer = LockLayer::builder(Locker::new(store), KeyFrom::path_param::<String>("id"))
        .namespace(namespace)
        .build()
        .expect("layer settings");
    Router::new().route(route, post(small)).route_layer(layer)
}

fn app(redis_url: &str) -> Router {
    let redis = RedisStore::from_url(redis_url).expect("redis store");
    Router::new()
        .route("/unlocked/{id}", post(small))
        .merge(locked("/memory/{id}", "bench-memory", MemoryStore::new()))
        .merge(locked("/redis/{id}", "bench-redis", redis))
}

/// One keep-alive HTTP/1.1 connection.
struct Client {
    sender: SendRequest<Empty<Bytes>>,
    host: HeaderValue,
}

impl Client {
    async fn connect(addr: SocketAddr) -> Client {
        let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("handshake");
        tokio::spawn(conn);
        Client {
            sender,
            host: HeaderValue::from_str(&addr.to_string()).expect("host"),
        }
    }

    /// One `POST` to `case`'s route with a fresh id, body read to the end.
    async fn request(&mut self, case: Case) {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let req = Request::builder()
            .method(Method::POST)
            .uri(format!("{}/{id}", case.route()))
            .header(header::HOST, self.host.clone())
            .body(Empty::new())
            .expect("request");
        self.sender.ready().await.expect("connection ready");
        let res = self.sender.send_request(req).await.expect("response");
        assert_eq!(res.status(), StatusCode::OK, "{}", case.name());
        let body = res.into_body().collect().await.expect("body").to_bytes();
        assert_eq!(&body[..], b"ok");
    }
}

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn criterion_cases(c: &mut Criterion, rt: &Runtime, addr: SocketAddr) {
    let mut group = c.benchmark_group(GROUP);
    group.throughput(Throughput::Elements(1));
    for case in Case::ALL {
        group.bench_function(case.name(), |b| {
            // The client runs as a task on the runtime's workers, like the
            // server, so the main thread only waits.
            b.to_async(rt).iter_custom(|iters| async move {
                tokio::spawn(async move {
                    let mut client = Client::connect(addr).await;
                    client.request(case).await;
                    let start = Instant::now();
                    for _ in 0..iters {
                        client.request(case).await;
                    }
                    start.elapsed()
                })
                .await
                .expect("client task")
            });
        });
    }
    group.finish();
}

/// The throughput loop's results for one case.
struct Load {
    case: Case,
    elapsed: Duration,
    /// Per-request latencies in ns, sorted at the end.
    ns: Vec<u64>,
}

impl Load {
    fn percentile_us(&self, p: f64) -> f64 {
        // Nearest rank.
        let rank = ((p / 100.0) * self.ns.len() as f64).ceil() as usize;
        self.ns[rank.clamp(1, self.ns.len()) - 1] as f64 / 1_000.0
    }

    fn per_second(&self) -> f64 {
        self.ns.len() as f64 / self.elapsed.as_secs_f64()
    }
}

/// `CONNECTIONS` connections sending `n` requests each to `case` at once;
/// the wall time and every request's latency.
async fn burst(addr: SocketAddr, case: Case, n: usize) -> (Duration, Vec<u64>) {
    let mut clients = Vec::with_capacity(CONNECTIONS);
    for _ in 0..CONNECTIONS {
        clients.push(Client::connect(addr).await);
    }
    let start = Instant::now();
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|mut client| {
            tokio::spawn(async move {
                let mut ns = Vec::with_capacity(n);
                for _ in 0..n {
                    let t = Instant::now();
                    client.request(case).await;
                    ns.push(t.elapsed().as_nanos() as u64);
                }
                ns
            })
        })
        .collect();
    let mut all = Vec::with_capacity(CONNECTIONS * n);
    for task in tasks {
        all.extend(task.await.expect("client task"));
    }
    (start.elapsed(), all)
}

fn warm_up(rt: &Runtime, addr: SocketAddr) {
    rt.block_on(async {
        for case in Case::ALL {
            burst(addr, case, WARM_UP).await;
        }
    });
}

fn throughput(rt: &Runtime, addr: SocketAddr) -> Vec<Load> {
    rt.block_on(async {
        let mut loads: Vec<Load> = Case::ALL
            .iter()
            .map(|&case| Load {
                case,
                elapsed: Duration::ZERO,
                ns: Vec::with_capacity(CONNECTIONS * REQUESTS),
            })
            .collect();
        for round in 0..ROUNDS {
            for k in 0..loads.len() {
                let load = &mut loads[(round + k) % Case::ALL.len()];
                let (elapsed, ns) = burst(addr, load.case, REQUESTS / ROUNDS).await;
                load.elapsed += elapsed;
                load.ns.extend(ns);
            }
        }
        for load in &mut loads {
            load.ns.sort_unstable();
        }
        loads
    })
}

fn print_table(loads: &[Load]) {
    let base = loads
        .iter()
        .find(|l| l.case == Case::Unlocked)
        .map(|l| l.percentile_us(50.0))
        .unwrap_or(f64::NAN);
    println!();
    println!(
        "{GROUP}: {CONNECTIONS} connections x {REQUESTS} requests per case \
         ({ROUNDS} interleaved rounds)"
    );
    println!(
        "{:<14} {:>10} {:>10} {:>10} {:>16}",
        "case", "req/s", "p50 µs", "p99 µs", "added p50 µs"
    );
    for l in loads {
        let p50 = l.percentile_us(50.0);
        let added = if l.case == Case::Unlocked {
            "(baseline)".to_owned()
        } else {
            format!("{:+.1}", p50 - base)
        };
        println!(
            "{:<14} {:>10.0} {:>10.1} {:>10.1} {:>16}",
            l.case.name(),
            l.per_second(),
            p50,
            l.percentile_us(99.0),
            added
        );
    }
}

fn main() {
    let redis = RedisServer::start();
    let rt = runtime();
    let addr = rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let app = app(&redis.url());
        tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
        // One request per case, so connection setup and script loading
        // stay out of every measurement.
        let mut client = Client::connect(addr).await;
        for case in Case::ALL {
            client.request(case).await;
        }
        addr
    });

    let mut c = Criterion::default()
        .measurement_time(Duration::from_secs(5))
        .warm_up_time(Duration::from_secs(1))
        .configure_from_args();
    criterion_cases(&mut c, &rt, addr);
    c.final_summary();

    // `cargo test --benches` runs each benchmark once as a smoke test; the
    // throughput loop is for real runs only.
    if common::full_run() {
        warm_up(&rt, addr);
        redis.reset_stats();
        let loads = throughput(&rt, addr);
        let stats = redis.command_stats();
        print_table(&loads);
        // Only `locked_redis` talks to Redis; `config|resetstat` is ours.
        let requests = (CONNECTIONS * REQUESTS) as f64;
        let per_request: Vec<String> = stats
            .iter()
            .filter(|(name, _)| !name.starts_with("config"))
            .map(|(name, calls)| format!("{name} {:.2}", *calls as f64 / requests))
            .collect();
        println!(
            "redis-server commands per locked_redis request: {}",
            per_request.join(", ")
        );
    }
    drop(rt);
    drop(redis);
}
