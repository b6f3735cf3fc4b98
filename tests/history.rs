//! History checker: several worker processes take and use locks
//! under injected faults, log everything they saw on the system-wide
//! monotonic clock, and the history is checked afterwards.
//!
//! The workers are this test binary re-executed with
//! `--exact history_worker_entry`; the worker entry returns at once when
//! `HISTORY_WORKER` is not set, so as a normal test it does nothing (the
//! checking tests below are `history_single_redis` and
//! `history_redlock_3_nodes`, and they refuse to pass unless every worker
//! they started logged its own start).
//!
//! Replay a run with `HISTORY_SEED=<seed> cargo test --test history`.
//! TESTING.md ("History checker") describes what is logged and checked.

mod support;

#[path = "history/checks.rs"]
mod checks;
#[path = "history/faults.rs"]
mod faults;
#[path = "history/monitor.rs"]
mod monitor;
#[path = "history/multi_worker.rs"]
mod multi_worker;
#[path = "history/worker.rs"]
mod worker;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use support::topology::start_independent;
use support::{RedisServer, Reply};

use checks::{
    Excludes, History, attempt_overlaps, build_history, check_at_most, check_claims,
    check_exclusion, check_lost, check_multi, check_progress, check_read_epochs, check_resource,
    check_tokens, check_writer_alone, keys,
};
use faults::{Fault, FaultCounts, Links, Plan, Workers, inject_faults};
use monitor::{MONITOR_END, monitor};
use worker::{SentinelSpec, WorkerSpec, mono_ns, worker_main};

/// Environment variable carrying a worker's spec; absent in normal test runs.
const WORKER_ENV: &str = "HISTORY_WORKER";
/// The test a worker process runs (`--exact`).
const WORKER_TEST: &str = "history_worker_entry";
/// Lock namespace and resource key prefix.
const NAMESPACE: &str = "history";
const KEYS: u32 = 3;
const LEASE: Duration = Duration::from_millis(300);
const WAIT: Duration = Duration::from_millis(600);
/// How long the workers run.
const WORKLOAD: Duration = Duration::from_secs(9);
/// Upper bound on loop iterations per worker (a second bound beside time).
const MAX_ITERATIONS: u32 = 2_000;
/// Hang guard on every store or resource call of a worker.
const CALL_GUARD: Duration = Duration::from_secs(5);
/// Hang guard for workers to exit once the workload time is over.
const EXIT_GUARD: Duration = Duration::from_secs(15);
/// Progress required per key (far below what a run does; see TESTING.md).
const MIN_GRANTS_PER_KEY: usize = 8;
const MIN_APPLIED_WRITES_PER_KEY: usize = 5;
/// How late a worker may log that `lost()` resolved, after the moment its
/// lock had certainly lapsed (its timer and its log line on a loaded
/// machine: the workers share 2 cores with the test and, in CI, with
/// other test binaries).
const LOST_SLACK: Duration = Duration::from_millis(150);
/// The nemesis run in `cargo test`: its workload.
const NEMESIS_WORKLOAD: Duration = Duration::from_secs(5);

/// The worker process's entry. As a normal test (no `HISTORY_WORKER`) it
/// returns at once and checks nothing; the checkers are the tests below.
#[test]
fn history_worker_entry() {
    let Ok(spec) = std::env::var(WORKER_ENV) else {
        return;
    };
    let spec = WorkerSpec::decode(&spec);
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(worker_main(spec));
}

// ---------------------------------------------------------------------------
// The checkers
// ---------------------------------------------------------------------------

fn seed() -> u64 {
    match std::env::var("HISTORY_SEED") {
        Ok(s) => s
            .parse()
            .unwrap_or_else(|_| panic!("HISTORY_SEED must be a u64, got {s:?}")),
        Err(_) => fastrand::u64(..),
    }
}

/// How the workers reach the lock servers.
#[derive(Clone, Copy, PartialEq)]
enum Proxies {
    /// Directly.
    None,
    /// Each through proxies of its own.
    PerWorker,
    /// A Cluster's nodes, each behind one proxy that every worker (and no
    /// node: the cluster bus is direct) goes through; a fault on it cuts
    /// the node off from every worker.
    Shared,
}

/// What a history is run with.
struct Run {
    workers: usize,
    workload: Duration,
    plan: Plan,
    /// Each worker through proxies of its own (the nemesis's faults), or
    /// through one proxy per node that all share (a Cluster's nodes
    /// announce one address each).
    proxied: Proxies,
    /// Grants and applied writes required per key.
    min_progress: (usize, usize),
    /// 0: the workers take locks; n: permits of n-permit semaphores, checked
    /// for at most n holders (and writing nothing).
    permits: u32,
    /// Half the grants two keys at once (`Locker::acquire_all`), checked
    /// by `check_multi` beside every check of the lock.
    multi: bool,
    /// The workers take reader-writer locks (see `WorkerSpec::rw`),
    /// checked for a writer never beside another holder.
    rw: bool,
}

impl Run {
    /// Processes paused and killed, lock servers frozen; 9 s.
    fn processes() -> Run {
        Run {
            workers: 4,
            workload: WORKLOAD,
            plan: Plan::processes(),
            proxied: Proxies::None,
            min_progress: (MIN_GRANTS_PER_KEY, MIN_APPLIED_WRITES_PER_KEY),
            permits: 0,
            rw: false,
            multi: false,
        }
    }

    /// The same faults, half the grants two keys at once.
    fn multi() -> Run {
        Run {
            multi: true,
            ..Run::processes()
        }
    }

    /// The same faults, the workers holding one of `permits` permits per
    /// key instead of its lock.
    fn semaphore(permits: u32) -> Run {
        Run {
            min_progress: (MIN_GRANTS_PER_KEY, 0),
            permits,
            ..Run::processes()
        }
    }
}

/// What a history did, for the figures.
#[derive(Debug, Default)]
struct Figures {
    grants: usize,
    applied: usize,
    stale: usize,
    losses: usize,
    faults: FaultCounts,
    /// Guards (or, for permits, grants bounding others' losses) the `lost`
    /// check judged.
    lost_bounds: usize,
    /// The smallest margin by which `lost()` came before its bound (ms).
    closest_lost: Option<f64>,
    stalls: usize,
}

/// Runs one history: `run.workers` processes against `lock_servers`,
/// faults until the workload ends, then every check.
fn run_history(name: &str, seed: u64, lock_servers: &[RedisServer], run: &Run) -> Figures {
    run_history_on(name, seed, lock_servers, None, run)
}

/// [`run_history`], the lock server being the primary `sentinel` names
/// when given.
fn run_history_on(
    name: &str,
    seed: u64,
    lock_servers: &[RedisServer],
    sentinel: Option<SentinelSpec>,
    run: &Run,
) -> Figures {
    let started = Instant::now();
    eprintln!("{name}: seed {seed} (replay: HISTORY_SEED={seed} cargo test --test history {name})");
    let resource = RedisServer::start();
    let dir = tempfile::Builder::new()
        .prefix(&format!("{name}-"))
        .tempdir()
        .unwrap();
    let collector = monitor(&resource);
    let workload_end = Instant::now() + run.workload;
    let mut pool = Workers {
        exe: std::env::current_exe().unwrap(),
        dir: dir.path().to_owned(),
        seed,
        lock_urls: lock_servers.iter().map(RedisServer::url).collect(),
        resource_url: resource.url(),
        deadline_ns: mono_ns() + run.workload.as_nanos() as u64,
        permits: run.permits,
        multi: run.multi,
        rw: run.rw,
        next_id: 1,
        running: Vec::new(),
        finished: Vec::new(),
        links: match run.proxied {
            Proxies::None => None,
            Proxies::PerWorker => Some(Links::new(
                lock_servers.iter().map(RedisServer::addr).collect(),
            )),
            Proxies::Shared => {
                let links = Links::shared(lock_servers.iter().map(RedisServer::addr).collect());
                announce_proxies(lock_servers, links.of(0));
                Some(links)
            }
        },
        cluster: run.proxied == Proxies::Shared,
        sentinel,
        pauses: Vec::new(),
    };
    for _ in 0..run.workers {
        pool.spawn();
        pool.wait_started();
    }
    let mut rng = fastrand::Rng::with_seed(seed);
    let faults = inject_faults(&mut rng, &run.plan, &mut pool, lock_servers, workload_end);
    let exited = pool.wait_all(EXIT_GUARD);
    resource.cmd(&["ECHO", MONITOR_END]);
    let accepted = collector.join().expect("the MONITOR thread panicked");
    let mut finals = BTreeMap::new();
    for key in keys() {
        let reply = resource.cmd(&["HMGET", &format!("res:{key}"), "value", "fencing_token"]);
        let Reply::Array(Some(items)) = reply else {
            panic!("HMGET answered {reply:?}");
        };
        let text = |r: &support::Reply| match r {
            Reply::Bulk(Some(b)) => Some(String::from_utf8_lossy(b).into_owned()),
            _ => None,
        };
        let state = text(&items[0]).zip(text(&items[1]).and_then(|t| t.parse().ok()));
        finals.insert(key, state);
    }

    let mut violations = Vec::new();
    if let Err(e) = &exited {
        violations.push(format!("workers: {e}"));
    }
    let accepted = match accepted {
        Ok(a) => a,
        Err(e) => {
            violations.push(format!("resource: {e}"));
            Vec::new()
        }
    };
    // The faults reached the workers only if their traffic went through
    // the proxies (behind Sentinel, by the address map).
    if let Some(links) = &pool.links {
        let (up, down) = links.bytes();
        if up == 0 || down == 0 {
            violations.push(format!(
                "proxies: no traffic went through them ({up} bytes up, {down} down)"
            ));
        }
    }
    let h = build_history(&pool.finished);
    if run.rw {
        check_writer_alone(&h, &mut violations);
        check_read_epochs(&h, &mut violations);
    } else if run.permits == 0 {
        check_exclusion(&h, &mut violations);
        check_claims(&h, &mut violations);
        check_multi(&h, &mut violations);
    } else {
        check_at_most(&h, run.permits as usize, &mut violations);
    }
    // (`lost`: a grant the other holder's kind shuts out means that one
    // must have lapsed; for permits, one more than the permits leave room
    // for means enough of them did.)
    let excludes = if run.rw {
        Excludes::ReadWrite
    } else if run.permits > 0 {
        Excludes::Permits(run.permits as usize)
    } else {
        Excludes::Lock
    };
    let (lost_bounds, closest_lost) = check_lost(&h, &pool.pauses, excludes, &mut violations);
    // (Readers share their epoch: tokens are the writers' to mint.)
    let minted = History {
        grants: h.grants.iter().filter(|g| !g.shared).cloned().collect(),
        ..History::default()
    };
    check_tokens(&minted, &mut violations);
    if run.permits == 0 && !run.rw {
        check_resource(&h, &accepted, &finals, &mut violations);
    }
    check_progress(
        &h,
        &accepted,
        run.min_progress,
        &run.plan,
        &faults,
        &mut violations,
    );

    let overlaps = attempt_overlaps(&h);
    let longest_stall = h
        .stalls
        .iter()
        .map(|(_, from, to)| (to - from) as f64 / 1e6)
        .fold(0.0, f64::max);
    let keep_logs = std::env::var_os("HISTORY_KEEP_LOGS").is_some();
    let per_key: Vec<String> = keys()
        .map(|k| {
            format!(
                "{k}: {} grants, {} applied",
                h.grants.iter().filter(|g| g.key == k).count(),
                accepted.iter().filter(|a| a.key == k).count()
            )
        })
        .collect();
    let summary = format!(
        "{name}: seed {seed}, {:.1} s, {} workers started, {} grants ({}), {} writes applied, \
         {} refused as stale, {} write errors, {} losses seen by holders, acquire failures {:?}, \
         faults {:?}, {} lost() bounds judged, lost() before its bound by at least {:?} ms, \
         worker stalls over 50 ms {} (longest {:.0} ms), attempt-start overlaps (information) {}",
        started.elapsed().as_secs_f64(),
        pool.finished.len(),
        h.grants.len(),
        per_key.join("; "),
        accepted.len(),
        h.stale_by_workers.len(),
        h.write_errors,
        h.lost_observed,
        h.acquire_failures,
        faults.by_kind,
        lost_bounds,
        closest_lost.map(|m| (m * 10.0).round() / 10.0),
        h.stalls.len(),
        longest_stall,
        overlaps.len(),
    );
    eprintln!("{summary}");
    if keep_logs {
        for o in &overlaps {
            eprintln!("{name}: attempt-start overlap (information): {o}");
        }
    }
    if !violations.is_empty() {
        let kept = dir.keep();
        // Up to 5 of each check, and how many there were.
        let mut by_check: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for v in &violations {
            let check = v.split(':').next().unwrap_or("");
            by_check.entry(check).or_default().push(v);
        }
        let counts: Vec<String> = by_check
            .iter()
            .map(|(check, vs)| format!("{check} {}", vs.len()))
            .collect();
        let shown: Vec<&str> = by_check
            .values()
            .flat_map(|vs| vs.iter().take(5).copied())
            .collect();
        panic!(
            "{name}: {} violation(s) ({}) with seed {seed} (replay: HISTORY_SEED={seed} cargo \
             test --test history {name}); logs kept in {}\n{summary}\n\n{}",
            violations.len(),
            counts.join(", "),
            kept.display(),
            shown.join("\n")
        );
    }
    if keep_logs {
        eprintln!("{name}: logs kept in {}", dir.keep().display());
    }
    Figures {
        grants: h.grants.len(),
        applied: accepted.len(),
        stale: h.stale_by_workers.len(),
        losses: h.grants.iter().filter(|g| g.lost_at.is_some()).count(),
        faults,
        lost_bounds,
        closest_lost,
        stalls: h.stalls.len(),
    }
}

/// Has each Cluster node announce its proxy's port (the cluster bus stays
/// direct), and waits until every node's slot map names only those ports:
/// clients then reach every node through its proxy.
fn announce_proxies(nodes: &[RedisServer], proxies: &[support::fault::FaultProxy]) {
    for (node, proxy) in nodes.iter().zip(proxies) {
        let port = proxy.addr().port().to_string();
        let reply = node.cmd(&["CONFIG", "SET", "cluster-announce-port", &port]);
        assert_eq!(reply.as_string().as_deref(), Some("OK"), "{reply:?}");
    }
    let ports: Vec<String> = proxies
        .iter()
        .map(|p| p.addr().port().to_string())
        .collect();
    let announced = || {
        nodes.iter().all(|n| {
            let text = n.cmd(&["CLUSTER", "NODES"]).as_string().unwrap_or_default();
            text.lines().count() == nodes.len()
                && text.lines().all(|l| {
                    // `<id> <ip>:<port>@<bus port> ...`
                    let addr = l.split(' ').nth(1).unwrap_or("");
                    let port = addr.split('@').next().and_then(|a| a.rsplit(':').next());
                    port.is_some_and(|p| ports.iter().any(|q| q == p))
                })
        })
    };
    assert!(
        support::wait_until(Duration::from_secs(20), announced),
        "the nodes did not announce their proxies"
    );
}

/// One Redis primary for the locks, one for the fenced resource; 4 workers.
#[test]
fn history_single_redis() {
    let seed = seed();
    let lock = RedisServer::start();
    let lock = std::slice::from_ref(&lock);
    run_history("history_single_redis", seed, lock, &Run::processes());
}

/// The semaphore: 5 workers share 2 permits per key on one Redis primary,
/// under the same faults (workers paused and killed, the server frozen):
/// never more than 2 holders of a key at once (check `at_most`), tokens
/// unique and rising per key (check `tokens`), progress.
#[test]
fn history_semaphore_single_redis() {
    let seed = seed();
    let lock = RedisServer::start();
    let lock = std::slice::from_ref(&lock);
    let run = Run {
        workers: 5,
        ..Run::semaphore(2)
    };
    run_history("history_semaphore_single_redis", seed, lock, &run);
}

/// The semaphore under the nemesis (each worker behind proxies of its own,
/// its links broken: latency, bandwidth, blackholes, partitions,
/// half-open and reset connections; worker pauses and kills): 5 workers,
/// 2 permits per key, one primary, 5 s; checks as
/// `history_semaphore_single_redis`.
#[test]
fn history_semaphore_nemesis() {
    one_primary_nemesis(
        "history_semaphore_nemesis",
        Run {
            permits: 2,
            ..Run::processes()
        },
    );
}

/// `run`'s kind under the nemesis on one primary: 5 workers, each behind
/// proxies of its own, 5 s, progress counted in grants.
fn one_primary_nemesis(name: &str, run: Run) {
    let seed = seed();
    let lock = RedisServer::start();
    let workload = NEMESIS_WORKLOAD;
    let run = Run {
        workers: 5,
        workload,
        plan: Plan::nemesis(&nemesis_faults()),
        proxied: Proxies::PerWorker,
        min_progress: ((workload.as_secs_f64() * 0.6) as usize, 0),
        ..run
    };
    run_history(name, seed, std::slice::from_ref(&lock), &run);
}

/// The reader-writer lock: 5 workers, a third of their takes writes, on
/// one Redis primary under the same faults (workers paused and killed,
/// the server frozen): no writer ever relied on a key beside another
/// holder (check `writer_alone`), reads carry the epoch of the writes
/// around them (`read_epochs`), writers' tokens unique and rising per key
/// (`tokens`), progress.
#[test]
fn history_rwlock_single_redis() {
    let seed = seed();
    let lock = RedisServer::start();
    let lock = std::slice::from_ref(&lock);
    let run = Run {
        workers: 5,
        min_progress: (MIN_GRANTS_PER_KEY, 0),
        rw: true,
        ..Run::processes()
    };
    run_history("history_rwlock_single_redis", seed, lock, &run);
}

/// The reader-writer lock under the nemesis (each worker behind proxies of
/// its own, its links broken; worker pauses and kills): 5 workers, one
/// primary, 5 s; checks as `history_rwlock_single_redis`.
#[test]
fn history_rwlock_nemesis() {
    one_primary_nemesis(
        "history_rwlock_nemesis",
        Run {
            rw: true,
            ..Run::processes()
        },
    );
}

/// Multi-key locks on one Redis primary (one script per grant), under the
/// faults of `history_single_redis`: half the grants take two keys at
/// once, the others one key's lock. Every check of the lock runs on each
/// key, and `multi`: a multi-key holder never overlaps any holder of any
/// of its keys.
#[test]
fn history_multi_single_redis() {
    let seed = seed();
    let lock = RedisServer::start();
    let lock = std::slice::from_ref(&lock);
    run_history("history_multi_single_redis", seed, lock, &Run::multi());
}

/// Multi-key locks over Redlock (3 primaries, one frozen at a time): the
/// keys taken one by one in the fixed order, rolled back when one is held.
#[test]
fn history_multi_redlock() {
    let seed = seed();
    let nodes = start_independent(3);
    run_history("history_multi_redlock", seed, &nodes, &Run::multi());
}

/// Redlock over 3 independent primaries, one frozen at a time; 4 workers.
#[test]
fn history_redlock_3_nodes() {
    let seed = seed();
    let nodes = start_independent(3);
    run_history("history_redlock_3_nodes", seed, &nodes, &Run::processes());
}

/// The kinds of lock the workers of a history take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    /// One key's lock.
    Lock,
    /// One of 2 permits per key.
    Semaphore,
    /// A key's reader-writer lock, a third of the takes writes.
    RwLock,
    /// Half the grants two keys at once, the others one key's lock.
    Multi,
}

impl Kind {
    const ALL: [Kind; 4] = [Kind::Lock, Kind::Semaphore, Kind::RwLock, Kind::Multi];

    fn name(self) -> &'static str {
        match self {
            Kind::Lock => "lock",
            Kind::Semaphore => "semaphore",
            Kind::RwLock => "rwlock",
            Kind::Multi => "multi",
        }
    }

    fn parse(name: &str) -> Kind {
        Kind::ALL
            .into_iter()
            .find(|k| k.name() == name)
            .unwrap_or_else(|| {
                panic!("NEMESIS_KIND: no kind {name:?} (lock, semaphore, rwlock, multi)")
            })
    }

    /// Whether `store` has this kind: Redlock has neither permits nor
    /// reader-writer locks (`LockStore::supports`: refused when made); one primary,
    /// Sentinel and a Cluster have every kind.
    fn on(self, store: &str) -> bool {
        store != "redlock" || matches!(self, Kind::Lock | Kind::Multi)
    }

    /// `run` with its workers taking this kind. Permits (2 per key) and
    /// reader-writer locks with 5 workers, as in their own histories, and
    /// no fenced writes asked for (they write none).
    fn apply(self, run: Run) -> Run {
        let grants = run.min_progress.0;
        let run = Run {
            permits: 0,
            rw: false,
            multi: false,
            ..run
        };
        match self {
            Kind::Lock => run,
            Kind::Semaphore => Run {
                workers: 5,
                permits: 2,
                min_progress: (grants, 0),
                ..run
            },
            Kind::RwLock => Run {
                workers: 5,
                rw: true,
                min_progress: (grants, 0),
                ..run
            },
            Kind::Multi => Run { multi: true, ..run },
        }
    }
}

/// The kinds `NEMESIS_KIND` names (`lock,multi`), or `rotation` when
/// unset; of those, the ones `store` has (perhaps none).
fn nemesis_lock_kinds(store: &str, rotation: &[Kind]) -> Vec<Kind> {
    let named: Vec<Kind> = std::env::var("NEMESIS_KIND").map_or_else(
        |_| rotation.to_vec(),
        |v| v.split(',').map(Kind::parse).collect(),
    );
    named.into_iter().filter(|k| k.on(store)).collect()
}

/// The kind a short nemesis history on `store` takes: one of
/// `nemesis_lock_kinds` chosen by the seed, so that the runs of
/// `cargo test` go through them in turn and a replay of the seed takes
/// the same.
fn rotated(seed: u64, store: &str, rotation: &[Kind]) -> Kind {
    let kinds = nemesis_lock_kinds(store, rotation);
    assert!(
        !kinds.is_empty(),
        "NEMESIS_KIND names no kind that {store} has (Redlock: lock, multi)"
    );
    kinds[(seed % kinds.len() as u64) as usize]
}

/// The nemesis: each worker reaches the lock servers through proxies of
/// its own, and its links get latency, a bandwidth limit, blackholes,
/// partitions, half-open and reset connections (and worker pauses and
/// kills), seeded. One primary, 5 s, in `cargo test`, the workers taking
/// one key's lock or (every other seed) multi-key locks; permits and
/// reader-writer locks on one primary have their own nemesis tests.
///
/// `NEMESIS_SECONDS=<n>` runs histories of `NEMESIS_WORKLOAD_MS` (10 s)
/// for `n` seconds instead, going through every kind on every store that
/// has it in turn (one primary, Redlock over 3 nodes, a Cluster of 3
/// primaries and a primary behind Sentinel; locks, permits, reader-writer
/// locks and multi-key locks, Redlock only locks and multi-key locks), and
/// prints the figures per store and kind.
/// `NEMESIS_STORE=redlock` runs only Redlock (`single` only one primary,
/// `cluster` only the Cluster, `sentinel` only a primary behind Sentinel);
/// `NEMESIS_KIND=semaphore,rwlock` only those kinds (`lock`, `semaphore`,
/// `rwlock`, `multi`); `NEMESIS_FAULTS=latency,sever` only those faults
/// (`Fault::name`).
#[test]
fn history_nemesis() {
    let base = seed();
    let faults = nemesis_faults();
    let store = std::env::var("NEMESIS_STORE").ok();
    let long: Option<u64> = std::env::var("NEMESIS_SECONDS")
        .ok()
        .map(|s| s.parse().expect("NEMESIS_SECONDS must be a number"));
    let workload = std::env::var("NEMESIS_WORKLOAD_MS").ok().map_or(
        if long.is_some() {
            WORKLOAD + Duration::from_secs(1)
        } else {
            NEMESIS_WORKLOAD
        },
        |ms| Duration::from_millis(ms.parse().expect("NEMESIS_WORKLOAD_MS")),
    );
    // Progress asked for: far below what a run does (12–19 grants and
    // 18–28 applied writes per key in 5 s).
    let per_second = workload.as_secs_f64();
    let run = Run {
        workers: 4,
        workload,
        plan: Plan::nemesis(&faults),
        proxied: Proxies::PerWorker,
        min_progress: ((per_second * 0.6) as usize, (per_second * 0.3) as usize),
        permits: 0,
        multi: false,
        rw: false,
    };
    let stores: Vec<&str> = match store.as_deref() {
        Some(s) => vec![s],
        None if long.is_some() => vec!["single", "redlock", "cluster", "sentinel"],
        None => vec!["single"],
    };
    // Every kind on every store in turn (the stores inside the kinds, so
    // that a short long run still sees each store); a single history
    // rotates its kind by the seed.
    let histories_to_run: Vec<(&str, Kind)> = match long {
        Some(_) => Kind::ALL
            .into_iter()
            .flat_map(|k| stores.iter().map(move |s| (*s, k)))
            .filter(|(s, k)| nemesis_lock_kinds(s, &Kind::ALL).contains(k))
            .collect(),
        None => {
            let rotation: &[Kind] = if stores[0] == "single" {
                &[Kind::Lock, Kind::Multi]
            } else {
                &Kind::ALL
            };
            vec![(stores[0], rotated(base, stores[0], rotation))]
        }
    };
    assert!(
        !histories_to_run.is_empty(),
        "NEMESIS_KIND names no kind that {stores:?} have (Redlock: lock, multi)"
    );
    let end = Instant::now() + Duration::from_secs(long.unwrap_or(0));
    let mut total = Figures::default();
    let mut by_store_kind: BTreeMap<(&str, Kind), (u64, Figures)> = BTreeMap::new();
    let mut histories = 0u64;
    loop {
        let (store, kind) = histories_to_run[histories as usize % histories_to_run.len()];
        let seed = base.wrapping_add(histories);
        eprintln!(
            "history_nemesis: {store}, {}, replay with HISTORY_SEED={seed} NEMESIS_STORE={store} \
             NEMESIS_KIND={} NEMESIS_WORKLOAD_MS={} cargo test --test history history_nemesis",
            kind.name(),
            kind.name(),
            workload.as_millis()
        );
        let run = kind.apply(Run {
            plan: run.plan.clone(),
            ..run
        });
        let f = match store {
            "single" => {
                let lock = RedisServer::start();
                run_history("history_nemesis", seed, std::slice::from_ref(&lock), &run)
            }
            "redlock" => run_history("history_nemesis", seed, &start_independent(3), &run),
            // (Two thirds of the progress asked of one primary, as in
            // `history_nemesis_cluster`: a fault cuts a node off from
            // every worker at once.)
            "cluster" => {
                let (grants, writes) = run.min_progress;
                let run = Run {
                    min_progress: (grants * 2 / 3, writes * 2 / 3),
                    plan: run.plan.clone(),
                    ..run
                };
                nemesis_on_a_cluster("history_nemesis", seed, &run)
            }
            "sentinel" => nemesis_behind_sentinel("history_nemesis", seed, &run),
            other => panic!("NEMESIS_STORE is single, redlock, cluster or sentinel, not {other:?}"),
        };
        histories += 1;
        let (n, of) = by_store_kind.entry((store, kind)).or_default();
        *n += 1;
        for sum in [&mut total, of] {
            sum.grants += f.grants;
            sum.applied += f.applied;
            sum.stale += f.stale;
            sum.losses += f.losses;
            sum.stalls += f.stalls;
            sum.lost_bounds += f.lost_bounds;
            sum.faults.add(&f.faults);
            sum.closest_lost = match (sum.closest_lost, f.closest_lost) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        if Instant::now() >= end {
            break;
        }
    }
    for ((store, kind), (n, f)) in &by_store_kind {
        eprintln!(
            "history_nemesis: {store}, {}: {n} histories, 0 violations, {} grants, {} writes \
             applied, {} refused as stale, {} guards lost, faults {:?}, {} lost() bounds judged, \
             lost() before its bound by at least {:?} ms",
            kind.name(),
            f.grants,
            f.applied,
            f.stale,
            f.losses,
            f.faults.by_kind,
            f.lost_bounds,
            f.closest_lost.map(|m| (m * 10.0).round() / 10.0),
        );
    }
    eprintln!(
        "history_nemesis: {histories} histories, 0 violations, {} grants, {} writes applied, \
         {} refused as stale, {} guards lost (lost() resolved), faults {:?} (past a lease: {:?}), \
         {} lost() bounds judged, lost() before its bound by at least {:?} ms, worker stalls \
         over 50 ms {}",
        total.grants,
        total.applied,
        total.stale,
        total.losses,
        total.faults.by_kind,
        total.faults.past_lease,
        total.lost_bounds,
        total.closest_lost,
        total.stalls,
    );
}

/// The fault kinds `NEMESIS_FAULTS` names (all when unset).
fn nemesis_faults() -> Vec<Fault> {
    std::env::var("NEMESIS_FAULTS")
        .map(|v| v.split(',').map(Fault::parse).collect())
        .unwrap_or_default()
}

/// A nemesis history on a Cluster of 3 primaries whose nodes each sit
/// behind one proxy that every worker shares (the slot map names the
/// proxies): a fault cuts a node (or all) off from every worker, while the
/// cluster bus stays up.
fn nemesis_on_a_cluster(name: &str, seed: u64, run: &Run) -> Figures {
    let cluster = support::topology::Cluster::start(3);
    let run = Run {
        proxied: Proxies::Shared,
        plan: run.plan.clone(),
        ..*run
    };
    run_history(name, seed, &cluster.nodes, &run)
}

/// The nemesis on a Cluster, 5 s, in `cargo test` (see
/// [`nemesis_on_a_cluster`]; the long run: `NEMESIS_STORE=cluster` with
/// `history_nemesis`). The workers take one kind of lock, chosen by the
/// seed among the four (`NEMESIS_KIND` names others).
#[test]
fn history_nemesis_cluster() {
    let seed = seed();
    let per_second = NEMESIS_WORKLOAD.as_secs_f64();
    let run = Run {
        workers: 4,
        workload: NEMESIS_WORKLOAD,
        plan: Plan::nemesis(&nemesis_faults()),
        proxied: Proxies::Shared,
        permits: 0,
        multi: false,
        rw: false,
        // Half of what is asked of one primary: a fault here cuts a node
        // off from every worker at once (3-14 grants per key in 5 s).
        min_progress: ((per_second * 0.4) as usize, (per_second * 0.2) as usize),
    };
    let kind = rotated(seed, "cluster", &Kind::ALL);
    eprintln!("history_nemesis_cluster: {}", kind.name());
    nemesis_on_a_cluster("history_nemesis_cluster", seed, &kind.apply(run));
}

/// A nemesis history behind Sentinel: a primary, its replica and three
/// Sentinels. Each worker's store asks the Sentinels (directly) for the
/// primary and reaches the address they name through proxies of its own
/// (`DataNodes::with_address_map`), so a fault cuts one worker off from
/// the primary while the others and the Sentinels still reach it: a
/// client-side fault, never a failover.
fn nemesis_behind_sentinel(name: &str, seed: u64, run: &Run) -> Figures {
    let set = support::topology::SentinelSet::start();
    let (host, port) = set.master_addr();
    let sentinel = SentinelSpec {
        urls: set.sentinel_urls(),
        master: set.master_name.clone(),
        named: format!("{host}:{port}").parse().unwrap(),
    };
    let run = Run {
        proxied: Proxies::PerWorker,
        plan: run.plan.clone(),
        ..*run
    };
    let figures = run_history_on(
        name,
        seed,
        std::slice::from_ref(&set.primary),
        Some(sentinel),
        &run,
    );
    // The faults were the workers' alone: the Sentinels never failed over.
    assert_eq!(
        set.master_addr().1,
        port,
        "the Sentinels failed over during the run\n{}",
        set.diagnostics()
    );
    figures
}

/// The nemesis behind Sentinel, 5 s, in `cargo test` (see
/// [`nemesis_behind_sentinel`]; the long run: `NEMESIS_STORE=sentinel`
/// with `history_nemesis`). The workers take one kind of lock, chosen by
/// the seed among the four (`NEMESIS_KIND` names others).
#[test]
fn history_nemesis_sentinel() {
    let seed = seed();
    let per_second = NEMESIS_WORKLOAD.as_secs_f64();
    let run = Run {
        workers: 4,
        workload: NEMESIS_WORKLOAD,
        plan: Plan::nemesis(&nemesis_faults()),
        proxied: Proxies::PerWorker,
        permits: 0,
        multi: false,
        rw: false,
        min_progress: ((per_second * 0.6) as usize, (per_second * 0.3) as usize),
    };
    let kind = rotated(seed, "sentinel", &Kind::ALL);
    eprintln!("history_nemesis_sentinel: {}", kind.name());
    nemesis_behind_sentinel("history_nemesis_sentinel", seed, &kind.apply(run));
}
