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

/// Commands run (`INFO commandstats`, every call including those scripts
/// run) and CPU time (`INFO cpu`) so far, summed over `servers`. Each call
/// adds 2 `INFO` calls per server to the next reading.
pub fn server_counts(servers: &[RedisServer]) -> (u64, Duration) {
    let calls = servers
        .iter()
        .map(|s| s.command_stats().values().sum::<u64>())
        .sum();
    let cpu = servers.iter().map(server_cpu).sum();
    (calls, cpu)
}

/// The median of `v`, with its minimum and maximum.
pub fn median(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

/// Pins this thread (the current-thread runtime's) to CPU 0.
pub fn pin_self_to_cpu0() {
    // SAFETY: a zeroed cpu_set_t with one bit set, for this thread only.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(0, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set),
            0,
            "sched_setaffinity"
        );
    }
}

/// Pins every thread of `server` to CPU 1 (`taskset -a -p -c 1`), so
/// that client and server never share a core.
pub fn pin_server_to_cpu1(server: &RedisServer) {
    let pid = server.pid().expect("redis-server pid").to_string();
    let ok = std::process::Command::new("taskset")
        .args(["-a", "-p", "-c", "1", &pid])
        .stdout(std::process::Stdio::null())
        .status()
        .expect("taskset")
        .success();
    assert!(ok, "taskset -a -p -c 1 {pid}");
}
