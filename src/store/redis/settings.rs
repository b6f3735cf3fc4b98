//! Making a store: [`RedisStoreBuilder`], started from a URL, a pool, a
//! Sentinel set or Cluster nodes; every setting is checked in
//! [`build`](RedisStoreBuilder::build).

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use super::notifier::PubSubSource;
use super::replicas::WaitReplicas;
use super::source::Source;
use super::{EvictionCheck, Inner, MAX_PX, RedisStore, ReplicaShortfall, ms};
use crate::error::ConfigError;
use crate::key::validate_name;

const DEFAULT_PREFIX: &str = "trl";
const DEFAULT_FENCE_RETENTION: Duration = Duration::from_secs(3600);
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);
/// How often a cluster store reads the slot map afresh.
const DEFAULT_TOPOLOGY_REFRESH: Duration = Duration::from_secs(30);
/// A bound on a call is no bound past this (and the sums of timeouts stay
/// far from overflowing).
const MAX_COMMAND_TIMEOUT: Duration = Duration::from_secs(3600);

/// Builds a [`RedisStore`]. Start from
/// [`RedisStore::builder`] (a URL), `RedisStore::pool_builder` (feature `deadpool`),
/// `RedisStore::sentinel_builder` or `RedisStore::cluster_builder`; the
/// setters take values as they are, and [`build`](RedisStoreBuilder::build)
/// checks them all and answers the first [`ConfigError`]. The built store is
/// configured for good: clones share its connections and settings.
///
/// ```
/// use std::time::Duration;
/// use tower_redis_lock::{EvictionCheck, RedisStore};
///
/// # fn main() -> Result<(), tower_redis_lock::ConfigError> {
/// let store = RedisStore::builder("redis://127.0.0.1:6379/")
///     .prefix("billing")
///     .command_timeout(Duration::from_millis(500))
///     .eviction_check(EvictionCheck::Log) // an evicting server: log, not refuse
///     .build()?;
/// # let _ = store;
/// # Ok(())
/// # }
/// ```
#[must_use = "a builder does nothing until `build` is called"]
pub struct RedisStoreBuilder {
    source: Result<Pending, ConfigError>,
    notifications: Option<redis::Client>,
    #[cfg(feature = "sentinel")]
    data_nodes: Option<super::DataNodes>,
    /// Checked, with `wait_replicas`, in `build`.
    settings: Settings,
    wait_replicas: Option<(u32, Duration, ReplicaShortfall)>,
    wait_aof: Option<(bool, u32, Duration, ReplicaShortfall)>,
    /// The URL of a store made by `builder(url)`: its client is made
    /// again in `build` when certificates are given.
    url: Option<String>,
    #[cfg(feature = "tls-rustls")]
    root_certificates: Option<Vec<u8>>,
    #[cfg(feature = "tls-rustls")]
    client_certificate: Option<super::tls::ClientCertificate>,
}

/// Where the store's connections will come from: made already, or (for
/// Sentinel) made in `build`, with the data nodes' settings.
pub(super) enum Pending {
    Ready(Source, Option<PubSubSource>),
    #[cfg(feature = "sentinel")]
    Sentinel {
        urls: Vec<String>,
        master: String,
    },
    /// A cluster's clients are made in `build`, with per-node timeouts
    /// from the command timeout.
    #[cfg(feature = "cluster")]
    Cluster(Vec<String>),
}

impl std::fmt::Debug for RedisStoreBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("RedisStoreBuilder");
        d.field("settings", &self.settings)
            .field("wait_replicas", &self.wait_replicas)
            .field("wait_aof", &self.wait_aof);
        #[cfg(feature = "sentinel")]
        d.field("data_nodes", &self.data_nodes);
        d.finish_non_exhaustive()
    }
}

impl RedisStore {
    /// A builder for a store on the `redis://` (or `rediss://`, `unix://`)
    /// URL, with release notifications over a pub/sub connection to the
    /// same server. The store opens one multiplexed connection (no pool)
    /// and keeps it; a broken one is replaced. A URL that does not parse is
    /// reported by `build`.
    pub fn builder(url: &str) -> RedisStoreBuilder {
        let config_err = |e: &dyn std::fmt::Display| ConfigError::new("url", format!("{e}"));
        let source = super::tls::check_url("url", url)
            .and_then(|()| redis::Client::open(url).map_err(|e| config_err(&e)))
            .map(|client| {
                (
                    Source::Url(Box::new(client.clone())),
                    Some(PubSubSource::Client(Box::new(client))),
                )
            });
        let mut builder = RedisStoreBuilder::over(source);
        builder.url = Some(url.to_owned());
        builder
    }

    /// A builder for a store over an existing pool (feature `deadpool`):
    /// the store takes one connection out of it and keeps it, and another
    /// when that one breaks. Waiters poll unless you add
    /// [`notifications`](RedisStoreBuilder::notifications).
    #[cfg(feature = "deadpool")]
    #[cfg_attr(docsrs, doc(cfg(feature = "deadpool")))]
    pub fn pool_builder(pool: deadpool_redis::Pool) -> RedisStoreBuilder {
        RedisStoreBuilder::over(Ok((Source::Pool(pool), None)))
    }

    /// A store with the defaults on a `redis://` (or `rediss://`,
    /// `unix://`) URL, with release notifications: `builder(url).build()`.
    /// Connects lazily: this does no I/O.
    pub fn from_url(url: &str) -> Result<Self, ConfigError> {
        Self::builder(url).build()
    }

    /// A store with the defaults over an existing pool (feature
    /// `deadpool`), without release notifications (waiters poll).
    #[cfg(feature = "deadpool")]
    #[cfg_attr(docsrs, doc(cfg(feature = "deadpool")))]
    pub fn new(pool: deadpool_redis::Pool) -> Self {
        Self::from_parts(Source::Pool(pool), None, Settings::default())
    }

    fn from_parts(source: Source, pubsub: Option<PubSubSource>, s: Settings) -> Self {
        RedisStore {
            inner: Arc::new(Inner {
                source,
                conn: Mutex::new(None),
                conn_opened: Mutex::new(None),
                server: Mutex::new(None),
                connecting: tokio::sync::Mutex::new(()),
                prefix: s.prefix,
                fence_retention_ms: ms(s.fence_retention),
                fencing: s.fencing,
                timeout: s.command_timeout,
                pubsub,
                wait_replicas: s.wait_replicas,
                wait_conns: super::replicas::WaitConns::new(),
                notifier: OnceLock::new(),
                eviction_check: s.eviction_check,
                eviction_reported: Mutex::default(),
                topology_refresh: s.topology_refresh.unwrap_or(DEFAULT_TOPOLOGY_REFRESH),
                refreshing: std::sync::atomic::AtomicBool::new(false),
                rereading: std::sync::atomic::AtomicBool::new(false),
            }),
        }
    }
}

#[cfg(feature = "sentinel")]
impl RedisStore {
    /// A builder for a store on the primary that a set of Sentinels names
    /// for `master_name`, with release notifications. Connections are
    /// resolved through the Sentinels and re-resolved when one breaks, so
    /// new grants follow a failover; a holder whose renewals then find no
    /// key (the grant was not replicated) is told its lock is lost.
    ///
    /// The Sentinel URLs carry the Sentinels' credentials (the same for
    /// all) and TLS mode (`rediss://`). The primary and replicas are
    /// reached with the same credentials and TLS mode unless
    /// [`data_nodes`](RedisStoreBuilder::data_nodes) says otherwise.
    ///
    /// A failover is also followed as soon as a Sentinel announces it
    /// (`+switch-master`). Consider
    /// [`wait_replicas`](RedisStoreBuilder::wait_replicas) (or
    /// [`wait_aof`](RedisStoreBuilder::wait_aof)) so that a grant a
    /// failover could lose is refused rather than acknowledged.
    #[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
    pub fn sentinel_builder(sentinel_urls: &[&str], master_name: &str) -> RedisStoreBuilder {
        RedisStoreBuilder::pending(Ok(Pending::Sentinel {
            urls: sentinel_urls.iter().map(|u| u.to_string()).collect(),
            master: master_name.to_owned(),
        }))
    }

    /// A store with the defaults on the primary that the Sentinels name:
    /// `sentinel_builder(..).build()`.
    #[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
    pub fn sentinel(sentinel_urls: &[&str], master_name: &str) -> Result<Self, ConfigError> {
        Self::sentinel_builder(sentinel_urls, master_name).build()
    }
}

#[cfg(feature = "cluster")]
impl RedisStore {
    /// A builder for a store on a Redis Cluster, given some of its nodes. Every lock's
    /// keys share one hash tag, so each script touches one slot; MOVED and
    /// ASK are followed by the cluster client; renewals go out concurrently
    /// on the cluster connection, which pipelines them per node.
    ///
    /// Release notifications use sharded pub/sub (Redis 7): a release
    /// `SPUBLISH`es on the lock's channel, which shares its slot, and
    /// waiters `SSUBSCRIBE` over one RESP3 cluster connection per store, on
    /// the node that owns the slot. When a slot moves, a node connection
    /// breaks or the server drops a subscription, the waiters concerned are
    /// woken to try again and the subscription is renewed where the slot now
    /// lives. A cluster that rejects `SSUBSCRIBE` (before Redis 7) still
    /// releases; its waiters poll, and a warning says so once.
    ///
    /// Every node connection has a response timeout of a quarter of the
    /// command timeout: a frozen node costs the calls on its own slots, and
    /// a slot-map refresh (after a MOVED reply, say) that asks it ends
    /// within that bound instead of holding every slot behind it.
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    pub fn cluster_builder(node_urls: &[&str]) -> RedisStoreBuilder {
        let urls = node_urls.iter().map(|u| u.to_string()).collect();
        RedisStoreBuilder::pending(Ok(Pending::Cluster(urls)))
    }

    /// A store with the defaults on a Redis Cluster:
    /// `cluster_builder(..).build()`.
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    pub fn cluster(node_urls: &[&str]) -> Result<Self, ConfigError> {
        Self::cluster_builder(node_urls).build()
    }
}

/// The settings of a store (checked by `RedisStoreBuilder::build`).
#[derive(Debug)]
struct Settings {
    prefix: String,
    fence_retention: Duration,
    fencing: bool,
    command_timeout: Duration,
    wait_replicas: Option<WaitReplicas>,
    eviction_check: EvictionCheck,
    /// Set by `topology_refresh` (cluster stores only).
    topology_refresh: Option<Duration>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            prefix: DEFAULT_PREFIX.to_owned(),
            fence_retention: DEFAULT_FENCE_RETENTION,
            fencing: true,
            command_timeout: DEFAULT_TIMEOUT,
            wait_replicas: None,
            eviction_check: EvictionCheck::default(),
            topology_refresh: None,
        }
    }
}

impl RedisStoreBuilder {
    pub(super) fn over(source: Result<(Source, Option<PubSubSource>), ConfigError>) -> Self {
        Self::pending(source.map(|(source, pubsub)| Pending::Ready(source, pubsub)))
    }

    pub(super) fn pending(source: Result<Pending, ConfigError>) -> Self {
        RedisStoreBuilder {
            source,
            notifications: None,
            #[cfg(feature = "sentinel")]
            data_nodes: None,
            settings: Settings::default(),
            wait_replicas: None,
            wait_aof: None,
            url: None,
            #[cfg(feature = "tls-rustls")]
            root_certificates: None,
            #[cfg(feature = "tls-rustls")]
            client_certificate: None,
        }
    }

    /// Uses `client` for one shared pub/sub connection that wakes waiters as
    /// soon as a lock is released (a store from a URL or Sentinels has one
    /// already). A cluster store is notified by sharded pub/sub from the
    /// nodes that own the locks: `build` refuses this setting there.
    pub fn notifications(mut self, client: redis::Client) -> Self {
        self.notifications = Some(client);
        self
    }

    /// How a store behind Sentinel connects to the primary and replicas
    /// (see [`DataNodes`](super::DataNodes); default: as the first Sentinel
    /// URL). `build` refuses this setting on other stores, whose URLs say
    /// it all.
    #[cfg(feature = "sentinel")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
    pub fn data_nodes(mut self, nodes: super::DataNodes) -> Self {
        self.data_nodes = Some(nodes);
        self
    }

    /// Prefix of every key and channel (default `trl`): 1 to 64 bytes of
    /// `A-Z a-z 0-9 _ - . / :`.
    pub fn prefix(mut self, prefix: &str) -> Self {
        prefix.clone_into(&mut self.settings.prefix);
        self
    }

    /// How long a bucket's fencing counter outlives the last grant of its
    /// bucket (default 1 h, at least 1 s, at most 100 years). Tokens stay
    /// strictly increasing after it lapses because they never fall below
    /// Redis `TIME` in µs; the counter only guards against the server clock
    /// stepping back within the retention.
    pub fn fence_retention(mut self, retention: Duration) -> Self {
        self.settings.fence_retention = retention;
        self
    }

    /// Whether grants mint fencing tokens (default `true`).
    ///
    /// `fencing(false)` is for efficiency locks, which only keep work from
    /// being done twice at once and guard no resource that could check a
    /// token: the grant is a plain `SET NX PX` (a script only when the lock
    /// is taken, to learn the holder's lease and mark the lock as
    /// waited-for), and a guard's
    /// [`fencing_token`](crate::LockGuard::fencing_token) answers
    /// [`Unfenced`](crate::Unfenced); the layer sends no `Fencing-Token`
    /// header. Renewal, loss, waiting, cancellation safety and idempotency
    /// are the same. See README, "Fencing, or not".
    pub fn fencing(mut self, on: bool) -> Self {
        self.settings.fencing = on;
        self
    }

    /// Upper bound on each call to Redis, connection included (default 2 s,
    /// at least 1 ms, at most 1 h).
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.settings.command_timeout = timeout;
        self
    }

    /// After each grant, `WAIT` until `replicas` replicas have the write or
    /// `timeout` passes; on a shortfall, [`ReplicaShortfall::Fail`] releases
    /// and fails the acquire. Shrinks (does not close) the window in which a
    /// failover to a replica that missed the grant lets a second holder in.
    /// Every grant waits: a lock's, and a semaphore's permit (a permit not
    /// confirmed is removed, owner-checked, and the acquire fails, so a
    /// failover does not let more than the semaphore's `n` in).
    /// `WAIT` runs on a connection of its own (kept for reuse), so the
    /// other commands of the store, renewals included, never queue behind
    /// it. On a cluster store, the grant and its `WAIT` go over a cluster
    /// connection of their own, and the `WAIT` to the primary of the
    /// lock's slot: `replicas` counts that primary's replicas (while the
    /// slot migrates, a grant made on the node importing it cannot be
    /// confirmed there, and is refused and taken back). At most 16 grants
    /// wait at once per store; more queue for a connection within the
    /// command timeout (one that gets none is refused,
    /// [`Error::Unavailable`](crate::Error::Unavailable), before anything
    /// is granted), then each has the command timeout plus `timeout` for
    /// its grant and wait; a wait cut by that bound is taken back too. An
    /// acquire dropped during its wait leaves the grant to the
    /// [`Locker`](crate::Locker)'s background release (owner-checked); a
    /// direct [`LockStore`](crate::LockStore) caller must release it
    /// itself. A grant to an owner that already held the lock or permit
    /// (a direct caller's second acquire under one owner token; the
    /// `Locker` draws a new token for every attempt) waits too, and one not
    /// confirmed is taken back with the earlier hold. At least one
    /// replica; the timeout above 0 and below the command timeout.
    pub fn wait_replicas(
        mut self,
        replicas: u32,
        timeout: Duration,
        on_shortfall: ReplicaShortfall,
    ) -> Self {
        self.wait_replicas = Some((replicas, timeout, on_shortfall));
        self
    }

    /// After each grant (a lock's or a permit's), `WAITAOF` until the
    /// grant is in the primary's own append-only file (`local`) and in that
    /// of `replicas` replicas, or `timeout` passes; on a shortfall, as
    /// [`wait_replicas`](Self::wait_replicas). Where `wait_replicas` only
    /// knows that replicas received the grant, this knows that it is on
    /// disk: a grant also survives a restart of the primary (`local`) or
    /// of the replica that takes over. With `appendfsync everysec` a file
    /// is synced up to a second after the grant: give the timeout room, or
    /// use `appendfsync always`.
    ///
    /// Needs `WAITAOF` (Redis 7.2+, Valkey 7.2+) and, for `local`,
    /// `appendonly yes` on the primary: a server without either makes the
    /// first grant fail with [`Error::Config`](crate::Error::Config) (the
    /// grant taken back), never a silent skip. A replica counts only
    /// with `appendonly yes` on it too; with it off, no grant is ever
    /// confirmed by it: each is refused after the whole `timeout` as
    /// [`Error::Unavailable`](crate::Error::Unavailable) ("the AOF of 0
    /// of 1 replicas"), a setting the store cannot tell from a lagging
    /// replica. `local` or at least one
    /// replica; the timeout above 0 and below the command timeout; not
    /// with `wait_replicas`. On a cluster store, as `wait_replicas`.
    pub fn wait_aof(
        mut self,
        local: bool,
        replicas: u32,
        timeout: Duration,
        on_shortfall: ReplicaShortfall,
    ) -> Self {
        self.wait_aof = Some((local, replicas, timeout, on_shortfall));
        self
    }

    /// What to do on a server whose `maxmemory-policy` can evict locks (see
    /// [`EvictionCheck`]): by default ([`EvictionCheck::Refuse`]) the store
    /// refuses it with [`Error::Config`](crate::Error::Config);
    /// `.eviction_check(EvictionCheck::Log)` logs an error and uses it.
    pub fn eviction_check(mut self, check: EvictionCheck) -> Self {
        self.settings.eviction_check = check;
        self
    }

    /// How often a cluster store reads the slot map afresh, in the
    /// background (default 30 s; at least the command timeout). A primary
    /// that freezes answers neither an error nor a redirect, so without
    /// this a store that makes no call to its slots (or none that times
    /// out) would keep the frozen primary after its replica took over.
    /// The new map is read over new connections, within the command
    /// timeout, while calls go on over the current ones; a frozen node
    /// costs the refresh its own answer only. `build` refuses this setting
    /// on other stores.
    #[cfg(feature = "cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    pub fn topology_refresh(mut self, every: Duration) -> Self {
        self.settings.topology_refresh = Some(every);
        self
    }

    /// Trusts the CA certificates in `pem` (one or more, PEM) besides the
    /// platform's roots, on a `rediss://` URL store's connections (its
    /// commands and its notifications): a server whose certificate a
    /// private CA signed. Feature `tls-rustls`. Only for
    /// [`RedisStore::builder`]: behind Sentinel it is
    /// [`DataNodes::with_root_certificates`](crate::DataNodes::with_root_certificates);
    /// a pool brings its own client. (The other route, for every client of
    /// the process: `SSL_CERT_FILE`, see README.)
    ///
    /// ```no_run
    /// use tower_redis_lock::RedisStore;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = RedisStore::builder("rediss://redis.internal:6380/")
    ///     .root_certificates(std::fs::read("/etc/redis/ca.crt")?)
    ///     .build()?;
    /// # let _ = store;
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "tls-rustls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls-rustls")))]
    pub fn root_certificates(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.root_certificates = Some(pem.into());
        self
    }

    /// Presents `certificate` (PEM, with its chain if any) and proves it
    /// with `key` (its PEM private key) on a `rediss://` URL store's
    /// connections, for a server that asks every client for one
    /// (`tls-auth-clients yes`). Feature `tls-rustls`; only for
    /// [`RedisStore::builder`] (behind Sentinel:
    /// [`DataNodes::with_client_certificate`](crate::DataNodes::with_client_certificate)).
    #[cfg(feature = "tls-rustls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls-rustls")))]
    pub fn client_certificate(
        mut self,
        certificate: impl Into<Vec<u8>>,
        key: impl Into<Vec<u8>>,
    ) -> Self {
        self.client_certificate = Some(super::tls::ClientCertificate {
            certificate: certificate.into(),
            key: key.into(),
        });
        self
    }

    /// A URL store's sources made again with the certificates given, if
    /// any; a certificate given to another kind of store is an error.
    #[cfg(feature = "tls-rustls")]
    fn with_certificates(
        pending: Pending,
        url: Option<&str>,
        root: Option<&[u8]>,
        client: Option<&super::tls::ClientCertificate>,
    ) -> Result<Pending, ConfigError> {
        if root.is_none() && client.is_none() {
            return Ok(pending);
        }
        let setting = if root.is_some() {
            "root_certificates"
        } else {
            "client_certificate"
        };
        let url = match (&pending, url) {
            (Pending::Ready(Source::Url(_), _), Some(url)) => url,
            _ => {
                return Err(ConfigError::new(
                    setting,
                    "only a store made from a URL takes certificates (behind Sentinel: \
                     DataNodes; over a pool: the pool's client)",
                ));
            }
        };
        if !url.starts_with("rediss://") {
            return Err(ConfigError::new(
                setting,
                "certificates are for TLS: the URL must be rediss://",
            ));
        }
        let certs = super::tls::certificates(root, client);
        let client = redis::Client::build_with_tls(url, certs)
            .map_err(|e| ConfigError::new(setting, e.to_string()))?;
        Ok(Pending::Ready(
            Source::Url(Box::new(client.clone())),
            Some(PubSubSource::Client(Box::new(client))),
        ))
    }

    /// Checks every setting and makes the store. Does no I/O: the store
    /// connects on its first call.
    pub fn build(self) -> Result<RedisStore, ConfigError> {
        #[cfg(feature = "tls-rustls")]
        let pending = Self::with_certificates(
            self.source?,
            self.url.as_deref(),
            self.root_certificates.as_deref(),
            self.client_certificate.as_ref(),
        )?;
        #[cfg(not(feature = "tls-rustls"))]
        let pending = self.source?;
        let (source, mut pubsub) = match pending {
            Pending::Ready(source, pubsub) => {
                #[cfg(feature = "sentinel")]
                if self.data_nodes.is_some() {
                    return Err(ConfigError::new(
                        "data_nodes",
                        "only a Sentinel store has data nodes apart from its URLs",
                    ));
                }
                (source, pubsub)
            }
            #[cfg(feature = "sentinel")]
            Pending::Sentinel { urls, master } => {
                super::sentinel::sources(&urls, &master, self.data_nodes.unwrap_or_default())?
            }
            #[cfg(feature = "cluster")]
            Pending::Cluster(urls) => {
                #[cfg(feature = "sentinel")]
                if self.data_nodes.is_some() {
                    return Err(ConfigError::new(
                        "data_nodes",
                        "only a Sentinel store has data nodes apart from its URLs",
                    ));
                }
                super::cluster::sources(urls, self.settings.command_timeout)?
            }
        };
        let mut s = self.settings;
        validate_name(&s.prefix, true).map_err(|e| ConfigError::new("prefix", e.to_string()))?;
        if s.fence_retention < Duration::from_secs(1) {
            return Err(ConfigError::new("fence_retention", "must be at least 1 s"));
        }
        if s.fence_retention > MAX_PX {
            return Err(ConfigError::new(
                "fence_retention",
                "must be at most 100 years (Redis refuses longer expiries)",
            ));
        }
        if s.command_timeout < Duration::from_millis(1) {
            return Err(ConfigError::new("command_timeout", "must be at least 1 ms"));
        }
        if s.command_timeout > MAX_COMMAND_TIMEOUT {
            return Err(ConfigError::new("command_timeout", "must be at most 1 h"));
        }
        if let Some(every) = s.topology_refresh {
            if !source.is_cluster() {
                return Err(ConfigError::new(
                    "topology_refresh",
                    "only a cluster store has a slot map to refresh",
                ));
            }
            if every < s.command_timeout {
                return Err(ConfigError::new(
                    "topology_refresh",
                    "must be at least the command timeout",
                ));
            }
        }
        if self.wait_replicas.is_some() && self.wait_aof.is_some() {
            return Err(ConfigError::new(
                "wait_aof",
                "choose one of wait_replicas and wait_aof",
            ));
        }
        let waits = self
            .wait_replicas
            .map(|(n, t, on)| ("wait_replicas", WaitReplicas::new(n, t, on), n, t))
            .into_iter()
            .chain(self.wait_aof.map(|(local, n, t, on)| {
                let w = WaitReplicas::aof(local, n, t, on);
                ("wait_aof", w, n.saturating_add(u32::from(local)), t)
            }));
        for (setting, w, confirmations, timeout) in waits {
            if confirmations == 0 {
                let reason = if setting == "wait_aof" {
                    "the primary's own AOF or at least one replica"
                } else {
                    "must be at least 1"
                };
                return Err(ConfigError::new(setting, reason));
            }
            if timeout.is_zero() || timeout >= s.command_timeout {
                return Err(ConfigError::new(
                    setting,
                    "the timeout must be above 0 and below the command timeout",
                ));
            }
            s.wait_replicas = Some(w);
        }
        if let Some(client) = self.notifications {
            super::tls::check_client("notifications", &client)?;
            if source.is_cluster() {
                return Err(ConfigError::new(
                    "notifications",
                    "a cluster store is notified by sharded pub/sub from the nodes that own \
                     the locks; a plain subscription on one node would miss their releases",
                ));
            }
            pubsub = Some(PubSubSource::Client(Box::new(client)));
        }
        Ok(RedisStore::from_parts(source, pubsub, s))
    }
}
