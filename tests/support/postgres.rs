//! [`PgServer`]: one throwaway PostgreSQL cluster, made by `initdb` in a
//! temporary directory and served by `postgres` on a unix socket in that
//! directory, trust authentication, stopped on drop.
//!
//! The binaries come from `$PG_BIN_DIR`, else from the newest
//! `/usr/lib/postgresql/<version>/bin` (Debian's `postgresql` package), so
//! a PostgreSQL already running on the machine (port 5432) is never used.
//!
//! PostgreSQL refuses to run as root. When the tests run as root (CI does),
//! `initdb` and `postgres` are started as `nobody` (uid and gid switched
//! between fork and exec) in a directory handed to that user. The
//! postmaster gets `PR_SET_PDEATHSIG = SIGKILL` *after* the switch (a
//! credential change clears it), so it dies with the test process; its
//! backends notice the postmaster's death and exit.

use std::ffi::CString;
use std::fs::{self, OpenOptions};
use std::io;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tempfile::TempDir;

use super::process::{kill_and_reap, send_signal, spawn_from_keeper};
use super::server::{free_port, text_tail};
use super::wait::{wait_until, wait_until_every};

/// How long `initdb` plus the first start may take before the test fails.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);
/// Poll interval while waiting for a starting server.
const STARTUP_POLL: Duration = Duration::from_millis(10);
/// How long a fast shutdown (SIGINT) may take before SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// The superuser `initdb` creates (also the database's name).
pub const PG_USER: &str = "postgres";

/// One PostgreSQL cluster in its own temporary directory, listening only
/// on `<dir>/.s.PGSQL.<port>`. Stopped (SIGINT, then SIGKILL) on drop.
#[derive(Debug)]
pub struct PgServer {
    child: Option<Child>,
    port: u16,
    // Declared last: removed after the server has stopped.
    dir: TempDir,
}

/// The user the cluster runs as: `Some((uid, gid))` of `nobody` when the
/// tests run as root, `None` (the current user) otherwise.
fn run_as() -> Option<(libc::uid_t, libc::gid_t)> {
    // SAFETY: plain syscall.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let name = CString::new("nobody").unwrap();
    // SAFETY: getpwnam returns a pointer into static storage or null; it is
    // read at once, before any other passwd call on this thread.
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    assert!(
        !pw.is_null(),
        "running as root, and there is no `nobody` user to run PostgreSQL as"
    );
    // SAFETY: checked non-null above.
    let (uid, gid) = unsafe { ((*pw).pw_uid, (*pw).pw_gid) };
    Some((uid, gid))
}

/// The directory holding `initdb` and `postgres`.
fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PG_BIN_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    let mut found: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            bin.join("postgres").exists().then_some((version, bin))
        })
        .collect();
    found.sort();
    match found.pop() {
        Some((_, bin)) => bin,
        None => panic!(
            "no PostgreSQL server found in /usr/lib/postgresql/*/bin: install it \
             (`apt-get install -y postgresql`) or set PG_BIN_DIR to the directory \
             holding initdb and postgres"
        ),
    }
}

/// `cmd` runs as `user` (if any), and with `kill_with_test` gets SIGKILL
/// when the thread that forks it exits (see `process::spawn_from_keeper`).
fn prepare(cmd: &mut Command, user: Option<(libc::uid_t, libc::gid_t)>, kill_with_test: bool) {
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs between fork and exec and only makes
    // async-signal-safe calls (setgroups, setgid, setuid, prctl, getppid).
    unsafe {
        cmd.pre_exec(move || {
            if let Some((uid, gid)) = user
                && (libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setgid(gid) != 0
                    || libc::setuid(uid) != 0)
            {
                return Err(io::Error::last_os_error());
            }
            // After the switch: changing credentials clears the death signal.
            if kill_with_test {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                    return Err(io::Error::last_os_error());
                }
                if libc::getppid() != parent {
                    return Err(io::Error::from_raw_os_error(libc::ESRCH));
                }
            }
            Ok(())
        });
    }
}

/// Hands `path` to `user` (if any).
fn give(path: &Path, user: Option<(libc::uid_t, libc::gid_t)>) {
    if let Some((uid, gid)) = user {
        std::os::unix::fs::chown(path, Some(uid), Some(gid))
            .unwrap_or_else(|e| panic!("cannot hand {} to uid {uid}: {e}", path.display()));
    }
}

impl PgServer {
    /// `initdb` (trust authentication, superuser `postgres`, no fsync) into
    /// a new temporary directory, then `postgres` on a free port number,
    /// unix socket only, fsync off; waits until the socket accepts.
    pub fn start() -> PgServer {
        let bin = bin_dir();
        let user = run_as();
        let dir = tempfile::Builder::new()
            .prefix("pg-test-")
            .tempdir()
            .unwrap_or_else(|e| panic!("cannot create a temporary directory for PostgreSQL: {e}"));
        give(dir.path(), user);
        let data = dir.path().join("data");
        let log = dir.path().join("initdb.log");
        let mut initdb = Command::new(bin.join("initdb"));
        initdb
            .arg("-D")
            .arg(&data)
            .args(["-U", PG_USER, "-A", "trust", "--no-sync", "-E", "UTF8"])
            .args(["--locale", "C"])
            .stdin(Stdio::null())
            .stdout(log_file(&log, user))
            .stderr(log_file(&log, user));
        prepare(&mut initdb, user, false);
        let status = initdb
            .status()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.join("initdb").display()));
        assert!(status.success(), "initdb failed ({status})\n{}", tail(&log));
        let port = free_port();
        let log = dir.path().join("postgres.log");
        let mut postgres = Command::new(bin.join("postgres"));
        postgres
            .arg("-D")
            .arg(&data)
            .arg("-p")
            .arg(port.to_string())
            .arg("-k")
            .arg(dir.path())
            .args(["-c", "listen_addresses=", "-c", "fsync=off"])
            .args(["-c", "synchronous_commit=off", "-c", "full_page_writes=off"])
            .stdin(Stdio::null())
            .stdout(log_file(&log, user))
            .stderr(log_file(&log, user));
        prepare(&mut postgres, user, true);
        let child = spawn_from_keeper(postgres)
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.join("postgres").display()));
        let mut server = PgServer {
            child: Some(child),
            port,
            dir,
        };
        let socket = server.socket();
        // Ready when the postmaster says so in postmaster.pid (its status
        // line reads `ready` once it accepts connections; before that a
        // client is told "the database system is starting up").
        let pid_file = data.join("postmaster.pid");
        let ready = wait_until_every(STARTUP_TIMEOUT, STARTUP_POLL, || {
            let exited = server
                .child
                .as_mut()
                .is_none_or(|c| !matches!(c.try_wait(), Ok(None)));
            let status = fs::read_to_string(&pid_file).unwrap_or_default();
            exited || (status.lines().nth(7).map(str::trim) == Some("ready") && socket.exists())
        });
        let running = server
            .child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)));
        assert!(
            ready && running,
            "postgres did not start on {} within {STARTUP_TIMEOUT:?}\n{}",
            socket.display(),
            server.log_tail()
        );
        server
    }

    /// The directory holding the socket (the `host` to connect to).
    pub fn socket_dir(&self) -> &Path {
        self.dir.path()
    }

    /// The postmaster's process id, or `None` after [`PgServer::stop`].
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The port number (part of the socket's name).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `<dir>/.s.PGSQL.<port>`.
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join(format!(".s.PGSQL.{}", self.port))
    }

    /// A libpq-style connection string for `tokio_postgres::connect`.
    pub fn conn_string(&self) -> String {
        format!(
            "host={} port={} user={PG_USER} dbname={PG_USER}",
            self.dir.path().display(),
            self.port
        )
    }

    /// The last lines of the server's log.
    pub fn log_tail(&self) -> String {
        tail(&self.dir.path().join("postgres.log"))
    }

    /// Fast shutdown (SIGINT: open transactions are rolled back), SIGKILL
    /// if it takes longer than 10 s. Idempotent.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            send_signal(child.id(), libc::SIGINT);
            let stopped = wait_until(STOP_TIMEOUT, || !matches!(child.try_wait(), Ok(None)));
            if !stopped {
                kill_and_reap(&mut child);
            }
        }
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A log file in the cluster's directory, writable by `user`.
fn log_file(path: &Path, user: Option<(libc::uid_t, libc::gid_t)>) -> Stdio {
    match OpenOptions::new().create(true).append(true).open(path) {
        Ok(file) => {
            give(path, user);
            Stdio::from(file)
        }
        Err(_) => Stdio::null(),
    }
}

fn tail(path: &Path) -> String {
    let text = fs::read(path).map(|b| String::from_utf8_lossy(&b).into_owned());
    match text {
        Ok(text) => text_tail(&path.display().to_string(), &text),
        Err(e) => format!("--- {}: {e} ---\n", path.display()),
    }
}
