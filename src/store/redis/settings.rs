//! Making a store: over a pool or from a URL, and its `with_*` settings
//! (Sentinel and Cluster constructors are in `sentinel.rs`, `cluster.rs`;
//! replicas and the eviction check beside their code).

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use super::connection::Source;
use super::notifier::PubSubSource;
use super::{EvictionCheck, Inner, MAX_PX, RedisStore, ms};
use crate::Error;
use crate::error::ConfigError;
use crate::key::validate_name;

const DEFAULT_PREFIX: &str = "trl";
const DEFAULT_FENCE_RETENTION: Duration = Duration::from_secs(3600);
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);
/// A bound on a call is no bound past this (and the sums of timeouts stay
/// far from overflowing).
const MAX_COMMAND_TIMEOUT: Duration = Duration::from_secs(3600);

impl RedisStore {
    /// A store over an existing pool. Waiters poll unless you add
    /// [`with_notifications`](RedisStore::with_notifications).
    pub fn new(pool: deadpool_redis::Pool) -> Self {
        Self::with_source(Source::Pool(pool))
    }

    pub(super) fn with_source(source: Source) -> Self {
        RedisStore {
            inner: Arc::new(Inner {
                source,
                conn: Mutex::new(None),
                connecting: tokio::sync::Mutex::new(()),
                prefix: DEFAULT_PREFIX.to_owned(),
                fence_retention_ms: DEFAULT_FENCE_RETENTION.as_millis() as u64,
                fencing: true,
                timeout: DEFAULT_TIMEOUT,
                pubsub: None,
                wait_replicas: None,
                wait_conns: Mutex::default(),
                notifier: OnceLock::new(),
                eviction_check: EvictionCheck::default(),
                eviction_reported: Mutex::default(),
            }),
        }
    }

    /// A store on the primary that a set of Sentinels names for
    /// `master_name`, with release notifications. Connections are resolved
    /// through the Sentinels and re-resolved when one breaks, so new grants
    /// follow a failover; a holder whose renewals then find no key (the
    /// grant was not replicated) is told its lock is lost.
    ///
    /// Consider [`with_wait_replicas`](RedisStore::with_wait_replicas) to
    /// A store for a `redis://` (or `rediss://`, `unix://`) URL, with release
    /// notifications. Connects lazily: this does no I/O.
    pub fn from_url(url: &str) -> Result<Self, Error> {
        let config_err =
            |e: &dyn std::fmt::Display| Error::Config(ConfigError::new("url", format!("{e}")));
        let client = redis::Client::open(url).map_err(|e| config_err(&e))?;
        let pool = deadpool_redis::Config::from_url(url)
            .create_pool(Some(deadpool_redis::Runtime::Tokio1))
            .map_err(|e| config_err(&e))?;
        Ok(Self::new(pool).with_notifications(client))
    }

    /// Uses `client` for one shared pub/sub connection that wakes waiters as
    /// soon as a lock is released.
    ///
    /// A [cluster](RedisStore::cluster) store keeps its own notifications
    /// (sharded, from the nodes that own the locks) and ignores this, with a
    /// warning: a plain subscription on one node would miss its releases.
    pub fn with_notifications(mut self, client: redis::Client) -> Self {
        if self.inner.source.is_cluster() {
            tracing::warn!(
                "with_notifications is ignored on a cluster store: it is notified by sharded pub/sub"
            );
            return self;
        }
        self.inner_mut().pubsub = Some(PubSubSource::Client(Box::new(client)));
        self
    }

    /// Prefix of every key and channel (default `trl`): 1 to 64 bytes of
    /// `A-Z a-z 0-9 _ - . / :`.
    pub fn with_prefix(mut self, prefix: &str) -> Result<Self, ConfigError> {
        validate_name(prefix, true).map_err(|e| ConfigError::new("prefix", e.to_string()))?;
        self.inner_mut().prefix = prefix.to_owned();
        Ok(self)
    }

    /// Whether grants mint fencing tokens (default `true`).
    ///
    /// `with_fencing(false)` is for efficiency locks, which only keep work
    /// from being done twice at once and guard no resource that could
    /// check a token: the grant is a plain `SET NX PX` (a script only when
    /// the lock is taken, to learn the holder's lease and mark the lock as
    /// waited-for), and a guard's
    /// [`fencing_token`](crate::LockGuard::fencing_token) answers
    /// [`Unfenced`](crate::Unfenced); the layer sends no `Fencing-Token`
    /// header. Renewal, loss, waiting, cancellation safety and idempotency
    /// are the same. See README, "Fencing, or not".
    pub fn with_fencing(mut self, on: bool) -> Self {
        self.inner_mut().fencing = on;
        self
    }

    /// How long a bucket's fencing counter outlives the last grant of its
    /// bucket (default 1 h, at least 1 s, at most 100 years). Tokens stay strictly increasing after it lapses because
    /// they never fall below Redis `TIME` in µs; the counter only guards
    /// against the server clock stepping back within the retention.
    pub fn with_fence_retention(mut self, retention: Duration) -> Result<Self, ConfigError> {
        if retention < Duration::from_secs(1) {
            return Err(ConfigError::new("fence_retention", "must be at least 1 s"));
        }
        if retention > MAX_PX {
            return Err(ConfigError::new(
                "fence_retention",
                "must be at most 100 years (Redis refuses longer expiries)",
            ));
        }
        self.inner_mut().fence_retention_ms = ms(retention);
        Ok(self)
    }

    /// Upper bound on each call to Redis, connection included (default 2 s,
    /// at least 1 ms, at most 1 h).
    pub fn with_command_timeout(mut self, timeout: Duration) -> Result<Self, ConfigError> {
        if timeout < Duration::from_millis(1) {
            return Err(ConfigError::new("command_timeout", "must be at least 1 ms"));
        }
        if timeout > MAX_COMMAND_TIMEOUT {
            return Err(ConfigError::new("command_timeout", "must be at most 1 h"));
        }
        self.inner_mut().timeout = timeout;
        Ok(self)
    }

    // Builder methods run before the store is shared.
    pub(super) fn inner_mut(&mut self) -> &mut Inner {
        if Arc::get_mut(&mut self.inner).is_none() {
            // A clone exists: detach this handle with its own state.
            let i = &self.inner;
            self.inner = Arc::new(Inner {
                source: i.source.clone(),
                conn: Mutex::new(None),
                connecting: tokio::sync::Mutex::new(()),
                prefix: i.prefix.clone(),
                fence_retention_ms: i.fence_retention_ms,
                fencing: i.fencing,
                timeout: i.timeout,
                pubsub: i.pubsub.clone(),
                wait_replicas: i.wait_replicas,
                wait_conns: Mutex::default(),
                notifier: OnceLock::new(),
                eviction_check: i.eviction_check,
                eviction_reported: Mutex::default(),
            });
        }
        Arc::get_mut(&mut self.inner).unwrap_or_else(|| unreachable!("just detached"))
    }
}
