//! Release notifications: one pub/sub connection per store, one task that
//! owns it.
//!
//! Waiters ask the task for a subscription and get a watch receiver once the
//! server has confirmed it; a reader task bumps the channel's counter on
//! every message. Channels are reference-counted by their live receivers and
//! unsubscribed when the last waiter leaves.
//!
//! The connection is either a plain pub/sub connection (`SUBSCRIBE` on one
//! primary, found through Sentinel where there is one) or a RESP3 cluster
//! connection doing sharded pub/sub (`SSUBSCRIBE`, Redis 7): each release
//! channel is subscribed on the node that owns its slot, and the cluster
//! client follows the slot when it moves. Both are driven by the same task.
//!
//! Whenever messages may have been lost — the connection broke, a node
//! connection broke, the server dropped a subscription (a slot moved away),
//! a subscription was confirmed again — every affected waiter is woken so
//! that it tries the lock again, and lost subscriptions are renewed (with a
//! backoff while that fails) and their waiters woken once more when they are
//! back. A server that rejects the subscribe command turns notifications off
//! for the store (logged once): waiters poll.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::PubSubSink;
use redis::cluster_async::ClusterConnection;
use redis::{PushInfo, PushKind, RedisError, RedisResult, Value};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{lock, timeout_error};
use crate::store::ReleaseWatch;
use crate::{Error, LockKey, Operation};

/// First wait before subscriptions that could not be renewed are tried
/// again; doubles up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(5);

/// Where the pub/sub connection comes from.
#[derive(Clone)]
pub(super) enum PubSubSource {
    /// One server.
    Client(Box<redis::Client>),
    /// The primary the Sentinels name, asked again on every reconnect, so
    /// the connection follows a failover.
    Sentinel(Arc<tokio::sync::Mutex<redis::sentinel::SentinelClient>>),
    /// A Redis Cluster, given some of its nodes: sharded pub/sub.
    Cluster(Arc<[String]>),
}

impl PubSubSource {
    /// Opens a connection whose reader feeds `feed`.
    async fn open(&self, feed: Feed) -> RedisResult<Connection> {
        let client = match self {
            PubSubSource::Client(c) => (**c).clone(),
            PubSubSource::Sentinel(s) => s.lock().await.async_get_client().await?,
            PubSubSource::Cluster(nodes) => {
                // Pushes (messages, confirmations, disconnections) of every
                // node arrive on `pushes`; the client resubscribes a node's
                // channels when it reconnects to it.
                let (pushes, rx) = mpsc::unbounded_channel();
                let conn =
                    redis::cluster::ClusterClientBuilder::new(nodes.iter().map(String::as_str))
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

pub(super) struct Notifier {
    cmds: mpsc::UnboundedSender<Cmd>,
    channels: Channels,
}

enum Cmd {
    Subscribe(String, LockKey, oneshot::Sender<Answer>),
    Unsubscribe(String),
}

/// A waiter's answer: the channel's counter, or `None` when the server has
/// no pub/sub for us (waiters poll).
type Answer = Result<Option<Subscription>, Error>;

/// A subscription handed to a waiter. It carries its own unsubscribe
/// guard from the moment it is sent, so a waiter that leaves after the
/// answer was sent but before it read it (the answer is dropped unread in
/// the oneshot) still gives the channel back.
struct Subscription {
    // Dropped before the guard: the task must find no receiver left.
    rx: watch::Receiver<u64>,
    guard: Unsubscribe,
}

impl Notifier {
    pub(super) fn spawn(source: PubSubSource, timeout: Duration) -> Notifier {
        let (cmds, cmds_rx) = mpsc::unbounded_channel();
        let (events, events_rx) = mpsc::unbounded_channel();
        let channels: Channels = Arc::default();
        let task = Task {
            source,
            timeout,
            cmds: cmds.downgrade(),
            channels: channels.clone(),
            conn: None,
            generation: 0,
            events,
            retry_at: None,
            backoff: RETRY_FIRST,
            polling: false,
        };
        tokio::spawn(task.run(cmds_rx, events_rx));
        Notifier { cmds, channels }
    }

    /// How many channels the notifier keeps (subscribed, or wanted), and
    /// the capacity of its map.
    pub(super) fn channels(&self) -> (usize, usize) {
        let map = lock(&self.channels);
        (map.len(), map.capacity())
    }

    /// Subscribes to `channel`, `key`'s release channel; answers once the
    /// subscription is in force.
    pub(super) async fn subscribe(
        &self,
        channel: String,
        key: &LockKey,
    ) -> Result<ReleaseWatch, Error> {
        let (reply, answer) = oneshot::channel();
        self.cmds
            .send(Cmd::Subscribe(channel.clone(), key.clone(), reply))
            .map_err(|_| notifier_gone(key))?;
        match answer.await.map_err(|_| notifier_gone(key))?? {
            Some(Subscription { rx, guard }) => Ok(ReleaseWatch::new(rx).with_guard(guard)),
            None => Ok(ReleaseWatch::never()),
        }
    }
}

fn notifier_gone(key: &LockKey) -> Error {
    Error::Unavailable {
        op: Operation::Subscribe,
        key: Some(key.clone()),
        source: "the notification task has stopped".into(),
    }
}

struct Unsubscribe {
    cmds: mpsc::UnboundedSender<Cmd>,
    channel: Option<String>,
}

impl Drop for Unsubscribe {
    fn drop(&mut self) {
        if let Some(ch) = self.channel.take() {
            let _ = self.cmds.send(Cmd::Unsubscribe(ch));
        }
    }
}

struct Channel {
    tx: watch::Sender<u64>,
    state: State,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Not on the server yet.
    New,
    /// Subscribed.
    Live,
    /// Was subscribed, then dropped; its waiters were woken, and are woken
    /// again once it is back.
    Lost,
}

type Channels = Arc<Mutex<HashMap<String, Channel>>>;

/// Wakes the channel's waiters; false if nobody waits on it.
fn wake(channels: &Channels, name: &str) -> bool {
    match lock(channels).get(name) {
        Some(ch) => {
            ch.tx.send_modify(|n| *n = n.wrapping_add(1));
            true
        }
        None => false,
    }
}

/// Gives memory back after a burst of distinct keys: the map keeps at
/// most four times the room its channels need.
fn shrink(map: &mut HashMap<String, Channel>) {
    if map.capacity() > 64 && map.len() * 4 < map.capacity() {
        map.shrink_to(map.len() * 2);
    }
}

/// What a reader tells the task. Each carries the generation of its
/// connection; the task ignores those of connections it has replaced.
enum Event {
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
struct Feed {
    channels: Channels,
    events: mpsc::UnboundedSender<(u64, Event)>,
    generation: u64,
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
    fn confirmed(&self, channel: &str) {
        if !wake(&self.channels, channel) {
            self.report(Event::Stray(channel.to_owned()));
        }
    }

    /// Reads the pushes of a cluster connection.
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

struct Connection {
    sub: Subscriber,
    _reader: Reader,
}

enum Subscriber {
    Plain(PubSubSink),
    Sharded(Box<ClusterConnection>),
}

/// Why a subscribe did not go through.
#[derive(Clone)]
enum Failure {
    Redis(RedisError),
    Timeout,
}

impl Failure {
    fn into_error(self, key: &LockKey, timeout: Duration) -> Error {
        match self {
            Failure::Redis(e) => Error::from_redis(Operation::Subscribe, Some(key), e),
            Failure::Timeout => timeout_error(Operation::Subscribe, Some(key), timeout),
        }
    }

    /// The server does not know the command: no (sharded) pub/sub there.
    fn is_unsupported(&self) -> bool {
        matches!(self, Failure::Redis(e)
            if e.code() == Some("ERR")
                && e.detail().is_some_and(|d| d.starts_with("unknown command")))
    }
}

async fn bounded<T>(
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
    async fn subscribe(
        &mut self,
        channels: &[String],
        timeout: Duration,
    ) -> Vec<Result<(), Failure>> {
        match self {
            Subscriber::Plain(sink) => {
                vec![bounded(timeout, sink.subscribe(channels)).await; channels.len()]
            }
            // One command per channel: each lives in its own lock's slot.
            Subscriber::Sharded(conn) => {
                futures_util::future::join_all(channels.iter().map(|ch| {
                    let mut conn = (**conn).clone();
                    async move { bounded(timeout, conn.ssubscribe(ch)).await }
                }))
                .await
            }
        }
    }

    async fn unsubscribe(&mut self, channels: &[String], timeout: Duration) -> Result<(), Failure> {
        match self {
            Subscriber::Plain(sink) => bounded(timeout, sink.unsubscribe(channels)).await,
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

    /// A plain connection is dropped after a failed command (it may be half
    /// broken); a cluster connection repairs its node connections itself.
    fn keep_after_failure(&self) -> bool {
        matches!(self, Subscriber::Sharded(_))
    }
}

/// A subscribe that waits for the task's answer.
struct Waiter {
    channel: String,
    key: LockKey,
    rx: watch::Receiver<u64>,
    reply: oneshot::Sender<Answer>,
}

struct Task {
    source: PubSubSource,
    timeout: Duration,
    /// For the unsubscribe guards of answers (weak: the task ends when the
    /// store's notifier is dropped).
    cmds: mpsc::WeakUnboundedSender<Cmd>,
    channels: Channels,
    conn: Option<Connection>,
    /// Of `conn`; events of older connections are stale.
    generation: u64,
    events: mpsc::UnboundedSender<(u64, Event)>,
    /// When to try again the subscriptions that are wanted but not live.
    retry_at: Option<Instant>,
    backoff: Duration,
    /// The server has no pub/sub for us: answer every subscribe with "poll".
    polling: bool,
}

impl Task {
    async fn run(
        mut self,
        mut cmds: mpsc::UnboundedReceiver<Cmd>,
        mut events: mpsc::UnboundedReceiver<(u64, Event)>,
    ) {
        loop {
            let mut batch = Vec::new();
            let mut happened = Vec::new();
            let retry_at = self.retry_at;
            let retry = async move {
                match retry_at {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                cmd = cmds.recv() => match cmd {
                    Some(cmd) => batch.push(cmd),
                    None => return,
                },
                Some(event) = events.recv() => happened.push(event),
                () = retry => self.retry_at = None,
            }
            while let Ok(event) = events.try_recv() {
                happened.push(event);
            }
            while let Ok(cmd) = cmds.try_recv() {
                batch.push(cmd);
            }
            for (generation, event) in happened {
                if generation == self.generation {
                    self.on_event(event).await;
                }
            }
            let waiters = self.on_commands(batch).await;
            self.subscribe(waiters).await;
        }
    }

    async fn on_event(&mut self, event: Event) {
        match event {
            Event::Closed => self.close(),
            Event::Dropped(None) => self.lose(|_| true),
            Event::Dropped(Some(name)) => self.lose(|ch| ch == name),
            Event::Stray(name) => {
                if !lock(&self.channels).contains_key(&name)
                    && let Some(c) = &mut self.conn
                {
                    let _ = c.sub.unsubscribe(&[name], self.timeout).await;
                }
            }
        }
    }

    /// Live subscriptions for which `which` holds may be gone: wake their
    /// waiters, and have them subscribed again.
    fn lose(&mut self, which: impl Fn(&str) -> bool) {
        for (name, ch) in lock(&self.channels).iter_mut() {
            if ch.state == State::Live && which(name) {
                ch.state = State::Lost;
                ch.tx.send_modify(|n| *n = n.wrapping_add(1));
            }
        }
    }

    /// Drops the connection: every subscription is lost.
    fn close(&mut self) {
        if self.conn.take().is_some() {
            tracing::debug!("release notification connection lost");
        }
        self.lose(|_| true);
    }

    /// Registers new subscribes (answered by [`Task::subscribe`]) and
    /// unsubscribes channels nobody waits on any more.
    async fn on_commands(&mut self, batch: Vec<Cmd>) -> Vec<Waiter> {
        let mut waiters = Vec::new();
        let mut left = Vec::new();
        {
            let mut map = lock(&self.channels);
            for cmd in batch {
                match cmd {
                    Cmd::Subscribe(channel, key, reply) => {
                        if self.polling {
                            let _ = reply.send(Ok(None));
                            continue;
                        }
                        let entry = map.entry(channel.clone()).or_insert_with(|| Channel {
                            tx: watch::channel(0).0,
                            state: State::New,
                        });
                        let rx = entry.tx.subscribe();
                        waiters.push(Waiter {
                            channel,
                            key,
                            rx,
                            reply,
                        });
                    }
                    Cmd::Unsubscribe(channel) => left.push(channel),
                }
            }
        }
        self.forget(left).await;
        waiters
    }

    /// Of `channels`, forgets those nobody waits on, unsubscribing the live
    /// ones.
    async fn forget(&mut self, channels: Vec<String>) {
        let mut gone = Vec::new();
        {
            let mut map = lock(&self.channels);
            for channel in channels {
                if map
                    .get(&channel)
                    .is_some_and(|c| c.tx.receiver_count() == 0)
                    && let Some(c) = map.remove(&channel)
                    && c.state == State::Live
                {
                    gone.push(channel);
                }
            }
            shrink(&mut map);
        }
        if let Some(c) = &mut self.conn
            && !gone.is_empty()
            && c.sub.unsubscribe(&gone, self.timeout).await.is_err()
            && !c.sub.keep_after_failure()
        {
            self.close();
        }
    }

    /// Subscribes every channel that someone waits on and that is not live
    /// (new ones, and lost ones), then answers `waiters`.
    async fn subscribe(&mut self, waiters: Vec<Waiter>) {
        let wanted: Vec<String> = lock(&self.channels)
            .iter()
            .filter(|(_, c)| c.state != State::Live && c.tx.receiver_count() > 0)
            .map(|(name, _)| name.clone())
            .collect();
        let mut failed: HashMap<String, Failure> = HashMap::new();
        let mut all_failed = None;
        if !wanted.is_empty() && !self.polling {
            if self.conn.is_none() {
                all_failed = self.connect().await.err();
            }
            if let Some(c) = &mut self.conn {
                let outcomes = c.sub.subscribe(&wanted, self.timeout).await;
                let mut map = lock(&self.channels);
                for (name, outcome) in wanted.iter().zip(outcomes) {
                    match (outcome, map.get_mut(name)) {
                        (Ok(()), Some(ch)) => {
                            if ch.state == State::Lost {
                                ch.tx.send_modify(|n| *n = n.wrapping_add(1));
                            }
                            ch.state = State::Live;
                        }
                        (Ok(()), None) => {}
                        (Err(f), _) => {
                            failed.insert(name.clone(), f);
                        }
                    }
                }
            }
            let keep = self
                .conn
                .as_ref()
                .is_some_and(|c| c.sub.keep_after_failure());
            if let Some(why) = all_failed
                .iter()
                .chain(failed.values())
                .find(|f| f.is_unsupported())
            {
                let why = why.clone();
                self.fall_back_to_polling(&why);
            } else if !failed.is_empty() && !keep {
                self.close();
            }
        }
        let mut gave_up = Vec::new();
        for w in waiters {
            let answer = if self.polling {
                Ok(None)
            } else {
                match (
                    all_failed.as_ref().or(failed.get(&w.channel)),
                    self.cmds.upgrade(),
                ) {
                    (Some(f), _) => Err(f.clone().into_error(&w.key, self.timeout)),
                    (None, Some(cmds)) => Ok(Some(Subscription {
                        rx: w.rx,
                        guard: Unsubscribe {
                            cmds,
                            channel: Some(w.channel.clone()),
                        },
                    })),
                    // The store is gone: nobody can wait any more.
                    (None, None) => Err(Error::Unavailable {
                        op: Operation::Subscribe,
                        key: Some(w.key.clone()),
                        source: "the store was dropped".into(),
                    }),
                }
            };
            // A waiter gone before its answer: the answer comes back and is
            // dropped here, its guard (if any) unsubscribing; the channel is
            // also forgotten directly, in case the answer had no guard.
            if let Err(answer) = w.reply.send(answer) {
                let had_guard = matches!(answer, Ok(Some(_)));
                drop(answer);
                if !had_guard {
                    gave_up.push(w.channel);
                }
            }
        }
        // Waiters that left before their answer came take no guard along.
        self.forget(gave_up).await;
        let mut map = lock(&self.channels);
        // Channels whose only would-be waiters were just refused.
        map.retain(|_, c| c.state == State::Live || c.tx.receiver_count() > 0);
        shrink(&mut map);
        // Lost ones that someone still waits on are tried again later.
        if map.values().any(|c| c.state != State::Live) {
            self.retry_at = Some(Instant::now() + self.backoff);
            self.backoff = (self.backoff * 2).min(RETRY_MAX);
        } else {
            self.retry_at = None;
            self.backoff = RETRY_FIRST;
        }
    }

    async fn connect(&mut self) -> Result<(), Failure> {
        self.generation += 1;
        let feed = Feed {
            channels: self.channels.clone(),
            events: self.events.clone(),
            generation: self.generation,
        };
        self.conn = Some(bounded(self.timeout, self.source.open(feed)).await?);
        Ok(())
    }

    fn fall_back_to_polling(&mut self, why: &Failure) {
        let needs = match self.source {
            PubSubSource::Cluster(_) => "sharded pub/sub (SSUBSCRIBE, Redis 7)",
            _ => "pub/sub (SUBSCRIBE)",
        };
        let error = match why {
            Failure::Redis(e) => e.to_string(),
            Failure::Timeout => String::new(),
        };
        tracing::warn!(
            %error,
            "Redis does not offer {needs}: no release notifications, waiters poll"
        );
        self.polling = true;
        self.conn = None;
        self.retry_at = None;
        // Dropping the senders leaves current watches unable to fire.
        lock(&self.channels).clear();
    }
}
