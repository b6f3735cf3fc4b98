//! [`ReadWriteLock`]: shared (read) and exclusive (write) holds of one key,
//! writer-preferring.

use std::time::Duration;

use super::guard::LockGuard;
use super::lease::Ask;
use super::locker::{Acquired, Locker};
use super::recovery::Undo;
use super::reentry;
use crate::error::{ConfigError, Error};
use crate::key::LockKey;
use crate::store::{LeaseKind, LockStore};
use crate::token::OwnerToken;

/// A key's reader-writer lock: any number of readers at once, or one
/// writer, across every process that uses the same store. Made by
/// [`Locker::rwlock`].
///
/// Each hold, read or write, is a lease held through a [`LockGuard`] like
/// a lock: the locker's watchdog renews it every lease/3,
/// [`LockGuard::lost`] resolves when it lapses, [`LockGuard::release`] (or
/// dropping the guard) gives it back, cancellation-safe, and waiters are
/// woken by the store's release notification.
///
/// * **Writer-preferring**: a writer that finds the lock busy and waits
///   marks itself waiting in the store, visible to every process; while
///   the mark lasts, no *new* reader is granted (readers that hold keep
///   their holds), so a stream of readers cannot starve a writer. The mark
///   lasts a lease (or the [hold cap](crate::LockerBuilder::max_hold),
///   if shorter) and is renewed by the writer's tries every third of
///   that at the least, whatever the poll interval, while it waits (for
///   the store, for its turn among this process's waiters, for its
///   subscription); a writer that gives up (its wait ends, its future is
///   dropped, its runtime shuts down) takes it back, and one whose process
///   died stops holding readers back when the mark's lease ends. A writer
///   that only tries
///   ([`try_write`](ReadWriteLock::try_write)) marks nothing.
/// * **Fencing tokens**: a write grant mints one from the key's fencing
///   counter (the one its lock and permits use). A read guard carries the
///   key's epoch: the counter as the read was granted, which is at least
///   the token of every write granted before it and below the token of
///   every write granted after it — so a resource can refuse a write based
///   on what an older read saw.
/// * **Re-entry**, for a task inside [`LockGuard::scope`] of a hold of the
///   same key (or a layer inside a layer): a read inside a read, or a write
///   inside a write, is one more hold on the same guard; a read inside a
///   write is one more hold on the write (the exclusive hold covers
///   reading). **A write inside a read is refused** with [`Error::Config`]
///   at once: two readers that both wait to write would wait for each
///   other for ever (release the read guard, then ask for the write). The
///   engine tells only within a scope: a task that holds a read guard
///   outside one and asks to write waits for itself until its wait ends.
///   Likewise, a task asking for a second read (outside a scope) while a
///   writer waits for its first waits behind that writer.
/// * [`LockGuard::finish`] and [`LockGuard::export`] are for a lock: on a
///   read or write guard they answer [`Error::Config`].
///
/// The memory store and the Redis store (one primary, Sentinel, Cluster)
/// have reader-writer locks; on [`RedlockStore`](crate::RedlockStore),
/// [`Locker::rwlock`] answers [`Error::Config`] ([`LockStore::supports`]).
///
/// ```
/// use std::time::Duration;
/// use tower_redis_lock::{LockKey, Locker, MemoryStore};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower_redis_lock::Error> {
/// let locker = Locker::new(MemoryStore::new());
/// let doc = locker.rwlock(&LockKey::new("docs", "readme")?)?;
///
/// // Readers share it...
/// let a = doc.try_read().await?;
/// let b = doc.try_read().await?;
/// // ...and keep a writer out.
/// assert!(doc.try_write().await.unwrap_err().is_contended());
/// drop((a, b));
///
/// let w = doc.write_within(Duration::from_secs(1)).await?;
/// assert!(doc.try_read().await.unwrap_err().is_contended());
/// let token = w.fencing_token().unwrap();
/// w.release().await?;
/// // A reader carries the epoch of the last write: not below its token.
/// let r = doc.try_read().await?;
/// assert!(r.fencing_token().unwrap() >= token);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
#[must_use = "a reader-writer lock takes nothing until it is asked to read or write"]
pub struct ReadWriteLock<S> {
    locker: Locker<S>,
    key: LockKey,
}

impl<S> std::fmt::Debug for ReadWriteLock<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadWriteLock")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl<S: LockStore> Locker<S> {
    /// The reader-writer lock of `key` (see [`ReadWriteLock`]). Takes
    /// nothing yet. Fails with [`Error::Config`] when the store keeps no
    /// reader-writer locks ([`LockStore::supports`]: Redlock), without
    /// asking the store.
    pub fn rwlock(&self, key: &LockKey) -> Result<ReadWriteLock<S>, Error> {
        crate::store::kind_unsupported(self.store(), LeaseKind::Read)?;
        Ok(ReadWriteLock {
            locker: self.clone(),
            key: key.clone(),
        })
    }
}

impl<S: LockStore> ReadWriteLock<S> {
    /// The key.
    pub fn key(&self) -> &LockKey {
        &self.key
    }

    /// Takes a shared hold, waiting up to the locker's wait timeout.
    pub async fn read(&self) -> Result<LockGuard, Error> {
        self.read_within(self.locker.wait_timeout()).await
    }

    /// Takes a shared hold if no writer holds or waits right now
    /// ([`Error::Contended`] otherwise).
    pub async fn try_read(&self) -> Result<LockGuard, Error> {
        self.read_within(Duration::ZERO).await
    }

    /// Takes a shared hold, waiting up to `wait` (0 = try once) for the
    /// writer holding it to release and the writers waiting to have had
    /// their turn, as [`Locker::acquire_within`] waits for a lock. Not
    /// granted by then: [`Error::WaitTimeout`]. Dropping the future at any
    /// point is safe.
    pub async fn read_within(&self, wait: Duration) -> Result<LockGuard, Error> {
        let store = self.locker.store_id();
        // A read inside this task's write: one more hold on the write.
        if let Some(outer) = reentry::held_by_task(&self.key, LeaseKind::Write, store)
            && let Ok(again) = LockGuard::from_hold(outer).reenter()
        {
            return Ok(again);
        }
        self.take(wait, Ask::Read).await
    }

    /// Takes the exclusive hold, waiting up to the locker's wait timeout.
    pub async fn write(&self) -> Result<LockGuard, Error> {
        self.write_within(self.locker.wait_timeout()).await
    }

    /// Takes the exclusive hold if nobody holds either side right now
    /// ([`Error::Contended`] otherwise); marks nothing.
    pub async fn try_write(&self) -> Result<LockGuard, Error> {
        self.write_within(Duration::ZERO).await
    }

    /// Takes the exclusive hold, waiting up to `wait` (0 = try once): while
    /// it waits, it is marked as a writer waiting, which stops new readers
    /// (see [`ReadWriteLock`]). Not granted by then:
    /// [`Error::WaitTimeout`], and the mark is taken back. Dropping the
    /// future at any point is safe: a grant whose answer was not received
    /// is released, and the mark taken back, in the background.
    ///
    /// In the scope of a read guard of the same key: [`Error::Config`] at
    /// once (no upgrade; see [`ReadWriteLock`]).
    pub async fn write_within(&self, wait: Duration) -> Result<LockGuard, Error> {
        let store = self.locker.store_id();
        if reentry::held_by_task(&self.key, LeaseKind::Write, store).is_none()
            && reentry::held_by_task(&self.key, LeaseKind::Read, store).is_some()
        {
            return Err(Error::Config(ConfigError::new(
                "rwlock",
                format!(
                    "{}: a read guard cannot be upgraded to write (two readers upgrading \
                     would wait for each other): release it, then ask for the write",
                    self.key
                ),
            )));
        }
        if wait.is_zero() {
            return self.take(wait, Ask::Write { waiter: None }).await;
        }
        // One mark for all the tries of this acquire.
        let waiter = fastrand::u128(..);
        let mark = Withdraw {
            armed: Some((self.key.clone(), waiter)),
            locker: &self.locker,
            runtime: tokio::runtime::Handle::try_current().ok(),
        };
        let res = self
            .take(
                wait,
                Ask::Write {
                    waiter: Some(waiter),
                },
            )
            .await;
        match res {
            Ok(guard) => {
                // The grant took the mark back.
                mark.disarm();
                Ok(guard)
            }
            Err(e) => {
                // Taken back before the caller hears of it: a job that gives
                // up and ends must not leave every reader refused.
                mark.withdraw().await;
                Err(e)
            }
        }
    }

    async fn take(&self, wait: Duration, ask: Ask) -> Result<LockGuard, Error> {
        match self.locker.take(&self.key, wait, ask).await? {
            Acquired::Locked(guard) => Ok(guard),
            Acquired::Completed(_) => Err(Error::Record {
                key: self.key.clone(),
                reason: "the store answered a reader-writer lock with a completed record",
            }),
        }
    }
}

/// Takes a waiting writer's mark back when the write acquire ends without
/// a grant: at once when its wait ran out or it failed, in the background
/// (with the locker's other undos, until the store answers) when its future
/// was dropped or the withdrawal failed. A future dropped by its runtime's
/// shutdown, or outside any runtime, is no exception: the undo goes on,
/// on a thread of its own if no runtime is left to run it (see
/// `recovery.rs`).
struct Withdraw<'a, S: LockStore> {
    armed: Option<(LockKey, u128)>,
    locker: &'a Locker<S>,
    /// The runtime the acquire runs on: where the undo goes when the
    /// future is dropped outside any runtime.
    runtime: Option<tokio::runtime::Handle>,
}

impl<S: LockStore> Withdraw<'_, S> {
    fn disarm(mut self) {
        self.armed = None;
    }

    async fn withdraw(mut self) {
        let Some((key, waiter)) = self.armed.as_ref() else {
            return;
        };
        let waiter = OwnerToken::from_u128(*waiter);
        match self
            .locker
            .inner
            .store
            .release(LeaseKind::WriterMark, key, &waiter)
            .await
        {
            Ok(_) => self.armed = None,
            Err(e) => {
                tracing::debug!(key = %key, error = %crate::error::Chain(&e), "taking a waiting writer's mark back failed; retrying in the background");
                if let Some((key, _)) = self.armed.take() {
                    self.undo(key, waiter, true);
                }
            }
        }
    }

    fn undo(&self, key: LockKey, waiter: OwnerToken, suspect: bool) {
        let recovery = &self.locker.inner.recovery;
        recovery.abandon(Undo::Mark { key, waiter }, suspect, self.runtime.as_ref());
    }
}

impl<S: LockStore> Drop for Withdraw<'_, S> {
    fn drop(&mut self) {
        if let Some((key, waiter)) = self.armed.take() {
            self.undo(key, OwnerToken::from_u128(waiter), false);
        }
    }
}
