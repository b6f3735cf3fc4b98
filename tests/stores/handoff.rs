//! A lock handed to another holder: `LockGuard::export` and
//! `Locker::resume`, on every store (memory, one Redis primary, Redlock
//! over three primaries). The resumed guard holds the original grant,
//! renewed by the resuming locker; a lease that lapsed or was taken over
//! is never resumed; a resumed lock that is lost says so.

use crate::support;

use support::{eventually, stores};

use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;
use tower_redis_lock::{Acquired, Error, ExportedLease, LockKey, LockStore, Locker};

/// Upper bound on every wait for a condition; reached only on failure.
const LIMIT: Duration = Duration::from_secs(10);
/// Short enough that a test outlives a few leases, long enough for
/// Redlock's grant on a loaded machine, and for a resume to come within
/// it (nobody renews an exported lease until then) and the watchdog's
/// renewals to be 800 ms late (600 ms left 400 ms).
const LEASE: Duration = Duration::from_millis(1_200);

fn key(id: &str) -> LockKey {
    LockKey::new("handoff", id).unwrap()
}

fn locker<S: LockStore>(store: S) -> Locker<S> {
    Locker::builder(store).lease(LEASE).build().unwrap()
}

/// An export read back from its JSON, as a worker in another process gets it.
fn through_json(lease: ExportedLease) -> ExportedLease {
    let text = serde_json::to_string(&lease).unwrap();
    serde_json::from_str(&text).unwrap()
}

macro_rules! handoff {
    ($name:ident, $fixture:expr) => {
        mod $name {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_resumed_lease_is_held_renewed_and_finished_by_its_new_holder() {
                let (store, _keep) = $fixture;
                let (web, worker) = (locker(store.clone()), locker(store));
                let k = key("resumed");
                let guard = web.acquire(&k).await.unwrap();
                let token = guard.fencing_token();
                let lease = through_json(guard.export().unwrap());
                assert_eq!(lease.key(), &k);
                assert_eq!(lease.fencing_token(), token);
                assert_eq!(web.status().renewing, 0, "the exporter still renews");

                let resumed = worker.resume(lease).await.unwrap();
                assert!(resumed.is_held());
                assert_eq!(resumed.fencing_token(), token);
                assert_eq!(worker.status().renewing, 1);
                // Three leases on, the worker's watchdog has kept it.
                tokio::time::sleep_until(Instant::now() + 3 * LEASE).await;
                assert!(resumed.is_held());
                assert!(matches!(
                    web.try_acquire(&k).await,
                    Err(Error::Contended { .. })
                ));

                // Finished by the worker: the record answers the next caller.
                let record = Bytes::from_static(b"the final answer");
                assert!(
                    resumed
                        .finish(record.clone(), Duration::from_secs(60))
                        .await
                        .unwrap()
                );
                match web.acquire_or_replay(&k).await.unwrap() {
                    Acquired::Completed(raw) => assert_eq!(raw, record),
                    Acquired::Locked(_) => panic!("the worker's record was not stored"),
                }
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_resumed_lease_can_be_released() {
                let (store, _keep) = $fixture;
                let (web, worker) = (locker(store.clone()), locker(store));
                let k = key("released");
                let lease = web.acquire(&k).await.unwrap().export().unwrap();
                let resumed = worker.resume(lease).await.unwrap();
                assert!(resumed.release().await.unwrap());
                let next = web.try_acquire(&k).await.unwrap();
                next.release().await.unwrap();
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_lease_that_lapsed_or_was_taken_over_is_not_resumed() {
                let (store, _keep) = $fixture;
                let (web, worker) = (locker(store.clone()), locker(store));
                let k = key("lapsed");
                let lease = web.acquire(&k).await.unwrap().export().unwrap();
                // Nobody renews an exported lease: another caller gets the
                // key once it lapses.
                let mut taker = None;
                assert!(
                    eventually(LIMIT, async || {
                        taker = web.try_acquire(&k).await.ok();
                        taker.is_some()
                    })
                    .await
                );
                let taker = taker.unwrap();
                assert!(taker.fencing_token().unwrap() > lease.fencing_token().unwrap());
                match worker.resume(lease.clone()).await {
                    Err(Error::LockLost { key }) => assert_eq!(key, k),
                    other => panic!("a taken-over lease resumed: {other:?}"),
                }
                assert!(taker.is_held(), "the failed resume touched the new holder");
                taker.release().await.unwrap();
                // Lapsed and free: still not ours.
                assert!(matches!(
                    worker.resume(lease).await,
                    Err(Error::LockLost { .. })
                ));
                assert_eq!(worker.status().renewing, 0);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_guard_that_no_longer_holds_exports_nothing() {
                let (store, _keep) = $fixture;
                let web = locker(store);
                let k = key("not-held");
                let guard = web.acquire(&k).await.unwrap();
                let clone = guard.clone();
                clone.release().await.unwrap();
                assert!(matches!(guard.export(), Err(Error::LockLost { .. })));
                // An export ends every clone's hold, and dropping them
                // releases nothing.
                let guard = web.acquire(&k).await.unwrap();
                let other = guard.clone();
                let lease = guard.export().unwrap();
                assert!(!other.is_held());
                drop(other);
                assert!(
                    web.try_acquire(&k).await.is_err(),
                    "a clone's drop released it"
                );
                web.resume(lease).await.unwrap().release().await.unwrap();
            }
        }
    };
}

handoff!(memory, stores::memory());
handoff!(redis, stores::redis());
handoff!(redlock, stores::redlock(3));

/// A resumed lock that is lost says so (`lost()` resolves, `is_held()`
/// turns false), as the original guard would have.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_lock_that_is_taken_over_is_reported_lost_memory() {
    let (store, ()) = stores::memory();
    let worker = locker(store.clone());
    let k = key("lost");
    let lease = locker(store.clone())
        .acquire(&k)
        .await
        .unwrap()
        .export()
        .unwrap();
    let resumed = worker.resume(lease).await.unwrap();
    store.take_over(&k, Duration::from_secs(30));
    tokio::time::timeout(LIMIT, resumed.lost())
        .await
        .expect("the loss was not reported");
    assert!(!resumed.is_held());
    assert!(
        !resumed
            .finish(Bytes::new(), Duration::from_secs(60))
            .await
            .unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_lock_that_is_deleted_is_reported_lost_redis() {
    let (store, server) = stores::redis();
    let worker = locker(store.clone());
    let k = key("lost");
    let lease = locker(store).acquire(&k).await.unwrap().export().unwrap();
    let resumed = worker.resume(lease).await.unwrap();
    let lock = stores::redis_name("handoff", "lost", "lock");
    assert_eq!(server.cmd(&["DEL", &lock]).as_int(), Some(1));
    tokio::time::timeout(LIMIT, resumed.lost())
        .await
        .expect("the loss was not reported");
    assert!(!resumed.is_held());
}

/// The serialized form is checked field by field: a forged or damaged
/// value is refused, never resumed as another key or owner.
#[tokio::test]
async fn an_exported_lease_reads_back_only_when_every_field_is_valid() {
    let web = locker(stores::memory().0);
    let lease = web.acquire(&key("wire")).await.unwrap().export().unwrap();
    let v = serde_json::to_value(&lease).unwrap();
    assert_eq!(v["key"], "handoff:wire");
    assert_eq!(v["lease_ms"], LEASE.as_millis() as u64);
    assert_eq!(v["owner"].as_str().unwrap().len(), 32);
    assert!(v["fencing_token"].as_u64().unwrap() > 0);
    assert!(!format!("{lease:?}").contains(v["owner"].as_str().unwrap()));
    let with = |field: &str, value: serde_json::Value| {
        let mut w = v.clone();
        w[field] = value;
        serde_json::from_value::<ExportedLease>(w)
    };
    assert!(with("key", "handoff:wire".into()).is_ok());
    for (field, bad) in [
        ("key", serde_json::json!("handoff")),
        ("key", serde_json::json!("handoff:{x}")),
        ("key", serde_json::json!("bad ns:x")),
        ("owner", serde_json::json!("XYZ")),
        (
            "owner",
            serde_json::json!("0123456789ABCDEF0123456789abcdef"),
        ),
        ("fencing_token", serde_json::json!(0)),
        ("lease_ms", serde_json::json!(0)),
        ("extra", serde_json::json!(1)),
    ] {
        assert!(with(field, bad.clone()).is_err(), "{field} = {bad}");
    }
    let _ = through_json(lease);
}
