//! Multi-server topologies built from [`RedisServer`]s: a Sentinel set (primary, replica,
//! 3 sentinels), a Redis Cluster of N primaries, and independent primaries (Redlock).
//!
//! Every process is a [`RedisServer`], so it is killed when dropped or when the test
//! process dies. Waits are bounded and panic with the log tails of every process.

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

/// A primary, one replica of it and 3 sentinels monitoring it as `mymaster` (quorum 2,
/// down-after 1 s, failover-timeout 4 s).
///
/// `primary` and `replica` name the processes as started: after a failover the
/// `replica` process is the master (see [`SentinelSet::current_master`]).
#[derive(Debug)]
pub struct SentinelSet {
    pub primary: RedisServer,
    pub replica: RedisServer,
    pub sentinels: Vec<SentinelProcess>,
    pub master_name: String,
}

/// One `redis-server <tempdir>/sentinel.conf --sentinel` process: a [`RedisServer`]
/// (derefs to it: `port()`, `url()`, `cmd()`, `freeze()`, `stop()`, ... ) started in
/// sentinel mode with its own writable config file.
#[derive(Debug)]
pub struct SentinelProcess {
    server: RedisServer,
}

/// A Redis Cluster of primaries without replicas, created by `redis-cli --cluster create`.
#[derive(Debug)]
pub struct Cluster {
    pub nodes: Vec<RedisServer>,
}

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

impl SentinelSet {
    /// Start the primary, the replica (`--replicaof`), wait for the replication link, then
    /// start 3 sentinels and wait until each reports the primary as `mymaster` and knows
    /// the 2 other sentinels and the (healthy) replica. Bounded (20 s per stage).
    pub fn start() -> SentinelSet {
        // No diskless-sync delay (5 s by default): replicas sync at once, also after a
        // failover, when the replica is the master.
        let no_delay = ["--repl-diskless-sync-delay", "0"];
        let primary = RedisServer::start_with(&no_delay);
        let primary_port = primary.port().to_string();
        let replica = RedisServer::start_with(
            &[&no_delay[..], &["--replicaof", "127.0.0.1", &primary_port]].concat(),
        );
        let mut set = SentinelSet {
            primary,
            replica,
            sentinels: Vec::new(),
            master_name: MASTER_NAME.to_string(),
        };
        set.wait_for("the replica's link to the primary", || {
            let info = set.replica.try_cmd(&["INFO", "replication"])?;
            let info = info.as_string().unwrap_or_default();
            match info_field(&info, "master_link_status") {
                Some("up") => Ok(()),
                other => Err(format!("master_link_status is {other:?}")),
            }
        });

        let master_port = set.primary.port();
        set.sentinels = start_parallel(SENTINELS, || {
            SentinelProcess::start(MASTER_NAME, master_port)
        });
        set.wait_for(
            "the sentinels to discover each other and the replica",
            || {
                set.sentinels
                    .iter()
                    .try_for_each(|sentinel| set.check_sentinel(sentinel, master_port))
            },
        );
        set
    }

    /// `redis://127.0.0.1:<port>/` of each sentinel.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(|s| s.url()).collect()
    }

    /// The master address according to the first sentinel that answers.
    pub fn master_addr(&self) -> (String, u16) {
        let mut errors = Vec::new();
        for sentinel in &self.sentinels {
            match sentinel.master_addr(&self.master_name) {
                Ok(addr) => return addr,
                Err(e) => errors.push(format!("sentinel on port {}: {e}", sentinel.port())),
            }
        }
        panic!(
            "no sentinel reported the address of {}:\n{}\n{}",
            self.master_name,
            errors.join("\n"),
            self.diagnostics()
        );
    }

    /// The process that is the master according to the sentinels.
    pub fn current_master(&self) -> &RedisServer {
        let (_, port) = self.master_addr();
        self.server_on_port(port).unwrap_or_else(|| {
            panic!(
                "the sentinels report master port {port}, which is neither the primary ({}) \
                 nor the replica ({})",
                self.primary.port(),
                self.replica.port()
            )
        })
    }

    /// The primary or the replica, whichever listens on `port`.
    pub fn server_on_port(&self, port: u16) -> Option<&RedisServer> {
        [&self.primary, &self.replica]
            .into_iter()
            .find(|server| server.port() == port)
    }

    /// `SENTINEL FAILOVER mymaster` on the first sentinel that accepts it (retried while
    /// no replica is eligible yet), then [`SentinelSet::wait_for_master_change`].
    /// Returns the new master's port.
    pub fn failover(&self) -> u16 {
        let (_, old_port) = self.master_addr();
        self.wait_for("a sentinel to accept SENTINEL FAILOVER", || {
            let mut errors = Vec::new();
            for sentinel in &self.sentinels {
                match sentinel.try_cmd(&["SENTINEL", "FAILOVER", &self.master_name]) {
                    Ok(Reply::Simple(ok)) if ok == "OK" => return Ok(()),
                    // Already failing over (e.g. on its own): just wait for the outcome.
                    Ok(Reply::Error(e)) if e.starts_with("INPROG") => return Ok(()),
                    Ok(other) => errors.push(format!("port {}: {other:?}", sentinel.port())),
                    Err(e) => errors.push(format!("port {}: {e}", sentinel.port())),
                }
            }
            Err(errors.join("; "))
        });
        self.wait_for_master_change(old_port)
    }

    /// Wait until every sentinel reports the same master, not on `old_port`, and that
    /// master answers `ROLE` as master. Returns its port.
    pub fn wait_for_master_change(&self, old_port: u16) -> u16 {
        self.wait_for(
            &format!("the sentinels to agree on a master other than port {old_port}"),
            || {
                let mut ports = Vec::new();
                for sentinel in &self.sentinels {
                    let (_, port) = sentinel.master_addr(&self.master_name)?;
                    ports.push(port);
                }
                let port = match ports.as_slice() {
                    [] => return Err("no sentinels".into()),
                    [first, rest @ ..] if rest.iter().all(|p| p == first) => *first,
                    _ => return Err(format!("sentinels disagree: master ports {ports:?}")),
                };
                if port == old_port {
                    return Err(format!("master is still on port {port}"));
                }
                let server = self
                    .server_on_port(port)
                    .ok_or_else(|| format!("master port {port} is not one of this set's"))?;
                match role(server)? {
                    Role::Master => Ok(port),
                    other => Err(format!("new master on port {port} has role {other:?}")),
                }
            },
        )
    }

    /// Log tails of every process of the set.
    pub fn diagnostics(&self) -> String {
        let mut out = tails([("primary", &self.primary), ("replica", &self.replica)]);
        out.push_str(&tails(
            self.sentinels.iter().map(|s| ("sentinel", &s.server)),
        ));
        out
    }

    /// Whether `sentinel` reports the master on `master_port`, 2 other sentinels and one
    /// replica that is neither down nor disconnected.
    fn check_sentinel(&self, sentinel: &SentinelProcess, master_port: u16) -> Result<(), String> {
        let name = &self.master_name;
        let at = |e: String| format!("sentinel on port {}: {e}", sentinel.port());
        let (_, port) = sentinel.master_addr(name).map_err(at)?;
        if port != master_port {
            return Err(at(format!("master on port {port}, not {master_port}")));
        }
        let others = sentinel.known_sentinels(name).map_err(at)?;
        if others.len() != SENTINELS - 1 {
            return Err(at(format!("knows {} other sentinels", others.len())));
        }
        let replicas = sentinel.known_replicas(name).map_err(at)?;
        let healthy = |r: &BTreeMap<String, String>| {
            r.get("flags")
                .is_some_and(|f| !f.contains("down") && !f.contains("disconnected"))
        };
        match replicas.as_slice() {
            [replica] if healthy(replica) => Ok(()),
            _ => Err(at(format!("knows replicas {replicas:?}"))),
        }
    }

    /// [`wait_for`] with this set's diagnostics.
    fn wait_for<T>(&self, what: &str, check: impl FnMut() -> Result<T, String>) -> T {
        wait_for(what, check, || self.diagnostics())
    }
}

impl SentinelProcess {
    /// Start a sentinel monitoring `127.0.0.1:master_port` as `master_name`, with its
    /// config in `<tempdir>/sentinel.conf` (written for each port tried).
    fn start(master_name: &str, master_port: u16) -> SentinelProcess {
        let server = RedisServer::start_launch(|port, dir| {
            let config = dir.join(SENTINEL_CONF);
            let text = format!(
                "port {port}\n\
                 bind 127.0.0.1\n\
                 sentinel monitor {master_name} 127.0.0.1 {master_port} 2\n\
                 sentinel down-after-milliseconds {master_name} 1000\n\
                 sentinel failover-timeout {master_name} 4000\n\
                 sentinel parallel-syncs {master_name} 1\n"
            );
            fs::write(&config, text)
                .unwrap_or_else(|e| panic!("cannot write {}: {e}", config.display()));
            Launch {
                config_file: Some(config),
                extra: vec!["--sentinel".to_string()],
            }
        });
        SentinelProcess { server }
    }

    /// The sentinel's config file (rewritten by the sentinel as it learns the topology).
    pub fn config_path(&self) -> &Path {
        self.server
            .launch
            .config_file
            .as_deref()
            .expect("a sentinel is started with a config file")
    }

    /// `SENTINEL GET-MASTER-ADDR-BY-NAME <name>` (1 s timeout).
    pub fn master_addr(&self, name: &str) -> Result<(String, u16), String> {
        let reply = self.query(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", name])?;
        let addr = match reply.as_array() {
            Some([host, port]) => host.as_string().zip(port.as_int()),
            _ => None,
        };
        addr.and_then(|(host, port)| Some((host, u16::try_from(port).ok()?)))
            .ok_or_else(|| format!("GET-MASTER-ADDR-BY-NAME {name} answered {reply:?}"))
    }

    /// `SENTINEL SENTINELS <name>`: the other sentinels this one knows, as field maps.
    pub fn known_sentinels(&self, name: &str) -> Result<Vec<BTreeMap<String, String>>, String> {
        field_maps(&self.query(&["SENTINEL", "SENTINELS", name])?)
    }

    /// `SENTINEL REPLICAS <name>`: the replicas this sentinel knows, as field maps.
    pub fn known_replicas(&self, name: &str) -> Result<Vec<BTreeMap<String, String>>, String> {
        field_maps(&self.query(&["SENTINEL", "REPLICAS", name])?)
    }

    /// [`RedisServer::try_cmd`], with error replies as `Err`.
    fn query(&self, args: &[&str]) -> Result<Reply, String> {
        match self.server.try_cmd(args)? {
            Reply::Error(e) => Err(format!("{args:?} answered -{e}")),
            reply => Ok(reply),
        }
    }
}

impl Deref for SentinelProcess {
    type Target = RedisServer;

    fn deref(&self) -> &RedisServer {
        &self.server
    }
}

impl DerefMut for SentinelProcess {
    fn deref_mut(&mut self) -> &mut RedisServer {
        &mut self.server
    }
}

impl Cluster {
    /// Start `n_primaries` (at least 3) cluster-enabled servers in parallel, join them with
    /// `redis-cli --cluster create ... --cluster-replicas 0 --cluster-yes` and wait until
    /// every node reports `cluster_state:ok` with all 16384 slots assigned, knows every
    /// node and agrees on the slot map.
    ///
    /// Each node gets an explicit free `--cluster-port` (the default, port + 10000, may
    /// be taken or above 65535).
    pub fn start(n_primaries: usize) -> Cluster {
        Cluster::start_with(n_primaries, &[])
    }

    /// [`Cluster::start`] with `extra` arguments for every node's `redis-server`.
    pub fn start_with(n_primaries: usize, extra: &[&str]) -> Cluster {
        assert!(
            n_primaries >= 3,
            "a Redis Cluster needs at least 3 primaries, not {n_primaries}"
        );
        let nodes = start_parallel(n_primaries, || {
            RedisServer::start_launch(|_, _| {
                let bus_port = free_port().to_string();
                let args = [
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                    "--cluster-port",
                    &bus_port,
                    "--appendonly",
                    "no",
                    "--save",
                    "",
                ];
                Launch::args(&[&args[..], extra].concat())
            })
        });
        let cluster = Cluster { nodes };
        let mut args = vec!["--cluster".to_string(), "create".to_string()];
        args.extend(
            cluster
                .nodes
                .iter()
                .map(|node| format!("127.0.0.1:{}", node.port())),
        );
        args.extend(["--cluster-replicas", "0", "--cluster-yes"].map(String::from));
        cluster.redis_cli(&args);
        cluster.wait_ok("cluster create");
        cluster
    }

    /// `redis://127.0.0.1:<port>/` of each node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// `CLUSTER MYID` of each node.
    pub fn node_ids(&self) -> Vec<String> {
        (0..self.nodes.len()).map(|i| self.node_id(i)).collect()
    }

    /// `CLUSTER KEYSLOT key`, asked of the first node that answers.
    pub fn slot_of(&self, key: &str) -> u16 {
        let reply = self.ask(&["CLUSTER", "KEYSLOT", key]);
        reply
            .as_int()
            .and_then(|slot| u16::try_from(slot).ok())
            .unwrap_or_else(|| panic!("CLUSTER KEYSLOT {key} answered {reply:?}"))
    }

    /// Index in `nodes` of the node that owns `slot`, per `CLUSTER SLOTS`.
    pub fn node_for_slot(&self, slot: u16) -> usize {
        self.slot_ranges()
            .into_iter()
            .find(|&(start, end, _)| (start..=end).contains(&slot))
            .map(|(_, _, node)| node)
            .unwrap_or_else(|| panic!("slot {slot} is not assigned\n{}", self.diagnostics()))
    }

    /// `(first slot, last slot, index in nodes)` of each slot range, in slot order, per
    /// `CLUSTER SLOTS` of the first node that answers.
    pub fn slot_ranges(&self) -> Vec<(u16, u16, usize)> {
        let reply = self.ask(&["CLUSTER", "SLOTS"]);
        let ranges = parse_cluster_slots(&reply).unwrap_or_else(|e| panic!("{e}"));
        ranges
            .into_iter()
            .map(|(start, end, port)| {
                let node = self.index_of_port(port).unwrap_or_else(|| {
                    panic!("slots {start}-{end} are on port {port}, not a node of this cluster")
                });
                (start, end, node)
            })
            .collect()
    }

    /// Number of slots each node owns (indexed like `nodes`).
    pub fn slot_counts(&self) -> Vec<usize> {
        let mut counts = vec![0; self.nodes.len()];
        for (start, end, node) in self.slot_ranges() {
            counts[node] += usize::from(end - start) + 1;
        }
        counts
    }

    /// Move `slots` slots from node `from` to node `to` with `redis-cli --cluster reshard`,
    /// then wait until the cluster is ok and every node agrees on the new slot map.
    pub fn reshard(&self, from: usize, to: usize, slots: u32) {
        assert!(
            from != to && from < self.nodes.len() && to < self.nodes.len(),
            "cannot reshard from node {from} to node {to} in a cluster of {}",
            self.nodes.len()
        );
        // redis-cli refuses to reshard while nodes disagree.
        self.wait_ok("the previous change");
        let args = [
            "--cluster".to_string(),
            "reshard".to_string(),
            format!("127.0.0.1:{}", self.nodes[from].port()),
            "--cluster-from".to_string(),
            self.node_id(from),
            "--cluster-to".to_string(),
            self.node_id(to),
            "--cluster-slots".to_string(),
            slots.to_string(),
            "--cluster-yes".to_string(),
        ];
        self.redis_cli(&args);
        self.wait_ok(&format!(
            "resharding {slots} slots from node {from} to node {to}"
        ));
    }

    /// Sum of [`RedisServer::command_calls`] over the running nodes.
    pub fn command_calls_total(&self, command: &str) -> u64 {
        self.running().map(|node| node.command_calls(command)).sum()
    }

    /// All keys of all running nodes, sorted.
    pub fn keys_total(&self) -> Vec<String> {
        let mut keys: Vec<String> = self.running().flat_map(RedisServer::keys).collect();
        keys.sort();
        keys
    }

    /// Log tails of every node.
    pub fn diagnostics(&self) -> String {
        tails(self.nodes.iter().map(|node| ("cluster node", node)))
    }

    /// Nodes that have not been stopped.
    fn running(&self) -> impl Iterator<Item = &RedisServer> {
        self.nodes.iter().filter(|node| node.pid().is_some())
    }

    fn index_of_port(&self, port: u16) -> Option<usize> {
        self.nodes.iter().position(|node| node.port() == port)
    }

    fn node_id(&self, node: usize) -> String {
        let reply = self.nodes[node].cmd(&["CLUSTER", "MYID"]);
        reply.as_string().unwrap_or_else(|| {
            panic!(
                "CLUSTER MYID on port {} answered {reply:?}",
                self.nodes[node].port()
            )
        })
    }

    /// Run `args` on the first running node that answers (1 s timeout each).
    fn ask(&self, args: &[&str]) -> Reply {
        let mut errors = Vec::new();
        for node in self.running() {
            match node.try_cmd(args) {
                Ok(reply) => return reply,
                Err(e) => errors.push(format!("port {}: {e}", node.port())),
            }
        }
        panic!(
            "no cluster node answered {args:?}: {errors:?}\n{}",
            self.diagnostics()
        );
    }

    /// Wait until every running node reports `cluster_state:ok`, all slots assigned, all
    /// nodes known, no slot migrating or importing, and the same slot map.
    fn wait_ok(&self, after: &str) {
        let n = self.nodes.len();
        wait_for(
            &format!("the cluster to be ok after {after}"),
            || {
                let mut first_map = None;
                for node in self.running() {
                    let at = |e: String| format!("node on port {}: {e}", node.port());
                    let info = node.try_cmd(&["CLUSTER", "INFO"]).map_err(at)?;
                    let info = info.as_string().unwrap_or_default();
                    for (field, want) in [
                        ("cluster_state", "ok".to_string()),
                        ("cluster_slots_assigned", CLUSTER_SLOTS.to_string()),
                        ("cluster_known_nodes", n.to_string()),
                    ] {
                        let got = info_field(&info, field);
                        if got != Some(want.as_str()) {
                            return Err(at(format!("{field} is {got:?}, want {want}")));
                        }
                    }
                    let nodes = node.try_cmd(&["CLUSTER", "NODES"]).map_err(at)?;
                    let nodes = nodes.as_string().unwrap_or_default();
                    if nodes.contains("->-") || nodes.contains("-<-") {
                        return Err(at(format!("slots still migrating:\n{nodes}")));
                    }
                    let map = node
                        .try_cmd(&["CLUSTER", "SLOTS"])
                        .and_then(|reply| parse_cluster_slots(&reply))
                        .map_err(at)?;
                    match &first_map {
                        None => first_map = Some(map),
                        Some(first) if *first == map => {}
                        Some(first) => {
                            return Err(at(format!("slot map {map:?} differs from {first:?}")));
                        }
                    }
                }
                Ok(())
            },
            || self.diagnostics(),
        );
    }

    /// Run `redis-cli args`, panicking with its output and the nodes' logs on failure.
    fn redis_cli(&self, args: &[String]) -> String {
        run_redis_cli(args).unwrap_or_else(|e| panic!("{e}\n{}", self.diagnostics()))
    }
}

/// Run `redis-cli args` (`$REDIS_CLI_BIN` or `redis-cli` from PATH) with a 60 s limit;
/// its stdout and stderr on success, else a message with their tail.
fn run_redis_cli(args: &[String]) -> Result<String, String> {
    let bin = CLI_TOOL.bin();
    let output = tempfile::tempfile()
        .unwrap_or_else(|e| panic!("cannot create a temporary file for redis-cli output: {e}"));
    let clone = || {
        output
            .try_clone()
            .unwrap_or_else(|e| panic!("cannot duplicate a file handle: {e}"))
    };
    let mut cmd = Command::new(&bin);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(clone())
        .stderr(clone());
    kill_with_parent(&mut cmd);
    let mut child =
        spawn_from_keeper(cmd).unwrap_or_else(|e| panic!("{}", CLI_TOOL.cannot_run(&bin, &e)));
    let mut status = None;
    wait_until_every(CLI_TIMEOUT, CLI_POLL, || {
        status = child.try_wait().ok().flatten();
        status.is_some()
    });
    if status.is_none() {
        kill_and_reap(&mut child);
    }
    let mut text = String::new();
    let mut output = output;
    let _ = output.rewind();
    let _ = output.read_to_string(&mut text);
    let command = format!("{} {}", bin.to_string_lossy(), args.join(" "));
    match status {
        Some(status) if status.success() => Ok(text),
        Some(status) => Err(format!(
            "`{command}` failed ({status})\n{}",
            text_tail("redis-cli output", &text)
        )),
        None => Err(format!(
            "`{command}` did not finish within {CLI_TIMEOUT:?}\n{}",
            text_tail("redis-cli output", &text)
        )),
    }
}

/// `CLUSTER SLOTS` as sorted `(first slot, last slot, master port)`.
fn parse_cluster_slots(reply: &Reply) -> Result<Vec<(u16, u16, u16)>, String> {
    let bad = || format!("CLUSTER SLOTS answered {reply:?}");
    let number = |item: Option<&Reply>| -> Result<u16, String> {
        item.and_then(Reply::as_int)
            .and_then(|n| u16::try_from(n).ok())
            .ok_or_else(bad)
    };
    let mut ranges = reply
        .as_array()
        .ok_or_else(bad)?
        .iter()
        .map(|range| {
            let range = range.as_array().ok_or_else(bad)?;
            let master = range.get(2).and_then(Reply::as_array).ok_or_else(bad)?;
            Ok((
                number(range.first())?,
                number(range.get(1))?,
                number(master.get(1))?,
            ))
        })
        .collect::<Result<Vec<_>, String>>()?;
    ranges.sort_unstable();
    Ok(ranges)
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
