//! A Sentinel set: a primary, a replica and 3 sentinels.

#[allow(unused_imports)]
use super::*;

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

/// What a [`SentinelSet`] is started with besides its defaults.
#[derive(Debug, Clone, Default)]
pub struct SentinelOptions {
    /// Extra args of the primary and the replica (e.g. `--requirepass pw
    /// --masterauth pw`, `--user ...`), after `tls_args`. With `--requirepass`, the helpers
    /// authenticate.
    pub data_args: Vec<String>,
    /// Extra lines of each sentinel's config, after its `sentinel monitor`
    /// line (e.g. `sentinel auth-pass mymaster pw`, `requirepass spw`,
    /// `user ...`). Give `--requirepass` in `sentinel_args` too, so that the
    /// helpers authenticate.
    pub sentinel_conf: String,
    /// Extra args of each sentinel.
    pub sentinel_args: Vec<String>,
    /// Args of every process that make it serve TLS (certificate, key, CA
    /// files): each then also listens for TLS on a port of its own
    /// (`tls_port`), replicates and monitors over TLS, and the sentinels
    /// name the data nodes by their TLS ports. The plain ports stay, for
    /// the helpers only.
    pub tls_args: Vec<String>,
}

/// One `redis-server <tempdir>/sentinel.conf --sentinel` process: a [`RedisServer`]
/// (derefs to it: `port()`, `url()`, `cmd()`, `freeze()`, `stop()`, ... ) started in
/// sentinel mode with its own writable config file.
#[derive(Debug)]
pub struct SentinelProcess {
    server: RedisServer,
    /// Its TLS port, when started with TLS.
    pub tls_port: Option<u16>,
}

/// A primary or replica with `args`, and its TLS port (a free one, given as
/// `--tls-port`) if `tls`.
fn start_data_node(args: &[String], tls: bool) -> (RedisServer, Option<u16>) {
    let mut tls_port = None;
    let server = RedisServer::start_launch(|_, _| {
        let mut extra = args.to_vec();
        if tls {
            let port = free_port();
            tls_port = Some(port);
            extra.extend(["--tls-port".to_string(), port.to_string()]);
        }
        Launch {
            config_file: None,
            extra,
        }
    });
    (server, tls_port)
}

impl SentinelSet {
    /// Start the primary, the replica (`--replicaof`), wait for the replication link, then
    /// start 3 sentinels and wait until each reports the primary as `mymaster` and knows
    /// the 2 other sentinels and the (healthy) replica. Bounded (20 s per stage).
    pub fn start() -> SentinelSet {
        SentinelSet::start_with(&SentinelOptions::default())
    }

    /// [`SentinelSet::start`] with `options`.
    pub fn start_with(options: &SentinelOptions) -> SentinelSet {
        // No diskless-sync delay (5 s by default): replicas sync at once, also after a
        // failover, when the replica is the master.
        let mut data_args = vec!["--repl-diskless-sync-delay".to_string(), "0".into()];
        let tls = !options.tls_args.is_empty();
        if tls {
            data_args.extend(options.tls_args.iter().cloned());
            data_args.extend(["--tls-replication".to_string(), "yes".into()]);
        }
        // After the TLS args, so that the data nodes' own win (e.g.
        // `--tls-auth-clients yes` on the data nodes only).
        data_args.extend(options.data_args.iter().cloned());
        let (primary, primary_tls) = start_data_node(&data_args, tls);
        let monitored = primary_tls.unwrap_or(primary.port());
        let replica_args = [
            &data_args[..],
            &[
                "--replicaof".into(),
                "127.0.0.1".into(),
                monitored.to_string(),
            ],
        ]
        .concat();
        let (replica, _) = start_data_node(&replica_args, tls);
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

        let master_port = monitored;
        set.sentinels = start_parallel(SENTINELS, || {
            SentinelProcess::start(MASTER_NAME, master_port, options)
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

    /// `rediss://127.0.0.1:<tls port>/` of each sentinel (started with
    /// [`SentinelOptions::tls_args`]).
    pub fn sentinel_tls_urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|s| {
                let port = s.tls_port.expect("a sentinel started with TLS");
                format!("rediss://127.0.0.1:{port}/")
            })
            .collect()
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

    /// Freeze the replica and have the primary drop its replication link,
    /// then wait until the primary counts no replica: from now on every
    /// write to the primary is one the replica misses (nothing sits in the
    /// replica's socket buffer to reach it after a thaw). Undo with
    /// `replica.thaw()`: the replica then reconnects to whichever primary
    /// the sentinels name.
    pub fn cut_replica_off(&self) {
        self.replica.freeze();
        self.wait_for("the primary to count no replica", || {
            self.primary
                .try_cmd(&["CLIENT", "KILL", "TYPE", "replica"])?;
            let info = self.primary.try_cmd(&["INFO", "replication"])?;
            let info = info.as_string().unwrap_or_default();
            match info_field(&info, "connected_slaves") {
                Some("0") => Ok(()),
                other => Err(format!("connected_slaves is {other:?}")),
            }
        });
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
    fn start(master_name: &str, master_port: u16, options: &SentinelOptions) -> SentinelProcess {
        let mut tls_port = None;
        let server = RedisServer::start_launch(|port, dir| {
            let config = dir.join(SENTINEL_CONF);
            let mut text = format!(
                "port {port}\n\
                 bind 127.0.0.1\n\
                 sentinel monitor {master_name} 127.0.0.1 {master_port} 2\n\
                 sentinel down-after-milliseconds {master_name} 1000\n\
                 sentinel failover-timeout {master_name} 4000\n\
                 sentinel parallel-syncs {master_name} 1\n\
                 {}\n",
                options.sentinel_conf
            );
            let mut extra = vec!["--sentinel".to_string()];
            extra.extend(options.sentinel_args.iter().cloned());
            if !options.tls_args.is_empty() {
                let tls = free_port();
                tls_port = Some(tls);
                text.push_str(&format!("tls-port {tls}\ntls-replication yes\n"));
                extra.extend(options.tls_args.iter().cloned());
            }
            fs::write(&config, text)
                .unwrap_or_else(|e| panic!("cannot write {}: {e}", config.display()));
            Launch {
                config_file: Some(config),
                extra,
            }
        });
        SentinelProcess { server, tls_port }
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
