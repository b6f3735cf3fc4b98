//! The lock kinds side by side (issue 25), every figure from one command:
//!
//! ```text
//! cargo bench -p tower-redis-lock-compare --bench kinds
//! ```
//!
//! One `redis-server` (a free port, all its threads on CPU 1); the bench's
//! runtime thread on CPU 0, and the Node peer, when it runs, on CPU 0 too
//! (`taskset -c 0`). Three passes with the rows interleaved; each figure is
//! the median of the passes (throughput's spread beside it).
//!
//! | row | one cycle |
//! |---|---|
//! | `mutex` | `Locker::acquire` + `release`, one key |
//! | `semaphore n=4` | `locker.semaphore(key, 4)?.acquire()` + `release` |
//! | `redis-semaphore n=4` | npm `redis-semaphore`'s `Semaphore(key, 4)`: `acquire()` + `release()` (`peers/redis-semaphore/run.js`, library defaults) |
//! | `rw read` | `rwlock(key).read()` + `release`, all readers on one key |
//! | `rw write` | `rwlock(key).write()` + `release` |
//! | `acquire_all k` | `acquire_all(&k keys)` + `MultiGuard::release` |
//! | `sequential k` | `acquire` of each of the k keys in turn, then their releases |
//!
//! Tasks run on the one current-thread runtime, sharing one locker (one
//! multiplexed connection). Columns: cycles per second; p50 and p99 of one
//! cycle's latency (waiting included, whatever the task count); Redis
//! commands per cycle (`INFO commandstats` deltas, every call including
//! the ones scripts run, less the bench's own `INFO`s) and Redis CPU per
//! cycle (`INFO cpu`, `used_cpu_user + used_cpu_sys`). Fencing on (the
//! default), acquires waiting up to 10 s. The peer rows need `node` and `npm install` (exact versions
//! in `peers/redis-semaphore/package.json`) in `peers/redis-semaphore/`;
//! without them they are skipped, and the bench says so.

#[path = "../../tests/support/mod.rs"]
mod support;

#[path = "../common/mod.rs"]
mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use support::RedisServer;
use tokio::task::JoinSet;
use tower_redis_lock::{LockKey, Locker, RedisStore};

const PASSES: usize = 3;
const PERMITS: u32 = 4;
const PEER_KEY: &str = "peer:semaphore";

#[derive(Clone, Copy)]
enum Kind {
    Mutex,
    Semaphore,
    Peer,
    Read,
    Write,
    All(usize),
    Sequential(usize),
}

#[derive(Clone, Copy)]
struct Row {
    kind: Kind,
    tasks: usize,
    cycles: u64,
}

impl Row {
    fn name(&self) -> String {
        let tasks = match self.tasks {
            1 => "1 task".to_owned(),
            t => format!("{t} tasks"),
        };
        match self.kind {
            Kind::Mutex => format!("mutex, {tasks}"),
            Kind::Semaphore => format!("semaphore n={PERMITS}, {tasks}"),
            Kind::Peer => format!("redis-semaphore (npm) n={PERMITS}, {tasks}"),
            Kind::Read if self.tasks == 1 => "rw read, 1 reader".to_owned(),
            Kind::Read => format!("rw read, {} readers", self.tasks),
            Kind::Write => format!("rw write, {tasks}"),
            Kind::All(k) => format!("acquire_all {k} keys, {tasks}"),
            Kind::Sequential(k) => format!("sequential {k} mutexes, {tasks}"),
        }
    }
}

struct Ours {
    locker: Locker<RedisStore>,
    mutex: LockKey,
    semaphore: LockKey,
    rw: LockKey,
    multi: Vec<LockKey>,
}

impl Ours {
    fn new(url: &str) -> Ours {
        let key = |id: &str| LockKey::new("kinds", id).unwrap();
        Ours {
            // Waits up to 10 s (the default is 0: try once), as the peer's
            // `acquireTimeout` default does.
            locker: Locker::builder(RedisStore::builder(url).build().unwrap())
                .wait_timeout(Duration::from_secs(10))
                .build()
                .unwrap(),
            mutex: key("mutex"),
            semaphore: key("semaphore"),
            rw: key("rw"),
            multi: (0..8).map(|i| key(&format!("multi-{i}"))).collect(),
        }
    }

    async fn cycle(&self, kind: Kind) {
        let l = &self.locker;
        match kind {
            Kind::Mutex => assert!(
                l.acquire(&self.mutex)
                    .await
                    .unwrap()
                    .release()
                    .await
                    .unwrap()
            ),
            Kind::Semaphore => {
                let sem = l.semaphore(&self.semaphore, PERMITS).unwrap();
                assert!(sem.acquire().await.unwrap().release().await.unwrap());
            }
            Kind::Read => assert!(
                l.rwlock(&self.rw)
                    .unwrap()
                    .read()
                    .await
                    .unwrap()
                    .release()
                    .await
                    .unwrap()
            ),
            Kind::Write => assert!(
                l.rwlock(&self.rw)
                    .unwrap()
                    .write()
                    .await
                    .unwrap()
                    .release()
                    .await
                    .unwrap()
            ),
            Kind::All(k) => {
                let g = l.acquire_all(&self.multi[..k]).await.unwrap();
                assert!(g.release().await.unwrap());
            }
            Kind::Sequential(k) => {
                let mut held = Vec::with_capacity(k);
                for key in &self.multi[..k] {
                    held.push(l.acquire(key).await.unwrap());
                }
                for g in held.into_iter().rev() {
                    assert!(g.release().await.unwrap());
                }
            }
            Kind::Peer => unreachable!("the peer runs in Node"),
        }
    }
}

/// What one pass of one row measured.
#[derive(Clone, Copy, Default)]
struct Run {
    per_s: f64,
    p50_us: f64,
    p99_us: f64,
    cmds: f64,
    cpu_us: f64,
}

/// Counts per cycle between two `common::server_counts` readings.
fn per_cycle(server: &RedisServer, before: (u64, Duration), n: u64) -> (f64, f64) {
    let after = common::server_counts(std::slice::from_ref(server));
    // Less the `INFO` calls of the readings themselves (2 per reading).
    let cmds = (after.0 - before.0).saturating_sub(2) as f64 / n as f64;
    (cmds, (after.1 - before.1).as_secs_f64() * 1e6 / n as f64)
}

fn pct(lat: &mut [f64], p: f64) -> f64 {
    lat.sort_by(f64::total_cmp);
    lat.get(((lat.len().max(1) - 1) as f64 * p) as usize)
        .copied()
        .unwrap_or(0.0)
}

async fn run_ours(ours: &Rc<Ours>, server: &RedisServer, row: Row) -> Run {
    // Warm up: scripts loaded, the connection up.
    for _ in 0..4 {
        ours.cycle(row.kind).await;
    }
    let before = common::server_counts(std::slice::from_ref(server));
    let left = Rc::new(AtomicU64::new(row.cycles));
    let start = Instant::now();
    let mut set = JoinSet::new();
    let local = tokio::task::LocalSet::new();
    for _ in 0..row.tasks {
        let (ours, left) = (ours.clone(), left.clone());
        set.spawn_local_on(
            async move {
                let mut lat = Vec::new();
                while left
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |l| l.checked_sub(1))
                    .is_ok()
                {
                    let t = Instant::now();
                    ours.cycle(row.kind).await;
                    lat.push(t.elapsed().as_secs_f64() * 1e6);
                }
                lat
            },
            &local,
        );
    }
    let mut lat = local
        .run_until(async move {
            let mut all = Vec::new();
            while let Some(r) = set.join_next().await {
                all.extend(r.unwrap());
            }
            all
        })
        .await;
    let elapsed = start.elapsed();
    let (cmds, cpu_us) = per_cycle(server, before, row.cycles);
    Run {
        per_s: row.cycles as f64 / elapsed.as_secs_f64(),
        p50_us: pct(&mut lat, 0.50),
        p99_us: pct(&mut lat, 0.99),
        cmds,
        cpu_us,
    }
}

/// The Node peer's directory, if `node` runs and its packages are installed.
fn peer_dir() -> Result<PathBuf, String> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("peers/redis-semaphore");
    let node = Command::new("node").arg("--version").output();
    if !node.is_ok_and(|o| o.status.success()) {
        return Err("`node` does not run".to_owned());
    }
    for package in ["redis-semaphore", "ioredis"] {
        if !dir.join("node_modules").join(package).is_dir() {
            return Err(format!(
                "{package} is not installed (`npm install` in {})",
                dir.display()
            ));
        }
    }
    Ok(dir)
}

/// One pass of the Node peer: it warms up and says `ready`; the counters
/// are read; a line on its stdin starts its cycles; it answers one JSON
/// line; the counters are read again.
fn run_peer(dir: &PathBuf, server: &RedisServer, row: Row) -> Run {
    let mut child = Command::new("taskset")
        .args(["-c", "0", "node", "run.js"])
        .arg(server.url())
        .args([
            PEER_KEY.to_owned(),
            PERMITS.to_string(),
            row.tasks.to_string(),
            row.cycles.to_string(),
        ])
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("node run.js");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready", "the peer said {line:?}");
    let before = common::server_counts(std::slice::from_ref(server));
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"go\n").unwrap();
    stdin.flush().unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    let (cmds, cpu_us) = per_cycle(server, before, row.cycles);
    drop(stdin);
    assert!(child.wait().unwrap().success(), "node run.js failed");
    let v: serde_json::Value =
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("peer answered {line:?}: {e}"));
    let f = |k: &str| {
        v[k].as_f64()
            .unwrap_or_else(|| panic!("no {k} in {line:?}"))
    };
    Run {
        per_s: f("per_s"),
        p50_us: f("p50_us"),
        p99_us: f("p99_us"),
        cmds,
        cpu_us,
    }
}

fn main() {
    if !common::full_run() {
        // `cargo test --benches` smoke run: nothing to measure.
        return;
    }
    common::pin_self_to_cpu0();
    let rt = common::runtime();
    let server = RedisServer::start();
    common::pin_server_to_cpu1(&server);
    let ours = Rc::new(Ours::new(&server.url()));
    let peer = peer_dir();
    let row = |kind, tasks, cycles| Row {
        kind,
        tasks,
        cycles,
    };
    let mut rows = vec![
        row(Kind::Mutex, 1, 3_000),
        row(Kind::Semaphore, 1, 3_000),
        row(Kind::Peer, 1, 3_000),
        row(Kind::Mutex, 16, 3_000),
        row(Kind::Semaphore, 16, 3_000),
        row(Kind::Peer, 16, 3_000),
        row(Kind::Read, 1, 3_000),
        row(Kind::Read, 8, 6_000),
        row(Kind::Read, 64, 12_000),
        row(Kind::Write, 1, 3_000),
        row(Kind::All(2), 1, 2_000),
        row(Kind::Sequential(2), 1, 2_000),
        row(Kind::All(8), 1, 1_000),
        row(Kind::Sequential(8), 1, 1_000),
    ];
    if let Err(why) = &peer {
        println!("redis-semaphore (npm) peer skipped: {why}");
        rows.retain(|r| !matches!(r.kind, Kind::Peer));
    }
    let mut runs: Vec<Vec<Run>> = vec![Vec::new(); rows.len()];
    for _ in 0..PASSES {
        for (i, &r) in rows.iter().enumerate() {
            let run = match (&peer, r.kind) {
                (Ok(dir), Kind::Peer) => run_peer(dir, &server, r),
                _ => rt.block_on(run_ours(&ours, &server, r)),
            };
            runs[i].push(run);
        }
    }
    println!(
        "\nkinds: one redis-server (CPU 1), client on CPU 0, {PASSES} passes (median [min-max])"
    );
    println!(
        "| row | cycles | cycles/s | p50 µs | p99 µs | Redis cmds/cycle | Redis CPU µs/cycle |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (r, runs) in rows.iter().zip(&runs) {
        let col = |f: fn(&Run) -> f64| common::median(runs.iter().map(f).collect());
        let (rate, lo, hi) = col(|r| r.per_s);
        println!(
            "| {} | {} | {rate:.0} [{lo:.0}–{hi:.0}] | {:.0} | {:.0} | {:.1} | {:.1} |",
            r.name(),
            r.cycles,
            col(|r| r.p50_us).0,
            col(|r| r.p99_us).0,
            col(|r| r.cmds).0,
            col(|r| r.cpu_us).0,
        );
    }
}
