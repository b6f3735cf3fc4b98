//! Unit tests of the wait loop and the local FIFO, on paused time.

use crate::store::LockStoreExt;
use std::sync::Mutex;

use super::super::test_support::{Counting, key};
use super::*;
use crate::store::memory::MemoryStore;

const LEASE: Duration = Duration::from_secs(30);

fn locker(wait: Duration) -> Locker<MemoryStore> {
    Locker::builder(MemoryStore::new())
        .lease(LEASE)
        .wait_timeout(wait)
        .build()
        .unwrap()
}

/// Lets every task that can run, run (paused time stands still).
async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_hold_cap_shorter_than_the_lease_ends_the_lock_everywhere_at_the_cap() {
    let cap = Duration::from_secs(12);
    let l = Locker::builder(MemoryStore::new())
        .lease(LEASE)
        .max_hold(cap)
        .build()
        .unwrap();
    let k = key("cap");
    let g = l.acquire(&k).await.unwrap();
    let t0 = g.acquired_at();
    // Renewed at 10 s for the 2 s left; never held past the cap, here
    // or in the store.
    tokio::time::sleep_until(t0 + cap - Duration::from_millis(1)).await;
    assert!(l.store().is_locked(&k));
    tokio::time::sleep_until(t0 + cap).await;
    assert!(!l.store().is_locked(&k), "the store let the lock go");
    assert!(!g.is_held(), "but the guard still says held");
    g.lost().await;

    // A cap under lease/3 ends the lock before any renewal: the grant
    // itself must be that short.
    let cap = Duration::from_secs(5);
    let l = Locker::builder(MemoryStore::new())
        .lease(LEASE)
        .max_hold(cap)
        .build()
        .unwrap();
    let g = l.acquire(&k).await.unwrap();
    tokio::time::sleep_until(g.acquired_at() + cap).await;
    assert!(!l.store().is_locked(&k), "held in the store past the cap");
    assert!(!g.is_held());
}

#[tokio::test(start_paused = true)]
async fn local_waiters_get_the_lock_in_arrival_order_one_release_each() {
    let l = locker(Duration::from_secs(600));
    let k = key("fifo");
    let first = l.acquire(&k).await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for n in 0..4 {
        let (l2, k2, order) = (l.clone(), k.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let (l, k) = (l2, k2);
            let g = l.acquire(&k).await.unwrap();
            order.lock().unwrap().push(n);
            // Hold a while, so that the next one has to wait for us.
            tokio::time::sleep(Duration::from_millis(10)).await;
            g.release().await.unwrap();
        }));
        settle().await;
        assert!(l.has_waiters(&k));
    }
    assert!(order.lock().unwrap().is_empty());
    first.release().await.unwrap();
    settle().await;
    // One release wakes one waiter, not the herd.
    assert_eq!(*order.lock().unwrap(), [0]);
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3]);
    assert!(!l.has_waiters(&k), "the queue goes with its last waiter");
}

#[tokio::test(start_paused = true)]
async fn a_new_acquirer_that_means_to_wait_queues_behind_the_waiters() {
    let l = locker(Duration::from_secs(600));
    let k = key("no-barging");
    let first = l.acquire(&k).await.unwrap();
    let waiter = {
        let (l, k) = (l.clone(), k.clone());
        tokio::spawn(async move { l.acquire(&k).await.unwrap().fencing_token().unwrap() })
    };
    settle().await;
    // Released, and at once (before the woken waiter runs) a newcomer
    // asks: it queues, and the waiter goes first.
    first.release().await.unwrap();
    let g = l.acquire(&k).await.unwrap();
    let came_later = g.fencing_token().unwrap();
    let waited = waiter.await.unwrap();
    assert!(waited < came_later, "{waited:?} then {came_later:?}");
}

#[tokio::test(start_paused = true)]
async fn while_a_local_waiter_holds_the_lock_the_next_one_does_not_poll_the_store() {
    let l = Locker::builder(Counting::default())
        .lease(LEASE)
        .wait_timeout(Duration::from_secs(600))
        .build()
        .unwrap();
    let k = key("held-here");
    let first = l.acquire(&k).await.unwrap();
    let spawn_waiter = |hold: Duration| {
        let (l, k) = (l.clone(), k.clone());
        tokio::spawn(async move {
            let g = l.acquire(&k).await.unwrap();
            tokio::time::sleep(hold).await;
            g.release().await.unwrap();
        })
    };
    let a = spawn_waiter(Duration::from_secs(20));
    settle().await;
    let b = spawn_waiter(Duration::ZERO);
    settle().await;
    first.release().await.unwrap();
    settle().await;
    // A got it from the queue and holds it 20 s; B, behind it, would
    // poll every 250 ms if it asked the store.
    let before = l.store().acquires();
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(l.store().acquires(), before, "B polled a lock held here");
    a.await.unwrap();
    b.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_waiter_leaves_the_queue_and_the_next_one_is_woken() {
    let l = locker(Duration::from_secs(600));
    let k = key("cancel");
    let first = l.acquire(&k).await.unwrap();
    let spawn_waiter = || {
        let (l, k) = (l.clone(), k.clone());
        tokio::spawn(async move { l.acquire(&k).await.unwrap() })
    };
    let cancelled = spawn_waiter();
    settle().await;
    let next = spawn_waiter();
    settle().await;
    cancelled.abort();
    settle().await;
    assert!(l.has_waiters(&k), "the other waiter is still queued");
    first.release().await.unwrap();
    let g = tokio::time::timeout(Duration::from_millis(10), next)
        .await
        .expect("the waiter behind the cancelled one was not woken")
        .unwrap();
    assert!(g.is_held());
    assert!(!l.has_waiters(&k));
    // And a lone cancelled waiter leaves no queue behind.
    let lone = spawn_waiter();
    settle().await;
    assert!(l.has_waiters(&k));
    lone.abort();
    settle().await;
    assert!(!l.has_waiters(&k));
}

#[tokio::test(start_paused = true)]
async fn a_waiter_that_times_out_behind_local_waiters_answers_the_holders_remaining_time() {
    // Held elsewhere, 10 s left of its lease; two waiters here: the second
    // never reaches the store (it queues behind the first), and its
    // Retry-After is still what the holder has left, not a whole lease.
    let l = locker(Duration::from_secs(2));
    let k = key("queued-retry-after");
    let owner = OwnerToken::generate();
    let AcquireOutcome::Granted(_) = l.store().acquire(&k, &owner, LEASE).await.unwrap() else {
        panic!("not granted");
    };
    tokio::time::advance(Duration::from_secs(20)).await;
    let first = {
        let l = l.clone();
        let k = k.clone();
        tokio::spawn(async move { l.acquire(&k).await })
    };
    settle().await;
    assert!(l.has_waiters(&k));
    let err = l.acquire(&k).await.unwrap_err();
    let Error::WaitTimeout { retry_after, .. } = err else {
        panic!("{err:?}");
    };
    assert!(
        retry_after <= Duration::from_secs(10) && retry_after >= Duration::from_secs(7),
        "Retry-After {retry_after:?} for a holder with 8 s left"
    );
    assert!(first.await.unwrap().is_err());
}
