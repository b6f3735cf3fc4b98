//! The store on a Redis Cluster.

use super::connection::Source;
use super::notifier::PubSubSource;
use super::{RedisStore, RedisStoreBuilder};
use crate::error::ConfigError;

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
    pub fn cluster_builder(node_urls: &[&str]) -> RedisStoreBuilder {
        let source = redis::cluster::ClusterClient::new(node_urls.to_vec())
            .map_err(|e| ConfigError::new("cluster_urls", e.to_string()))
            .map(|client| {
                let nodes = node_urls.iter().map(|u| u.to_string()).collect();
                (
                    Source::Cluster(Box::new(client)),
                    Some(PubSubSource::Cluster(nodes)),
                )
            });
        RedisStoreBuilder::over(source)
    }

    /// A store with the defaults on a Redis Cluster:
    /// `cluster_builder(..).build()`.
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    pub fn cluster(node_urls: &[&str]) -> Result<Self, ConfigError> {
        Self::cluster_builder(node_urls).build()
    }
}
