//! The task that owns the notifier's connection: it subscribes what
//! waiters ask for, answers them once the server confirms, renews lost
//! subscriptions with a backoff, and falls back to polling where the server
//! has no pub/sub.

use std::collections::HashMap;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use super::connection::{Connection, Event, Failure, Feed, PubSubSource, bounded};
use super::{Answer, Channel, Channels, Cmd, State, Subscription, Unsubscribe, shrink};
use crate::error::{Error, Operation};
use crate::key::LockKey;
use crate::sync::lock;

/// First wait before subscriptions that could not be renewed are tried
/// again; doubles up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(5);

/// A subscribe that waits for the task's answer.
struct Waiter {
    channel: String,
    key: LockKey,
    rx: watch::Receiver<u64>,
    reply: oneshot::Sender<Answer>,
}

/// Starts the task for a notifier whose commands arrive on `cmds_rx`
/// (`cmds` is for the unsubscribe guards of answers).
pub(super) fn spawn(
    source: PubSubSource,
    timeout: Duration,
    cmds: mpsc::WeakUnboundedSender<Cmd>,
    channels: Channels,
    cmds_rx: mpsc::UnboundedReceiver<Cmd>,
) {
    let (events, events_rx) = mpsc::unbounded_channel();
    let task = Task {
        source,
        timeout,
        cmds,
        channels,
        conn: None,
        generation: 0,
        events,
        retry_at: None,
        backoff: RETRY_FIRST,
        polling: false,
    };
    tokio::spawn(task.run(cmds_rx, events_rx));
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
        let mut reconnect = false;
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
                    Cmd::Reconnect => reconnect = true,
                }
            }
        }
        if reconnect {
            self.close();
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
            && let Err(f) = c.sub.unsubscribe(&gone, self.timeout).await
            && !c.sub.keep_after(&f)
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
            self.try_subscribe(&wanted, &mut failed).await;
            // A cluster connection that found a node frozen or gone keeps
            // that node in its slot map (no error, no redirect tells it
            // otherwise): it is made again, with a fresh slot map, and the
            // failed channels tried once more on it.
            let remake = self.conn.as_ref().is_some_and(|c| {
                c.sub.is_sharded() && failed.values().any(|f| !c.sub.keep_after(f))
            });
            if remake {
                self.close();
                if self.connect().await.is_ok() {
                    let again: Vec<String> = failed.keys().cloned().collect();
                    failed.clear();
                    self.try_subscribe(&again, &mut failed).await;
                }
            }
            let keep = self
                .conn
                .as_ref()
                .is_some_and(|c| failed.values().all(|f| c.sub.keep_after(f)));
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

    /// Subscribes `wanted` on the connection (if any), marking each live or
    /// noting why it failed.
    async fn try_subscribe(&mut self, wanted: &[String], failed: &mut HashMap<String, Failure>) {
        let Some(c) = &mut self.conn else {
            return;
        };
        let outcomes = c.sub.subscribe(wanted, self.timeout).await;
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
            #[cfg(feature = "cluster")]
            PubSubSource::Cluster(..) => "sharded pub/sub (SSUBSCRIBE, Redis 7)",
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
