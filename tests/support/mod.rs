//! Test support: throwaway `redis-server` processes and a tiny blocking RESP client.
//!
//! Used by the integration tests (`mod support;`) and by the benches
//! (`#[path = "../tests/support/mod.rs"] mod support;`). This file depends only on
//! std, `libc` and `tempfile`; [`http`] adds axum, [`slow`] raw-TCP slow
//! clients, and [`stores`] the crate's stores.
//!
//! Every server runs on its own free port with its own temporary directory and
//! is killed when its [`RedisServer`] is dropped, or when the test process dies
//! (the child is spawned with `PR_SET_PDEATHSIG = SIGKILL`).
//!
//! [`topology`] builds Sentinel sets, Redis Clusters and independent primaries from them;
//! [`stores`] has one fixture per store for the suites run against every store.

#![allow(dead_code)]

pub mod http;
pub mod logs;
pub mod slow;
pub mod stores;
pub mod topology;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs::{self, OpenOptions};
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

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
    launch: Launch,
    password: Option<String>,
    bin: OsString,
    // Declared last: removed after the child has been killed.
    dir: TempDir,
}

/// What a server is started with besides the standard args (see [`spawn_server`]).
#[derive(Debug, Clone, Default)]
struct Launch {
    /// A config file given as the first argument (a sentinel needs one it can rewrite).
    config_file: Option<PathBuf>,
    /// Args appended after the standard ones.
    extra: Vec<String>,
}

impl Launch {
    /// No config file, just `extra` args.
    fn args<S: AsRef<str>>(extra: &[S]) -> Launch {
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
    fn start_launch(mut launch: impl FnMut(u16, &Path) -> Launch) -> RedisServer {
        let bin = SERVER_TOOL.bin();
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

    /// Total calls of one command according to `INFO commandstats` (case-insensitive,
    /// e.g. `"evalsha"`, `"set"`, `"publish"`); 0 if absent. A name without `|` also counts
    /// its subcommands (`"config"` includes `config|resetstat`, ...).
    pub fn command_calls(&self, command: &str) -> u64 {
        let command = command.to_ascii_lowercase();
        self.command_stats()
            .iter()
            .filter(|(name, _)| {
                **name == command
                    || (!command.contains('|')
                        && name
                            .strip_prefix(command.as_str())
                            .is_some_and(|rest| rest.starts_with('|')))
            })
            .map(|(_, calls)| calls)
            .sum()
    }

    /// All of `INFO commandstats` as command name -> calls
    /// (Redis 7 subcommands appear as e.g. `config|resetstat`).
    pub fn command_stats(&self) -> BTreeMap<String, u64> {
        self.command_times()
            .into_iter()
            .map(|(name, (calls, _))| (name, calls))
            .collect()
    }

    /// All of `INFO commandstats` as command name -> (calls, µs spent in
    /// the command inside Redis).
    pub fn command_times(&self) -> BTreeMap<String, (u64, u64)> {
        parse_command_stats(&self.info("commandstats"))
    }

    /// `CONFIG RESETSTAT` (clears commandstats, among others).
    pub fn reset_stats(&self) {
        self.expect_ok(&["CONFIG", "RESETSTAT"]);
    }

    /// All keys (`KEYS *`; test servers are small), sorted.
    pub fn keys(&self) -> Vec<String> {
        let reply = self.cmd(&["KEYS", "*"]);
        let Reply::Array(Some(items)) = &reply else {
            panic!(
                "redis-server on port {}: KEYS * answered {reply:?}",
                self.port
            );
        };
        let mut keys: Vec<String> = items
            .iter()
            .map(|item| match item {
                Reply::Bulk(Some(bytes)) => String::from_utf8_lossy(bytes).into_owned(),
                other => panic!("redis-server on port {}: KEYS * item {other:?}", self.port),
            })
            .collect();
        keys.sort();
        keys
    }

    /// Number of keys (`DBSIZE`).
    pub fn dbsize(&self) -> u64 {
        let reply = self.cmd(&["DBSIZE"]);
        reply
            .as_int()
            .and_then(|n| u64::try_from(n).ok())
            .unwrap_or_else(|| {
                panic!(
                    "redis-server on port {}: DBSIZE answered {reply:?}",
                    self.port
                )
            })
    }

    /// Connected clients (`INFO clients` / `connected_clients`), not counting the
    /// connection used to ask.
    pub fn connected_clients(&self) -> u64 {
        let info = self.info("clients");
        let clients = info_field(&info, "connected_clients")
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or_else(|| {
                panic!(
                    "redis-server on port {}: no connected_clients in INFO clients",
                    self.port
                )
            });
        clients.saturating_sub(1)
    }

    /// `used_memory` of `INFO memory`, in bytes.
    pub fn used_memory(&self) -> u64 {
        let info = self.info("memory");
        info_field(&info, "used_memory")
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no used_memory in INFO memory: {info}"))
    }

    /// `INFO <section>` as text; panics on anything else.
    fn info(&self, section: &str) -> String {
        let reply = self.cmd(&["INFO", section]);
        reply.as_string().unwrap_or_else(|| {
            panic!(
                "redis-server on port {}: INFO {section} answered {reply:?}",
                self.port
            )
        })
    }

    /// Run a command that must answer `+OK`.
    fn expect_ok(&self, args: &[&str]) {
        let reply = self.cmd(args);
        if reply != Reply::Simple("OK".into()) {
            panic!(
                "redis-server on port {}: {args:?} answered {reply:?}",
                self.port
            );
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

/// One RESP reply. RESP3-only types, should a command produce them, are mapped onto
/// these (null -> `Bulk(None)`, boolean -> `Int`, double/big number -> `Simple`,
/// map -> flat `Array`, set/push -> `Array`).
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// `+...`
    Simple(String),
    /// `-...` (the whole message, e.g. `"ERR unknown command ..."`).
    Error(String),
    /// `:...`
    Int(i64),
    /// `$...`; `None` is the nil bulk string.
    Bulk(Option<Vec<u8>>),
    /// `*...`; `None` is the nil array.
    Array(Option<Vec<Reply>>),
}

impl Reply {
    /// The integer of an `Int`, or of a `Simple`/`Bulk` whose text parses as `i64`
    /// (e.g. `GET` of a counter).
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Reply::Int(n) => Some(*n),
            Reply::Simple(s) => s.parse().ok(),
            Reply::Bulk(Some(bytes)) => std::str::from_utf8(bytes).ok()?.parse().ok(),
            _ => None,
        }
    }

    /// The text of a `Simple` or a (valid UTF-8) `Bulk`.
    pub fn as_string(&self) -> Option<String> {
        match self {
            Reply::Simple(s) => Some(s.clone()),
            Reply::Bulk(Some(bytes)) => String::from_utf8(bytes.clone()).ok(),
            _ => None,
        }
    }

    /// The elements of a non-nil `Array`.
    pub fn as_array(&self) -> Option<&[Reply]> {
        match self {
            Reply::Array(Some(items)) => Some(items),
            _ => None,
        }
    }

    /// Nil bulk string or nil array.
    pub fn is_nil(&self) -> bool {
        matches!(self, Reply::Bulk(None) | Reply::Array(None))
    }

    /// An error reply.
    pub fn is_error(&self) -> bool {
        matches!(self, Reply::Error(_))
    }
}

/// A free TCP port on 127.0.0.1 (bind port 0, read it, drop the listener).
pub fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .unwrap_or_else(|e| panic!("cannot find a free port on 127.0.0.1: {e}"))
}

/// Wait until `cond()` is true, polling every 2 ms, up to `timeout`; returns whether it
/// became true. Blocking: for sync contexts.
pub fn wait_until(timeout: Duration, cond: impl FnMut() -> bool) -> bool {
    wait_until_every(timeout, Duration::from_millis(2), cond)
}

/// Like [`wait_until`], polling every `poll` (for conditions that are costly to check,
/// e.g. several commands on several servers).
pub fn wait_until_every(timeout: Duration, poll: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        thread::sleep((deadline - now).min(poll));
    }
}

/// A binary named by an environment variable, else looked up in PATH.
struct Tool {
    /// The environment variable that may name the binary.
    var: &'static str,
    /// The binary's name in PATH.
    name: &'static str,
    /// The Debian package that provides it.
    package: &'static str,
}

/// `redis-server`, overridable by `$REDIS_SERVER_BIN`.
const SERVER_TOOL: Tool = Tool {
    var: "REDIS_SERVER_BIN",
    name: "redis-server",
    package: "redis-server",
};

impl Tool {
    /// `$var` if set and non-empty, else `name` (to be looked up in PATH).
    fn bin(&self) -> OsString {
        std::env::var_os(self.var)
            .filter(|bin| !bin.is_empty())
            .unwrap_or_else(|| OsString::from(self.name))
    }

    /// Panic message for when spawning `bin` (from [`Tool::bin`]) failed with `e`.
    fn cannot_run(&self, bin: &OsString, e: &io::Error) -> String {
        let (name, var) = (self.name, self.var);
        let source = if std::env::var_os(var).is_some_and(|b| !b.is_empty()) {
            format!("from {var}")
        } else {
            format!("from PATH; {var} is not set")
        };
        format!(
            "cannot run {name}: spawning {bin:?} ({source}) failed: {e}. \
             Install it (`apt-get install -y {}`) or set {var} \
             to the path of a {name} binary.",
            self.package
        )
    }
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

/// Make the child of `cmd` get SIGKILL when the thread that forks it exits (see
/// [`spawn_from_keeper`] for why that thread must live as long as the process).
fn kill_with_parent(cmd: &mut Command) {
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs between fork and exec and only makes async-signal-safe
    // calls (prctl, getppid) without allocating.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died before prctl took effect.
            if libc::getppid() != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// Spawn `cmd` from a dedicated thread that lives as long as the process.
///
/// `PR_SET_PDEATHSIG` fires when the *thread* that forked the child exits, not the
/// process. Test harnesses run tests on short-lived threads, and a server may be started
/// on a helper thread and outlive it, so the fork must happen on a thread that only
/// ends with the process.
fn spawn_from_keeper(cmd: Command) -> io::Result<Child> {
    type Job = Box<dyn FnOnce() + Send>;
    static KEEPER: OnceLock<mpsc::Sender<Job>> = OnceLock::new();
    let keeper = KEEPER.get_or_init(|| {
        let (jobs, inbox) = mpsc::channel::<Job>();
        thread::Builder::new()
            .name("redis-server-spawner".into())
            .spawn(move || {
                for job in inbox {
                    job();
                }
            })
            .expect("cannot start the redis-server spawner thread");
        jobs
    });
    let gone = || io::Error::other("the redis-server spawner thread is gone");
    let (result_tx, result_rx) = mpsc::channel();
    let mut cmd = cmd;
    keeper
        .send(Box::new(move || {
            let _ = result_tx.send(cmd.spawn());
        }))
        .map_err(|_| gone())?;
    result_rx.recv().map_err(|_| gone())?
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

/// SIGCONT (in case it is frozen), SIGKILL and reap; ignores errors.
fn kill_and_reap(child: &mut Child) {
    if let Ok(None) = child.try_wait() {
        // Not reaped yet, so the pid cannot have been reused.
        send_signal(child.id(), libc::SIGCONT);
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// `kill(pid, signal)`, ignoring errors.
fn send_signal(pid: u32, signal: libc::c_int) {
    // SAFETY: plain syscall; callers only pass pids of children that are not reaped yet.
    unsafe {
        libc::kill(pid as libc::pid_t, signal);
    }
}

/// The state letter from `/proc/<pid>/stat` (`R`, `S`, `T`, `Z`, ...).
fn process_state(pid: u32) -> Option<char> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) S ...": comm may contain spaces and parentheses.
    let (_, after_comm) = stat.rsplit_once(')')?;
    after_comm.trim_start().chars().next()
}

/// The value of `field` in an INFO text (`field:value` lines).
/// An `INFO commandstats` text as command name -> (calls, µs spent in the
/// command inside Redis); a missing field counts as 0.
pub fn parse_command_stats(info: &str) -> BTreeMap<String, (u64, u64)> {
    info.lines()
        .filter_map(|line| {
            let (name, fields) = line.trim().strip_prefix("cmdstat_")?.split_once(':')?;
            let field = |f: &str| {
                fields
                    .split(',')
                    .find_map(|kv| kv.strip_prefix(f)?.strip_prefix('='))
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            Some((name.to_owned(), (field("calls"), field("usec"))))
        })
        .collect()
}

fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        (name == field).then(|| value.trim())
    })
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
fn text_tail(label: &str, text: &str) -> String {
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

/// A blocking RESP2 connection whose whole exchange must finish before a deadline.
struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
    pos: usize,
    deadline: Instant,
    timeout: Duration,
}

impl Conn {
    /// Connect to `addr` and, with a password, `AUTH`; all within `timeout`.
    fn open(addr: SocketAddr, timeout: Duration, password: Option<&str>) -> Result<Conn, String> {
        let stream = TcpStream::connect_timeout(&addr, timeout)
            .map_err(|e| format!("connect to {addr}: {e}"))?;
        let _ = stream.set_nodelay(true);
        let mut conn = Conn {
            stream,
            buf: Vec::new(),
            pos: 0,
            deadline: Instant::now() + timeout,
            timeout,
        };
        if let Some(password) = password {
            match conn.request(&["AUTH", password]) {
                Ok(Reply::Simple(ok)) if ok == "OK" => {}
                Ok(other) => return Err(format!("AUTH on {addr} answered {other:?}")),
                Err(e) => return Err(format!("AUTH on {addr}: {e}")),
            }
        }
        Ok(conn)
    }

    /// Send one command and read one reply.
    fn request(&mut self, args: &[&str]) -> io::Result<Reply> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for arg in args {
            out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
            out.extend_from_slice(arg.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        let left = self.time_left()?;
        self.stream.set_write_timeout(Some(left))?;
        self.stream
            .write_all(&out)
            .map_err(|e| self.explain_timeout(e))?;
        self.read_reply()
    }

    /// Time until the deadline, or a `TimedOut` error.
    fn time_left(&self) -> io::Result<Duration> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            Err(self.timed_out())
        } else {
            Ok(left)
        }
    }

    fn timed_out(&self) -> io::Error {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!("no complete reply within {:?}", self.timeout),
        )
    }

    /// Socket timeouts surface as `WouldBlock` on Unix; report them as timeouts.
    fn explain_timeout(&self, e: io::Error) -> io::Error {
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => self.timed_out(),
            _ => e,
        }
    }

    /// Read more bytes into the buffer.
    fn fill(&mut self) -> io::Result<()> {
        let left = self.time_left()?;
        self.stream.set_read_timeout(Some(left))?;
        let mut chunk = [0u8; 8192];
        let n = self
            .stream
            .read(&mut chunk)
            .map_err(|e| self.explain_timeout(e))?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed by the server",
            ));
        }
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(())
    }

    /// One `\r\n`-terminated line, without the terminator.
    fn read_line(&mut self) -> io::Result<Vec<u8>> {
        let mut searched = self.pos;
        loop {
            if let Some(i) = self.buf[searched..].windows(2).position(|w| w == b"\r\n") {
                let end = searched + i;
                let line = self.buf[self.pos..end].to_vec();
                self.pos = end + 2;
                return Ok(line);
            }
            searched = self.buf.len().saturating_sub(1).max(self.pos);
            self.fill()?;
        }
    }

    /// Exactly `len` bytes followed by `\r\n`.
    fn read_payload(&mut self, len: usize) -> io::Result<Vec<u8>> {
        while self.buf.len() - self.pos < len + 2 {
            self.fill()?;
        }
        let payload = self.buf[self.pos..self.pos + len].to_vec();
        if &self.buf[self.pos + len..self.pos + len + 2] != b"\r\n" {
            return Err(protocol_error("bulk string not terminated by CRLF"));
        }
        self.pos += len + 2;
        Ok(payload)
    }

    /// `n` replies.
    fn read_replies(&mut self, n: usize) -> io::Result<Vec<Reply>> {
        (0..n).map(|_| self.read_reply()).collect()
    }

    /// One complete reply.
    fn read_reply(&mut self) -> io::Result<Reply> {
        let line = self.read_line()?;
        let Some((&kind, rest)) = line.split_first() else {
            return Err(protocol_error("empty reply line"));
        };
        let text = String::from_utf8_lossy(rest).into_owned();
        let length = |text: &str| -> io::Result<Option<usize>> {
            let n: i64 = text
                .parse()
                .map_err(|_| protocol_error(&format!("bad length {text:?}")))?;
            Ok(usize::try_from(n).ok())
        };
        Ok(match kind {
            b'+' => Reply::Simple(text),
            b'-' => Reply::Error(text),
            b':' => Reply::Int(
                text.parse()
                    .map_err(|_| protocol_error(&format!("bad integer {text:?}")))?,
            ),
            b'$' => match length(&text)? {
                Some(len) => Reply::Bulk(Some(self.read_payload(len)?)),
                None => Reply::Bulk(None),
            },
            b'*' => match length(&text)? {
                Some(n) => Reply::Array(Some(self.read_replies(n)?)),
                None => Reply::Array(None),
            },
            // RESP3 types, mapped onto the RESP2 ones.
            b'_' => Reply::Bulk(None),
            b'#' => Reply::Int(i64::from(text == "t")),
            b',' | b'(' => Reply::Simple(text),
            b'=' => Reply::Bulk(Some(self.read_payload(length(&text)?.unwrap_or(0))?)),
            b'!' => {
                let payload = self.read_payload(length(&text)?.unwrap_or(0))?;
                Reply::Error(String::from_utf8_lossy(&payload).into_owned())
            }
            b'%' => Reply::Array(Some(self.read_replies(length(&text)?.unwrap_or(0) * 2)?)),
            b'~' | b'>' => Reply::Array(Some(self.read_replies(length(&text)?.unwrap_or(0))?)),
            b'|' => {
                // Attributes precede the real reply: skip them.
                self.read_replies(length(&text)?.unwrap_or(0) * 2)?;
                self.read_reply()?
            }
            other => {
                return Err(protocol_error(&format!(
                    "unknown reply type {:?}",
                    char::from(other)
                )));
            }
        })
    }
}

fn protocol_error(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("RESP protocol error: {what}"),
    )
}

/// Polls `cond` every 5 ms on the tokio clock until it holds or `limit`
/// passes; returns whether it held. The async tests' one way of waiting for
/// a condition instead of sleeping.
pub async fn eventually(limit: Duration, mut cond: impl AsyncFnMut() -> bool) -> bool {
    // (Not written over `eventually_some`: wrapping `cond` in another async
    // closure makes the future not `Send` for every lifetime, which the
    // generic, spawned scenarios of tests/layer_stores.rs need.)
    let end = tokio::time::Instant::now() + limit;
    loop {
        if cond().await {
            return true;
        }
        if tokio::time::Instant::now() >= end {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Like [`eventually`], for a condition that yields a value: polls `f`
/// every 5 ms until it answers `Some` or `limit` passes.
pub async fn eventually_some<T>(
    limit: Duration,
    mut f: impl AsyncFnMut() -> Option<T>,
) -> Option<T> {
    let end = tokio::time::Instant::now() + limit;
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        if tokio::time::Instant::now() >= end {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
