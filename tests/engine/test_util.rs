//! The `test-util` hooks on `MemoryStore` (`lose`, `take_over`,
//! `fail_next_calls`), used the way a user tests their own handlers: a
//! handler under the layer sees `lost()`, and a store failure is a 503.
//! All local logic, on tokio's paused clock.

use crate::support;

use std::time::Duration;

use axum::Router;
use axum::extract::Extension;
use axum::routing::post;
use http::StatusCode;
use support::http::{join, post_to, send, spawn_send};
use tokio::sync::mpsc;
use tower_redis_lock::{
    Error, KeyFrom, LockGuard, LockKey, LockLayer, Locker, MemoryStore, OnLockLost,
};

const LEASE: Duration = Duration::from_secs(3);

fn key() -> LockKey {
    LockKey::new("orders", "42").unwrap()
}

/// A route `/orders/{id}` under the layer whose handler reports that it
/// started (with its token), then works for an hour. Under
/// `OnLockLost::KeepRunning` it watches its guard and answers "lost" once
/// its lock is lost; under `Abort` the layer does the watching (a handler
/// watching too would race the layer to answer).
fn app(store: &MemoryStore, on_lost: OnLockLost) -> (Router, mpsc::UnboundedReceiver<u64>) {
    let (started, rx) = mpsc::unbounded_channel::<u64>();
    async fn watching(
        guard: LockGuard,
        Extension(started): Extension<mpsc::UnboundedSender<u64>>,
    ) -> &'static str {
        let _ = started.send(guard.fencing_token().unwrap().get());
        tokio::select! {
            _ = guard.lost() => "lost",
            _ = tokio::time::sleep(Duration::from_secs(3600)) => "done",
        }
    }
    async fn working(
        guard: LockGuard,
        Extension(started): Extension<mpsc::UnboundedSender<u64>>,
    ) -> &'static str {
        let _ = started.send(guard.fencing_token().unwrap().get());
        tokio::time::sleep(Duration::from_secs(3600)).await;
        "done"
    }
    let locker = Locker::builder(store.clone()).lease(LEASE).build().unwrap();
    let layer = LockLayer::builder(locker, KeyFrom::path_param::<String>("id"))
        .namespace("orders")
        .on_lock_lost(on_lost)
        .build()
        .unwrap();
    let route = match on_lost {
        OnLockLost::Abort => post(working),
        _ => post(watching),
    };
    let app = Router::new()
        .route("/orders/{id}", route)
        .layer(layer)
        .layer(Extension(started));
    (app, rx)
}

/// Waits for a handler to start (its fencing token); fails, rather than
/// hangs, if none does.
async fn started_handler(started: &mut mpsc::UnboundedReceiver<u64>) -> u64 {
    tokio::time::timeout(Duration::from_secs(10), started.recv())
        .await
        .expect("no handler started")
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_handler_sees_lost_when_the_test_loses_its_lock() {
    let store = MemoryStore::new();
    let (app, mut started) = app(&store, OnLockLost::KeepRunning);
    let task = spawn_send(&app, post_to("/orders/42"));
    started_handler(&mut started).await;
    assert!(store.is_locked(&key()));

    assert!(store.lose(&key()));
    assert!(!store.is_locked(&key()));
    // The watchdog's next renewal (lease/3) finds no lock: lost() fires
    // long before the handler's hour is up.
    let reply = join(task).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.text(), "lost");
    assert!(!store.lose(&key()), "nothing left to lose");
}

#[tokio::test(start_paused = true)]
async fn a_takeover_aborts_the_handler_with_503_and_the_taker_has_a_higher_token() {
    let store = MemoryStore::new();
    let (app, mut started) = app(&store, OnLockLost::Abort);
    let task = spawn_send(&app, post_to("/orders/42"));
    let first = started_handler(&mut started).await;

    let taker = store.take_over(&key(), Duration::from_secs(60));
    assert!(taker.get() > first);
    let reply = join(task).await;
    reply.problem(StatusCode::SERVICE_UNAVAILABLE);
    // The taker still holds it: the next request is refused, not run.
    assert!(store.is_locked(&key()));
    send(&app, post_to("/orders/42"))
        .await
        .problem(StatusCode::CONFLICT);
    assert!(started.try_recv().is_err());
}

#[tokio::test(start_paused = true)]
async fn a_failed_store_call_is_a_503_with_retry_after_and_only_that_call_fails() {
    let store = MemoryStore::new();
    let (app, mut started) = app(&store, OnLockLost::KeepRunning);
    store.fail_next_calls(1);
    let reply = send(&app, post_to("/orders/42")).await;
    reply.problem(StatusCode::SERVICE_UNAVAILABLE);
    assert!(reply.retry_after() > 0);
    assert!(started.try_recv().is_err(), "the handler ran");

    let task = spawn_send(&app, post_to("/orders/42"));
    started_handler(&mut started).await;
    store.lose(&key());
    assert_eq!(join(task).await.text(), "lost");
}

#[tokio::test(start_paused = true)]
async fn fail_next_calls_fails_exactly_that_many_calls_of_any_kind_and_zero_cancels() {
    let store = MemoryStore::new();
    let locker = Locker::new(store.clone());
    let guard = locker.acquire(&key()).await.unwrap();

    store.fail_next_calls(2);
    let renewal = guard.extend().await.unwrap_err();
    assert!(
        matches!(&renewal, Error::Unavailable { key: Some(k), .. } if *k == key()),
        "{renewal:?}"
    );
    let other = LockKey::new("orders", "43").unwrap();
    assert!(locker.acquire(&other).await.unwrap_err().is_store_failure());
    // The third call goes through.
    guard.extend().await.unwrap();
    assert!(guard.is_held());

    store.fail_next_calls(5);
    store.fail_next_calls(0);
    assert!(guard.release().await.unwrap());
}

#[tokio::test(start_paused = true)]
async fn take_over_of_a_free_key_holds_it_with_a_rising_token() {
    let store = MemoryStore::new();
    let locker = Locker::new(store.clone());
    let a = store.take_over(&key(), LEASE);
    assert!(locker.try_acquire(&key()).await.unwrap_err().is_contended());
    let b = store.take_over(&key(), LEASE);
    assert!(b > a);
    // The taker's lease runs out like any other.
    tokio::time::sleep(LEASE).await;
    let guard = locker.try_acquire(&key()).await.unwrap();
    assert!(guard.fencing_token().unwrap() > b);
}
