//! The Sentinel client: one client per Sentinel, asked for the primary
//! concurrently. Below the connection sources and the notifier, which hold
//! it; the store's use of it (the sources, the `+switch-master` watch) is
//! in `sentinel.rs`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{IntoConnectionInfo, RedisResult, TlsMode};

use super::data_nodes::{DataNodes, NodeTls, Resolved};
use crate::error::ConfigError;

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
///
/// Each Sentinel is also watched for `+switch-master` on the store's
/// primary (see [`watch`](Sentinels::watch)): a failover that breaks no
/// connection (`SENTINEL FAILOVER`, a primary cut off from the Sentinels
/// but not from the store) leaves the old primary a primary for seconds,
/// until the Sentinels demote it, and without the event the store would
/// grant there all along.
pub(super) struct Sentinels {
    clients: Vec<tokio::sync::Mutex<SentinelClient>>,
    /// The Sentinels themselves (their credentials and TLS), for the watch.
    infos: Vec<redis::ConnectionInfo>,
    master: String,
    watching: AtomicBool,
    /// See `DataNodes::with_address_map`.
    #[cfg(any(test, feature = "test-util"))]
    address_map: super::data_nodes::AddressMap,
}

impl Sentinels {
    /// A client for the primary the Sentinels name now, with the data
    /// nodes' settings: the first answer that names a primary (checked
    /// with `ROLE` by redis-rs) wins. If none does, the most telling error:
    /// one from the named primary (authentication, TLS) before a Sentinel
    /// that does not know the name, before one that cannot be reached.
    pub(super) async fn primary(&self) -> RedisResult<redis::Client> {
        let mut lookups: FuturesUnordered<_> = self
            .clients
            .iter()
            .map(|s| async move { s.lock().await.async_get_client().await })
            .collect();
        let mut best: Option<redis::RedisError> = None;
        while let Some(lookup) = lookups.next().await {
            match lookup {
                Ok(client) => return self.mapped(client),
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

impl Sentinels {
    /// `client`, or one for the address it is mapped to (see
    /// `DataNodes::with_address_map`).
    fn mapped(&self, client: redis::Client) -> RedisResult<redis::Client> {
        #[cfg(any(test, feature = "test-util"))]
        if let redis::ConnectionAddr::Tcp(host, port) = client.get_connection_info().addr() {
            let to = self
                .address_map
                .iter()
                .find(|((h, p), _)| h == host && p == port);
            if let Some((_, (host, port))) = to {
                let info = client.get_connection_info().clone();
                return redis::Client::open(
                    info.set_addr(redis::ConnectionAddr::Tcp(host.clone(), *port)),
                );
            }
        }
        Ok(client)
    }
}

impl Sentinels {
    /// The clients asking `urls` for `master`, connecting to the data nodes
    /// with `nodes`. Refuses an empty list, URLs that do not parse or whose
    /// credentials differ.
    pub(super) fn new(
        urls: &[String],
        master: &str,
        nodes: DataNodes,
    ) -> Result<Arc<Self>, ConfigError> {
        let bad = |reason: String| ConfigError::new("sentinel_urls", reason);
        for url in urls {
            super::tls::check_url("sentinel_urls", url)?;
        }
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
        #[cfg(any(test, feature = "test-util"))]
        let address_map = nodes.address_map.clone();

        let clients = infos
            .iter()
            .map(|i| {
                let client = client(i.addr().clone(), master, &username, &password, &nodes)?;
                Ok(tokio::sync::Mutex::new(client))
            })
            .collect::<RedisResult<Vec<_>>>()
            .map_err(|e| bad(e.to_string()))?;
        Ok(Arc::new(Sentinels {
            clients,
            infos,
            master: master.to_owned(),
            watching: AtomicBool::new(false),
            #[cfg(any(test, feature = "test-util"))]
            address_map,
        }))
    }
}

impl Sentinels {
    /// The Sentinels to watch for `+switch-master` on `master`, the first
    /// time this is asked; `None` after.
    pub(super) fn to_watch(&self) -> Option<(&[redis::ConnectionInfo], &str)> {
        if self.watching.swap(true, Ordering::AcqRel) {
            return None;
        }
        Some((&self.infos, &self.master))
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
    if nodes.root_certificates.is_some() || nodes.client_certificate.is_some() {
        builder = builder.set_client_to_redis_certificates(super::tls::certificates(
            nodes.root_certificates.as_deref(),
            nodes.client_certificate.as_ref(),
        ));
    }
    builder.build()
}
