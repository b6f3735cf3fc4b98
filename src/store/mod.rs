//! Backends that keep locks: one small trait, one file per store.
//!
//! [`LockStore`] is the whole contract between the lock engine
//! ([`Locker`](crate::Locker)) and a backend. The engine owns waiting, the
//! watchdog and guards; a store only has to make each operation atomic and
//! owner-checked. Every operation on a lease takes its [`LeaseKind`] (the
//! lock of a key, one permit of its semaphore, a read or the write of its
//! reader-writer lock, a waiting writer's mark), so that each promise is
//! written once for every kind:
//!
//! | operation | meaning |
//! |---|---|
//! | [`supports`](LockStore::supports) | which kinds the store keeps, declared as data: a kind it lacks is refused when a locker, semaphore or layer is made |
//! | [`grant`](LockStore::grant) | grant a [`Grant`] if free (or already ours), minting the fencing token in the same step; else report when the holder's lease ends |
//! | [`renew`](LockStore::renew), [`renew_many`](LockStore::renew_many) | reset a lease if we still own it; a batch pipelined where the backend can |
//! | [`release`](LockStore::release) | give a lease back if we still own it, and wake waiters |
//! | [`transfer`](LockStore::transfer) | hand a lock to another owner token if we still own it (for `Locker::resume`) |
//! | [`subscribe`](LockStore::subscribe) | a [`ReleaseWatch`] that fires on the next release of any lease of a key |
//! | [`finish`](LockStore::finish), [`read_record`](LockStore::read_record) | store a completed record and release, as one owner-checked step; read it back |
//! | [`grant_all`](LockStore::grant_all), [`release_all`](LockStore::release_all) | the locks of every key of a list or none, and their release |
//! | [`check`](LockStore::check) | whether the store answers now (readiness, and the probe during an outage) |
//!
//! The operator's view ([`inspect`](OperatorStore::inspect),
//! [`list`](OperatorStore::list), [`force_release`](OperatorStore::force_release))
//! is a trait of its own, [`OperatorStore`]; [`LockStoreExt`] keeps
//! one-line grants (`store.acquire(&key, &owner, lease)`) for tests and
//! tools.
//!
//! The kinds of one key are apart (a permit of `orders:42` and the lock
//! `orders:42` never see each other) but share the key's fencing counter,
//! so that tokens of every kind rise together, and its release channel.
//!
//! Every store passes the same conformance suite (`tests/stores/conformance.rs`),
//! every kind it keeps.

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;

use crate::error::Error;
use crate::key::LockKey;
use crate::token::OwnerToken;

mod boxed;
pub(crate) mod holder;
mod lease;
pub(crate) mod memory;
pub(crate) mod multi;
pub(crate) mod redis;
pub(crate) mod redlock;
mod rwlock;

pub use boxed::BoxStore;
pub use lease::{AcquireOutcome, Ask, Grant, LeaseKind, Renewal};
pub use multi::AcquireAllOutcome;
pub use rwlock::RwMode;

use crate::error::Operation;
use holder::{ForcedRelease, HolderInfo, HolderLabel, HolderPage, ListCursor};

/// The refusal of a kind the store does not keep (see
/// [`LockStore::supports`]).
pub(crate) fn kind_unsupported<S: LockStore + ?Sized>(
    store: &S,
    kind: LeaseKind,
) -> Result<(), crate::error::ConfigError> {
    if store.supports(kind) {
        return Ok(());
    }
    Err(unsupported_kind_config(kind))
}

fn unsupported_kind_config(kind: LeaseKind) -> crate::error::ConfigError {
    let (setting, what) = match kind {
        LeaseKind::Permit => ("permits", "semaphores (permits)"),
        LeaseKind::Read | LeaseKind::Write | LeaseKind::WriterMark => {
            ("read_write", "reader-writer locks")
        }
        LeaseKind::Lock => ("store", "locks"),
    };
    crate::error::ConfigError::new(setting, format!("this store does not keep {what}"))
}

/// The answer of a store asked for a lease of a kind it does not keep
/// (the engine never asks: it checks [`LockStore::supports`] first).
pub(crate) fn unsupported_kind(kind: LeaseKind) -> Error {
    Error::Config(unsupported_kind_config(kind))
}

/// A backend that keeps locks.
///
/// Implementations must make each operation atomic and check the owner
/// token on every write. Futures must be cancel-safe in the sense that
/// dropping one never leaves the store inconsistent (at worst, a grant
/// whose answer was lost expires after its lease; the engine undoes it
/// owner-checked once the store answers).
///
/// Thirteen methods, five with defaults; each takes the lease's kind
/// where it matters, so a store keeps a new kind by handling it in
/// [`grant`](LockStore::grant), [`renew`](LockStore::renew) and
/// [`release`](LockStore::release) and saying so in
/// [`supports`](LockStore::supports).
pub trait LockStore: Send + Sync + 'static {
    /// Whether the store keeps leases of `kind`: declared as data, so that
    /// a [`Semaphore`](crate::Semaphore), a
    /// [`ReadWriteLock`](crate::ReadWriteLock) or a layer of a kind the
    /// store lacks is refused when it is made ([`ConfigError`]), never at
    /// each request. The default keeps locks only. The memory and Redis
    /// stores keep every kind; Redlock keeps locks. A store that keeps
    /// [`Write`](LeaseKind::Write) keeps [`Read`](LeaseKind::Read) and
    /// [`WriterMark`](LeaseKind::WriterMark) too.
    ///
    /// [`ConfigError`]: crate::ConfigError
    fn supports(&self, kind: LeaseKind) -> bool {
        kind == LeaseKind::Lock
    }

    /// Grants `grant.ask` of `grant.key` to `grant.owner` for
    /// `grant.lease`, minting its fencing token from the key's counter in
    /// the same atomic step, and keeps `grant.label` with it for the
    /// operator view. Otherwise answers [`AcquireOutcome::Held`] with the
    /// time until the lease in the way ends, and marks the key as
    /// waited-for, so that the next release of any of its leases fires
    /// [`subscribe`](LockStore::subscribe)'s watch. Per kind:
    ///
    /// * [`Ask::Lock`]: if the key's lock is free. With `replay`, a key
    ///   that has a completed record answers [`AcquireOutcome::Completed`]
    ///   with it and takes nothing.
    /// * [`Ask::Permit`]: if fewer than `permits` unexpired permits are
    ///   held (expired ones are freed first); `Held` answers when the
    ///   soonest permit's lease ends.
    /// * [`Ask::Read`]: if no writer holds the key and no writer's mark
    ///   lasts (writers are preferred). Its token is the key's epoch: the
    ///   counter as it stands (raised to the clock where it is behind,
    ///   never past it), so at least every earlier write's token and below
    ///   every later one's.
    /// * [`Ask::Write`]: if nobody holds either side; the grant takes the
    ///   `waiter`'s mark back. Found busy with a `waiter`, marks it as a
    ///   writer waiting ([`LeaseKind::WriterMark`]) for `lease`. The engine
    ///   keeps one waiter for all the tries of one acquire, tries again at
    ///   least every third of the mark's length, and releases the mark when
    ///   it gives up.
    ///
    /// Already held by `owner` (a retried attempt whose answer was lost),
    /// the lease is reset and the answer is a token valid for that hold: at
    /// least its grant's and below every later holder's. The engine never
    /// does this: each attempt has a fresh owner, and a guard's re-entry
    /// sends nothing to the store.
    ///
    /// A kind the store does not keep answers a
    /// [`ConfigError`](crate::ConfigError) (the engine never asks one).
    fn grant(&self, grant: Grant<'_>)
    -> impl Future<Output = Result<AcquireOutcome, Error>> + Send;

    /// Resets the lease of `owner`'s `kind` hold of `key` to `lease`, if it
    /// is still held and unexpired. `Ok(false)` means "not the owner"
    /// (expired, released, or taken by someone else).
    fn renew(
        &self,
        kind: LeaseKind,
        key: &LockKey,
        owner: &OwnerToken,
        lease: Duration,
    ) -> impl Future<Output = Result<bool, Error>> + Send;

    /// Renews many leases, answering one result per renewal, in order,
    /// with the meaning of [`renew`](LockStore::renew) for each: one
    /// lease's error (its key is of the wrong type, its cluster node is
    /// down) must not fail the others. A failure that does reach every
    /// renewal of the batch (the one connection they shared broke or timed
    /// out) is answered as an error for each. The default runs
    /// [`renew`](LockStore::renew) one after another; network stores
    /// pipeline the batch.
    fn renew_many(
        &self,
        renewals: &[Renewal],
    ) -> impl Future<Output = Vec<Result<bool, Error>>> + Send {
        async move {
            let mut out = Vec::with_capacity(renewals.len());
            for r in renewals {
                out.push(self.renew(r.kind, &r.key, &r.owner, r.lease).await);
            }
            out
        }
    }

    /// Gives back `owner`'s `kind` hold of `key` (for
    /// [`LeaseKind::WriterMark`], takes back the mark of the waiter
    /// `owner`) and wakes the key's waiters. `Ok(false)` means it was no
    /// longer ours.
    fn release(
        &self,
        kind: LeaseKind,
        key: &LockKey,
        owner: &OwnerToken,
    ) -> impl Future<Output = Result<bool, Error>> + Send;

    /// Hands the lock of `key` from owner `from` to owner `to`, for `lease`
    /// counted from now, if `from` holds it: one owner-checked step, so
    /// that of callers that all hand the same `from` over, at most one
    /// succeeds. `Ok(false)` means `from` no longer holds it (lapsed,
    /// released, taken by someone else, or handed over already).
    /// [`Locker::resume`](crate::Locker::resume) takes an exported lease up
    /// with it, so that an export is taken up once. The default answers
    /// [`Error::Config`]: a store of your own implements it to support
    /// `resume`.
    fn transfer(
        &self,
        key: &LockKey,
        from: &OwnerToken,
        to: &OwnerToken,
        lease: Duration,
    ) -> impl Future<Output = Result<bool, Error>> + Send {
        let _ = (key, from, to, lease);
        async {
            Err(Error::Config(crate::error::ConfigError::new(
                "store",
                "this store does not implement LockStore::transfer, which Locker::resume needs",
            )))
        }
    }

    /// Subscribes to release notifications for `key`. When this returns,
    /// the subscription is in force: any release after this point of a
    /// lease that a waiter's try found in the way fires the watch
    /// (subscribe first, then retry — no missed wake-up: a Redis store
    /// announces a release only when a grant that found the key busy
    /// marked it as waited-for, and the try after subscribing does).
    ///
    /// One watch serves every kind of lease of `key`: it fires on a release
    /// of the key's lock, of any of its permits, of either side of its
    /// reader-writer lock and of a writer's mark (a waiter of another kind
    /// just tries again).
    fn subscribe(&self, key: &LockKey) -> impl Future<Output = Result<ReleaseWatch, Error>> + Send;

    /// Stores `record` for `retention` and releases the lock of `key`, as
    /// one atomic step, if `owner` still holds it: there is no moment where
    /// neither the lock nor the record exists, and a holder that lost its
    /// lock stores nothing (`Ok(false)`). Wakes waiters like a release.
    fn finish(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        record: Bytes,
        retention: Duration,
    ) -> impl Future<Output = Result<bool, Error>> + Send;

    /// The completed record of `key`, if one is stored.
    fn read_record(
        &self,
        key: &LockKey,
    ) -> impl Future<Output = Result<Option<Bytes>, Error>> + Send;

    /// Grants the lock of every key of `keys` to `owner` for `lease`, each
    /// minting its fencing token from its own counter as
    /// [`grant`](LockStore::grant) does and keeping `label`, or none of
    /// them: [`AcquireAllOutcome::Held`] names a key found held, and then
    /// no key of the list is left held by `owner`. A key found held is
    /// marked as waited-for, as `grant` marks it, so that its release fires
    /// [`subscribe`](LockStore::subscribe)'s watch.
    ///
    /// The engine ([`Locker::acquire_all`](crate::Locker::acquire_all))
    /// sends 1 to 64 keys, distinct and sorted (its fixed global order).
    /// The default takes them one by one in the order given with
    /// `grant`, and on the first one held releases the ones taken, the
    /// last first: callers that all ask in one order never deadlock, but
    /// the keys taken on the way are held for a moment. Stores that keep
    /// the keys in one place override it with one atomic step (the memory
    /// store; a Redis primary, Sentinel, and a Cluster when the keys share
    /// a slot: one script).
    fn grant_all(
        &self,
        keys: &[LockKey],
        owner: &OwnerToken,
        lease: Duration,
        label: Option<&HolderLabel>,
    ) -> impl Future<Output = Result<AcquireAllOutcome, Error>> + Send {
        multi::acquire_in_order(self, keys, owner, lease, label)
    }

    /// Releases the lock of every key of `keys` that `owner` holds, waking
    /// their waiters: one answer per key, whether it was still ours. The
    /// default releases them one after another (the first error is
    /// answered once all were tried).
    fn release_all(
        &self,
        keys: &[LockKey],
        owner: &OwnerToken,
    ) -> impl Future<Output = Result<Vec<bool>, Error>> + Send {
        multi::release_each(self, keys, owner)
    }

    /// Whether the store answers now: a readiness check, and the probe a
    /// [`Locker`](crate::Locker) runs while its store is down, so that its
    /// [`status`](crate::Locker::status) recovers without traffic. The
    /// Redis stores open their connections and run their boot checks
    /// ([`RedisStore::check`](crate::RedisStore::check),
    /// [`RedlockStore::check`](crate::RedlockStore::check)). The default
    /// reads the completed record of a key no lock uses: one round trip
    /// through the store's usual path.
    fn check(&self) -> impl Future<Output = Result<(), Error>> + Send {
        async move {
            // (A namespace and id that `LockKey::new` accepts.)
            let probe = LockKey::new("trl-check", "probe").map_err(Error::from)?;
            self.read_record(&probe).await.map(drop)
        }
    }

    /// Identifies the locks this store works on: clones of one store give
    /// the same id, so a [`LockGuard`](crate::LockGuard) granted through one
    /// clone is [re-entered](crate::LockGuard::reenter) by a
    /// [`Locker`](crate::Locker) built on another. Stores that are cheap
    /// handles to shared state should answer the address of that state; the
    /// default, the address of `self`, only matches the very same value.
    fn instance_id(&self) -> usize {
        std::ptr::from_ref(self).cast::<()>() as usize
    }
}

/// The operator's view of a store: who holds a key, a page of a
/// namespace's holders, and a forced release, for every kind the store
/// keeps. [`Locker::inspect`](crate::Locker::inspect) and its neighbours
/// need it. The defaults answer an error ("this store keeps no holder
/// information"): a store of your own opts in with an empty
/// `impl OperatorStore for MyStore {}` and overrides what it can answer.
pub trait OperatorStore: LockStore {
    /// Who holds `key` right now, `None` when nobody does: an opaque
    /// holder id (never the owner token), the label, the fencing token,
    /// the grant's time, the lease left, whether waiters marked it. For
    /// operators; read-only.
    fn inspect(
        &self,
        key: &LockKey,
    ) -> impl Future<Output = Result<Option<HolderInfo>, Error>> + Send {
        std::future::ready(Err(unsupported(Operation::Inspect, Some(key))))
    }

    /// One page of the held locks of `namespace`, from `cursor`, about
    /// `count` at a time, by a bounded cursor scan (Redis `SCAN`, never
    /// `KEYS`; on a Cluster, every primary in turn). A lock granted or
    /// released while the listing runs may or may not appear.
    fn list(
        &self,
        namespace: &str,
        cursor: &ListCursor,
        count: usize,
    ) -> impl Future<Output = Result<HolderPage, Error>> + Send {
        let _ = (namespace, cursor, count);
        std::future::ready(Err(unsupported(Operation::List, None)))
    }

    /// Removes `key`'s lock whoever holds it (an operator's release), wakes
    /// its waiters, and raises the fence: every later grant's token is
    /// above [`ForcedRelease::fence`], itself above every token issued
    /// before. The old holder finds out at its next renewal (its guard
    /// flips to lost).
    fn force_release(
        &self,
        key: &LockKey,
    ) -> impl Future<Output = Result<ForcedRelease, Error>> + Send {
        std::future::ready(Err(unsupported(Operation::ForceRelease, Some(key))))
    }
}

/// One-line grants over [`LockStore::grant`], for tests and tools: every
/// store has them.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower_redis_lock::Error> {
/// use std::time::Duration;
/// use tower_redis_lock::{LockKey, LockStore, LockStoreExt, LeaseKind, MemoryStore, OwnerToken};
///
/// let store = MemoryStore::new();
/// let (key, owner) = (LockKey::new("jobs", "nightly")?, OwnerToken::generate());
/// assert!(store.acquire(&key, &owner, Duration::from_secs(5)).await?.is_granted());
/// assert!(store.release(LeaseKind::Lock, &key, &owner).await?);
/// # Ok(())
/// # }
/// ```
pub trait LockStoreExt: LockStore {
    /// A grant of the key's lock.
    fn acquire(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        lease: Duration,
    ) -> impl Future<Output = Result<AcquireOutcome, Error>> + Send {
        async move {
            self.grant(Grant::new(key, owner, lease, Ask::Lock { replay: false }))
                .await
        }
    }

    /// A grant of the key's lock, or its completed record if it has one.
    fn acquire_or_replay(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        lease: Duration,
    ) -> impl Future<Output = Result<AcquireOutcome, Error>> + Send {
        async move {
            self.grant(Grant::new(key, owner, lease, Ask::Lock { replay: true }))
                .await
        }
    }

    /// A grant of one of `permits` permits of the key's semaphore.
    fn acquire_permit(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        permits: u32,
        lease: Duration,
    ) -> impl Future<Output = Result<AcquireOutcome, Error>> + Send {
        async move {
            self.grant(Grant::new(key, owner, lease, Ask::Permit { permits }))
                .await
        }
    }

    /// A grant of a read of the key's reader-writer lock.
    fn acquire_read(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        lease: Duration,
    ) -> impl Future<Output = Result<AcquireOutcome, Error>> + Send {
        async move { self.grant(Grant::new(key, owner, lease, Ask::Read)).await }
    }

    /// A grant of the write of the key's reader-writer lock, marking
    /// `waiter` as waiting if it is busy.
    fn acquire_write(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        waiter: Option<&OwnerToken>,
        lease: Duration,
    ) -> impl Future<Output = Result<AcquireOutcome, Error>> + Send {
        let waiter = waiter.cloned();
        async move {
            self.grant(Grant::new(key, owner, lease, Ask::Write { waiter }))
                .await
        }
    }
}

impl<S: LockStore + ?Sized> LockStoreExt for S {}

/// The second half of a grant of [`Ask::Lock`] with `replay` for a store
/// that cannot replay in one step: after `outcome`, a grant, reads the
/// record while holding the lock (only a holder can store one, so none can
/// appear in between) and releases if there is one.
pub(crate) async fn replay_after_grant<S: LockStore + ?Sized>(
    store: &S,
    key: &LockKey,
    owner: &OwnerToken,
    outcome: AcquireOutcome,
) -> Result<AcquireOutcome, Error> {
    if !outcome.is_granted() {
        return Ok(outcome);
    }
    match store.read_record(key).await {
        Ok(Some(record)) => {
            store.release(LeaseKind::Lock, key, owner).await?;
            Ok(AcquireOutcome::Completed(record))
        }
        Ok(None) => Ok(outcome),
        Err(e) => {
            let _ = store.release(LeaseKind::Lock, key, owner).await;
            Err(e)
        }
    }
}

/// The answer of a store that keeps no holder information.
fn unsupported(op: Operation, key: Option<&LockKey>) -> Error {
    Error::Unavailable {
        op,
        key: key.cloned(),
        source: "this store keeps no holder information".into(),
    }
}

/// `err`, which hit a whole batch, as one error per renewal: the first
/// keeps the original, the others carry a copy of its message (errors are
/// not `Clone`), each with its own key.
pub(crate) fn error_for_each(err: Error, renewals: &[Renewal]) -> Vec<Result<bool, Error>> {
    let mut out = Vec::with_capacity(renewals.len());
    for r in renewals.iter().skip(1) {
        out.push(Err(copy_error(&err, &r.key)));
    }
    if let Some(first) = renewals.first() {
        out.insert(0, Err(with_key(err, &first.key)));
    }
    out
}

/// `err` about `key` (a batch error carries no key, or another one).
fn with_key(err: Error, key: &LockKey) -> Error {
    match err {
        Error::Unavailable { op, source, .. } => Error::Unavailable {
            op,
            key: Some(key.clone()),
            source,
        },
        Error::Auth { op, source, .. } => Error::Auth {
            op,
            key: Some(key.clone()),
            source,
        },
        other => other,
    }
}

/// A copy of `err` about `key`: same kind, the source as text.
fn copy_error(err: &Error, key: &LockKey) -> Error {
    let source = |s: &crate::error::BoxError| -> crate::error::BoxError { s.to_string().into() };
    match err {
        Error::Auth { op, source: s, .. } => Error::Auth {
            op: *op,
            key: Some(key.clone()),
            source: source(s),
        },
        Error::Unavailable { op, source: s, .. } => Error::Unavailable {
            op: *op,
            key: Some(key.clone()),
            source: source(s),
        },
        other => Error::Unavailable {
            op: crate::error::Operation::Extend,
            key: Some(key.clone()),
            source: other.to_string().into(),
        },
    }
}

/// Fires when a key is released after the watch was created.
///
/// Stores build one from a [`tokio::sync::watch::Receiver`] that they bump
/// on every release, plus an optional guard that unsubscribes when the watch
/// is dropped.
pub struct ReleaseWatch {
    // Field order matters: the receiver is dropped before the guard, so the
    // guard sees the receiver count without it.
    rx: Option<watch::Receiver<u64>>,
    _guard: Option<Box<dyn Send + Sync>>,
}

impl std::fmt::Debug for ReleaseWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReleaseWatch")
            .field("active", &self.rx.is_some())
            .finish()
    }
}

impl ReleaseWatch {
    /// A watch over a counter that the store bumps on every release. Values
    /// sent before this call do not fire it.
    pub fn new(mut rx: watch::Receiver<u64>) -> Self {
        rx.mark_unchanged();
        ReleaseWatch {
            rx: Some(rx),
            _guard: None,
        }
    }

    /// A watch that never fires (the store has no notifications; waiters
    /// poll).
    pub fn never() -> Self {
        ReleaseWatch {
            rx: None,
            _guard: None,
        }
    }

    /// Keeps `guard` alive as long as the watch, and drops it after the
    /// receiver (so its `Drop` can unsubscribe when no receiver is left).
    pub fn with_guard(mut self, guard: impl Send + Sync + 'static) -> Self {
        self._guard = Some(Box::new(guard));
        self
    }

    /// Waits for the next release. Pends forever on a watch that cannot
    /// fire (no notifications, or the store went away).
    pub async fn released(&mut self) {
        match &mut self.rx {
            Some(rx) => {
                if rx.changed().await.is_err() {
                    self.rx = None;
                    std::future::pending::<()>().await;
                }
            }
            None => std::future::pending::<()>().await,
        }
    }

    /// Whether this watch can fire at all.
    pub fn is_active(&self) -> bool {
        self.rx.is_some()
    }
}
