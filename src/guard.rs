//! The guard a holder keeps while it holds a lock.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
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

tokio::task_local! {
    /// The holds a task runs under (innermost last): see [`LockGuard::scope`].
    static TASK_HOLDS: Arc<[Weak<Shared>]>;
}

/// A hold of `key`, granted by `store`, that the current task runs under
/// and that is still held.
pub(crate) fn held_by_task(key: &LockKey, store: usize) -> Option<LockGuard> {
    TASK_HOLDS
        .try_with(|held| {
            held.iter().rev().find_map(|w| {
                let guard = LockGuard {
                    shared: w.upgrade()?,
                };
                (guard.key() == key && guard.is_from(store) && guard.is_held()).then_some(guard)
            })
        })
        .ok()
        .flatten()
}

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
    /// Holds not yet given back: 1 for the grant, +1 per re-entry. The lock
    /// is released when this reaches zero.
    holds: AtomicU32,
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
            hold_deadline: max_hold.map(|h| far_add(attempt_start, h)),
            valid_until_ns: AtomicU64::new(0),
            status: AtomicU8::new(HELD),
            lost: CancellationToken::new(),
            holds: AtomicU32::new(1),
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

    /// Neither released nor lost, and the validity deadline not passed.
    pub(crate) fn is_valid_now(&self) -> bool {
        self.is_active() && Instant::now() < self.valid_until()
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

    fn instance_id_dyn(&self) -> usize;
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

    fn instance_id_dyn(&self) -> usize {
        self.instance_id()
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

/// One hold of a lease: the grant, or one re-entry. Clones of a guard
/// share it.
struct Shared {
    lease: Arc<Lease>,
    store: Arc<dyn DynStore>,
    watchdog: mpsc::UnboundedSender<Cmd>,
    /// The runtime the lock was granted on: where background releases go
    /// when the guard is dropped outside any runtime.
    runtime: Option<tokio::runtime::Handle>,
    /// This process's waiters, woken right after a release.
    local: Queues,
    /// Whether this hold has been given back (release, finish or drop).
    ended: AtomicBool,
}

impl LockGuard {
    pub(crate) fn new(
        lease: Arc<Lease>,
        store: Arc<dyn DynStore>,
        watchdog: mpsc::UnboundedSender<Cmd>,
        runtime: Option<tokio::runtime::Handle>,
        local: Queues,
    ) -> Self {
        LockGuard {
            shared: Arc::new(Shared {
                lease,
                store,
                watchdog,
                runtime,
                local,
                ended: AtomicBool::new(false),
            }),
        }
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
    /// [`LockLayer`](crate::LockLayer) runs its inner service in one).
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
        let s = &self.shared;
        let l = &s.lease;
        let lost = || Error::LockLost { key: l.key.clone() };
        if s.ended.load(Ordering::Acquire) || !self.is_held() {
            return Err(lost());
        }
        // Zero holds means the lock is being released: no coming back.
        l.holds
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n > 0).then_some(n + 1)
            })
            .map_err(|_| lost())?;
        Ok(LockGuard {
            shared: Arc::new(Shared {
                lease: l.clone(),
                store: s.store.clone(),
                watchdog: s.watchdog.clone(),
                runtime: s.runtime.clone(),
                local: s.local.clone(),
                ended: AtomicBool::new(false),
            }),
        })
    }

    /// How many holds the grant has: 1 after the acquire, +1 per
    /// [`reenter`](LockGuard::reenter), −1 per hold released or dropped.
    pub fn hold_count(&self) -> u32 {
        self.shared.lease.holds.load(Ordering::Acquire)
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
        let this = Arc::downgrade(&self.shared);
        // Usually the first hold of the task: one allocation, no copy.
        let held: Arc<[Weak<Shared>]> = match TASK_HOLDS.try_with(Arc::clone) {
            Ok(outer) => outer.iter().cloned().chain([this]).collect(),
            Err(_) => Arc::new([this]),
        };
        TASK_HOLDS.scope(held, fut)
    }

    /// The lease this guard holds.
    pub(crate) fn lease_state(&self) -> &Arc<Lease> {
        &self.shared.lease
    }

    /// Whether this guard's lock was granted by a store with this
    /// [`instance_id`](LockStore::instance_id).
    pub(crate) fn is_from(&self, store: usize) -> bool {
        self.shared.store.instance_id_dyn() == store
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

    /// Whether we still hold the lock: this hold not given back, the lock
    /// not released or lost, and the local validity deadline (`last
    /// successful renewal start + lease − drift`, on the monotonic clock) not
    /// passed.
    pub fn is_held(&self) -> bool {
        !self.shared.ended.load(Ordering::Acquire) && self.shared.lease.is_valid_now()
    }

    /// How long the lease is certainly valid from now on (zero once lost or
    /// released, or once this hold is given back).
    pub fn valid_for(&self) -> Duration {
        let l = &self.shared.lease;
        if !l.is_active() || self.shared.ended.load(Ordering::Acquire) {
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
    ///
    /// This ends the lock for every hold: other holds of a
    /// [re-entered](LockGuard::reenter) lock see `is_held() == false`.
    ///
    /// If nothing was stored (an error, or the lock was no longer ours), the
    /// lock is released as by [`release`](LockGuard::release), retried in
    /// the background on failure. Dropping the future before it is done
    /// finishes (then, if needed, releases) in the background.
    pub async fn finish(self, record: &Record, retention: Duration) -> Result<bool, Error> {
        let s = &self.shared;
        if s.end_hold().is_none() || !s.stop_renewal() {
            return Ok(false);
        }
        let l = &s.lease;
        let encoded = record.encode();
        // Dropped before the answer: the same step finishes in the
        // background (then releases if nothing was stored).
        let mut pending = PendingEnd::arm(
            s,
            EndOp::Finish {
                record: encoded.clone(),
                retention,
            },
        );
        let res = s
            .store
            .finish_dyn(&l.key, &l.owner, encoded, retention)
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
        if matches!(res, Ok(true)) {
            pending.disarm();
            s.local.wake(&l.key);
            return res;
        }
        // Not stored: make sure the lock does not linger either.
        pending.op = Some(EndOp::Release);
        let released = s.store.release_dyn(&l.key, &l.owner).await;
        trace_release(l, &released);
        if released.is_ok() {
            pending.disarm();
            s.local.wake(&l.key);
        } else {
            // A brief outage: keep trying in the background.
            pending.retry_later();
        }
        res
    }

    /// Gives this hold back now, whatever other clones of it exist; the
    /// release, if it was the last hold, runs in the background.
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
            Some(false) => return Ok(s.lease.is_valid_now()),
            Some(true) => {}
        }
        if !s.stop_renewal() {
            return Ok(false);
        }
        let l = &s.lease;
        // Dropped before the answer: the release goes on in the background.
        let mut pending = PendingEnd::arm(s, EndOp::Release);
        let res = s.store.release_dyn(&l.key, &l.owner).await;
        trace_release(l, &res);
        if res.is_ok() {
            pending.disarm();
            s.local.wake(&l.key);
        } else {
            // The error goes to the caller; the release is retried in the
            // background until the store answers or the lease is over.
            pending.retry_later();
        }
        res
    }
}

impl Shared {
    /// Gives this hold back: `Some(true)` if it was the last hold of the
    /// lease (the caller releases the lock), `Some(false)` if others remain,
    /// `None` if this hold was given back before.
    fn end_hold(&self) -> Option<bool> {
        if self.ended.swap(true, Ordering::AcqRel) {
            return None;
        }
        Some(self.lease.holds.fetch_sub(1, Ordering::AcqRel) == 1)
    }

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
            "lock release failed; retrying in the background"
        ),
    }
}

impl Shared {
    /// Gives this hold back; if it was the last, stops renewal and releases
    /// in a spawned task (retried on errors, see [`end_lock`]); never
    /// blocks.
    fn release_in_background(&self) {
        if self.end_hold() != Some(true) || !self.stop_renewal() {
            return;
        }
        self.spawn_end(EndOp::Release, false);
    }

    /// Ends the lock in a task of the caller's runtime, or of the runtime
    /// that granted it when there is no current runtime (and it is still
    /// running). With neither, the lease expires on its own.
    fn spawn_end(&self, op: EndOp, pause_first: bool) {
        let job = end_lock(
            self.lease.clone(),
            self.store.clone(),
            self.local.clone(),
            op,
            pause_first,
        );
        if !spawn_detached(self.runtime.as_ref(), job) {
            tracing::warn!(
                key = %self.lease.key,
                fencing_token = self.lease.token.get(),
                "no runtime left to release the lock on; the lease will expire on its own"
            );
        }
    }
}

/// Spawns `fut` on the current runtime, else on `fallback`. Returns false
/// if there was neither.
pub(crate) fn spawn_detached<F>(fallback: Option<&tokio::runtime::Handle>, fut: F) -> bool
where
    F: Future<Output = ()> + Send + 'static,
{
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        drop(rt.spawn(fut));
        return true;
    }
    match fallback {
        // (A runtime that has shut down drops the task unrun.)
        Some(rt) => {
            drop(rt.spawn(fut));
            true
        }
        None => false,
    }
}

/// How a lock is ended.
enum EndOp {
    /// Compare-and-delete.
    Release,
    /// Store a completed record and release, in one step; release alone if
    /// that did not store it.
    Finish { record: Bytes, retention: Duration },
}

/// A release or finish whose answer has not arrived. If its future is
/// dropped (timeout layer, client gone), the same operation goes on in the
/// background; on a store error it is retried there. Costs nothing (no
/// spawn) when the answer arrives.
struct PendingEnd<'a> {
    shared: &'a Shared,
    op: Option<EndOp>,
    pause_first: bool,
}

impl<'a> PendingEnd<'a> {
    fn arm(shared: &'a Shared, op: EndOp) -> Self {
        PendingEnd {
            shared,
            op: Some(op),
            pause_first: false,
        }
    }

    /// The store answered: nothing left to do.
    fn disarm(&mut self) {
        self.op = None;
    }

    /// The store failed just now: retry in the background after a pause.
    fn retry_later(mut self) {
        self.pause_first = true;
    }
}

impl Drop for PendingEnd<'_> {
    fn drop(&mut self) {
        if let Some(op) = self.op.take() {
            self.shared.spawn_end(op, self.pause_first);
        }
    }
}

/// First pause between two tries of a failed release; doubles up to
/// [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(50);
/// Longest pause between two tries of a failed release.
const RETRY_MAX: Duration = Duration::from_secs(1);

/// Ends a lock whose hold is over: runs `op`, then (unless that stored the
/// record) releases with [`release_retrying`] until the lock would have
/// expired by itself (a full lease past its last validity deadline, which
/// also covers a renewal still in flight). Then wakes this process's
/// waiters.
async fn end_lock(
    lease: Arc<Lease>,
    store: Arc<dyn DynStore>,
    local: Queues,
    op: EndOp,
    pause_first: bool,
) {
    let l = &*lease;
    let give_up = far_add(l.valid_until(), l.lease);
    let mut pause_first = pause_first;
    if let EndOp::Finish { record, retention } = op {
        let finish = store.finish_dyn(&l.key, &l.owner, record, retention);
        match tokio::time::timeout_at(give_up, finish).await {
            Ok(Ok(true)) => {
                tracing::debug!(key = %l.key, "lock finished in the background");
                local.wake(&l.key);
                return;
            }
            Ok(Ok(false)) | Err(_) => {}
            Ok(Err(e)) => {
                tracing::warn!(key = %l.key, error = %e, "storing the completed record failed")
            }
        }
        pause_first = false;
    }
    let res = release_retrying(&*store, &l.key, &l.owner, give_up, pause_first).await;
    match res {
        Some(owned) => trace_release(l, &Ok(owned)),
        None => tracing::warn!(
            key = %l.key,
            fencing_token = l.token.get(),
            "lock release kept failing; the lease will expire on its own"
        ),
    }
    local.wake(&l.key);
}

/// Releases `key` (owner-checked), retrying failures with jittered
/// exponential backoff (50 ms doubling to 1 s) until the store answers or
/// `give_up` passes. The answer (whether we still owned it), or `None` if it
/// never came. With `pause_first`, waits one backoff step before the first
/// try (a try just failed).
async fn release_retrying(
    store: &dyn DynStore,
    key: &LockKey,
    owner: &OwnerToken,
    give_up: Instant,
    pause_first: bool,
) -> Option<bool> {
    let mut pause = RETRY_FIRST;
    let mut first = !pause_first;
    loop {
        if !first {
            // Jitter in [pause/2, pause].
            let nap = pause / 2 + pause.mul_f64(fastrand::f64() / 2.0);
            if Instant::now() + nap >= give_up {
                return None;
            }
            tokio::time::sleep(nap).await;
            pause = (pause * 2).min(RETRY_MAX);
        }
        first = false;
        match tokio::time::timeout_at(give_up, store.release_dyn(key, owner)).await {
            Ok(Ok(owned)) => return Some(owned),
            Ok(Err(e)) => tracing::debug!(key = %key, error = %e, "lock release failed; retrying"),
            Err(_) => return None,
        }
    }
}

/// `at + d`, saturating at a far-future instant instead of panicking.
pub(crate) fn far_add(at: Instant, d: Duration) -> Instant {
    // About 30 years: far enough to mean "never", small enough to add.
    const FAR: Duration = Duration::from_secs(86_400 * 365 * 30);
    at.checked_add(d.min(FAR))
        .or_else(|| at.checked_add(Duration::from_secs(86_400)))
        .unwrap_or(at)
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
