//! Test support: throwaway `redis-server` processes and a tiny blocking RESP client.
//!
//! Used by the integration tests (`mod support;`) and by the benches
//! (`#[path = "../tests/support/mod.rs"] mod support;`). The modules below
//! `server` depend only on std, `libc` and `tempfile`; [`http`] adds axum,
//! [`slow`] raw-TCP slow clients, [`logs`] tracing, and [`stores`] the
//! crate's stores.
//!
//! | module | job |
//! |---|---|
//! | `server` | [`RedisServer`]: start on a free port, restart, freeze, kill on drop |
//! | `process` | children that die with the test process; finding the binaries |
//! | `resp` | [`Reply`] and the blocking one-shot RESP connection |
//! | `info` | what a server reports (`INFO commandstats`, clients, memory, keys) |
//! | `wait` | [`wait_until`] (blocking) and [`eventually`] (tokio clock) |
//! | [`fault`] | [`fault::FaultProxy`]: a TCP proxy whose link a test breaks while traffic flows (latency, bandwidth, blackhole, partition, resets) |
//! | [`topology`] | Sentinel sets, Redis Clusters and independent primaries |
//! | [`stores`] | one fixture per store, for the suites run against every store |
//! | [`postgres`] | [`postgres::PgServer`]: a throwaway PostgreSQL (`initdb` + `postgres`) |
//!
//! Every server runs on its own free port with its own temporary directory and
//! is killed when its [`RedisServer`] is dropped, or when the test process dies
//! (the child is spawned with `PR_SET_PDEATHSIG = SIGKILL`).

#![allow(dead_code)]

pub mod fault;
pub mod http;
pub mod logs;
pub mod postgres;
pub mod slow;
pub mod stores;
pub mod topology;

mod info;
mod process;
mod resp;
mod server;
mod wait;

// The public paths (`support::RedisServer`, `support::eventually`, ...);
// each test crate uses a part of them.
#[allow(unused_imports)]
pub use self::{
    info::parse_command_stats,
    process::{
        harness_name, in_own_process, kill_and_reap, process_state, send_signal,
        spawn_dying_with_test,
    },
    resp::Reply,
    server::{RedisServer, free_port},
    wait::{eventually, eventually_some, wait_until, wait_until_every},
};
