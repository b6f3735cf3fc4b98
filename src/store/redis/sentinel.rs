//! The store on a Redis Sentinel set: the primary they name.

use std::sync::Arc;

use super::RedisStore;
use super::connection::Source;
use super::notifier::PubSubSource;
use crate::Error;
use crate::error::ConfigError;

impl RedisStore {
    /// A store on the primary that a set of Sentinels names for
    /// `master_name`, with release notifications. Connections are resolved
    /// through the Sentinels and re-resolved when one breaks, so new grants
    /// follow a failover; a holder whose renewals then find no key (the
    /// grant was not replicated) is told its lock is lost.
    ///
    /// Consider [`with_wait_replicas`](RedisStore::with_wait_replicas) to
    /// shrink the window in which a failover loses a fresh grant.
    #[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
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
}
