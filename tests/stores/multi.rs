//! Several keys at once (`Locker::acquire_all`) on every store: one suite,
//! written once, run on memory, one Redis primary, Sentinel, a Cluster with
//! the keys in one slot (one script) and across slots (one by one, rolled
//! back), Redlock (one by one), and `BoxStore` over memory and over one
//! Redis; then what only one store can show.

use crate::support;

use support::{RedisServer, Reply, eventually, stores};

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use tower_redis_lock::redis::cluster_routing::Slot;
use tower_redis_lock::{
    Error, LockKey, LockStore, Locker, MemoryStore, OperatorStore, OwnerToken, RedisStore,
};

const NS: &str = "multi";

/// The fencing bucket of `ns:id` (README, "Key layout": 32-bit FNV-1a,
/// modulo 1,024): ids of one bucket share a hash tag, so one Cluster slot.
fn bucket(id: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in format!("{NS}:{id}").bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h % 1024
}

/// The Cluster slot of `id`'s lock.
fn slot(id: &str) -> Slot {
    Slot::for_key(stores::redis_name(NS, id, "lock"))
}

/// `n` keys named after `tag` whose locks share one slot (one bucket).
fn one_slot(tag: &str, n: usize) -> Vec<LockKey> {
    let want = bucket(&format!("{tag}-0"));
    let ids = (0..).map(|i| format!("{tag}-{i}"));
    let ids: Vec<String> = ids.filter(|id| bucket(id) == want).take(n).collect();
    sorted(&ids)
}

/// The keys of `ids`, in the fixed global order a guard keeps them in.
fn sorted(ids: &[String]) -> Vec<LockKey> {
    let mut keys: Vec<LockKey> = ids.iter().map(|id| LockKey::new(NS, id).unwrap()).collect();
    keys.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    keys
}

/// `n` keys named after `tag` whose locks are each in a slot of its own.
fn own_slots(tag: &str, n: usize) -> Vec<LockKey> {
    let mut seen = Vec::new();
    let mut ids = Vec::new();
    for id in (0..).map(|i| format!("{tag}-{i}")) {
        let s = slot(&id);
        if !seen.contains(&s) {
            seen.push(s);
            ids.push(id);
        }
        if ids.len() == n {
            break;
        }
    }
    sorted(&ids)
}

fn locker<S: LockStore>(store: S, lease_ms: u64, wait_ms: u64) -> Locker<S> {
    Locker::builder(store)
        .lease(Duration::from_millis(lease_ms))
        .wait_timeout(Duration::from_millis(wait_ms))
        .build()
        .unwrap()
}

/// Whether every key is free: each can be taken (and is given back).
async fn all_free<S: LockStore>(l: &Locker<S>, keys: &[LockKey]) -> bool {
    for k in keys {
        match l.try_acquire(k).await {
            Ok(g) => {
                g.release().await.unwrap();
            }
            Err(_) => return false,
        }
    }
    true
}

macro_rules! multi_suite {
    ($name:ident, $fixture:expr, $keys:expr) => {
        mod $name {
            use super::*;

            /// A holder of one key makes the list wait and fail, and while
            /// it does, no other key of the list is held by it: before,
            /// during and after the wait.
            #[tokio::test]
            async fn a_partial_grant_is_never_held_or_left() {
                let (store, _keep) = $fixture;
                let l = locker(store.clone(), 10_000, 0);
                let other = locker(store, 10_000, 0);
                let keys = $keys("partial", 3);
                let b = other.try_acquire(&keys[1]).await.unwrap();
                for _ in 0..5 {
                    let err = l.try_acquire_all(&keys).await.unwrap_err();
                    assert!(err.is_contended(), "{err:?}");
                    assert_eq!(err.key(), Some(&keys[1]), "{err:?}");
                    assert!(err.retry_after().unwrap() > Duration::from_secs(5));
                    for free in [&keys[0], &keys[2]] {
                        let g = other.try_acquire(free).await.unwrap();
                        g.release().await.unwrap();
                    }
                }
                // Waiting, and timing out: nothing left either, once the
                // attempt the deadline cut has been given back in the
                // background (taken one by one, as on Redlock, the cut
                // attempt may hold the first key for a moment: seen with
                // eight test threads on 2 vCPUs).
                let err = l
                    .acquire_all_within(&keys, Duration::from_millis(150))
                    .await
                    .unwrap_err();
                assert!(matches!(err, Error::WaitTimeout { .. }), "{err:?}");
                let rest = [keys[0].clone(), keys[2].clone()];
                assert!(
                    eventually(Duration::from_secs(5), async || all_free(&other, &rest)
                        .await)
                    .await,
                    "a key of the list was left held after the wait timed out"
                );

                b.release().await.unwrap();
                let all = l.try_acquire_all(&keys).await.unwrap();
                assert_eq!(
                    all.keys().collect::<Vec<_>>(),
                    keys.iter().collect::<Vec<_>>()
                );
                for k in &keys {
                    assert!(
                        other.try_acquire(k).await.unwrap_err().is_contended(),
                        "{k}"
                    );
                }
                assert!(all.release().await.unwrap());
                assert!(all_free(&other, &keys).await);
            }

            /// One token per key, from that key's own counter: a key's
            /// tokens rise across single grants and multi-key grants, and
            /// the guard's order is the sorted one, duplicates taken once.
            #[tokio::test]
            async fn tokens_rise_per_key_across_single_and_multi_grants() {
                let (store, _keep) = $fixture;
                let l = locker(store, 10_000, 0);
                let keys = $keys("tokens", 2);
                let mut last = [0u64; 2];
                for round in 0..6 {
                    for (i, k) in keys.iter().enumerate() {
                        let g = l.try_acquire(k).await.unwrap();
                        let t = g.fencing_token().unwrap().get();
                        assert!(t > last[i], "round {round}: single {t} after {}", last[i]);
                        last[i] = t;
                        g.release().await.unwrap();
                    }
                    // Asked backwards and twice over: taken once each, sorted.
                    let asked = [keys[1].clone(), keys[0].clone(), keys[1].clone()];
                    let all = l.try_acquire_all(&asked).await.unwrap();
                    assert_eq!(all.len(), 2);
                    let tokens = all.fencing_tokens();
                    for (i, k) in keys.iter().enumerate() {
                        let t = tokens[i].unwrap().get();
                        assert_eq!(all.fencing_token(k), Some(Ok(tokens[i].unwrap())));
                        assert!(t > last[i], "round {round}: multi {t} after {}", last[i]);
                        last[i] = t;
                    }
                    assert!(all.release().await.unwrap());
                }
            }

            /// Two lockers (as two processes) with two tasks each: one
            /// task locks {a, b}, another {b, a}, a third takes `a` alone,
            /// many rounds, concurrently. Nobody deadlocks (every task
            /// finishes every round well before its wait runs out) and no
            /// key ever has two holders.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn ab_and_ba_never_deadlock_and_never_overlap() {
                let (store, _keep) = $fixture;
                let lockers = [
                    locker(store.clone(), 10_000, 20_000),
                    locker(store, 10_000, 20_000),
                ];
                let keys = $keys("abba", 2);
                let (a, b) = (keys[0].clone(), keys[1].clone());
                let inside = Arc::new([AtomicU32::new(0), AtomicU32::new(0)]);
                const ROUNDS: usize = 25;
                let mut tasks = Vec::new();
                for (t, l) in lockers.iter().chain(lockers.iter()).enumerate() {
                    let l = l.clone();
                    let order = if t % 2 == 0 {
                        vec![a.clone(), b.clone()]
                    } else {
                        vec![b.clone(), a.clone()]
                    };
                    let inside = inside.clone();
                    tasks.push(tokio::spawn(async move {
                        for _ in 0..ROUNDS {
                            let g = l.acquire_all(&order).await.unwrap();
                            for n in inside.iter() {
                                assert_eq!(n.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                            }
                            tokio::task::yield_now().await;
                            for n in inside.iter() {
                                n.fetch_sub(1, Ordering::SeqCst);
                            }
                            assert!(g.release().await.unwrap());
                        }
                    }));
                }
                let single = {
                    let (l, a, inside) = (lockers[0].clone(), a.clone(), inside.clone());
                    tokio::spawn(async move {
                        for _ in 0..ROUNDS {
                            let g = l.acquire(&a).await.unwrap();
                            assert_eq!(
                                inside[0].fetch_add(1, Ordering::SeqCst),
                                0,
                                "two holders of a"
                            );
                            tokio::task::yield_now().await;
                            inside[0].fetch_sub(1, Ordering::SeqCst);
                            assert!(g.release().await.unwrap());
                        }
                    })
                };
                tasks.push(single);
                let all = futures_util::future::join_all(tasks);
                let done = tokio::time::timeout(Duration::from_secs(60), all)
                    .await
                    .expect("deadlocked: the rounds did not finish");
                for d in done {
                    d.unwrap();
                }
                assert!(all_free(&lockers[1], &keys).await);
            }

            /// The waiter polls once an hour: only the release notification
            /// of the one key it waits on can wake it in time. It waits on
            /// the last key of three, held alone by another "process".
            #[tokio::test]
            async fn a_waiter_is_woken_by_the_release_of_the_key_it_waits_on() {
                let (store, _keep) = $fixture;
                let holder = locker(store.clone(), 10_000, 0);
                let waiter = stores::woken_only_by_notification(store.clone());
                let keys = $keys("woken", 3);
                let g = holder.try_acquire(&keys[2]).await.unwrap();
                let all = {
                    let (waiter, keys) = (waiter.clone(), keys.clone());
                    tokio::spawn(async move { waiter.acquire_all(&keys).await })
                };
                // Once the waiter found the key held (it marks it as
                // waited-for), where the store tells.
                let marked = eventually(Duration::from_secs(5), async || {
                    match store.inspect(&keys[2]).await {
                        Ok(Some(info)) => info.waiters,
                        Ok(None) => false,
                        Err(_) => true,
                    }
                })
                .await;
                assert!(marked, "the waiter never found the key held");
                let released = Instant::now();
                assert!(g.release().await.unwrap());
                let got = tokio::time::timeout(Duration::from_secs(10), all)
                    .await
                    .expect("the waiter was not woken by the release")
                    .unwrap()
                    .unwrap();
                assert!(released.elapsed() < Duration::from_secs(5));
                assert!(got.is_held());
                assert!(got.release().await.unwrap());
            }

            /// Renewed together past several leases; dropping the guard
            /// gives every key back in the background.
            #[tokio::test]
            async fn renewed_together_and_dropping_the_guard_releases_every_key() {
                let (store, _keep) = $fixture;
                // A 1 s lease, renewed every ~333 ms, held for three
                // leases. (300 ms left too little slack for a renewal on a
                // loaded machine: the lease lapsed between the check of
                // `is_held` and the other's grant, with eight test threads.)
                let l = locker(store.clone(), 1_000, 0);
                let other = locker(store, 10_000, 0);
                let keys = $keys("renewed", 3);
                let all = l.try_acquire_all(&keys).await.unwrap();
                let from = Instant::now();
                while from.elapsed() < Duration::from_millis(3_000) {
                    assert!(all.is_held(), "lost after {:?}", from.elapsed());
                    match other.try_acquire_all(&keys).await {
                        Err(err) => assert!(err.is_contended(), "{err}"),
                        Ok(_) => panic!(
                            "granted to another after {:?} while ours was held: {}",
                            from.elapsed(),
                            if all.is_held() {
                                "two holders"
                            } else {
                                "ours lapsed meanwhile"
                            },
                        ),
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                assert!(all.valid_for() > Duration::ZERO);
                drop(all);
                let freed = eventually(Duration::from_secs(5), async || {
                    match other.try_acquire_all(&keys).await {
                        Ok(g) => g.release().await.unwrap(),
                        Err(_) => false,
                    }
                })
                .await;
                assert!(freed, "a dropped guard left a key held");
                assert_eq!(l.status().renewing, 0);
            }

            /// An acquire dropped at any point (here: cut at random times
            /// from 0 to 3 ms, many times, with a holder of one key coming
            /// and going) leaves no key held once the background releases
            /// have run.
            #[tokio::test]
            async fn dropped_acquires_leave_no_key_held() {
                let (store, _keep) = $fixture;
                let l = locker(store.clone(), 10_000, 50);
                let other = locker(store, 10_000, 0);
                let keys = $keys("dropped", 3);
                let mut cut = 0;
                for round in 0..40 {
                    let blocker = if round % 2 == 0 {
                        // (After a cut acquire, its background release may
                        // still be on its way: wait for it.)
                        let k = &keys[(round / 2) % 3];
                        Some(
                            other
                                .acquire_within(k, Duration::from_secs(5))
                                .await
                                .unwrap(),
                        )
                    } else {
                        None
                    };
                    let at = Duration::from_micros(fastrand::u64(0..3_000));
                    match tokio::time::timeout(at, l.acquire_all(&keys)).await {
                        Ok(Ok(g)) => drop(g),
                        Ok(Err(e)) => assert!(e.is_contended(), "{e:?}"),
                        Err(_) => cut += 1,
                    }
                    drop(blocker);
                }
                assert!(cut > 0, "no acquire was cut");
                let freed = eventually(Duration::from_secs(10), async || {
                    match other.try_acquire_all(&keys).await {
                        Ok(g) => g.release().await.unwrap(),
                        Err(_) => false,
                    }
                })
                .await;
                assert!(freed, "a dropped acquire left a key held");
            }

            /// An empty list and a list over 64 are refused as settings,
            /// and take nothing.
            #[tokio::test]
            async fn hostile_lists_are_refused_before_the_store() {
                let (store, _keep) = $fixture;
                let l = locker(store, 10_000, 0);
                match l.try_acquire_all(&[]).await {
                    Err(Error::Config(e)) => assert_eq!(e.setting(), "keys"),
                    other => panic!("{other:?}"),
                }
                let many: Vec<LockKey> = (0..65)
                    .map(|i| LockKey::new(NS, format!("many-{i}")).unwrap())
                    .collect();
                match l.acquire_all(&many).await {
                    Err(Error::Config(e)) => assert!(e.to_string().contains("at most 64"), "{e}"),
                    other => panic!("{other:?}"),
                }
                assert!(all_free(&l, &many).await);
                // 64 is the bound, not beyond it.
                let g = l.try_acquire_all(&many[..64]).await.unwrap();
                assert_eq!(g.len(), 64);
                assert!(g.release().await.unwrap());
            }
        }
    };
}

multi_suite!(memory, stores::memory(), one_slot);
multi_suite!(redis, stores::redis(), own_slots);
multi_suite!(sentinel, stores::sentinel(), own_slots);
multi_suite!(cluster_one_slot, stores::cluster(), one_slot);
multi_suite!(cluster_across_slots, stores::cluster(), own_slots);
multi_suite!(redlock, stores::redlock(3), own_slots);
multi_suite!(boxed_memory, stores::boxed(stores::memory()), own_slots);
multi_suite!(boxed_redis, stores::boxed(stores::redis()), own_slots);

#[test]
fn the_key_makers_give_what_they_say() {
    let one = one_slot("check", 4);
    let first = slot(one[0].id());
    assert!(one.iter().all(|k| slot(k.id()) == first));
    let own = own_slots("check", 4);
    for (i, k) in own.iter().enumerate() {
        assert!(own[..i].iter().all(|o| slot(o.id()) != slot(k.id())));
    }
}

/// The memory store loses one key of three: the guard finds out at its
/// next renewal, `lost()` resolves, and the release still gives the other
/// two back.
#[tokio::test]
async fn memory_the_loss_of_any_key_is_the_loss_of_the_guard() {
    let store = MemoryStore::new();
    let l = locker(store.clone(), 10_000, 0);
    let keys = one_slot("lose", 3);
    let all = l.try_acquire_all(&keys).await.unwrap();
    assert!(store.lose(&keys[1]));
    let err = all.extend().await.unwrap_err();
    assert!(
        matches!(&err, Error::LockLost { key } if *key == keys[1]),
        "{err:?}"
    );
    tokio::time::timeout(Duration::from_secs(1), all.lost())
        .await
        .expect("lost() did not resolve");
    assert!(all.is_lost() && !all.is_held());
    assert!(!all.release().await.unwrap(), "not every key was ours");
    assert_eq!(store.held_count(), 0);
}

/// On Redis, a key deleted behind the guard's back (as a failover that
/// lost it would) is noticed by the watchdog within a lease: `lost()`
/// resolves without anybody calling `extend`.
#[tokio::test]
async fn redis_a_key_deleted_behind_the_guard_is_reported_lost() {
    let (store, server) = stores::redis();
    let l = locker(store, 600, 0);
    let keys = own_slots("deleted", 3);
    let all = l.try_acquire_all(&keys).await.unwrap();
    let name = stores::redis_name(NS, keys[2].id(), "lock");
    assert_eq!(server.cmd(&["DEL", &name]), Reply::Int(1));
    tokio::time::timeout(Duration::from_secs(3), all.lost())
        .await
        .expect("the watchdog did not report the deleted key lost");
    assert!(!all.is_held());
}

/// The one script leaves each key exactly as a single grant does (lock
/// with its holder record, the bucket's counter at the token), a held key marked
/// as waited-for, and the release script deletes them again; a refused
/// list writes nothing at all.
#[tokio::test]
async fn redis_one_script_writes_what_a_single_grant_writes_and_refusals_write_nothing() {
    let (store, server) = stores::redis();
    let l = locker(store.clone(), 10_000, 0);
    let keys = own_slots("layout", 2);
    let all = l.try_acquire_all(&keys).await.unwrap();
    for (k, t) in keys.iter().zip(all.fencing_tokens()) {
        let t = t.unwrap().get().to_string();
        let fence = stores::redis_name(NS, k.id(), "fence");
        assert_eq!(server.cmd(&["GET", &fence]).as_string(), Some(t.clone()));
        // The holder record in the lock's value, after the owner token.
        let lock = stores::redis_name(NS, k.id(), "lock");
        let v = server.cmd(&["GET", &lock]).as_string().unwrap();
        assert!(v[OwnerToken::LEN..].starts_with(&format!(" {t} ")), "{v}");
    }
    // Another process finds the list held: the key it names is marked.
    let other = locker(store, 10_000, 0);
    let err = other.try_acquire_all(&keys).await.unwrap_err();
    let held = err.key().unwrap().clone();
    let waited = stores::redis_name(NS, held.id(), "waited");
    assert_eq!(server.cmd(&["EXISTS", &waited]), Reply::Int(1));
    assert!(all.release().await.unwrap());
    assert_eq!(server.cmd(&["EXISTS", &waited]), Reply::Int(0));
    for k in &keys {
        let name = stores::redis_name(NS, k.id(), "lock");
        assert_eq!(server.cmd(&["EXISTS", &name]), Reply::Int(0), "{name}");
    }

    let before = evalsha_calls(&server);
    let dbsize = server.cmd(&["DBSIZE"]);
    assert!(matches!(
        l.try_acquire_all(&[]).await,
        Err(Error::Config(_))
    ));
    let many: Vec<LockKey> = (0..100)
        .map(|i| LockKey::new(NS, format!("flood-{i}")).unwrap())
        .collect();
    assert!(matches!(
        l.try_acquire_all(&many).await,
        Err(Error::Config(_))
    ));
    assert_eq!(
        evalsha_calls(&server),
        before,
        "a refused list reached Redis"
    );
    assert_eq!(server.cmd(&["DBSIZE"]), dbsize);
}

/// How many EVALSHA calls the server has run.
fn evalsha_calls(server: &RedisServer) -> u64 {
    let info = server.cmd(&["INFO", "commandstats"]).as_string().unwrap();
    support::parse_command_stats(&info)
        .get("evalsha")
        .map_or(0, |s| s.0)
}

/// A single primary with a `fencing(false)` store: the script grants
/// without tokens, and the guard says so per key.
#[tokio::test]
async fn redis_unfenced_lists_have_no_tokens() {
    let server = RedisServer::start();
    let store = RedisStore::builder(&server.url())
        .fencing(false)
        .build()
        .unwrap();
    let l = locker(store, 10_000, 0);
    let keys = own_slots("unfenced", 2);
    let all = l.try_acquire_all(&keys).await.unwrap();
    assert!(all.fencing_tokens().iter().all(Result::is_err));
    assert!(l.try_acquire(&keys[0]).await.unwrap_err().is_contended());
    assert!(all.release().await.unwrap());
    assert!(all_free(&l, &keys).await);
}

/// The EVALSHA calls every node of `cluster` has run.
fn cluster_evalsha_calls(cluster: &support::topology::Cluster) -> u64 {
    cluster.nodes.iter().map(evalsha_calls).sum()
}

/// On a Cluster, locks of one slot are granted and released by one script
/// each (one EVALSHA for three keys), and locks across slots one by one
/// (one EVALSHA per key and step); both leave the same locks.
#[tokio::test]
async fn cluster_one_slot_is_one_script_and_across_slots_one_by_one() {
    let (store, cluster) = stores::cluster();
    let l = locker(store, 10_000, 0);
    let (one, across) = (one_slot("script", 3), own_slots("script", 3));
    // Warm: the scripts loaded on the nodes these keys live on.
    for keys in [&one, &across] {
        let g = l.try_acquire_all(keys).await.unwrap();
        g.release().await.unwrap();
    }
    let before = cluster_evalsha_calls(&cluster);
    let g = l.try_acquire_all(&one).await.unwrap();
    assert_eq!(
        cluster_evalsha_calls(&cluster) - before,
        1,
        "one grant script"
    );
    assert!(g.release().await.unwrap());
    assert_eq!(
        cluster_evalsha_calls(&cluster) - before,
        2,
        "one release script"
    );

    let before = cluster_evalsha_calls(&cluster);
    let g = l.try_acquire_all(&across).await.unwrap();
    assert_eq!(
        cluster_evalsha_calls(&cluster) - before,
        3,
        "one grant per key"
    );
    assert!(g.release().await.unwrap());
    assert_eq!(
        cluster_evalsha_calls(&cluster) - before,
        6,
        "one release per key"
    );
}
