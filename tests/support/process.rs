//! Child processes that die with the test process: spawning from a keeper
//! thread with `PR_SET_PDEATHSIG`, signals, reaping, and finding the
//! binaries (`redis-server`, `redis-cli`).

use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::sync::OnceLock;
use std::sync::mpsc;
use std::thread;

/// A binary named by an environment variable, else looked up in PATH.
pub(super) struct Tool {
    /// The environment variable that may name the binary.
    pub(super) var: &'static str,
    /// The binary's name in PATH.
    pub(super) name: &'static str,
    /// The Debian package that provides it.
    pub(super) package: &'static str,
}

/// `redis-server`, overridable by `$REDIS_SERVER_BIN`.
pub(super) const SERVER_TOOL: Tool = Tool {
    var: "REDIS_SERVER_BIN",
    name: "redis-server",
    package: "redis-server",
};

impl Tool {
    /// `$var` if set and non-empty, else `name` (to be looked up in PATH).
    pub(super) fn bin(&self) -> OsString {
        std::env::var_os(self.var)
            .filter(|bin| !bin.is_empty())
            .unwrap_or_else(|| OsString::from(self.name))
    }

    /// Panic message for when spawning `bin` (from [`Tool::bin`]) failed with `e`.
    pub(super) fn cannot_run(&self, bin: &OsString, e: &io::Error) -> String {
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

/// Make the child of `cmd` get SIGKILL when the thread that forks it exits (see
/// [`spawn_from_keeper`] for why that thread must live as long as the process).
pub(super) fn kill_with_parent(cmd: &mut Command) {
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
pub(super) fn spawn_from_keeper(cmd: Command) -> io::Result<Child> {
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

/// Spawn `cmd` so that its process gets SIGKILL when the test process dies
/// (for tests that run programs of their own, e.g. an example server).
pub fn spawn_dying_with_test(mut cmd: Command) -> io::Result<Child> {
    kill_with_parent(&mut cmd);
    spawn_from_keeper(cmd)
}

/// SIGCONT (in case it is frozen), SIGKILL and reap; ignores errors.
pub fn kill_and_reap(child: &mut Child) {
    if let Ok(None) = child.try_wait() {
        // Not reaped yet, so the pid cannot have been reused.
        send_signal(child.id(), libc::SIGCONT);
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// `kill(pid, signal)`, ignoring errors.
pub fn send_signal(pid: u32, signal: libc::c_int) {
    // SAFETY: plain syscall; callers only pass pids of children that are not reaped yet.
    unsafe {
        libc::kill(pid as libc::pid_t, signal);
    }
}

/// The state letter from `/proc/<pid>/stat` (`R`, `S`, `T`, `Z`, ...).
pub fn process_state(pid: u32) -> Option<char> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) S ...": comm may contain spaces and parentheses.
    let (_, after_comm) = stat.rsplit_once(')')?;
    after_comm.trim_start().chars().next()
}

/// The test harness's name for `test`, a test function of the module
/// `module` (pass `module_path!()`): what `--exact` needs to run that one
/// test again in a child process, whether the file is a test binary of its
/// own or a module of one.
pub fn harness_name(module: &str, test: &str) -> String {
    match module.split_once("::") {
        Some((_, path)) => format!("{path}::{test}"),
        None => test.to_owned(),
    }
}

/// Runs the calling test, `test` of the module `module` (pass
/// `module_path!()`), again in a process of its own, and answers `true`
/// inside that process (go on with the test there) and `false` in the
/// parent, once the child passed (the parent's test is then done).
///
/// For tests that count log lines: a scoped `tracing` subscriber misses
/// events while other tests of the binary hit the same callsites on other
/// threads (callsite interest is cached process-wide), and a log line
/// common to many tests cannot be told apart in the global capture.
/// Blocking; call it from a test's first line (inside `block_in_place` in
/// a multi-thread runtime).
pub fn in_own_process(module: &str, test: &str) -> bool {
    const CHILD: &str = "TOWER_REDIS_LOCK_TEST_ALONE";
    if std::env::var(CHILD).as_deref() == Ok(test) {
        return true;
    }
    let name = harness_name(module, test);
    let out = Command::new(std::env::current_exe().expect("the test binary"))
        .args([name.as_str(), "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, test)
        .output()
        .expect("the test binary runs again");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "{name} in a process of its own failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    false
}
