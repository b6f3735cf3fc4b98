//! The store on one Redis primary, a Sentinel set or a Cluster: the
//! [`RedisStore`] type and its [`LockStore`] impl. The rest, by job:
//!
//! | file | job |
//! |---|---|
//! | `settings.rs` | `RedisStoreBuilder`: every constructor (URL, pool, Sentinel, Cluster), the settings and their checks |
//! | `sentinel.rs`, `cluster.rs` | the Sentinel and Cluster connection sources (features `sentinel`, `cluster`); the Sentinels' `+switch-master` watch; the slot-map refresh |
//! | `sentinel_client.rs` | the client that asks every Sentinel for the primary |
//! | `data_nodes.rs` | `DataNodes`: how a Sentinel store reaches the primary and replicas |
//! | `scripts.rs`, `scripts/*.lua` | the Lua scripts, their sources and the `EVALSHA` call that reloads them on `NOSCRIPT` |
//! | `calls.rs` | the store's calls that run them: grants (through `replicas.rs`), renewals, releases, finish, permits |
//! | `multi.rs` | several locks at once: one script on one node or slot, else one by one |
//! | `keys.rs` | Redis names of a lock (hash tag, fencing bucket) |
//! | `source.rs` | where connections come from (`Source`), the connection (`Conn`), a cluster's node timeouts |
//! | `connection.rs` | the shared connection, opened from the source, and call timeouts |
//! | `replicas.rs` | `WAIT` for replicas (or `WAITAOF`) after a grant |
//! | `eviction.rs` | the `maxmemory-policy` check |
//! | `notifier/` | release notifications over pub/sub |

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;

use super::holder::{HolderInfo, HolderLabel, HolderPage, ListCursor};
use super::{
    AcquireAllOutcome, AcquireOutcome, Ask, ForcedRelease, Grant, LeaseKind, LockStore,
    OperatorStore, ReleaseWatch, Renewal, RwMode,
};
use crate::error::{Error, Operation};
use crate::key::LockKey;
use crate::token::OwnerToken;

mod calls;
#[cfg(feature = "cluster")]
mod cluster;
mod connection;
#[cfg(feature = "sentinel")]
mod data_nodes;
mod eviction;
mod keys;
mod multi;
mod notifier;
mod operator;
mod renew;
mod replicas;
mod rwlock;
mod scripts;
#[cfg(feature = "sentinel")]
mod sentinel;
#[cfg(feature = "sentinel")]
mod sentinel_client;
mod server;
mod settings;
mod source;
mod tls;

#[cfg(feature = "sentinel")]
pub use data_nodes::{DataNodes, NodeTls};
pub use eviction::EvictionCheck;
use keys::{LOCK, RECORD};
use notifier::{Notifier, PubSubSource};
pub use replicas::ReplicaShortfall;
use replicas::WaitReplicas;
use scripts::{Argv, RELEASE, ScriptCall};
pub use settings::RedisStoreBuilder;
use source::{Conn, Source};

/// Locks on one Redis primary (standalone, or the primary of a replicated
/// setup with no automatic failover).
///
/// * acquire, extend and release are one Lua script and one round trip each
///   (EVALSHA, reloaded on `NOSCRIPT`); the grant mints the fencing token in
///   the same script. The watchdog's renewals of a batch are one pipeline
///   and one script call on one primary; on Valkey 8.1 or newer a lock
///   without fencing is renewed with `SET … IFEQ`, no script (the server is
///   read at connect, `INFO server`);
/// * a lock `orders:42` lives at `trl:{orders:170}:42:lock` and its release
///   channel is `trl:{orders:170}:42:released`, where `170` is the lock's
///   fencing bucket (one of 1,024 per namespace, from a hash of the key); its
///   fencing counter is the bucket's, `trl:{orders:170}:fence`, shared by the
///   ids of the bucket. All names of a lock share one hash tag, and nothing
///   is left in Redis per id once its lock is released (the counters are at
///   most 1,024 per namespace, each expiring after the fence retention);
/// * commands go over one multiplexed connection, kept (opened from the
///   URL's client, or checked out of a `deadpool_redis::Pool` handed in: a
///   checkout per call would ping, doubling the round trips); a broken
///   connection is replaced;
/// * release notifications use one pub/sub connection per store, shared by
///   all waiters, when the store has a [`redis::Client`] for it
///   ([`from_url`](RedisStore::from_url) or
///   [`notifications`](RedisStoreBuilder::notifications)); without one,
///   waiters poll. A cluster (feature `cluster`) store always has one,
///   using sharded pub/sub;
/// * every call is bounded by the command timeout (default 2 s), so a Redis
///   that is down or frozen gives [`Error::Unavailable`], never a hang.
///
/// ```no_run
/// use tower_redis_lock::{Locker, RedisStore};
///
/// # fn main() -> Result<(), tower_redis_lock::ConfigError> {
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
    /// When the shared connection was opened: a cluster connection is
    /// replaced after a timeout only once it is a command timeout old.
    conn_opened: Mutex<Option<std::time::Instant>>,
    /// The server the shared connection found when it opened (one primary
    /// or Sentinel; `None` on a Cluster, or a server not named): which
    /// commands renewals may use (server.rs).
    server: Mutex<Option<server::Server>>,
    /// Held while a new connection is checked out, so a burst of requests
    /// after a disconnect opens one connection, not one each.
    connecting: tokio::sync::Mutex<()>,
    prefix: String,
    fence_retention_ms: u64,
    /// Whether grants mint fencing tokens (`RedisStoreBuilder::fencing`).
    fencing: bool,
    timeout: Duration,
    pubsub: Option<PubSubSource>,
    wait_replicas: Option<WaitReplicas>,
    /// Idle connections of their own for grants that `WAIT` (which blocks
    /// the connection it runs on; the shared one carries everybody's
    /// commands, renewals included).
    wait_conns: replicas::WaitConns,
    notifier: OnceLock<Notifier>,
    eviction_check: EvictionCheck,
    /// The last `maxmemory-policy` finding logged, so that a reconnect
    /// does not repeat it.
    eviction_reported: Mutex<Option<String>>,
    /// How often a cluster store reads the slot map afresh.
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    topology_refresh: Duration,
    /// Whether the slot-map refresh task was started.
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    refreshing: std::sync::atomic::AtomicBool,
    /// Whether a slot-map read started by a command timeout is under way
    /// (at most one at a time).
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    rereading: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.inner.prefix)
            .field("fence_retention_ms", &self.inner.fence_retention_ms)
            .field("fencing", &self.inner.fencing)
            .field("timeout", &self.inner.timeout)
            .field("notifications", &self.inner.pubsub.is_some())
            .field("topology", &self.inner.source.topology())
            .finish()
    }
}

impl RedisStore {
    /// How release scripts announce a release: sharded on a cluster (a
    /// plain PUBLISH there would be broadcast to every node).
    fn publish_command(&self) -> &'static str {
        if self.inner.source.is_cluster() {
            "SPUBLISH"
        } else {
            "PUBLISH"
        }
    }

    /// Test support: how many release channels the store's notifier keeps
    /// (subscribed or wanted) and the capacity of its map; `(0, 0)` before
    /// the first subscribe or without notifications.
    #[cfg(any(test, feature = "test-util"))]
    #[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
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

/// The longest expiry written to Redis: about 100 years, far below what
/// `PX` accepts (the server refuses an expiry past `i64::MAX` ms from now).
const MAX_PX: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// `d` in whole milliseconds for `PX`/`PEXPIRE`: at least 1, and at most
/// [`MAX_PX`] (a longer lease or retention is that long).
fn ms(d: Duration) -> u64 {
    (d.min(MAX_PX).as_millis() as u64).max(1)
}

impl RedisStore {
    /// The lock's release (release.lua).
    async fn release_lock(&self, key: &LockKey, owner: &OwnerToken) -> Result<bool, Error> {
        // Always the script, on every server. Valkey 9's `DELIFEQ` and
        // Redis 8.4's `DELEX … IFEQ` delete the lock alone if it is ours,
        // but a release must, in the same step, delete the waited-for mark
        // and publish only if there was one. Sent after the owner-checked delete, in a second
        // round trip or the same pipeline, the mark's `DEL` could come
        // after another owner took the lock and a waiter marked it: that
        // waiter's mark would be gone, and the next holder's release would
        // not wake it (it polls until the lease ends). Sent in one
        // `MULTI`, the mark's `DEL` would run even when the lock is not
        // ours. So neither command can release here.
        // The owner, and the flags on a Cluster only (release.lua).
        let args = [Argv::Str(owner.as_str()), Argv::Str("c")];
        let args = if self.inner.source.is_cluster() {
            &args[..]
        } else {
            &args[..1]
        };
        let call = ScriptCall::new(&RELEASE, &[self.name(key, LOCK)], args);
        let n: i64 = self
            .with_conn(Operation::Release, Some(key), |mut c| async move {
                call.invoke(&mut c).await
            })
            .await?;
        Ok(n == 1)
    }
}

impl LockStore for RedisStore {
    fn instance_id(&self) -> usize {
        Arc::as_ptr(&self.inner).cast::<()>() as usize
    }

    async fn check(&self) -> Result<(), Error> {
        RedisStore::check(self).await
    }

    fn supports(&self, _kind: LeaseKind) -> bool {
        true
    }

    async fn grant(&self, grant: Grant<'_>) -> Result<AcquireOutcome, Error> {
        let (key, owner, lease) = (grant.key, grant.owner, grant.lease);
        match &grant.ask {
            Ask::Lock { replay } => Ok(self
                .acquire_script(key, owner, lease, *replay, grant.label)
                .await?
                .0),
            Ask::Permit { permits } => {
                self.acquire_permit_script(key, owner, *permits, lease)
                    .await
            }
            Ask::Read => {
                self.acquire_rw_script(key, owner, (RwMode::Read, None), lease)
                    .await
            }
            Ask::Write { waiter } => {
                self.acquire_rw_script(key, owner, (RwMode::Write, waiter.as_ref()), lease)
                    .await
            }
        }
    }

    async fn renew(
        &self,
        kind: LeaseKind,
        key: &LockKey,
        owner: &OwnerToken,
        lease: Duration,
    ) -> Result<bool, Error> {
        match kind {
            LeaseKind::Lock => self.extend_lock(key, owner, lease).await,
            LeaseKind::Permit => self.extend_permit_script(key, owner, lease).await,
            LeaseKind::Read => self.extend_rw_script(key, owner, RwMode::Read, lease).await,
            LeaseKind::Write => {
                self.extend_rw_script(key, owner, RwMode::Write, lease)
                    .await
            }
            LeaseKind::WriterMark => self.renew_mark_script(key, owner, lease).await,
        }
    }

    async fn renew_many(&self, renewals: &[Renewal]) -> Vec<Result<bool, Error>> {
        if renewals.is_empty() {
            return Vec::new();
        }
        if self.inner.source.is_cluster() {
            // Keys of a batch live in many slots: send the renewals at once
            // on the cluster connection, which pipelines them per node. Each
            // answers for itself: a frozen node fails only its own keys.
            // Not grouped by slot into batch script calls: a namespace's
            // locks spread over 1,024 hash tags (one per fencing bucket),
            // so a batch of 512 leases of one namespace meets about 400
            // slots, 1.3 leases a slot, and a script call per slot would
            // save next to nothing.
            return futures_util::future::join_all(
                renewals
                    .iter()
                    .map(|r| self.renew(r.kind, &r.key, &r.owner, r.lease)),
            )
            .await;
        }
        // One primary: one pipeline, one script call per batch
        // (renew.rs).
        self.extend_batch(renewals).await
    }

    async fn release(
        &self,
        kind: LeaseKind,
        key: &LockKey,
        owner: &OwnerToken,
    ) -> Result<bool, Error> {
        match kind {
            LeaseKind::Lock => self.release_lock(key, owner).await,
            LeaseKind::Permit => self.release_permit_script(key, owner).await,
            LeaseKind::Read => self.release_rw_script(key, owner, RwMode::Read).await,
            LeaseKind::Write => self.release_rw_script(key, owner, RwMode::Write).await,
            LeaseKind::WriterMark => self.withdraw_writer_script(key, owner).await,
        }
    }

    async fn transfer(
        &self,
        key: &LockKey,
        from: &OwnerToken,
        to: &OwnerToken,
        lease: Duration,
    ) -> Result<bool, Error> {
        self.transfer_lock(key, from, to, lease).await
    }

    async fn subscribe(&self, key: &LockKey) -> Result<ReleaseWatch, Error> {
        match self.notifier() {
            Some(notifier) => notifier.subscribe(self.release_channel(key), key).await,
            None => Ok(ReleaseWatch::never()),
        }
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
        // Sized up front ("GET" and the name), as the scripts' commands are.
        let mut get = redis::Cmd::with_capacity(2, 3 + record_key.byte_len());
        get.arg("GET").arg(record_key);
        let raw: Option<Vec<u8>> = self
            .with_conn(Operation::Acquire, Some(key), |mut c| async move {
                get.query_async(&mut c).await
            })
            .await?;
        Ok(raw.map(Bytes::from))
    }

    async fn grant_all(
        &self,
        keys: &[LockKey],
        owner: &OwnerToken,
        lease: Duration,
        _label: Option<&HolderLabel>,
    ) -> Result<AcquireAllOutcome, Error> {
        self.acquire_all_keys(keys, owner, lease).await
    }

    async fn release_all(&self, keys: &[LockKey], owner: &OwnerToken) -> Result<Vec<bool>, Error> {
        self.release_all_keys(keys, owner).await
    }
}

impl OperatorStore for RedisStore {
    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, Error> {
        self.inspect_script(key).await
    }

    async fn list(
        &self,
        namespace: &str,
        cursor: &ListCursor,
        count: usize,
    ) -> Result<HolderPage, Error> {
        self.list_scan(namespace, cursor, count).await
    }

    async fn force_release(&self, key: &LockKey) -> Result<ForcedRelease, Error> {
        self.force_release_script(key).await
    }
}
