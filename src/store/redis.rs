//! The store on one Redis primary.

use std::sync::{Arc, LazyLock, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use redis::aio::MultiplexedConnection;
use redis::{RedisError, Script};

use super::{AcquireOutcome, LockStore, ReleaseWatch, Renewal};
use crate::error::{BoxError, ConfigError};
use crate::key::validate_name;
use crate::{Error, FencingToken, LockKey, Operation, OwnerToken};

mod notifier;

use notifier::{Notifier, PubSubSource};

// The lock value is the owner token; the fencing counter is the lock's
// bucket's (see `bucket`): the last token minted for any lock of the bucket.
// It only rises, so each lock's tokens rise too, and Redis holds one counter
// per bucket, however many ids were ever locked.
//
// KEYS[1] lock, KEYS[2] bucket fence counter, KEYS[3] (optional) completed record
// ARGV[1] owner, ARGV[2] lease ms, ARGV[3] fence retention ms
// -> {1, token} granted (or re-entered by the same owner: same token),
//    {0, pttl} held, {2, record} completed (only when KEYS[3] is given)
//
// Written for Redis' cost model: every redis.call and every Lua string
// conversion is a large share of the script's time, so the grant is one
// `SET NX PX GET` (take it, or learn who has it), `TIME`, and one
// `SET … PX GET` of the counter. The token is built from TIME's two strings
// and compared as a string of digits, with no floating-point formatting on
// the usual path.
const ACQUIRE_SRC: &str = r#"
if KEYS[3] then
  local rec = redis.call('GET', KEYS[3])
  if rec then return {2, rec} end
end
local cur = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2], 'GET')
if cur then
  if cur ~= ARGV[1] then return {0, redis.call('PTTL', KEYS[1])} end
  -- Ours already (an attempt whose answer was lost): the counter is at
  -- least the token that attempt minted, and no other holder of this lock
  -- can have come between, so it is a valid token for this grant.
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  local last = redis.call('GET', KEYS[2])
  if last then return {1, last} end
end
-- token = max(last + 1, TIME in us), as a decimal string
local t = redis.call('TIME')
local s = t[1] .. string.sub(t[2] + 1000000, 2)
local last = redis.call('SET', KEYS[2], s, 'PX', ARGV[3], 'GET')
if last and (#last > #s or (#last == #s and last >= s)) then
  s = string.format('%.0f', tonumber(last) + 1)
  redis.call('SET', KEYS[2], s, 'PX', ARGV[3])
end
return {1, s}
"#;
static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE_SRC));

// KEYS[1] fence counter; ARGV[1] token, ARGV[2] retention ms
// Raises the counter to at least the token (Redlock write-back).
const RAISE_FENCE_SRC: &str = r#"
local cur = tonumber(redis.call('GET', KEYS[1]))
if not cur or cur < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
end
return 1
"#;
static RAISE_FENCE: LazyLock<Script> = LazyLock::new(|| Script::new(RAISE_FENCE_SRC));

// Release and finish announce the release with ARGV[n] (`PUBLISH`, or
// `SPUBLISH` on a cluster: the channel shares the lock's hash tag, so it is
// in the script's slot) on the channel ARGV[n + 1]. `pcall`: a server that
// lacks the command (a cluster before Redis 7) still releases; its waiters
// poll.

// KEYS[1] lock, KEYS[2] record, KEYS[3] (optional, Redlock) record writer
// ARGV[1] owner, ARGV[2] record, ARGV[3] retention ms,
// ARGV[4] publish command, ARGV[5] release channel
// -> 1 stored and released, 0 not owner (nothing stored)
// The record writer (the owner token, kept as long as the record) lets a
// Redlock finish that missed its quorum take back exactly what it wrote.
const FINISH_SRC: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
  if KEYS[3] then redis.call('SET', KEYS[3], ARGV[1], 'PX', ARGV[3]) end
  redis.call('DEL', KEYS[1])
  redis.pcall(ARGV[4], ARGV[5], '')
  return 1
end
return 0
"#;
static FINISH: LazyLock<Script> = LazyLock::new(|| Script::new(FINISH_SRC));

// KEYS[1] record, KEYS[2] record writer; ARGV[1] owner
// Deletes the record if `owner` wrote it (Redlock: a finish that missed its
// quorum) -> 1 deleted, 0 not ours (absent, or a later holder's)
const ROLLBACK_SRC: &str = r#"
if redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('DEL', KEYS[1], KEYS[2])
  return 1
end
return 0
"#;
static ROLLBACK: LazyLock<Script> = LazyLock::new(|| Script::new(ROLLBACK_SRC));

// KEYS[1] lock; ARGV[1] owner, ARGV[2] lease ms -> 1 extended, 0 not owner
const EXTEND_SRC: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"#;
static EXTEND: LazyLock<Script> = LazyLock::new(|| Script::new(EXTEND_SRC));

// KEYS[1] lock; ARGV[1] owner, ARGV[2] publish command, ARGV[3] release
// channel -> 1 released, 0 not owner
const RELEASE_SRC: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.pcall(ARGV[2], ARGV[3], '')
  return 1
end
return 0
"#;
static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE_SRC));

/// Locks on one Redis primary (standalone, or the primary of a replicated
/// setup with no automatic failover).
///
/// * acquire, extend and release are one Lua script and one round trip each
///   (EVALSHA, reloaded on `NOSCRIPT`); the grant mints the fencing token in
///   the same script;
/// * a lock `orders:42` lives at `trl:{orders:170}:42:lock` and its release
///   channel is `trl:{orders:170}:42:released`, where `170` is the lock's
///   fencing bucket (one of 1,024 per namespace, from a hash of the key); its
///   fencing counter is the bucket's, `trl:{orders:170}:fence`, shared by the
///   ids of the bucket. All names of a lock share one hash tag, and nothing
///   is left in Redis per id once its lock is released (the counters are at
///   most 1,024 per namespace, each expiring after the fence retention);
/// * commands go over one multiplexed connection checked out of the
///   [`deadpool_redis::Pool`] and kept (a pool checkout pings, which would
///   double the round trips); a broken connection is replaced from the pool;
/// * release notifications use one pub/sub connection per store, shared by
///   all waiters, when the store has a [`redis::Client`] for it
///   ([`from_url`](RedisStore::from_url) or
///   [`with_notifications`](RedisStore::with_notifications)); without one,
///   waiters poll. A [cluster](RedisStore::cluster) store always has one,
///   using sharded pub/sub;
/// * every call is bounded by the command timeout (default 2 s), so a Redis
///   that is down or frozen gives [`Error::Unavailable`], never a hang.
///
/// ```no_run
/// use tower_redis_lock::{Locker, RedisStore};
///
/// # fn main() -> Result<(), tower_redis_lock::Error> {
/// let store = RedisStore::from_url("redis://127.0.0.1:6379/")?;
/// let locker = Locker::new(store);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    source: Source,
    conn: Mutex<Option<Conn>>,
    /// Held while a new connection is checked out, so a burst of requests
    /// after a disconnect opens one connection, not one each.
    connecting: tokio::sync::Mutex<()>,
    prefix: String,
    fence_retention_ms: u64,
    timeout: Duration,
    pubsub: Option<PubSubSource>,
    wait_replicas: Option<WaitReplicas>,
    /// Idle connections of their own for grants that `WAIT` (which blocks
    /// the connection it runs on; the shared one carries everybody's
    /// commands, renewals included).
    wait_conns: Mutex<Vec<MultiplexedConnection>>,
    notifier: OnceLock<Notifier>,
    eviction_check: EvictionCheck,
    /// The last `maxmemory-policy` finding logged, so that a reconnect
    /// does not repeat it.
    eviction_reported: Mutex<Option<String>>,
}

/// Idle `WAIT` connections kept per store.
const MAX_IDLE_WAIT_CONNS: usize = 16;

const LOCK: &str = "lock";
const FENCE: &str = "fence";
const RECORD: &str = "record";
const RECORD_WRITER: &str = "record-writer";
const RELEASED: &str = "released";

/// Fencing counters per namespace. The counter of a lock is shared by every
/// id whose [`bucket`] is the same, so the fencing state in Redis is bounded
/// by the namespaces in use (at most this many keys each), never by the ids
/// ever seen. Part of the key layout: changing it changes every name.
pub(crate) const FENCE_BUCKETS: u32 = 1024;

/// The fencing bucket of `key`: 32-bit FNV-1a of `namespace:id`, modulo
/// [`FENCE_BUCKETS`]. Stable across processes, versions and languages (the
/// names it picks are in Redis), and cheap: no allocation, a few ns.
pub(crate) fn bucket(key: &LockKey) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for &b in key.as_str().as_bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h % FENCE_BUCKETS
}

/// One Redis name of a lock. The hash tag is the namespace and the lock's
/// fencing bucket, `{<namespace>:<bucket, 3 hex digits>}`, so every name of
/// a lock, its bucket's counter among them, is in one slot, and a Cluster
/// still spreads a namespace over 1,024 tags:
///
/// * `<prefix>:{<ns>:<bucket>}:<id>:<suffix>` for the lock, its record and
///   its release channel;
/// * `<prefix>:{<ns>:<bucket>}:fence` for the bucket's fencing counter.
///
/// Written into commands without an intermediate `String`.
#[derive(Clone, Copy)]
struct Name<'a> {
    prefix: &'a str,
    key: &'a LockKey,
    suffix: &'static str,
}

impl std::fmt::Display for Name<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (prefix, ns, b) = (self.prefix, self.key.namespace(), bucket(self.key));
        if self.suffix == FENCE {
            write!(f, "{prefix}:{{{ns}:{b:03x}}}:{FENCE}")
        } else {
            write!(
                f,
                "{prefix}:{{{ns}:{b:03x}}}:{}:{}",
                self.key.id(),
                self.suffix
            )
        }
    }
}

impl redis::ToRedisArgs for Name<'_> {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        use std::io::Write as _;
        // Writing into the argument buffer cannot fail.
        let _ = write!(out.writer_for_next_arg(), "{self}");
    }
}

/// Where command connections come from.
#[derive(Clone)]
enum Source {
    Pool(deadpool_redis::Pool),
    Sentinel(Arc<tokio::sync::Mutex<redis::sentinel::SentinelClient>>),
    Cluster(Box<redis::cluster::ClusterClient>),
}

/// `WAIT numreplicas timeout` after each grant.
#[derive(Debug, Clone, Copy)]
struct WaitReplicas {
    replicas: u32,
    timeout: Duration,
    on_shortfall: ReplicaShortfall,
}

/// What to do when fewer replicas than asked acknowledge a grant in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ReplicaShortfall {
    /// Release the grant and fail the acquire with
    /// [`Error::Unavailable`] (default): the handler does not run on a grant
    /// a failover could lose.
    #[default]
    Fail,
    /// Keep the grant and log a warning.
    Proceed,
}

/// What a store does on connecting to a server whose `maxmemory-policy` can
/// evict keys that have an expiry (`volatile-*`, `allkeys-*`): under memory
/// pressure such a server deletes a held lock, and a second holder gets in
/// while the first still runs. Run locks on `noeviction`, where a full server
/// refuses writes (the store answers [`Error::Unavailable`]) instead of
/// forgetting locks.
///
/// The policy is read with `CONFIG GET` each time the store opens a command
/// connection (on a Cluster, from every primary); a server that refuses
/// `CONFIG` (some managed services do) is reported once at warn level and
/// used: there is nothing to check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum EvictionCheck {
    /// Log an error (once per policy) and use the server (default).
    #[default]
    Log,
    /// Refuse the server: every call fails with [`Error::Unavailable`]
    /// naming the policy, until the policy is changed.
    Refuse,
    /// Do not read the policy.
    Off,
}

/// A command connection: one multiplexed connection to a primary, or a
/// cluster connection that routes by slot and follows MOVED/ASK.
#[derive(Clone)]
enum Conn {
    Single(MultiplexedConnection),
    Cluster(Box<redis::cluster_async::ClusterConnection>),
}

impl redis::aio::ConnectionLike for Conn {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.inner.prefix)
            .field("fence_retention_ms", &self.inner.fence_retention_ms)
            .field("timeout", &self.inner.timeout)
            .field("notifications", &self.inner.pubsub.is_some())
            .field(
                "topology",
                &match self.inner.source {
                    Source::Pool(_) => "primary",
                    Source::Sentinel(_) => "sentinel",
                    Source::Cluster(_) => "cluster",
                },
            )
            .finish()
    }
}

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

    fn with_source(source: Source) -> Self {
        RedisStore {
            inner: Arc::new(Inner {
                source,
                conn: Mutex::new(None),
                connecting: tokio::sync::Mutex::new(()),
                prefix: DEFAULT_PREFIX.to_owned(),
                fence_retention_ms: DEFAULT_FENCE_RETENTION.as_millis() as u64,
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
    /// shrink the window in which a failover loses a fresh grant.
    pub fn sentinel(sentinel_urls: &[&str], master_name: &str) -> Result<Self, Error> {
        // (`String` satisfies both signatures of `build`, with and without
        // the client's TLS features.)
        let service = String::from(master_name);
        let client = redis::sentinel::SentinelClient::build(
            sentinel_urls.to_vec(),
            service,
            None,
            redis::sentinel::SentinelServerType::Master,
        )
        .map_err(|e| Error::Config(ConfigError::new("sentinel_urls", e.to_string())))?;
        let shared = Arc::new(tokio::sync::Mutex::new(client));
        let mut store = Self::with_source(Source::Sentinel(shared.clone()));
        store.inner_mut().pubsub = Some(PubSubSource::Sentinel(shared));
        Ok(store)
    }

    /// A store on a Redis Cluster, given some of its nodes. Every lock's
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
    pub fn cluster(node_urls: &[&str]) -> Result<Self, Error> {
        let client = redis::cluster::ClusterClient::new(node_urls.to_vec())
            .map_err(|e| Error::Config(ConfigError::new("cluster_urls", e.to_string())))?;
        let mut store = Self::with_source(Source::Cluster(Box::new(client)));
        let nodes = node_urls.iter().map(|u| u.to_string()).collect();
        store.inner_mut().pubsub = Some(PubSubSource::Cluster(nodes));
        Ok(store)
    }

    /// After each grant, `WAIT` until `replicas` replicas have the write or
    /// `timeout` passes; on a shortfall, [`ReplicaShortfall::Fail`] releases
    /// and fails the acquire. Shrinks (does not close) the window in which a
    /// failover to a replica that missed the grant lets a second holder in.
    /// `WAIT` runs on a connection of its own (kept for reuse), so the
    /// other commands of the store, renewals included, never queue behind
    /// it.
    pub fn with_wait_replicas(
        mut self,
        replicas: u32,
        timeout: Duration,
        on_shortfall: ReplicaShortfall,
    ) -> Result<Self, ConfigError> {
        if replicas == 0 {
            return Err(ConfigError::new("wait_replicas", "must be at least 1"));
        }
        if let Source::Cluster(_) = self.inner.source {
            return Err(ConfigError::new(
                "wait_replicas",
                "not supported on a cluster store (WAIT is per node)",
            ));
        }
        if timeout.is_zero() || timeout >= self.inner.timeout {
            return Err(ConfigError::new(
                "wait_replicas",
                "the timeout must be above 0 and below the command timeout",
            ));
        }
        self.inner_mut().wait_replicas = Some(WaitReplicas {
            replicas,
            timeout,
            on_shortfall,
        });
        Ok(self)
    }

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
        if let Source::Cluster(_) = self.inner.source {
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

    /// What to do on a server whose `maxmemory-policy` can evict locks (see
    /// [`EvictionCheck`]; default [`EvictionCheck::Log`]).
    ///
    /// ```
    /// use tower_redis_lock::{EvictionCheck, RedisStore};
    ///
    /// # fn main() -> Result<(), tower_redis_lock::Error> {
    /// let store = RedisStore::from_url("redis://127.0.0.1/")?.with_eviction_check(EvictionCheck::Refuse);
    /// # let _ = store;
    /// # Ok(())
    /// # }
    /// ```
    pub fn with_eviction_check(mut self, check: EvictionCheck) -> Self {
        self.inner_mut().eviction_check = check;
        self
    }

    /// The Redis key that holds `key`'s lock.
    pub fn lock_key(&self, key: &LockKey) -> String {
        self.name(key, LOCK).to_string()
    }

    /// The Redis key that holds the fencing counter of `key`'s bucket (shared
    /// with the other ids of the bucket: see the store's key layout).
    pub fn fence_key(&self, key: &LockKey) -> String {
        self.name(key, FENCE).to_string()
    }

    /// The Redis key that holds `key`'s completed record.
    pub fn record_key(&self, key: &LockKey) -> String {
        self.name(key, RECORD).to_string()
    }

    /// The channel on which `key`'s releases are published.
    pub fn release_channel(&self, key: &LockKey) -> String {
        self.name(key, RELEASED).to_string()
    }

    /// One of `key`'s Redis names, written straight into a command.
    fn name<'a>(&'a self, key: &'a LockKey, suffix: &'static str) -> Name<'a> {
        Name {
            prefix: &self.inner.prefix,
            key,
            suffix,
        }
    }

    /// How release scripts announce a release: sharded on a cluster (a
    /// plain PUBLISH there would be broadcast to every node).
    fn publish_command(&self) -> &'static str {
        match self.inner.source {
            Source::Cluster(_) => "SPUBLISH",
            _ => "PUBLISH",
        }
    }

    // Builder methods run before the store is shared.
    fn inner_mut(&mut self) -> &mut Inner {
        if Arc::get_mut(&mut self.inner).is_none() {
            // A clone exists: detach this handle with its own state.
            let i = &self.inner;
            self.inner = Arc::new(Inner {
                source: i.source.clone(),
                conn: Mutex::new(None),
                connecting: tokio::sync::Mutex::new(()),
                prefix: i.prefix.clone(),
                fence_retention_ms: i.fence_retention_ms,
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

    async fn connection(&self, op: Operation, key: Option<&LockKey>) -> Result<Conn, Error> {
        if let Some(c) = lock(&self.inner.conn).as_ref() {
            return Ok(c.clone());
        }
        let _one_at_a_time = self.inner.connecting.lock().await;
        if let Some(c) = lock(&self.inner.conn).as_ref() {
            return Ok(c.clone());
        }
        let conn = match &self.inner.source {
            Source::Cluster(client) => Conn::Cluster(Box::new(
                client
                    .get_async_connection()
                    .await
                    .map_err(|e| Error::from_redis(op, key, e))?,
            )),
            // Boxed: opening a connection is rare, and its future (pool or
            // Sentinel, several layers of the redis client deep) would
            // otherwise be nested into every call's future type.
            _ => Conn::Single(Box::pin(self.open_single(op, key)).await?),
        };
        let mut conn = conn;
        if let Conn::Single(_) = conn {
            // Load the scripts once per connection, in one round trip, so
            // that first uses do not pay for a NOSCRIPT answer. (EVALSHA
            // still falls back to loading if the script cache is flushed; on
            // a cluster that fallback loads them where they are needed.)
            let mut load = redis::pipe();
            for src in [ACQUIRE_SRC, EXTEND_SRC, RELEASE_SRC, FINISH_SRC] {
                load.cmd("SCRIPT").arg("LOAD").arg(src).ignore();
            }
            load.query_async::<()>(&mut conn)
                .await
                .map_err(|e| Error::from_redis(op, key, e))?;
        }
        self.check_eviction(&mut conn, op, key).await?;
        *lock(&self.inner.conn) = Some(conn.clone());
        Ok(conn)
    }

    /// A new connection to the primary (pool or Sentinel source).
    async fn open_single(
        &self,
        op: Operation,
        key: Option<&LockKey>,
    ) -> Result<MultiplexedConnection, Error> {
        let redis_err = |e| Error::from_redis(op, key, e);
        match &self.inner.source {
            Source::Pool(pool) => {
                let obj = pool.get().await.map_err(|e| pool_error(op, key, e))?;
                Ok(deadpool_redis::Connection::take(obj))
            }
            Source::Sentinel(sentinel) => {
                let client = sentinel
                    .lock()
                    .await
                    .async_get_client()
                    .await
                    .map_err(redis_err)?;
                client
                    .get_multiplexed_async_connection()
                    .await
                    .map_err(redis_err)
            }
            Source::Cluster(_) => Err(Error::Config(ConfigError::new(
                "source",
                "a cluster store has no single primary",
            ))),
        }
    }

    /// Reads the server's `maxmemory-policy` on a new connection and acts
    /// per [`EvictionCheck`].
    async fn check_eviction(
        &self,
        conn: &mut Conn,
        op: Operation,
        key: Option<&LockKey>,
    ) -> Result<(), Error> {
        let check = self.inner.eviction_check;
        if check == EvictionCheck::Off {
            return Ok(());
        }
        let mut get = redis::cmd("CONFIG");
        get.arg("GET").arg("maxmemory-policy");
        let answer = match conn {
            Conn::Single(c) => get.query_async::<redis::Value>(c).await,
            Conn::Cluster(c) => {
                use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};
                let all = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
                c.route_command(get, all).await
            }
        };
        let finding = match answer {
            Ok(v) => {
                let mut policies = Vec::new();
                eviction_policies(&v, &mut policies);
                policies.sort();
                policies.dedup();
                match policies.iter().find(|p| can_evict(p)) {
                    Some(p) => Finding::Evicting(p.clone()),
                    None if policies.is_empty() => {
                        Finding::Unknown("no maxmemory-policy in the CONFIG GET answer".into())
                    }
                    None => Finding::Safe,
                }
            }
            // Refused (ACL, a renamed command, a managed service).
            Err(e)
                if e.code().is_some()
                    || matches!(
                        e.kind(),
                        redis::ErrorKind::Server(_) | redis::ErrorKind::Extension
                    ) =>
            {
                Finding::Unknown(e.to_string())
            }
            Err(e) => return Err(Error::from_redis(op, key, e)),
        };
        let report = |text: String| {
            let mut last = lock(&self.inner.eviction_reported);
            let new = last.as_deref() != Some(text.as_str());
            if new {
                *last = Some(text);
            }
            new
        };
        match finding {
            Finding::Safe => Ok(()),
            Finding::Unknown(why) => {
                if report(format!("unknown: {why}")) {
                    tracing::warn!(
                        error = %why,
                        "could not read the Redis maxmemory-policy; locks are safe only on `noeviction`"
                    );
                }
                Ok(())
            }
            Finding::Evicting(policy) => {
                let refuse = check == EvictionCheck::Refuse;
                if report(policy.clone()) {
                    tracing::error!(
                        maxmemory_policy = %policy,
                        refused = refuse,
                        "Redis can evict keys with an expiry under memory pressure, held locks among them: \
                         two holders could then run at once; set `maxmemory-policy noeviction`"
                    );
                }
                if refuse {
                    return Err(Error::Unavailable {
                        op,
                        key: key.cloned(),
                        source: format!(
                            "the server's maxmemory-policy `{policy}` can evict held locks; \
                             the store refuses it (EvictionCheck::Refuse): set `noeviction`"
                        )
                        .into(),
                    });
                }
                Ok(())
            }
        }
    }

    fn forget_connection_on(&self, err: &RedisError) {
        let readonly = err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly);
        if err.is_io_error()
            || err.is_connection_dropped()
            || err.is_unrecoverable_error()
            || readonly
        {
            self.forget_connections();
        }
    }

    /// Drops the shared connection and the idle `WAIT` connections: the next
    /// call opens new ones (and, behind Sentinel, asks for the primary).
    fn forget_connections(&self) {
        *lock(&self.inner.conn) = None;
        lock(&self.inner.wait_conns).clear();
    }

    /// Runs `f` on the shared connection within the command timeout.
    async fn with_conn<T, F, Fut>(
        &self,
        op: Operation,
        key: Option<&LockKey>,
        f: F,
    ) -> Result<T, Error>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
    {
        let work = async {
            let conn = self.connection(op, key).await?;
            f(conn).await.map_err(|e| {
                self.forget_connection_on(&e);
                Error::from_redis(op, key, e)
            })
        };
        self.bounded(op, key, self.inner.timeout, work).await
    }

    /// Runs `work` within `bound`; a timeout is an [`Error::Unavailable`].
    async fn bounded<T>(
        &self,
        op: Operation,
        key: Option<&LockKey>,
        bound: Duration,
        work: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        match tokio::time::timeout(bound, work).await {
            Ok(r) => r,
            Err(_) => {
                // Behind Sentinel a silent primary may have been replaced:
                // ask again on the next call.
                if let Source::Sentinel(_) = self.inner.source {
                    self.forget_connections();
                }
                Err(timeout_error(op, key, bound))
            }
        }
    }

    async fn acquire_script(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        lease: Duration,
        replay: bool,
    ) -> Result<AcquireOutcome, Error> {
        let mut inv = ACQUIRE.key(self.name(key, LOCK));
        inv.key(self.name(key, FENCE));
        if replay {
            inv.key(self.name(key, RECORD));
        }
        inv.arg(owner.as_str())
            .arg(ms(lease))
            .arg(self.inner.fence_retention_ms);
        let (kind, value) = match self.inner.wait_replicas {
            None => {
                self.with_conn(Operation::Acquire, Some(key), |mut c| async move {
                    inv.invoke_async(&mut c).await
                })
                .await?
            }
            Some(w) => {
                let (kind, value, acked) = self.grant_and_wait(&inv, key, w).await?;
                if let Some(acked) = acked {
                    self.check_replicas(key, owner, w, acked).await?;
                }
                (kind, value)
            }
        };
        let unexpected = || Error::Unavailable {
            op: Operation::Acquire,
            key: Some(key.clone()),
            source: "unexpected reply from the acquire script".into(),
        };
        Ok(match (kind, value) {
            (1, redis::Value::BulkString(digits)) => AcquireOutcome::Granted(FencingToken::new(
                std::str::from_utf8(&digits)
                    .ok()
                    .and_then(|d| d.parse().ok())
                    .ok_or_else(unexpected)?,
            )),
            (0, redis::Value::Int(n)) => AcquireOutcome::Held {
                remaining: (n >= 0).then(|| Duration::from_millis(n as u64)),
            },
            (2, redis::Value::BulkString(rec)) => AcquireOutcome::Completed(Bytes::from(rec)),
            _ => return Err(unexpected()),
        })
    }

    /// Raises `key`'s fencing counter to at least `token`, so that the next
    /// grant on this node mints a larger token (Redlock write-back).
    pub(crate) async fn raise_fence(
        &self,
        key: &LockKey,
        token: FencingToken,
    ) -> Result<(), Error> {
        let mut inv = RAISE_FENCE.key(self.name(key, FENCE));
        inv.arg(token.get()).arg(self.inner.fence_retention_ms);
        let _: i64 = self
            .with_conn(Operation::Acquire, Some(key), |mut c| async move {
                inv.invoke_async(&mut c).await
            })
            .await?;
        Ok(())
    }

    /// The finish script; with `mark`, it also stores who wrote the record
    /// (for [`rollback_record`](RedisStore::rollback_record)).
    async fn finish_script(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        record: Bytes,
        retention: Duration,
        mark: bool,
    ) -> Result<bool, Error> {
        let mut inv = FINISH.key(self.name(key, LOCK));
        inv.key(self.name(key, RECORD));
        if mark {
            inv.key(self.name(key, RECORD_WRITER));
        }
        inv.arg(owner.as_str())
            .arg(record.as_ref())
            .arg(ms(retention))
            .arg(self.publish_command())
            .arg(self.name(key, RELEASED));
        let n: i64 = self
            .with_conn(Operation::Release, Some(key), |mut c| async move {
                inv.invoke_async(&mut c).await
            })
            .await?;
        Ok(n == 1)
    }

    /// Finish that remembers the record's writer (Redlock).
    pub(crate) async fn finish_marked(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        record: Bytes,
        retention: Duration,
    ) -> Result<bool, Error> {
        self.finish_script(key, owner, record, retention, true)
            .await
    }

    /// Deletes `key`'s record if `owner` wrote it with
    /// [`finish_marked`](RedisStore::finish_marked): never a later holder's.
    pub(crate) async fn rollback_record(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
    ) -> Result<bool, Error> {
        let mut inv = ROLLBACK.key(self.name(key, RECORD));
        inv.key(self.name(key, RECORD_WRITER)).arg(owner.as_str());
        let n: i64 = self
            .with_conn(Operation::Release, Some(key), |mut c| async move {
                inv.invoke_async(&mut c).await
            })
            .await?;
        Ok(n == 1)
    }

    /// The acquire script, then (if it granted) `WAIT`, on a connection of
    /// their own: `WAIT` blocks the connection it runs on, and it must run
    /// where the grant was written (it counts that client's writes). The
    /// connection is reused only after a clean answer.
    async fn grant_and_wait(
        &self,
        inv: &redis::ScriptInvocation<'_>,
        key: &LockKey,
        w: WaitReplicas,
    ) -> Result<(i64, redis::Value, Option<i64>), Error> {
        let op = Operation::Acquire;
        let bound = self.inner.timeout.saturating_add(w.timeout);
        let work = async {
            let idle = lock(&self.inner.wait_conns).pop();
            let mut conn = match idle {
                Some(c) => c,
                None => {
                    let mut c = Box::pin(self.open_single(op, Some(key))).await?;
                    c.set_response_timeout(bound);
                    c
                }
            };
            let fail = |e: RedisError| {
                self.forget_connection_on(&e);
                Error::from_redis(op, Some(key), e)
            };
            let (kind, value): (i64, redis::Value) =
                inv.invoke_async(&mut conn).await.map_err(fail)?;
            let acked = if kind == 1 {
                let n: i64 = redis::cmd("WAIT")
                    .arg(w.replicas)
                    .arg(ms(w.timeout))
                    .query_async(&mut conn)
                    .await
                    .map_err(fail)?;
                Some(n)
            } else {
                None
            };
            let mut idle = lock(&self.inner.wait_conns);
            if idle.len() < MAX_IDLE_WAIT_CONNS {
                idle.push(conn);
            }
            Ok((kind, value, acked))
        };
        self.bounded(op, Some(key), bound, work).await
    }

    /// On too few replica acknowledgements with [`ReplicaShortfall::Fail`],
    /// releases the grant and fails.
    async fn check_replicas(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        w: WaitReplicas,
        acked: i64,
    ) -> Result<(), Error> {
        if acked >= i64::from(w.replicas) {
            return Ok(());
        }
        match w.on_shortfall {
            ReplicaShortfall::Proceed => {
                tracing::warn!(key = %key, acked, wanted = w.replicas, "grant not yet on enough replicas; proceeding");
                Ok(())
            }
            ReplicaShortfall::Fail => {
                let _ = self.release(key, owner).await;
                Err(Error::Unavailable {
                    op: Operation::Acquire,
                    key: Some(key.clone()),
                    source: format!(
                        "only {acked} of {} replicas acknowledged the grant within {} ms",
                        w.replicas,
                        w.timeout.as_millis()
                    )
                    .into(),
                })
            }
        }
    }

    /// Test support: how many release channels the store's notifier keeps
    /// (subscribed or wanted) and the capacity of its map; `(0, 0)` before
    /// the first subscribe or without notifications.
    #[doc(hidden)]
    pub fn notification_channels(&self) -> (usize, usize) {
        self.inner.notifier.get().map_or((0, 0), Notifier::channels)
    }

    fn notifier(&self) -> Option<&Notifier> {
        let source = self.inner.pubsub.as_ref()?;
        Some(
            self.inner
                .notifier
                .get_or_init(|| Notifier::spawn(source.clone(), self.inner.timeout)),
        )
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What a `CONFIG GET maxmemory-policy` found.
enum Finding {
    Safe,
    Evicting(String),
    Unknown(String),
}

/// Whether `policy` can evict a key that has an expiry: every policy but
/// `noeviction`.
fn can_evict(policy: &str) -> bool {
    !policy.eq_ignore_ascii_case("noeviction")
}

/// Collects the values of `maxmemory-policy` in a `CONFIG GET` answer: a
/// flat `[name, value]` array (RESP2), a map (RESP3), or a map of such
/// answers per node (a Cluster asked on every primary).
fn eviction_policies(v: &redis::Value, out: &mut Vec<String>) {
    use redis::Value;
    let text = |v: &Value| match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    let is_name = |v: &Value| text(v).is_some_and(|t| t.eq_ignore_ascii_case("maxmemory-policy"));
    match v {
        Value::Array(items) if items.len() == 2 && is_name(&items[0]) => {
            out.extend(text(&items[1]));
        }
        Value::Array(items) => items.iter().for_each(|i| eviction_policies(i, out)),
        Value::Map(pairs) => {
            for (k, v) in pairs {
                if is_name(k) {
                    out.extend(text(v));
                } else {
                    eviction_policies(v, out);
                }
            }
        }
        _ => {}
    }
}

/// The longest expiry written to Redis: about 100 years, far below what
/// `PX` accepts (the server refuses an expiry past `i64::MAX` ms from now).
const MAX_PX: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// `d` in whole milliseconds for `PX`/`PEXPIRE`: at least 1, and at most
/// [`MAX_PX`] (a longer lease or retention is that long).
fn ms(d: Duration) -> u64 {
    (d.min(MAX_PX).as_millis() as u64).max(1)
}

fn timeout_error(op: Operation, key: Option<&LockKey>, after: Duration) -> Error {
    Error::Unavailable {
        op,
        key: key.cloned(),
        source: format!("no answer from Redis within {} ms", after.as_millis()).into(),
    }
}

fn pool_error(op: Operation, key: Option<&LockKey>, e: deadpool_redis::PoolError) -> Error {
    match e {
        deadpool_redis::PoolError::Backend(e) => Error::from_redis(op, key, e),
        other => Error::Unavailable {
            op,
            key: key.cloned(),
            source: Box::new(other) as BoxError,
        },
    }
}

impl LockStore for RedisStore {
    fn instance_id(&self) -> usize {
        Arc::as_ptr(&self.inner).cast::<()>() as usize
    }

    async fn acquire(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        lease: Duration,
    ) -> Result<AcquireOutcome, Error> {
        self.acquire_script(key, owner, lease, false).await
    }

    async fn acquire_or_replay(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        lease: Duration,
    ) -> Result<AcquireOutcome, Error> {
        self.acquire_script(key, owner, lease, true).await
    }

    async fn finish(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        record: Bytes,
        retention: Duration,
    ) -> Result<bool, Error> {
        self.finish_script(key, owner, record, retention, false)
            .await
    }

    async fn read_record(&self, key: &LockKey) -> Result<Option<Bytes>, Error> {
        let record_key = self.name(key, RECORD);
        let raw: Option<Vec<u8>> = self
            .with_conn(Operation::Acquire, Some(key), |mut c| async move {
                redis::cmd("GET").arg(record_key).query_async(&mut c).await
            })
            .await?;
        Ok(raw.map(Bytes::from))
    }

    async fn extend(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        lease: Duration,
    ) -> Result<bool, Error> {
        let mut inv = EXTEND.key(self.name(key, LOCK));
        inv.arg(owner.as_str()).arg(ms(lease));
        let n: i64 = self
            .with_conn(Operation::Extend, Some(key), |mut c| async move {
                inv.invoke_async(&mut c).await
            })
            .await?;
        Ok(n == 1)
    }

    async fn extend_many(&self, renewals: &[Renewal]) -> Vec<Result<bool, Error>> {
        if renewals.is_empty() {
            return Vec::new();
        }
        if let Source::Cluster(_) = self.inner.source {
            // Keys of a batch live in many slots: send the renewals at once
            // on the cluster connection, which pipelines them per node. Each
            // answers for itself: a frozen node fails only its own keys.
            return futures_util::future::join_all(
                renewals
                    .iter()
                    .map(|r| self.extend(&r.key, &r.owner, r.lease)),
            )
            .await;
        }
        let mut pipe = redis::pipe();
        // One answer per command: a server error of one (a key of the wrong
        // type) must not fail the others.
        pipe.ignore_errors();
        for r in renewals {
            pipe.cmd("EVALSHA")
                .arg(EXTEND.get_hash())
                .arg(1)
                .arg(self.name(&r.key, LOCK))
                .arg(r.owner.as_str())
                .arg(ms(r.lease));
        }
        let key = (renewals.len() == 1).then(|| &renewals[0].key);
        let no_script = |a: &redis::RedisResult<i64>| matches!(a, Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript));
        let answers: Vec<redis::RedisResult<i64>> = match self
            .with_conn(Operation::Extend, key, |mut c| async move {
                let answers: Vec<redis::RedisResult<i64>> = pipe.query_async(&mut c).await?;
                if answers.iter().any(no_script) {
                    EXTEND.prepare_invoke().load_async(&mut c).await?;
                    return pipe.query_async(&mut c).await;
                }
                Ok(answers)
            })
            .await
        {
            Ok(answers) => answers,
            // The connection failed or timed out: every lease on it.
            Err(e) => return super::error_for_each(e, renewals),
        };
        if answers.len() != renewals.len() {
            let e = Error::Unavailable {
                op: Operation::Extend,
                key: None,
                source: "the renewal pipeline answered the wrong number of replies".into(),
            };
            return super::error_for_each(e, renewals);
        }
        answers
            .into_iter()
            .zip(renewals)
            .map(|(a, r)| match a {
                Ok(n) => Ok(n == 1),
                Err(e) => {
                    self.forget_connection_on(&e);
                    Err(Error::from_redis(Operation::Extend, Some(&r.key), e))
                }
            })
            .collect()
    }

    async fn release(&self, key: &LockKey, owner: &OwnerToken) -> Result<bool, Error> {
        let mut inv = RELEASE.key(self.name(key, LOCK));
        inv.arg(owner.as_str())
            .arg(self.publish_command())
            .arg(self.name(key, RELEASED));
        let n: i64 = self
            .with_conn(Operation::Release, Some(key), |mut c| async move {
                inv.invoke_async(&mut c).await
            })
            .await?;
        Ok(n == 1)
    }

    async fn subscribe(&self, key: &LockKey) -> Result<ReleaseWatch, Error> {
        match self.notifier() {
            Some(notifier) => notifier.subscribe(self.release_channel(key), key).await,
            None => Ok(ReleaseWatch::never()),
        }
    }
}
