//! The store on a Redis Sentinel set: the primary they name.

use std::sync::Arc;

use super::connection::Source;
use super::notifier::PubSubSource;
use super::{RedisStore, RedisStoreBuilder};
use crate::error::ConfigError;

impl RedisStore {
    /// A builder for a store on the primary that a set of Sentinels names
    /// for `master_name`, with release notifications. Connections are
    /// resolved through the Sentinels and re-resolved when one breaks, so
    /// new grants follow a failover; a holder whose renewals then find no
    /// key (the grant was not replicated) is told its lock is lost.
    ///
    /// Consider [`wait_replicas`](RedisStoreBuilder::wait_replicas) to
    /// shrink the window in which a failover loses a fresh grant.
    #[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
    pub fn sentinel_builder(sentinel_urls: &[&str], master_name: &str) -> RedisStoreBuilder {
        // (`String` satisfies both signatures of `build`, with and without
        // the client's TLS features.)
        let service = String::from(master_name);
        let source = redis::sentinel::SentinelClient::build(
            sentinel_urls.to_vec(),
            service,
            None,
            redis::sentinel::SentinelServerType::Master,
        )
        .map_err(|e| ConfigError::new("sentinel_urls", e.to_string()))
        .map(|client| {
            let shared = Arc::new(tokio::sync::Mutex::new(client));
            (
                Source::Sentinel(shared.clone()),
                Some(PubSubSource::Sentinel(shared)),
            )
        });
        RedisStoreBuilder::over(source)
    }

    /// A store with the defaults on the primary that the Sentinels name:
    /// `sentinel_builder(..).build()`.
    #[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
    pub fn sentinel(sentinel_urls: &[&str], master_name: &str) -> Result<Self, ConfigError> {
        Self::sentinel_builder(sentinel_urls, master_name).build()
    }
}
