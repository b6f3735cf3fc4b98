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

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::{self, Write as _};
use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Write as _};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use support::RedisServer;
use support::topology::start_independent;
use tower_redis_lock::{
    FenceOutcome, FencedResource, LockGuard, LockKey, LockStore, Locker, RedisStore, RedlockStore,
};

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

// ---------------------------------------------------------------------------
// Clock and log lines
// ---------------------------------------------------------------------------

/// `CLOCK_MONOTONIC` in nanoseconds: one clock for every process on the
/// machine (std and tokio `Instant`s read the same clock on Linux).
fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC) failed");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A worker's event log: one line per event, `<mono ns> <KIND> k=v ...`,
/// each appended with a single `write` so a SIGKILL never leaves half a line
/// behind a complete one.
struct EventLog {
    file: File,
}

impl EventLog {
    fn open(path: &Path) -> EventLog {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
        EventLog { file }
    }

    fn event(&mut self, t: u64, kind: &str, fields: fmt::Arguments<'_>) {
        let line = format!("{t} {kind} {fields}\n");
        self.file
            .write_all(line.as_bytes())
            .expect("cannot append to the worker log");
    }
}

// ---------------------------------------------------------------------------
// Worker side
// ---------------------------------------------------------------------------

/// What a worker process is told (through `HISTORY_WORKER`).
#[derive(Debug, Clone)]
struct WorkerSpec {
    id: u32,
    seed: u64,
    lock_urls: Vec<String>,
    resource_url: String,
    log: PathBuf,
    deadline_ns: u64,
}

impl WorkerSpec {
    fn encode(&self) -> String {
        format!(
            "id={};seed={};locks={};resource={};log={};deadline={}",
            self.id,
            self.seed,
            self.lock_urls.join(","),
            self.resource_url,
            self.log.display(),
            self.deadline_ns
        )
    }

    fn decode(text: &str) -> WorkerSpec {
        let fields: HashMap<&str, &str> = text
            .split(';')
            .filter_map(|kv| kv.split_once('='))
            .collect();
        let field = |name: &str| {
            *fields
                .get(name)
                .unwrap_or_else(|| panic!("{WORKER_ENV} has no {name}: {text}"))
        };
        WorkerSpec {
            id: field("id").parse().unwrap(),
            seed: field("seed").parse().unwrap(),
            lock_urls: field("locks").split(',').map(str::to_owned).collect(),
            resource_url: field("resource").to_owned(),
            log: PathBuf::from(field("log")),
            deadline_ns: field("deadline").parse().unwrap(),
        }
    }
}

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

fn lock_node(url: &str) -> RedisStore {
    RedisStore::from_url(url)
        .unwrap()
        .with_command_timeout(Duration::from_millis(500))
        .unwrap()
}

async fn worker_main(spec: WorkerSpec) {
    let mut log = EventLog::open(&spec.log);
    log.event(
        mono_ns(),
        "START",
        format_args!(
            "worker={} pid={} seed={}",
            spec.id,
            std::process::id(),
            spec.seed
        ),
    );
    if spec.lock_urls.len() == 1 {
        let store = lock_node(&spec.lock_urls[0]);
        worker_loop(&spec, &mut log, store).await;
    } else {
        let nodes = spec.lock_urls.iter().map(|u| lock_node(u)).collect();
        let store = RedlockStore::new(nodes).unwrap();
        worker_loop(&spec, &mut log, store).await;
    }
}

/// How one grant is used.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Style {
    /// Write, then end at once.
    Short,
    /// Hold for up to 2.5 leases (the watchdog renews), writing midway.
    Long,
    /// Taken with a hold cap of one lease: renewals stop, the lock expires
    /// while we keep the guard; held until the guard says so.
    Expire,
}

async fn worker_loop<S: LockStore + Clone>(spec: &WorkerSpec, log: &mut EventLog, store: S) {
    let normal = Locker::builder(store.clone())
        .lease(LEASE)
        .wait_timeout(WAIT)
        .build()
        .unwrap();
    let capped = Locker::builder(store)
        .lease(LEASE)
        .wait_timeout(WAIT)
        .max_hold(LEASE)
        .build()
        .unwrap();
    let mut rng = fastrand::Rng::with_seed(
        spec.seed ^ u64::from(spec.id).wrapping_mul(0x9E37_79B9_7F4A_7C15),
    );
    let mut conn = redis::Client::open(spec.resource_url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let mut grants = 0u32;
    for _ in 0..MAX_ITERATIONS {
        if mono_ns() >= spec.deadline_ns {
            break;
        }
        let k = rng.u32(..KEYS);
        let key = LockKey::new(NAMESPACE, format!("k{k}")).unwrap();
        let style = match rng.u32(..100) {
            0..55 => Style::Short,
            55..85 => Style::Long,
            _ => Style::Expire,
        };
        let locker = if style == Style::Expire {
            &capped
        } else {
            &normal
        };
        log.event(mono_ns(), "ATTEMPT", format_args!("key=k{k}"));
        let res = tokio::time::timeout(CALL_GUARD, locker.acquire(&key)).await;
        let t = mono_ns();
        let guard = match res {
            Ok(Ok(guard)) => guard,
            Ok(Err(e)) => {
                let why = if e.is_contended() {
                    "contended"
                } else if e.is_store_failure() {
                    "store"
                } else {
                    "other"
                };
                log.event(t, "ACQFAIL", format_args!("key=k{k} why={why}"));
                if why != "contended" {
                    // The store is failing (frozen): back off a little.
                    tokio::time::sleep(Duration::from_millis(rng.u64(10..50))).await;
                }
                continue;
            }
            Err(_) => {
                log.event(t, "ACQFAIL", format_args!("key=k{k} why=hang"));
                continue;
            }
        };
        grants += 1;
        let grant = Grant {
            id: format!("w{}-{grants}", spec.id),
            key: format!("k{k}"),
            resource: FencedResource::new(format!("res:k{k}")),
        };
        let attempt = t.saturating_sub(guard.acquired_at().elapsed().as_nanos() as u64);
        log.event(
            t,
            "GRANT",
            format_args!(
                "key={} grant={} token={} attempt={attempt} style={style:?}",
                grant.key,
                grant.id,
                guard.fencing_token().get()
            ),
        );
        observe(log, &grant, &guard);
        let mut writes = 0u32;
        grant.write(log, &guard, &mut conn, &mut writes).await;
        match style {
            Style::Short => {}
            Style::Long => {
                let hold = LEASE.mul_f64(rng.f64() * 2.0 + 0.5);
                let mid = hold / 2;
                let start = Instant::now();
                let mut wrote_mid = false;
                while start.elapsed() < hold {
                    tokio::time::sleep(LEASE / 5).await;
                    observe(log, &grant, &guard);
                    if !wrote_mid && start.elapsed() >= mid {
                        wrote_mid = true;
                        grant.write(log, &guard, &mut conn, &mut writes).await;
                    }
                }
            }
            Style::Expire => {
                let start = Instant::now();
                while start.elapsed() < LEASE * 4 {
                    tokio::time::sleep(LEASE / 5).await;
                    if !observe(log, &grant, &guard) {
                        break;
                    }
                }
                // A late write, as from a holder that woke up after its
                // lease: the resource must refuse it once a newer holder
                // has written.
                grant.write(log, &guard, &mut conn, &mut writes).await;
            }
        }
        // The last look before giving the lock back.
        observe(log, &grant, &guard);
        if rng.u32(..100) < 70 {
            log.event(mono_ns(), "RELEASING", format_args!("grant={}", grant.id));
            let res = tokio::time::timeout(CALL_GUARD, guard.release()).await;
            let result = match res {
                Ok(Ok(owned)) => owned.to_string(),
                Ok(Err(e)) if e.is_store_failure() => "store".to_owned(),
                Ok(Err(_)) => "error".to_owned(),
                Err(_) => "hang".to_owned(),
            };
            log.event(
                mono_ns(),
                "RELEASED",
                format_args!("grant={} result={result}", grant.id),
            );
        } else {
            log.event(mono_ns(), "DROP", format_args!("grant={}", grant.id));
            drop(guard);
        }
    }
    log.event(mono_ns(), "END", format_args!("grants={grants}"));
}

struct Grant {
    id: String,
    key: String,
    resource: FencedResource,
}

/// Looks at the guard and logs what it said. The timestamp is taken before
/// the call, so a `HELD` line's time is never later than the moment the
/// guard claimed the lock.
fn observe(log: &mut EventLog, grant: &Grant, guard: &LockGuard) -> bool {
    let t = mono_ns();
    let held = guard.is_held();
    let valid_for = guard.valid_for();
    if held {
        log.event(
            t,
            "HELD",
            format_args!("grant={} valid_us={}", grant.id, valid_for.as_micros()),
        );
    } else {
        log.event(
            t,
            "NOTHELD",
            format_args!("grant={} lost={}", grant.id, guard.is_lost()),
        );
    }
    held
}

impl Grant {
    /// One fenced write with this grant's token; the value names the grant.
    async fn write(
        &self,
        log: &mut EventLog,
        guard: &LockGuard,
        conn: &mut redis::aio::MultiplexedConnection,
        writes: &mut u32,
    ) {
        *writes += 1;
        let value = format!("{}/{}", self.id, writes);
        let token = guard.fencing_token();
        let sent = mono_ns();
        let res = tokio::time::timeout(CALL_GUARD, self.resource.set(conn, token, &value)).await;
        let result = match res {
            Ok(Ok(FenceOutcome::Applied)) => "applied".to_owned(),
            Ok(Ok(FenceOutcome::Stale { seen })) => format!("stale:{}", seen.get()),
            Ok(Err(_)) => "error".to_owned(),
            Err(_) => "hang".to_owned(),
        };
        log.event(
            mono_ns(),
            "WRITE",
            format_args!(
                "key={} grant={} token={} value={value} sent={sent} result={result}",
                self.key,
                self.id,
                token.get()
            ),
        );
    }
}

// ---------------------------------------------------------------------------
// Controller side: processes and faults
// ---------------------------------------------------------------------------

/// The worker processes; every one still running is SIGCONTed, SIGKILLed
/// and reaped on drop (also when the test panics).
struct Workers {
    exe: PathBuf,
    dir: PathBuf,
    seed: u64,
    lock_urls: Vec<String>,
    resource_url: String,
    deadline_ns: u64,
    next_id: u32,
    running: Vec<Worker>,
    finished: Vec<(u32, PathBuf, Option<std::process::ExitStatus>)>,
}

struct Worker {
    id: u32,
    child: Child,
    log: PathBuf,
}

impl Workers {
    fn spawn(&mut self) {
        let id = self.next_id;
        self.next_id += 1;
        let log = self.dir.join(format!("worker-{id}.log"));
        let spec = WorkerSpec {
            id,
            seed: self.seed,
            lock_urls: self.lock_urls.clone(),
            resource_url: self.resource_url.clone(),
            log: log.clone(),
            deadline_ns: self.deadline_ns,
        };
        let out = File::create(self.dir.join(format!("worker-{id}.out"))).unwrap();
        let mut cmd = Command::new(&self.exe);
        cmd.args(["--exact", WORKER_TEST, "--nocapture", "--test-threads=1"])
            .env(WORKER_ENV, spec.encode())
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out);
        let parent = std::process::id() as libc::pid_t;
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0
                    || libc::getppid() != parent
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().expect("cannot re-execute the test binary");
        self.running.push(Worker { id, child, log });
    }

    /// Waits until the newest worker has logged `START`: proof that the
    /// re-executed binary really runs the worker (not an empty filter) and a
    /// worker is never killed before it began.
    fn wait_started(&mut self) {
        const LIMIT: Duration = Duration::from_secs(20);
        let end = Instant::now() + LIMIT;
        let w = self.running.last_mut().expect("no worker to wait for");
        loop {
            let log = fs::read_to_string(&w.log).unwrap_or_default();
            if log.lines().any(|l| l.split(' ').nth(1) == Some("START")) {
                return;
            }
            let exited = w.child.try_wait().unwrap();
            if exited.is_some() || Instant::now() >= end {
                let out = fs::read_to_string(self.dir.join(format!("worker-{}.out", w.id)))
                    .unwrap_or_default();
                panic!(
                    "worker {} did not log START (exited: {exited:?}, waited up to {LIMIT:?}); \
                     its output:\n{out}",
                    w.id
                );
            }
            thread::sleep(Duration::from_millis(5));
        }
    }

    fn signal(&self, slot: usize, signal: libc::c_int) {
        // SAFETY: the child is not reaped while in `running`, so the pid is ours.
        unsafe {
            libc::kill(self.running[slot].child.id() as libc::pid_t, signal);
        }
    }

    /// SIGKILL the worker in `slot`, reap it and start a replacement.
    fn kill_and_replace(&mut self, slot: usize) {
        let mut w = self.running.remove(slot);
        let _ = w.child.kill();
        let _ = w.child.wait();
        self.finished.push((w.id, w.log, None));
        self.spawn();
        self.wait_started();
    }

    /// Waits (polling, up to `limit`) for every worker to exit by itself.
    fn wait_all(&mut self, limit: Duration) -> Result<(), String> {
        let end = Instant::now() + limit;
        while !self.running.is_empty() {
            let mut i = 0;
            while i < self.running.len() {
                if let Some(status) = self.running[i].child.try_wait().unwrap() {
                    let w = self.running.remove(i);
                    self.finished.push((w.id, w.log, Some(status)));
                } else {
                    i += 1;
                }
            }
            if self.running.is_empty() {
                break;
            }
            if Instant::now() >= end {
                let ids: Vec<u32> = self.running.iter().map(|w| w.id).collect();
                return Err(format!(
                    "workers {ids:?} still running {limit:?} after the end"
                ));
            }
            thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for w in &mut self.running {
            // SAFETY: not reaped yet, so the pid is ours.
            unsafe {
                libc::kill(w.child.id() as libc::pid_t, libc::SIGCONT);
            }
            let _ = w.child.kill();
            let _ = w.child.wait();
        }
    }
}

#[derive(Debug, Default, Clone)]
struct FaultCounts {
    worker_pauses: u32,
    worker_pauses_past_lease: u32,
    lock_freezes: u32,
    lock_freezes_past_lease: u32,
    worker_kills: u32,
    quiet_gaps: u32,
}

#[derive(Debug, Clone, Copy)]
enum Fault {
    PauseWorker,
    FreezeLock,
    KillWorker,
    Nothing,
}

/// Injects seeded faults until `until`, one at a time.
fn inject_faults(
    rng: &mut fastrand::Rng,
    workers: &mut Workers,
    lock_servers: &[RedisServer],
    until: Instant,
) -> FaultCounts {
    let mut counts = FaultCounts::default();
    // Every kind at least once, early, in a seeded order; then at random.
    let mut first = vec![Fault::PauseWorker, Fault::FreezeLock, Fault::KillWorker];
    rng.shuffle(&mut first);
    first.reverse();
    loop {
        thread::sleep(Duration::from_millis(rng.u64(80..300)));
        if Instant::now() >= until {
            break;
        }
        let fault = first.pop().unwrap_or_else(|| match rng.u32(..100) {
            0..40 => Fault::PauseWorker,
            40..70 => Fault::FreezeLock,
            70..82 => Fault::KillWorker,
            _ => Fault::Nothing,
        });
        match fault {
            Fault::PauseWorker => {
                let slot = rng.usize(..workers.running.len());
                // Up to 2.5 leases: often long enough to lose the lock.
                let pause = LEASE.mul_f64(rng.f64() * 2.4 + 0.1);
                workers.signal(slot, libc::SIGSTOP);
                thread::sleep(pause);
                workers.signal(slot, libc::SIGCONT);
                counts.worker_pauses += 1;
                if pause > LEASE {
                    counts.worker_pauses_past_lease += 1;
                }
            }
            Fault::FreezeLock => {
                let node = rng.usize(..lock_servers.len());
                let freeze = LEASE.mul_f64(rng.f64() * 1.6 + 0.1);
                lock_servers[node].freeze();
                thread::sleep(freeze);
                lock_servers[node].thaw();
                counts.lock_freezes += 1;
                if freeze > LEASE {
                    counts.lock_freezes_past_lease += 1;
                }
            }
            Fault::KillWorker => {
                let slot = rng.usize(..workers.running.len());
                workers.kill_and_replace(slot);
                counts.worker_kills += 1;
            }
            Fault::Nothing => counts.quiet_gaps += 1,
        }
    }
    counts
}

// ---------------------------------------------------------------------------
// The resource's own record of accepted writes (MONITOR)
// ---------------------------------------------------------------------------

/// Marker command sent to the resource server once every worker is gone.
const MONITOR_END: &str = "history-monitor-end";

/// One write the resource applied, in the order the resource applied them:
/// every `HSET` of a resource key `MONITOR` saw (the one the compare-and-set
/// script runs, or any other).
#[derive(Debug, Clone)]
struct Accepted {
    seq: usize,
    key: String,
    value: String,
    token: u64,
    line: String,
}

/// Starts `MONITOR` on `server` and returns the thread collecting the
/// applied fenced writes until the end marker.
fn monitor(server: &RedisServer) -> thread::JoinHandle<Result<Vec<Accepted>, String>> {
    let mut stream = TcpStream::connect(server.addr()).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    stream.write_all(b"MONITOR\r\n").unwrap();
    let mut reader = BufReader::new(stream);
    let mut ok = String::new();
    reader.read_line(&mut ok).unwrap();
    assert_eq!(ok.trim_end(), "+OK", "MONITOR answered {ok:?}");
    thread::spawn(move || {
        let mut accepted = Vec::new();
        let mut line = String::new();
        loop {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) => return Err("MONITOR connection closed before the end marker".into()),
                Ok(_) => {}
                Err(e) => return Err(format!("MONITOR read failed: {e}")),
            }
            let args = monitor_args(&line);
            let Some(cmd) = args.first() else { continue };
            if cmd.eq_ignore_ascii_case("echo")
                && args.get(1).map(String::as_str) == Some(MONITOR_END)
            {
                return Ok(accepted);
            }
            // Every change of a resource, whoever sends it (the fenced
            // script's HSET, or anything writing around it).
            if !cmd.eq_ignore_ascii_case("hset")
                || !args.get(1).is_some_and(|k| k.starts_with("res:"))
            {
                continue;
            }
            // HSET <key> value <v> fencing_token <t>
            let field = |name: &str| {
                args.iter()
                    .position(|a| a == name)
                    .and_then(|i| args.get(i + 1))
                    .cloned()
            };
            let (Some(key), Some(value), Some(token)) = (
                args.get(1).cloned(),
                field("value"),
                field("fencing_token").and_then(|t| t.parse().ok()),
            ) else {
                return Err(format!("unexpected HSET in MONITOR: {line}"));
            };
            accepted.push(Accepted {
                seq: accepted.len(),
                key: key.trim_start_matches("res:").to_owned(),
                value,
                token,
                line: line.trim_end().to_owned(),
            });
        }
    })
}

/// The quoted arguments of a MONITOR line
/// (`+1700000000.1 [0 lua] "HSET" "k" ...`).
fn monitor_args(line: &str) -> Vec<String> {
    let mut args = Vec::new();
    let Some(start) = line.find("] ") else {
        return args;
    };
    let mut chars = line[start + 2..].chars();
    while let Some(c) = chars.next() {
        if c != '"' {
            continue;
        }
        let mut arg = String::new();
        while let Some(c) = chars.next() {
            match c {
                '"' => break,
                '\\' => {
                    if let Some(next) = chars.next() {
                        arg.push(next);
                    }
                }
                c => arg.push(c),
            }
        }
        args.push(arg);
    }
    args
}

// ---------------------------------------------------------------------------
// The history and its checks
// ---------------------------------------------------------------------------

/// One parsed log line.
#[derive(Debug, Clone)]
struct Event {
    t: u64,
    kind: String,
    fields: BTreeMap<String, String>,
    /// `path:line: text`, for messages.
    origin: String,
}

impl Event {
    fn get(&self, name: &str) -> &str {
        self.fields.get(name).map(String::as_str).unwrap_or("")
    }

    fn num(&self, name: &str) -> u64 {
        self.get(name)
            .parse()
            .unwrap_or_else(|_| panic!("bad {name} in {}", self.origin))
    }
}

fn parse_log(path: &Path) -> Vec<Event> {
    let text = fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .enumerate()
        .filter_map(|(i, line)| {
            let mut parts = line.split(' ');
            let t = parts.next()?.parse().ok()?;
            let kind = parts.next()?.to_owned();
            let fields = parts
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect();
            Some(Event {
                t,
                kind,
                fields,
                origin: format!("{}:{}: {line}", path.display(), i + 1),
            })
        })
        .collect()
}

/// One grant as its holder saw it.
#[derive(Debug, Clone)]
struct GrantView {
    id: String,
    key: String,
    token: u64,
    /// Start of the winning attempt: the grant happened after this.
    attempt: u64,
    /// When the holder had the answer: the grant happened before this.
    granted: u64,
    /// Time of the last look at the guard that said "held".
    last_held: Option<u64>,
    /// The latest end of validity the guard claimed (`valid_for` added to
    /// the time of a look that said "held").
    claim_end: Option<u64>,
    /// When the holder gave the lock back (release or drop started).
    given_back: Option<u64>,
    /// The events that matter for messages.
    grant_line: String,
    last_held_line: Option<String>,
}

impl GrantView {
    /// When this holder relied on the lock: from the moment it knew it had
    /// it to its last look that said held.
    fn reliance(&self) -> Option<(u64, u64)> {
        self.last_held.map(|end| (self.granted, end))
    }

    fn describe(&self) -> String {
        let mut s = format!("    {}\n", self.grant_line);
        if let Some(held) = &self.last_held_line {
            let _ = writeln!(s, "    {held}");
        }
        s
    }
}

#[derive(Debug, Default)]
struct History {
    grants: Vec<GrantView>,
    applied_by_workers: Vec<Event>,
    stale_by_workers: Vec<Event>,
    write_errors: usize,
    lost_observed: usize,
    acquire_failures: BTreeMap<String, usize>,
    worker_problems: Vec<String>,
}

fn build_history(finished: &[(u32, PathBuf, Option<std::process::ExitStatus>)]) -> History {
    let mut h = History::default();
    for (id, path, status) in finished {
        let events = parse_log(path);
        let started = events.iter().any(|e| e.kind == "START");
        let ended = events.iter().any(|e| e.kind == "END");
        match status {
            _ if !started => h.worker_problems.push(format!(
                "worker {id} never logged START (did `--exact {WORKER_TEST}` run?): {}",
                path.display()
            )),
            Some(status) if !status.success() || !ended => h.worker_problems.push(format!(
                "worker {id} exited with {status}, END logged: {ended}: {}",
                path.display()
            )),
            _ => {}
        }
        let mut by_id: HashMap<String, GrantView> = HashMap::new();
        let mut order = Vec::new();
        for e in events {
            match e.kind.as_str() {
                "GRANT" => {
                    let g = GrantView {
                        id: e.get("grant").to_owned(),
                        key: e.get("key").to_owned(),
                        token: e.num("token"),
                        attempt: e.num("attempt"),
                        granted: e.t,
                        last_held: None,
                        claim_end: None,
                        given_back: None,
                        grant_line: e.origin.clone(),
                        last_held_line: None,
                    };
                    order.push(g.id.clone());
                    by_id.insert(g.id.clone(), g);
                }
                "HELD" => {
                    let g = by_id
                        .get_mut(e.get("grant"))
                        .unwrap_or_else(|| panic!("HELD before GRANT: {}", e.origin));
                    g.last_held = Some(e.t);
                    g.last_held_line = Some(e.origin.clone());
                    let claim = e.t + e.num("valid_us") * 1_000;
                    g.claim_end = g.claim_end.max(Some(claim));
                }
                "NOTHELD" if e.get("lost") == "true" => h.lost_observed += 1,
                "RELEASING" | "DROP" => {
                    let g = by_id
                        .get_mut(e.get("grant"))
                        .unwrap_or_else(|| panic!("{} before GRANT: {}", e.kind, e.origin));
                    g.given_back.get_or_insert(e.t);
                }
                "WRITE" => {
                    let result = e.get("result");
                    if result == "applied" {
                        h.applied_by_workers.push(e);
                    } else if result.starts_with("stale:") {
                        h.stale_by_workers.push(e);
                    } else {
                        h.write_errors += 1;
                    }
                }
                "ACQFAIL" => {
                    *h.acquire_failures
                        .entry(e.get("why").to_owned())
                        .or_default() += 1
                }
                _ => {}
            }
        }
        h.grants
            .extend(order.into_iter().filter_map(|id| by_id.remove(&id)));
    }
    h
}

/// Check 1: no two holders relied on one key at the same time.
fn check_exclusion(h: &History, violations: &mut Vec<String>) {
    for key in keys() {
        let mut spans: Vec<(&GrantView, u64, u64)> = h
            .grants
            .iter()
            .filter(|g| g.key == key)
            .filter_map(|g| g.reliance().map(|(a, b)| (g, a, b)))
            .collect();
        spans.sort_by_key(|&(_, start, _)| start);
        let mut widest: Option<(&GrantView, u64)> = None;
        for &(g, start, end) in &spans {
            if let Some((prev, prev_end)) = widest
                && start < prev_end
            {
                violations.push(format!(
                    "exclusion: {key}: {} was granted {:.1} ms before {} last saw itself holding it\n{}{}",
                    g.id,
                    (prev_end - start) as f64 / 1e6,
                    prev.id,
                    prev.describe(),
                    g.describe()
                ));
            }
            if widest.is_none_or(|(_, e)| end > e) {
                widest = Some((g, end));
            }
        }
    }
}

/// Check 1b: nobody got the lock while an earlier holder's guard still
/// promised it (`valid_for`) and that holder had not given it back. Only
/// grants known to come later count: asked for after the earlier holder had
/// its answer.
fn check_claims(h: &History, violations: &mut Vec<String>) {
    for a in &h.grants {
        let Some(claim) = a.claim_end else { continue };
        let until = a.given_back.map_or(claim, |g| g.min(claim));
        for b in &h.grants {
            if b.key == a.key && a.granted < b.attempt && b.granted < until {
                violations.push(format!(
                    "validity: {}: {} was granted {:.1} ms before the end of the validity {}'s guard \
                     had promised (and {} had not given it back)\n{}{}",
                    a.key,
                    b.id,
                    (until - b.granted) as f64 / 1e6,
                    a.id,
                    a.id,
                    a.describe(),
                    b.describe()
                ));
            }
        }
    }
}

/// Check 2: fencing tokens strictly increase in grant order. Two grants are
/// ordered when one's answer arrived before the other's attempt started;
/// tokens of one key are never equal.
fn check_tokens(h: &History, violations: &mut Vec<String>) {
    for key in keys() {
        let grants: Vec<&GrantView> = h.grants.iter().filter(|g| g.key == key).collect();
        let mut seen: HashMap<u64, &GrantView> = HashMap::new();
        for g in &grants {
            if let Some(other) = seen.insert(g.token, g) {
                violations.push(format!(
                    "tokens: {key}: grants {} and {} share token {}\n{}{}",
                    other.id,
                    g.id,
                    g.token,
                    other.describe(),
                    g.describe()
                ));
            }
        }
        for a in &grants {
            for b in &grants {
                if a.granted < b.attempt && a.token >= b.token {
                    violations.push(format!(
                        "tokens: {key}: {} (token {}) was granted before {} was asked for, \
                         yet {} got token {}\n{}{}",
                        a.id,
                        a.token,
                        b.id,
                        b.id,
                        b.token,
                        a.describe(),
                        b.describe()
                    ));
                }
            }
        }
    }
}

/// Check 3: the resource never applied a token lower than one it had
/// applied before (equal only from the same grant); every applied write
/// carries the token of the grant that sent it; the workers' view agrees
/// with the resource's; the final state is the last applied write.
fn check_resource(
    h: &History,
    accepted: &[Accepted],
    finals: &BTreeMap<String, Option<(String, u64)>>,
    violations: &mut Vec<String>,
) {
    let grants: HashMap<&str, &GrantView> = h.grants.iter().map(|g| (g.id.as_str(), g)).collect();
    for key in keys() {
        let mut last: Option<&Accepted> = None;
        for a in accepted.iter().filter(|a| a.key == key) {
            let grant_id = a.value.split('/').next().unwrap_or("");
            match grants.get(grant_id) {
                Some(g) if g.key == key && g.token == a.token => {}
                Some(g) => violations.push(format!(
                    "resource: {key}: applied write #{} ({}) carries token {} but grant {} of {} has token {}\n{}",
                    a.seq,
                    a.value,
                    a.token,
                    g.id,
                    g.key,
                    g.token,
                    g.describe()
                )),
                None => violations.push(format!(
                    "resource: {key}: applied write #{} ({}) with token {} comes from no logged grant\n    {}",
                    a.seq, a.value, a.token, a.line
                )),
            }
            if let Some(prev) = last {
                let same_grant = prev.value.split('/').next() == Some(grant_id);
                if a.token < prev.token || (a.token == prev.token && !same_grant) {
                    violations.push(format!(
                        "resource: {key}: applied token {} ({}) after token {} ({})\n    {}\n    {}",
                        a.token, a.value, prev.token, prev.value, prev.line, a.line
                    ));
                }
            }
            last = Some(a);
        }
        let expected = last.map(|a| (a.value.clone(), a.token));
        let actual = finals.get(&key).cloned().flatten();
        if actual != expected {
            violations.push(format!(
                "resource: {key}: final state {actual:?}, but the last applied write was {expected:?}"
            ));
        }
    }
    let applied: HashSet<&str> = accepted.iter().map(|a| a.value.as_str()).collect();
    for e in &h.applied_by_workers {
        if !applied.contains(e.get("value")) {
            violations.push(format!(
                "resource: a worker was told its write was applied, the resource never applied it\n    {}",
                e.origin
            ));
        }
    }
    for e in &h.stale_by_workers {
        if applied.contains(e.get("value")) {
            violations.push(format!(
                "resource: a worker was told its write was stale, the resource applied it\n    {}",
                e.origin
            ));
        }
    }
}

/// Check 4: the run did something, and the faults happened.
fn check_progress(
    h: &History,
    accepted: &[Accepted],
    faults: &FaultCounts,
    violations: &mut Vec<String>,
) {
    for key in keys() {
        let grants = h.grants.iter().filter(|g| g.key == key).count();
        let writes = accepted.iter().filter(|a| a.key == key).count();
        if grants < MIN_GRANTS_PER_KEY || writes < MIN_APPLIED_WRITES_PER_KEY {
            violations.push(format!(
                "progress: {key}: {grants} grants (need {MIN_GRANTS_PER_KEY}), \
                 {writes} applied writes (need {MIN_APPLIED_WRITES_PER_KEY})"
            ));
        }
    }
    if faults.worker_pauses == 0 || faults.lock_freezes == 0 || faults.worker_kills == 0 {
        violations.push(format!(
            "faults: a kind of fault never happened: {faults:?}"
        ));
    }
    violations.extend(h.worker_problems.iter().cloned());
}

/// Information only: pairs the brief's stricter reading would flag (the
/// next grant's *attempt start* before the previous holder's last "held"),
/// which a request queued at a frozen Redis produces without any real
/// overlap.
fn attempt_overlaps(h: &History) -> Vec<String> {
    let mut found = Vec::new();
    for a in &h.grants {
        for b in &h.grants {
            if let (Some((_, a_end)), true) = (a.reliance(), a.key == b.key && a.id != b.id)
                && b.attempt < a_end
                && b.granted > a.granted
            {
                found.push(format!(
                    "{} asked {:.1} ms before {} last saw itself holding, and was answered {:.1} ms after\n{}{}",
                    b.id,
                    (a_end - b.attempt) as f64 / 1e6,
                    a.id,
                    (b.granted as f64 - a_end as f64) / 1e6,
                    a.describe(),
                    b.describe()
                ));
            }
        }
    }
    found
}

fn keys() -> impl Iterator<Item = String> {
    (0..KEYS).map(|k| format!("k{k}"))
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
        let support::Reply::Array(Some(items)) = reply else {
            panic!("HMGET answered {reply:?}");
        };
        let text = |r: &support::Reply| match r {
            support::Reply::Bulk(Some(b)) => Some(String::from_utf8_lossy(b).into_owned()),
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
