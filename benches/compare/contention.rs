//! Many tasks at once, and many tasks on one key: our locker against raw
//! Redis commands and against `rslock` (with its defaults), in one run, on
//! one `redis-server` started by the test support.
//!
//! **S2, concurrent uncontended cycles.** 64 tasks on one current-thread
//! tokio runtime, each with its own key, each repeating one cycle:
//!
//! | case     | one cycle                                                                 |
//! |----------|---------------------------------------------------------------------------|
//! | `raw`    | `SET k v NX PX 30000`, then `DEL k`, on one redis-rs `MultiplexedConnection` (baseline) |
//! | `ours`   | `Locker::try_acquire`, then `LockGuard::release`, on `RedisStore::from_url` |
//! | `rslock` | `LockManager::lock` (30 s TTL), then `LockManager::unlock`, on `LockManager::new([url])` |
//!
//! Each implementation keeps one command connection, shared by the 64 tasks.
//! The criterion group `s2_64_tasks` gives the time per cycle with 64 in
//! flight (so its throughput is cycles per second); after it, a loop runs
//! the cases in interleaved rounds and prints throughput, the ratios to the
//! baseline and to rslock, CPU per cycle of this process (`getrusage`) and of
//! `redis-server` (`INFO cpu`), and the commands Redis ran per cycle
//! (`INFO commandstats`). Then `redis-server`'s time per call of each script,
//! one kind of call per phase (our grant, our acquire on a held key, our
//! release, rslock's lock and unlock).
//!
//! **S3, one key, 8 tasks.** Each task loops: acquire (waiting), hold 1 ms
//! (`tokio::time::sleep`), release, until 500 grants have been made. In the
//! *handoff* variant a task that released waits until another task holds the
//! lock before it tries again, so every grant is a real handoff; in the
//! *plain* variant it tries again at once. Per implementation:
//!
//! | case     | acquire / release                                                        |
//! |----------|--------------------------------------------------------------------------|
//! | `ours`   | `Locker::builder(RedisStore::from_url(..)).wait_timeout(10 s)`: default 250 ms poll, release notifications / `release` |
//! | `rslock` | `LockManager::acquire` (default retry: 3 tries 0–200 ms apart, then again) / `LockGuard::release` |
//! | `spin`   | `SET k v NX PX 10000` retried at once until `OK` / `DEL k` (baseline)   |
//!
//! The gap of a grant is the time from the previous holder's `release`
//! returning to this grant's acquire returning. Commands per grant are
//! `INFO commandstats` deltas over the 500 grants, counted twice: every
//! command Redis ran (including the ones scripts run, such as `PUBLISH`) and
//! only the ones clients sent (round trips). The handoff gaps are also
//! written to `target/contention-s3-gaps.csv`, and plotted (a cumulative
//! distribution per case, SVG written by hand) to
//! `benches/plots/s3_handoff_gap.svg`.
//!
//! Run with `cargo bench -p tower-redis-lock-compare --bench contention` (see BENCHMARKS.md); about
//! 35 s. The bench pins itself to CPU 0 and its `redis-server` to CPU 1:
//! do not wrap it in `taskset`, which would put both on one core.

#[path = "../../tests/support/mod.rs"]
mod support;

#[path = "../common/mod.rs"]
mod common;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use support::RedisServer;
use tokio::runtime::Runtime;
use tokio::sync::watch;
use tokio::task::{JoinSet, LocalSet};
use tower_redis_lock::redis::{self, aio::MultiplexedConnection};
use tower_redis_lock::{Error, LockGuard, LockKey, Locker, RedisStore};

const S2_GROUP: &str = "s2_64_tasks";
/// Tasks in S2, each with its own key.
const S2_TASKS: usize = 64;
/// Cycles per case and round in the S2 loop.
const S2_CYCLES: u64 = 12_000;
/// Rounds of the S2 loop (the order of the cases rotates).
const S2_ROUNDS: usize = 5;
/// Lease / TTL in S2.
const S2_TTL: Duration = Duration::from_secs(30);

/// Tasks in S3, all on one key.
const S3_TASKS: usize = 8;
/// Grants per S3 case.
const S3_GRANTS: usize = 500;
/// How long each S3 holder keeps the lock.
const S3_HOLD: Duration = Duration::from_millis(1);
/// Lease / TTL in S3 (every hold is far shorter).
const S3_TTL: Duration = Duration::from_secs(10);
/// Our wait timeout in S3.
const S3_WAIT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------
// Measuring: CPU of both processes, and what Redis ran
// ---------------------------------------------------------------------------

/// `INFO commandstats`: command -> (calls, µs inside Redis).
#[derive(Clone, Default)]
struct CmdStats(BTreeMap<String, (u64, u64)>);

impl CmdStats {
    fn read(server: &RedisServer) -> CmdStats {
        CmdStats(
            server
                .command_times()
                .into_iter()
                // The bench's own `INFO` and `CONFIG RESETSTAT` are not counted.
                .filter(|(name, _)| name != "info" && !name.starts_with("config"))
                .collect(),
        )
    }

    fn since(&self, before: &CmdStats) -> CmdStats {
        CmdStats(
            self.0
                .iter()
                .map(|(name, &(calls, usec))| {
                    let (c0, u0) = before.0.get(name).copied().unwrap_or((0, 0));
                    (name.clone(), (calls - c0, usec - u0))
                })
                .filter(|(_, (calls, _))| *calls > 0)
                .collect(),
        )
    }

    fn add(&mut self, other: &CmdStats) {
        for (name, &(calls, usec)) in &other.0 {
            let e = self.0.entry(name.clone()).or_default();
            e.0 += calls;
            e.1 += usec;
        }
    }

    /// Every command Redis ran, including those run by scripts.
    fn all_calls(&self) -> u64 {
        self.0.values().map(|&(calls, _)| calls).sum()
    }

    /// The commands clients sent: all, minus the ones only `imp`'s scripts
    /// run (each implementation sends a known set of commands).
    fn sent_calls(&self, imp: Impl) -> u64 {
        let inside_scripts: &[&str] = match imp {
            // Acquire: TIME, SET, SET, and where held PEXPIRETIME (or
            // PTTL), SET; release: GET, DEL, PUBLISH.
            Impl::Ours => &[
                "get",
                "pttl",
                "pexpiretime",
                "time",
                "set",
                "del",
                "publish",
                "pexpire",
            ],
            // Unlock script: GET, DEL. Lock is a plain SET.
            Impl::Rslock => &["get", "del"],
            Impl::Raw | Impl::Spin => &[],
        };
        self.0
            .iter()
            .filter(|(name, _)| !inside_scripts.contains(&name.as_str()))
            .map(|(_, &(calls, _))| calls)
            .sum()
    }

    fn usec(&self) -> u64 {
        self.0.values().map(|&(_, usec)| usec).sum()
    }

    /// `name calls/n (µs/call)` for every command, for the logs.
    fn per(&self, n: f64) -> String {
        let mut out = String::new();
        for (name, &(calls, usec)) in &self.0 {
            let _ = write!(
                out,
                "{name} {:.2} ({:.2} µs), ",
                calls as f64 / n,
                usec as f64 / calls.max(1) as f64
            );
        }
        out.trim_end_matches(", ").to_owned()
    }
}

/// What one measured stretch cost: wall time, both CPUs, Redis commands.
#[derive(Clone, Default)]
struct Cost {
    n: u64,
    wall: Duration,
    client_cpu: Duration,
    server_cpu: Duration,
    cmds: CmdStats,
}

impl Cost {
    fn add(&mut self, other: &Cost) {
        self.n += other.n;
        self.wall += other.wall;
        self.client_cpu += other.client_cpu;
        self.server_cpu += other.server_cpu;
        self.cmds.add(&other.cmds);
    }

    fn us_per(&self, d: Duration) -> f64 {
        d.as_secs_f64() * 1e6 / self.n.max(1) as f64
    }
}

/// Runs `work` (which does `n` units) and measures it.
fn measure<F: std::future::Future<Output = ()>>(
    rt: &Runtime,
    server: &RedisServer,
    n: u64,
    work: F,
) -> Cost {
    let cmds0 = CmdStats::read(server);
    let server0 = common::server_cpu(server);
    let client0 = common::process_cpu();
    let start = Instant::now();
    rt.block_on(work);
    let wall = start.elapsed();
    let client_cpu = common::process_cpu() - client0;
    let server_cpu = common::server_cpu(server).saturating_sub(server0);
    Cost {
        n,
        wall,
        client_cpu,
        server_cpu,
        cmds: CmdStats::read(server).since(&cmds0),
    }
}

// ---------------------------------------------------------------------------
// S2: 64 tasks, distinct keys, one connection
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Impl {
    Raw,
    Ours,
    Rslock,
    Spin,
}

impl Impl {
    const S2: [Impl; 3] = [Impl::Raw, Impl::Ours, Impl::Rslock];
    const S3: [Impl; 3] = [Impl::Ours, Impl::Rslock, Impl::Spin];

    fn name(self) -> &'static str {
        match self {
            Impl::Raw => "raw",
            Impl::Ours => "ours",
            Impl::Rslock => "rslock",
            Impl::Spin => "spin",
        }
    }
}

/// One key per task, in each implementation's spelling.
struct TaskKeys {
    raw: String,
    ours: LockKey,
    rslock: String,
}

struct S2 {
    conn: MultiplexedConnection,
    locker: Locker<RedisStore>,
    rslock: rslock::LockManager,
    keys: Vec<TaskKeys>,
}

impl S2 {
    async fn connect(url: &str) -> Arc<S2> {
        let client = redis::Client::open(url).expect("redis client");
        let s2 = Arc::new(S2 {
            conn: client
                .get_multiplexed_async_connection()
                .await
                .expect("raw connection"),
            locker: Locker::new(RedisStore::from_url(url).expect("redis store")),
            rslock: rslock::LockManager::new(vec![url]),
            keys: (0..S2_TASKS)
                .map(|t| TaskKeys {
                    raw: format!("raw:{{s2:{t}}}:lock"),
                    ours: LockKey::new("s2", t.to_string()).expect("key"),
                    rslock: format!("rslock:s2:{t}"),
                })
                .collect(),
        });
        // Connections, scripts and the watchdog stay out of the measurements.
        for imp in Impl::S2 {
            s2.cycle(imp, 0).await;
        }
        s2
    }

    async fn cycle(&self, imp: Impl, task: usize) {
        let keys = &self.keys[task];
        match imp {
            Impl::Raw => {
                let mut conn = self.conn.clone();
                let set: Option<String> = redis::cmd("SET")
                    .arg(&keys.raw)
                    .arg("val")
                    .arg("NX")
                    .arg("PX")
                    .arg(S2_TTL.as_millis() as u64)
                    .query_async(&mut conn)
                    .await
                    .expect("SET NX PX");
                assert!(set.is_some(), "SET NX on a free key was refused");
                let deleted: i64 = redis::cmd("DEL")
                    .arg(&keys.raw)
                    .query_async(&mut conn)
                    .await
                    .expect("DEL");
                assert_eq!(deleted, 1);
            }
            Impl::Ours => {
                let guard = self.locker.try_acquire(&keys.ours).await.expect("acquire");
                assert!(guard.release().await.expect("release"));
            }
            Impl::Rslock => {
                let lock = self
                    .rslock
                    .lock(keys.rslock.as_bytes(), S2_TTL)
                    .await
                    .expect("rslock lock");
                self.rslock.unlock(&lock).await;
            }
            Impl::Spin => unreachable!("not an S2 case"),
        }
    }

    /// `n` cycles of `imp`, shared out to the 64 tasks as they go.
    async fn run(self: &Arc<Self>, imp: Impl, n: u64) {
        let left = Arc::new(AtomicU64::new(n));
        let mut tasks = JoinSet::new();
        for task in 0..S2_TASKS {
            let (s2, left) = (self.clone(), left.clone());
            tasks.spawn(async move {
                while left
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |l| l.checked_sub(1))
                    .is_ok()
                {
                    s2.cycle(imp, task).await;
                }
            });
        }
        while let Some(done) = tasks.join_next().await {
            done.expect("S2 task");
        }
    }
}

fn s2_criterion(c: &mut Criterion, rt: &Runtime, s2: &Arc<S2>) {
    let mut group = c.benchmark_group(S2_GROUP);
    group.throughput(Throughput::Elements(1));
    for imp in Impl::S2 {
        group.bench_function(imp.name(), |b| {
            b.to_async(rt).iter_custom(|iters| async move {
                let start = Instant::now();
                s2.run(imp, iters).await;
                start.elapsed()
            });
        });
    }
    group.finish();
}

/// The S2 cases in interleaved rounds; one summed cost per case.
fn s2_loop(rt: &Runtime, server: &RedisServer, s2: &Arc<S2>) -> Vec<(Impl, Cost)> {
    let mut costs: Vec<(Impl, Cost)> = Impl::S2.iter().map(|&i| (i, Cost::default())).collect();
    for imp in Impl::S2 {
        rt.block_on(s2.run(imp, S2_CYCLES / 4));
    }
    for round in 0..S2_ROUNDS {
        for k in 0..costs.len() {
            let (imp, total) = &mut costs[(round + k) % Impl::S2.len()];
            let cost = measure(rt, server, S2_CYCLES, s2.run(*imp, S2_CYCLES));
            total.add(&cost);
        }
    }
    costs
}

fn s2_print(costs: &[(Impl, Cost)]) {
    let rate = |imp: Impl| {
        costs
            .iter()
            .find(|(i, _)| *i == imp)
            .map(|(_, c)| c.n as f64 / c.wall.as_secs_f64())
            .unwrap_or(f64::NAN)
    };
    println!();
    println!(
        "S2: {S2_TASKS} tasks, distinct keys, one connection each; {S2_ROUNDS} interleaved rounds of {S2_CYCLES} cycles per case"
    );
    println!(
        "{:<8} {:>11} {:>8} {:>10} {:>12} {:>12} {:>10} {:>10}",
        "case", "cycles/s", "÷ raw", "÷ rslock", "client µs/c", "server µs/c", "sent/c", "all/c"
    );
    for (imp, c) in costs {
        let r = rate(*imp);
        println!(
            "{:<8} {:>11.0} {:>8.3} {:>10.3} {:>12.2} {:>12.2} {:>10.2} {:>10.2}",
            imp.name(),
            r,
            r / rate(Impl::Raw),
            r / rate(Impl::Rslock),
            c.us_per(c.client_cpu),
            c.us_per(c.server_cpu),
            c.cmds.sent_calls(*imp) as f64 / c.n as f64,
            c.cmds.all_calls() as f64 / c.n as f64,
        );
    }
    for (imp, c) in costs {
        println!(
            "  {:<7} wall {:.2} µs/cycle, redis µs in commands {:.2}/cycle: {}",
            imp.name(),
            c.us_per(c.wall),
            c.cmds.usec() as f64 / c.n as f64,
            c.cmds.per(c.n as f64)
        );
    }
}

/// Keys per phase in [`s2_script_times`].
const PHASE_KEYS: usize = 4_096;

/// Runs `f` on every item, from 64 tasks at once.
fn fan_out<T, Fut>(rt: &Runtime, items: Vec<T>, f: impl Fn(T) -> Fut + Clone + 'static)
where
    T: 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    let queue = Rc::new(RefCell::new(items.into_iter()));
    let local = LocalSet::new();
    for _ in 0..S2_TASKS {
        let (queue, f) = (queue.clone(), f.clone());
        local.spawn_local(async move {
            loop {
                let item = queue.borrow_mut().next();
                match item {
                    Some(item) => f(item).await,
                    None => break,
                }
            }
        });
    }
    rt.block_on(local);
}

/// Server time per call of each script, from `INFO commandstats` over
/// phases that each make one kind of call ([`PHASE_KEYS`] of them, from 64
/// tasks): our acquire on free keys (grants), our acquire on the same keys
/// while held, our release; rslock's lock and unlock.
fn s2_script_times(rt: &Runtime, server: &RedisServer, s2: &Arc<S2>) {
    println!("redis-server µs per call, one kind of call per phase (INFO commandstats):");
    let phase = |name: &str, command: &str, work: &mut dyn FnMut()| {
        let before = CmdStats::read(server);
        work();
        let d = CmdStats::read(server).since(&before);
        let (calls, usec) = d.0.get(command).copied().unwrap_or((0, 0));
        println!(
            "  {name:<24} {command:<8} {:>5.2} µs per call ({calls} calls; per call: {})",
            usec as f64 / calls.max(1) as f64,
            d.per(calls.max(1) as f64)
        );
    };
    let keys: Vec<LockKey> = (0..PHASE_KEYS)
        .map(|i| LockKey::new("s2diag", i.to_string()).expect("key"))
        .collect();
    let guards: Rc<RefCell<Vec<LockGuard>>> = Rc::default();
    let locks: Rc<RefCell<Vec<rslock::Lock>>> = Rc::default();

    phase("ours acquire, key free", "evalsha", &mut || {
        let (s2, guards) = (s2.clone(), guards.clone());
        fan_out(rt, keys.clone(), move |key| {
            let (s2, guards) = (s2.clone(), guards.clone());
            async move {
                let guard = s2.locker.try_acquire(&key).await.expect("acquire");
                guards.borrow_mut().push(guard);
            }
        });
    });
    phase("ours acquire, key held", "evalsha", &mut || {
        let s2 = s2.clone();
        fan_out(rt, keys.clone(), move |key| {
            let s2 = s2.clone();
            async move { assert!(s2.locker.try_acquire(&key).await.is_err()) }
        });
    });
    phase("ours release", "evalsha", &mut || {
        fan_out(rt, guards.take(), |guard: LockGuard| async move {
            assert!(guard.release().await.expect("release"));
        });
    });
    phase("rslock lock (SET NX PX)", "set", &mut || {
        let (s2, locks) = (s2.clone(), locks.clone());
        fan_out(rt, keys.clone(), move |key| {
            let (s2, locks) = (s2.clone(), locks.clone());
            async move {
                let lock = s2
                    .rslock
                    .lock(key.as_str().as_bytes(), S2_TTL)
                    .await
                    .expect("rslock lock");
                locks.borrow_mut().push(lock);
            }
        });
    });
    phase("rslock unlock", "evalsha", &mut || {
        let s2 = s2.clone();
        fan_out(rt, locks.take(), move |lock: rslock::Lock| {
            let s2 = s2.clone();
            async move { s2.rslock.unlock(&lock).await }
        });
    });
}

// ---------------------------------------------------------------------------
// S3: 8 tasks on one key
// ---------------------------------------------------------------------------

/// One implementation, set up for S3.
enum Contender {
    Ours(Locker<RedisStore>, LockKey),
    Rslock(rslock::LockManager, String),
    Spin(MultiplexedConnection, String),
}

enum Held {
    Ours(LockGuard),
    Rslock(rslock::LockGuard),
    Spin,
}

impl Contender {
    async fn new(imp: Impl, url: &str, key: &str) -> Arc<Contender> {
        let c: Contender = match imp {
            Impl::Ours => {
                let locker = Locker::builder(RedisStore::from_url(url).expect("store"))
                    .wait_timeout(S3_WAIT)
                    .build()
                    .expect("locker");
                Contender::Ours(locker, LockKey::new("s3", key).expect("key"))
            }
            Impl::Rslock => Contender::Rslock(rslock::LockManager::new(vec![url]), key.to_owned()),
            Impl::Spin => {
                let client = redis::Client::open(url).expect("client");
                let conn = client
                    .get_multiplexed_async_connection()
                    .await
                    .expect("connection");
                Contender::Spin(conn, key.to_owned())
            }
            Impl::Raw => unreachable!("not an S3 case"),
        };
        // Connect (and load scripts) before anything is measured.
        let held = c.acquire().await;
        let c = Arc::new(c);
        if let Contender::Ours(..) = &*c {
            // One contended acquire, so that the store's pub/sub connection
            // is open too.
            let waiter = c.clone();
            let waiting = tokio::spawn(async move { waiter.acquire().await });
            tokio::time::sleep(Duration::from_millis(20)).await;
            c.release(held).await;
            let held = waiting.await.expect("waiter");
            c.release(held).await;
        } else {
            c.release(held).await;
        }
        c
    }

    async fn acquire(&self) -> Held {
        match self {
            Contender::Ours(locker, key) => loop {
                match locker.acquire(key).await {
                    Ok(guard) => return Held::Ours(guard),
                    // Not expected within 500 grants of 1 ms; try again.
                    Err(Error::WaitTimeout { .. }) => continue,
                    Err(e) => panic!("acquire: {e}"),
                }
            },
            Contender::Rslock(rl, key) => Held::Rslock(
                rl.acquire(key.as_bytes(), S3_TTL)
                    .await
                    .expect("rslock acquire"),
            ),
            Contender::Spin(conn, key) => {
                let mut conn = conn.clone();
                loop {
                    let set: Option<String> = redis::cmd("SET")
                        .arg(key)
                        .arg("val")
                        .arg("NX")
                        .arg("PX")
                        .arg(S3_TTL.as_millis() as u64)
                        .query_async(&mut conn)
                        .await
                        .expect("SET NX PX");
                    if set.is_some() {
                        return Held::Spin;
                    }
                }
            }
        }
    }

    async fn release(&self, held: Held) {
        match (self, held) {
            (Contender::Ours(..), Held::Ours(guard)) => {
                assert!(guard.release().await.expect("release"), "lock lost");
            }
            (Contender::Rslock(..), Held::Rslock(guard)) => guard.release().await,
            (Contender::Spin(conn, key), Held::Spin) => {
                let deleted: i64 = redis::cmd("DEL")
                    .arg(key)
                    .query_async(&mut conn.clone())
                    .await
                    .expect("DEL");
                assert_eq!(deleted, 1, "spin lock expired");
            }
            _ => unreachable!("a guard of another implementation"),
        }
    }
}

/// One grant, as the holder saw it.
#[derive(Clone, Copy)]
struct Grant {
    task: usize,
    granted: Instant,
    release_called: Option<Instant>,
    released: Option<Instant>,
}

/// What the S3 tasks share.
struct Log {
    grants: Mutex<Vec<Grant>>,
    /// Number of grants so far.
    count: watch::Sender<usize>,
}

impl Log {
    fn grant(&self, task: usize) -> usize {
        let granted = Instant::now();
        let mut grants = self.grants.lock().expect("log");
        grants.push(Grant {
            task,
            granted,
            release_called: None,
            released: None,
        });
        let n = grants.len();
        drop(grants);
        self.count.send_replace(n);
        n - 1
    }

    fn released(&self, n: usize, called: Instant) {
        let released = Instant::now();
        let mut grants = self.grants.lock().expect("log");
        grants[n].release_called = Some(called);
        grants[n].released = Some(released);
    }
}

async fn s3_task(c: Arc<Contender>, log: Arc<Log>, task: usize, handoff: bool) {
    let mut count = log.count.subscribe();
    loop {
        if *count.borrow() >= S3_GRANTS {
            return;
        }
        let held = c.acquire().await;
        let n = log.grant(task);
        if n >= S3_GRANTS {
            // A grant past the end: only to let this task stop.
            c.release(held).await;
            return;
        }
        tokio::time::sleep(S3_HOLD).await;
        let called = Instant::now();
        c.release(held).await;
        log.released(n, called);
        if handoff {
            // Wait until another task holds the lock (or the run is over).
            count
                .wait_for(|&granted| granted > n + 1 || n + 1 >= S3_GRANTS)
                .await
                .expect("log");
        }
    }
}

/// Outcome of one S3 case.
struct S3Result {
    imp: Impl,
    handoff: bool,
    grants: Vec<Grant>,
    cost: Cost,
}

impl S3Result {
    /// Release returned → next grant, in µs, per handoff.
    fn gaps(&self) -> Vec<f64> {
        self.grants
            .windows(2)
            .map(|w| signed_us(w[1].granted, w[0].released.expect("released")))
            .collect()
    }

    /// Release called → next grant, in µs.
    fn gaps_from_call(&self) -> Vec<f64> {
        self.grants
            .windows(2)
            .map(|w| signed_us(w[1].granted, w[0].release_called.expect("released")))
            .collect()
    }

    fn same_task(&self) -> usize {
        self.grants
            .windows(2)
            .filter(|w| w[0].task == w[1].task)
            .count()
    }

    /// Commands clients sent over the 500 grants.
    fn cmds_sent(&self) -> u64 {
        self.cost.cmds.sent_calls(self.imp)
    }

    fn mean_hold_us(&self) -> f64 {
        let holds: Vec<f64> = self
            .grants
            .iter()
            .map(|g| signed_us(g.release_called.expect("released"), g.granted))
            .collect();
        holds.iter().sum::<f64>() / holds.len() as f64
    }
}

fn signed_us(later: Instant, earlier: Instant) -> f64 {
    match later.checked_duration_since(earlier) {
        Some(d) => d.as_secs_f64() * 1e6,
        None => -(earlier.duration_since(later).as_secs_f64() * 1e6),
    }
}

fn s3_case(rt: &Runtime, server: &RedisServer, imp: Impl, handoff: bool) -> S3Result {
    let key = format!(
        "{}:{}",
        imp.name(),
        if handoff { "handoff" } else { "plain" }
    );
    let contender = rt.block_on(Contender::new(imp, &server.url(), &key));
    let log = Arc::new(Log {
        grants: Mutex::new(Vec::with_capacity(S3_GRANTS + S3_TASKS)),
        count: watch::channel(0).0,
    });
    let mut tasks = JoinSet::new();
    let cost = measure(rt, server, S3_GRANTS as u64, async {
        for task in 0..S3_TASKS {
            tasks.spawn(s3_task(contender.clone(), log.clone(), task, handoff));
        }
        // Measure up to the last counted release; the tasks then stop.
        let mut count = log.count.subscribe();
        count.wait_for(|&n| n >= S3_GRANTS).await.expect("log");
        loop {
            if log.grants.lock().expect("log")[S3_GRANTS - 1]
                .released
                .is_some()
            {
                break;
            }
            tokio::task::yield_now().await;
        }
    });
    rt.block_on(async {
        while let Some(done) = tasks.join_next().await {
            done.expect("S3 task");
        }
    });
    let mut grants = log.grants.lock().expect("log").clone();
    grants.truncate(S3_GRANTS);
    S3Result {
        imp,
        handoff,
        grants,
        cost,
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn s3_print(results: &[S3Result]) {
    println!();
    println!(
        "S3: {S3_TASKS} tasks, one key, hold {} ms, {S3_GRANTS} grants per case",
        S3_HOLD.as_millis()
    );
    println!(
        "{:<8} {:<8} {:>10} {:>9} {:>9} {:>9} {:>11} {:>8} {:>8} {:>8} {:>9} {:>9} {:>9}",
        "case",
        "variant",
        "gap mean",
        "p50",
        "p90",
        "p99",
        "from call",
        "sent/g",
        "all/g",
        "same",
        "hold µs",
        "client/g",
        "server/g"
    );
    for r in results {
        let gaps = r.gaps();
        let mut sorted = gaps.clone();
        sorted.sort_by(f64::total_cmp);
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        let from_call = r.gaps_from_call().iter().sum::<f64>() / gaps.len() as f64;
        let n = S3_GRANTS as f64;
        println!(
            "{:<8} {:<8} {:>10.1} {:>9.1} {:>9.1} {:>9.1} {:>11.1} {:>8.2} {:>8.2} {:>8} {:>9.0} {:>9.1} {:>9.1}",
            r.imp.name(),
            if r.handoff { "handoff" } else { "plain" },
            mean,
            percentile(&sorted, 50.0),
            percentile(&sorted, 90.0),
            percentile(&sorted, 99.0),
            from_call,
            r.cmds_sent() as f64 / n,
            r.cost.cmds.all_calls() as f64 / n,
            r.same_task(),
            r.mean_hold_us(),
            r.cost.us_per(r.cost.client_cpu),
            r.cost.us_per(r.cost.server_cpu),
        );
    }
    println!(
        "(gaps in µs from release returned to next grant; \"from call\": from release called;"
    );
    println!(
        " sent/g: commands clients sent per grant, all/g: all commands Redis ran incl. scripts';"
    );
    println!(
        " same: grants that went to the task that had just released; client/g, server/g: CPU µs per grant)"
    );
    for r in results {
        println!(
            "  {:<7} {:<8} wall {:.0} ms, per grant: {}",
            r.imp.name(),
            if r.handoff { "handoff" } else { "plain" },
            r.cost.wall.as_secs_f64() * 1e3,
            r.cost.cmds.per(S3_GRANTS as f64)
        );
    }
}

/// The handoff gaps, one line per grant, for plotting.
fn s3_write_csv(results: &[S3Result]) {
    let mut csv = String::from("case,variant,gap_us\n");
    for r in results {
        for g in r.gaps() {
            let variant = if r.handoff { "handoff" } else { "plain" };
            let _ = writeln!(csv, "{},{variant},{g:.1}", r.imp.name());
        }
    }
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../target")
        .join("contention-s3-gaps.csv");
    match std::fs::write(&path, csv) {
        Ok(()) => println!("S3 gaps written to {}", path.display()),
        Err(e) => println!("S3 gaps not written to {}: {e}", path.display()),
    }
}

/// The handoff gaps as a plot: one cumulative distribution per case, gap
/// on a log scale, written by hand as SVG to `benches/plots/`.
fn s3_write_svg(results: &[S3Result]) {
    let (w, h, left, bottom) = (720.0, 400.0, 60.0, 40.0);
    let (lo, hi) = (0.1f64.log10(), 100_000f64.log10());
    let x = |us: f64| left + (us.max(0.1).log10() - lo) / (hi - lo) * (w - left - 20.0);
    let y = |frac: f64| (h - bottom) - frac * (h - bottom - 20.0);
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    for decade in -1..=5 {
        let px = x(10f64.powi(decade));
        let _ = writeln!(
            svg,
            "<line x1=\"{px:.1}\" y1=\"20\" x2=\"{px:.1}\" y2=\"{:.1}\" stroke=\"#ddd\"/><text x=\"{px:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            h - bottom,
            h - bottom + 16.0,
            10f64.powi(decade)
        );
    }
    let _ = writeln!(
        svg,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">handoff gap, µs (log scale); y: share of grants with a gap at most x</text>",
        w / 2.0,
        h - 6.0
    );
    let colours = ["#1f77b4", "#d62728", "#2ca02c"];
    for (i, r) in results.iter().filter(|r| r.handoff).enumerate() {
        let mut gaps = r.gaps();
        gaps.sort_by(f64::total_cmp);
        let n = gaps.len().max(1) as f64;
        let points: Vec<String> = gaps
            .iter()
            .enumerate()
            .map(|(k, g)| format!("{:.1},{:.1}", x(*g), y((k + 1) as f64 / n)))
            .collect();
        let colour = colours[i % colours.len()];
        let _ = writeln!(
            svg,
            "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.5\" points=\"{}\"/><text x=\"{:.1}\" y=\"{:.1}\" fill=\"{colour}\">{}</text>",
            points.join(" "),
            left + 10.0,
            30.0 + 16.0 * i as f64,
            r.imp.name()
        );
    }
    svg.push_str("</svg>\n");
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../plots")
        .join("s3_handoff_gap.svg");
    match std::fs::write(&path, svg) {
        Ok(()) => println!("S3 handoff plot written to {}", path.display()),
        Err(e) => println!("S3 handoff plot not written to {}: {e}", path.display()),
    }
}

// ---------------------------------------------------------------------------

fn main() {
    let server = RedisServer::start();
    common::pin_self_to_cpu0();
    common::pin_server_to_cpu1(&server);
    let rt = common::runtime();
    let s2 = rt.block_on(S2::connect(&server.url()));

    let mut c = Criterion::default()
        .measurement_time(Duration::from_secs(4))
        .warm_up_time(Duration::from_secs(1))
        .configure_from_args();
    s2_criterion(&mut c, &rt, &s2);
    c.final_summary();

    // `cargo test --benches` runs each benchmark once as a smoke test, and
    // `--profile-time` is for profilers: the loops are for real runs only.
    if !common::full_run() {
        return;
    }
    let costs = s2_loop(&rt, &server, &s2);
    s2_print(&costs);
    s2_script_times(&rt, &server, &s2);

    let mut results = Vec::new();
    for handoff in [true, false] {
        for imp in Impl::S3 {
            results.push(s3_case(&rt, &server, imp, handoff));
        }
    }
    s3_print(&results);
    s3_write_csv(&results);
    s3_write_svg(&results);
    drop(s2);
    drop(rt);
    drop(server);
}
