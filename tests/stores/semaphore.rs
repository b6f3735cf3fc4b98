//! The semaphore (`Locker::semaphore`) on every store that has one: one
//! suite, written once, run on memory, one Redis primary, Sentinel,
//! Cluster, and `BoxStore` over memory and over one Redis; then what only
//! Redis can show (server-clock expiry, the fence counter, Redis memory)
//! and what Redlock answers.

use crate::support;
use tower_redis_lock::{
    AcquireOutcome, Error, LeaseKind, LockKey, LockStore, LockStoreExt, Locker, OwnerToken,
};

use support::{eventually, stores};

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

fn key(id: &str) -> LockKey {
    LockKey::new("sem", id).unwrap()
}

fn locker<S: LockStore>(store: S, lease_ms: u64, wait_ms: u64) -> Locker<S> {
    Locker::builder(store)
        .lease(Duration::from_millis(lease_ms))
        .wait_timeout(Duration::from_millis(wait_ms))
        .build()
        .unwrap()
}

macro_rules! semaphore_suite {
    ($name:ident, $fixture:expr) => {
        mod $name {
            use super::*;

            /// 12 tasks over two lockers (two "processes") share 3 permits:
            /// never more than 3 at once, and 3 at once is reached.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn never_more_than_n_holders_under_contention() {
                let (store, _keep) = $fixture;
                let lockers = [
                    locker(store.clone(), 10_000, 30_000),
                    locker(store, 10_000, 30_000),
                ];
                let k = key("at-most-n");
                let (inside, most) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
                let mut tasks = Vec::new();
                for t in 0..12usize {
                    let sem = lockers[t % 2].semaphore(&k, 3).unwrap();
                    let (inside, most) = (inside.clone(), most.clone());
                    tasks.push(tokio::spawn(async move {
                        for _ in 0..6 {
                            let g = sem.acquire().await.unwrap();
                            let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                            most.fetch_max(now, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(3)).await;
                            inside.fetch_sub(1, Ordering::SeqCst);
                            g.release().await.unwrap();
                        }
                    }));
                }
                for t in tasks {
                    t.await.unwrap();
                }
                let most = most.load(Ordering::SeqCst);
                assert!(most <= 3, "{most} holders of 3 permits at once");
                assert_eq!(most, 3, "the 3 permits were never all used");
            }

            /// A holder that stops renewing (its process gone: a grant with
            /// no locker behind it) keeps its permit to the end of its
            /// lease, and not a moment longer than needed to notice.
            #[tokio::test]
            async fn a_crashed_holders_permit_comes_back_at_its_lease_end_never_earlier() {
                let (store, _keep) = $fixture;
                let k = key("crashed");
                // Long enough that the first try below answers within it
                // on a loaded machine (it must see the permit held).
                let lease = Duration::from_millis(1_200);
                // A longer permit beside it: the crashed one must come back
                // on its own, while the key stays held.
                let long = OwnerToken::generate();
                let granted = store
                    .acquire_permit(&k, &long, 2, Duration::from_secs(20))
                    .await
                    .unwrap();
                assert!(matches!(granted, AcquireOutcome::Granted(_)), "{granted:?}");
                let start = Instant::now();
                let crashed = OwnerToken::generate();
                let granted = store.acquire_permit(&k, &crashed, 2, lease).await.unwrap();
                assert!(matches!(granted, AcquireOutcome::Granted(_)), "{granted:?}");
                let other = OwnerToken::generate();
                let mut seen_held = false;
                let came_back = loop {
                    match store
                        .acquire_permit(&k, &other, 2, Duration::from_secs(10))
                        .await
                        .unwrap()
                    {
                        AcquireOutcome::Granted(_) => break start.elapsed(),
                        AcquireOutcome::Held { remaining: Some(r) } => {
                            seen_held = true;
                            assert!(r <= lease, "remaining {r:?} of a {lease:?} lease");
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                        other => panic!("{other:?}"),
                    }
                    assert!(start.elapsed() < lease * 5, "never came back");
                };
                assert!(seen_held, "granted at once beside a held permit");
                // (The server counts whole milliseconds: 2 ms of slack.)
                assert!(
                    came_back + Duration::from_millis(2) >= lease,
                    "came back after {came_back:?}, before the {lease:?} lease ended"
                );
                assert!(came_back < lease * 3, "came back only after {came_back:?}");
                assert!(store.release(LeaseKind::Permit, &k, &other).await.unwrap());
                assert!(store.release(LeaseKind::Permit, &k, &long).await.unwrap());
            }

            /// Two lockers, as two processes: the waiter's locker polls
            /// once an hour, so only the store's release notification can
            /// wake it in time.
            #[tokio::test]
            async fn a_waiter_is_woken_by_a_release_not_by_polling() {
                let (store, _keep) = $fixture;
                let holder = locker(store.clone(), 10_000, 0);
                let waiter = stores::woken_only_by_notification(store);
                let k = key("woken");
                let g = holder
                    .semaphore(&k, 1)
                    .unwrap()
                    .try_acquire()
                    .await
                    .unwrap();
                let sem = waiter.semaphore(&k, 1).unwrap();
                let waiting = tokio::spawn(async move {
                    let g = sem.acquire().await;
                    (g, Instant::now())
                });
                assert!(eventually(Duration::from_secs(5), async || waiter.has_waiters(&k)).await);
                // (Released whenever the waiter is on its way in: the strict
                // "subscribed, then released" order is
                // `*_a_permit_waiter_subscribed_is_woken_by_the_release`.)
                let released = Instant::now();
                assert!(g.release().await.unwrap());
                let (got, at) = tokio::time::timeout(Duration::from_secs(10), waiting)
                    .await
                    .expect("the waiter was not woken by the release")
                    .unwrap();
                let got = got.unwrap();
                let took = at - released;
                assert!(
                    took < Duration::from_secs(1),
                    "woken {took:?} after the release"
                );
                got.release().await.unwrap();
            }

            /// Waiters of one locker each get a permit as one is freed: a
            /// permit held by a task of this process does not mean none is
            /// free (the lock's "held here, ask nobody" shortcut must not
            /// apply). The locker polls once an hour.
            #[tokio::test]
            async fn local_waiters_each_get_a_freed_permit() {
                let (store, _keep) = $fixture;
                let l = stores::woken_only_by_notification(store);
                let k = key("local-waiters");
                let sem = l.semaphore(&k, 2).unwrap();
                let (g1, g2) = (
                    sem.try_acquire().await.unwrap(),
                    sem.try_acquire().await.unwrap(),
                );
                let spawn_waiter = || {
                    let sem = sem.clone();
                    tokio::spawn(async move { sem.acquire().await.unwrap() })
                };
                let (w1, w2) = (spawn_waiter(), spawn_waiter());
                assert!(eventually(Duration::from_secs(5), async || l.has_waiters(&k)).await);
                g1.release().await.unwrap();
                let got1 = tokio::time::timeout(Duration::from_secs(5), w1)
                    .await
                    .expect("the first waiter got no permit")
                    .unwrap();
                g2.release().await.unwrap();
                let got2 = tokio::time::timeout(Duration::from_secs(5), w2)
                    .await
                    .expect("the second waiter got no permit while one was free")
                    .unwrap();
                assert!(got1.is_held() && got2.is_held());
            }

            /// Tokens of permits and of the key's lock come from one
            /// counter: strictly rising whatever the kind, across releases
            /// and several holders.
            #[tokio::test]
            async fn tokens_rise_across_permits_and_the_lock_of_a_key() {
                let (store, _keep) = $fixture;
                let l = locker(store, 10_000, 0);
                let k = key("tokens");
                let sem = l.semaphore(&k, 2).unwrap();
                let mut last = 0u64;
                for round in 0..15 {
                    let a = sem.try_acquire().await.unwrap();
                    let b = sem.try_acquire().await.unwrap();
                    let (ta, tb) = (
                        a.fencing_token().unwrap().get(),
                        b.fencing_token().unwrap().get(),
                    );
                    assert!(ta > last && tb > ta, "round {round}: {last}, {ta}, {tb}");
                    assert!(sem.try_acquire().await.unwrap_err().is_contended());
                    a.release().await.unwrap();
                    b.release().await.unwrap();
                    let lock = l.try_acquire(&k).await.unwrap();
                    let tl = lock.fencing_token().unwrap().get();
                    assert!(tl > tb, "round {round}: lock token {tl} after permit {tb}");
                    last = tl;
                    lock.release().await.unwrap();
                }
            }

            /// The watchdog renews a permit past its lease, and no other
            /// holder gets it meanwhile.
            #[tokio::test]
            async fn the_watchdog_keeps_a_permit_across_several_leases() {
                let (store, _keep) = $fixture;
                // The lease of the lock's version of this test: a 300 ms
                // lease lapsed when the test's thread got no CPU for about
                // 200 ms (2 cores, a full test run and three builds), and
                // CI now runs two test passes at once: 1.2 s, three leases
                // watched.
                let l = locker(store.clone(), 1_200, 0);
                let other = locker(store, 1_200, 0);
                let k = key("renewed");
                let g = l.semaphore(&k, 1).unwrap().try_acquire().await.unwrap();
                let held_from = Instant::now();
                let sem = other.semaphore(&k, 1).unwrap();
                while held_from.elapsed() < Duration::from_millis(3_600) {
                    assert!(g.is_held(), "lost after {:?}", held_from.elapsed());
                    assert!(sem.try_acquire().await.unwrap_err().is_contended());
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                assert!(!g.is_lost());
                assert!(
                    g.release().await.unwrap(),
                    "still owned after 3 lease lengths"
                );
                assert!(sem.try_acquire().await.is_ok());
            }

            /// Re-entry shares the permit; a permit and the key's lock are
            /// apart.
            #[tokio::test]
            async fn reentry_shares_the_permit_and_the_lock_is_apart() {
                let (store, _keep) = $fixture;
                let l = locker(store.clone(), 10_000, 0);
                let other = locker(store, 10_000, 0);
                let k = key("reenter");
                let sem = l.semaphore(&k, 1).unwrap();
                let outer = sem.try_acquire().await.unwrap();
                let inner = outer.reenter().unwrap();
                assert_eq!(inner.fencing_token(), outer.fencing_token());
                assert_eq!(outer.hold_count(), 2);
                // Inside its scope, asking for a permit of the key is one
                // more hold on the same permit; the lock is a lock.
                let (again, lock) = outer
                    .scope(async {
                        (
                            sem.try_acquire().await.unwrap(),
                            l.try_acquire(&k).await.unwrap(),
                        )
                    })
                    .await;
                assert_eq!(again.fencing_token(), outer.fencing_token());
                assert_eq!(lock.hold_count(), 1);
                assert!(lock.fencing_token().unwrap() > outer.fencing_token().unwrap());
                lock.release().await.unwrap();
                drop(again);
                let taken = other.semaphore(&k, 1).unwrap();
                inner.release().await.unwrap();
                assert!(taken.try_acquire().await.unwrap_err().is_contended());
                outer.release().await.unwrap();
                assert!(taken.try_acquire().await.is_ok());
            }

            /// Bad permit counts are refused before any store call; a
            /// caller's own N is what counts.
            #[tokio::test]
            async fn permit_counts_are_checked_and_the_callers_n_counts() {
                let (store, _keep) = $fixture;
                let l = locker(store, 10_000, 0);
                let k = key("counts");
                for bad in [0, 65_537, u32::MAX] {
                    match l.semaphore(&k, bad) {
                        Err(Error::Config(e)) => assert_eq!(e.setting(), "permits"),
                        other => panic!("{bad} permits: {other:?}"),
                    }
                }
                let two = l.semaphore(&k, 2).unwrap();
                let (_a, _b) = (
                    two.try_acquire().await.unwrap(),
                    two.try_acquire().await.unwrap(),
                );
                assert!(two.try_acquire().await.unwrap_err().is_contended());
                // A caller that says 3 is granted a third; one that says 1
                // is refused.
                let _c = l.semaphore(&k, 3).unwrap().try_acquire().await.unwrap();
                assert!(l.semaphore(&k, 1).unwrap().try_acquire().await.is_err());
            }

            /// A try that finds no permit answers when the soonest one ends.
            #[tokio::test]
            async fn contention_tells_when_the_soonest_permit_ends() {
                let (store, _keep) = $fixture;
                let short = locker(store.clone(), 2_000, 0);
                let long = locker(store, 20_000, 0);
                let k = key("retry-after");
                let _long = long.semaphore(&k, 2).unwrap().try_acquire().await.unwrap();
                let _short = short.semaphore(&k, 2).unwrap().try_acquire().await.unwrap();
                let err = long
                    .semaphore(&k, 2)
                    .unwrap()
                    .try_acquire()
                    .await
                    .unwrap_err();
                let after = err.retry_after().unwrap();
                assert!(
                    after <= Duration::from_secs(2) && after > Duration::from_millis(500),
                    "{after:?}"
                );
            }
        }
    };
}

semaphore_suite!(memory, stores::memory());
semaphore_suite!(redis, stores::redis());
semaphore_suite!(cluster, stores::cluster());
semaphore_suite!(sentinel, stores::sentinel());
semaphore_suite!(boxed_memory, stores::boxed(stores::memory()));
semaphore_suite!(boxed_redis, stores::boxed(stores::redis()));

/// The waiter (another locker, as another process: no local wake-up)
/// polls once an hour; it is released only once it has subscribed and its
/// try after subscribing found no permit (the key is marked as
/// waited-for), so only the release's notification can wake it.
async fn a_permit_waiter_subscribed_is_woken_by_the_release<S: LockStore + Clone>(
    store: S,
    marked: impl AsyncFnMut() -> bool,
) {
    let holder = locker(store.clone(), 10_000, 0);
    let waiter = stores::woken_only_by_notification(store);
    let k = key("strict-wake");
    let g = holder
        .semaphore(&k, 1)
        .unwrap()
        .try_acquire()
        .await
        .unwrap();
    let sem = waiter.semaphore(&k, 1).unwrap();
    let waiting = tokio::spawn(async move {
        let g = sem.acquire().await;
        (g, Instant::now())
    });
    assert!(eventually(Duration::from_secs(5), marked).await);
    let released = Instant::now();
    assert!(g.release().await.unwrap());
    let (got, at) = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter was not woken by the release")
        .unwrap();
    let took = at - released;
    assert!(
        took < Duration::from_secs(1),
        "woken {took:?} after the release"
    );
    got.unwrap().release().await.unwrap();
}

#[tokio::test]
async fn memory_a_permit_waiter_subscribed_is_woken_by_the_release() {
    let store = tower_redis_lock::MemoryStore::new();
    let k = key("strict-wake");
    let watched = store.clone();
    a_permit_waiter_subscribed_is_woken_by_the_release(store, async || watched.is_watched(&k))
        .await;
}

#[tokio::test]
async fn redis_a_permit_waiter_subscribed_is_woken_by_the_release() {
    let (store, server) = stores::redis();
    let mark = stores::redis_name("sem", "strict-wake", "permits-waited");
    a_permit_waiter_subscribed_is_woken_by_the_release(store, async || {
        server.cmd(&["EXISTS", &mark]) == support::Reply::Int(1)
    })
    .await;
}

/// A permit whose lease lapses behind its holder (the store lost it) is
/// reported lost at the next renewal.
#[tokio::test]
async fn memory_a_permit_the_store_lost_is_reported_lost() {
    let store = tower_redis_lock::MemoryStore::new();
    let l = locker(store.clone(), 300, 0);
    let k = key("lost-memory");
    let g = l.semaphore(&k, 2).unwrap().try_acquire().await.unwrap();
    assert_eq!(store.permits_held(&k), 1);
    assert_eq!(store.lose_permits(&k), 1);
    tokio::time::timeout(Duration::from_secs(2), g.lost())
        .await
        .expect("lost() did not resolve");
    assert!(!g.is_held());
}

#[tokio::test]
async fn redis_a_permit_whose_set_was_deleted_is_reported_lost() {
    let (store, server) = stores::redis();
    let l = locker(store.clone(), 300, 0);
    let k = key("lost-redis");
    let g = l.semaphore(&k, 2).unwrap().try_acquire().await.unwrap();
    server.cmd(&["DEL", &store.permits_key(&k)]);
    tokio::time::timeout(Duration::from_secs(2), g.lost())
        .await
        .expect("lost() did not resolve");
    assert!(!g.is_held());
    assert!(
        !g.release().await.unwrap(),
        "released a permit it no longer had"
    );
}

/// The permits' set shares the lock's hash tag; its members are scored by
/// the lease end on the server's clock, and the set expires with its
/// longest lease.
#[tokio::test]
async fn redis_the_permits_live_under_the_locks_hash_tag_scored_by_lease_end() {
    let (store, server) = stores::redis();
    let l = locker(store.clone(), 10_000, 0);
    let k = key("layout");
    let g = l.semaphore(&k, 4).unwrap().try_acquire().await.unwrap();
    let name = store.permits_key(&k);
    let lock = store.lock_key(&k);
    let tag = |n: &str| n[n.find('{').unwrap()..=n.find('}').unwrap()].to_string();
    assert_eq!(tag(&name), tag(&lock));
    assert!(name.ends_with(":permits"), "{name}");
    let support::Reply::Array(Some(time)) = server.cmd(&["TIME"]) else {
        panic!("TIME");
    };
    let now_ms = match &time[0] {
        support::Reply::Bulk(Some(s)) => String::from_utf8_lossy(s).parse::<u64>().unwrap() * 1000,
        other => panic!("{other:?}"),
    };
    let support::Reply::Array(Some(members)) =
        server.cmd(&["ZRANGE", &name, "0", "-1", "WITHSCORES"])
    else {
        panic!("ZRANGE");
    };
    assert_eq!(members.len(), 2, "one permit: {members:?}");
    let score = match &members[1] {
        support::Reply::Bulk(Some(s)) => String::from_utf8_lossy(s).parse::<u64>().unwrap(),
        other => panic!("{other:?}"),
    };
    assert!(
        score > now_ms + 8_000 && score <= now_ms + 11_000,
        "score {score}, server time {now_ms} ms"
    );
    let pttl = match server.cmd(&["PTTL", &name]) {
        support::Reply::Int(n) => n,
        other => panic!("{other:?}"),
    };
    assert!(pttl > 8_000 && pttl <= 10_000, "PTTL {pttl}");
    g.release().await.unwrap();
    assert_eq!(
        server.cmd(&["EXISTS", &name]),
        support::Reply::Int(0),
        "the empty set is left behind"
    );
}

/// A permit's token is minted from the key's bucket counter: a counter far
/// ahead of the clock still gives a larger token.
#[tokio::test]
async fn redis_a_permits_token_is_above_the_buckets_counter() {
    let (store, server) = stores::redis();
    let l = locker(store.clone(), 10_000, 0);
    let k = key("counter");
    let ahead: u64 = 9_000_000_000_000_000;
    server.cmd(&["SET", &store.fence_key(&k), &ahead.to_string()]);
    let g = l.semaphore(&k, 3).unwrap().try_acquire().await.unwrap();
    assert_eq!(g.fencing_token().unwrap().get(), ahead + 1);
    g.release().await.unwrap();
}

/// A flood of distinct keys (released, or left to expire) leaves nothing in
/// Redis but the fencing counters (at most 1,024 per namespace); bad counts
/// write nothing at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_flood_of_keys_leaves_only_the_counters() {
    let (store, server) = stores::redis();
    let l = locker(store.clone(), 10_000, 0);
    for bad in [0, 1_000_000] {
        assert!(l.semaphore(&key("bad"), bad).is_err());
    }
    assert_eq!(server.dbsize(), 0, "a refused count wrote to Redis");
    let mut tasks = Vec::new();
    for chunk in 0..8 {
        let store = store.clone();
        let l = l.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..250 {
                let k = key(&format!("flood-{chunk}-{i}"));
                if i % 5 == 0 {
                    // Left to expire: a crashed holder.
                    let owner = OwnerToken::generate();
                    store
                        .acquire_permit(&k, &owner, 7, Duration::from_millis(300))
                        .await
                        .unwrap();
                } else {
                    let g = l.semaphore(&k, 7).unwrap().try_acquire().await.unwrap();
                    g.release().await.unwrap();
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert!(
        eventually(Duration::from_secs(5), async || server
            .keys_besides_counters()
            .is_empty())
        .await,
        "left behind: {:?}",
        server
            .keys_besides_counters()
            .iter()
            .take(5)
            .collect::<Vec<_>>()
    );
    assert!(server.keys().len() <= 1024);
}

#[tokio::test]
async fn memory_a_flood_of_keys_leaves_nothing() {
    let store = tower_redis_lock::MemoryStore::new();
    let l = locker(store.clone(), 10_000, 0);
    for i in 0..3_000 {
        let k = key(&format!("flood-{i}"));
        if i % 3 == 0 {
            let owner = OwnerToken::generate();
            store
                .acquire_permit(&k, &owner, 2, Duration::from_millis(50))
                .await
                .unwrap();
        } else {
            let g = l.semaphore(&k, 2).unwrap().try_acquire().await.unwrap();
            g.release().await.unwrap();
        }
    }
    tokio::time::sleep(Duration::from_millis(60)).await;
    // The next grants sweep what expired.
    for i in 0..1_100 {
        let g = l.semaphore(&key(&format!("after-{i}")), 1).unwrap();
        g.try_acquire().await.unwrap().release().await.unwrap();
    }
    assert_eq!(store.keys_kept(), 0);
}

/// Permit acquires dropped at every point of their way (before, during,
/// after the grant) and guards dropped at once leave no permit behind:
/// each attempt whose answer was not taken is released in the background,
/// long before its 30 s lease would end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_dropped_permit_acquires_and_guards_leave_no_permit() {
    let (store, server) = stores::redis();
    let l = locker(store.clone(), 30_000, 2_000);
    let k = key("dropped");
    let name = store.permits_key(&k);
    let sem = l.semaphore(&k, 3).unwrap();
    for round in 0..60u64 {
        let cut = Duration::from_micros(round * 37 % 1_500);
        match tokio::time::timeout(cut, sem.acquire()).await {
            Ok(Ok(g)) => drop(g),
            Ok(Err(e)) => panic!("round {round}: {e}"),
            Err(_) => {}
        }
    }
    assert!(
        eventually(Duration::from_secs(5), async || server
            .cmd(&["EXISTS", &name])
            == support::Reply::Int(0))
        .await,
        "permits left: {:?}",
        server.cmd(&["ZRANGE", &name, "0", "-1"])
    );
    assert!(eventually(Duration::from_secs(5), async || l.status().renewing == 0).await);
}

/// The permit scripts come back after the server forgets its scripts
/// (`SCRIPT FLUSH`, as after a restart or failover): grants, the
/// watchdog's pipelined renewals (which reload the permit renewal script
/// beside the lock's) and releases all go on.
#[tokio::test]
async fn redis_permits_survive_a_script_flush() {
    let (store, server) = stores::redis();
    let l = locker(store.clone(), 1_000, 0);
    let k = key("noscript");
    let sem = l.semaphore(&k, 2).unwrap();
    let g = sem.try_acquire().await.unwrap();
    // A lock beside it: one pipeline renews both kinds.
    let lock = l.try_acquire(&key("noscript-lock")).await.unwrap();
    server.cmd(&["SCRIPT", "FLUSH"]);
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(3_000) {
        assert!(g.is_held(), "the permit was lost after the flush");
        assert!(lock.is_held(), "the lock was lost after the flush");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server.cmd(&["SCRIPT", "FLUSH"]);
    let second = sem.try_acquire().await.unwrap();
    server.cmd(&["SCRIPT", "FLUSH"]);
    assert!(g.release().await.unwrap());
    assert!(second.release().await.unwrap());
    assert!(lock.release().await.unwrap());
    assert_eq!(
        server.cmd(&["EXISTS", &store.permits_key(&k)]),
        support::Reply::Int(0)
    );
}
