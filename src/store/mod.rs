//! Backends that keep locks: one small trait, one file per store.
//!
//! [`LockStore`] is the whole contract between the lock engine
//! ([`Locker`](crate::Locker)) and a backend. The engine owns waiting, the
//! watchdog and guards; a store only has to make each operation atomic and
//! owner-checked:
//!
//! | operation | meaning |
//! |---|---|
//! | [`acquire`](LockStore::acquire) | grant if free (or already ours) and mint the fencing token in the same step; else report the holder's remaining lease |
//! | [`extend`](LockStore::extend) | reset the lease to `lease` if we still own it |
//! | [`extend_many`](LockStore::extend_many) | the same for a batch (pipelined where the backend can) |
//! | [`release`](LockStore::release) | delete if we still own it, and wake waiters |
//! | [`transfer`](LockStore::transfer) | hand the lock to another owner token if we still own it (for `Locker::resume`) |
//! | [`subscribe`](LockStore::subscribe) | a [`ReleaseWatch`] that fires on the next release of a key |
//! | [`acquire_or_replay`](LockStore::acquire_or_replay) | as `acquire`, but answer the completed record instead if there is one |
//! | [`finish`](LockStore::finish) | store a completed record and release, as one owner-checked step |
//! | [`read_record`](LockStore::read_record) | the completed record of a key, if any |
//! | [`acquire_labelled`](LockStore::acquire_labelled) | `acquire` (or `acquire_or_replay`) that stores the holder's label with the grant |
//! | [`inspect`](LockStore::inspect) | who holds a key ([`HolderInfo`]), for operators |
//! | [`list`](LockStore::list) | a page of a namespace's held locks, by a bounded cursor scan |
//! | [`force_release`](LockStore::force_release) | an operator's release, whoever holds it, raising the fence |
//! | [`acquire_permit`](LockStore::acquire_permit) | grant one of `permits` permits of a key's semaphore (expired permits freed first) and mint its fencing token in the same step; else report when the soonest permit ends |
//! | [`extend_permit`](LockStore::extend_permit), [`release_permit`](LockStore::release_permit) | as `extend` and `release`, for one permit |
//! | [`acquire_all`](LockStore::acquire_all), [`release_all`](LockStore::release_all) | every key of a list or none (one atomic step where the store can; by default the keys in order, rolled back on the first held), and their release |
//! | [`acquire_read`](LockStore::acquire_read), [`acquire_write`](LockStore::acquire_write) | grant a shared or the exclusive side of a key's reader-writer lock (a writer that finds it busy marks itself waiting, which stops new readers) |
//! | [`extend_rw`](LockStore::extend_rw), [`release_rw`](LockStore::release_rw), [`withdraw_writer`](LockStore::withdraw_writer) | as `extend` and `release`, for one side; a waiting writer's mark taken back |
//!
//! A lease is of a [`LeaseKind`]: the lock of a key, one permit of its
//! semaphore, or a read or the write hold of its reader-writer lock. The
//! kinds of one key are apart (a permit of `orders:42` and the lock
//! `orders:42` never see each other) but share the key's fencing counter,
//! so that tokens of every kind rise together. The permit and
//! reader-writer methods have defaults that answer a
//! [`ConfigError`](crate::ConfigError) ("not supported"), so a store
//! without them still compiles and says so clearly.
//!
//! Every store passes the same conformance suite (`tests/conformance.rs`).

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;

use crate::error::Error;
use crate::key::LockKey;
use crate::token::{FencingToken, OwnerToken};

mod boxed;
pub(crate) mod holder;
pub(crate) mod memory;
pub(crate) mod multi;
pub(crate) mod redis;
pub(crate) mod redlock;
mod rwlock;

pub use boxed::BoxStore;
pub use multi::AcquireAllOutcome;
pub use rwlock::RwMode;
pub(crate) use rwlock::rw_unsupported;

use crate::error::Operation;
use holder::{ForcedRelease, HolderInfo, HolderLabel, HolderPage, ListCursor};

/// What an acquire attempt found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AcquireOutcome {
    /// The lock is ours, with this fencing token.
    Granted(FencingToken),
    /// The lock is ours, and the store mints no fencing tokens (a
    /// [`RedisStore`](crate::RedisStore) built
    /// [`fencing(false)`](crate::RedisStoreBuilder::fencing)). The
    /// guard's [`fencing_token`](crate::LockGuard::fencing_token) answers
    /// [`Unfenced`](crate::Unfenced).
    GrantedUnfenced,
    /// Someone else holds it. `remaining` is the holder's remaining lease,
    /// `None` when the key has no expiry (written by something else).
    Held {
        /// The holder's remaining lease.
        remaining: Option<Duration>,
    },
    /// The key's work is done: its completed record (see
    /// the layer's `Record`). Only [`LockStore::acquire_or_replay`]
    /// answers this.
    Completed(Bytes),
}

/// What a lease holds: the lock of a key, one permit of the key's
/// semaphore, or a side of its reader-writer lock. Renewals and releases
/// go to the kind's own operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum LeaseKind {
    /// The key's lock ([`LockStore::acquire`]).
    #[default]
    Lock,
    /// One permit of the key's semaphore ([`LockStore::acquire_permit`]).
    Permit,
    /// A shared (read) hold of the key's reader-writer lock
    /// ([`LockStore::acquire_read`]).
    Read,
    /// The exclusive (write) hold of the key's reader-writer lock
    /// ([`LockStore::acquire_write`]).
    Write,
}

impl LeaseKind {
    /// The side of the reader-writer lock this kind holds, if it is one.
    pub(crate) fn rw_mode(self) -> Option<RwMode> {
        match self {
            LeaseKind::Read => Some(RwMode::Read),
            LeaseKind::Write => Some(RwMode::Write),
            LeaseKind::Lock | LeaseKind::Permit => None,
        }
    }
}

/// One lease to renew in [`LockStore::extend_many`].
#[derive(Debug, Clone)]
pub struct Renewal {
    /// The lock.
    pub key: LockKey,
    /// Our owner token.
    pub owner: OwnerToken,
    /// The new lease, counted from when the store applies it.
    pub lease: Duration,
    /// What the lease holds: the lock, or a permit.
    pub kind: LeaseKind,
}

/// The error of a store that has no semaphores.
/// The refusal of a kind the store does not keep (see
/// [`LockStore::supports`]).
pub(crate) fn kind_unsupported<S: LockStore + ?Sized>(
    store: &S,
    kind: LeaseKind,
) -> Result<(), crate::error::ConfigError> {
    if store.supports(kind) {
        return Ok(());
    }
    let (setting, what) = match kind {
        LeaseKind::Permit => ("permits", "semaphores (permits)"),
        LeaseKind::Read | LeaseKind::Write => ("read_write", "reader-writer locks"),
        LeaseKind::Lock => ("store", "locks"),
    };
    Err(crate::error::ConfigError::new(
        setting,
        format!("this store does not keep {what}"),
    ))
}

pub(crate) fn permits_unsupported() -> Error {
    Error::Config(crate::error::ConfigError::new(
        "permits",
        "this store does not support semaphores (permits)",
    ))
}

/// A backend that keeps locks.
///
/// Implementations must make each operation atomic and check the owner
/// token on every write. Futures must be cancel-safe in the sense that
/// dropping one never leaves the store inconsistent (at worst, a grant
/// whose answer was lost expires after its lease).
pub trait LockStore: Send + Sync + 'static {
    /// Grants `key` to `owner` for `lease` if it is free or already held by
    /// `owner`, minting the fencing token in the same atomic step. Already
    /// held by `owner` (a retried attempt whose answer was lost), the
    /// answer is a token valid for that hold: at least its grant's and
    /// below every later holder's; its grant's on the memory store, and on
    /// the Redis stores unless another lock of its fencing bucket was
    /// granted, or asked for while held, since (an attempt that finds a
    /// lock held may raise the bucket's counter to the server's clock; see
    /// [`RedlockStore`](crate::RedlockStore) for when Redlock can tell). The engine never does this: each attempt has a
    /// fresh owner, and a guard's re-entry sends nothing to the store.
    fn acquire(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        lease: Duration,
    ) -> impl Future<Output = Result<AcquireOutcome, Error>> + Send;

    /// Resets the lease of `key` to `lease` if `owner` holds it. `Ok(false)`
    /// means "not the owner" (expired, released, or taken by someone else).
    fn extend(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        lease: Duration,
    ) -> impl Future<Output = Result<bool, Error>> + Send;

    /// Extends many leases, answering one result per renewal, in order,
    /// with the meaning of [`extend`](LockStore::extend) for each: one
    /// lease's error (its key is of the wrong type, its cluster node is
    /// down) must not fail the others. A failure that does reach every
    /// renewal of the batch (the one connection they shared broke or timed
    /// out) is answered as an error for each. The default runs
    /// [`extend`](LockStore::extend) one after another; network stores
    /// pipeline the batch.
    fn extend_many(
        &self,
        renewals: &[Renewal],
    ) -> impl Future<Output = Vec<Result<bool, Error>>> + Send {
        async move {
            let mut out = Vec::with_capacity(renewals.len());
            for r in renewals {
                out.push(match (r.kind, r.kind.rw_mode()) {
                    (_, Some(mode)) => self.extend_rw(&r.key, &r.owner, mode, r.lease).await,
                    (LeaseKind::Permit, _) => self.extend_permit(&r.key, &r.owner, r.lease).await,
                    _ => self.extend(&r.key, &r.owner, r.lease).await,
                });
            }
            out
        }
    }

    /// Hands `key` from owner `from` to owner `to`, for `lease` counted
    /// from now, if `from` holds it: one owner-checked step, so that of
    /// callers that all hand the same `from` over, at most one succeeds.
    /// `Ok(false)` means `from` no longer holds it (lapsed, released,
    /// taken by someone else, or handed over already).
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

    /// Deletes `key` if `owner` holds it and wakes its waiters. `Ok(false)`
    /// means we no longer owned it.
    fn release(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
    ) -> impl Future<Output = Result<bool, Error>> + Send;

    /// Like [`acquire`](LockStore::acquire), but when `key` has a completed
    /// record, answers [`AcquireOutcome::Completed`] with it and takes
    /// nothing. The default takes the lock, then reads the record while
    /// holding it (only a holder can store one, so none can appear in
    /// between) and releases if there is one: two round trips where a store
    /// can do one.
    fn acquire_or_replay(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        lease: Duration,
    ) -> impl Future<Output = Result<AcquireOutcome, Error>> + Send {
        async move {
            let outcome = self.acquire(key, owner, lease).await?;
            replay_after_grant(self, key, owner, outcome).await
        }
    }

    /// Stores `record` for `retention` and releases `key`, as one atomic
    /// step, if `owner` still holds it: there is no moment where neither the
    /// lock nor the record exists, and a holder that lost its lock stores
    /// nothing (`Ok(false)`). Wakes waiters like a release.
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

    /// Subscribes to release notifications for `key`. When this returns,
    /// the subscription is in force: any release after this point of a
    /// lock that a waiter's try found held fires the watch (subscribe
    /// first, then retry — no missed wake-up: a Redis store announces a
    /// release only when an acquire that found the lock held marked it as
    /// waited-for, and the try after subscribing does).
    ///
    /// One watch serves every kind of lease of `key`: it fires on a release
    /// of the key's lock, of any of its permits, of either side of its
    /// reader-writer lock and on a waiting writer's withdrawal (a waiter of
    /// another kind just tries again).
    fn subscribe(&self, key: &LockKey) -> impl Future<Output = Result<ReleaseWatch, Error>> + Send;

    /// Grants `owner` one of `permits` permits of `key`'s semaphore for
    /// `lease`, if fewer than `permits` unexpired permits are held (or
    /// `owner` holds one already: its lease is reset), minting its fencing
    /// token from the same counter as the key's lock in the same atomic
    /// step. Expired permits are freed first. Otherwise answers
    /// [`AcquireOutcome::Held`] with the time until the soonest permit's
    /// lease ends. A finding of "no permit" marks the key as waited-for,
    /// as the lock does, so that the next permit release fires
    /// [`subscribe`](LockStore::subscribe)'s watch.
    ///
    /// `permits` is the caller's: callers that disagree each count against
    /// their own `permits` (one asking for 5 is granted while 4 are held,
    /// one asking for 3 is not). The engine checks `permits` (1 to
    /// 65,536) before calling. The default answers a
    /// [`ConfigError`](crate::ConfigError): not supported.
    fn acquire_permit(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        permits: u32,
        lease: Duration,
    ) -> impl Future<Output = Result<AcquireOutcome, Error>> + Send {
        let _ = (key, owner, permits, lease);
        async { Err(permits_unsupported()) }
    }

    /// Resets the lease of `owner`'s permit of `key` to `lease`, if it is
    /// still held and unexpired. `Ok(false)`: not held (expired, released,
    /// or removed). The default answers "not supported".
    fn extend_permit(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        lease: Duration,
    ) -> impl Future<Output = Result<bool, Error>> + Send {
        let _ = (key, owner, lease);
        async { Err(permits_unsupported()) }
    }

    /// Gives back `owner`'s permit of `key` and wakes the key's permit
    /// waiters. `Ok(false)`: it was no longer held. The default answers
    /// "not supported".
    fn release_permit(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
    ) -> impl Future<Output = Result<bool, Error>> + Send {
        let _ = (key, owner);
        async { Err(permits_unsupported()) }
    }

    /// Grants every key of `keys` to `owner` for `lease`, each minting its
    /// fencing token from its own counter as [`acquire`](LockStore::acquire)
    /// does, or none of them: [`AcquireAllOutcome::Held`] names a key found
    /// held, and then no key of the list is left held by `owner`. A key
    /// found held is marked as waited-for, as `acquire` marks it, so that
    /// its release fires [`subscribe`](LockStore::subscribe)'s watch.
    ///
    /// The engine ([`Locker::acquire_all`](crate::Locker::acquire_all))
    /// sends 1 to 64 keys, distinct and sorted (its fixed global order).
    /// The default takes them one by one in the order given with
    /// `acquire`, and on the first one held releases the ones taken, the
    /// last first: callers that all ask in one order never deadlock, but
    /// the keys taken on the way are held for a moment. Stores that keep
    /// the keys in one place override it with one atomic step (the memory
    /// store; a Redis primary, Sentinel, and a Cluster when the keys share
    /// a slot: one script).
    fn acquire_all(
        &self,
        keys: &[LockKey],
        owner: &OwnerToken,
        lease: Duration,
    ) -> impl Future<Output = Result<AcquireAllOutcome, Error>> + Send {
        multi::acquire_in_order(self, keys, owner, lease)
    }

    /// Releases every key of `keys` that `owner` holds, waking their
    /// waiters: one answer per key, whether it was still ours. The default
    /// releases them one after another with [`release`](LockStore::release)
    /// (the first error is answered once all were tried).
    fn release_all(
        &self,
        keys: &[LockKey],
        owner: &OwnerToken,
    ) -> impl Future<Output = Result<Vec<bool>, Error>> + Send {
        multi::release_each(self, keys, owner)
    }

    /// Grants `owner` a shared (read) hold of `key`'s reader-writer lock
    /// for `lease`, if no writer holds it and none waits (writers are
    /// preferred: a waiting writer's mark stops new readers), or if
    /// `owner` holds one already (its lease is reset). Expired readers and
    /// lapsed writer marks are dropped first. The answer's token is the
    /// key's epoch: the fencing counter as it stands (raised to the clock
    /// where it is behind, never advanced past it), so at least every
    /// earlier write grant's token and below every later one's. Otherwise
    /// [`AcquireOutcome::Held`], with the writer's remaining lease or the
    /// time until the waiting writers' marks lapse; the finding marks the
    /// key as waited-for, as the lock does, so that the next release of
    /// either side (or a writer's withdrawal) fires
    /// [`subscribe`](LockStore::subscribe)'s watch.
    ///
    /// The default answers a [`ConfigError`](crate::ConfigError): not
    /// supported.
    fn acquire_read(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        lease: Duration,
    ) -> impl Future<Output = Result<AcquireOutcome, Error>> + Send {
        let _ = (key, owner, lease);
        async { Err(rw_unsupported()) }
    }

    /// Grants `owner` the exclusive (write) hold of `key`'s reader-writer
    /// lock for `lease`, if nobody holds either side (or `owner` holds the
    /// write side already: its lease is reset), minting its fencing token
    /// from the key's counter in the same step, and taking back `waiter`'s
    /// mark. Otherwise answers [`AcquireOutcome::Held`] (the writer's
    /// remaining lease, or the time until the last reader's lease ends)
    /// and, with a `waiter`, marks it as a writer waiting for `lease`:
    /// while any such mark lasts, [`acquire_read`](LockStore::acquire_read)
    /// grants nobody new. The engine keeps one `waiter` for all the tries
    /// of one acquire, tries again (so refreshes the mark) at least every
    /// lease/3, and takes the mark back with
    /// [`withdraw_writer`](LockStore::withdraw_writer) when it gives up; a
    /// try that does not wait passes no `waiter`.
    ///
    /// The default answers "not supported".
    fn acquire_write(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        waiter: Option<&OwnerToken>,
        lease: Duration,
    ) -> impl Future<Output = Result<AcquireOutcome, Error>> + Send {
        let _ = (key, owner, waiter, lease);
        async { Err(rw_unsupported()) }
    }

    /// Resets the lease of `owner`'s `mode` hold of `key` to `lease`, if it
    /// is still held and unexpired. `Ok(false)`: not held. The default
    /// answers "not supported".
    fn extend_rw(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        mode: RwMode,
        lease: Duration,
    ) -> impl Future<Output = Result<bool, Error>> + Send {
        let _ = (key, owner, mode, lease);
        async { Err(rw_unsupported()) }
    }

    /// Gives back `owner`'s `mode` hold of `key` and wakes the key's
    /// waiters. `Ok(false)`: it was no longer held. The default answers
    /// "not supported".
    fn release_rw(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        mode: RwMode,
    ) -> impl Future<Output = Result<bool, Error>> + Send {
        let _ = (key, owner, mode);
        async { Err(rw_unsupported()) }
    }

    /// Takes back the mark of `waiter`, a writer that gave up waiting for
    /// `key` (see [`acquire_write`](LockStore::acquire_write)), and wakes
    /// the readers it held back. `Ok(false)`: there was no such mark. The
    /// default answers "not supported".
    fn withdraw_writer(
        &self,
        key: &LockKey,
        waiter: &OwnerToken,
    ) -> impl Future<Output = Result<bool, Error>> + Send {
        let _ = (key, waiter);
        async { Err(rw_unsupported()) }
    }

    /// [`acquire`](LockStore::acquire), or with `replay`
    /// [`acquire_or_replay`](LockStore::acquire_or_replay), that keeps
    /// `label` with the grant for [`inspect`](LockStore::inspect). The
    /// engine grants through this. The default ignores the label.
    fn acquire_labelled(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        lease: Duration,
        label: Option<&HolderLabel>,
        replay: bool,
    ) -> impl Future<Output = Result<AcquireOutcome, Error>> + Send {
        let _ = label;
        async move {
            if replay {
                self.acquire_or_replay(key, owner, lease).await
            } else {
                self.acquire(key, owner, lease).await
            }
        }
    }

    /// Who holds `key` right now, `None` when nobody does: an opaque
    /// holder id (never the owner token), the label, the fencing token,
    /// the grant's time, the lease left, whether waiters marked it. For
    /// operators; read-only. The default answers an error (a store of
    /// another crate that keeps no holder information).
    fn inspect(
        &self,
        key: &LockKey,
    ) -> impl Future<Output = Result<Option<HolderInfo>, Error>> + Send {
        std::future::ready(Err(unsupported(Operation::Inspect, Some(key))))
    }

    /// One page of the held locks of `namespace`, from `cursor`, about
    /// `count` at a time, by a bounded cursor scan (Redis `SCAN`, never
    /// `KEYS`; on a Cluster, every primary in turn). A lock granted or
    /// released while the listing runs may or may not appear. The default
    /// answers an error.
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
    /// flips to lost). The default answers an error.
    fn force_release(
        &self,
        key: &LockKey,
    ) -> impl Future<Output = Result<ForcedRelease, Error>> + Send {
        std::future::ready(Err(unsupported(Operation::ForceRelease, Some(key))))
    }

    /// Whether the store keeps leases of `kind`: declared as data, so that
    /// a [`Semaphore`](crate::Semaphore), a
    /// [`ReadWriteLock`](crate::ReadWriteLock) or a layer of a kind the
    /// store lacks is refused when it is made ([`ConfigError`]), never at
    /// each request. The default keeps locks only: a store of your own
    /// that implements the permit or reader-writer methods says so here.
    /// The memory and Redis stores keep every kind; Redlock keeps locks.
    ///
    /// [`ConfigError`]: crate::ConfigError
    fn supports(&self, kind: LeaseKind) -> bool {
        kind == LeaseKind::Lock
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

/// Renews a lease of `kind` (see [`LockStore::extend`] and
/// [`LockStore::extend_permit`]).
pub(crate) async fn extend_lease<S: LockStore>(
    store: &S,
    kind: LeaseKind,
    key: &LockKey,
    owner: &OwnerToken,
    lease: Duration,
) -> Result<bool, Error> {
    match kind {
        LeaseKind::Lock => store.extend(key, owner, lease).await,
        LeaseKind::Permit => store.extend_permit(key, owner, lease).await,
        LeaseKind::Read => store.extend_rw(key, owner, RwMode::Read, lease).await,
        LeaseKind::Write => store.extend_rw(key, owner, RwMode::Write, lease).await,
    }
}

/// Releases a lease of `kind` (see [`LockStore::release`] and
/// [`LockStore::release_permit`]).
pub(crate) async fn release_lease<S: LockStore>(
    store: &S,
    kind: LeaseKind,
    key: &LockKey,
    owner: &OwnerToken,
) -> Result<bool, Error> {
    match kind {
        LeaseKind::Lock => store.release(key, owner).await,
        LeaseKind::Permit => store.release_permit(key, owner).await,
        LeaseKind::Read => store.release_rw(key, owner, RwMode::Read).await,
        LeaseKind::Write => store.release_rw(key, owner, RwMode::Write).await,
    }
}

/// The second half of the default
/// [`acquire_or_replay`](LockStore::acquire_or_replay): after `outcome`, a
/// grant, reads the record while holding the lock (only a holder can store
/// one, so none can appear in between) and releases if there is one.
pub(crate) async fn replay_after_grant<S: LockStore + ?Sized>(
    store: &S,
    key: &LockKey,
    owner: &OwnerToken,
    outcome: AcquireOutcome,
) -> Result<AcquireOutcome, Error> {
    if !matches!(
        outcome,
        AcquireOutcome::Granted(_) | AcquireOutcome::GrantedUnfenced
    ) {
        return Ok(outcome);
    }
    match store.read_record(key).await {
        Ok(Some(record)) => {
            store.release(key, owner).await?;
            Ok(AcquireOutcome::Completed(record))
        }
        Ok(None) => Ok(outcome),
        Err(e) => {
            let _ = store.release(key, owner).await;
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
