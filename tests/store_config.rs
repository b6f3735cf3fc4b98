//! Out-of-range durations never reach Redis as invalid expiries (issue 10,
//! #9): settings are refused with a clear error, per-call durations are
//! capped.

mod support;

use std::time::Duration;

use bytes::Bytes;
use support::RedisServer;
use tower_redis_lock::{AcquireOutcome, LockKey, LockStore, OwnerToken, RedisStore};

const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

#[test]
fn a_fence_retention_past_what_redis_accepts_is_refused() {
    let store = RedisStore::from_url("redis://127.0.0.1:1/").unwrap();
    let err = store
        .clone()
        .with_fence_retention(Duration::MAX)
        .unwrap_err();
    assert_eq!(err.setting(), "fence_retention");
    assert!(err.to_string().contains("at most"), "{err}");
    assert!(store.clone().with_fence_retention(CENTURY).is_ok());
    assert!(
        store
            .with_fence_retention(CENTURY + Duration::from_secs(1))
            .is_err()
    );
}

#[test]
fn a_command_timeout_past_an_hour_is_refused() {
    let store = RedisStore::from_url("redis://127.0.0.1:1/").unwrap();
    let err = store
        .clone()
        .with_command_timeout(Duration::MAX)
        .unwrap_err();
    assert_eq!(err.setting(), "command_timeout");
    assert!(
        store
            .with_command_timeout(Duration::from_secs(3600))
            .is_ok()
    );
}

/// The longest fence retention allowed works against a real server: the
/// grant succeeds and the counter carries that expiry.
#[tokio::test]
async fn the_longest_fence_retention_grants() {
    let server = RedisServer::start();
    let store = RedisStore::from_url(&server.url())
        .unwrap()
        .with_fence_retention(CENTURY)
        .unwrap();
    let k = LockKey::new("config", "retention").unwrap();
    let owner = OwnerToken::generate();
    assert!(matches!(
        store
            .acquire(&k, &owner, Duration::from_secs(5))
            .await
            .unwrap(),
        AcquireOutcome::Granted(_)
    ));
    let pttl = server
        .cmd(&["PTTL", &store.fence_key(&k)])
        .as_int()
        .unwrap();
    assert!(
        pttl > (CENTURY - Duration::from_secs(60)).as_millis() as i64,
        "{pttl}"
    );
}

/// A lease or record retention of `Duration::MAX` is capped to an expiry
/// Redis accepts instead of wrapping into an invalid one (every such call
/// answered an error).
#[tokio::test]
async fn unbounded_lease_and_retention_are_capped() {
    let server = RedisServer::start();
    let store = RedisStore::from_url(&server.url()).unwrap();
    let k = LockKey::new("config", "max").unwrap();
    let owner = OwnerToken::generate();
    assert!(matches!(
        store.acquire(&k, &owner, Duration::MAX).await.unwrap(),
        AcquireOutcome::Granted(_)
    ));
    assert!(store.extend(&k, &owner, Duration::MAX).await.unwrap());
    assert!(
        store
            .finish(&k, &owner, Bytes::from_static(b"done"), Duration::MAX)
            .await
            .unwrap()
    );
    assert_eq!(
        store.read_record(&k).await.unwrap(),
        Some(Bytes::from_static(b"done"))
    );
    let pttl = server
        .cmd(&["PTTL", &store.record_key(&k)])
        .as_int()
        .unwrap();
    assert!(pttl > 0, "{pttl}");
}
