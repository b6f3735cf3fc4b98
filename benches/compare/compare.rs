//! The comparison with rslock, every figure from one command:
//!
//! ```text
//! cargo bench -p tower-redis-lock-compare --bench compare
//! ```
//!
//! The bench pins itself (its one runtime thread) to CPU 0 and every
//! `redis-server` it starts (all threads, `taskset -a -p -c 1`) to CPU 1:
//! client and server never share a core. Three passes; each figure is the
//! median of the passes (the spread is printed beside it).
//!
//! | scenario | what one cycle is |
//! |---|---|
//! | S1 | one task, one key: acquire then release, one after another |
//! | S2 | 64 tasks on one current-thread runtime, a key each, 64 cycles in flight |
//! | S4 | Redlock over 5 independent `redis-server`s, one task |
//!
//! Cases: `raw` (`SET k v NX PX` then `DEL k` on one redis-rs connection;
//! S1/S2 only), `rslock` 0.10 (`LockManager::lock` then `unlock`), `ours`
//! (`Locker::try_acquire` then `LockGuard::release`, fencing on, the
//! default) and `ours-unfenced` (the same, `RedisStoreBuilder::fencing(false)`).
//! Two more cases on plain redis-rs connections, the floors (see
//! `floor.rs`): `floor-fenced` (one script minting a clock-floored token
//! on the server, an owner-checked release) and `floor-unfenced` (`SET NX
//! PX`, rslock's release), the least a safe cycle can cost; the table
//! gives each of our cases' ratio to its floor too (S4: the fenced one),
//! and in S1 the ratio of p99 latencies. `floor-unfenced-os` is
//! `floor-unfenced` with each owner drawn from the OS random source, as
//! DESIGN.md asks of ours (S1, S2); `floor-unfenced-marked` is that one
//! with the release also deleting the waited-for mark and announcing
//! itself where a waiter set it, as ours does (S1, S2).
//! And `store-unfenced` (S1, S2): the unfenced `RedisStore`'s `acquire` and
//! `release` called without a `Locker`, to show what the `Locker` adds.
//! For each: cycles per second, the ratio to rslock, S1's p50/p99 latency
//! of a cycle, Redis commands per cycle (`INFO commandstats`, every call
//! including those scripts run, over all servers) and Redis CPU per cycle
//! (`INFO cpu`, `used_cpu_user + used_cpu_sys`, over all servers), and the
//! client's own CPU per cycle (`getrusage` of the bench process: the
//! runtime thread and the connection drivers on it).

#[path = "../../tests/support/mod.rs"]
mod support;

#[path = "../common/mod.rs"]
mod common;

mod floor;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use support::RedisServer;
use tokio::task::JoinSet;
use tower_redis_lock::{
    AcquireOutcome, LeaseKind, LockKey, LockStore, LockStoreExt, Locker, OwnerToken, RedisStore,
    RedlockStore,
};

const PASSES: usize = 3;
const TTL: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, PartialEq)]
enum Case {
    Raw,
    Rslock,
    Ours,
    Unfenced,
    FloorFenced,
    FloorUnfenced,
    FloorUnfencedOs,
    FloorMarked,
    StoreUnfenced,
}

impl Case {
    fn name(self) -> &'static str {
        match self {
            Case::Raw => "raw",
            Case::Rslock => "rslock",
            Case::Ours => "ours",
            Case::Unfenced => "ours-unfenced",
            Case::FloorFenced => "floor-fenced",
            Case::FloorUnfenced => "floor-unfenced",
            Case::FloorUnfencedOs => "floor-unfenced-os",
            Case::FloorMarked => "floor-unfenced-marked",
            Case::StoreUnfenced => "store-unfenced",
        }
    }

    /// The floor case this case is measured against, if any.
    fn floor(self) -> Option<Case> {
        match self {
            Case::Ours => Some(Case::FloorFenced),
            Case::Unfenced => Some(Case::FloorUnfenced),
            _ => None,
        }
    }
}

/// One case's clients, over one or several servers.
struct Client {
    raw: Option<MultiplexedConnection>,
    rslock: rslock::LockManager,
    ours: Ours,
    unfenced: Ours,
    floor: floor::Floor,
    /// The unfenced store called without a `Locker` (one server only).
    store: Option<RedisStore>,
}

/// Our locker as a user writes it: over the store itself (no `BoxStore`).
enum Ours {
    One(Locker<RedisStore>),
    Redlock(Locker<RedlockStore>),
}

impl Ours {
    async fn cycle(&self, k: &LockKey) {
        match self {
            Ours::One(locker) => try_and_release(locker, k).await,
            Ours::Redlock(locker) => try_and_release(locker, k).await,
        }
    }
}

async fn try_and_release<S: tower_redis_lock::LockStore>(locker: &Locker<S>, k: &LockKey) {
    let g = locker.try_acquire(k).await.unwrap();
    assert!(g.release().await.unwrap());
}

impl Client {
    async fn new(urls: &[String]) -> Client {
        let store = |fencing: bool| -> Ours {
            let nodes: Vec<RedisStore> = urls
                .iter()
                .map(|u| RedisStore::builder(u).fencing(fencing).build().unwrap())
                .collect();
            if nodes.len() == 1 {
                Ours::One(Locker::new(nodes.into_iter().next().unwrap()))
            } else {
                Ours::Redlock(Locker::new(RedlockStore::new(nodes).unwrap()))
            }
        };
        let raw = if urls.len() == 1 {
            let client = redis::Client::open(urls[0].as_str()).unwrap();
            Some(client.get_multiplexed_async_connection().await.unwrap())
        } else {
            None
        };
        Client {
            raw,
            rslock: rslock::LockManager::new(urls.to_vec()),
            ours: store(true),
            unfenced: store(false),
            floor: floor::Floor::new(urls).await,
            store: (urls.len() == 1).then(|| {
                RedisStore::builder(&urls[0])
                    .fencing(false)
                    .build()
                    .unwrap()
            }),
        }
    }

    async fn cycle(&self, case: Case, task: usize) {
        match case {
            Case::Raw => {
                let mut c = self.raw.clone().expect("raw is for one server");
                let k = format!("raw:{task}");
                let set: Option<String> = redis::cmd("SET")
                    .arg(&k)
                    .arg("v")
                    .arg("NX")
                    .arg("PX")
                    .arg(TTL.as_millis() as u64)
                    .query_async(&mut c)
                    .await
                    .unwrap();
                assert!(set.is_some());
                let _: i64 = redis::cmd("DEL").arg(&k).query_async(&mut c).await.unwrap();
            }
            Case::Rslock => {
                let k = format!("rslock:{task}");
                let lock = self.rslock.lock(k.as_bytes(), TTL).await.unwrap();
                self.rslock.unlock(&lock).await;
            }
            Case::Ours | Case::Unfenced => {
                let locker = if case == Case::Ours {
                    &self.ours
                } else {
                    &self.unfenced
                };
                let k = LockKey::new("cmp", task.to_string()).unwrap();
                locker.cycle(&k).await;
            }
            Case::FloorFenced | Case::FloorUnfenced | Case::FloorUnfencedOs | Case::FloorMarked => {
                let kind = floor::Kind {
                    fenced: case == Case::FloorFenced,
                    os_owner: matches!(case, Case::FloorUnfencedOs | Case::FloorMarked),
                    marked: case == Case::FloorMarked,
                };
                self.floor.cycle(kind, task).await
            }
            Case::StoreUnfenced => {
                // What the Locker adds (its guard, the watchdog, the local
                // queue, spans and metrics) is the difference from
                // `ours-unfenced`.
                let store = self
                    .store
                    .as_ref()
                    .expect("the store alone is for one server");
                let k = LockKey::new("cmp", task.to_string()).unwrap();
                let owner = OwnerToken::generate();
                let granted = store.acquire(&k, &owner, TTL).await.unwrap();
                assert!(matches!(granted, AcquireOutcome::GrantedUnfenced));
                assert!(store.release(LeaseKind::Lock, &k, &owner).await.unwrap());
            }
        }
    }
}

/// What one run of one case measured.
#[derive(Clone, Copy, Default)]
struct Run {
    per_s: f64,
    p50_us: f64,
    p99_us: f64,
    cmds: f64,
    cpu_us: f64,
    client_us: f64,
}

/// `n` cycles of `case` from `tasks` tasks (S1: one task, latencies kept).
async fn run(
    client: &Arc<Client>,
    servers: &[RedisServer],
    case: Case,
    tasks: usize,
    n: u64,
) -> Run {
    // Warm up: connections, scripts, the watchdog.
    for t in 0..tasks.min(4) {
        client.cycle(case, t).await;
    }
    let (calls0, cpu0) = common::server_counts(servers);
    let client0 = common::process_cpu();
    let start = Instant::now();
    let mut lat = Vec::new();
    if tasks == 1 {
        lat.reserve(n as usize);
        for _ in 0..n {
            let t = Instant::now();
            client.cycle(case, 0).await;
            lat.push(t.elapsed().as_secs_f64() * 1e6);
        }
    } else {
        let left = Arc::new(AtomicU64::new(n));
        let mut set = JoinSet::new();
        for task in 0..tasks {
            let (client, left) = (client.clone(), left.clone());
            set.spawn(async move {
                while left
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |l| l.checked_sub(1))
                    .is_ok()
                {
                    client.cycle(case, task).await;
                }
            });
        }
        while let Some(r) = set.join_next().await {
            r.unwrap();
        }
    }
    let elapsed = start.elapsed();
    let (calls1, cpu1) = common::server_counts(servers);
    lat.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        if lat.is_empty() {
            0.0
        } else {
            lat[((lat.len() - 1) as f64 * p) as usize]
        }
    };
    Run {
        per_s: n as f64 / elapsed.as_secs_f64(),
        p50_us: pct(0.50),
        p99_us: pct(0.99),
        // Less the `INFO` calls of `stats` itself (2 per server).
        cmds: (calls1 - calls0).saturating_sub(2 * servers.len() as u64) as f64 / n as f64,
        cpu_us: (cpu1 - cpu0).as_secs_f64() * 1e6 / n as f64,
        client_us: (common::process_cpu() - client0).as_secs_f64() * 1e6 / n as f64,
    }
}

fn scenario(
    rt: &tokio::runtime::Runtime,
    name: &str,
    nodes: usize,
    tasks: usize,
    n: u64,
    cases: &[Case],
) {
    let servers: Vec<RedisServer> = (0..nodes).map(|_| RedisServer::start()).collect();
    servers.iter().for_each(common::pin_server_to_cpu1);
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let client = Arc::new(rt.block_on(Client::new(&urls)));
    let mut runs: Vec<Vec<Run>> = vec![Vec::new(); cases.len()];
    for _ in 0..PASSES {
        // Cases interleaved within each pass.
        for (i, &case) in cases.iter().enumerate() {
            runs[i].push(rt.block_on(run(&client, &servers, case, tasks, n)));
        }
    }
    let rs = cases
        .iter()
        .position(|&c| c == Case::Rslock)
        .expect("rslock");
    let rs_rate = common::median(runs[rs].iter().map(|r| r.per_s).collect()).0;
    let rs_p99 = common::median(runs[rs].iter().map(|r| r.p99_us).collect()).0;
    println!(
        "\n{name}: {nodes} server(s), {tasks} task(s), {n} cycles x {PASSES} passes (median [min-max])"
    );
    println!(
        "| case | cycles/s | ÷ rslock | ÷ its floor | p50 µs | p99 µs | p99 ÷ rslock | p99 ÷ its floor's | Redis cmds/cycle | Redis CPU µs/cycle | client CPU µs/cycle |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for (i, case) in cases.iter().enumerate() {
        let col = |f: fn(&Run) -> f64| common::median(runs[i].iter().map(f).collect());
        let (rate, lo, hi) = col(|r| r.per_s);
        let (p50, p99) = (col(|r| r.p50_us).0, col(|r| r.p99_us).0);
        // Each pass's ratio to the floor measured in the same pass.
        let floor = case
            .floor()
            .and_then(|f| cases.iter().position(|&c| c == f));
        let floor_ratio = |f: fn(&Run) -> f64| {
            floor.map_or("–".to_owned(), |fl| {
                let ratios = runs[i].iter().zip(&runs[fl]).map(|(a, b)| f(a) / f(b));
                format!("{:.2}", common::median(ratios.collect()).0)
            })
        };
        let lat = if tasks == 1 {
            format!(
                "{p50:.0} | {p99:.0} | {:.2} | {}",
                p99 / rs_p99,
                floor_ratio(|r| r.p99_us)
            )
        } else {
            "– | – | – | –".to_owned()
        };
        let to_floor = floor_ratio(|r| r.per_s);
        println!(
            "| {} | {rate:.0} [{lo:.0}–{hi:.0}] | {:.2} | {to_floor} | {lat} | {:.1} | {:.1} | {:.1} |",
            case.name(),
            rate / rs_rate,
            col(|r| r.cmds).0,
            col(|r| r.cpu_us).0,
            col(|r| r.client_us).0,
        );
    }
}

fn main() {
    if !common::full_run() {
        // `cargo test --benches` smoke run: nothing to measure.
        return;
    }
    common::pin_self_to_cpu0();
    let rt = common::runtime();
    let all = [
        Case::Raw,
        Case::Rslock,
        Case::Ours,
        Case::Unfenced,
        Case::FloorFenced,
        Case::FloorUnfenced,
        Case::FloorUnfencedOs,
        Case::FloorMarked,
        Case::StoreUnfenced,
    ];
    if let Ok(only) = std::env::var("COMPARE_PROFILE") {
        // For a profiler (`perf record`): one scenario's one case, 10 times
        // its cycles, and nothing else, e.g. `COMPARE_PROFILE=S2:ours-unfenced`.
        let (name, case) = only
            .split_once(':')
            .expect("COMPARE_PROFILE=<S1|S2|S4>:<case>");
        let case = *all.iter().find(|c| c.name() == case).expect(
            "case: raw, rslock, ours, ours-unfenced, floor-fenced, floor-unfenced, \
                 floor-unfenced-os, floor-unfenced-marked or store-unfenced",
        );
        let (nodes, tasks, n) = match name {
            "S1" => (1, 1, 30_000),
            "S2" => (1, 64, 300_000),
            "S4" => (5, 1, 10_000),
            other => panic!("no scenario {other}"),
        };
        let n = std::env::var("COMPARE_CYCLES").map_or(n, |c| c.parse().expect("COMPARE_CYCLES"));
        let servers: Vec<RedisServer> = (0..nodes).map(|_| RedisServer::start()).collect();
        servers.iter().for_each(common::pin_server_to_cpu1);
        let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
        let client = Arc::new(rt.block_on(Client::new(&urls)));
        // Warm up (connections, script loads), then, for a profiler
        // attached to the servers, a marker: `COMPARE_MARK=<file>` is
        // written before the measured cycles and waited on (deleted) after
        // them, so the profile can be zeroed and dumped around them.
        rt.block_on(run(&client, &servers, case, tasks, n / 100));
        let mark = std::env::var("COMPARE_MARK").ok();
        let handshake = |stage: &str| {
            if let Some(m) = &mark {
                std::fs::write(m, stage).unwrap();
                while std::path::Path::new(m).exists() {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        };
        handshake("before");
        let r = rt.block_on(run(&client, &servers, case, tasks, n));
        handshake("after");
        println!(
            "{only}: {:.0} cycles/s, {:.1} Redis cmds/cycle",
            r.per_s, r.cmds
        );
        return;
    }
    // (10,000: S1's p99 is then the 100th slowest cycle of a pass, not the 30th.)
    scenario(&rt, "S1", 1, 1, 10_000, &all);
    scenario(&rt, "S2", 1, 64, 30_000, &all);
    scenario(
        &rt,
        "S4",
        5,
        1,
        1_000,
        &[Case::Rslock, Case::Ours, Case::Unfenced, Case::FloorFenced],
    );
}
