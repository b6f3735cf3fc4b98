//! The lock engine: acquiring with a wait, and handing out guards.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;

use super::guard::LockGuard;
use super::lease::Ask;
use super::options::Options;
use super::queue::Queues;
use super::recovery::Recovery;
use super::watchdog::Watchdog;
use crate::error::Error;
use crate::key::LockKey;
use crate::store::{BoxStore, LeaseKind, LockStore};

/// A [`Locker`]'s state: see [`Locker::status`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Status {
    /// Leases the locker keeps renewed: granted, neither released nor
    /// found lost.
    pub renewing: usize,
    /// `false` from an acquire (or [`check`](Locker::check)) that found the
    /// store unavailable until the store answers again: the locker probes
    /// it in the background meanwhile, at least once a second. `true`
    /// before any acquire.
    pub store_up: bool,
    /// Calls abandoned during an outage (an acquire that timed out, a
    /// release that kept failing) whose possible effect waits to be taken
    /// back, owner-checked, once the store answers: 0 when nothing can be
    /// left stuck.
    pub undos_waiting: usize,
}

/// What [`Locker::acquire_or_replay`] found.
#[derive(Debug)]
pub enum Acquired {
    /// The lock is ours: do the work, then [`LockGuard::finish`] or release.
    Locked(LockGuard),
    /// The work was done before: the bytes its holder stored with
    /// [`LockGuard::finish`], to replay. The engine never looks inside
    /// them (the `LockLayer` (feature `axum`) stores an encoded
    /// `Record`).
    Completed(Bytes),
}

/// Takes locks from a [`LockStore`] and keeps them alive.
///
/// A `Locker` is cheap to clone; clones share their watchdog, which renews
/// every lease they hold, every lease/3, in pipelined batches: one task per
/// runtime the locker grants on (usually one), spawned there with its first
/// grant, so that a lease is renewed on the runtime it was granted on. A
/// locker can be used from several runtimes (a `static` shared by
/// `#[tokio::test]`s, a setup runtime, a restarted worker): when a runtime
/// shuts down, the leases granted on it that are still held are reported
/// lost at once ([`LockGuard::lost`] resolves); the others are not
/// touched.
///
/// ```
/// use std::time::Duration;
/// use tower_redis_lock::{LockKey, Locker, MemoryStore};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower_redis_lock::Error> {
/// let locker = Locker::builder(MemoryStore::new())
///     .lease(Duration::from_secs(10))
///     .wait_timeout(Duration::from_secs(2))
///     .build()?;
///
/// let key = LockKey::new("reports", "2026-11")?;
/// let guard = locker.acquire(&key).await?;
/// if let Ok(token) = guard.fencing_token() {
///     println!("fencing token {token}");
/// }
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
pub struct Locker<S> {
    pub(super) inner: Arc<Inner<S>>,
}

impl<S> Clone for Locker<S> {
    fn clone(&self) -> Self {
        Locker {
            inner: self.inner.clone(),
        }
    }
}

pub(crate) struct Inner<S> {
    pub(crate) store: Arc<S>,
    /// The same store, type-erased once for the guards (which are not
    /// generic): cloning it per grant is a reference count, not a box.
    pub(crate) erased: BoxStore,
    pub(crate) opts: Options,
    /// The renewal schedulers, one per runtime the locker grants on.
    watchdogs: RwLock<Vec<Watchdog>>,
    pub(crate) next_id: AtomicU64,
    /// This process's waiters for a key's lock.
    pub(crate) queues: Queues,
    /// This process's waiters for a permit of a key's semaphore (apart
    /// from the lock's: a permit held here does not mean none is free).
    pub(crate) permit_queues: Queues,
    /// This process's waiters for either side of a key's reader-writer
    /// lock (one queue: in turn, whichever side each wants).
    pub(crate) rw_queues: Queues,
    /// The store's health, and the undos of abandoned calls.
    pub(crate) recovery: Arc<Recovery>,
}

impl<S> std::fmt::Debug for Locker<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Locker")
            .field("lease", &self.inner.opts.lease)
            .field("wait_timeout", &self.inner.opts.wait)
            .field("max_hold", &self.inner.opts.max_hold)
            .finish_non_exhaustive()
    }
}

impl<S: LockStore> Locker<S> {
    /// A locker with the defaults: 30 s lease, try-lock, no hold cap.
    pub fn new(store: S) -> Self {
        Locker::with_options(store, Options::default())
    }

    pub(crate) fn with_options(store: S, opts: Options) -> Self {
        let store = Arc::new(store);
        let erased = BoxStore::from_arc(store.clone());
        Locker {
            inner: Arc::new(Inner {
                recovery: Arc::new(Recovery::new(erased.clone())),
                erased,
                store,
                opts,
                watchdogs: RwLock::default(),
                next_id: AtomicU64::new(0),
                queues: Queues::default(),
                permit_queues: Queues::default(),
                rw_queues: Queues::default(),
            }),
        }
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.inner.store
    }

    /// The store, shared.
    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    pub(crate) fn store_arc(&self) -> Arc<S> {
        Arc::clone(&self.inner.store)
    }

    /// The configured lease.
    pub fn lease(&self) -> Duration {
        self.inner.opts.lease
    }

    /// How many leases the watchdog is renewing right now (granted and
    /// neither released nor found lost).
    ///
    /// A test hook (feature `test-util`): tests wait for leases to be
    /// dropped.
    #[cfg(any(test, feature = "test-util"))]
    #[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
    pub fn renewing(&self) -> usize {
        let all = crate::sync::read(&self.inner.watchdogs);
        all.iter().map(Watchdog::renewing).sum()
    }

    /// What this locker holds and how its store answered, for a health or
    /// readiness route (as deadpool's `Pool::status()` is for a pool).
    ///
    /// ```
    /// use tower_redis_lock::{LockKey, Locker, MemoryStore};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_redis_lock::Error> {
    /// let locker = Locker::new(MemoryStore::new());
    /// let guard = locker.acquire(&LockKey::new("jobs", "nightly")?).await?;
    /// let status = locker.status();
    /// assert_eq!(status.renewing, 1);
    /// assert!(status.store_up);
    /// # drop(guard);
    /// # Ok(())
    /// # }
    /// ```
    pub fn status(&self) -> Status {
        let renewing = crate::sync::read(&self.inner.watchdogs)
            .iter()
            .map(Watchdog::renewing)
            .sum();
        Status {
            renewing,
            store_up: !self.inner.recovery.health.is_down(),
            undos_waiting: self.inner.recovery.waiting(),
        }
    }

    /// Asks the store whether it answers now ([`LockStore::check`]: for a
    /// [`RedisStore`](crate::RedisStore), connections opened, the boot
    /// checks run, a `PING` answered), and notes the answer in
    /// [`status`](Locker::status): a readiness check. Show the error with
    /// [`Error::report`] (each cause once).
    ///
    /// The locker probes its store by itself while an acquire last found it
    /// down, so `status().store_up` recovers without traffic too (within
    /// about a second of the store answering again).
    ///
    /// ```
    /// use tower_redis_lock::{Locker, MemoryStore};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let locker = Locker::new(MemoryStore::new());
    /// match locker.check().await {
    ///     Ok(()) => println!("ready"),
    ///     Err(e) => println!("not ready: {}", e.report()),
    /// }
    /// # }
    /// ```
    pub async fn check(&self) -> Result<(), Error> {
        let answer = self.inner.store.check().await;
        self.inner.recovery.saw(&answer);
        answer
    }

    /// The configured wait timeout.
    pub fn wait_timeout(&self) -> Duration {
        self.inner.opts.wait
    }

    /// Takes the lock, waiting up to the configured wait timeout.
    pub async fn acquire(&self, key: &LockKey) -> Result<LockGuard, Error> {
        self.acquire_within(key, self.inner.opts.wait).await
    }

    /// Takes the lock if it is free right now ([`Error::Contended`]
    /// otherwise).
    pub async fn try_acquire(&self, key: &LockKey) -> Result<LockGuard, Error> {
        self.acquire_within(key, Duration::ZERO).await
    }

    /// Takes the lock, waiting up to `wait` (0 = try-lock).
    ///
    /// While waiting it first tries, then subscribes to the key's release
    /// notifications, then tries again before every wait — so a release
    /// between a failed try and the wait is never missed. It wakes on a
    /// notification, or after a jittered poll bounded by the holder's
    /// remaining lease (which covers expiry, which nobody announces).
    ///
    /// Every step after the first try — waiting for this process's earlier
    /// waiters, subscribing, each further try — ends at the deadline
    /// (`wait` after the call), whatever the store's command timeout: a wait
    /// answers [`Error::WaitTimeout`] on time even when the store stops
    /// answering. `Duration::MAX` waits for ever.
    ///
    /// Dropping the future at any point is safe: an attempt whose answer was
    /// not received (dropped, or cut at the deadline) is released in the
    /// background (owner-checked, on the current runtime).
    ///
    /// Re-entry: when the calling task already holds `key` through this
    /// locker's store or a clone of it (inside [`LockGuard::scope`]; the
    /// `LockLayer` (feature `axum`) runs its inner service in one), the
    /// answer is one more hold on that grant, at once and with the same
    /// fencing token (see [`LockGuard::reenter`]).
    pub async fn acquire_within(&self, key: &LockKey, wait: Duration) -> Result<LockGuard, Error> {
        match self.take(key, wait, Ask::Lock { replay: false }).await? {
            Acquired::Locked(guard) => Ok(guard),
            Acquired::Completed(_) => Err(Error::Record {
                key: key.clone(),
                reason: "the store answered a plain acquire with a completed record",
            }),
        }
    }

    /// Takes the lock unless the key's work is already done: then answers
    /// its completed bytes (stored by [`LockGuard::finish`]) without
    /// locking. Waits up to the configured wait timeout like
    /// [`acquire`](Locker::acquire), so a duplicate that arrives while the
    /// first is running can wait for its record.
    ///
    /// With the Redis store this is one round trip when the key is free or
    /// completed.
    pub async fn acquire_or_replay(&self, key: &LockKey) -> Result<Acquired, Error> {
        self.take(key, self.inner.opts.wait, Ask::Lock { replay: true })
            .await
    }

    /// [`acquire_or_replay`](Locker::acquire_or_replay), waiting up to
    /// `wait` (0 = try once) instead of the configured wait timeout.
    pub async fn acquire_or_replay_within(
        &self,
        key: &LockKey,
        wait: Duration,
    ) -> Result<Acquired, Error> {
        self.take(key, wait, Ask::Lock { replay: true }).await
    }

    /// This process's waiters for leases of `kind`.
    pub(crate) fn queues(&self, kind: LeaseKind) -> &Queues {
        match kind {
            LeaseKind::Lock => &self.inner.queues,
            LeaseKind::Permit => &self.inner.permit_queues,
            LeaseKind::Read | LeaseKind::Write | LeaseKind::WriterMark => &self.inner.rw_queues,
        }
    }

    /// Identifies the store behind this locker (for re-entry: a guard
    /// re-enters only through the store that granted it, or a clone).
    pub(crate) fn store_id(&self) -> usize {
        self.inner.store.instance_id()
    }

    /// Whether a task of this locker is waiting for `key` (its lock, a
    /// permit of its [`Semaphore`](crate::Semaphore), or either side of
    /// its [`ReadWriteLock`](crate::ReadWriteLock)) right now.
    ///
    /// A test hook (feature `test-util`): tests wait for a waiter to be
    /// queued.
    #[cfg(any(test, feature = "test-util"))]
    #[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
    pub fn has_waiters(&self, key: &LockKey) -> bool {
        self.inner.queues.has_waiters(key)
            || self.inner.permit_queues.has_waiters(key)
            || self.inner.rw_queues.has_waiters(key)
    }

    /// The watchdog of `runtime` (the caller's): one renewal task per
    /// runtime the locker grants on, spawned there with its first grant, so
    /// that a lease is renewed on the runtime it was granted on. A runtime
    /// that shuts down takes its task along, and its leases still held are
    /// reported lost; one that idles (kept, no longer driven) stalls only
    /// its own leases, whose holders stall with it.
    pub(crate) fn watchdog(&self, runtime: &tokio::runtime::Handle) -> Watchdog {
        let watchdogs = &self.inner.watchdogs;
        {
            // The usual case, read-only: the runtime's task runs already.
            let all = crate::sync::read(watchdogs);
            if let Some(w) = all.iter().find(|w| w.serves(runtime)) {
                return w.clone();
            }
        }
        let mut all = crate::sync::write(watchdogs);
        if let Some(w) = all.iter().find(|w| w.serves(runtime)) {
            return w.clone();
        }
        // (The ones whose runtime is gone have nothing left to renew.)
        all.retain(|w| !w.is_ended());
        let w = Watchdog::start(
            self.inner.store.clone(),
            runtime,
            self.inner.opts.batch,
            // Renewals due within lease/12 of each other share a batch.
            self.inner.opts.lease / 12,
        );
        all.push(w.clone());
        w
    }
}
