//! The notifier's pub/sub connection: where it comes from, the reader
//! that wakes waiters on each message, and subscribe/unsubscribe on it.

#[cfg(any(feature = "sentinel", feature = "cluster"))]
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::PubSubSink;
#[cfg(feature = "cluster")]
use redis::cluster_async::ClusterConnection;
#[cfg(feature = "cluster")]
use redis::{PushInfo, PushKind, Value};
use redis::{RedisError, RedisResult};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::super::source::timeout_error;
use super::{Channels, wake};
use crate::error::{Error, Operation};
use crate::key::LockKey;
#[cfg(feature = "cluster")]
use crate::sync::lock;

/// Where the pub/sub connection comes from.
#[derive(Clone)]
pub(in crate::store::redis) enum PubSubSource {
    /// One server.
    Client(Box<redis::Client>),
    /// The primary the Sentinels name, asked again on every reconnect, so
    /// the connection follows a failover.
    #[cfg(feature = "sentinel")]
    Sentinel(Arc<crate::store::redis::sentinel_client::Sentinels>),
    /// A Redis Cluster, given some of its nodes: sharded pub/sub.
    #[cfg(feature = "cluster")]
    Cluster(Arc<[String]>, crate::store::redis::source::NodeTimeouts),
}

impl PubSubSource {
    /// Opens a connection whose reader feeds `feed`.
    pub(super) async fn open(&self, feed: Feed) -> RedisResult<Connection> {
        let client = match self {
            PubSubSource::Client(c) => (**c).clone(),
            #[cfg(feature = "sentinel")]
            PubSubSource::Sentinel(s) => s.primary().await?,
            #[cfg(feature = "cluster")]
            PubSubSource::Cluster(nodes, timeouts) => {
                // Pushes (messages, confirmations, disconnections) of every
                // node arrive on `pushes`; the client resubscribes a node's
                // channels when it reconnects to it.
                let (pushes, rx) = mpsc::unbounded_channel();
                let builder =
                    redis::cluster::ClusterClientBuilder::new(nodes.iter().map(String::as_str));
                let conn = timeouts
                    .apply(builder)
                    .use_protocol(redis::ProtocolVersion::RESP3)
                    .push_sender(pushes)
                    .build()?
                    .get_async_connection()
                    .await?;
                return Ok(Connection {
                    sub: Subscriber::Sharded(Box::new(conn)),
                    _reader: Reader(tokio::spawn(feed.read_pushes(rx))),
                });
            }
        };
        let (sink, stream) = client.get_async_pubsub().await?.split();
        Ok(Connection {
            sub: Subscriber::Plain(sink),
            _reader: Reader(tokio::spawn(feed.read_messages(stream))),
        })
    }
}

/// What a reader tells the task. Each carries the generation of its
/// connection; the task ignores those of connections it has replaced.
// Only a cluster reader reports dropped and stray subscriptions.
#[cfg_attr(not(feature = "cluster"), allow(dead_code))]
pub(super) enum Event {
    /// The connection is gone.
    Closed,
    /// The server dropped this subscription (its slot moved away), or, for
    /// `None`, a node connection broke and may have taken any of them:
    /// messages may have been missed.
    Dropped(Option<String>),
    /// The server confirmed a subscription nobody wants: one whose answer
    /// came too late, after its waiters had gone.
    Stray(String),
}

/// What a reader needs: the channels to wake and where to report.
pub(super) struct Feed {
    pub(super) channels: Channels,
    pub(super) events: mpsc::UnboundedSender<(u64, Event)>,
    pub(super) generation: u64,
}

impl Feed {
    fn report(&self, event: Event) {
        let _ = self.events.send((self.generation, event));
    }

    /// Reads a plain pub/sub connection.
    async fn read_messages(self, mut stream: redis::aio::PubSubStream) {
        while let Some(msg) = stream.next().await {
            wake(&self.channels, msg.get_channel_name());
        }
        self.report(Event::Closed);
    }

    /// A subscription was confirmed: ours, or the client's own after it
    /// reconnected to a node or followed a slot. A release may have been
    /// missed before it, so its waiters look again (after our own subscribe
    /// that is at worst one extra try).
    #[cfg(feature = "cluster")]
    fn confirmed(&self, channel: &str) {
        if !wake(&self.channels, channel) {
            self.report(Event::Stray(channel.to_owned()));
        }
    }

    /// Reads the pushes of a cluster connection.
    #[cfg(feature = "cluster")]
    async fn read_pushes(self, mut pushes: mpsc::UnboundedReceiver<PushInfo>) {
        while let Some(push) = pushes.recv().await {
            let channel = match push.data.first() {
                Some(Value::BulkString(name)) => std::str::from_utf8(name).ok(),
                _ => None,
            };
            match (push.kind, channel) {
                (PushKind::SMessage, Some(ch)) => {
                    wake(&self.channels, ch);
                }
                (PushKind::SSubscribe, Some(ch)) => self.confirmed(ch),
                // Ours (the channel is gone from the map then), or the
                // server's when the channel's slot moves to another node.
                (PushKind::SUnsubscribe, Some(ch)) if lock(&self.channels).contains_key(ch) => {
                    self.report(Event::Dropped(Some(ch.to_owned())));
                }
                (PushKind::Disconnection, _) => self.report(Event::Dropped(None)),
                _ => {}
            }
        }
        self.report(Event::Closed);
    }
}

/// Aborts the reader when the connection is replaced or the task ends.
struct Reader(JoinHandle<()>);

impl Drop for Reader {
    fn drop(&mut self) {
        self.0.abort();
    }
}

pub(super) struct Connection {
    pub(super) sub: Subscriber,
    _reader: Reader,
}

pub(super) enum Subscriber {
    Plain(PubSubSink),
    #[cfg(feature = "cluster")]
    Sharded(Box<ClusterConnection>),
}

/// Why a subscribe did not go through.
#[derive(Clone)]
pub(super) enum Failure {
    Redis(RedisError),
    Timeout,
}

impl Failure {
    pub(super) fn into_error(self, key: &LockKey, timeout: Duration) -> Error {
        match self {
            Failure::Redis(e) => Error::from_redis(Operation::Subscribe, Some(key), e),
            Failure::Timeout => timeout_error(Operation::Subscribe, Some(key), timeout),
        }
    }

    /// The server does not know the command: no (sharded) pub/sub there.
    pub(super) fn is_unsupported(&self) -> bool {
        matches!(self, Failure::Redis(e)
            if e.code() == Some("ERR")
                && e.detail().is_some_and(|d| d.starts_with("unknown command")))
    }
}

pub(super) async fn bounded<T>(
    timeout: Duration,
    work: impl Future<Output = RedisResult<T>>,
) -> Result<T, Failure> {
    match tokio::time::timeout(timeout, work).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(Failure::Redis(e)),
        Err(_) => Err(Failure::Timeout),
    }
}

impl Subscriber {
    /// Subscribes `channels`, answering for each.
    pub(super) async fn subscribe(
        &mut self,
        channels: &[String],
        timeout: Duration,
    ) -> Vec<Result<(), Failure>> {
        match self {
            Subscriber::Plain(sink) => {
                vec![bounded(timeout, sink.subscribe(channels)).await; channels.len()]
            }
            // One command per channel: each lives in its own lock's slot.
            #[cfg(feature = "cluster")]
            Subscriber::Sharded(conn) => {
                futures_util::future::join_all(channels.iter().map(|ch| {
                    let mut conn = (**conn).clone();
                    async move { bounded(timeout, conn.ssubscribe(ch)).await }
                }))
                .await
            }
        }
    }

    pub(super) async fn unsubscribe(
        &mut self,
        channels: &[String],
        timeout: Duration,
    ) -> Result<(), Failure> {
        match self {
            Subscriber::Plain(sink) => bounded(timeout, sink.unsubscribe(channels)).await,
            #[cfg(feature = "cluster")]
            Subscriber::Sharded(conn) => {
                futures_util::future::join_all(channels.iter().map(|ch| {
                    let mut conn = (**conn).clone();
                    async move { bounded(timeout, conn.sunsubscribe(ch)).await }
                }))
                .await
                .into_iter()
                .collect()
            }
        }
    }

    /// A cluster's sharded pub/sub connection.
    pub(super) fn is_sharded(&self) -> bool {
        match self {
            Subscriber::Plain(_) => false,
            #[cfg(feature = "cluster")]
            Subscriber::Sharded(_) => true,
        }
    }

    /// Whether the connection is kept after `failure`. A plain connection is
    /// dropped after any failed command (it may be half broken). A cluster
    /// connection repairs its node connections itself after an error, but
    /// not after a node that timed out or could not be reached: a frozen
    /// primary answers neither an error nor a redirect, so its slot map
    /// would keep sending that slot's subscriptions to the frozen process
    /// after its replica took over. Such a connection is made again at once
    /// (a fresh slot map) and the subscription tried once more on it (see
    /// `Task::subscribe`).
    pub(super) fn keep_after(&self, failure: &Failure) -> bool {
        match self {
            Subscriber::Plain(_) => {
                let _ = failure;
                false
            }
            #[cfg(feature = "cluster")]
            Subscriber::Sharded(_) => match failure {
                Failure::Timeout => false,
                // (A node that does not answer in time, or cannot be
                // reached, as its own connection reports it.)
                Failure::Redis(e) => {
                    !(e.is_timeout() || e.is_io_error() || e.is_connection_dropped())
                }
            },
        }
    }
}
