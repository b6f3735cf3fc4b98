//! Helpers shared by the benches: the runtime, the "real run" switch, and
//! CPU time of this process and of `redis-server`.

#![allow(dead_code)]

use std::time::Duration;

use tokio::runtime::Runtime;

use crate::support::RedisServer;

/// The current-thread runtime every bench loop runs on.
pub fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Whether this is a real `cargo bench` run: `cargo test --benches` runs each
/// bench once as a smoke test (no `--bench`), and `--profile-time` is for
/// profilers. The summary loops are for real runs only.
pub fn full_run() -> bool {
    let args: Vec<String> = std::env::args().collect();
    args.iter().any(|a| a == "--bench") && !args.iter().any(|a| a == "--profile-time")
}

/// CPU time (user + system) of this process so far.
pub fn process_cpu() -> Duration {
    // SAFETY: `getrusage` only writes into the zeroed struct we pass.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1_000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// CPU time (user + system) of `redis-server` so far (`INFO cpu`).
pub fn server_cpu(server: &RedisServer) -> Duration {
    let info = server.cmd(&["INFO", "cpu"]).as_string().unwrap_or_default();
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.trim().strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    Duration::from_secs_f64(field("used_cpu_user") + field("used_cpu_sys"))
}
