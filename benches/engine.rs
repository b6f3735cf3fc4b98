//! Cost of one uncontended lock cycle (try-acquire, then release), against
//! the raw Redis commands a minimal lock would send, measured in one run.
//!
//! Cases, in the criterion group `s1_uncontended_cycle`:
//!
//! | case                         | one cycle                                            |
//! |------------------------------|------------------------------------------------------|
//! | `raw_set_nx_px_del`          | `SET k v NX PX 30000`, then `DEL k` (baseline)       |
//! | `locker_try_acquire_release` | `Locker::try_acquire`, then `LockGuard::release`     |
//! | `memory_try_acquire_release` | the same on `MemoryStore` (engine cost, no network)  |
//! | `boxed_memory_try_acquire_release` | the same on `BoxStore::new(MemoryStore)` (the cost of type erasure) |
//!
//! Both Redis cases talk to one `redis-server` started by the test support
//! on a free port, over a `MultiplexedConnection` (the store keeps one too),
//! from one task on a current-thread tokio runtime. Every cycle uses a fresh
//! key and ends with `yield_now`, so that tasks spawned on the runtime (the
//! locker's watchdog, the connection driver) run as they would in a server:
//! without it the memory case never yields, the watchdog never runs and its
//! queue grows without bound.
//!
//! After criterion, a separate loop times 20,000 cycles per case one by one
//! (interleaved in rounds) and prints p50/p99 per cycle and the locker/raw
//! ratio, which criterion (means only) does not give, the boxed/unboxed
//! memory difference, and the server-side time per command from
//! `INFO commandstats` over that loop.
//!
//! Run with `cargo bench --bench engine`.

#[path = "../tests/support/mod.rs"]
mod support;

mod common;

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use support::RedisServer;
use tokio::runtime::Runtime;
use tower_redis_lock::redis::{self, aio::MultiplexedConnection};
use tower_redis_lock::{BoxStore, LockKey, Locker, MemoryStore, RedisStore};

const GROUP: &str = "s1_uncontended_cycle";
const RAW: &str = "raw_set_nx_px_del";
const LOCKER: &str = "locker_try_acquire_release";
const MEMORY: &str = "memory_try_acquire_release";
const BOXED: &str = "boxed_memory_try_acquire_release";

/// Cycles per case in the percentile loop.
const SAMPLES: usize = 20_000;
/// The percentile loop alternates cases in rounds of this many cycles.
const ROUND: usize = 2_000;
/// Untimed cycles per case before the percentile loop.
const WARM_UP: usize = 2_000;

/// Key suffixes, never reused within a run.
static NEXT_KEY: AtomicU64 = AtomicU64::new(0);

fn next_id() -> u64 {
    NEXT_KEY.fetch_add(1, Ordering::Relaxed)
}

/// The cases, each ready to run one cycle.
struct Cases {
    conn: MultiplexedConnection,
    redis: Locker<RedisStore>,
    memory: Locker<MemoryStore>,
    boxed: Locker<BoxStore>,
}

#[derive(Clone, Copy)]
enum Case {
    Raw,
    Locker,
    Memory,
    Boxed,
}

impl Case {
    const ALL: [Case; 4] = [Case::Raw, Case::Locker, Case::Memory, Case::Boxed];

    fn name(self) -> &'static str {
        match self {
            Case::Raw => RAW,
            Case::Locker => LOCKER,
            Case::Memory => MEMORY,
            Case::Boxed => BOXED,
        }
    }
}

impl Cases {
    /// Connects everything and runs one cycle of each, so that connection
    /// setup and script loading stay out of every measurement.
    async fn connect(url: &str) -> Cases {
        let client = redis::Client::open(url).expect("redis client");
        let conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("raw connection");
        let store = RedisStore::from_url(url).expect("redis store");
        let cases = Cases {
            conn,
            redis: Locker::new(store),
            memory: Locker::new(MemoryStore::new()),
            boxed: Locker::new(BoxStore::new(MemoryStore::new())),
        };
        for case in Case::ALL {
            cases.cycle(case).await;
        }
        cases
    }

    async fn cycle(&self, case: Case) {
        match case {
            Case::Raw => raw_cycle(self.conn.clone()).await,
            Case::Locker => locker_cycle(&self.redis).await,
            Case::Memory => locker_cycle(&self.memory).await,
            Case::Boxed => locker_cycle(&self.boxed).await,
        }
        tokio::task::yield_now().await;
    }

    /// `n` cycles of `case`; the total time.
    async fn run(&self, case: Case, n: u64) -> Duration {
        let start = Instant::now();
        for _ in 0..n {
            self.cycle(case).await;
        }
        start.elapsed()
    }
}

/// `SET k v NX PX 30000`, then `DEL k`, on a fresh key.
async fn raw_cycle(mut conn: MultiplexedConnection) {
    let key = format!("raw:{{bench:{}}}:lock", next_id());
    let set: Option<String> = redis::cmd("SET")
        .arg(&key)
        .arg("val")
        .arg("NX")
        .arg("PX")
        .arg(30_000)
        .query_async(&mut conn)
        .await
        .expect("SET NX PX");
    assert!(set.is_some(), "SET NX on a fresh key was refused");
    let deleted: i64 = redis::cmd("DEL")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .expect("DEL");
    assert_eq!(deleted, 1);
}

/// `try_acquire`, then `release`, on a fresh key.
async fn locker_cycle<S: tower_redis_lock::LockStore>(locker: &Locker<S>) {
    let key = LockKey::new("bench", next_id().to_string()).expect("key");
    let guard = locker.try_acquire(&key).await.expect("try_acquire");
    black_box(guard.fencing_token().unwrap());
    assert!(guard.release().await.expect("release"));
}

fn criterion_cases(c: &mut Criterion, rt: &Runtime, cases: &Cases) {
    let mut group = c.benchmark_group(GROUP);
    group.throughput(Throughput::Elements(1));
    for case in Case::ALL {
        group.bench_function(case.name(), |b| {
            b.to_async(rt).iter_custom(|iters| cases.run(case, iters));
        });
    }
    group.finish();
}

/// Per-cycle timings, sorted, in nanoseconds.
struct Timings {
    case: Case,
    ns: Vec<u64>,
}

impl Timings {
    fn percentile(&self, p: f64) -> f64 {
        // Nearest rank.
        let rank = ((p / 100.0) * self.ns.len() as f64).ceil() as usize;
        self.ns[rank.clamp(1, self.ns.len()) - 1] as f64 / 1_000.0
    }

    fn mean(&self) -> f64 {
        self.ns.iter().sum::<u64>() as f64 / self.ns.len() as f64 / 1_000.0
    }
}

/// Times `SAMPLES` cycles per case one by one, alternating the cases in
/// rounds (rotating which goes first) so that drift hits all of them alike.
fn percentiles(rt: &Runtime, cases: &Cases) -> Vec<Timings> {
    rt.block_on(async {
        for case in Case::ALL {
            cases.run(case, WARM_UP as u64).await;
        }
        let mut all: Vec<Timings> = Case::ALL
            .iter()
            .map(|&case| Timings {
                case,
                ns: Vec::with_capacity(SAMPLES),
            })
            .collect();
        for round in 0..SAMPLES / ROUND {
            for k in 0..all.len() {
                let t = &mut all[(round + k) % Case::ALL.len()];
                for _ in 0..ROUND {
                    let start = Instant::now();
                    cases.cycle(t.case).await;
                    t.ns.push(start.elapsed().as_nanos() as u64);
                }
            }
        }
        for t in &mut all {
            t.ns.sort_unstable();
        }
        all
    })
}

fn print_summary(timings: &[Timings]) {
    let p50 = |case: &str| {
        timings
            .iter()
            .find(|t| t.case.name() == case)
            .map(|t| t.percentile(50.0))
            .unwrap_or(f64::NAN)
    };
    println!();
    println!("{GROUP}: {SAMPLES} cycles per case, timed one by one (µs per cycle)");
    println!(
        "{:<34} {:>9} {:>9} {:>9} {:>9}",
        "case", "mean", "p50", "p99", "max"
    );
    for t in timings {
        println!(
            "{:<34} {:>9.2} {:>9.2} {:>9.2} {:>9.2}",
            t.case.name(),
            t.mean(),
            t.percentile(50.0),
            t.percentile(99.0),
            t.ns.last().copied().unwrap_or(0) as f64 / 1_000.0
        );
    }
    println!(
        "ratio locker/raw p50: {:.2}   memory/raw p50: {:.3}",
        p50(LOCKER) / p50(RAW),
        p50(MEMORY) / p50(RAW)
    );
    let mean = |case: &str| {
        timings
            .iter()
            .find(|t| t.case.name() == case)
            .map(Timings::mean)
            .unwrap_or(f64::NAN)
    };
    println!(
        "boxed - unboxed memory: p50 {:+.3} µs, mean {:+.3} µs per cycle",
        p50(BOXED) - p50(MEMORY),
        mean(BOXED) - mean(MEMORY)
    );
}

/// `calls` and µs per call of each command from `INFO commandstats`.
fn print_server_time(server: &RedisServer) {
    let stats = server.command_times();
    println!("redis-server time per command over that loop (INFO commandstats):");
    for name in ["set", "del", "evalsha"] {
        let (calls, usec) = stats.get(name).copied().unwrap_or_default();
        println!(
            "  {name:<8} calls={calls:<8} usec_per_call={:.2}",
            usec as f64 / calls.max(1) as f64
        );
    }
}

fn main() {
    let server = RedisServer::start();
    let rt = common::runtime();
    let cases = rt.block_on(Cases::connect(&server.url()));

    let mut c = Criterion::default()
        .measurement_time(Duration::from_secs(5))
        .warm_up_time(Duration::from_secs(1))
        .configure_from_args();
    criterion_cases(&mut c, &rt, &cases);
    c.final_summary();

    // `cargo test --benches` runs each benchmark once as a smoke test, and
    // `--profile-time` is for profilers: the summary is for real runs only.
    if common::full_run() {
        server.reset_stats();
        print_summary(&percentiles(&rt, &cases));
        print_server_time(&server);
    }
    drop(cases);
    drop(rt);
    drop(server);
}
