//! The controller side: worker processes and the faults injected into them.

use std::fs::{self, File};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::support::RedisServer;
use crate::worker::WorkerSpec;
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
    pub next_id: u32,
    pub running: Vec<Worker>,
    pub finished: Vec<(u32, PathBuf, Option<ExitStatus>)>,
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

#[derive(Debug, Default, Clone)]
pub struct FaultCounts {
    pub worker_pauses: u32,
    pub worker_pauses_past_lease: u32,
    pub lock_freezes: u32,
    pub lock_freezes_past_lease: u32,
    pub worker_kills: u32,
    pub quiet_gaps: u32,
}

#[derive(Debug, Clone, Copy)]
pub enum Fault {
    PauseWorker,
    FreezeLock,
    KillWorker,
    Nothing,
}

/// Injects seeded faults until `until`, one at a time.
pub fn inject_faults(
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
