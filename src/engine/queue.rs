//! This process's waiters, per key: a local FIFO so that one release wakes
//! one local task, and the key's release subscription handed from one
//! waiter to the next.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;

use super::lease::Lease;
use crate::key::LockKey;
use crate::store::ReleaseWatch;
use crate::sync::lock;

type QueueMap = Mutex<HashMap<LockKey, Arc<KeyQueue>>>;

/// This process's waiting tasks, per key. Guards hold it too, so that a
/// local release wakes the local waiter at once, without waiting for the
/// store's notification (or, where there is none, for a poll).
#[derive(Clone, Default)]
pub(crate) struct Queues(Arc<QueueMap>);

impl Queues {
    /// Tells the key's waiting task (if any) that the lock was just released
    /// here.
    pub(crate) fn wake(&self, key: &LockKey) {
        if let Some(q) = lock(&self.0).get(key) {
            q.released.notify_one();
        }
    }

    /// Whether a task is waiting for `key` right now.
    pub(crate) fn has_waiters(&self, key: &LockKey) -> bool {
        lock(&self.0).contains_key(key)
    }

    /// Joins the key's queue (creating it); the handle leaves it on drop.
    pub(crate) fn join<'a>(&'a self, key: &'a LockKey) -> QueueRef<'a> {
        let queue = lock(&self.0)
            .entry(key.clone())
            .or_insert_with(|| {
                Arc::new(KeyQueue {
                    turn: Semaphore::new(1),
                    released: Notify::new(),
                    watch: Mutex::new(None),
                    holder: Mutex::default(),
                    seen_until: Mutex::default(),
                })
            })
            .clone();
        QueueRef {
            queue,
            key,
            map: &self.0,
        }
    }
}

/// This process's waiters for one key: whoever holds `turn` waits on the
/// store; the others wait for the turn, first come first served.
pub(crate) struct KeyQueue {
    pub(crate) turn: Semaphore,
    /// A release by this process.
    pub(crate) released: Notify,
    /// The key's release subscription, handed from one waiter to the next
    /// and dropped (unsubscribed) with the queue.
    watch: Mutex<Option<ReleaseWatch>>,
    /// The lease of the last grant to one of the queue's waiters. While it
    /// is valid, the lock is held here and its release will be local:
    /// waiters need not ask the store.
    holder: Mutex<Weak<Lease>>,
    /// When the holder's lease ends, as a waiter of the queue last saw it
    /// (the store's answer): for the `Retry-After` of a waiter that timed
    /// out in the queue, without asking the store itself.
    seen_until: Mutex<Option<Instant>>,
}

impl KeyQueue {
    /// How long the lock stays held by a task of this process, if it is.
    pub(crate) fn held_here(&self) -> Option<Duration> {
        let lease = lock(&self.holder).upgrade()?;
        lease.is_valid_now().then(|| {
            lease
                .valid_until()
                .saturating_duration_since(Instant::now())
        })
    }

    /// Records what a waiter of the queue was told: the lock is held for
    /// `remaining` more.
    pub(crate) fn saw_held(&self, remaining: Duration) {
        let until = crate::time::far_add(Instant::now(), remaining);
        *lock(&self.seen_until) = Some(until);
    }

    /// How long the lock stays held, as far as this queue knows: a holder
    /// of this process, or what a waiter was last told by the store.
    pub(crate) fn held_for(&self) -> Option<Duration> {
        self.held_here().or_else(|| {
            let until = (*lock(&self.seen_until))?;
            let left = until.saturating_duration_since(Instant::now());
            (!left.is_zero()).then_some(left)
        })
    }

    /// Records the lease just granted to one of the queue's waiters (what
    /// was heard of the previous holder no longer applies).
    pub(crate) fn set_holder(&self, lease: &Arc<Lease>) {
        *lock(&self.seen_until) = None;
        *lock(&self.holder) = Arc::downgrade(lease);
    }
}

/// A waiter's handle on its key's queue; the last one out removes the queue.
pub(crate) struct QueueRef<'a> {
    queue: Arc<KeyQueue>,
    key: &'a LockKey,
    map: &'a QueueMap,
}

impl QueueRef<'_> {
    pub(crate) fn take_watch(&self) -> Option<ReleaseWatch> {
        lock(&self.queue.watch).take()
    }

    pub(crate) fn put_watch(&self, watch: Option<ReleaseWatch>) {
        if let Some(w) = watch {
            *lock(&self.queue.watch) = Some(w);
        }
    }
}

impl std::ops::Deref for QueueRef<'_> {
    type Target = KeyQueue;

    fn deref(&self) -> &KeyQueue {
        &self.queue
    }
}

impl Drop for QueueRef<'_> {
    fn drop(&mut self) {
        let mut map = lock(self.map);
        // Only the map and this handle left: nobody else waits here.
        if Arc::strong_count(&self.queue) == 2 {
            map.remove(self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{grant, key};
    use super::*;
    use crate::store::memory::MemoryStore;

    #[tokio::test(start_paused = true)]
    async fn the_queue_lives_as_long_as_its_last_waiter() {
        let queues = Queues::default();
        let k = key("q");
        assert!(!queues.has_waiters(&k));
        let a = queues.join(&k);
        let b = queues.join(&k);
        assert!(queues.has_waiters(&k));
        drop(a);
        assert!(queues.has_waiters(&k), "removed under a waiter");
        drop(b);
        assert!(!queues.has_waiters(&k));
    }

    #[tokio::test(start_paused = true)]
    async fn a_local_release_wakes_one_waiter_of_that_key_only() {
        let queues = Queues::default();
        let (k, other) = (key("wake"), key("other"));
        let q = queues.join(&k);
        let mut woken = std::pin::pin!(q.released.notified());
        woken.as_mut().enable();
        queues.wake(&other);
        assert!(
            futures_util::poll!(woken.as_mut()).is_pending(),
            "woken by another key"
        );
        queues.wake(&k);
        assert!(futures_util::poll!(woken.as_mut()).is_ready());
    }

    #[tokio::test(start_paused = true)]
    async fn a_release_just_before_the_waiter_waits_is_not_lost() {
        let queues = Queues::default();
        let k = key("early");
        let q = queues.join(&k);
        // Released between the waiter's failed try and its wait.
        queues.wake(&k);
        let woken = q.released.notified();
        assert!(futures_util::poll!(std::pin::pin!(woken)).is_ready());
    }

    #[test]
    fn a_wake_with_nobody_queued_is_a_no_op() {
        let queues = Queues::default();
        let k = key("nobody");
        queues.wake(&k);
        assert!(!queues.has_waiters(&k));
    }

    #[tokio::test(start_paused = true)]
    async fn the_lock_counts_as_held_here_while_the_last_local_grant_is_valid() {
        let queues = Queues::default();
        let k = key("held-here");
        let q = queues.join(&k);
        assert_eq!(q.held_here(), None);
        let lease = grant(&MemoryStore::new(), &k, Duration::from_secs(30), None).await;
        q.set_holder(&lease);
        assert_eq!(q.held_here(), Some(lease.valid_for()));
        lease.mark_released();
        assert_eq!(q.held_here(), None, "a released lease is not held here");
        let next = grant(&MemoryStore::new(), &k, Duration::from_secs(30), None).await;
        q.set_holder(&next);
        assert!(q.held_here().is_some());
        // Past its deadline (not renewed: no watchdog here), it is not.
        tokio::time::advance(next.valid_for()).await;
        assert_eq!(q.held_here(), None, "an expired lease is held here");
        let last = grant(&MemoryStore::new(), &k, Duration::from_secs(30), None).await;
        q.set_holder(&last);
        assert!(q.held_here().is_some());
        drop(last);
        assert_eq!(q.held_here(), None, "a dropped lease is not held here");
    }
}
