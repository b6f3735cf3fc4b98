//! Multi-server topologies built from [`RedisServer`]s: a Sentinel set (primary, replica,
//! 3 sentinels), a Redis Cluster of N primaries, and independent primaries (Redlock).
//!
//! Every process is a [`RedisServer`], so it is killed when dropped or when the test
//! process dies. Waits are bounded and panic with the log tails of every process.
//!
//! `sentinel.rs`: the Sentinel set; `cluster.rs`: the Cluster and `redis-cli`;
//! here: what both use (roles, parallel starts, bounded waits, log tails).

use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Seek};
use std::ops::{Deref, DerefMut};
use std::path::Path;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use super::info::info_field;
use super::process::{Tool, kill_and_reap, kill_with_parent, spawn_from_keeper};
use super::server::{Launch, text_tail};
use super::{RedisServer, Reply, free_port, wait_until_every};

/// How long a topology may take to settle (start, failover, reshard).
const TOPOLOGY_TIMEOUT: Duration = Duration::from_secs(20);
/// Poll interval while waiting for a topology to settle.
const TOPOLOGY_POLL: Duration = Duration::from_millis(20);
/// The name the sentinels monitor the primary under.
const MASTER_NAME: &str = "mymaster";
/// Sentinels in a [`SentinelSet`].
const SENTINELS: usize = 3;
/// Sentinel config file inside the sentinel's temporary directory.
const SENTINEL_CONF: &str = "sentinel.conf";
/// Number of hash slots of a Redis Cluster.
const CLUSTER_SLOTS: usize = 16384;
/// `redis-cli`, overridable by `$REDIS_CLI_BIN`.
const CLI_TOOL: Tool = Tool {
    var: "REDIS_CLI_BIN",
    name: "redis-cli",
    package: "redis-tools",
};
/// How long one `redis-cli --cluster ...` run may take.
const CLI_TIMEOUT: Duration = Duration::from_secs(60);
/// Poll interval while waiting for `redis-cli`.
const CLI_POLL: Duration = Duration::from_millis(10);

mod cluster;
mod sentinel;

pub use cluster::Cluster;
#[allow(unused_imports)]
pub use sentinel::{SentinelOptions, SentinelSet};

/// A server's `ROLE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    Master,
    /// Replicating from `master_host:master_port`; `state` is e.g. `"connected"`.
    Replica {
        master_host: String,
        master_port: u16,
        state: String,
    },
    Sentinel,
}

/// `n` independent primaries (for Redlock), started in parallel.
pub fn start_independent(n: usize) -> Vec<RedisServer> {
    start_parallel(n, RedisServer::start)
}

/// `ROLE` of `server` (1 s timeout); `Err` if it does not answer or answers oddly.
pub fn role(server: &RedisServer) -> Result<Role, String> {
    let reply = server.try_cmd(&["ROLE"])?;
    let items = reply
        .as_array()
        .ok_or_else(|| format!("ROLE answered {reply:?}"))?;
    let text = |i: usize| items.get(i).and_then(Reply::as_string);
    match text(0).as_deref() {
        Some("master") => Ok(Role::Master),
        Some("sentinel") => Ok(Role::Sentinel),
        Some("slave") => {
            let (Some(master_host), Some(master_port), Some(state)) =
                (text(1), items.get(2).and_then(Reply::as_int), text(3))
            else {
                return Err(format!("ROLE answered {reply:?}"));
            };
            let master_port = u16::try_from(master_port)
                .map_err(|_| format!("ROLE answered master port {master_port}"))?;
            Ok(Role::Replica {
                master_host,
                master_port,
                state,
            })
        }
        _ => Err(format!("ROLE answered {reply:?}")),
    }
}

/// An array of flat `field, value, ...` arrays (e.g. `SENTINEL SENTINELS`) as maps.
fn field_maps(reply: &Reply) -> Result<Vec<BTreeMap<String, String>>, String> {
    let bad = || format!("expected an array of field/value arrays, got {reply:?}");
    reply
        .as_array()
        .ok_or_else(bad)?
        .iter()
        .map(|entry| {
            let items = entry.as_array().ok_or_else(bad)?;
            items
                .chunks(2)
                .map(|pair| match pair {
                    [field, value] => field.as_string().zip(value.as_string()).ok_or_else(bad),
                    _ => Err(bad()),
                })
                .collect()
        })
        .collect()
}

/// Start `n` things with `start` on `n` threads at once. If any start panics, the others
/// are dropped (killed) and the first panic is resumed.
fn start_parallel<T: Send>(n: usize, start: impl Fn() -> T + Sync) -> Vec<T> {
    thread::scope(|scope| {
        let handles: Vec<_> = (0..n).map(|_| scope.spawn(&start)).collect();
        let mut started = Vec::with_capacity(n);
        let mut first_panic = None;
        for handle in handles {
            match handle.join() {
                Ok(value) => started.push(value),
                Err(panic) => {
                    first_panic.get_or_insert(panic);
                }
            }
        }
        if let Some(panic) = first_panic {
            drop(started);
            std::panic::resume_unwind(panic);
        }
        started
    })
}

/// Poll `check` every 20 ms until it returns `Ok` (whose value is returned), for up to
/// 20 s; then panic naming `what`, the last `Err` and `diagnostics()`.
fn wait_for<T>(
    what: &str,
    mut check: impl FnMut() -> Result<T, String>,
    diagnostics: impl FnOnce() -> String,
) -> T {
    let started = Instant::now();
    let mut last = String::from("not checked");
    let mut value = None;
    wait_until_every(TOPOLOGY_TIMEOUT, TOPOLOGY_POLL, || match check() {
        Ok(v) => {
            value = Some(v);
            true
        }
        Err(e) => {
            last = e;
            false
        }
    });
    value.unwrap_or_else(|| {
        panic!(
            "timed out after {:?} waiting for {what}; last state: {last}\n{}",
            started.elapsed(),
            diagnostics()
        )
    })
}

/// `=== <label> on port <port> ===` and the log tail of each server.
fn tails<'a>(servers: impl IntoIterator<Item = (&'a str, &'a RedisServer)>) -> String {
    servers
        .into_iter()
        .map(|(label, server)| {
            format!(
                "=== {label} on port {} ===\n{}",
                server.port(),
                server.log_tail()
            )
        })
        .collect()
}
