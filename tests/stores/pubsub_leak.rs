//! Release subscriptions are given back whenever their waiter leaves:
//! also a waiter dropped after the notifier
//! answered but before it read the answer, and after a burst of thousands
//! of distinct keys the notifier keeps nothing per key.

use crate::support;

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Waker};
use std::time::Duration;

use support::topology::Cluster;
use support::{RedisServer, eventually};
use tower_redis_lock::{
    AcquireOutcome, LeaseKind, LockKey, LockStore, LockStoreExt, OwnerToken, RedisStore,
    ReleaseWatch,
};

type Subscribing<'a> =
    Pin<Box<dyn Future<Output = Result<ReleaseWatch, tower_redis_lock::Error>> + 'a>>;

/// Polls once without a waker that could ever poll again: the subscribe
/// command is sent, the answer stays unread until the future is dropped.
fn poll_once(fut: &mut Subscribing<'_>) {
    let mut cx = Context::from_waker(Waker::noop());
    assert!(fut.as_mut().poll(&mut cx).is_pending());
}

fn numsub(server: &RedisServer, channel: &str) -> i64 {
    let reply = server.cmd(&["PUBSUB", "NUMSUB", channel]);
    reply.as_array().unwrap()[1].as_int().unwrap()
}

fn channels(server: &RedisServer) -> usize {
    server
        .cmd(&["PUBSUB", "CHANNELS"])
        .as_array()
        .map_or(0, <[_]>::len)
}

/// Waiters on 150 distinct keys leave at three points: before their first
/// poll, right after it (before the answer), and after the notifier
/// answered but before they read the answer. The server ends with no
/// subscription and the notifier with no channel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_that_leave_at_any_point_leave_no_subscription() {
    let server = RedisServer::start();
    let store = RedisStore::from_url(&server.url()).unwrap();
    let keys: Vec<LockKey> = (0..150)
        .map(|i| LockKey::new("leak", format!("k{i}")).unwrap())
        .collect();
    let mut answered_unread = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        let mut fut: Subscribing<'_> = Box::pin(store.subscribe(k));
        match i % 3 {
            0 => drop(fut),
            1 => {
                poll_once(&mut fut);
                drop(fut);
            }
            _ => {
                poll_once(&mut fut);
                answered_unread.push(fut);
            }
        }
    }
    // A barrier: the notifier answers in order, so once this subscribe is
    // answered, every earlier one has been answered too.
    let barrier = LockKey::new("leak", "barrier").unwrap();
    let watch = store.subscribe(&barrier).await.unwrap();
    assert!(watch.is_active());
    for k in keys.iter().skip(2).step_by(3) {
        assert_eq!(numsub(&server, &store.release_channel(k)), 1);
    }
    drop(answered_unread);
    drop(watch);

    let clean = eventually(Duration::from_secs(10), async || {
        channels(&server) == 0 && store.notification_channels().0 == 0
    })
    .await;
    assert!(
        clean,
        "left behind: {} server channels, notifier {:?}",
        channels(&server),
        store.notification_channels()
    );
}

/// 10,000 distinct keys, each waited on and released: afterwards the
/// server has no subscription, the notifier no channel, and its map has
/// given its room back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_distinct_keys_leaves_nothing_per_key() {
    let server = RedisServer::start();
    let store = RedisStore::from_url(&server.url()).unwrap();
    let (owner, other) = (OwnerToken::generate(), OwnerToken::generate());
    let mut peak = 0;
    for chunk in 0..20 {
        let keys: Vec<LockKey> = (0..500)
            .map(|i| LockKey::new("burst", format!("c{chunk}-{i}")).unwrap())
            .collect();
        for k in &keys {
            store
                .acquire(k, &owner, Duration::from_secs(30))
                .await
                .unwrap();
        }
        let mut watches = futures_util::future::join_all(keys.iter().map(|k| store.subscribe(k)))
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect::<Vec<_>>();
        peak = peak.max(store.notification_channels().0);
        // Each waiter tries after subscribing, as the engine's do: the try
        // finds the lock held and marks it, so its release is announced.
        for k in &keys {
            let tried = store.acquire(k, &other, Duration::from_secs(30)).await;
            assert!(
                matches!(tried, Ok(AcquireOutcome::Held { .. })),
                "{tried:?}"
            );
        }
        for k in &keys {
            assert!(store.release(LeaseKind::Lock, k, &owner).await.unwrap());
        }
        for w in &mut watches {
            tokio::time::timeout(Duration::from_secs(10), w.released())
                .await
                .expect("a waiter was not woken by the release");
        }
    }
    assert!(peak >= 500, "{peak}");
    let clean = eventually(Duration::from_secs(10), async || {
        channels(&server) == 0 && store.notification_channels().0 == 0
    })
    .await;
    assert!(
        clean,
        "left behind: {} server channels, notifier {:?}",
        channels(&server),
        store.notification_channels()
    );
    let (_, capacity) = store.notification_channels();
    assert!(capacity <= 64, "the channel map kept room for {capacity}");
}

/// The same on a cluster, whose waiters use sharded pub/sub: no shard
/// channel is left on any node and the notifier keeps no channel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_waiters_that_leave_after_the_answer_leave_no_shard_channel() {
    let cluster = Cluster::start(3);
    let urls = cluster.urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let store = RedisStore::cluster(&urls).unwrap();
    let keys: Vec<LockKey> = (0..60)
        .map(|i| LockKey::new("leak", format!("s{i}")).unwrap())
        .collect();
    let mut answered_unread = Vec::new();
    for k in &keys {
        let mut fut: Subscribing<'_> = Box::pin(store.subscribe(k));
        poll_once(&mut fut);
        answered_unread.push(fut);
    }
    let barrier = LockKey::new("leak", "barrier").unwrap();
    let watch = store.subscribe(&barrier).await.unwrap();
    assert!(watch.is_active());
    drop(answered_unread);
    drop(watch);
    let shard_channels = || -> usize {
        cluster
            .nodes
            .iter()
            .map(|n| {
                n.cmd(&["PUBSUB", "SHARDCHANNELS"])
                    .as_array()
                    .map_or(0, <[_]>::len)
            })
            .sum()
    };
    let clean = eventually(Duration::from_secs(10), async || {
        shard_channels() == 0 && store.notification_channels().0 == 0
    })
    .await;
    assert!(
        clean,
        "left behind: {} shard channels, notifier {:?}",
        shard_channels(),
        store.notification_channels()
    );
}
