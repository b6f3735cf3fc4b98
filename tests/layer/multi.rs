//! The multi-key layer (`MultiLockLayer`): the `from` and `to` accounts of
//! a JSON transfer, or two path parameters, locked as one, through
//! `Router::oneshot`: the tokens per key in the response, contention as
//! 409/423 with `Retry-After`, store trouble as 503, bad input refused
//! before any store call, and {a, b} against {b, a} with no deadlock. On
//! the memory store and on one real Redis.

use crate::support;

use support::RedisServer;
use support::http::{Reply, send};

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::routing::post;
use axum::{Extension, Router};
use http::{HeaderName, Request, StatusCode};
use tower_redis_lock::{
    FencingToken, Idempotency, KeyFrom, LockGuard, LockKey, LockLayer, LockStore, Locker,
    MemoryStore, MultiGuard, MultiLockLayer, RedisStore,
};

fn locker<S: LockStore>(store: S, wait_ms: u64) -> Locker<S> {
    Locker::builder(store)
        .lease(Duration::from_secs(10))
        .wait_timeout(Duration::from_millis(wait_ms))
        .build()
        .unwrap()
}

fn account(id: &str) -> LockKey {
    LockKey::new("accounts", id).unwrap()
}

/// A transfer route keyed on the body's `from` and `to`; the handler
/// counts how many transfers touch each account at once (never 2).
fn transfers<S: LockStore>(locker: Locker<S>, inside: Arc<AtomicU32>) -> Router {
    let layer = MultiLockLayer::builder(
        locker,
        [
            KeyFrom::json_pointer::<String>("/from"),
            KeyFrom::json_pointer::<String>("/to"),
        ],
    )
    .namespace("accounts")
    .build()
    .unwrap();
    Router::new().route(
        "/transfers",
        post(move |Extension(guard): Extension<MultiGuard>| async move {
            assert!(guard.is_held());
            assert_eq!(
                inside.fetch_add(1, Ordering::SeqCst),
                0,
                "two transfers at once"
            );
            tokio::task::yield_now().await;
            inside.fetch_sub(1, Ordering::SeqCst);
            let keys: Vec<String> = guard.keys().map(ToString::to_string).collect();
            keys.join(",")
        })
        .route_layer(layer),
    )
}

fn transfer(from: &str, to: &str) -> Request<Body> {
    Request::post("/transfers")
        .header("content-type", "application/json")
        .body(Body::from(format!(
            r#"{{"from":"{from}","to":"{to}","cents":100}}"#
        )))
        .unwrap()
}

const TOKEN: HeaderName = HeaderName::from_static("fencing-token");

async fn transfer_answers<S: LockStore + Clone>(store: S) {
    let l = locker(store.clone(), 0);
    let app = transfers(l.clone(), Arc::default());

    // Both accounts, in key order; one token each, in that order.
    let res = send(&app, transfer("B-7", "A-1")).await;
    assert_eq!(res.status, StatusCode::OK, "{res:?}");
    assert_eq!(res.text(), "accounts:A-1,accounts:B-7");
    let tokens: Vec<u64> = res.all(&TOKEN).iter().map(|t| t.parse().unwrap()).collect();
    assert_eq!(tokens.len(), 2, "{res:?}");
    // Each from its key's own counter: a single lock of A-1 now is above it.
    let a = l.try_acquire(&account("A-1")).await.unwrap();
    assert!(a.fencing_token().unwrap().get() > tokens[0]);

    // A-1 held elsewhere: 409, Retry-After, problem+json; B-7 stays free.
    let res = send(&app, transfer("A-1", "B-7")).await;
    res.problem(StatusCode::CONFLICT);
    assert!(res.retry_after() >= 5, "{res:?}");
    assert!(res.headers.get(&TOKEN).is_none());
    let b = l.try_acquire(&account("B-7")).await.unwrap();
    b.release().await.unwrap();
    a.release().await.unwrap();

    // To oneself: one key, one token.
    let res = send(&app, transfer("A-1", "A-1")).await;
    assert_eq!(res.status, StatusCode::OK, "{res:?}");
    assert_eq!(res.all(&TOKEN).len(), 1);

    // Released when the handler has answered.
    assert!(
        l.try_acquire_all(&[account("A-1"), account("B-7")])
            .await
            .is_ok()
    );
}

#[tokio::test]
async fn memory_a_transfer_locks_both_accounts_and_tells_each_token() {
    transfer_answers(MemoryStore::new()).await;
}

#[tokio::test]
async fn redis_a_transfer_locks_both_accounts_and_tells_each_token() {
    let server = RedisServer::start();
    transfer_answers(RedisStore::from_url(&server.url()).unwrap()).await;
}

/// Transfers A→B and B→A from two "instances", many at once, each waiting
/// for the accounts: every one is answered 200 (no deadlock), never two at
/// once on an account.
async fn both_directions_never_deadlock<S: LockStore + Clone>(store: S) {
    let inside = Arc::new(AtomicU32::new(0));
    let apps = [
        transfers(locker(store.clone(), 20_000), inside.clone()),
        transfers(locker(store, 20_000), inside.clone()),
    ];
    let mut tasks = Vec::new();
    for i in 0..40 {
        let app = apps[i % 2].clone();
        let req = if i % 4 < 2 {
            transfer("A-1", "B-7")
        } else {
            transfer("B-7", "A-1")
        };
        tasks.push(tokio::spawn(async move { send(&app, req).await }));
    }
    let all = futures_util::future::join_all(tasks);
    let done = tokio::time::timeout(Duration::from_secs(60), all)
        .await
        .expect("deadlocked: the transfers did not all finish");
    for res in done {
        let res: Reply = res.unwrap();
        assert_eq!(res.status, StatusCode::OK, "{res:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_transfers_both_ways_never_deadlock() {
    both_directions_never_deadlock(MemoryStore::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_transfers_both_ways_never_deadlock() {
    let server = RedisServer::start();
    both_directions_never_deadlock(RedisStore::from_url(&server.url()).unwrap()).await;
}

/// A `LockLayer` on the transfer's `from` account, nested inside the
/// transfer's `MultiLockLayer` (through a locker of its own on the same
/// store, which would wait 2 s): it re-enters that account's lease instead
/// of waiting for the request's own grant (it answered 409 after its
/// wait). The handler sees the account's guard (a second hold of that
/// lease), its token, and the transfer's guard, and its own acquire of the
/// other account re-enters too; the answer carries the
/// transfer's tokens once each; everything is released after. An
/// idempotent layer nested there answers 500 (the transfer stores no
/// record), never 409.
async fn a_lock_layer_inside_reenters_its_key<S: LockStore + Clone>(store: S) {
    let outer = MultiLockLayer::builder(
        locker(store.clone(), 0),
        [
            KeyFrom::json_pointer::<String>("/from"),
            KeyFrom::json_pointer::<String>("/to"),
        ],
    )
    .namespace("accounts")
    .build()
    .unwrap();
    let inner = |idempotent: bool| {
        let b = LockLayer::builder(
            locker(store.clone(), 2_000),
            KeyFrom::json_pointer::<String>("/from"),
        )
        .namespace("accounts");
        let b = if idempotent {
            b.idempotent(Idempotency::new())
        } else {
            b
        };
        b.build().unwrap()
    };
    let waits = locker(store.clone(), 2_000);
    let handler = move |guard: LockGuard,
                        token: FencingToken,
                        Extension(both): Extension<MultiGuard>| async move {
        assert_eq!(guard.key(), &account("B-7"));
        assert_eq!(guard.hold_count(), 2, "not a hold of the transfer's lease");
        assert_eq!(guard.fencing_token(), Ok(token));
        assert_eq!(both.fencing_token(guard.key()), Some(Ok(token)));
        assert!(both.is_held() && guard.is_held());
        // The handler runs in the transfer's scope too: its own acquire
        // of the other account re-enters.
        let to = waits.acquire(&account("A-1")).await.unwrap();
        assert_eq!(to.hold_count(), 2);
        assert_eq!(both.fencing_token(to.key()), Some(to.fencing_token()));
        token.to_string()
    };
    let app = Router::new().route(
        "/transfers",
        post(handler)
            .route_layer(inner(false))
            .route_layer(outer.clone()),
    );
    let started = tokio::time::Instant::now();
    let res = send(&app, transfer("B-7", "A-1")).await;
    assert_eq!(res.status, StatusCode::OK, "{res:?}");
    assert!(started.elapsed() < Duration::from_secs(2), "it waited");
    let tokens = res.all(&TOKEN);
    assert_eq!(tokens.len(), 2, "{res:?}");
    assert_eq!(tokens[1], res.text(), "B-7's token is the handler's");
    let l = locker(store.clone(), 0);
    let both = l
        .try_acquire_all(&[account("A-1"), account("B-7")])
        .await
        .expect("a key was left held");
    both.release().await.unwrap();

    let app = Router::new().route(
        "/transfers",
        post(|| async { "ran" })
            .route_layer(inner(true))
            .route_layer(outer),
    );
    send(&app, transfer("B-7", "A-1"))
        .await
        .problem(StatusCode::INTERNAL_SERVER_ERROR);
    assert!(
        l.try_acquire_all(&[account("A-1"), account("B-7")])
            .await
            .is_ok()
    );
}

#[tokio::test]
async fn memory_a_lock_layer_inside_a_transfer_reenters_its_key() {
    a_lock_layer_inside_reenters_its_key(MemoryStore::new()).await;
}

#[tokio::test]
async fn redis_a_lock_layer_inside_a_transfer_reenters_its_key() {
    let server = RedisServer::start();
    a_lock_layer_inside_reenters_its_key(RedisStore::from_url(&server.url()).unwrap()).await;
}

/// A store that fails: 503 with `Retry-After` and problem+json. A body
/// without a `to`, or a `to` of the wrong type, is refused before any
/// store call (the next call's failure is still pending after them).
#[tokio::test]
async fn store_trouble_is_503_and_bad_bodies_never_reach_the_store() {
    let store = MemoryStore::new();
    let app = transfers(locker(store.clone(), 0), Arc::default());
    store.fail_next_calls(1);
    for (body, status) in [
        (r#"{"from":"A-1"}"#, StatusCode::BAD_REQUEST),
        (r#"{"from":"A-1","to":7}"#, StatusCode::UNPROCESSABLE_ENTITY),
        (r#"{"from":"A-1","to":""}"#, StatusCode::BAD_REQUEST),
        ("not json", StatusCode::BAD_REQUEST),
    ] {
        let req = Request::post("/transfers")
            .header("content-type", "application/json")
            .body(Body::from(body))
            .unwrap();
        send(&app, req).await.problem(status);
    }
    let res = send(&app, transfer("A-1", "B-7")).await;
    res.problem(StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(res.retry_after(), 1);
    // The failure asked for was spent by that request, not before.
    assert_eq!(
        send(&app, transfer("A-1", "B-7")).await.status,
        StatusCode::OK
    );
}

/// Two path parameters, 423 as the contention status, and a header name of
/// one's own: one value per key.
#[tokio::test]
async fn path_params_423_and_a_header_of_ones_own() {
    let store = MemoryStore::new();
    let l = locker(store, 0);
    let layer = MultiLockLayer::builder(
        l.clone(),
        [
            KeyFrom::path_param::<u64>("a"),
            KeyFrom::path_param::<u64>("b"),
        ],
    )
    .namespace("seats")
    .contention_status(StatusCode::LOCKED)
    .fencing_header(HeaderName::from_static("x-fence"))
    .build()
    .unwrap();
    let app = Router::new().route(
        "/swap/{a}/{b}",
        post(|| async { "swapped" }).route_layer(layer),
    );
    let post = |uri: &str| Request::post(uri).body(Body::empty()).unwrap();
    let res = send(&app, post("/swap/12/007")).await;
    assert_eq!(res.status, StatusCode::OK, "{res:?}");
    assert_eq!(res.all(&HeaderName::from_static("x-fence")).len(), 2);
    let held = l
        .try_acquire(&LockKey::new("seats", "7").unwrap())
        .await
        .unwrap();
    let res = send(&app, post("/swap/7/12")).await;
    res.problem(StatusCode::LOCKED);
    res.retry_after();
    held.release().await.unwrap();
    send(&app, post("/swap/x/12"))
        .await
        .problem(StatusCode::BAD_REQUEST);
}

#[test]
fn the_builder_checks_its_settings() {
    let l = || Locker::new(MemoryStore::new());
    let no_keys: [KeyFrom; 0] = [];
    let err = MultiLockLayer::builder(l(), no_keys).build().unwrap_err();
    assert_eq!(err.setting(), "keys");
    let many = (0..65).map(|i| KeyFrom::query::<String>(&format!("k{i}")));
    assert_eq!(
        MultiLockLayer::builder(l(), many)
            .build()
            .unwrap_err()
            .setting(),
        "keys"
    );
    let one = [KeyFrom::query::<String>("id")];
    let err = MultiLockLayer::builder(l(), one.clone())
        .contention_status(StatusCode::IM_A_TEAPOT)
        .build()
        .unwrap_err();
    assert_eq!(err.setting(), "contention_status");
    let err = MultiLockLayer::builder(l(), one)
        .namespace("")
        .build()
        .unwrap_err();
    assert_eq!(err.setting(), "namespace");
}
