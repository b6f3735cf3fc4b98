//! The store on a Redis Sentinel set: the primary they name, reached with
//! the data nodes' own settings ([`DataNodes`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{IntoConnectionInfo, RedisResult, TlsMode};

use super::connection::Source;
use super::data_nodes::{DataNodes, NodeTls, Resolved};
use super::notifier::PubSubSource;
use super::settings::Pending;
use super::{Inner, RedisStore, RedisStoreBuilder};
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
    /// A failover is also followed as soon as a Sentinel announces it
    /// (`+switch-master`). Consider
    /// [`wait_replicas`](RedisStoreBuilder::wait_replicas) (or
    /// [`wait_aof`](RedisStoreBuilder::wait_aof)) so that a grant a
    /// failover could lose is refused rather than acknowledged.
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

impl Sentinels {
    /// Starts watching every Sentinel for `+switch-master` on this
    /// store's primary, once (on the first connection; it needs the
    /// runtime). On the event the store drops its connections, so the
    /// next call asks the Sentinels for the primary again, and its
    /// notification connection subscribes again on the new primary (its
    /// waiters woken to try at once): new grants, renewals and wake-ups
    /// follow a failover when the Sentinels announce it, not when the old
    /// primary is demoted (seconds later).
    pub(super) fn watch(&self, store: &Arc<Inner>) {
        if self.watching.swap(true, Ordering::AcqRel) {
            return;
        }
        for info in &self.infos {
            let task = watch_one(
                Arc::downgrade(store),
                info.clone(),
                self.master.clone(),
                store.timeout,
            );
            tokio::spawn(task);
        }
    }
}

/// How often a watch looks whether its store is gone, and how long it
/// waits before subscribing again after a Sentinel failed it.
const WATCH_PERIOD: Duration = Duration::from_secs(1);

/// Subscribes to `+switch-master` on one Sentinel, again whenever the
/// subscription breaks, until the store is dropped; on a switch of
/// `master`, the store forgets its connections.
async fn watch_one(
    store: Weak<Inner>,
    sentinel: redis::ConnectionInfo,
    master: String,
    timeout: Duration,
) {
    // "<name> <old ip> <old port> <new ip> <new port>"
    let ours = format!("{master} ");
    while store.strong_count() > 0 {
        let subscribe = async {
            let client = redis::Client::open(sentinel.clone())?;
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe("+switch-master").await?;
            RedisResult::Ok(pubsub)
        };
        if let Ok(Ok(pubsub)) = tokio::time::timeout(timeout, subscribe).await {
            let mut events = pubsub.into_on_message();
            let mut tick = tokio::time::interval(WATCH_PERIOD);
            loop {
                tokio::select! {
                    event = events.next() => match event {
                        Some(m) => {
                            let payload: String = m.get_payload().unwrap_or_default();
                            if payload.starts_with(&ours) {
                                let Some(inner) = store.upgrade() else { return };
                                tracing::info!(%payload, "Sentinel switched the primary; reconnecting");
                                if let Some(notifier) = inner.notifier.get() {
                                    notifier.reconnect();
                                }
                                RedisStore { inner }.forget_connections();
                            }
                        }
                        None => break,
                    },
                    _ = tick.tick() => {
                        if store.strong_count() == 0 {
                            return;
                        }
                    }
                }
            }
        }
        tokio::time::sleep(WATCH_PERIOD).await;
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

    let clients = infos
        .iter()
        .map(|i| {
            let client = client(i.addr().clone(), master, &username, &password, &nodes)?;
            Ok(tokio::sync::Mutex::new(client))
        })
        .collect::<RedisResult<Vec<_>>>()
        .map_err(|e| bad(e.to_string()))?;
    let shared = Arc::new(Sentinels {
        clients,
        infos,
        master: master.to_owned(),
        watching: AtomicBool::new(false),
    });
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
    if nodes.root_certificates.is_some() || nodes.client_certificate.is_some() {
        builder = builder.set_client_to_redis_certificates(super::tls::certificates(
            nodes.root_certificates.as_deref(),
            nodes.client_certificate.as_ref(),
        ));
    }
    builder.build()
}
