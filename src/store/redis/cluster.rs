//! The store on a Redis Cluster.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use redis::cluster::{ClusterClient, ClusterClientBuilder};

use super::connection::{Conn, Source};
use super::notifier::PubSubSource;
use super::settings::Pending;
use super::{RedisStore, RedisStoreBuilder};
use crate::error::{Chain, ConfigError, Error, Operation};
use crate::sync::lock;

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
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    ///
    /// Every node connection has a response timeout of a quarter of the
    /// command timeout: a frozen node costs the calls on its own slots, and
    /// a slot-map refresh (after a MOVED reply, say) that asks it ends
    /// within that bound instead of holding every slot behind it.
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

/// The bounds on every connection a cluster store opens to a node.
#[derive(Clone, Copy, Debug)]
pub(super) struct NodeTimeouts {
    /// How long a node may take to answer one request (or to accept a
    /// connection): a quarter of the command timeout, so that a slot-map
    /// refresh that meets a frozen node (a ping, a reconnect) ends well
    /// within one command timeout.
    per_node: Duration,
}

impl NodeTimeouts {
    pub(super) fn new(command_timeout: Duration) -> Self {
        NodeTimeouts {
            per_node: (command_timeout / 4).max(Duration::from_millis(1)),
        }
    }

    /// The settings of a cluster connection of its own for grants that
    /// wait for replicas: a node may take `bound` to answer (the `WAIT`
    /// after a grant blocks until its timeout when replicas lag), and as
    /// long as any other to accept a connection.
    pub(super) fn for_waits(self, bound: Duration) -> redis::cluster::ClusterConfig {
        redis::cluster::ClusterConfig::new()
            .set_connection_timeout(self.per_node)
            .set_response_timeout(bound)
    }

    /// `builder` with these bounds. No overall bound of the client's own:
    /// the store's command timeout bounds every call (redirects included).
    pub(super) fn apply(self, builder: ClusterClientBuilder) -> ClusterClientBuilder {
        builder
            .response_timeout(self.per_node)
            .connection_timeout(self.per_node)
            .overall_response_timeout(None)
    }
}

/// The sources of a cluster store given some of its nodes.
pub(super) fn sources(
    urls: Vec<String>,
    command_timeout: Duration,
) -> Result<(Source, Option<PubSubSource>), ConfigError> {
    for url in &urls {
        super::tls::check_url("cluster_urls", url)?;
    }
    let timeouts = NodeTimeouts::new(command_timeout);
    let client: ClusterClient = timeouts
        .apply(ClusterClientBuilder::new(urls.iter().map(String::as_str)))
        .build()
        .map_err(|e| ConfigError::new("cluster_urls", e.to_string()))?;
    let nodes: Arc<[String]> = urls.into();
    Ok((
        Source::Cluster(Box::new(client)),
        Some(PubSubSource::Cluster(nodes, timeouts)),
    ))
}

impl RedisStore {
    /// When the store's current cluster connection was opened (and its
    /// slot map read), if it has one. A test hook, not part of the stable
    /// API.
    #[cfg(any(test, feature = "test-util"))]
    #[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
    pub fn slot_map_read_at(&self) -> Option<std::time::Instant> {
        *lock(&self.inner.conn_opened)
    }

    /// Starts, once per store, the task that reads the slot map afresh
    /// every `topology_refresh` (see
    /// [`RedisStoreBuilder::topology_refresh`]): an idle store follows a
    /// failover too. The task holds the store weakly, and ends with it.
    pub(super) fn keep_slot_map_fresh(&self) {
        if !self.inner.source.is_cluster() || self.inner.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let store = Arc::downgrade(&self.inner);
        let every = self.inner.topology_refresh;
        tokio::spawn(async move {
            let start = tokio::time::Instant::now() + every;
            let mut tick = tokio::time::interval_at(start, every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(inner) = store.upgrade() else {
                    return;
                };
                RedisStore { inner }.refresh_slot_map().await;
            }
        });
    }

    /// Reads the slot map afresh in the background after a command timed
    /// out (see [`RedisStore::bounded`]); one such read at a time.
    pub(super) fn reread_slot_map(&self) {
        if self.inner.rereading.swap(true, Ordering::AcqRel) {
            return;
        }
        /// Lowers the flag however the read ends (its task dropped with
        /// its runtime included), so that a later timeout reads again.
        struct Done(RedisStore);
        impl Drop for Done {
            fn drop(&mut self) {
                self.0.inner.rereading.store(false, Ordering::Release);
            }
        }
        let done = Done(self.clone());
        tokio::spawn(async move {
            done.0.refresh_slot_map().await;
            drop(done);
        });
    }

    /// Opens a new cluster connection (which reads the slot map from the
    /// seed nodes) and checks its primaries' eviction policy, within the
    /// command timeout, and puts it in place of the current one; calls
    /// meanwhile go on over the current one. On a failure the current one
    /// stays (and the next tick, or the next timeout, tries again).
    async fn refresh_slot_map(&self) {
        let Source::Cluster(client) = &self.inner.source else {
            return;
        };
        let open = async {
            let mut conn = Conn::Cluster(Box::new(
                client
                    .get_async_connection()
                    .await
                    .map_err(|e| Error::from_redis(Operation::Connect, None, e))?,
            ));
            self.check_eviction(&mut conn, Operation::Connect, None)
                .await?;
            Ok::<_, Error>(conn)
        };
        match tokio::time::timeout(self.inner.timeout, open).await {
            Ok(Ok(conn)) => {
                *lock(&self.inner.conn) = Some(conn);
                *lock(&self.inner.conn_opened) = Some(std::time::Instant::now());
            }
            Ok(Err(e)) => tracing::debug!(error = %Chain(&e), "slot map refresh failed"),
            Err(_) => tracing::debug!("slot map refresh timed out"),
        }
    }
}
