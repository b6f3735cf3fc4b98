//! Re-entrant holds: a holder takes its own lock again (explicitly with
//! `LockGuard::reenter`, or through the locker inside `LockGuard::scope`),
//! holds are counted, the fencing token stays, and the lock goes when the
//! last hold does. On `MemoryStore` and on a real `redis-server`.

use crate::support;
use support::stores::redis_name;

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::{Request, StatusCode};
use support::{RedisServer, eventually};
use tower::ServiceExt;
use tower_redis_lock::{
    Error, KeyFrom, LockGuard, LockKey, LockLayer, LockStore, Locker, MemoryStore, Record,
    RedisStore,
};

const LIMIT: Duration = Duration::from_secs(10);

fn key(id: &str) -> LockKey {
    LockKey::new("reentry", id).unwrap()
}

/// Whether another owner could take `key` right now (taking and releasing
/// it if so).
async fn free_for_others<St: LockStore>(other: &Locker<St>, key: &LockKey) -> bool {
    match other.try_acquire(key).await {
        Ok(g) => {
            g.release().await.unwrap();
            true
        }
        Err(Error::Contended { .. }) => false,
        Err(e) => panic!("unexpected error: {e}"),
    }
}

/// `locker` and `other` are two lockers on the same backing data, so `other`
/// acts as a second process.
async fn holds_are_counted<St: LockStore + Clone>(locker: Locker<St>, other: Locker<St>) {
    // Inner holds released first, then the outer one.
    let k = key("in-order");
    let outer = locker.acquire(&k).await.unwrap();
    let a = outer.reenter().unwrap();
    let b = a.reenter().unwrap();
    assert_eq!(outer.hold_count(), 3);
    assert_eq!(a.fencing_token().unwrap(), outer.fencing_token().unwrap());
    assert_eq!(b.fencing_token().unwrap(), outer.fencing_token().unwrap());
    assert!(
        b.release().await.unwrap(),
        "the lock stays held for the others"
    );
    assert_eq!(outer.hold_count(), 2);
    assert!(!free_for_others(&other, &k).await);
    assert!(a.release().await.unwrap());
    assert!(!free_for_others(&other, &k).await);
    assert!(outer.is_held());
    assert!(outer.release().await.unwrap(), "the last hold releases");
    assert!(free_for_others(&other, &k).await);

    // The outer hold released first: the inner one keeps the lock, and its
    // own renewals go on.
    let k = key("outer-first");
    let outer = locker.acquire(&k).await.unwrap();
    let inner = outer.reenter().unwrap();
    let clone_of_outer = outer.clone();
    assert!(outer.release().await.unwrap());
    assert!(!clone_of_outer.is_held(), "that hold is given back");
    assert!(
        clone_of_outer.reenter().is_err(),
        "a given-back hold cannot re-enter"
    );
    assert!(inner.is_held());
    assert!(!free_for_others(&other, &k).await);
    inner.extend().await.unwrap();
    assert!(inner.release().await.unwrap());
    assert!(free_for_others(&other, &k).await);

    // Dropped holds count like released ones; the last drop releases in the
    // background.
    let k = key("dropped");
    let outer = locker.acquire(&k).await.unwrap();
    let inner = outer.reenter().unwrap();
    drop(outer);
    assert_eq!(inner.hold_count(), 1);
    assert!(!free_for_others(&other, &k).await);
    drop(inner);
    assert!(
        eventually(LIMIT, async || free_for_others(&other, &k).await).await,
        "the last dropped hold did not release"
    );
}

#[tokio::test]
async fn holds_are_counted_and_the_last_one_releases_memory() {
    let store = MemoryStore::new();
    holds_are_counted(Locker::new(store.clone()), Locker::new(store)).await;
}

#[tokio::test]
async fn holds_are_counted_and_the_last_one_releases_redis() {
    let server = RedisServer::start();
    let store = RedisStore::from_url(&server.url()).unwrap();
    let other = RedisStore::from_url(&server.url()).unwrap();
    holds_are_counted(Locker::new(store), Locker::new(other)).await;
    assert!(
        !server.keys().iter().any(|k| k.ends_with(":lock")),
        "a lock was left behind: {:?}",
        server.keys()
    );
}

/// Inside a multi-key guard's scope, a single acquire of one of its keys
/// (through a locker that would wait 2 s for it, or another locker on the
/// same store) re-enters that key's lease at once: one more hold, the
/// key's token from the grant; a list of any of the keys is refused at
/// once. Outside the scope it is an ordinary wait. A key stays held until
/// its last hold goes, the guard's release included (which answers
/// `true`); the other keys go with the guard. `other` acts as a second
/// process.
async fn a_single_acquire_reenters_a_multi_key_grant<St: LockStore + Clone>(
    store: St,
    other: Locker<St>,
) {
    let waits = |store: &St| {
        Locker::builder(store.clone())
            .wait_timeout(Duration::from_secs(2))
            .build()
            .unwrap()
    };
    let (locker, same_store) = (waits(&store), waits(&store));
    let (a, b) = (key("multi-a"), key("multi-b"));
    let both = locker.acquire_all(&[a.clone(), b.clone()]).await.unwrap();
    let started = tokio::time::Instant::now();
    let (one, two, list) = both
        .scope(async {
            (
                locker.acquire(&a).await.unwrap(),
                same_store.acquire(&b).await.unwrap(),
                locker
                    .acquire_all(std::slice::from_ref(&b))
                    .await
                    .unwrap_err(),
            )
        })
        .await;
    assert!(started.elapsed() < Duration::from_secs(1), "it waited");
    assert_eq!((one.hold_count(), two.hold_count()), (2, 2));
    assert_eq!(both.fencing_token(&a), Some(one.fencing_token()));
    assert_eq!(both.fencing_token(&b), Some(two.fencing_token()));
    assert!(
        matches!(&list, Error::Config(e) if e.setting() == "keys"),
        "{list:?}"
    );
    assert!(locker.try_acquire(&a).await.unwrap_err().is_contended());
    drop(two);
    assert!(both.release().await.unwrap());
    assert!(
        !free_for_others(&other, &a).await,
        "a key was released under the hold that re-entered it"
    );
    assert!(free_for_others(&other, &b).await);
    assert!(one.is_held());
    assert!(one.release().await.unwrap());
    assert!(free_for_others(&other, &a).await);
}

#[tokio::test]
async fn a_single_acquire_reenters_a_multi_key_grant_memory() {
    let store = MemoryStore::new();
    a_single_acquire_reenters_a_multi_key_grant(store.clone(), Locker::new(store)).await;
}

#[tokio::test]
async fn a_single_acquire_reenters_a_multi_key_grant_redis() {
    let server = RedisServer::start();
    let store = RedisStore::from_url(&server.url()).unwrap();
    let other = Locker::new(RedisStore::from_url(&server.url()).unwrap());
    a_single_acquire_reenters_a_multi_key_grant(store, other).await;
}

/// A key's lease re-entered from a multi-key guard is one lease: lost for
/// the re-entered hold (a renewal finds another owner), it is lost for
/// the guard too.
#[tokio::test]
async fn a_multi_key_grant_and_its_reentry_are_lost_together() {
    let store = MemoryStore::new();
    let locker = Locker::new(store.clone());
    let (a, b) = (key("lost-a"), key("lost-b"));
    let both = locker.acquire_all(&[a.clone(), b]).await.unwrap();
    let one = both.scope(locker.acquire(&a)).await.unwrap();
    assert!(store.lose(&a));
    assert!(matches!(one.extend().await, Err(Error::LockLost { .. })));
    assert!(both.is_lost() && !both.is_held());
    tokio::time::timeout(LIMIT, both.lost())
        .await
        .expect("the guard did not hear of its key's loss");
}

#[tokio::test]
async fn a_reentry_sends_nothing_to_redis() {
    let server = RedisServer::start();
    let locker = Locker::new(RedisStore::from_url(&server.url()).unwrap());
    let k = key("silent");
    let outer = locker.acquire(&k).await.unwrap();
    server.reset_stats();
    let again = outer
        .scope(async { locker.acquire(&k).await.unwrap() })
        .await;
    let explicit = outer.reenter().unwrap();
    assert_eq!(again.hold_count(), 3);
    drop((again, explicit));
    assert_eq!(outer.hold_count(), 1);
    let stats = server.command_stats();
    assert!(
        stats.keys().all(|c| c == "info" || c == "config|resetstat"),
        "re-entering and giving holds back sent commands: {stats:?}"
    );
    outer.release().await.unwrap();
}

#[tokio::test]
async fn the_locker_reenters_inside_the_scope_only() {
    let store = MemoryStore::new();
    let locker = Locker::builder(store.clone())
        .wait_timeout(Duration::ZERO)
        .build()
        .unwrap();
    let k = key("scoped");
    let guard = locker.acquire(&k).await.unwrap();

    guard
        .scope(async {
            // The same task, same store: one more hold, same token, no wait.
            let again = locker.acquire(&k).await.unwrap();
            assert_eq!(again.fencing_token().unwrap(), guard.fencing_token().unwrap());
            assert_eq!(guard.hold_count(), 2);
            // Scopes nest; the replay form re-enters too.
            let other = key("other");
            let g2 = locker.acquire(&other).await.unwrap();
            g2.scope(async {
                let third = locker.acquire_or_replay_within(&k, Duration::ZERO).await.unwrap();
                assert!(matches!(third, tower_redis_lock::Acquired::Locked(ref g) if g.fencing_token().unwrap() == guard.fencing_token().unwrap()));
                assert_eq!(guard.hold_count(), 3);
                assert_eq!(locker.acquire(&other).await.unwrap().hold_count(), 2);
            })
            .await;
            assert_eq!(guard.hold_count(), 2);
            drop(again);
            // A task spawned from the scope is not in it.
            let (l, k2) = (locker.clone(), k.clone());
            let spawned = tokio::spawn(async move { l.acquire(&k2).await.map(|_| ()) });
            assert!(matches!(
                spawned.await.unwrap(),
                Err(Error::Contended { .. })
            ));
            // A locker on a clone of the store is the same lock...
            let sibling = Locker::new(store.clone());
            assert_eq!(sibling.acquire(&k).await.unwrap().hold_count(), 2);
            // ...another store with the same key names is another lock.
            let elsewhere = Locker::new(MemoryStore::new());
            assert_eq!(elsewhere.acquire(&k).await.unwrap().hold_count(), 1);
        })
        .await;

    // Outside the scope the same task waits like anybody else.
    assert!(matches!(
        locker.acquire(&k).await,
        Err(Error::Contended { .. })
    ));
    assert_eq!(guard.hold_count(), 1);
    assert!(guard.release().await.unwrap());
    // (`other` was dropped in the scope: released in the background.)
    assert!(eventually(LIMIT, async || store.held_count() == 0).await);
}

#[tokio::test]
async fn no_reentry_into_a_lost_or_released_lock() {
    let server = RedisServer::start();
    let locker = Locker::new(RedisStore::from_url(&server.url()).unwrap());

    // Lost: the key vanished under us (as after a failover).
    let k = key("lost");
    let guard = locker.acquire(&k).await.unwrap();
    server.cmd(&["DEL", &redis_name("reentry", "lost", "lock")]);
    assert!(matches!(guard.extend().await, Err(Error::LockLost { .. })));
    assert!(matches!(guard.reenter(), Err(Error::LockLost { .. })));
    // Inside its scope the locker does not re-enter a lost lock: it takes
    // a new grant with a newer token.
    let fresh = guard.scope(locker.acquire(&k)).await.unwrap();
    assert!(fresh.fencing_token().unwrap() > guard.fencing_token().unwrap());
    assert_eq!(fresh.hold_count(), 1);
    fresh.release().await.unwrap();

    // Released.
    let k = key("released");
    let guard = locker.acquire(&k).await.unwrap();
    let clone = guard.clone();
    guard.release().await.unwrap();
    assert!(matches!(clone.reenter(), Err(Error::LockLost { .. })));
}

#[tokio::test]
async fn finish_ends_the_lock_for_every_hold() {
    let server = RedisServer::start();
    let locker = Locker::new(RedisStore::from_url(&server.url()).unwrap());
    let k = key("finished");
    let outer = locker.acquire(&k).await.unwrap();
    let inner = outer.reenter().unwrap();
    let mut record = Record::new(StatusCode::CREATED);
    record = record.with_body("done".into());
    assert!(
        inner
            .finish(record.encode(), Duration::from_secs(60))
            .await
            .unwrap()
    );
    assert!(!outer.is_held());
    assert!(!outer.release().await.unwrap(), "nothing left to release");
    match locker
        .acquire_or_replay_within(&k, Duration::ZERO)
        .await
        .unwrap()
    {
        tower_redis_lock::Acquired::Completed(raw) => {
            let r = Record::decode(raw).unwrap();
            assert_eq!(
                (r.status(), &r.body()[..]),
                (StatusCode::CREATED, &b"done"[..])
            )
        }
        other => panic!("expected the record, got {other:?}"),
    }
    assert!(!server.keys().iter().any(|k| k.ends_with(":lock")));
}

/// A handler under the layer that calls into code locking the same key.
async fn nested_work(locker: Locker<RedisStore>, guard: LockGuard) -> String {
    let k = guard.key().clone();
    // As a library function deep in the handler would: it only knows the
    // locker and the key.
    let again = locker.acquire(&k).await.unwrap();
    assert_eq!(again.hold_count(), 2);
    let token = again.fencing_token().unwrap();
    again.release().await.unwrap();
    assert!(guard.is_held(), "the layer's hold keeps the lock");
    token.to_string()
}

#[tokio::test]
async fn a_handler_reenters_the_layers_lock_through_the_locker() {
    let server = RedisServer::start();
    let locker = Locker::new(RedisStore::from_url(&server.url()).unwrap());
    let layer = LockLayer::builder(locker.clone(), KeyFrom::path_param::<String>("id"))
        .namespace("orders")
        .build()
        .unwrap();
    let l2 = locker.clone();
    let app = Router::new().route(
        "/orders/{id}",
        post(move |guard: LockGuard| nested_work(l2.clone(), guard)).route_layer(layer),
    );
    let res = app
        .oneshot(Request::post("/orders/5").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let header = res.headers()["fencing-token"].to_str().unwrap().to_owned();
    let body = axum::body::to_bytes(res.into_body(), 1024).await.unwrap();
    assert_eq!(
        header.as_bytes(),
        &body[..],
        "the nested call got the layer's token"
    );
    assert!(
        !server.keys().iter().any(|k| k.ends_with(":lock")),
        "the lock outlived the request: {:?}",
        server.keys()
    );
}
