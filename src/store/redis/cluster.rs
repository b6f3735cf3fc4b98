//! The store on a Redis Cluster.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;

use super::RedisStore;
use super::notifier::PubSubSource;
use super::scripts::preloaded;
use super::source::{Conn, NodeTimeouts, Source};
use crate::error::{Chain, ConfigError, Error, Operation};
use crate::sync::lock;

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

/// Loads every script the store runs (see [`preloaded`]) on every primary
/// `conn` knows, each script's `SCRIPT LOAD` sent to all of them at once:
/// the first use of a script on a node pays no `NOSCRIPT` answer. The
/// primaries are the nodes the eviction check reads too, as every new
/// cluster connection does: a silent primary holds up both alike, within
/// the command timeout.
pub(super) async fn load_on_primaries(conn: &ClusterConnection) -> redis::RedisResult<()> {
    use redis::cluster_routing::{MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo};
    let loads = preloaded().map(|src| {
        let mut conn = conn.clone();
        let mut load = redis::cmd("SCRIPT");
        load.arg("LOAD").arg(src);
        let everywhere = RoutingInfo::MultiNode((
            MultipleNodeRoutingInfo::AllMasters,
            Some(ResponsePolicy::AllSucceeded),
        ));
        // (A node's refusal may come back as an error value, not an
        // error: taken out, so that it fails the load.)
        async move { conn.route_command(load, everywhere).await?.extract_error() }
    });
    futures_util::future::try_join_all(loads).await.map(drop)
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
    /// seed nodes), loads the scripts on its primaries and checks their
    /// eviction policy, within the
    /// command timeout, and puts it in place of the current one; calls
    /// meanwhile go on over the current one. On a failure the current one
    /// stays (and the next tick, or the next timeout, tries again).
    async fn refresh_slot_map(&self) {
        let Source::Cluster(client) = &self.inner.source else {
            return;
        };
        let open = async {
            let redis_err = |e| Error::from_redis(Operation::Connect, None, e);
            let conn = client.get_async_connection().await.map_err(redis_err)?;
            // A primary new since the last read (a replica promoted by a
            // failover, a node added) has none of the scripts yet.
            load_on_primaries(&conn).await.map_err(redis_err)?;
            let mut conn = Conn::Cluster(Box::new(conn));
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
