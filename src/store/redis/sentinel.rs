//! The store on a Redis Sentinel set: the primary they name, reached with
//! the data nodes' own settings ([`DataNodes`]).

use std::sync::Arc;

use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{IntoConnectionInfo, RedisResult, TlsMode};

use super::connection::Source;
use super::data_nodes::{DataNodes, NodeTls};
use super::notifier::PubSubSource;
use super::settings::Pending;
use super::{RedisStore, RedisStoreBuilder};
use crate::error::ConfigError;

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
    /// Consider [`wait_replicas`](RedisStoreBuilder::wait_replicas) to
    /// shrink the window in which a failover loses a fresh grant.
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

/// The Sentinel client, shared by the command, `WAIT` and notification
/// connections: each asks it for the primary.
pub(super) struct Sentinels(tokio::sync::Mutex<SentinelClient>);

impl Sentinels {
    /// A client for the primary the Sentinels name now, with the data
    /// nodes' settings.
    pub(super) async fn primary(&self) -> RedisResult<redis::Client> {
        self.0.lock().await.async_get_client().await
    }
}

/// The sources of a Sentinel store: the client asking `urls` for `master`,
/// connecting to the data nodes with `nodes`.
pub(super) fn sources(
    urls: &[String],
    master: &str,
    nodes: DataNodes,
) -> Result<(Source, Option<PubSubSource>), ConfigError> {
    let bad = |reason: String| ConfigError::new("sentinel_urls", reason);
    let infos = urls
        .iter()
        .map(|u| u.as_str().into_connection_info())
        .collect::<RedisResult<Vec<_>>>()
        .map_err(|e| bad(e.to_string()))?;
    let Some(first) = infos.first() else {
        return Err(bad("at least one Sentinel is required".into()));
    };
    let auth = |i: &redis::ConnectionInfo| {
        let s = i.redis_settings();
        (
            s.username().map(str::to_owned),
            s.password().map(str::to_owned),
        )
    };
    let (username, password) = auth(first);
    if infos
        .iter()
        .any(|i| auth(i) != (username.clone(), password.clone()))
    {
        return Err(bad(
            "every Sentinel URL must carry the same credentials".into()
        ));
    }
    let nodes = nodes.resolve(first)?;

    let mut builder = SentinelClientBuilder::new(
        infos.iter().map(|i| i.addr().clone()),
        master,
        SentinelServerType::Master,
    )
    .map_err(|e| bad(e.to_string()))?
    .set_client_to_redis_db(nodes.database);
    if let Some(u) = &username {
        builder = builder.set_client_to_sentinel_username(u);
    }
    if let Some(p) = &password {
        builder = builder.set_client_to_sentinel_password(p);
    }
    if let Some(u) = &nodes.username {
        builder = builder.set_client_to_redis_username(u);
    }
    if let Some(p) = &nodes.password {
        builder = builder.set_client_to_redis_password(p);
    }
    match nodes.tls {
        NodeTls::Off => {}
        NodeTls::Verified => builder = builder.set_client_to_redis_tls_mode(TlsMode::Secure),
        NodeTls::Insecure => builder = builder.set_client_to_redis_tls_mode(TlsMode::Insecure),
    }
    #[cfg(feature = "tls-rustls")]
    if let Some(pem) = nodes.root_certificates {
        builder = builder.set_client_to_redis_certificates(redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(pem),
        });
    }
    let client = builder.build().map_err(|e| bad(e.to_string()))?;
    let shared = Arc::new(Sentinels(tokio::sync::Mutex::new(client)));
    Ok((
        Source::Sentinel(shared.clone()),
        Some(PubSubSource::Sentinel(shared)),
    ))
}
