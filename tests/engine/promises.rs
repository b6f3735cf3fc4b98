//! README promises that had no test which would fail if they were broken
//! (TESTING.md, "Gaps"), each against real redis-server processes.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::{Request, StatusCode};
use support::http::{post_to, send};
use support::{RedisServer, eventually};
use tokio::time::timeout;
use tower_redis_lock::{
    Error, Idempotency, KeyFrom, LockGuard, LockKey, LockLayer, Locker, RedisStore,
};

/// Hang guard for one awaited step.
const GUARD: Duration = Duration::from_secs(10);
/// A poll interval so long that only something else can wake a waiter.
const HOUR: Duration = Duration::from_secs(3600);

fn key(id: &str) -> LockKey {
    LockKey::new("promises", id).unwrap()
}

fn store(server: &RedisServer) -> RedisStore {
    RedisStore::from_url(&server.url()).unwrap()
}

/// `PUBSUB NUMSUB <channel>`'s count.
fn numsub(server: &RedisServer, channel: &str) -> i64 {
    let reply = server.cmd(&["PUBSUB", "NUMSUB", channel]);
    reply.as_array().unwrap()[1].as_int().unwrap()
}

/// A router whose handler counts its runs (locked or not), under a lock keyed
/// on the path.
fn counted_app(locker: Locker<RedisStore>) -> (Router, Arc<AtomicU32>) {
    let calls = Arc::new(AtomicU32::new(0));
    let handler = {
        let calls = calls.clone();
        move |_guard: Option<LockGuard>| async move {
            calls.fetch_add(1, Ordering::SeqCst);
            "locked"
        }
    };
    let app = Router::new().route(
        "/jobs/{id}",
        post(handler).route_layer(
            LockLayer::builder(locker, KeyFrom::path_param::<String>("id"))
                .namespace("jobs")
                .build()
                .unwrap(),
        ),
    );
    (app, calls)
}

/// "A jittered poll bounded by the holder's remaining lease covers expiry
/// (which nobody announces)": the lock expires without a release, and only
/// the remaining-lease bound can wake the waiter (its poll is an hour, its
/// wait timeout longer than the hang guard).
#[tokio::test]
async fn a_lock_that_expires_unannounced_goes_to_the_waiter_after_the_remaining_lease() {
    let server = RedisServer::start();
    let st = store(&server);
    let k = key("expiry");
    let lock_key = st.lock_key(&k);
    let locker = Locker::builder(st)
        .wait_timeout(Duration::from_secs(60))
        .poll_interval(HOUR)
        .build()
        .unwrap();
    server.cmd(&["SET", &lock_key, "someone", "PX", "400"]);
    let guard = timeout(GUARD, locker.acquire(&k))
        .await
        .expect("the waiter was not woken by the end of the holder's lease")
        .unwrap();
    assert!(guard.is_held());
    assert_eq!(
        server.command_calls("publish"),
        0,
        "nobody announced the expiry"
    );
    guard.release().await.unwrap();
}

/// "A lost pub/sub connection wakes its waiters" on one Redis: the pub/sub
/// connection is killed server-side while a waiter waits; the subscription
/// comes back and the next release still reaches the waiter (its poll is an
/// hour, the holder's lease a minute).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_pubsub_connection_on_one_redis_wakes_its_waiter_and_resubscribes() {
    let server = RedisServer::start();
    let k = key("pubsub");
    let holder = Locker::builder(store(&server))
        .lease(Duration::from_secs(60))
        .build()
        .unwrap();
    let st = store(&server);
    let channel = st.release_channel(&k);
    let waiter = Locker::builder(st)
        .wait_timeout(Duration::from_secs(60))
        .poll_interval(HOUR)
        .build()
        .unwrap();
    let held = holder.acquire(&k).await.unwrap();
    let wait = tokio::spawn({
        let k = k.clone();
        async move { waiter.acquire(&k).await }
    });
    assert!(
        eventually(GUARD, async || numsub(&server, &channel) == 1).await,
        "the waiter never subscribed"
    );
    server.reset_stats();
    let killed = server.cmd(&["CLIENT", "KILL", "TYPE", "pubsub"]).as_int();
    assert_eq!(killed, Some(1));
    // The waiter is woken: it asks the store again, and subscribes again.
    assert!(
        eventually(GUARD, async || server.command_calls("evalsha") >= 1).await,
        "the waiter was not woken by the lost connection"
    );
    assert!(
        eventually(GUARD, async || numsub(&server, &channel) == 1).await,
        "the subscription was not renewed"
    );
    assert!(!wait.is_finished());
    held.release().await.unwrap();
    let got = timeout(GUARD, wait)
        .await
        .expect("the release after the reconnection did not wake the waiter")
        .unwrap()
        .unwrap();
    assert!(got.is_held());
    got.release().await.unwrap();
}

/// "`Auth` (password or ACL)" and "auth or ACL error → 503 with
/// `Retry-After`, handler not run": a user without EVAL/EVALSHA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_refusal_is_auth_and_answers_503() {
    let server = RedisServer::start();
    server.cmd(&[
        "ACL", "SETUSER", "limited", "on", ">pw", "~*", "&*", "+@all", "-evalsha", "-eval",
    ]);
    let url = format!("redis://limited:pw@127.0.0.1:{}/", server.port());
    let locker = Locker::new(RedisStore::from_url(&url).unwrap());
    match timeout(GUARD, locker.try_acquire(&key("acl")))
        .await
        .unwrap()
    {
        Err(Error::Auth { .. }) => {}
        other => panic!("expected Error::Auth, got {other:?}"),
    }
    let (app, calls) = counted_app(locker);
    let r = send(&app, post_to("/jobs/a")).await;
    r.problem(StatusCode::SERVICE_UNAVAILABLE);
    assert!(r.retry_after() >= 1);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "the handler ran without a lock"
    );
    assert!(server.keys().iter().all(|k| !k.ends_with(":lock")));
}

/// "Redis … frozen → 503 with `Retry-After`, handler not run", on one Redis
/// through the layer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_redis_answers_503_through_the_layer() {
    let server = RedisServer::start();
    // 1 s: the first request, on a connection still opening, must be
    // answered within it on a loaded machine too.
    let st = RedisStore::builder(&server.url())
        .command_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let (app, calls) = counted_app(Locker::new(st));
    let r = send(&app, post_to("/jobs/a")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    server.freeze();
    let r = send(&app, post_to("/jobs/a")).await;
    server.thaw();
    r.problem(StatusCode::SERVICE_UNAVAILABLE);
    assert!(r.retry_after() >= 1);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the handler ran without a lock"
    );
}

/// "Every `lost()` future resolves": three clones of one guard, each awaited
/// in its own task, after the key is deleted behind the holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_lost_future_of_every_clone_resolves() {
    let server = RedisServer::start();
    let st = store(&server);
    let k = key("lost");
    let lock_key = st.lock_key(&k);
    let locker = Locker::builder(st)
        .lease(Duration::from_millis(600))
        .build()
        .unwrap();
    let guard = locker.acquire(&k).await.unwrap();
    let tasks: Vec<_> = (0..3)
        .map(|_| {
            let g = guard.clone();
            tokio::spawn(async move { g.lost().await })
        })
        .collect();
    // Also a second lost() on the original guard.
    let first = guard.lost();
    assert_eq!(server.cmd(&["DEL", &lock_key]).as_int(), Some(1));
    for t in tasks {
        timeout(GUARD, t)
            .await
            .expect("a lost() future never resolved")
            .unwrap();
    }
    timeout(GUARD, first).await.expect("lost() never resolved");
    assert!(!guard.is_held());
}

/// "duplicate after completion: the stored answer … one Redis round trip".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_costs_one_redis_round_trip() {
    let server = RedisServer::start();
    let calls = Arc::new(AtomicU32::new(0));
    let handler = {
        let calls = calls.clone();
        move || async move {
            calls.fetch_add(1, Ordering::SeqCst);
            "applied"
        }
    };
    let app = Router::new().route(
        "/hooks",
        post(handler).route_layer(
            LockLayer::builder(
                Locker::new(store(&server)),
                KeyFrom::header(http::HeaderName::from_static("x-event-id")),
            )
            .namespace("hooks")
            .idempotent(Idempotency::new())
            .build()
            .unwrap(),
        ),
    );
    let req = || {
        Request::post("/hooks")
            .header("x-event-id", "evt_1")
            .body(Body::empty())
            .unwrap()
    };
    let first = send(&app, req()).await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.text());

    server.reset_stats();
    let replay = send(&app, req()).await;
    assert_eq!(replay.status, StatusCode::OK, "{}", replay.text());
    assert_eq!(replay.headers["idempotent-replayed"], "true");
    assert_eq!(replay.body, first.body);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let ran: Vec<_> = server
        .command_stats()
        .into_iter()
        .filter(|(name, _)| !name.starts_with("config") && !name.starts_with("info"))
        .collect();
    // One EVALSHA sent; `INFO commandstats` also counts the commands a
    // script runs, here the grant script's own `GET` of the record.
    assert_eq!(
        ran,
        [("evalsha".to_owned(), 1), ("get".to_owned(), 1)],
        "commands Redis ran for the replay"
    );
}
