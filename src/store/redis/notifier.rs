//! Release notifications: one pub/sub connection per store, one task that
//! owns it. Waiters ask the task for a subscription and get a watch receiver
//! once SUBSCRIBE is confirmed; a reader task bumps the channel's counter on
//! every message. Channels are reference-counted by their live receivers and
//! unsubscribed when the last waiter leaves.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use redis::RedisError;
use redis::aio::PubSubSink;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use super::{lock, timeout_error};
use crate::store::ReleaseWatch;
use crate::{Error, LockKey, Operation};

/// Where the pub/sub connection comes from (re-resolved on reconnect, so it
/// follows a Sentinel failover).
#[derive(Clone)]
pub(super) enum PubSubSource {
    Client(Box<redis::Client>),
    Sentinel(Arc<tokio::sync::Mutex<redis::sentinel::SentinelClient>>),
}

impl PubSubSource {
    async fn client(&self) -> Result<redis::Client, RedisError> {
        match self {
            PubSubSource::Client(c) => Ok((**c).clone()),
            PubSubSource::Sentinel(s) => s.lock().await.async_get_client().await,
        }
    }
}

enum Cmd {
    Subscribe(
        String,
        LockKey,
        oneshot::Sender<Result<watch::Receiver<u64>, Error>>,
    ),
    Unsubscribe(String),
}

pub(super) struct Notifier {
    cmds: mpsc::UnboundedSender<Cmd>,
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
    on_server: bool,
}

type Channels = Arc<Mutex<HashMap<String, Channel>>>;

/// Aborts the reader when the connection is replaced or the task ends.
struct Reader(JoinHandle<()>);

impl Drop for Reader {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Notifier {
    pub(super) fn spawn(client: PubSubSource, timeout: Duration) -> Notifier {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(notifier_task(client, rx, timeout));
        Notifier { cmds: tx }
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
        let rx = answer.await.map_err(|_| notifier_gone(key))??;
        Ok(ReleaseWatch::new(rx).with_guard(Unsubscribe {
            cmds: self.cmds.clone(),
            channel: Some(channel),
        }))
    }
}

async fn notifier_task(
    client: PubSubSource,
    mut cmds: mpsc::UnboundedReceiver<Cmd>,
    timeout: Duration,
) {
    let channels: Channels = Arc::default();
    let mut sink: Option<(PubSubSink, Reader)> = None;
    let (lost_tx, mut lost_rx) = mpsc::unbounded_channel::<()>();
    loop {
        let first = tokio::select! {
            cmd = cmds.recv() => match cmd {
                Some(cmd) => cmd,
                None => return,
            },
            Some(()) = lost_rx.recv() => {
                // The connection dropped: every channel must be subscribed
                // again, and every waiter may have missed a release.
                sink = None;
                for ch in lock(&channels).values_mut() {
                    ch.on_server = false;
                    ch.tx.send_modify(|n| *n = n.wrapping_add(1));
                }
                tracing::debug!("release notification connection lost");
                continue;
            }
        };
        let mut batch = vec![first];
        while let Ok(cmd) = cmds.try_recv() {
            batch.push(cmd);
        }

        let mut waiting = Vec::new();
        let mut drop_channels = Vec::new();
        {
            let mut map = lock(&channels);
            for cmd in batch {
                match cmd {
                    Cmd::Subscribe(ch, key, reply) => {
                        let entry = map.entry(ch.clone()).or_insert_with(|| Channel {
                            tx: watch::channel(0).0,
                            on_server: false,
                        });
                        waiting.push((ch, key, entry.tx.subscribe(), reply));
                    }
                    Cmd::Unsubscribe(ch) => {
                        if map.get(&ch).is_some_and(|c| c.tx.receiver_count() == 0)
                            && let Some(c) = map.remove(&ch)
                            && c.on_server
                        {
                            drop_channels.push(ch);
                        }
                    }
                }
            }
        }

        if let Some((s, _)) = &mut sink
            && !drop_channels.is_empty()
            && !matches!(
                tokio::time::timeout(timeout, s.unsubscribe(&drop_channels)).await,
                Ok(Ok(()))
            )
        {
            sink = None;
        }

        if waiting.is_empty() {
            continue;
        }
        let mut result = Ok(());
        if sink.is_none() {
            let connect = async { client.client().await?.get_async_pubsub().await };
            match tokio::time::timeout(timeout, connect).await {
                Ok(Ok(pubsub)) => {
                    let (s, mut stream) = pubsub.split();
                    let map = channels.clone();
                    let lost = lost_tx.clone();
                    let reader = tokio::spawn(async move {
                        while let Some(msg) = stream.next().await {
                            if let Some(ch) = lock(&map).get(msg.get_channel_name()) {
                                ch.tx.send_modify(|n| *n = n.wrapping_add(1));
                            }
                        }
                        let _ = lost.send(());
                    });
                    sink = Some((s, Reader(reader)));
                }
                Ok(Err(e)) => result = Err(("connect", Some(e))),
                Err(_) => result = Err(("connect", None)),
            }
        }
        if let (Some((s, _)), Ok(())) = (&mut sink, &result) {
            // Everything known but not yet on the server: new channels and,
            // after a reconnect, the ones that were there before.
            let pending: Vec<String> = lock(&channels)
                .iter()
                .filter(|(_, c)| !c.on_server)
                .map(|(name, _)| name.clone())
                .collect();
            if !pending.is_empty() {
                match tokio::time::timeout(timeout, s.subscribe(&pending)).await {
                    Ok(Ok(())) => {
                        let mut map = lock(&channels);
                        for name in &pending {
                            if let Some(c) = map.get_mut(name) {
                                c.on_server = true;
                            }
                        }
                    }
                    Ok(Err(e)) => result = Err(("subscribe", Some(e))),
                    Err(_) => result = Err(("subscribe", None)),
                }
            }
        }
        if result.is_err() {
            sink = None;
        }
        for (_, key, rx, reply) in waiting {
            let answer = match &result {
                Ok(()) => Ok(rx),
                Err((_, Some(e))) => Err(Error::from_redis(
                    Operation::Subscribe,
                    Some(&key),
                    e.clone(),
                )),
                Err((_, None)) => Err(timeout_error(Operation::Subscribe, Some(&key), timeout)),
            };
            let _ = reply.send(answer);
        }
        // Channels whose only would-be waiters were just refused.
        lock(&channels).retain(|_, c| c.on_server || c.tx.receiver_count() > 0);
    }
}

fn notifier_gone(key: &LockKey) -> Error {
    Error::Unavailable {
        op: Operation::Subscribe,
        key: Some(key.clone()),
        source: "the notification task has stopped".into(),
    }
}
