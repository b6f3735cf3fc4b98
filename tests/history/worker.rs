//! The worker process: takes locks, writes to the fenced resource, logs.

use std::collections::HashMap;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tower_redis_lock::{
    DataNodes, FenceOutcome, FencedResource, LockGuard, LockKey, LockStore, Locker, RedisStore,
    RedlockStore,
};

use crate::{CALL_GUARD, KEYS, LEASE, MAX_ITERATIONS, NAMESPACE, WAIT, WORKER_ENV};

/// How often the heartbeat ticks, and a gap between ticks logged as a
/// `STALL`.
const HEARTBEAT: Duration = Duration::from_millis(10);
const STALL: Duration = Duration::from_millis(50);

/// `CLOCK_MONOTONIC` in nanoseconds: one clock for every process on the
/// machine (std and tokio `Instant`s read the same clock on Linux).
pub fn mono_ns() -> u64 {
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
/// behind a complete one. Clones append to the same file (the tasks that
/// watch `lost()`).
#[derive(Clone)]
pub struct EventLog {
    pub file: Arc<File>,
}

impl EventLog {
    fn open(path: &Path) -> EventLog {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
        EventLog {
            file: Arc::new(file),
        }
    }

    pub fn event(&self, t: u64, kind: &str, fields: fmt::Arguments<'_>) {
        let line = format!("{t} {kind} {fields}\n");
        (&*self.file)
            .write_all(line.as_bytes())
            .expect("cannot append to the worker log");
    }
}

// ---------------------------------------------------------------------------
// Worker side
// ---------------------------------------------------------------------------

/// What a worker process is told (through `HISTORY_WORKER`).
#[derive(Debug, Clone)]
pub struct WorkerSpec {
    pub id: u32,
    pub seed: u64,
    pub lock_urls: Vec<String>,
    /// The lock servers are one Redis Cluster's nodes.
    pub cluster: bool,
    /// Behind Sentinel: the Sentinels' URLs and the primary's name, and the
    /// address they name the primary by; the store reaches that address at
    /// `lock_urls[0]` (the worker's proxy) instead.
    pub sentinel: Option<SentinelSpec>,
    pub resource_url: String,
    pub log: PathBuf,
    pub deadline_ns: u64,
    /// 0: the workers take each key's lock; n: one of the key's n permits
    /// (and write nothing to the resource, which n holders share).
    pub permits: u32,
    /// Half the grants two keys at once (`multi_worker.rs`).
    pub multi: bool,
    /// The workers take each key's reader-writer lock, a third of the
    /// time to write (and write nothing to the resource).
    pub rw: bool,
}

/// How a worker behind Sentinel finds the primary.
#[derive(Debug, Clone)]
pub struct SentinelSpec {
    pub urls: Vec<String>,
    pub master: String,
    /// The primary's address as the Sentinels name it.
    pub named: std::net::SocketAddr,
}

impl WorkerSpec {
    pub fn encode(&self) -> String {
        let mut text = format!(
            "id={};seed={};locks={};cluster={};resource={};log={};deadline={};permits={};multi={};rw={}",
            self.id,
            self.seed,
            self.lock_urls.join(","),
            u8::from(self.cluster),
            self.resource_url,
            self.log.display(),
            self.deadline_ns,
            self.permits,
            u8::from(self.multi),
            u8::from(self.rw)
        );
        if let Some(s) = &self.sentinel {
            text += &format!(
                ";sentinels={};master={};named={}",
                s.urls.join(","),
                s.master,
                s.named
            );
        }
        text
    }

    pub fn decode(text: &str) -> WorkerSpec {
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
            cluster: field("cluster") == "1",
            sentinel: fields.contains_key("sentinels").then(|| SentinelSpec {
                urls: field("sentinels").split(',').map(str::to_owned).collect(),
                master: field("master").to_owned(),
                named: field("named").parse().unwrap(),
            }),
            resource_url: field("resource").to_owned(),
            log: PathBuf::from(field("log")),
            deadline_ns: field("deadline").parse().unwrap(),
            permits: field("permits").parse().unwrap(),
            multi: field("multi") == "1",
            rw: field("rw") == "1",
        }
    }
}

pub fn lock_node(url: &str) -> RedisStore {
    RedisStore::builder(url)
        .command_timeout(Duration::from_millis(500))
        .build()
        .unwrap()
}

pub async fn worker_main(spec: WorkerSpec) {
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
    // A heartbeat: when this process's runtime did not run for a while (the
    // process not scheduled, or something blocking the thread), nothing of
    // it could react then; logged, so the `lost` check does not blame the
    // lock for a late `LOST` line.
    let beat = log.clone();
    tokio::spawn(async move {
        let mut last = mono_ns();
        loop {
            tokio::time::sleep(HEARTBEAT).await;
            let now = mono_ns();
            if now - last > STALL.as_nanos() as u64 {
                beat.event(now, "STALL", format_args!("from={last}"));
            }
            last = now;
        }
    });
    if let Some(sentinel) = &spec.sentinel {
        let urls: Vec<&str> = sentinel.urls.iter().map(String::as_str).collect();
        let proxy = spec.lock_urls[0]
            .trim_start_matches("redis://")
            .trim_end_matches('/')
            .parse::<std::net::SocketAddr>()
            .unwrap();
        let named = (sentinel.named.ip().to_string(), sentinel.named.port());
        let reach = (proxy.ip().to_string(), proxy.port());
        let store = RedisStore::sentinel_builder(&urls, &sentinel.master)
            .data_nodes(
                DataNodes::new()
                    .with_address_map((named.0.as_str(), named.1), (reach.0.as_str(), reach.1)),
            )
            .command_timeout(Duration::from_millis(500))
            .build()
            .unwrap();
        worker_loop(&spec, &mut log, store).await;
    } else if spec.cluster {
        let urls: Vec<&str> = spec.lock_urls.iter().map(String::as_str).collect();
        let store = RedisStore::cluster_builder(&urls)
            .command_timeout(Duration::from_millis(500))
            .build()
            .unwrap();
        worker_loop(&spec, &mut log, store).await;
    } else if spec.lock_urls.len() == 1 {
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
pub enum Style {
    /// Write, then end at once.
    Short,
    /// Hold for up to 2.5 leases (the watchdog renews), writing midway.
    Long,
    /// Taken with a hold cap of one lease: renewals stop, the lock expires
    /// while we keep the guard; held until the guard says so.
    Expire,
}

pub async fn worker_loop<S: LockStore + Clone>(spec: &WorkerSpec, log: &mut EventLog, store: S) {
    if spec.multi {
        return crate::multi_worker::multi_worker_loop(spec, log, store).await;
    }
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
        // (Drawn only for a reader-writer history: the others' draws stay
        // as they were for a seed.)
        let write = spec.rw && rng.u32(..3) == 0;
        let take = async {
            if spec.rw {
                let rw = locker.rwlock(&key).unwrap();
                return if write {
                    rw.write().await
                } else {
                    rw.read().await
                };
            }
            match spec.permits {
                0 => locker.acquire(&key).await,
                n => locker.semaphore(&key, n)?.acquire().await,
            }
        };
        let res = tokio::time::timeout(CALL_GUARD, take).await;
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
                "key={} grant={} token={} attempt={attempt} style={style:?} shared={}",
                grant.key,
                grant.id,
                guard.fencing_token().unwrap().get(),
                u8::from(spec.rw && !write)
            ),
        );
        // `lost()` watched from the grant to its giving back: the time it
        // resolved is what the `lost` check compares with the deadline.
        let (given_back, give_back) = tokio::sync::oneshot::channel::<()>();
        let watcher = {
            let (guard, log, id) = (guard.clone(), log.clone(), grant.id.clone());
            tokio::spawn(async move {
                tokio::select! {
                    biased;
                    () = guard.lost() => log.event(mono_ns(), "LOST", format_args!("grant={id}")),
                    _ = give_back => {}
                }
            })
        };
        observe(log, &grant, &guard);
        let mut writes = 0u32;
        grant
            .write_if(spec, log, &guard, &mut conn, &mut writes)
            .await;
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
                        grant
                            .write_if(spec, log, &guard, &mut conn, &mut writes)
                            .await;
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
                grant
                    .write_if(spec, log, &guard, &mut conn, &mut writes)
                    .await;
            }
        }
        // The last look before giving the lock back.
        observe(log, &grant, &guard);
        let _ = given_back.send(());
        let _ = watcher.await;
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

pub struct Grant {
    pub id: String,
    pub key: String,
    pub resource: FencedResource,
}

/// Looks at the guard and logs what it said. The timestamp is taken before
/// the call, so a `HELD` line's time is never later than the moment the
/// guard claimed the lock.
pub fn observe(log: &mut EventLog, grant: &Grant, guard: &LockGuard) -> bool {
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
    /// [`write`](Grant::write), for a lock holder only: a permit's holders
    /// share the resource, so their fenced writes refuse each other.
    async fn write_if(
        &self,
        spec: &WorkerSpec,
        log: &mut EventLog,
        guard: &LockGuard,
        conn: &mut redis::aio::MultiplexedConnection,
        writes: &mut u32,
    ) {
        if spec.permits == 0 && !spec.rw {
            self.write(log, guard, conn, writes).await;
        }
    }

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
        let token = guard.fencing_token().unwrap();
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
