//! Release notifications only when somebody waits, against real
//! `redis-server` processes: an acquire that finds the lock held marks it
//! as waited-for; a release (or finish) publishes only when it finds the
//! mark, and deletes it.

use crate::support;

use std::time::Duration;

use bytes::Bytes;
use support::RedisServer;
use support::stores::{redis_name, woken_only_by_notification};
use tokio::time::timeout;
use tower_redis_lock::{
    AcquireOutcome, LeaseKind, LockKey, LockStore, LockStoreExt, OwnerToken, RedisStore,
};

/// Only a hang guard: every waiter below polls once an hour.
const GUARD: Duration = Duration::from_secs(30);

fn key(id: &str) -> LockKey {
    LockKey::new("notice", id).unwrap()
}

fn store(server: &RedisServer) -> RedisStore {
    RedisStore::from_url(&server.url()).unwrap()
}

fn granted(outcome: AcquireOutcome) -> bool {
    matches!(outcome, AcquireOutcome::Granted(_))
}

#[tokio::test]
async fn an_uncontended_release_or_finish_publishes_nothing_and_leaves_no_mark() {
    let server = RedisServer::start();
    let st = store(&server);
    let lease = Duration::from_secs(10);
    let (k, a) = (key("quiet"), OwnerToken::generate());
    server.reset_stats();
    assert!(granted(st.acquire(&k, &a, lease).await.unwrap()));
    assert!(st.release(LeaseKind::Lock, &k, &a).await.unwrap());
    assert!(granted(st.acquire(&k, &a, lease).await.unwrap()));
    assert!(
        st.finish(&k, &a, Bytes::from_static(b"done"), lease)
            .await
            .unwrap()
    );
    assert_eq!(
        server.command_calls("publish"),
        0,
        "{:?}",
        server.command_stats()
    );
    assert!(
        server.keys().iter().all(|k| !k.ends_with(":waited")),
        "{:?}",
        server.keys()
    );
}

#[tokio::test]
async fn a_contended_release_or_finish_publishes_once_and_deletes_the_mark() {
    let server = RedisServer::start();
    let st = store(&server);
    let lease = Duration::from_secs(10);
    let (a, b) = (OwnerToken::generate(), OwnerToken::generate());
    let mark = |id: &str| redis_name("notice", id, "waited");
    for (round, id) in ["released", "finished"].into_iter().enumerate() {
        let k = key(id);
        assert!(granted(st.acquire(&k, &a, lease).await.unwrap()));
        assert!(!granted(st.acquire(&k, &b, lease).await.unwrap()));
        // The mark expires, and no later than the holder's lease.
        let expiry = |name: &str| server.cmd(&["PEXPIRETIME", name]).as_int().unwrap();
        let (mark_at, lock_at) = (expiry(&mark(id)), expiry(&redis_name("notice", id, "lock")));
        assert!(
            mark_at > 0 && mark_at <= lock_at,
            "{mark_at} ms, lock {lock_at} ms"
        );
        if round == 0 {
            assert!(st.release(LeaseKind::Lock, &k, &a).await.unwrap());
        } else {
            let record = Bytes::from_static(b"done");
            assert!(st.finish(&k, &a, record, lease).await.unwrap());
        }
        assert_eq!(server.command_calls("publish"), round as u64 + 1);
        assert!(server.cmd(&["EXISTS", &mark(id)]).as_int() == Some(0));
    }
}

#[tokio::test]
async fn nothing_per_id_is_left_after_contended_locks_are_released() {
    let server = RedisServer::start();
    let st = store(&server);
    let lease = Duration::from_secs(10);
    let (a, b) = (OwnerToken::generate(), OwnerToken::generate());
    for i in 0..200 {
        let k = key(&format!("flood-{i}"));
        assert!(granted(st.acquire(&k, &a, lease).await.unwrap()));
        assert!(!granted(st.acquire(&k, &b, lease).await.unwrap()));
        assert!(st.release(LeaseKind::Lock, &k, &a).await.unwrap());
    }
    let keys = server.keys();
    let left = keys.iter().find(|k| !k.ends_with("}:fence"));
    assert!(left.is_none(), "a per-id key is left: {left:?}");
}

/// The race between a waiter's mark and the holder's release: the holder
/// (another process: its own store, so no local wake-up) releases at a
/// different point of the waiter's way in each round: after a few yields
/// (before or during its first try), once it has subscribed (before or
/// after its try after subscribing), and once that try was sent (it is
/// asleep, or about to be). The waiter polls once an hour and its lease is
/// an hour, so if any interleaving lost the wake-up it would wait an hour
/// and the hang guard fails the test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_never_misses_the_release_whenever_it_happens() {
    let server = RedisServer::start();
    let build = || woken_only_by_notification(store(&server));
    let (holder, waiter) = (build(), build());
    for round in 0..60u32 {
        let id = format!("race-{round}");
        let (k, channel) = (key(&id), redis_name("notice", &id, "released"));
        server.reset_stats();
        let held = holder.try_acquire(&k).await.unwrap();
        let task = {
            let (waiter, k) = (waiter.clone(), k.clone());
            tokio::spawn(async move { waiter.acquire(&k).await.unwrap() })
        };
        for _ in 0..round % 20 {
            tokio::task::yield_now().await;
        }
        let subscribed = async || {
            let subs = server.cmd(&["PUBSUB", "NUMSUB", &channel]);
            subs.as_array().unwrap()[1].as_int() == Some(1)
        };
        if round >= 20 {
            assert!(support::eventually(GUARD, subscribed).await);
        }
        if round >= 40 {
            // The holder's grant, the waiter's first try and its try
            // after subscribing.
            let retried = async || server.command_calls("evalsha") >= 3;
            assert!(support::eventually(GUARD, retried).await);
        }
        assert!(held.release().await.unwrap());
        let g = timeout(GUARD, task)
            .await
            .unwrap_or_else(|_| panic!("round {round}: the waiter missed the release"))
            .unwrap();
        assert!(g.is_held());
        g.release().await.unwrap();
    }
}
