//! A Redis Cluster of N primaries, made and resharded with `redis-cli`.

#[allow(unused_imports)]
use super::*;

/// A Redis Cluster of primaries without replicas, created by `redis-cli --cluster create`.
#[derive(Debug)]
pub struct Cluster {
    pub nodes: Vec<RedisServer>,
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

    /// [`Cluster::start_with`] with `extra` arguments for every node's
    /// `redis-server`.
    pub fn start_with(n_primaries: usize, extra: &[&str]) -> Cluster {
        Cluster::start_with_replicas(n_primaries, 0, extra)
    }

    /// `n_primaries` primaries with `replicas` replicas each (`redis-cli
    /// --cluster-replicas`); [`Cluster::replica_indices`] tells which nodes
    /// are replicas.
    pub fn start_with_replicas(n_primaries: usize, replicas: usize, extra: &[&str]) -> Cluster {
        assert!(
            n_primaries >= 3,
            "a Redis Cluster needs at least 3 primaries, not {n_primaries}"
        );
        let nodes = start_parallel(n_primaries * (1 + replicas), || {
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
        // Nodes with `--requirepass`: redis-cli authenticates too.
        if let Some(pw) = extra
            .windows(2)
            .rev()
            .find(|pair| pair[0] == "--requirepass")
            .map(|pair| pair[1])
        {
            args.splice(
                0..0,
                ["-a".to_string(), pw.to_string(), "--no-auth-warning".into()],
            );
        }
        args.extend(
            cluster
                .nodes
                .iter()
                .map(|node| format!("127.0.0.1:{}", node.port())),
        );
        args.extend([
            "--cluster-replicas".to_string(),
            replicas.to_string(),
            "--cluster-yes".to_string(),
        ]);
        cluster.redis_cli(&args);
        cluster.wait_ok("cluster create");
        cluster
    }

    /// Indices in `nodes` of the replicas (by `ROLE`).
    pub fn replica_indices(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| matches!(role(&self.nodes[i]), Ok(Role::Replica { .. })))
            .collect()
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

    /// The port of the primary that node `node` says owns `slot`, per its
    /// own `CLUSTER SLOTS` (`Err` if it does not answer within 1 s or
    /// names no owner).
    pub fn owner_port_per(&self, node: usize, slot: u16) -> Result<u16, String> {
        let reply = self.nodes[node].try_cmd(&["CLUSTER", "SLOTS"])?;
        parse_cluster_slots(&reply)?
            .into_iter()
            .find(|&(start, end, _)| (start..=end).contains(&slot))
            .map(|(_, _, port)| port)
            .ok_or_else(|| format!("slot {slot} has no owner"))
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
