//! History checker (issue 10): several worker processes take and use locks
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
#[path = "history/worker.rs"]
mod worker;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use support::topology::start_independent;
use support::{RedisServer, Reply};

use checks::{
    attempt_overlaps, build_history, check_claims, check_exclusion, check_progress, check_resource,
    check_tokens, keys,
};
use faults::{Workers, inject_faults};
use monitor::{MONITOR_END, monitor};
use worker::{WorkerSpec, mono_ns, worker_main};

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

/// Runs one history: `workers` processes against `lock_servers`, faults
/// until the workload ends, then every check.
fn run_history(name: &str, seed: u64, lock_servers: &[RedisServer], workers: usize) {
    let started = Instant::now();
    eprintln!("{name}: seed {seed} (replay: HISTORY_SEED={seed} cargo test --test history {name})");
    let resource = RedisServer::start();
    let dir = tempfile::Builder::new()
        .prefix(&format!("{name}-"))
        .tempdir()
        .unwrap();
    let collector = monitor(&resource);
    let workload_end = Instant::now() + WORKLOAD;
    let mut pool = Workers {
        exe: std::env::current_exe().unwrap(),
        dir: dir.path().to_owned(),
        seed,
        lock_urls: lock_servers.iter().map(RedisServer::url).collect(),
        resource_url: resource.url(),
        deadline_ns: mono_ns() + WORKLOAD.as_nanos() as u64,
        next_id: 1,
        running: Vec::new(),
        finished: Vec::new(),
    };
    for _ in 0..workers {
        pool.spawn();
        pool.wait_started();
    }
    let mut rng = fastrand::Rng::with_seed(seed);
    let faults = inject_faults(&mut rng, &mut pool, lock_servers, workload_end);
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
    let h = build_history(&pool.finished);
    check_exclusion(&h, &mut violations);
    check_claims(&h, &mut violations);
    check_tokens(&h, &mut violations);
    check_resource(&h, &accepted, &finals, &mut violations);
    check_progress(&h, &accepted, &faults, &mut violations);

    let overlaps = attempt_overlaps(&h);
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
         faults {faults:?}, attempt-start overlaps (information) {}",
        started.elapsed().as_secs_f64(),
        pool.finished.len(),
        h.grants.len(),
        per_key.join("; "),
        accepted.len(),
        h.stale_by_workers.len(),
        h.write_errors,
        h.lost_observed,
        h.acquire_failures,
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
}

/// One Redis primary for the locks, one for the fenced resource; 4 workers.
#[test]
fn history_single_redis() {
    let seed = seed();
    let lock = RedisServer::start();
    run_history("history_single_redis", seed, std::slice::from_ref(&lock), 4);
}

/// Redlock over 3 independent primaries, one frozen at a time; 4 workers.
#[test]
fn history_redlock_3_nodes() {
    let seed = seed();
    let nodes = start_independent(3);
    run_history("history_redlock_3_nodes", seed, &nodes, 4);
}
