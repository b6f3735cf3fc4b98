//! The controller side: worker processes and the faults injected into them.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::support::RedisServer;
use crate::support::fault::FaultProxy;
use crate::worker::{SentinelSpec, WorkerSpec, mono_ns};
use crate::{LEASE, WORKER_ENV, WORKER_TEST};

/// The worker processes; every one still running is SIGCONTed, SIGKILLed
/// and reaped on drop (also when the test panics).
pub struct Workers {
    pub exe: PathBuf,
    pub dir: PathBuf,
    pub seed: u64,
    pub lock_urls: Vec<String>,
    pub resource_url: String,
    pub deadline_ns: u64,
    /// Permits per key (0: the lock); see `WorkerSpec::permits`.
    pub permits: u32,
    /// Half the grants two keys at once; see `WorkerSpec::multi`.
    pub multi: bool,
    /// Reader-writer locks; see `WorkerSpec::rw`.
    pub rw: bool,
    pub next_id: u32,
    pub running: Vec<Worker>,
    pub finished: Vec<(u32, PathBuf, Option<ExitStatus>)>,
    /// With a nemesis: each worker reaches the lock servers through
    /// proxies of its own (or, on a Cluster, through one proxy per node
    /// that every worker shares).
    pub links: Option<Links>,
    /// The lock servers are the nodes of one Redis Cluster.
    pub cluster: bool,
    /// The lock server is a primary behind Sentinel (see
    /// `WorkerSpec::sentinel`).
    pub sentinel: Option<SentinelSpec>,
    /// When workers were stopped (SIGSTOP): worker id, from, to (ns).
    pub pauses: Vec<(u32, u64, u64)>,
}

/// Each worker's own proxies, one per lock server, on a runtime of the
/// controller's; or one set that every worker shares.
pub struct Links {
    /// Worker id and its proxies, in lock server order. (Declared before
    /// the runtime: dropped first.)
    pub proxies: Vec<(u32, Vec<FaultProxy>)>,
    /// The proxies every worker shares, if shared.
    pub shared: Option<Vec<FaultProxy>>,
    pub targets: Vec<SocketAddr>,
    pub rt: tokio::runtime::Runtime,
}

impl Links {
    pub fn new(targets: Vec<SocketAddr>) -> Links {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        Links {
            proxies: Vec::new(),
            shared: None,
            targets,
            rt,
        }
    }

    /// One proxy per server that every worker goes through: for a Cluster,
    /// whose nodes announce one address each (the proxy's).
    pub fn shared(targets: Vec<SocketAddr>) -> Links {
        let mut links = Links::new(targets);
        let proxies = links
            .targets
            .iter()
            .map(|t| FaultProxy::start_on(links.rt.handle(), *t))
            .collect();
        links.shared = Some(proxies);
        links
    }

    /// Proxies for worker `id`; their URLs.
    fn add(&mut self, id: u32) -> Vec<String> {
        if let Some(shared) = &self.shared {
            return shared.iter().map(FaultProxy::url).collect();
        }
        let proxies: Vec<FaultProxy> = self
            .targets
            .iter()
            .map(|t| FaultProxy::start_on(self.rt.handle(), *t))
            .collect();
        let urls = proxies.iter().map(FaultProxy::url).collect();
        self.proxies.push((id, proxies));
        urls
    }

    /// Bytes every proxy carried, each way (to the servers, back).
    pub fn bytes(&self) -> (u64, u64) {
        self.proxies
            .iter()
            .flat_map(|(_, p)| p)
            .chain(self.shared.iter().flatten())
            .map(FaultProxy::bytes)
            .fold((0, 0), |(u, d), (a, b)| (u + a, d + b))
    }

    pub fn of(&self, id: u32) -> &[FaultProxy] {
        if let Some(shared) = &self.shared {
            return shared;
        }
        &self
            .proxies
            .iter()
            .find(|(w, _)| *w == id)
            .expect("a worker without proxies")
            .1
    }
}

pub struct Worker {
    pub id: u32,
    pub child: Child,
    pub log: PathBuf,
}

impl Workers {
    pub fn spawn(&mut self) {
        let id = self.next_id;
        self.next_id += 1;
        let log = self.dir.join(format!("worker-{id}.log"));
        let lock_urls = match &mut self.links {
            Some(links) => links.add(id),
            None => self.lock_urls.clone(),
        };
        let spec = WorkerSpec {
            id,
            seed: self.seed,
            lock_urls,
            cluster: self.cluster,
            sentinel: self.sentinel.clone(),
            resource_url: self.resource_url.clone(),
            log: log.clone(),
            deadline_ns: self.deadline_ns,
            permits: self.permits,
            multi: self.multi,
            rw: self.rw,
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
    pub fn wait_started(&mut self) {
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
    pub fn wait_all(&mut self, limit: Duration) -> Result<(), String> {
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

/// How many faults of each kind were injected, and how many of them
/// lasted longer than a lease.
#[derive(Debug, Default, Clone)]
pub struct FaultCounts {
    pub by_kind: BTreeMap<&'static str, u32>,
    pub past_lease: BTreeMap<&'static str, u32>,
}

impl FaultCounts {
    fn count(&mut self, fault: Fault, lasted: Option<Duration>) {
        *self.by_kind.entry(fault.name()).or_default() += 1;
        if lasted.is_some_and(|d| d > LEASE) {
            *self.past_lease.entry(fault.name()).or_default() += 1;
        }
    }

    pub fn of(&self, fault: Fault) -> u32 {
        self.by_kind.get(fault.name()).copied().unwrap_or(0)
    }

    pub fn add(&mut self, other: &FaultCounts) {
        for (k, n) in &other.by_kind {
            *self.by_kind.entry(k).or_default() += n;
        }
        for (k, n) in &other.past_lease {
            *self.past_lease.entry(k).or_default() += n;
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// SIGSTOP/SIGCONT of a worker.
    PauseWorker,
    /// SIGSTOP/SIGCONT of a lock server.
    FreezeLock,
    /// SIGKILL of a worker, and a replacement.
    KillWorker,
    /// The nemesis, on one worker's links (one lock server's, or all):
    /// latency each way.
    Latency,
    /// A bandwidth limit.
    Bandwidth,
    /// Connections open, nothing passes; then what was held goes on.
    Blackhole,
    /// Open connections stall, new ones are reset.
    Partition,
    /// The open connections never carry anything again (half-open).
    Sever,
    /// The open connections are reset.
    Reset,
    /// The open connections are reset a few bytes into the next answer.
    ResetMidReply,
    Nothing,
}

impl Fault {
    pub const NETWORK: [Fault; 7] = [
        Fault::Latency,
        Fault::Bandwidth,
        Fault::Blackhole,
        Fault::Partition,
        Fault::Sever,
        Fault::Reset,
        Fault::ResetMidReply,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Fault::PauseWorker => "pause_worker",
            Fault::FreezeLock => "freeze_lock",
            Fault::KillWorker => "kill_worker",
            Fault::Latency => "latency",
            Fault::Bandwidth => "bandwidth",
            Fault::Blackhole => "blackhole",
            Fault::Partition => "partition",
            Fault::Sever => "sever",
            Fault::Reset => "reset",
            Fault::ResetMidReply => "reset_mid_reply",
            Fault::Nothing => "nothing",
        }
    }

    pub fn parse(name: &str) -> Fault {
        [
            Fault::PauseWorker,
            Fault::FreezeLock,
            Fault::KillWorker,
            Fault::Nothing,
        ]
        .into_iter()
        .chain(Fault::NETWORK)
        .find(|f| f.name() == name)
        .unwrap_or_else(|| panic!("no fault kind {name:?}"))
    }
}

/// Which faults a history gets: each of `first` once, early, in a seeded
/// order; then one at random by weight.
#[derive(Debug, Clone)]
pub struct Plan {
    pub first: Vec<Fault>,
    pub weights: Vec<(Fault, u32)>,
}

impl Plan {
    /// Worker pauses and kills, lock server freezes.
    pub fn processes() -> Plan {
        Plan {
            first: vec![Fault::PauseWorker, Fault::FreezeLock, Fault::KillWorker],
            weights: vec![
                (Fault::PauseWorker, 40),
                (Fault::FreezeLock, 30),
                (Fault::KillWorker, 12),
                (Fault::Nothing, 18),
            ],
        }
    }

    /// The network faults `kinds` (every one when empty) on the workers'
    /// links, with worker pauses and kills among them when every kind is
    /// in.
    pub fn nemesis(kinds: &[Fault]) -> Plan {
        if kinds.is_empty() {
            let mut weights: Vec<(Fault, u32)> = Fault::NETWORK.iter().map(|f| (*f, 12)).collect();
            weights.extend([
                (Fault::PauseWorker, 8),
                (Fault::KillWorker, 4),
                (Fault::Nothing, 4),
            ]);
            Plan {
                first: Fault::NETWORK.to_vec(),
                weights,
            }
        } else {
            Plan {
                first: kinds.to_vec(),
                weights: kinds.iter().map(|f| (*f, 10)).collect(),
            }
        }
    }

    fn pick(&self, rng: &mut fastrand::Rng) -> Fault {
        let total: u32 = self.weights.iter().map(|(_, w)| w).sum();
        let mut at = rng.u32(..total);
        for (f, w) in &self.weights {
            if at < *w {
                return *f;
            }
            at -= w;
        }
        unreachable!()
    }
}

/// Injects seeded faults until `until`, one at a time.
pub fn inject_faults(
    rng: &mut fastrand::Rng,
    plan: &Plan,
    workers: &mut Workers,
    lock_servers: &[RedisServer],
    until: Instant,
) -> FaultCounts {
    let mut counts = FaultCounts::default();
    let mut first = plan.first.clone();
    rng.shuffle(&mut first);
    first.reverse();
    loop {
        // The first round (each kind once) is kept short, so that every
        // kind fits in the shortest run: seven network faults at up to 2.5
        // leases each, with gaps up to 300 ms, could outlast a 5 s run (a
        // seed did, and the run failed "a kind of fault never happened").
        let early = !first.is_empty();
        let gap = if early { 80..150 } else { 80..300 };
        thread::sleep(Duration::from_millis(rng.u64(gap)));
        if Instant::now() >= until {
            break;
        }
        let fault = first.pop().unwrap_or_else(|| plan.pick(rng));
        let leases = if early { 1.2 } else { 2.5 };
        let from = mono_ns();
        let (lasted, target) = match fault {
            Fault::PauseWorker => {
                let slot = rng.usize(..workers.running.len());
                // Up to 2.5 leases: often long enough to lose the lock.
                let pause = LEASE.mul_f64(rng.f64() * 2.4 + 0.1);
                let id = workers.running[slot].id;
                let from = mono_ns();
                workers.signal(slot, libc::SIGSTOP);
                thread::sleep(pause);
                workers.signal(slot, libc::SIGCONT);
                workers.pauses.push((id, from, mono_ns()));
                (Some(pause), format!("worker={id}"))
            }
            Fault::FreezeLock => {
                let node = rng.usize(..lock_servers.len());
                let freeze = LEASE.mul_f64(rng.f64() * 1.6 + 0.1);
                lock_servers[node].freeze();
                thread::sleep(freeze);
                lock_servers[node].thaw();
                (Some(freeze), format!("node={node}"))
            }
            Fault::KillWorker => {
                let slot = rng.usize(..workers.running.len());
                let id = workers.running[slot].id;
                workers.kill_and_replace(slot);
                (None, format!("worker={id}"))
            }
            Fault::Nothing => (None, String::new()),
            network => {
                let (lasted, target) = on_links(rng, network, workers, leases);
                (Some(lasted), target)
            }
        };
        counts.count(fault, lasted);
        // For reading a kept history: when each fault began and ended, and
        // what it hit (a kill ends when its replacement has started).
        let line = format!(
            "{from} FAULT {} {target} until={}\n",
            fault.name(),
            mono_ns()
        );
        let _ = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(workers.dir.join("faults.log"))
            .and_then(|mut f| std::io::Write::write_all(&mut f, line.as_bytes()));
    }
    counts
}

/// One network fault on one worker's links (one lock server's, or all of
/// them), lasting up to `leases` leases; healed before the next fault.
/// How long it lasted, and what it hit.
fn on_links(
    rng: &mut fastrand::Rng,
    fault: Fault,
    workers: &Workers,
    leases: f64,
) -> (Duration, String) {
    let links = workers
        .links
        .as_ref()
        .expect("a network fault without proxies");
    let id = workers.running[rng.usize(..workers.running.len())].id;
    let all = links.of(id);
    let (proxies, target): (Vec<&FaultProxy>, String) = if all.len() > 1 && rng.bool() {
        let node = rng.usize(..all.len());
        (vec![&all[node]], format!("worker={id} node={node}"))
    } else {
        (all.iter().collect(), format!("worker={id} nodes=all"))
    };
    let lasting = LEASE.mul_f64(rng.f64() * (leases - 0.1) + 0.1);
    let each = |f: &dyn Fn(&FaultProxy)| proxies.iter().for_each(|p| f(p));
    match fault {
        Fault::Latency => {
            let up = LEASE.mul_f64(rng.f64() / 3.0);
            let down = LEASE.mul_f64(rng.f64() / 3.0);
            each(&|p| p.set_latency(up, down));
        }
        Fault::Bandwidth => {
            let rate = rng.u64(500..20_000);
            each(&|p| p.set_bandwidth(Some(rate)));
        }
        Fault::Blackhole => each(&|p| p.blackhole(lasting)),
        Fault::Partition => each(&|p| p.partition(lasting)),
        Fault::Sever => each(&|p| p.sever()),
        Fault::Reset => each(&|p| p.reset()),
        Fault::ResetMidReply => {
            let n = rng.usize(..48);
            each(&|p| p.reset_mid_reply(n));
        }
        other => unreachable!("{other:?} is not a network fault"),
    }
    let lasted = match fault {
        Fault::Sever | Fault::Reset | Fault::ResetMidReply => Duration::ZERO,
        _ => {
            thread::sleep(lasting);
            each(&|p| p.heal());
            lasting
        }
    };
    (lasted, target)
}
