//! One hold of a grant (the grant itself, or one re-entry), and hold
//! counting: the lock is released when the last hold is given back.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::lease::Lease;
use super::pending::{EndOp, Ending};
use super::watchdog::Watchdog;
use crate::key::LockKey;
use crate::store::LockStore;

/// One hold of a lease: the grant, or one re-entry. Clones of a guard
/// share it.
pub(crate) struct Hold {
    pub(crate) end: Ending,
    pub(crate) watchdog: Watchdog,
    /// Whether this hold has been given back (release, finish or drop).
    ended: AtomicBool,
}

impl Hold {
    /// The first hold of a fresh grant.
    pub(crate) fn new(end: Ending, watchdog: Watchdog) -> Hold {
        Hold {
            end,
            watchdog,
            ended: AtomicBool::new(false),
        }
    }

    pub(crate) fn lease(&self) -> &Arc<Lease> {
        &self.end.lease
    }

    pub(crate) fn key(&self) -> &LockKey {
        &self.end.lease.key
    }

    /// Whether this hold is given back.
    pub(crate) fn is_ended(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }

    /// This hold not given back, and the lease valid.
    pub(crate) fn is_held(&self) -> bool {
        !self.is_ended() && self.end.lease.is_valid_now()
    }

    /// Whether the lock was granted by a store with this instance id.
    pub(crate) fn is_from(&self, store: usize) -> bool {
        self.end.store.instance_id() == store
    }

    /// One more hold on the same grant, or `None` if this hold is given
    /// back or the lock is no longer held (zero holds means the lock is
    /// being released: no coming back).
    pub(crate) fn reenter(&self) -> Option<Hold> {
        if !self.is_held() {
            return None;
        }
        self.end
            .lease
            .holds
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n > 0).then_some(n + 1)
            })
            .ok()?;
        Some(Hold::new(self.end.clone(), self.watchdog.clone()))
    }

    /// Holds the grant has right now.
    pub(crate) fn count(&self) -> u32 {
        self.end.lease.holds.load(Ordering::Acquire)
    }

    /// Gives this hold back: `Some(true)` if it was the last hold of the
    /// lease (the caller releases the lock), `Some(false)` if others remain,
    /// `None` if this hold was given back before.
    pub(crate) fn end_hold(&self) -> Option<bool> {
        if self.ended.swap(true, Ordering::AcqRel) {
            return None;
        }
        Some(self.end.lease.holds.fetch_sub(1, Ordering::AcqRel) == 1)
    }

    /// Marks the lease released and takes it off the watchdog, before any
    /// release command is sent. Returns false if it was released before.
    pub(crate) fn stop_renewal(&self) -> bool {
        if !self.end.lease.mark_released() {
            return false;
        }
        self.watchdog.remove(self.end.lease.id);
        true
    }

    /// Gives this hold back; if it was the last, stops renewal and releases
    /// in a spawned task (retried on errors); never blocks.
    pub(crate) fn release_in_background(&self) {
        if self.end_hold() != Some(true) || !self.stop_renewal() {
            return;
        }
        self.end.spawn(EndOp::Release, false);
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.release_in_background();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::queue::Queues;
    use super::super::test_support::{grant, key};
    use super::*;
    use crate::store::memory::MemoryStore;

    struct Granted {
        hold: Hold,
        store: Arc<MemoryStore>,
        watchdog: Watchdog,
    }

    async fn granted(id: &str) -> Granted {
        let store = Arc::new(MemoryStore::new());
        let lease = grant(&store, &key(id), Duration::from_secs(30), None).await;
        let watchdog = Watchdog::detached();
        watchdog.add(lease.clone());
        let erased = crate::store::BoxStore::from_arc(store.clone());
        let end = Ending {
            lease,
            recovery: Arc::new(crate::engine::recovery::Recovery::new(erased.clone())),
            store: erased,
            local: Queues::default(),
            runtime: Some(tokio::runtime::Handle::current()),
        };
        Granted {
            hold: Hold::new(end, watchdog.clone()),
            store,
            watchdog,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn each_reentry_counts_and_only_the_last_hold_given_back_ends_the_lock() {
        let Granted {
            hold,
            store,
            watchdog,
        } = granted("count").await;
        let k = hold.key().clone();
        assert_eq!(hold.count(), 1);
        let second = hold.reenter().unwrap();
        let third = second.reenter().unwrap();
        assert_eq!(hold.count(), 3);

        // Given back in any order; the first two leave the lock alone.
        assert_eq!(second.end_hold(), Some(false));
        assert_eq!(second.end_hold(), None, "a hold is given back once");
        assert!(!second.is_held() && hold.is_held() && third.is_held());
        assert_eq!(hold.end_hold(), Some(false));
        drop(hold);
        drop(second);
        assert_eq!(third.count(), 1);
        tokio::task::yield_now().await;
        assert!(store.is_locked(&k));
        assert_eq!(watchdog.renewing(), 1, "renewal stopped under a live hold");

        // The last one, dropped: off the watchdog, released in the store.
        drop(third);
        assert_eq!(watchdog.renewing(), 0);
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!store.is_locked(&k));
    }

    #[tokio::test(start_paused = true)]
    async fn no_reentry_into_a_lock_being_released_or_through_a_given_back_hold() {
        let g = granted("closed").await;
        let other = g.hold.reenter().unwrap();
        assert_eq!(other.end_hold(), Some(false));
        assert!(
            other.reenter().is_none(),
            "re-entered through a given-back hold"
        );
        assert_eq!(g.hold.end_hold(), Some(true));
        // Zero holds: the lock is being released, nobody comes back in.
        assert!(g.hold.reenter().is_none());
        assert_eq!(g.hold.count(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn renewal_stops_once_whoever_ends_the_lock() {
        let g = granted("stop").await;
        assert!(g.hold.stop_renewal());
        assert_eq!(g.watchdog.renewing(), 0);
        assert!(!g.hold.stop_renewal(), "stopped twice");
        assert!(!g.hold.is_held());
    }
}
