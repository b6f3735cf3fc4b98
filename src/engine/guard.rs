//! The guard a holder keeps while it holds a lock: the public face of a
//! [`Hold`].

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;
use tracing::Instrument;

use super::exported::ExportedLease;
use super::hold::Hold;
use super::lease::{Lease, LossReason};
use super::pending::{EndOp, Ending, PendingEnd, trace_release};
use super::reentry;
use super::watchdog::Watchdog;
use crate::error::{Chain, Error};
use crate::key::LockKey;
use crate::observe;
use crate::store::{LeaseKind, LockStore};
use crate::token::{FencingToken, Unfenced};

/// Proof that we hold a lock, for as long as [`is_held`](LockGuard::is_held)
/// says so.
///
/// * cheap to clone (`Arc` inside), `Send + Sync`, not generic: it can travel
///   in request extensions and into spawned tasks;
/// * the watchdog renews the lease every lease/3 while any clone is alive;
/// * when a renewal finds another owner, or the local validity deadline
///   passes without a successful renewal, the guard flips to lost at once:
///   `is_held()` turns false and every [`lost()`](LockGuard::lost) future
///   resolves;
/// * [`release`](LockGuard::release) gives the lock back and says whether we
///   still owned it; dropping the last clone releases in a task spawned on
///   the current runtime (or, outside any, on the one that granted the
///   lock) and never blocks. Renewal stops before the release is sent.
/// * cancellation-safe: a `release` or `finish` future dropped at any point
///   completes in the background, and a release that fails (a brief
///   outage) is retried there until the store answers or the lease is over;
///   this process's waiters for the key are woken once it lands.
///
/// ```
/// use tower_redis_lock::{LockKey, Locker, MemoryStore};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower_redis_lock::Error> {
/// let locker = Locker::new(MemoryStore::new());
/// let guard = locker.acquire(&LockKey::new("invoices", "inv_7")?).await?;
///
/// // Hand the fencing token to the resource you write to (a store built
/// // `fencing(false)` on the store builder answers `Err(Unfenced)` here: it mints none).
/// let token = guard.fencing_token().expect("the memory store fences");
/// assert!(guard.is_held());
///
/// tokio::select! {
///     _ = guard.lost() => { /* stop: someone else may hold it now */ }
///     _ = async { /* the work */ } => {}
/// }
/// assert!(guard.release().await?);
/// # let _ = token;
/// # Ok(())
/// # }
/// ```
///
/// A guard left unused is a lock released at once, so the compiler warns:
///
/// ```compile_fail
/// #![deny(unused_must_use)]
/// # use tower_redis_lock::{LockKey, Locker, MemoryStore};
/// # async fn work(locker: Locker<MemoryStore>, key: LockKey) -> Result<(), tower_redis_lock::Error> {
/// locker.acquire(&key).await?; // the guard is dropped here: the lock with it
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
#[must_use = "the lock is released as soon as its guard is dropped; keep the guard while the work runs"]
pub struct LockGuard {
    shared: Arc<Hold>,
}
impl LockGuard {
    /// The guard of a fresh grant.
    pub(crate) fn new(end: Ending, watchdog: Watchdog) -> Self {
        LockGuard {
            shared: Arc::new(Hold::new(end, watchdog)),
        }
    }

    /// A guard on an existing hold (found by task-local re-entry).
    pub(crate) fn from_hold(shared: Arc<Hold>) -> Self {
        LockGuard { shared }
    }

    /// Takes the lock again for a nested piece of work of the same holder,
    /// without asking the store: the returned guard is one more hold on the
    /// same grant (same key, same fencing token, same lease and watchdog).
    ///
    /// Holds are counted, like Redisson's re-entrant lock: the lock is
    /// released when every hold has been released or dropped, in any order.
    /// [`finish`](LockGuard::finish) is the exception: it ends the lock for
    /// every hold at once. A re-entry costs no round trip.
    ///
    /// Fails with [`Error::LockLost`] if the lock is no longer held (lost,
    /// expired or released).
    ///
    /// [`Locker`](crate::Locker) re-enters by itself when the task that asks
    /// for a key already holds it through [`scope`](LockGuard::scope) (the
    /// `LockLayer` (feature `axum`) runs its inner service in one).
    ///
    /// ```
    /// use tower_redis_lock::{LockKey, Locker, MemoryStore};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_redis_lock::Error> {
    /// let locker = Locker::new(MemoryStore::new());
    /// let key = LockKey::new("orders", "42")?;
    /// let outer = locker.acquire(&key).await?;
    /// let inner = outer.reenter()?;
    /// assert_eq!(inner.fencing_token(), outer.fencing_token());
    /// assert_eq!(outer.hold_count(), 2);
    ///
    /// inner.release().await?; // one hold left: still locked
    /// assert!(locker.try_acquire(&key).await.is_err());
    /// outer.release().await?; // the last hold: released
    /// assert!(locker.try_acquire(&key).await.is_ok());
    /// # Ok(())
    /// # }
    /// ```
    pub fn reenter(&self) -> Result<LockGuard, Error> {
        match self.shared.reenter() {
            Some(hold) => Ok(LockGuard {
                shared: Arc::new(hold),
            }),
            None => Err(Error::LockLost {
                key: self.key().clone(),
            }),
        }
    }

    /// How many holds the grant has: 1 after the acquire, +1 per
    /// [`reenter`](LockGuard::reenter), −1 per hold released or dropped.
    pub fn hold_count(&self) -> u32 {
        self.shared.count()
    }

    /// Runs `fut` with this lock registered as held by the current task, so
    /// that a [`Locker`](crate::Locker) call for the same key inside it
    /// (through any locker on the same store or a clone of it) re-enters
    /// instead of waiting for itself. Tasks spawned from `fut` are not inside the scope; hand them
    /// the guard (or a [`reenter`](LockGuard::reenter)ed one) instead.
    ///
    /// The scope does not keep the lock: dropping every clone of the guard
    /// inside it gives the hold back as usual.
    ///
    /// ```
    /// use tower_redis_lock::{LockKey, Locker, MemoryStore};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_redis_lock::Error> {
    /// let locker = Locker::new(MemoryStore::new()); // try-lock
    /// let key = LockKey::new("orders", "42")?;
    /// let guard = locker.acquire(&key).await?;
    ///
    /// let nested = guard
    ///     .scope(async {
    ///         // Deep inside the same work: no deadlock, no 409.
    ///         let again = locker.acquire(&key).await?;
    ///         assert_eq!(again.hold_count(), 2);
    ///         Ok::<_, tower_redis_lock::Error>(again.fencing_token())
    ///     })
    ///     .await?;
    /// assert_eq!(nested, guard.fencing_token());
    /// # Ok(())
    /// # }
    /// ```
    pub fn scope<F: Future>(&self, fut: F) -> impl Future<Output = F::Output> {
        reentry::scope(Arc::downgrade(&self.shared), fut)
    }

    /// The lease this guard holds.
    pub(crate) fn lease_state(&self) -> &Arc<Lease> {
        self.shared.lease()
    }

    /// Whether both guards are holds on one grant (one re-entered the
    /// other). (Only the HTTP layer asks.)
    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    pub(crate) fn same_grant(&self, other: &LockGuard) -> bool {
        Arc::ptr_eq(self.shared.lease(), other.shared.lease())
    }

    /// The lock's key.
    pub fn key(&self) -> &LockKey {
        &self.shared.lease().key
    }

    /// The fencing token of this grant, or [`Unfenced`] when its store
    /// grants without fencing ([`RedisStoreBuilder::fencing`](crate::RedisStoreBuilder::fencing)`(false)`):
    /// then there is no token at all, never a token of zero.
    pub fn fencing_token(&self) -> Result<FencingToken, Unfenced> {
        self.shared.lease().token
    }

    /// The lease length the watchdog keeps renewing.
    pub fn lease(&self) -> Duration {
        self.shared.lease().lease
    }

    /// When the lock was granted (start of the winning attempt).
    pub fn acquired_at(&self) -> Instant {
        self.shared.lease().acquired_at
    }

    /// Whether we still hold the lock: this hold not given back, the lock
    /// not released or lost, and the local validity deadline (`last
    /// successful renewal start + lease − drift`, on the monotonic clock) not
    /// passed.
    pub fn is_held(&self) -> bool {
        self.shared.is_held()
    }

    /// How long the lease is certainly valid from now on (zero once lost or
    /// released, or once this hold is given back).
    pub fn valid_for(&self) -> Duration {
        if self.shared.is_ended() {
            return Duration::ZERO;
        }
        self.shared.lease().valid_for()
    }

    /// Resolves once the lock is lost (another owner, or the lease ran out
    /// without a renewal). Pends forever while the lock is held or after a
    /// clean release. Cancel-safe; any number of clones may wait.
    ///
    /// The validity deadline is watched here too, on the awaiting task's
    /// runtime: a lease the watchdog could not renew resolves this at its
    /// deadline even if the watchdog's own task cannot run (its runtime
    /// alive but no longer driven).
    pub fn lost(&self) -> impl Future<Output = ()> + Send + '_ {
        self.shared.lease().until_lost()
    }

    /// Whether the lock has been lost (as opposed to held or released): a
    /// renewal found another owner, or the validity deadline passed
    /// without a renewal.
    pub fn is_lost(&self) -> bool {
        self.shared.lease().expire_if_due()
    }

    /// Renews the lease right now, on top of the watchdog. Fails with
    /// [`Error::LockLost`] (and flips the guard to lost) if we no longer own
    /// the lock.
    pub async fn extend(&self) -> Result<(), Error> {
        let l = self.shared.lease();
        if !l.is_active() {
            return Err(Error::LockLost { key: l.key.clone() });
        }
        let started = Instant::now();
        let lease = l.renewal_at(started);
        if lease.is_zero() {
            return Err(Error::LockLost { key: l.key.clone() });
        }
        if self
            .shared
            .end
            .store
            .renew(l.kind, &l.key, &l.owner, lease)
            .await?
        {
            l.renewed(started, lease);
            Ok(())
        } else {
            l.mark_lost(LossReason::NotOwner);
            // Out of the watchdog's table at once, as when a renewal of
            // its own finds another owner.
            self.shared.watchdog.remove(l.id);
            Err(Error::LockLost { key: l.key.clone() })
        }
    }

    /// Stores `record` (opaque bytes: the engine never looks inside) as the
    /// key's completed outcome for `retention` and releases the lock, in one
    /// atomic owner-checked step: duplicates from now on get these bytes
    /// from [`Locker::acquire_or_replay`](crate::Locker::acquire_or_replay)
    /// as [`Acquired::Completed`](crate::Acquired::Completed).
    /// `Ok(false)` (nothing stored) if we no longer owned the lock.
    ///
    /// (The `LockLayer` (feature `axum`) stores an encoded
    /// `Record` here.)
    ///
    /// This ends the lock for every hold: other holds of a
    /// [re-entered](LockGuard::reenter) lock see `is_held() == false`.
    ///
    /// If nothing was stored (an error, or the lock was no longer ours), the
    /// lock is released as by [`release`](LockGuard::release), retried in
    /// the background on failure. Dropping the future before it is done
    /// finishes (then, if needed, releases) in the background.
    ///
    /// A permit (from [`Semaphore`](crate::Semaphore)) has no completed
    /// record: `finish` on one releases it and answers
    /// [`Error::Config`].
    pub async fn finish(self, record: Bytes, retention: Duration) -> Result<bool, Error> {
        if self.shared.lease().kind != LeaseKind::Lock {
            drop(self.release().await);
            return Err(Error::Config(crate::error::ConfigError::new(
                "finish",
                "only a lock has a completed record: release a permit or a read or write guard instead",
            )));
        }
        let s = &self.shared;
        if s.end_hold().is_none() || !s.stop_renewal() {
            return Ok(false);
        }
        let e = &s.end;
        let l = &*e.lease;
        let len = record.len();
        // Dropped before the answer: the same step finishes in the
        // background (then releases if nothing was stored).
        let mut pending = PendingEnd::arm(
            e,
            EndOp::Finish {
                record: record.clone(),
                retention,
            },
        );
        let span = l.release_span("finish");
        let finish = e.store.finish(&l.key, &l.owner, record, retention);
        let res = finish.instrument(span.clone()).await;
        span.in_scope(|| match &res {
            Ok(stored) => tracing::debug!(
                key = %l.key,
                fencing_token = l.token.ok().map(crate::token::FencingToken::get),
                stored,
                bytes = len,
                "lock finished with a completed record"
            ),
            Err(e) => {
                observe::store_error(e);
                tracing::warn!(key = %l.key, error = %Chain(e), "storing the completed record failed")
            }
        });
        if let Ok(stored) = &res {
            span.record("owned", *stored);
        }
        if matches!(res, Ok(true)) {
            pending.disarm();
            e.local.wake(&l.key);
            return res;
        }
        // Not stored: make sure the lock does not linger either.
        pending.op = Some(EndOp::Release);
        let released = e
            .store
            .release(LeaseKind::Lock, &l.key, &l.owner)
            .instrument(span.clone())
            .await;
        span.in_scope(|| trace_release(l, &released));
        if released.is_ok() {
            pending.disarm();
            e.local.wake(&l.key);
        } else {
            // A brief outage: keep trying in the background.
            pending.retry_later();
        }
        res
    }

    /// Gives the lock up **without releasing it**, as a value another task
    /// or process can [`resume`](crate::Locker::resume): the lock stays in
    /// the store for the rest of its lease, renewed by nobody until it is
    /// resumed. Long work answered early (a webhook acknowledged with
    /// `202 Accepted`) hands its lock to a worker this way; a worker that
    /// dies before it resumes or finishes lets the lock lapse at its lease.
    ///
    /// Like [`finish`](LockGuard::finish) this ends the lock here for every
    /// hold: other clones and re-entered holds see `is_held() == false`,
    /// and dropping them releases nothing.
    ///
    /// Fails with [`Error::LockLost`] if the lock is no longer held (then
    /// it is released as by dropping the guard). The value carries the
    /// owner token: it is a capability (see [`ExportedLease`](crate::ExportedLease)).
    ///
    /// ```
    /// use tower_redis_lock::{LockKey, Locker, MemoryStore};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_redis_lock::Error> {
    /// let locker = Locker::new(MemoryStore::new());
    /// let key = LockKey::new("jobs", "7")?;
    /// let guard = locker.acquire(&key).await?;
    /// let exported = guard.export()?;
    /// assert_eq!(locker.status().renewing, 0, "renewed by nobody until resumed");
    /// assert!(locker.try_acquire(&key).await.is_err(), "but still held");
    /// let again = locker.resume(exported).await?;
    /// assert!(again.release().await?);
    /// # Ok(())
    /// # }
    /// ```
    pub fn export(self) -> Result<ExportedLease, Error> {
        let s = &self.shared;
        let l = s.lease();
        if l.kind != LeaseKind::Lock {
            return Err(Error::Config(crate::error::ConfigError::new(
                "export",
                "only a lock can be handed off, not a permit or a read or write guard",
            )));
        }
        if !s.is_held() {
            return Err(Error::LockLost { key: l.key.clone() });
        }
        let valid_for = l.valid_for();
        // This hold ended and the lease off the watchdog, marked released
        // here without a word to the store: nothing ends it but its lease.
        if s.end_hold().is_none() || !s.stop_renewal() {
            return Err(Error::LockLost { key: l.key.clone() });
        }
        tracing::debug!(
            key = %l.key,
            fencing_token = l.token.ok().map(crate::token::FencingToken::get),
            valid_ms = valid_for.as_millis() as u64,
            "lock exported: no longer renewed here"
        );
        Ok(ExportedLease {
            key: l.key.clone(),
            owner: l.owner.clone(),
            token: l.token,
            lease: l.lease,
            deadline: std::time::SystemTime::now() + valid_for,
        })
    }

    /// Whether this hold was given back (released, finished or dropped
    /// through one of its clones). (Only the HTTP layer asks.)
    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    pub(crate) fn is_given_back(&self) -> bool {
        self.shared.is_ended()
    }

    /// Gives this hold back now, whatever other clones of it exist; the
    /// release, if it was the last hold, runs in the background. (Only the
    /// HTTP layer calls it.)
    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    pub(crate) fn release_in_background(&self) {
        self.shared.release_in_background();
    }

    /// Gives this hold back; if it was the last one (always, unless the lock
    /// was [re-entered](LockGuard::reenter)), releases the lock now.
    ///
    /// `Ok(true)` if we still owned the lock, `Ok(false)` if it had already
    /// expired, been taken over, or been released through another clone.
    /// Other clones of this guard see `is_held() == false` afterwards. When
    /// other holds remain, nothing is sent and the answer is whether the
    /// lock is still held for them.
    ///
    /// An `Err` (the store did not answer) does not leave the lock to its
    /// lease: the release keeps being retried in the background, with
    /// backoff, until the store answers (released, or no longer ours) or the
    /// lock would have expired by itself. Dropping the future before the
    /// answer likewise lets the release finish in the background; either
    /// way this process's waiters for the key are woken when it lands.
    pub async fn release(self) -> Result<bool, Error> {
        let s = &self.shared;
        match s.end_hold() {
            None => return Ok(false),
            Some(false) => return Ok(s.lease().is_valid_now()),
            Some(true) => {}
        }
        if !s.stop_renewal() {
            return Ok(false);
        }
        let e = &s.end;
        let l = &*e.lease;
        // Dropped before the answer: the release goes on in the background.
        let mut pending = PendingEnd::arm(e, EndOp::Release);
        let span = l.release_span("release");
        let res = e
            .store
            .release(l.kind, &l.key, &l.owner)
            .instrument(span.clone())
            .await;
        span.in_scope(|| trace_release(l, &res));
        if res.is_ok() {
            pending.disarm();
            e.local.wake(&l.key);
        } else {
            // The error goes to the caller; the release is retried in the
            // background until the store answers or the lease is over.
            pending.retry_later();
        }
        res
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let l = self.shared.lease();
        f.debug_struct("LockGuard")
            .field("key", &l.key)
            .field("fencing_token", &l.token)
            .field("held", &self.is_held())
            .field("valid_for", &self.valid_for())
            .finish_non_exhaustive()
    }
}
