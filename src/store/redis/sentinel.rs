//! The store on a Redis Sentinel set: the primary they name, reached with
//! the data nodes' own settings ([`DataNodes`]).

use std::sync::Arc;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{IntoConnectionInfo, RedisResult, TlsMode};

use super::connection::Source;
use super::data_nodes::{DataNodes, NodeTls, Resolved};
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

/// One Sentinel client per Sentinel, shared by the command, `WAIT` and
/// notification connections: each asks them for the primary.
///
/// One client per Sentinel, not one client for all: redis-rs' client asks
/// its Sentinels concurrently but takes their answers in list order, each
/// after up to its own 500 ms response timeout, so a frozen first Sentinel
/// would hold every lookup for 500 ms, past a shorter command timeout.
/// Here the first Sentinel to name a primary that confirms
/// its role wins, whatever the list order; the caller's command timeout
/// bounds the lookup.
pub(super) struct Sentinels(Vec<tokio::sync::Mutex<SentinelClient>>);

impl Sentinels {
    /// A client for the primary the Sentinels name now, with the data
    /// nodes' settings: the first answer that names a primary (checked
    /// with `ROLE` by redis-rs) wins. If none does, the most telling error:
    /// one from the named primary (authentication, TLS) before a Sentinel
    /// that does not know the name, before one that cannot be reached.
    pub(super) async fn primary(&self) -> RedisResult<redis::Client> {
        let mut lookups: FuturesUnordered<_> = self
            .0
            .iter()
            .map(|s| async move { s.lock().await.async_get_client().await })
            .collect();
        let mut best: Option<redis::RedisError> = None;
        while let Some(lookup) = lookups.next().await {
            match lookup {
                Ok(client) => return Ok(client),
                Err(e) => {
                    if best.as_ref().is_none_or(|b| rank(&e) > rank(b)) {
                        best = Some(e);
                    }
                }
            }
        }
        // `sources` refuses an empty list, so there was at least one error.
        Err(best.unwrap_or_else(|| {
            redis::RedisError::from((redis::ErrorKind::InvalidClientConfig, "no Sentinel"))
        }))
    }
}

/// How much a failed lookup says: an answer from the named primary most,
/// then a Sentinel's answer, then no answer.
fn rank(e: &redis::RedisError) -> u8 {
    if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() {
        0
    } else if e.kind() == redis::ErrorKind::MasterNameNotFoundBySentinel {
        1
    } else {
        2
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

    let clients = infos
        .iter()
        .map(|i| {
            let client = client(i.addr().clone(), master, &username, &password, &nodes)?;
            Ok(tokio::sync::Mutex::new(client))
        })
        .collect::<RedisResult<Vec<_>>>()
        .map_err(|e| bad(e.to_string()))?;
    let shared = Arc::new(Sentinels(clients));
    Ok((
        Source::Sentinel(shared.clone()),
        Some(PubSubSource::Sentinel(shared)),
    ))
}

/// The client asking the Sentinel at `addr` for `master`.
fn client(
    addr: redis::ConnectionAddr,
    master: &str,
    username: &Option<String>,
    password: &Option<String>,
    nodes: &Resolved,
) -> RedisResult<SentinelClient> {
    let mut builder = SentinelClientBuilder::new([addr], master, SentinelServerType::Master)?
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
    if let Some(pem) = &nodes.root_certificates {
        builder = builder.set_client_to_redis_certificates(redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(pem.clone()),
        });
    }
    builder.build()
}
