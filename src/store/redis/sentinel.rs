//! The store on a Redis Sentinel set: its connection sources (the primary
//! the Sentinels name, reached with the data nodes' own settings,
//! [`DataNodes`]) and the `+switch-master` watch. The client that asks the
//! Sentinels is `sentinel_client.rs`; the builder, `settings.rs`.

use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use redis::RedisResult;

use super::data_nodes::DataNodes;
use super::notifier::PubSubSource;
use super::sentinel_client::Sentinels;
use super::source::Source;
use super::{Inner, RedisStore};
use crate::error::ConfigError;

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
        let Some((sentinels, master)) = self.to_watch() else {
            return;
        };
        for info in sentinels {
            let task = watch_one(
                Arc::downgrade(store),
                info.clone(),
                master.to_owned(),
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

/// The sources of a Sentinel store: the client asking `urls` for `master`,
/// connecting to the data nodes with `nodes`.
pub(super) fn sources(
    urls: &[String],
    master: &str,
    nodes: DataNodes,
) -> Result<(Source, Option<PubSubSource>), ConfigError> {
    let shared = Sentinels::new(urls, master, nodes)?;
    Ok((
        Source::Sentinel(shared.clone()),
        Some(PubSubSource::Sentinel(shared)),
    ))
}
