//! `RedisStoreBuilder::fencing(false)`: the grant is a plain `SET NX PX`,
//! there is no token anywhere (the guard says why, the layer sends no
//! header), and everything else works as with fencing. Real
//! `redis-server` processes.

use crate::support;

use std::time::Duration;

use axum::Router;
use axum::extract::Extension;
use axum::routing::post;
use bytes::Bytes;
use support::http::{post_to, send};
use support::stores::{redis_name, woken_only_by_notification};
use support::topology::start_independent;
use support::{RedisServer, eventually};
use tokio::time::timeout;
use tower_redis_lock::{
    AcquireOutcome, Error, FencingToken, KeyFrom, LeaseKind, LockGuard, LockKey, LockLayer,
    LockStore, LockStoreExt, Locker, OwnerToken, RedisStore, RedlockStore, Unfenced,
};

const HOUR: Duration = Duration::from_secs(3600);
/// Only a hang guard.
const GUARD: Duration = Duration::from_secs(30);

fn key(id: &str) -> LockKey {
    LockKey::new("plain", id).unwrap()
}

fn store(server: &RedisServer) -> RedisStore {
    RedisStore::builder(&server.url())
        .fencing(false)
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_free_lock_is_one_plain_set_and_the_guard_says_it_has_no_token() {
    let server = RedisServer::start();
    let locker = Locker::new(store(&server));
    let k = key("free");
    let warm_up = locker.try_acquire(&key("warm-up")).await.unwrap();
    assert!(warm_up.release().await.unwrap());
    server.reset_stats();
    let guard = locker.try_acquire(&k).await.unwrap();
    assert_eq!(guard.fencing_token(), Err(Unfenced));
    assert_eq!(
        server.command_calls("set"),
        1,
        "{:?}",
        server.command_stats()
    );
    assert_eq!(server.command_calls("evalsha"), 0);
    // No fencing counter: the lock key alone.
    let keys = server.keys();
    assert!(
        keys.contains(&redis_name("plain", "free", "lock")),
        "{keys:?}"
    );
    assert!(keys.iter().all(|k| !k.ends_with(":fence")), "{keys:?}");
    assert!(guard.release().await.unwrap());
    // The release: owner check and DEL, nobody waited so no PUBLISH.
    assert_eq!(server.command_calls("evalsha"), 1);
    assert_eq!(server.command_calls("publish"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_told_the_lease_left_and_woken_by_the_release() {
    let server = RedisServer::start();
    let build = || woken_only_by_notification(store(&server));
    let (holder, waiter) = (build(), build());
    let k = key("waited");
    let held = holder.acquire(&k).await.unwrap();
    match waiter.try_acquire(&k).await {
        Err(Error::Contended { retry_after, .. }) => {
            assert!(
                retry_after <= HOUR && retry_after > HOUR / 2,
                "{retry_after:?}"
            );
        }
        other => panic!("expected Contended, got {other:?}"),
    }
    server.reset_stats();
    let task = {
        let (waiter, k) = (waiter.clone(), k.clone());
        tokio::spawn(async move { waiter.acquire(&k).await.unwrap() })
    };
    let mark = redis_name("plain", "waited", "waited");
    let marked = async || {
        server.command_calls("evalsha") >= 2 && server.cmd(&["EXISTS", &mark]).as_int() == Some(1)
    };
    assert!(eventually(GUARD, marked).await);
    assert!(held.release().await.unwrap());
    let g = timeout(GUARD, task)
        .await
        .expect("the waiter missed the release")
        .unwrap();
    assert_eq!(g.fencing_token(), Err(Unfenced));
    assert!(g.release().await.unwrap());
}

#[tokio::test]
async fn the_watchdog_renews_an_unfenced_lock() {
    let server = RedisServer::start();
    let locker = Locker::builder(store(&server))
        .lease(Duration::from_millis(1_000))
        .build()
        .unwrap();
    let guard = locker.try_acquire(&key("renewed")).await.unwrap();
    server.reset_stats();
    // Three renewals (every lease/3) keep it past its first lease: each a
    // script call, or on Valkey 8.1 and later a `SET … IFEQ`
    // (renewal_paths.rs).
    let renewed = async || server.command_calls("evalsha") + server.command_calls("set") >= 3;
    assert!(eventually(GUARD, renewed).await);
    assert!(guard.is_held());
    assert!(guard.release().await.unwrap());
}

#[tokio::test]
async fn a_record_is_stored_and_replayed_without_fencing() {
    let server = RedisServer::start();
    let st = store(&server);
    let (k, owner) = (key("record"), OwnerToken::generate());
    let outcome = st.acquire_or_replay(&k, &owner, HOUR).await.unwrap();
    assert_eq!(outcome, AcquireOutcome::GrantedUnfenced);
    let record = Bytes::from_static(b"done");
    assert!(st.finish(&k, &owner, record.clone(), HOUR).await.unwrap());
    let other = OwnerToken::generate();
    let again = st.acquire_or_replay(&k, &other, HOUR).await.unwrap();
    assert_eq!(again, AcquireOutcome::Completed(record));
}

#[tokio::test]
async fn the_layer_sends_no_fencing_token_for_an_unfenced_lock() {
    let server = RedisServer::start();
    let layer = LockLayer::builder(
        Locker::new(store(&server)),
        KeyFrom::path_param::<String>("id"),
    )
    .build()
    .unwrap();
    let handler = post(
        |guard: LockGuard, token: Option<Extension<FencingToken>>| async move {
            assert!(guard.is_held());
            format!("{:?} {}", guard.fencing_token(), token.is_some())
        },
    );
    let app = Router::new().route("/jobs/{id}", handler.layer(layer));
    let reply = send(&app, post_to("/jobs/j1")).await;
    assert_eq!(reply.status, http::StatusCode::OK, "{}", reply.text());
    assert_eq!(reply.text(), "Err(Unfenced) false");
    assert!(
        reply.headers.get("fencing-token").is_none(),
        "{:?}",
        reply.headers
    );

    // A handler that asks for the token itself: `Option` sees none, the
    // plain extractor refuses with a 500 problem naming the cause.
    let layer = || {
        LockLayer::builder(
            Locker::new(store(&server)),
            KeyFrom::path_param::<String>("id"),
        )
        .build()
        .unwrap()
    };
    let app = Router::new()
        .route(
            "/opt/{id}",
            post(|token: Option<FencingToken>| async move { format!("{token:?}") }).layer(layer()),
        )
        .route(
            "/must/{id}",
            post(|token: FencingToken| async move { token.to_string() }).layer(layer()),
        );
    assert_eq!(send(&app, post_to("/opt/j2")).await.text(), "None");
    let reply = send(&app, post_to("/must/j3")).await;
    assert_eq!(reply.status, http::StatusCode::INTERNAL_SERVER_ERROR);
    assert!(reply.text().contains("fencing(false)"), "{}", reply.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_over_unfenced_nodes_grants_without_a_token_or_write_back() {
    let servers = start_independent(3);
    let nodes = servers.iter().map(store).collect();
    let redlock = RedlockStore::new(nodes).unwrap();
    for s in &servers {
        s.reset_stats();
    }
    let (k, owner) = (key("redlock"), OwnerToken::generate());
    let outcome = redlock.acquire(&k, &owner, HOUR).await.unwrap();
    assert_eq!(outcome, AcquireOutcome::GrantedUnfenced);
    assert!(redlock.release(LeaseKind::Lock, &k, &owner).await.unwrap());
    let sent = |cmd: &str| servers.iter().map(|s| s.command_calls(cmd)).sum::<u64>();
    let released = eventually(GUARD, async || sent("evalsha") == 3).await;
    assert!(released, "{:?}", servers[0].command_stats());
    // One SET per node and the releases: no script on the grant, no
    // fencing counter written back.
    assert_eq!(sent("set"), 3);
}
