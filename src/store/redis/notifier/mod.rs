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

use tokio::sync::{mpsc, oneshot, watch};

use crate::error::{Error, Operation};
use crate::key::LockKey;
use crate::store::ReleaseWatch;
use crate::sync::lock;

mod connection;
mod task;

pub(super) use connection::PubSubSource;

pub(super) struct Notifier {
    cmds: mpsc::UnboundedSender<Cmd>,
    /// (Read by the `test-util` hook `RedisStore::notification_channels`.)
    #[cfg_attr(not(any(test, feature = "test-util")), allow(dead_code))]
    channels: Channels,
}

pub(super) enum Cmd {
    Subscribe(String, LockKey, oneshot::Sender<Answer>),
    Unsubscribe(String),
    /// The primary changed (a Sentinel failover): drop the connection,
    /// wake every waiter and subscribe again where the source now points.
    #[cfg_attr(not(feature = "sentinel"), allow(dead_code))]
    Reconnect,
}

/// A waiter's answer: the channel's counter, or `None` when the server has
/// no pub/sub for us (waiters poll).
pub(super) type Answer = Result<Option<Subscription>, Error>;

/// A subscription handed to a waiter. It carries its own unsubscribe
/// guard from the moment it is sent, so a waiter that leaves after the
/// answer was sent but before it read it (the answer is dropped unread in
/// the oneshot) still gives the channel back.
pub(super) struct Subscription {
    // Dropped before the guard: the task must find no receiver left.
    pub(super) rx: watch::Receiver<u64>,
    pub(super) guard: Unsubscribe,
}

impl Notifier {
    pub(super) fn spawn(source: PubSubSource, timeout: Duration) -> Notifier {
        let (cmds, cmds_rx) = mpsc::unbounded_channel();
        let channels: Channels = Arc::default();
        task::spawn(source, timeout, cmds.downgrade(), channels.clone(), cmds_rx);
        Notifier { cmds, channels }
    }

    /// Has the connection made again (see [`Cmd::Reconnect`]).
    #[cfg(feature = "sentinel")]
    pub(super) fn reconnect(&self) {
        let _ = self.cmds.send(Cmd::Reconnect);
    }

    /// How many channels the notifier keeps (subscribed, or wanted), and
    /// the capacity of its map.
    #[cfg_attr(not(any(test, feature = "test-util")), allow(dead_code))]
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

pub(super) struct Unsubscribe {
    pub(super) cmds: mpsc::UnboundedSender<Cmd>,
    pub(super) channel: Option<String>,
}

impl Drop for Unsubscribe {
    fn drop(&mut self) {
        if let Some(ch) = self.channel.take() {
            let _ = self.cmds.send(Cmd::Unsubscribe(ch));
        }
    }
}

pub(super) struct Channel {
    pub(super) tx: watch::Sender<u64>,
    pub(super) state: State,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    /// Not on the server yet.
    New,
    /// Subscribed.
    Live,
    /// Was subscribed, then dropped; its waiters were woken, and are woken
    /// again once it is back.
    Lost,
}

pub(super) type Channels = Arc<Mutex<HashMap<String, Channel>>>;

/// Wakes the channel's waiters; false if nobody waits on it.
pub(super) fn wake(channels: &Channels, name: &str) -> bool {
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
pub(super) fn shrink(map: &mut HashMap<String, Channel>) {
    if map.capacity() > 64 && map.len() * 4 < map.capacity() {
        map.shrink_to(map.len() * 2);
    }
}
