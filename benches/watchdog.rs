//! The watchdog under load: 10,000 locks held at once with a 3 s lease,
//! kept for 30 s, on one server started by the test support
//! (`redis-server`, or `REDIS_SERVER_BIN`: a `valkey-server`).
//!
//! One `Locker::builder(RedisStore::from_url(..)).lease(3 s)` on a
//! current-thread tokio runtime takes 10,000 distinct keys (64 tasks taking
//! them in turn), then holds every guard for 30 s while its watchdog renews
//! them (every lease/3 = 1 s, in pipelined batches of 512: one call of the
//! batch renewal script each, or on Valkey 8.1 and later without fencing
//! one `SET … IFEQ` per lock). It reports:
//!
//! * locks lost: guards not held at the end, the lowest number held at any
//!   check during the hold (every 500 ms), and releases that found the
//!   lock no longer ours (`release` answering `false`); must all be 0;
//! * renewals: the renewal commands Redis was sent during the hold
//!   (`EVALSHA` and `SET`, `INFO commandstats`), grouped into ticks by a
//!   thread that samples the counters (a tick is a burst of calls with
//!   less than [`QUIET`] between samples that saw calls); every command
//!   Redis ran (those scripts ran included) per renewal; and the µs
//!   Redis spent in the renewal commands per renewal (`usec`). Renewals
//!   are counted in Redis: one `GET` each on the script path (extend.lua's
//!   owner check), one `SET` each on the `IFEQ` path;
//! * client CPU: `utime + stime` of this process (`/proc/self/stat`) and of
//!   the runtime thread alone (`/proc/self/task/<pid>/stat`) over the hold,
//!   as a percentage of one CPU, and the thread's less the bench's own
//!   checks of every guard (timed with the thread's CPU clock); the server's from `INFO cpu`, in all and
//!   less the sampler's own `INFO` calls (their `usec`), that less the
//!   same server idle with the sampler running (measured for a quarter of
//!   the hold, at most 10 s, before the locks are taken: the server's cron
//!   and the sampler's connection, which no renewal causes), and the
//!   renewal commands' `usec` alone, each as a percentage of one CPU;
//! * memory per held lock: the growth of this process's resident set
//!   (`/proc/self/statm`) from before the acquires to after them, divided
//!   by the number of locks.
//!
//! Run with `taskset -c 0 cargo bench --bench watchdog` (about 35 s).
//! The environment changes the case:
//!
//! * `WATCHDOG_LOCKS` (10,000), `WATCHDOG_LEASE_MS` (3,000) and
//!   `WATCHDOG_HOLD_MS` (30 s, or four renewal periods if longer). The
//!   goal's case, 100,000 locks at the default lease:
//!   `WATCHDOG_LOCKS=100000 WATCHDOG_LEASE_MS=30000 cargo bench --bench watchdog`
//!   (about 50 s);
//! * `WATCHDOG_FENCING=0`: a store with `fencing(false)` (on Valkey 8.1
//!   and later, the `SET … IFEQ` renewals).
//!
//! `cargo test --benches` runs a short version (200 locks for 2 s).

#[path = "../tests/support/mod.rs"]
mod support;

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use support::RedisServer;
use tokio::task::JoinSet;
use tower_redis_lock::redis;
use tower_redis_lock::{LockGuard, LockKey, Locker, RedisStore};

/// Renewals per pipeline (the locker's default, set here so the figures
/// say what they measured).
const RENEW_BATCH: usize = 512;

/// Locks held at once (`WATCHDOG_LOCKS`).
const LOCKS: usize = 10_000;
/// Their lease (`WATCHDOG_LEASE_MS`); the watchdog renews every lease/3.
const LEASE: Duration = Duration::from_secs(3);
/// How long they are held at least (`WATCHDOG_HOLD_MS`).
const HOLD: Duration = Duration::from_secs(30);
/// Tasks taking the locks.
const TASKS: usize = 64;
/// How often the sampler reads the renewal commands' counters.
const SAMPLE_EVERY: Duration = Duration::from_millis(10);
/// Samples with calls closer than this belong to one tick.
const QUIET: Duration = Duration::from_millis(100);

/// A number from the environment, or `default`.
fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name}={v}: not a number"))
        })
        .unwrap_or(default)
}
/// How often the hold loop checks every guard.
const CHECK_EVERY: Duration = Duration::from_millis(500);
/// `getconf PAGESIZE` on x86-64 Linux: the unit of `/proc/self/statm`.
const PAGE: u64 = 4096;
/// `getconf CLK_TCK`: the unit of the times in `/proc/<pid>/stat`.
const CLK_TCK: f64 = 100.0;

/// Resident set size of this process, in bytes.
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("resident pages");
    pages * PAGE
}

/// `utime + stime` from a `/proc/.../stat` file, in seconds.
fn cpu_seconds(path: &str) -> f64 {
    let stat = std::fs::read_to_string(path).expect("stat");
    // "pid (comm) state ppid ...": utime and stime are fields 14 and 15,
    // i.e. the 12th and 13th after the closing parenthesis.
    let after = stat.rsplit_once(')').map(|(_, a)| a).unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (ticks(11) + ticks(12)) as f64 / CLK_TCK
}

/// CPU seconds of the calling thread (`CLOCK_THREAD_CPUTIME_ID`, finer
/// than `/proc`'s ticks).
fn thread_cpu() -> f64 {
    // SAFETY: `clock_gettime` only writes into the zeroed struct we pass.
    let ts = unsafe {
        let mut ts: libc::timespec = std::mem::zeroed();
        libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts);
        ts
    };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

/// CPU seconds of the whole process and of the main (runtime) thread.
fn client_cpu() -> (f64, f64) {
    let pid = std::process::id();
    (
        cpu_seconds("/proc/self/stat"),
        cpu_seconds(&format!("/proc/self/task/{pid}/stat")),
    )
}

/// `calls` and `usec` of one command in an `INFO commandstats` text.
fn command_stat(info: &str, command: &str) -> (u64, u64) {
    support::parse_command_stats(info)
        .get(command)
        .copied()
        .unwrap_or_default()
}

/// A thread that reads the renewal commands' counters (`EVALSHA` and
/// `SET`) every [`SAMPLE_EVERY`] over one connection of its own.
struct Sampler {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Vec<(Instant, u64)>>,
}

impl Sampler {
    fn start(url: &str) -> Sampler {
        let client = redis::Client::open(url).expect("client");
        let mut conn = client.get_connection().expect("sampler connection");
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut samples = Vec::new();
            while !stopped.load(Ordering::Relaxed) {
                let info: String = redis::cmd("INFO")
                    .arg("commandstats")
                    .query(&mut conn)
                    .expect("INFO commandstats");
                let calls = command_stat(&info, "evalsha").0 + command_stat(&info, "set").0;
                samples.push((Instant::now(), calls));
                std::thread::sleep(SAMPLE_EVERY);
            }
            samples
        });
        Sampler { stop, thread }
    }

    fn stop(self) -> Vec<(Instant, u64)> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("sampler")
    }
}

/// One burst of renewals.
struct Tick {
    start: Instant,
    end: Instant,
    calls: u64,
}

/// Groups the sampled counter into bursts separated by [`QUIET`].
fn ticks(samples: &[(Instant, u64)]) -> Vec<Tick> {
    let mut ticks: Vec<Tick> = Vec::new();
    for w in samples.windows(2) {
        let (t, calls) = (w[1].0, w[1].1.saturating_sub(w[0].1));
        if calls == 0 {
            continue;
        }
        match ticks.last_mut() {
            Some(last) if t.duration_since(last.end) < QUIET => {
                last.end = t;
                last.calls += calls;
            }
            _ => ticks.push(Tick {
                start: w[0].0,
                end: t,
                calls,
            }),
        }
    }
    ticks
}

/// Takes `n` distinct keys from [`TASKS`] tasks; every guard.
async fn acquire_all(locker: &Locker<RedisStore>, n: usize) -> Vec<LockGuard> {
    let mut tasks = JoinSet::new();
    for t in 0..TASKS {
        let locker = locker.clone();
        tasks.spawn(async move {
            let mut guards = Vec::new();
            for i in (t..n).step_by(TASKS) {
                let key = LockKey::new("watchdog", i.to_string()).expect("key");
                guards.push(locker.try_acquire(&key).await.expect("acquire"));
            }
            guards
        });
    }
    let mut all = Vec::with_capacity(n);
    while let Some(guards) = tasks.join_next().await {
        all.extend(guards.expect("acquire task"));
    }
    all
}

/// Releases every guard from [`TASKS`] tasks; how many were still ours.
async fn release_all(guards: Vec<LockGuard>) -> usize {
    let mut tasks = JoinSet::new();
    let per_task = guards.len().div_ceil(TASKS).max(1);
    for chunk in guards.chunks(per_task) {
        let chunk = chunk.to_vec();
        tasks.spawn(async move {
            let mut owned = 0;
            for guard in chunk {
                owned += usize::from(guard.release().await.expect("release"));
            }
            owned
        });
    }
    let mut owned = 0;
    while let Some(n) = tasks.join_next().await {
        owned += n.expect("release task");
    }
    owned
}

fn main() {
    // `cargo test --benches` (no `--bench`) runs a short version.
    let real = common::full_run();
    let lease = Duration::from_millis(env_or("WATCHDOG_LEASE_MS", LEASE.as_millis() as u64));
    let hold = Duration::from_millis(env_or("WATCHDOG_HOLD_MS", HOLD.as_millis() as u64))
        .max(lease / 3 * 4);
    let fencing = env_or("WATCHDOG_FENCING", 1) != 0;
    let (locks, hold) = if real {
        (env_or("WATCHDOG_LOCKS", LOCKS as u64) as usize, hold)
    } else {
        (200, Duration::from_secs(2))
    };
    let lease = if real { lease } else { LEASE };

    let server = RedisServer::start();
    let rt = common::runtime();
    let store = RedisStore::builder(&server.url())
        .fencing(fencing)
        .build()
        .expect("store");
    let locker = Locker::builder(store.clone())
        .lease(lease)
        .renew_batch(RENEW_BATCH)
        .build()
        .expect("locker");
    // Connection, scripts and the watchdog task exist before measuring.
    rt.block_on(async {
        let key = LockKey::new("watchdog", "warm-up").expect("key");
        let guard = locker.try_acquire(&key).await.expect("acquire");
        guard.release().await.expect("release");
    });

    // The server with nothing held and the sampler running, as during the
    // hold: its cron and the sampler's connection (less the `INFO`s' own
    // time, as below), which the hold's figure includes and no renewal
    // causes.
    let idle = (hold / 4).min(Duration::from_secs(10));
    let idle_pct = {
        server.reset_stats();
        let sampler = Sampler::start(&server.url());
        let (server0, start) = (common::server_cpu(&server).as_secs_f64(), Instant::now());
        std::thread::sleep(idle);
        let used = common::server_cpu(&server).as_secs_f64() - server0;
        let wall = start.elapsed().as_secs_f64();
        sampler.stop();
        let info = server
            .cmd(&["INFO", "commandstats"])
            .as_string()
            .unwrap_or_default();
        (used - command_stat(&info, "info").1 as f64 / 1e6) / wall * 100.0
    };

    let rss_before = rss();
    let started = Instant::now();
    let guards = rt.block_on(acquire_all(&locker, locks));
    let acquire_time = started.elapsed();
    // Let the watchdog take in every new lease before measuring memory.
    rt.block_on(async { tokio::time::sleep(Duration::from_millis(200)).await });
    let rss_after = rss();
    let renewing_start = locker.renewing();

    server.reset_stats();
    let sampler = Sampler::start(&server.url());
    let (process0, thread0) = client_cpu();
    let server0 = common::server_cpu(&server).as_secs_f64();
    let start = Instant::now();
    let (min_held, checking) = rt.block_on(async {
        let mut min_held = guards.len();
        // The CPU the checks themselves take (this thread's), so that the
        // client's figure can be given without them: 100,000 guards
        // checked twice a second cost more than their renewals.
        let mut checking = 0.0;
        while start.elapsed() < hold {
            tokio::time::sleep(CHECK_EVERY.min(hold.saturating_sub(start.elapsed()))).await;
            let before = thread_cpu();
            min_held = min_held.min(guards.iter().filter(|g| g.is_held()).count());
            checking += thread_cpu() - before;
        }
        (min_held, checking)
    });
    let wall = start.elapsed().as_secs_f64();
    let (process1, thread1) = client_cpu();
    let server1 = common::server_cpu(&server).as_secs_f64();
    let samples = sampler.stop();
    let info = server
        .cmd(&["INFO", "commandstats"])
        .as_string()
        .unwrap_or_default();
    let stats = support::parse_command_stats(&info);
    let stat = |command: &str| stats.get(command).copied().unwrap_or_default();
    let (evalsha, evalsha_usec) = stat("evalsha");
    let (set, set_usec) = stat("set");
    let (_, info_usec) = stat("info");
    // One `GET` per renewal on the script path, one `SET` on IFEQ's.
    let renewals = stat("get").0 + set;
    let all_calls: u64 = stats
        .iter()
        .filter(|(name, _)| !name.starts_with("info") && !name.starts_with("config"))
        .map(|(_, (calls, _))| calls)
        .sum();

    let held_at_end = guards.iter().filter(|g| g.is_held()).count();
    let renewing_end = locker.renewing();
    let owned = rt.block_on(release_all(guards));

    let ticks = ticks(&samples);
    let per_tick: Vec<u64> = ticks.iter().map(|t| t.calls).collect();
    let period = if ticks.len() > 1 {
        ticks
            .windows(2)
            .map(|w| w[1].start.duration_since(w[0].start).as_secs_f64())
            .sum::<f64>()
            / (ticks.len() - 1) as f64
    } else {
        f64::NAN
    };
    let burst_ms = ticks
        .iter()
        .map(|t| t.end.duration_since(t.start).as_secs_f64() * 1e3)
        .sum::<f64>()
        / ticks.len().max(1) as f64;
    let per_renewal = |n: u64| n as f64 / renewals.max(1) as f64;
    let pct = |seconds: f64| seconds / wall * 100.0;

    println!();
    println!(
        "watchdog: {locks} locks, lease {} ms, fencing {fencing}, on {}, held {wall:.1} s \
         (renewal every {} ms, batches of {RENEW_BATCH})",
        lease.as_millis(),
        store
            .detected_server()
            .unwrap_or_else(|| "an unnamed server".into()),
        (lease / 3).as_millis()
    );
    println!(
        "  acquired in {:.0} ms from {TASKS} tasks; renewing: {renewing_start} at start, {renewing_end} at end",
        acquire_time.as_secs_f64() * 1e3
    );
    println!(
        "  lost: {} not held at the end, {} lowest held at any check, {} of {locks} releases found the lock gone",
        locks - held_at_end,
        min_held,
        locks - owned
    );
    println!(
        "  renewals during the hold: {renewals} ({:.0}/s); EVALSHA {evalsha}, SET {set}: \
         {:.4} EVALSHA and {:.3} commands in all (scripts' included) per renewal",
        renewals as f64 / wall,
        per_renewal(evalsha),
        per_renewal(all_calls),
    );
    println!(
        "  redis-server time in the renewal commands: {:.3} µs per renewal (usec of EVALSHA + SET)",
        per_renewal(evalsha_usec + set_usec)
    );
    println!(
        "  ticks observed: {} (mean period {:.3} s, mean burst {:.0} ms as sampled every {} ms)",
        ticks.len(),
        period,
        burst_ms,
        SAMPLE_EVERY.as_millis()
    );
    println!(
        "  renewal commands (EVALSHA + SET) per tick: mean {:.0}, min {}, max {}; per-tick counts: {per_tick:?}",
        per_tick.iter().sum::<u64>() as f64 / per_tick.len().max(1) as f64,
        per_tick.iter().min().copied().unwrap_or(0),
        per_tick.iter().max().copied().unwrap_or(0),
    );
    println!(
        "  round trips per renewal of all {locks}: {} pipelines (batch {RENEW_BATCH}) against {locks} one by one",
        locks.div_ceil(RENEW_BATCH)
    );
    println!(
        "  client CPU: {:.2} % of one CPU (process), {:.2} % (runtime thread), \
         {:.2} % (runtime thread less the bench's own checks of every guard, {:.3} s)",
        pct(process1 - process0),
        pct(thread1 - thread0),
        pct(thread1 - thread0 - checking),
        checking,
    );
    let less_info = pct(server1 - server0 - info_usec as f64 / 1e6);
    println!(
        "  redis-server CPU: {:.2} % of one CPU (INFO cpu), {less_info:.2} % less the sampler's INFO \
         ({:.3} s of usec), {:.3} % in the renewal commands (usec)",
        pct(server1 - server0),
        info_usec as f64 / 1e6,
        pct((evalsha_usec + set_usec) as f64 / 1e6),
    );
    println!(
        "  redis-server CPU for the renewals: {:.2} % of one CPU, the hold's {less_info:.2} % less \
         the same server idle with the sampler before the locks were taken ({idle_pct:.2} % over {:.1} s)",
        less_info - idle_pct,
        idle.as_secs_f64(),
    );
    println!(
        "  memory: RSS {:.1} MiB before, {:.1} MiB after acquiring: {:.0} bytes per held lock",
        rss_before as f64 / (1 << 20) as f64,
        rss_after as f64 / (1 << 20) as f64,
        (rss_after.saturating_sub(rss_before)) as f64 / locks as f64
    );
    drop(locker);
    drop(rt);
    drop(server);
}
