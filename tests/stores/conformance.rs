//! One behaviour suite, written once, run against every store.
//!
//! The promises every lease kind shares (contention, tokens, owner
//! checks, renewal, the hold cap, wake-ups, capacity) are in the matrix
//! (`conformance/matrix.rs`), run for every kind on every store that
//! keeps it; this file keeps what is the lock's own (records, the
//! operator's view, the local queue, the guard's API).
//!
//! `conformance!(name, fixture)` expands to a module of tests; the fixture
//! (from `support::stores`) returns a store plus whatever must stay alive
//! with it (the `redis-server` processes started on free ports).

use crate::support;

mod matrix;
use tower_redis_lock::{
    AcquireOutcome, Error, LockKey, LockStore, LockStoreExt, Locker, OwnerToken,
};

use support::{eventually, stores};

use std::sync::Arc;
use std::time::Duration;

/// A lease meant to lapse soon; the tests wait for its end on the
/// condition, not by sleeping. Long enough that a grant on a loaded
/// machine still counts: Redlock refuses a grant that took longer than
/// the lease's validity (30 ms once took 36 ms for five nodes while the
/// machine compiled; 100 ms took 100.9 ms on Valkey at load average 8-11).
const SHORT_LEASE: Duration = Duration::from_secs(1);

fn key(id: &str) -> LockKey {
    LockKey::new("conf", id).unwrap()
}

fn locker<S: LockStore>(store: S, lease_ms: u64, wait_ms: u64) -> Locker<S> {
    Locker::builder(store)
        .lease(Duration::from_millis(lease_ms))
        .wait_timeout(Duration::from_millis(wait_ms))
        .build()
        .unwrap()
}

macro_rules! conformance {
    ($name:ident, $fixture:expr) => {
        mod $name {
            use super::*;

            #[tokio::test]
            async fn reentry_by_the_same_owner_keeps_the_token() {
                let (store, _keep) = $fixture;
                let a = OwnerToken::generate();
                let k = key("reentry");
                let lease = Duration::from_secs(5);
                let first = store.acquire(&k, &a, lease).await.unwrap();
                let again = store.acquire(&k, &a, lease).await.unwrap();
                assert!(matches!(first, AcquireOutcome::Granted(_)));
                assert_eq!(first, again);
            }

            #[tokio::test]
            async fn try_lock_and_wait_timeout_errors_are_told_apart() {
                let (store, _keep) = $fixture;
                let l = locker(store, 5_000, 0);
                let k = key("errors");
                let _held = l.acquire(&k).await.unwrap();
                match l.try_acquire(&k).await {
                    Err(Error::Contended { retry_after, .. }) => {
                        assert!(retry_after > Duration::from_secs(2));
                    }
                    other => panic!("{other:?}"),
                }
                match l.acquire_within(&k, Duration::from_millis(60)).await {
                    Err(Error::WaitTimeout { waited, .. }) => {
                        assert!(waited >= Duration::from_millis(60));
                    }
                    other => panic!("{other:?}"),
                }
            }

            #[tokio::test]
            async fn release_says_whether_we_still_owned_the_lock() {
                let (store, _keep) = $fixture;
                let l = locker(store, 5_000, 0);
                let k = key("release");
                let g = l.acquire(&k).await.unwrap();
                let clone = g.clone();
                assert!(g.release().await.unwrap());
                assert!(!clone.is_held());
                assert!(!clone.is_lost(), "a clean release is not a loss");
                assert!(
                    !clone.release().await.unwrap(),
                    "second release through a clone"
                );
                // Free again: taken (and dropped) at once.
                drop(l.try_acquire(&k).await.unwrap());
            }

            #[tokio::test]
            async fn guard_extend_renews_and_reports_loss() {
                let (store, _keep) = $fixture;
                let l = locker(store, 5_000, 0);
                let g = l.acquire(&key("guard-extend")).await.unwrap();
                // Where the validity ends: an extend sent 20 ms or more
                // after the grant moves it at least that much later,
                // however long either call took to answer. (It compared
                // what was left just after each answer, 5 ms apart at
                // most: a slower answer to the extend failed it.)
                let ends = || tokio::time::Instant::now() + g.valid_for();
                let granted_until = ends();
                // Until the guard's own validity has run down by 20 ms.
                let start = g.valid_for();
                let ran_down = eventually(Duration::from_secs(5), async || {
                    g.valid_for() + Duration::from_millis(20) <= start
                })
                .await;
                assert!(ran_down);
                g.extend().await.unwrap();
                let extended_until = ends();
                assert!(
                    extended_until >= granted_until + Duration::from_millis(10),
                    "the extend moved the validity's end by {:?}",
                    extended_until.saturating_duration_since(granted_until)
                );
                assert!(g.clone().release().await.unwrap());
                assert!(matches!(g.extend().await, Err(Error::LockLost { .. })));
            }

            #[tokio::test]
            async fn finish_stores_the_record_and_releases_in_one_step() {
                let (store, _keep) = $fixture;
                let (a, b) = (OwnerToken::generate(), OwnerToken::generate());
                let k = key("finish");
                let lease = Duration::from_secs(10);
                assert!(matches!(
                    store.acquire_or_replay(&k, &a, lease).await.unwrap(),
                    AcquireOutcome::Granted(_)
                ));
                assert!(matches!(
                    store.acquire_or_replay(&k, &b, lease).await.unwrap(),
                    AcquireOutcome::Held { .. }
                ));
                assert_eq!(store.read_record(&k).await.unwrap(), None);
                let rec = bytes::Bytes::from_static(b"outcome\0\xff");
                assert!(
                    !store
                        .finish(&k, &b, rec.clone(), Duration::from_secs(60))
                        .await
                        .unwrap(),
                    "non-owner stored"
                );
                assert_eq!(store.read_record(&k).await.unwrap(), None);
                assert!(
                    store
                        .finish(&k, &a, rec.clone(), Duration::from_secs(60))
                        .await
                        .unwrap()
                );
                assert_eq!(store.read_record(&k).await.unwrap(), Some(rec.clone()));
                // The record answers duplicates; the lock itself is free.
                assert_eq!(
                    store.acquire_or_replay(&k, &b, lease).await.unwrap(),
                    AcquireOutcome::Completed(rec)
                );
                assert!(matches!(
                    store.acquire(&k, &b, lease).await.unwrap(),
                    AcquireOutcome::Granted(_)
                ));
            }

            /// `LockGuard::finish` is public and takes any retention: the
            /// largest one keeps the record (for as long as the store can
            /// say), never a panic or an overflow error.
            #[tokio::test]
            async fn a_retention_of_duration_max_keeps_the_record() {
                let (store, _keep) = $fixture;
                let locker = locker(store, 10_000, 0);
                let store = locker.store();
                let k = key("finish-max");
                let g = locker.acquire(&k).await.unwrap();
                let rec = bytes::Bytes::from_static(b"kept");
                assert!(g.finish(rec.clone(), Duration::MAX).await.unwrap());
                assert_eq!(store.read_record(&k).await.unwrap(), Some(rec.clone()));
                assert_eq!(
                    store
                        .acquire_or_replay(&k, &OwnerToken::generate(), Duration::from_secs(1))
                        .await
                        .unwrap(),
                    AcquireOutcome::Completed(rec)
                );
            }

            #[tokio::test]
            async fn a_holder_that_lost_its_lock_cannot_store_a_record() {
                let (store, _keep) = $fixture;
                let (old, new) = (OwnerToken::generate(), OwnerToken::generate());
                let k = key("finish-stale");
                let first = store
                    .acquire_or_replay(&k, &old, SHORT_LEASE)
                    .await
                    .unwrap();
                assert!(matches!(first, AcquireOutcome::Granted(_)), "{first:?}");
                assert!(
                    eventually(Duration::from_secs(5), async || matches!(
                        store
                            .acquire_or_replay(&k, &new, Duration::from_secs(10))
                            .await,
                        Ok(AcquireOutcome::Granted(_))
                    ))
                    .await
                );
                let rec = bytes::Bytes::from_static(b"stale");
                assert!(
                    !store
                        .finish(&k, &old, rec, Duration::from_secs(60))
                        .await
                        .unwrap()
                );
                assert_eq!(store.read_record(&k).await.unwrap(), None);
                assert!(
                    matches!(
                        store
                            .acquire(&k, &old, Duration::from_secs(1))
                            .await
                            .unwrap(),
                        AcquireOutcome::Held { .. }
                    ),
                    "the new holder's lock survived"
                );
            }

            #[tokio::test]
            async fn records_expire_after_their_retention() {
                let (store, _keep) = $fixture;
                let a = OwnerToken::generate();
                let k = key("record-expiry");
                store
                    .acquire_or_replay(&k, &a, Duration::from_secs(10))
                    .await
                    .unwrap();
                assert!(
                    store
                        .finish(
                            &k,
                            &a,
                            bytes::Bytes::from_static(b"r"),
                            Duration::from_millis(50)
                        )
                        .await
                        .unwrap()
                );
                assert!(
                    eventually(Duration::from_secs(5), async || matches!(
                        store
                            .acquire_or_replay(&k, &OwnerToken::generate(), Duration::from_secs(1))
                            .await,
                        Ok(AcquireOutcome::Granted(_))
                    ))
                    .await
                );
            }

            #[tokio::test]
            async fn a_waiting_duplicate_gets_the_record_when_the_holder_finishes() {
                let (store, _keep) = $fixture;
                let l = locker(store, 10_000, 10_000);
                let k = key("wait-replay");
                let tower_redis_lock::Acquired::Locked(first) = l
                    .acquire_or_replay_within(&k, Duration::ZERO)
                    .await
                    .unwrap()
                else {
                    panic!("first request must lock");
                };
                let waiter = {
                    let (l, k) = (l.clone(), k.clone());
                    tokio::spawn(async move {
                        l.acquire_or_replay_within(&k, Duration::from_secs(10))
                            .await
                    })
                };
                let mut rec = tower_redis_lock::Record::new(http::StatusCode::CREATED);
                rec = rec.with_body(bytes::Bytes::from_static(b"done"));
                // Finish while the duplicate waits.
                assert!(eventually(Duration::from_secs(5), async || l.has_waiters(&k)).await);
                assert!(
                    first
                        .finish(rec.encode(), Duration::from_secs(60))
                        .await
                        .unwrap()
                );
                match tokio::time::timeout(Duration::from_secs(5), waiter)
                    .await
                    .unwrap()
                    .unwrap()
                    .unwrap()
                {
                    tower_redis_lock::Acquired::Completed(got) => {
                        assert_eq!(tower_redis_lock::Record::decode(got), Some(rec))
                    }
                    other => panic!("{other:?}"),
                }
            }

            #[tokio::test]
            async fn inspect_shows_the_holder_without_its_owner_token() {
                let (store, _keep) = $fixture;
                let lease = Duration::from_secs(10);
                let l = Locker::builder(store.clone())
                    .lease(lease)
                    .label("conf-host pid 7")
                    .build()
                    .unwrap();
                let k = key("inspect");
                assert_eq!(l.inspect(&k).await.unwrap(), None, "free");
                let before = std::time::SystemTime::now();
                let guard = l.acquire(&k).await.unwrap();
                let seen = l.inspect(&k).await.unwrap().expect("held");
                assert_eq!(seen.key, k);
                assert_eq!(
                    seen.label.as_ref().map(|l| l.as_str()),
                    Some("conf-host pid 7")
                );
                assert_eq!(seen.fencing_token, Some(guard.fencing_token().unwrap()));
                let remaining = seen.remaining.expect("a lease");
                assert!(remaining <= lease && remaining > lease / 2, "{remaining:?}");
                let granted = seen.granted_at.expect("a grant time");
                let slack = Duration::from_secs(5);
                assert!(
                    granted + slack > before && granted < before + slack,
                    "{granted:?}"
                );
                assert!(!seen.waiters, "nobody waited yet");
                // The same hold, the same id; the id is not the owner token.
                assert_eq!(l.inspect(&k).await.unwrap().unwrap().holder, seen.holder);
                assert_eq!(seen.holder.as_str().len(), 16);
                // A try that finds it held marks it waited-for.
                let other = locker(store.clone(), 10_000, 0);
                assert!(other.try_acquire(&k).await.unwrap_err().is_contended());
                assert!(l.inspect(&k).await.unwrap().unwrap().waiters);
                // Another grant, another id; released, nobody.
                guard.release().await.unwrap();
                assert_eq!(l.inspect(&k).await.unwrap(), None, "released");
                let next = other.acquire(&k).await.unwrap();
                let again = l.inspect(&k).await.unwrap().expect("held again");
                assert_ne!(again.holder, seen.holder);
                assert_eq!(again.label, None, "the other locker sets no label");
                assert_eq!(again.fencing_token, Some(next.fencing_token().unwrap()));
            }

            #[tokio::test]
            async fn inspect_follows_renewals_and_the_holder_record_goes_with_the_lock() {
                let (store, _keep) = $fixture;
                let l = Locker::builder(store.clone())
                    .lease(Duration::from_millis(1_200))
                    .label("renewed")
                    .build()
                    .unwrap();
                let k = key("inspect-renewed");
                let lease = Duration::from_millis(1_200);
                let guard = l.acquire(&k).await.unwrap();
                // Renewed four times by the watchdog (the fourth at 4/3 of
                // the lease, past the end of the first): the holder record
                // must have been renewed with the lock to be there still.
                let margin = lease / 100 + Duration::from_millis(2);
                let renewed = |n: u32| {
                    guard.is_held()
                        && tokio::time::Instant::now() + guard.valid_for()
                            >= guard.acquired_at() + lease / 3 * n + lease - margin
                };
                assert!(eventually(Duration::from_secs(10), async || renewed(4)).await);
                let seen = l.inspect(&k).await.unwrap().expect("still held");
                assert_eq!(seen.label.as_ref().map(|l| l.as_str()), Some("renewed"));
                assert_eq!(seen.fencing_token, Some(guard.fencing_token().unwrap()));
                drop(guard);
                assert!(
                    eventually(Duration::from_secs(5), async || l
                        .inspect(&k)
                        .await
                        .unwrap()
                        .is_none())
                    .await
                );
            }

            #[tokio::test]
            async fn list_pages_through_the_held_locks_of_one_namespace() {
                let (store, _keep) = $fixture;
                let l = locker(store.clone(), 10_000, 0);
                let mut guards = Vec::new();
                let mut ids: Vec<String> = (0..23).map(|i| format!("job-{i}")).collect();
                // An id that is hashed in its key, too.
                ids.push("x".repeat(300));
                for id in &ids {
                    guards.push(
                        l.acquire(&LockKey::new("conf-list", id).unwrap())
                            .await
                            .unwrap(),
                    );
                }
                let elsewhere = l
                    .acquire(&LockKey::new("conf-other", "job-1").unwrap())
                    .await
                    .unwrap();
                let released = LockKey::new("conf-list", "gone").unwrap();
                l.acquire(&released).await.unwrap().release().await.unwrap();
                let mut seen = std::collections::BTreeMap::new();
                let mut cursor = Some(tower_redis_lock::ListCursor::start());
                let mut pages = 0;
                while let Some(at) = cursor {
                    let page = l.list("conf-list", &at, 5).await.unwrap();
                    for h in page.locks {
                        assert_eq!(h.key.namespace(), "conf-list");
                        seen.insert(h.key.to_string(), h.fencing_token);
                    }
                    cursor = page.next;
                    pages += 1;
                    assert!(pages < 1000, "the listing does not end");
                }
                let want: std::collections::BTreeMap<_, _> = guards
                    .iter()
                    .map(|g| (g.key().to_string(), Some(g.fencing_token().unwrap())))
                    .collect();
                assert_eq!(seen, want);
                assert!(pages > 1, "five at a time: more than one page");
                drop(elsewhere);
            }

            #[tokio::test]
            async fn force_release_takes_the_lock_and_raises_the_fence() {
                let (store, _keep) = $fixture;
                let l = locker(store.clone(), 10_000, 0);
                let k = key("forced");
                let old = l.acquire(&k).await.unwrap();
                let old_token = old.fencing_token().unwrap();
                let forced = l.force_release(&k, "conformance").await.unwrap();
                assert!(forced.released);
                let fence = forced.fence.expect("a fenced store raises the fence");
                assert!(fence > old_token, "{fence} after {old_token}");
                assert_eq!(l.inspect(&k).await.unwrap(), None);
                // The old holder learns at its next renewal.
                assert!(matches!(old.extend().await, Err(Error::LockLost { .. })));
                assert!(!old.is_held());
                // The next grant is above the fence.
                let next = l.try_acquire(&k).await.unwrap();
                let next_token = next.fencing_token().unwrap();
                assert!(next_token > fence);
                // The old holder's release cannot take the new one's lock.
                assert!(!old.release().await.unwrap());
                assert!(l.inspect(&k).await.unwrap().is_some());
                next.release().await.unwrap();
                // Nothing held: nothing released, the fence still rises.
                let again = l.force_release(&k, "conformance").await.unwrap();
                assert!(!again.released);
                assert!(again.fence.unwrap() > next_token);
            }

            #[tokio::test]
            async fn force_release_wakes_a_waiter() {
                let (store, _keep) = $fixture;
                let holder = locker(store.clone(), 30_000, 0);
                let k = key("forced-wake");
                let _old = holder.acquire(&k).await.unwrap();
                let waiting = stores::woken_only_by_notification(store.clone());
                let w = {
                    let (waiting, k) = (waiting.clone(), k.clone());
                    tokio::spawn(async move { waiting.acquire(&k).await })
                };
                assert!(eventually(Duration::from_secs(5), async || waiting.has_waiters(&k)).await);
                holder.force_release(&k, "conformance").await.unwrap();
                let got = tokio::time::timeout(Duration::from_secs(5), w).await;
                assert!(matches!(got, Ok(Ok(Ok(_)))), "{got:?}");
            }

            // One thread: the four tasks are all polled, and so all queued,
            // before the first one's next turn. (On two workers, a worker
            // thread the OS deschedules can leave a task unpolled while
            // another runs many rounds with nobody to queue behind: the
            // order then says nothing about the queue. Seen in CI.)
            #[tokio::test]
            async fn local_waiters_take_turns_and_a_releaser_queues_behind_them() {
                let (store, _keep) = $fixture;
                let l = locker(store, 10_000, 30_000);
                let k = key("fair");
                let order = Arc::new(std::sync::Mutex::new(Vec::new()));
                let mut tasks = Vec::new();
                for t in 0..4u32 {
                    let (l, k, order) = (l.clone(), k.clone(), order.clone());
                    tasks.push(tokio::spawn(async move {
                        for _ in 0..25 {
                            let g = l.acquire(&k).await.unwrap();
                            order.lock().unwrap().push(t);
                            tokio::task::yield_now().await;
                            g.release().await.unwrap();
                        }
                    }));
                }
                for t in tasks {
                    t.await.unwrap();
                }
                let order = order.lock().unwrap().clone();
                assert_eq!(order.len(), 100);
                // Without a queue the releaser wins nearly every time (it is
                // the first to ask again); with one it goes to the back.
                let repeats = order.windows(2).filter(|w| w[0] == w[1]).count();
                assert!(repeats <= 10, "{repeats} repeats: {order:?}");
            }
        }
    };
}

conformance!(memory, stores::memory());
conformance!(redis, stores::redis());
conformance!(redlock, stores::redlock(3));
conformance!(cluster, stores::cluster());
conformance!(sentinel, stores::sentinel());
conformance!(boxed_memory, stores::boxed(stores::memory()));
conformance!(boxed_redis, stores::boxed(stores::redis()));
