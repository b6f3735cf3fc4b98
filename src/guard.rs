//! The guard a holder keeps while it holds a lock.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::locker::Queues;
use crate::store::LockStore;
use crate::watchdog::Cmd;
use crate::{Error, FencingToken, LockKey, OwnerToken, Record};

const HELD: u8 = 0;
const LOST: u8 = 1;
const RELEASED: u8 = 2;

/// Why a lease was lost (for logs).
#[derive(Debug, Clone, Copy)]
pub(crate) enum LossReason {
    NotOwner,
    Expired,
}

/// State of one granted lease, shared by its guard clones and the watchdog.
pub(crate) struct Lease {
    pub(crate) id: u64,
    pub(crate) key: LockKey,
    pub(crate) owner: OwnerToken,
    pub(crate) token: FencingToken,
    pub(crate) lease: Duration,
    pub(crate) drift: Duration,
    pub(crate) acquired_at: Instant,
    pub(crate) hold_deadline: Option<Instant>,
    /// Nanoseconds after `acquired_at` until which the lease is valid.
    valid_until_ns: AtomicU64,
    status: AtomicU8,
    lost: CancellationToken,
}

impl Lease {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        id: u64,
        key: LockKey,
        owner: OwnerToken,
        token: FencingToken,
        lease: Duration,
        drift: Duration,
        attempt_start: Instant,
        max_hold: Option<Duration>,
    ) -> Lease {
        let l = Lease {
            id,
            key,
            owner,
            token,
            lease,
            drift,
            acquired_at: attempt_start,
            hold_deadline: max_hold.map(|h| attempt_start + h),
            valid_until_ns: AtomicU64::new(0),
            status: AtomicU8::new(HELD),
            lost: CancellationToken::new(),
        };
        l.renewed(attempt_start, lease);
        l
    }

    pub(crate) fn valid_until(&self) -> Instant {
        self.acquired_at + Duration::from_nanos(self.valid_until_ns.load(Ordering::Acquire))
    }

    /// Records a successful renewal sent at `started` for `lease`: the lease
    /// is valid until `started + lease - drift` (never moves backwards).
    pub(crate) fn renewed(&self, started: Instant, lease: Duration) {
        let until = (started + lease.saturating_sub(self.drift))
            .saturating_duration_since(self.acquired_at)
            .as_nanos() as u64;
        self.valid_until_ns.fetch_max(until, Ordering::AcqRel);
    }

    pub(crate) fn is_active(&self) -> bool {
        self.status.load(Ordering::Acquire) == HELD
    }

    /// Flips a held lease to lost and tells every observer. Returns whether
    /// this call did it.
    pub(crate) fn mark_lost(&self, reason: LossReason) -> bool {
        let flipped = self
            .status
            .compare_exchange(HELD, LOST, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if flipped {
            self.lost.cancel();
            tracing::warn!(
                key = %self.key,
                fencing_token = self.token.get(),
                reason = ?reason,
                held_ms = self.acquired_at.elapsed().as_millis() as u64,
                "lock lost"
            );
        }
        flipped
    }

    /// Marks the lease released; returns whether it was not released before.
    fn mark_released(&self) -> bool {
        self.status.swap(RELEASED, Ordering::AcqRel) != RELEASED
    }
}

/// Object-safe view of a store, so that guards are not generic.
pub(crate) trait DynStore: Send + Sync + 'static {
    fn release_dyn<'a>(
        &'a self,
        key: &'a LockKey,
        owner: &'a OwnerToken,
    ) -> Pin<Box<dyn Future<Output = Result<bool, Error>> + Send + 'a>>;

    fn extend_dyn<'a>(
        &'a self,
        key: &'a LockKey,
        owner: &'a OwnerToken,
        lease: Duration,
    ) -> Pin<Box<dyn Future<Output = Result<bool, Error>> + Send + 'a>>;

    fn finish_dyn<'a>(
        &'a self,
        key: &'a LockKey,
        owner: &'a OwnerToken,
        record: Bytes,
        retention: Duration,
    ) -> Pin<Box<dyn Future<Output = Result<bool, Error>> + Send + 'a>>;
}

impl<S: LockStore> DynStore for S {
    fn release_dyn<'a>(
        &'a self,
        key: &'a LockKey,
        owner: &'a OwnerToken,
    ) -> Pin<Box<dyn Future<Output = Result<bool, Error>> + Send + 'a>> {
        Box::pin(self.release(key, owner))
    }

    fn extend_dyn<'a>(
        &'a self,
        key: &'a LockKey,
        owner: &'a OwnerToken,
        lease: Duration,
    ) -> Pin<Box<dyn Future<Output = Result<bool, Error>> + Send + 'a>> {
        Box::pin(self.extend(key, owner, lease))
    }

    fn finish_dyn<'a>(
        &'a self,
        key: &'a LockKey,
        owner: &'a OwnerToken,
        record: Bytes,
        retention: Duration,
    ) -> Pin<Box<dyn Future<Output = Result<bool, Error>> + Send + 'a>> {
        Box::pin(self.finish(key, owner, record, retention))
    }
}

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
///   still owned it; dropping the last clone releases in a spawned task and
///   never blocks. Renewal stops before the release is sent.
///
/// ```
/// use tower_redis_lock::{LockKey, Locker, MemoryStore};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower_redis_lock::Error> {
/// let locker = Locker::new(MemoryStore::new());
/// let guard = locker.acquire(&LockKey::new("invoices", "inv_7")?).await?;
///
/// // Hand the fencing token to the resource you write to.
/// let token = guard.fencing_token();
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
#[derive(Clone)]
pub struct LockGuard {
    shared: Arc<Shared>,
}

struct Shared {
    lease: Arc<Lease>,
    store: Arc<dyn DynStore>,
    watchdog: mpsc::UnboundedSender<Cmd>,
    runtime: tokio::runtime::Handle,
    /// This process's waiters, woken right after a release.
    local: Queues,
}

impl LockGuard {
    pub(crate) fn new(
        lease: Arc<Lease>,
        store: Arc<dyn DynStore>,
        watchdog: mpsc::UnboundedSender<Cmd>,
        runtime: tokio::runtime::Handle,
        local: Queues,
    ) -> Self {
        LockGuard {
            shared: Arc::new(Shared {
                lease,
                store,
                watchdog,
                runtime,
                local,
            }),
        }
    }

    /// The lock's key.
    pub fn key(&self) -> &LockKey {
        &self.shared.lease.key
    }

    /// The fencing token of this grant.
    pub fn fencing_token(&self) -> FencingToken {
        self.shared.lease.token
    }

    /// The lease length the watchdog keeps renewing.
    pub fn lease(&self) -> Duration {
        self.shared.lease.lease
    }

    /// When the lock was granted (start of the winning attempt).
    pub fn acquired_at(&self) -> Instant {
        self.shared.lease.acquired_at
    }

    /// Whether we still hold the lock: not released, not lost, and the local
    /// validity deadline (`last successful renewal start + lease − drift`,
    /// on the monotonic clock) not passed.
    pub fn is_held(&self) -> bool {
        let l = &self.shared.lease;
        l.is_active() && Instant::now() < l.valid_until()
    }

    /// How long the lease is certainly valid from now on (zero once lost or
    /// released).
    pub fn valid_for(&self) -> Duration {
        let l = &self.shared.lease;
        if !l.is_active() {
            return Duration::ZERO;
        }
        l.valid_until().saturating_duration_since(Instant::now())
    }

    /// Resolves once the lock is lost (another owner, or the lease ran out
    /// without a renewal). Pends forever while the lock is held or after a
    /// clean release. Cancel-safe; any number of clones may wait.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + '_ {
        self.shared.lease.lost.cancelled()
    }

    /// Whether the lock has been lost (as opposed to held or released).
    pub fn is_lost(&self) -> bool {
        self.shared.lease.lost.is_cancelled()
    }

    /// Renews the lease right now, on top of the watchdog. Fails with
    /// [`Error::LockLost`] (and flips the guard to lost) if we no longer own
    /// the lock.
    pub async fn extend(&self) -> Result<(), Error> {
        let l = &self.shared.lease;
        if !l.is_active() {
            return Err(Error::LockLost { key: l.key.clone() });
        }
        let started = Instant::now();
        let lease = match l.hold_deadline {
            Some(cap) => l.lease.min(cap.saturating_duration_since(started)),
            None => l.lease,
        };
        if lease.is_zero() {
            return Err(Error::LockLost { key: l.key.clone() });
        }
        if self
            .shared
            .store
            .extend_dyn(&l.key, &l.owner, lease)
            .await?
        {
            l.renewed(started, lease);
            Ok(())
        } else {
            l.mark_lost(crate::guard::LossReason::NotOwner);
            Err(Error::LockLost { key: l.key.clone() })
        }
    }

    /// Stores `record` as the key's completed outcome for `retention` and
    /// releases the lock, in one atomic owner-checked step: duplicates from
    /// now on get the record from
    /// [`Locker::acquire_or_replay`](crate::Locker::acquire_or_replay).
    /// `Ok(false)` (nothing stored) if we no longer owned the lock.
    pub async fn finish(self, record: &Record, retention: Duration) -> Result<bool, Error> {
        let s = &self.shared;
        if !s.stop_renewal() {
            return Ok(false);
        }
        let l = &s.lease;
        let res = s
            .store
            .finish_dyn(&l.key, &l.owner, record.encode(), retention)
            .await;
        match &res {
            Ok(stored) => tracing::debug!(
                key = %l.key,
                fencing_token = l.token.get(),
                stored,
                status = record.status.as_u16(),
                "lock finished with a completed record"
            ),
            Err(e) => {
                tracing::warn!(key = %l.key, error = %e, "storing the completed record failed")
            }
        }
        if !matches!(res, Ok(true)) {
            // Not stored: make sure the lock does not linger either.
            let _ = s.store.release_dyn(&l.key, &l.owner).await;
        }
        s.local.wake(&l.key);
        res
    }

    /// Releases the lock in the background now, whatever other clones exist.
    pub(crate) fn release_in_background(&self) {
        self.shared.release_in_background();
    }

    /// Releases the lock now. `Ok(true)` if we still owned it, `Ok(false)` if
    /// it had already expired, been taken over, or been released through
    /// another clone. Other clones see `is_held() == false` afterwards.
    pub async fn release(self) -> Result<bool, Error> {
        let s = &self.shared;
        if !s.stop_renewal() {
            return Ok(false);
        }
        let l = &s.lease;
        let res = s.store.release_dyn(&l.key, &l.owner).await;
        trace_release(l, &res);
        s.local.wake(&l.key);
        res
    }
}

impl Shared {
    /// Marks the lease released and takes it off the watchdog, before any
    /// release command is sent. Returns false if it was released before.
    fn stop_renewal(&self) -> bool {
        if !self.lease.mark_released() {
            return false;
        }
        let _ = self.watchdog.send(Cmd::Remove(self.lease.id));
        true
    }
}

fn trace_release(l: &Lease, res: &Result<bool, Error>) {
    match res {
        Ok(owned) => tracing::debug!(
            key = %l.key,
            fencing_token = l.token.get(),
            owned,
            held_ms = l.acquired_at.elapsed().as_millis() as u64,
            "lock released"
        ),
        Err(e) => tracing::warn!(
            key = %l.key,
            fencing_token = l.token.get(),
            error = %e,
            "lock release failed; the lease will expire on its own"
        ),
    }
}

impl Shared {
    /// Stops renewal and releases in a task of the runtime that granted the
    /// lock; never blocks. If that runtime is gone, the lease expires on its
    /// own.
    fn release_in_background(&self) {
        if !self.stop_renewal() {
            return;
        }
        let lease = self.lease.clone();
        let store = self.store.clone();
        let local = self.local.clone();
        // (`spawn` on a handle whose runtime has shut down drops the future.)
        drop(self.runtime.spawn(async move {
            let res = store.release_dyn(&lease.key, &lease.owner).await;
            trace_release(&lease, &res);
            local.wake(&lease.key);
        }));
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.release_in_background();
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let l = &self.shared.lease;
        f.debug_struct("LockGuard")
            .field("key", &l.key)
            .field("fencing_token", &l.token)
            .field("held", &self.is_held())
            .field("valid_for", &self.valid_for())
            .finish_non_exhaustive()
    }
}
