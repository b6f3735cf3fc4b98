//! The reader-writer lock (`Locker::rwlock`) on every store that has one:
//! one suite, written once, run on memory, one Redis primary, Sentinel,
//! Cluster, and `BoxStore` over memory and over one Redis; then what only
//! Redis can show (server-clock expiry, the key layout, Redis memory) and
//! what Redlock answers.
use crate::support;

use support::{eventually, stores};

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use tower_redis_lock::{
    AcquireOutcome, Error, KeyFrom, LeaseKind, LockKey, LockLayer, LockStore, LockStoreExt, Locker,
    OwnerToken,
};

fn key(id: &str) -> LockKey {
    LockKey::new("rw", id).unwrap()
}

fn locker<S: LockStore>(store: S, lease_ms: u64, wait_ms: u64) -> Locker<S> {
    Locker::builder(store)
        .lease(Duration::from_millis(lease_ms))
        .wait_timeout(Duration::from_millis(wait_ms))
        .build()
        .unwrap()
}

/// Whether a new reader of `l` gets in within 5 s (a writer's mark taken
/// back in the background).
async fn readers_get_in<S: LockStore>(l: &Locker<S>, k: &LockKey) -> bool {
    eventually(Duration::from_secs(5), async || {
        l.rwlock(k).unwrap().try_read().await.is_ok()
    })
    .await
}

/// Whether a new reader of `k` is refused as contended right now.
async fn read_refused<S: LockStore>(l: &Locker<S>, k: &LockKey) -> bool {
    let rw = l.rwlock(k).unwrap();
    rw.try_read().await.unwrap_err().is_contended()
}

/// Who is inside: readers count up from 0, a writer is `WRITER`.
const WRITER: u32 = 1 << 16;

macro_rules! rwlock_suite {
    ($name:ident, $fixture:expr) => {
        mod $name {
            use super::*;

            /// 12 tasks over two lockers (two "processes"), a third of
            /// them writers: never a writer together with anyone, and
            /// readers do share (two at once is reached).
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn never_a_writer_with_anyone_and_readers_share() {
                let (store, _keep) = $fixture;
                let lockers = [
                    locker(store.clone(), 10_000, 30_000),
                    locker(store, 10_000, 30_000),
                ];
                let k = key("exclusive");
                let inside = Arc::new(AtomicU32::new(0));
                let (bad, most_readers) =
                    (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
                let mut tasks = Vec::new();
                for t in 0..12usize {
                    let rw = lockers[t % 2].rwlock(&k).unwrap();
                    let (inside, bad, most_readers) =
                        (inside.clone(), bad.clone(), most_readers.clone());
                    tasks.push(tokio::spawn(async move {
                        for _ in 0..5 {
                            if t % 3 == 0 {
                                let g = rw.write().await.unwrap();
                                if inside.fetch_add(WRITER, Ordering::SeqCst) != 0 {
                                    bad.fetch_add(1, Ordering::SeqCst);
                                }
                                tokio::time::sleep(Duration::from_millis(3)).await;
                                inside.fetch_sub(WRITER, Ordering::SeqCst);
                                g.release().await.unwrap();
                            } else {
                                let g = rw.read().await.unwrap();
                                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                                if now >= WRITER {
                                    bad.fetch_add(1, Ordering::SeqCst);
                                }
                                most_readers.fetch_max(now, Ordering::SeqCst);
                                tokio::time::sleep(Duration::from_millis(3)).await;
                                inside.fetch_sub(1, Ordering::SeqCst);
                                g.release().await.unwrap();
                            }
                        }
                    }));
                }
                for t in tasks {
                    t.await.unwrap();
                }
                assert_eq!(
                    bad.load(Ordering::SeqCst),
                    0,
                    "a writer overlapped a holder"
                );
                let most = most_readers.load(Ordering::SeqCst);
                assert!(most >= 2, "readers never shared the lock ({most} at most)");
            }

            /// Writer preference across processes: with a reader holding,
            /// a writer of another locker that waits stops a reader of a
            /// third locker; the writer goes first, woken by the release.
            #[tokio::test]
            async fn a_waiting_writer_stops_new_readers_of_other_processes() {
                let (store, _keep) = $fixture;
                let (a, b, c) = (
                    locker(store.clone(), 10_000, 0),
                    locker(store.clone(), 10_000, 20_000),
                    locker(store, 10_000, 0),
                );
                let k = key("writer-first");
                let held = a.rwlock(&k).unwrap().try_read().await.unwrap();
                // Before any writer waits, readers share.
                let early = c.rwlock(&k).unwrap().try_read().await.unwrap();
                early.release().await.unwrap();
                let writer = b.rwlock(&k).unwrap();
                let waiting = tokio::spawn(async move { writer.write().await });
                // (A waiter is queued only after its first try, which marked it.)
                assert!(eventually(Duration::from_secs(5), async || b.has_waiters(&k)).await);
                let err = c.rwlock(&k).unwrap().try_read().await.unwrap_err();
                assert!(
                    err.is_contended(),
                    "a new reader got in past a waiting writer: {err}"
                );
                assert!(held.release().await.unwrap());
                let w = tokio::time::timeout(Duration::from_secs(5), waiting)
                    .await
                    .expect("the writer was not granted after the reader left")
                    .unwrap()
                    .unwrap();
                assert!(read_refused(&c, &k).await);
                w.release().await.unwrap();
                assert!(c.rwlock(&k).unwrap().try_read().await.is_ok());
            }

            /// A writer that gives up waiting (its wait ends, or its future
            /// is dropped) takes its mark back: readers get in again long
            /// before the mark's lease would end.
            #[tokio::test]
            async fn a_writer_that_gives_up_lets_readers_in_again() {
                let (store, _keep) = $fixture;
                let (a, b, c) = (
                    locker(store.clone(), 30_000, 0),
                    locker(store.clone(), 30_000, 300),
                    locker(store, 30_000, 0),
                );
                let k = key("gave-up");
                let _held = a.rwlock(&k).unwrap().try_read().await.unwrap();
                let err = b.rwlock(&k).unwrap().write().await.unwrap_err();
                assert!(matches!(err, Error::WaitTimeout { .. }), "{err}");
                // At once, not eventually: the mark is taken back before
                // the error answers (a job that gives up and ends runs
                // nothing after it).
                let reader = c.rwlock(&k).unwrap().try_read().await;
                assert!(
                    reader.is_ok(),
                    "a reader kept out right after the writer timed out: {reader:?}"
                );
                drop(reader);
                // Dropped while it waits.
                let rw = b.rwlock(&k).unwrap();
                let waiting =
                    tokio::spawn(async move { rw.write_within(Duration::from_secs(60)).await });
                assert!(eventually(Duration::from_secs(5), async || b.has_waiters(&k)).await);
                assert!(read_refused(&c, &k).await);
                waiting.abort();
                assert!(
                    readers_get_in(&c, &k).await,
                    "readers still kept out after the writer's future was dropped"
                );
            }

            /// A writer that crashed while waiting (its mark not taken back)
            /// holds readers back until its mark's lease ends, no longer.
            #[tokio::test]
            async fn a_crashed_writers_mark_lapses_at_its_lease_end() {
                let (store, _keep) = $fixture;
                let k = key("crashed-writer");
                let reader = OwnerToken::generate();
                let lease = Duration::from_secs(20);
                let got = store.acquire_read(&k, &reader, lease).await.unwrap();
                assert!(matches!(got, AcquireOutcome::Granted(_)), "{got:?}");
                let mark = Duration::from_millis(500);
                let (writer, waiter) = (OwnerToken::generate(), OwnerToken::generate());
                let start = Instant::now();
                let got = store
                    .acquire_write(&k, &writer, Some(&waiter), mark)
                    .await
                    .unwrap();
                assert!(matches!(got, AcquireOutcome::Held { .. }), "{got:?}");
                let other = OwnerToken::generate();
                let came_in = loop {
                    match store.acquire_read(&k, &other, lease).await.unwrap() {
                        AcquireOutcome::Granted(_) => break start.elapsed(),
                        AcquireOutcome::Held { remaining: Some(r) } => {
                            assert!(r <= mark, "remaining {r:?} of a {mark:?} mark");
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                        other => panic!("{other:?}"),
                    }
                    assert!(start.elapsed() < mark * 6, "the mark never lapsed");
                };
                assert!(
                    came_in + Duration::from_millis(2) >= mark,
                    "a reader got in after {came_in:?}, inside the {mark:?} mark"
                );
                assert!(store.release(LeaseKind::Read, &k, &other).await.unwrap());
                assert!(store.release(LeaseKind::Read, &k, &reader).await.unwrap());
                assert!(
                    !store
                        .release(LeaseKind::WriterMark, &k, &waiter)
                        .await
                        .unwrap()
                );
            }

            /// An ended mark beside a longer one is dropped by the grant
            /// (not only by the set's own expiry, which follows the
            /// longest): once the longer writer withdraws, readers get in.
            #[tokio::test]
            async fn an_ended_mark_beside_a_longer_one_is_dropped() {
                let (store, _keep) = $fixture;
                let k = key("ended-mark");
                let reader = OwnerToken::generate();
                let long = Duration::from_secs(20);
                store.acquire_read(&k, &reader, long).await.unwrap();
                let short = Duration::from_millis(300);
                let (a, a_waits) = (OwnerToken::generate(), OwnerToken::generate());
                let (b, b_waits) = (OwnerToken::generate(), OwnerToken::generate());
                let got = store
                    .acquire_write(&k, &a, Some(&a_waits), short)
                    .await
                    .unwrap();
                assert!(matches!(got, AcquireOutcome::Held { .. }), "{got:?}");
                // The short mark ends `short` after it was set at the
                // latest, however late its answer came.
                let short_set = Instant::now();
                let got = store
                    .acquire_write(&k, &b, Some(&b_waits), long)
                    .await
                    .unwrap();
                assert!(matches!(got, AcquireOutcome::Held { .. }), "{got:?}");
                // (The short mark's end passes.)
                tokio::time::sleep_until((short_set + short + short / 10).into()).await;
                let other = OwnerToken::generate();
                let got = store.acquire_read(&k, &other, long).await.unwrap();
                assert!(matches!(got, AcquireOutcome::Held { .. }), "{got:?}");
                assert!(
                    store
                        .release(LeaseKind::WriterMark, &k, &b_waits)
                        .await
                        .unwrap()
                );
                let got = store.acquire_read(&k, &other, long).await.unwrap();
                assert!(
                    matches!(got, AcquireOutcome::Granted(_)),
                    "an ended mark still kept readers out: {got:?}"
                );
                assert!(
                    !store
                        .release(LeaseKind::WriterMark, &k, &a_waits)
                        .await
                        .unwrap()
                );
                for r in [&reader, &other] {
                    assert!(store.release(LeaseKind::Read, &k, r).await.unwrap());
                }
            }

            /// Write grants mint rising tokens from the key's counter (the
            /// lock's too); a read carries the epoch: at least the last
            /// write's token, below the next write's.
            #[tokio::test]
            async fn writes_mint_tokens_and_reads_carry_the_last_writes() {
                let (store, _keep) = $fixture;
                let l = locker(store, 10_000, 0);
                let k = key("tokens");
                let rw = l.rwlock(&k).unwrap();
                let mut last = 0u64;
                for round in 0..10 {
                    let w = rw.try_write().await.unwrap();
                    let tw = w.fencing_token().unwrap().get();
                    assert!(tw > last, "round {round}: write {tw} after {last}");
                    w.release().await.unwrap();
                    let (r1, r2) = (rw.try_read().await.unwrap(), rw.try_read().await.unwrap());
                    let tr = r1.fencing_token().unwrap().get();
                    assert!(tr >= tw, "round {round}: read {tr} below the write's {tw}");
                    assert!(r2.fencing_token().unwrap().get() >= tr);
                    r1.release().await.unwrap();
                    r2.release().await.unwrap();
                    let lock = l.try_acquire(&k).await.unwrap();
                    let tl = lock.fencing_token().unwrap().get();
                    assert!(tl > tr, "round {round}: lock {tl} after read {tr}");
                    lock.release().await.unwrap();
                    last = tl;
                }
            }

            /// The watchdog renews both sides past their leases.
            #[tokio::test]
            async fn the_watchdog_keeps_reads_and_writes_across_leases() {
                let (store, _keep) = $fixture;
                // A 1 s lease held for three: a shorter one left a loaded
                // machine too little slack for a renewal.
                let l = locker(store.clone(), 1_000, 0);
                let other = locker(store, 1_000, 0);
                let (kr, kw) = (key("renewed-read"), key("renewed-write"));
                let r = l.rwlock(&kr).unwrap().try_read().await.unwrap();
                let w = l.rwlock(&kw).unwrap().try_write().await.unwrap();
                let from = Instant::now();
                while from.elapsed() < Duration::from_millis(3_000) {
                    assert!(
                        r.is_held() && w.is_held(),
                        "lost after {:?}",
                        from.elapsed()
                    );
                    assert!(
                        other
                            .rwlock(&kr)
                            .unwrap()
                            .try_write()
                            .await
                            .unwrap_err()
                            .is_contended()
                    );
                    assert!(
                        other
                            .rwlock(&kw)
                            .unwrap()
                            .try_read()
                            .await
                            .unwrap_err()
                            .is_contended()
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                assert!(r.release().await.unwrap());
                assert!(w.release().await.unwrap());
                assert!(other.rwlock(&kr).unwrap().try_write().await.is_ok());
                assert!(other.rwlock(&kw).unwrap().try_read().await.is_ok());
            }

            /// Re-entry in a scope: read in read and write in write share
            /// the hold; read in write is a hold on the write; write in
            /// read is refused at once; the lock of the key is apart.
            #[tokio::test]
            async fn reentry_rules() {
                let (store, _keep) = $fixture;
                let l = locker(store, 10_000, 5_000);
                let k = key("reenter");
                let rw = l.rwlock(&k).unwrap();
                let read = rw.try_read().await.unwrap();
                let (again, upgrade, lock) = read
                    .scope(async {
                        (
                            rw.read().await.unwrap(),
                            rw.write().await.unwrap_err(),
                            l.try_acquire(&k).await.unwrap(),
                        )
                    })
                    .await;
                assert_eq!(read.hold_count(), 2);
                assert_eq!(again.fencing_token(), read.fencing_token());
                match upgrade {
                    Error::Config(e) => {
                        assert_eq!(e.setting(), "rwlock");
                        assert!(e.to_string().contains("upgrade"), "{e}");
                    }
                    other => panic!("an upgrade answered {other:?}"),
                }
                lock.release().await.unwrap();
                drop(again);
                read.release().await.unwrap();

                let write = rw.try_write().await.unwrap();
                let (w2, r2) = write
                    .scope(async { (rw.write().await.unwrap(), rw.read().await.unwrap()) })
                    .await;
                assert_eq!(write.hold_count(), 3);
                assert_eq!(w2.fencing_token(), write.fencing_token());
                assert_eq!(r2.fencing_token(), write.fencing_token());
                drop((w2, r2));
                write.release().await.unwrap();
                assert!(rw.try_write().await.is_ok());
            }
        }
    };
}

rwlock_suite!(memory, stores::memory());
rwlock_suite!(redis, stores::redis());
rwlock_suite!(cluster, stores::cluster());
rwlock_suite!(sentinel, stores::sentinel());
rwlock_suite!(boxed_memory, stores::boxed(stores::memory()));
rwlock_suite!(boxed_redis, stores::boxed(stores::redis()));

/// The reader (another locker, as another process) polls once an hour: only
/// the store's notifications can wake it, after the writer's release; and a
/// writer waiting for the last reader is woken by that reader's release.
async fn waiters_of_either_side_are_woken_by_the_release<S: LockStore + Clone>(store: S) {
    let holder = locker(store.clone(), 10_000, 0);
    let waiter = stores::woken_only_by_notification(store);
    let k = key("woken");
    let w = holder.rwlock(&k).unwrap().try_write().await.unwrap();
    let rw = waiter.rwlock(&k).unwrap();
    let reading = tokio::spawn(async move { (rw.read().await, Instant::now()) });
    assert!(eventually(Duration::from_secs(5), async || waiter.has_waiters(&k)).await);
    let released = Instant::now();
    assert!(w.release().await.unwrap());
    let (r, at) = tokio::time::timeout(Duration::from_secs(10), reading)
        .await
        .expect("the reader was not woken by the writer's release")
        .unwrap();
    assert!(
        at - released < Duration::from_secs(1),
        "woken {:?} after",
        at - released
    );
    let r = r.unwrap();

    let rw = waiter.rwlock(&key("woken-2")).unwrap();
    let r2 = holder
        .rwlock(&key("woken-2"))
        .unwrap()
        .try_read()
        .await
        .unwrap();
    let writing = tokio::spawn(async move { (rw.write().await, Instant::now()) });
    assert!(
        eventually(Duration::from_secs(5), async || waiter
            .has_waiters(&key("woken-2")))
        .await
    );
    let released = Instant::now();
    assert!(r2.release().await.unwrap());
    let (w, at) = tokio::time::timeout(Duration::from_secs(10), writing)
        .await
        .expect("the writer was not woken by the last reader's release")
        .unwrap();
    assert!(
        at - released < Duration::from_secs(1),
        "woken {:?} after",
        at - released
    );
    w.unwrap().release().await.unwrap();
    r.release().await.unwrap();
}

#[tokio::test]
async fn memory_waiters_of_either_side_are_woken_by_the_release() {
    waiters_of_either_side_are_woken_by_the_release(tower_redis_lock::MemoryStore::new()).await;
}

#[tokio::test]
async fn redis_waiters_of_either_side_are_woken_by_the_release() {
    let (store, _server) = stores::redis();
    waiters_of_either_side_are_woken_by_the_release(store).await;
}

#[tokio::test]
async fn cluster_waiters_of_either_side_are_woken_by_the_release() {
    let (store, _cluster) = stores::cluster();
    waiters_of_either_side_are_woken_by_the_release(store).await;
}

/// A write the store lost (its key deleted) is reported lost, and its
/// release answers that it was no longer held; the same for a read.
#[tokio::test]
async fn redis_holds_the_store_lost_are_reported_lost() {
    let (store, server) = stores::redis();
    let l = locker(store.clone(), 300, 0);
    let (kw, kr) = (key("lost-write"), key("lost-read"));
    let w = l.rwlock(&kw).unwrap().try_write().await.unwrap();
    let r = l.rwlock(&kr).unwrap().try_read().await.unwrap();
    let [_, writer, _] = store.rw_keys(&kw);
    let [readers, _, _] = store.rw_keys(&kr);
    server.cmd(&["DEL", &writer, &readers]);
    for g in [&w, &r] {
        tokio::time::timeout(Duration::from_secs(2), g.lost())
            .await
            .expect("lost() did not resolve");
    }
    assert!(!w.release().await.unwrap());
    assert!(!r.release().await.unwrap());
}

/// Every name of a key's reader-writer lock shares the lock's hash tag
/// (one slot on a Cluster); the readers are scored by their lease end on
/// the server's clock; nothing is left once released.
#[tokio::test]
async fn redis_the_layout_shares_the_locks_hash_tag_and_leaves_nothing() {
    let (store, server) = stores::redis();
    let l = locker(store.clone(), 10_000, 0);
    let k = key("layout");
    let tag = |n: &str| n[n.find('{').unwrap()..=n.find('}').unwrap()].to_string();
    let names = store.rw_keys(&k);
    for n in &names {
        assert_eq!(tag(n), tag(&store.lock_key(&k)), "{n}");
    }
    assert!(names[0].ends_with(":rw-readers") && names[1].ends_with(":rw-writer"));
    let r = l.rwlock(&k).unwrap().try_read().await.unwrap();
    let pttl = match server.cmd(&["PTTL", &names[0]]) {
        support::Reply::Int(n) => n,
        other => panic!("{other:?}"),
    };
    assert!(pttl > 8_000 && pttl <= 10_000, "PTTL {pttl}");
    r.release().await.unwrap();
    let w = l.rwlock(&k).unwrap().try_write().await.unwrap();
    let pttl = match server.cmd(&["PTTL", &names[1]]) {
        support::Reply::Int(n) => n,
        other => panic!("{other:?}"),
    };
    assert!(pttl > 8_000 && pttl <= 10_000, "PTTL {pttl}");
    w.release().await.unwrap();
    assert_eq!(server.keys_besides_counters(), Vec::<String>::new());
}

/// A flood of distinct keys (released, left to expire, writers that waited
/// and gave up) leaves nothing in Redis but the fencing counters (at most
/// 1,024 per namespace).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_flood_of_keys_leaves_only_the_counters() {
    let (store, server) = stores::redis();
    let l = locker(store.clone(), 10_000, 0);
    let mut tasks = Vec::new();
    for chunk in 0..8 {
        let store = store.clone();
        let l = l.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..200 {
                let k = key(&format!("flood-{chunk}-{i}"));
                let rw = l.rwlock(&k).unwrap();
                match i % 4 {
                    0 => {
                        // A crashed reader, and a writer that waited and crashed.
                        let short = Duration::from_millis(300);
                        let (r, w, q) = (
                            OwnerToken::generate(),
                            OwnerToken::generate(),
                            OwnerToken::generate(),
                        );
                        store.acquire_read(&k, &r, short).await.unwrap();
                        store.acquire_write(&k, &w, Some(&q), short).await.unwrap();
                    }
                    1 => assert!(rw.try_write().await.unwrap().release().await.unwrap()),
                    2 => {
                        let r = rw.try_read().await.unwrap();
                        // A writer that waits briefly and gives up.
                        let err = rw.write_within(Duration::from_millis(5)).await.unwrap_err();
                        assert!(err.is_contended(), "{err}");
                        r.release().await.unwrap();
                    }
                    _ => assert!(rw.try_read().await.unwrap().release().await.unwrap()),
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
            let short = Duration::from_millis(50);
            let (r, w, q) = (
                OwnerToken::generate(),
                OwnerToken::generate(),
                OwnerToken::generate(),
            );
            store.acquire_read(&k, &r, short).await.unwrap();
            store.acquire_write(&k, &w, Some(&q), short).await.unwrap();
        } else if i % 3 == 1 {
            l.rwlock(&k)
                .unwrap()
                .try_write()
                .await
                .unwrap()
                .release()
                .await
                .unwrap();
        } else {
            l.rwlock(&k)
                .unwrap()
                .try_read()
                .await
                .unwrap()
                .release()
                .await
                .unwrap();
        }
    }
    tokio::time::sleep(Duration::from_millis(60)).await;
    // The next grants sweep what expired.
    for i in 0..1_100 {
        let rw = l.rwlock(&key(&format!("after-{i}"))).unwrap();
        rw.try_read().await.unwrap().release().await.unwrap();
    }
    assert_eq!(store.keys_kept(), 0);
}

/// Redlock has no reader-writer lock: a clear configuration error when the
/// lock, or a reader-writer layer, is made (never per request), nothing
/// written. The same for its semaphores.
#[tokio::test]
async fn redlock_says_rwlocks_and_semaphores_are_not_supported_when_made() {
    let (store, servers) = stores::redlock(3);
    let l = locker(store, 10_000, 0);
    match l.rwlock(&key("redlock")) {
        Err(Error::Config(e)) => {
            assert_eq!(e.setting(), "read_write");
            assert!(e.to_string().contains("reader-writer"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    match l.semaphore(&key("redlock"), 3) {
        Err(Error::Config(e)) => {
            assert_eq!(e.setting(), "permits");
            assert!(e.to_string().contains("semaphores"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    let layers = [
        LockLayer::builder(l.clone(), KeyFrom::path_param::<String>("id"))
            .read_write()
            .build(),
        LockLayer::builder(l.clone(), KeyFrom::path_param::<String>("id"))
            .concurrency_limit(3)
            .build(),
    ];
    for built in layers {
        let e = built.expect_err("a layer of a kind Redlock lacks was built");
        assert!(e.to_string().contains("does not keep"), "{e}");
    }
    for s in &servers {
        assert_eq!(s.dbsize(), 0);
    }
}

/// Read and write acquires dropped at every point of their way (before,
/// during, after the grant, while a writer waits) and guards dropped at
/// once leave nothing behind: each attempt whose answer was not taken is
/// released, and each mark taken back, in the background, long before
/// their 30 s leases would end. `empty` says whether the store keeps
/// nothing of the key.
async fn dropped_acquires_and_guards_leave_nothing<S: LockStore + Clone>(
    store: S,
    mut empty: impl AsyncFnMut() -> bool,
) {
    let l = locker(store, 30_000, 2_000);
    let k = key("dropped");
    let rw = l.rwlock(&k).unwrap();
    for round in 0..80u64 {
        let cut = Duration::from_micros(round * 37 % 1_500);
        // Every third round with a reader holding, so that writers wait.
        // (What the last round dropped is given back in the background.)
        let held = match round % 3 {
            0 => Some(rw.read_within(Duration::from_secs(5)).await.unwrap()),
            _ => None,
        };
        let res = if round % 2 == 0 {
            tokio::time::timeout(cut, rw.write()).await
        } else {
            tokio::time::timeout(cut, rw.read()).await
        };
        match res {
            Ok(Ok(g)) => drop(g),
            Ok(Err(e)) => panic!("round {round}: {e}"),
            Err(_) => {}
        }
        drop(held);
    }
    assert!(
        eventually(Duration::from_secs(5), async || empty().await).await,
        "the key's reader-writer lock was left behind"
    );
    assert!(eventually(Duration::from_secs(5), async || l.status().renewing == 0).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_dropped_acquires_and_guards_leave_nothing() {
    let (store, server) = stores::redis();
    dropped_acquires_and_guards_leave_nothing(store, async || {
        server.keys_besides_counters().is_empty()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_dropped_acquires_and_guards_leave_nothing() {
    let store = tower_redis_lock::MemoryStore::new();
    let watched = store.clone();
    dropped_acquires_and_guards_leave_nothing(store, async || watched.keys_kept() == 0).await;
}

/// The reader-writer scripts come back after the server forgets its
/// scripts: grants, the watchdog's pipelined renewals and releases go on.
#[tokio::test]
async fn redis_rwlocks_survive_a_script_flush() {
    let (store, server) = stores::redis();
    let l = locker(store.clone(), 1_000, 0);
    let r = l
        .rwlock(&key("noscript-r"))
        .unwrap()
        .try_read()
        .await
        .unwrap();
    let w = l
        .rwlock(&key("noscript-w"))
        .unwrap()
        .try_write()
        .await
        .unwrap();
    server.cmd(&["SCRIPT", "FLUSH"]);
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(3_000) {
        assert!(r.is_held() && w.is_held(), "lost after the flush");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server.cmd(&["SCRIPT", "FLUSH"]);
    assert!(r.release().await.unwrap());
    server.cmd(&["SCRIPT", "FLUSH"]);
    assert!(w.release().await.unwrap());
}

/// A waiting writer's mark lasts a lease (the writer's, here 1.2 s), and
/// the writer's tries renew it every lease/3 while it waits, however long
/// the reader in its way holds (10 s leases) and however rarely its locker
/// polls otherwise (once an hour): new readers stay out for many of the
/// writer's leases, then the writer goes first.
async fn a_waiting_writers_mark_is_renewed_while_it_waits<S: LockStore + Clone>(store: S) {
    let holder = locker(store.clone(), 10_000, 0);
    let writer = Locker::builder(store.clone())
        .lease(Duration::from_millis(1_200))
        .wait_timeout(Duration::from_secs(30))
        .poll_interval(Duration::from_secs(3600))
        .build()
        .unwrap();
    let other = locker(store, 10_000, 0);
    let k = key("mark-renewed");
    let r = holder.rwlock(&k).unwrap().try_read().await.unwrap();
    let rw = writer.rwlock(&k).unwrap();
    let waiting = tokio::spawn(async move { rw.write().await });
    assert!(eventually(Duration::from_secs(5), async || writer.has_waiters(&k)).await);
    let from = Instant::now();
    while from.elapsed() < Duration::from_millis(3_600) {
        match other.rwlock(&k).unwrap().try_read().await {
            Err(e) => assert!(e.is_contended(), "{e}"),
            Ok(_) => panic!("a reader got in {:?} into the wait", from.elapsed()),
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    r.release().await.unwrap();
    let w = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the writer was not granted")
        .unwrap()
        .unwrap();
    w.release().await.unwrap();
}

#[tokio::test]
async fn memory_a_waiting_writers_mark_is_renewed_while_it_waits() {
    a_waiting_writers_mark_is_renewed_while_it_waits(tower_redis_lock::MemoryStore::new()).await;
}

#[tokio::test]
async fn redis_a_waiting_writers_mark_is_renewed_while_it_waits() {
    let (store, _server) = stores::redis();
    a_waiting_writers_mark_is_renewed_while_it_waits(store).await;
}

/// A waiting writer's mark lasts what its tries ask for, the hold cap
/// (2.4 s) where it is below the lease (30 s): the writer renews it at a
/// third of that, not of the lease, although its locker polls once an
/// hour. No new reader of another locker gets in for the whole wait (over
/// two of the mark's lengths); then the writer goes first. (It was
/// renewed at lease/3, 10 s: the mark lapsed 2.4 s into the wait and
/// readers got in.) `paused`: the clock is tokio's paused one, and the
/// writer's tries run at their exact times.
async fn a_writers_mark_under_a_short_hold_cap_is_renewed_at_a_third_of_it<S: LockStore + Clone>(
    store: S,
) {
    let cap = Duration::from_millis(2_400);
    let holder = locker(store.clone(), 10_000, 0);
    let writer = Locker::builder(store.clone())
        .lease(Duration::from_secs(30))
        .max_hold(cap)
        .wait_timeout(Duration::from_secs(60))
        .poll_interval(Duration::from_secs(3600))
        .build()
        .unwrap();
    let other = locker(store, 10_000, 0);
    let k = key("mark-capped");
    let r = holder.rwlock(&k).unwrap().try_read().await.unwrap();
    let rw = writer.rwlock(&k).unwrap();
    let waiting = tokio::spawn(async move { rw.write().await });
    // (Queued after its first try, which marked it.)
    assert!(eventually(Duration::from_secs(5), async || writer.has_waiters(&k)).await);
    let from = tokio::time::Instant::now();
    while from.elapsed() < cap * 2 + cap / 12 {
        match other.rwlock(&k).unwrap().try_read().await {
            Err(e) => assert!(e.is_contended(), "{e}"),
            Ok(_) => panic!("a reader got in {:?} into the wait", from.elapsed()),
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(!waiting.is_finished());
    r.release().await.unwrap();
    let w = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the writer was not granted")
        .unwrap()
        .unwrap();
    assert!(read_refused(&other, &k).await);
    w.release().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn memory_a_writers_mark_under_a_short_hold_cap_is_renewed_at_a_third_of_it() {
    a_writers_mark_under_a_short_hold_cap_is_renewed_at_a_third_of_it(
        tower_redis_lock::MemoryStore::new(),
    )
    .await;
}

#[tokio::test]
async fn redis_a_writers_mark_under_a_short_hold_cap_is_renewed_at_a_third_of_it() {
    let (store, _server) = stores::redis();
    a_writers_mark_under_a_short_hold_cap_is_renewed_at_a_third_of_it(store).await;
}

/// A read's token is the key's counter as it stands, even far ahead of the
/// clock (not advanced: the next write mints the one above it).
#[tokio::test]
async fn redis_a_reads_token_is_the_counter_and_the_next_write_above_it() {
    let (store, server) = stores::redis();
    let l = locker(store.clone(), 10_000, 0);
    let k = key("counter");
    let ahead: u64 = 9_000_000_000_000_000;
    server.cmd(&["SET", &store.fence_key(&k), &ahead.to_string()]);
    let rw = l.rwlock(&k).unwrap();
    let (r1, r2) = (rw.try_read().await.unwrap(), rw.try_read().await.unwrap());
    assert_eq!(r1.fencing_token().unwrap().get(), ahead);
    assert_eq!(r2.fencing_token().unwrap().get(), ahead);
    drop((r1, r2));
    let w = rw.write_within(Duration::from_secs(5)).await.unwrap();
    assert_eq!(w.fencing_token().unwrap().get(), ahead + 1);
}

/// Read and write grants go through the replica confirmation as every
/// kind's does: on a primary with a replica, `wait_replicas` confirms a
/// read the replica has; with the replica frozen, a write (and a read) is
/// refused (`Unavailable`) and taken back, owner-checked: the read held
/// beside it stays, and nothing else is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_grants_are_confirmed_by_replicas_and_unconfirmed_ones_taken_back() {
    let primary = support::RedisServer::start();
    let port = primary.port().to_string();
    let replica = support::RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
    assert!(
        support::wait_until(Duration::from_secs(10), || replica
            .cmd(&["INFO", "replication"])
            .as_string()
            .unwrap_or_default()
            .contains("master_link_status:up")),
        "the replica never linked"
    );
    let store = tower_redis_lock::RedisStore::builder(&primary.url())
        .command_timeout(Duration::from_secs(4))
        .wait_replicas(
            1,
            Duration::from_secs(2),
            tower_redis_lock::ReplicaShortfall::Fail,
        )
        .build()
        .unwrap();
    let l = Locker::new(store.clone());
    let k = key("replicas");
    let [readers, writer, _] = store.rw_keys(&k);
    let held = l.rwlock(&k).unwrap().try_read().await.unwrap();
    assert_eq!(replica.cmd(&["ZCARD", &readers]).as_int(), Some(1));
    replica.freeze();
    let refused = |res: Result<tower_redis_lock::LockGuard, Error>| match res {
        Err(Error::Unavailable { source, .. }) => {
            assert!(
                source.to_string().contains("replicas acknowledged"),
                "{source}"
            )
        }
        other => panic!("{other:?}"),
    };
    refused(l.rwlock(&k).unwrap().try_read().await);
    assert_eq!(
        primary.cmd(&["ZCARD", &readers]).as_int(),
        Some(1),
        "the refused read was kept"
    );
    drop(held);
    assert!(
        eventually(Duration::from_secs(5), async || primary
            .cmd(&["EXISTS", &readers])
            .as_int()
            == Some(0))
        .await
    );
    refused(l.rwlock(&k).unwrap().try_write().await);
    assert_eq!(
        primary.cmd(&["EXISTS", &writer]).as_int(),
        Some(0),
        "the refused write was kept"
    );
    replica.thaw();
    assert!(l.rwlock(&k).unwrap().try_write().await.is_ok());
}
