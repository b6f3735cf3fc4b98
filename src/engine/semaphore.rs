//! [`Semaphore`]: at most N holders of a key at once, each holding a
//! permit that is a lease of its own.

use std::time::Duration;

use super::guard::LockGuard;
use super::lease::Ask;
use super::locker::{Acquired, Locker};
use crate::error::{ConfigError, Error};
use crate::key::LockKey;
use crate::store::{LeaseKind, LockStore};

/// The most permits a semaphore may have: larger counts are refused before
/// any store call (a count that large is a bug, and the store keeps one
/// entry per permit held).
pub(crate) const MAX_PERMITS: u32 = 65_536;

/// A key's semaphore: at most `permits` holders at once, across every
/// process that uses the same store. Made by [`Locker::semaphore`].
///
/// Each permit is a lease of its own, with its own owner token and its own
/// fencing token, and is held through a [`LockGuard`] like a lock: the
/// locker's watchdog renews it every lease/3, [`LockGuard::lost`] resolves
/// when it lapses, [`LockGuard::release`] (or dropping the guard) gives it
/// back, cancellation-safe, and waiters are woken by the store's release
/// notification. A holder that crashes keeps its permit until its lease
/// ends, never longer, and never less.
///
/// * **Fencing tokens** come from the key's fencing counter, the one its
///   lock uses: tokens of permits and of the lock of one key rise together
///   and never go back.
/// * **N is the caller's**: each acquire counts the permits held against
///   its own `permits` (as Redisson's and DistributedLock's semaphores do).
///   Callers that disagree on N get what each asked for: with 4 held, one
///   that asks with N = 5 is granted, one with N = 3 is not. Use one N per
///   key.
/// * **Re-entry**: [`LockGuard::reenter`] gives one more hold on the *same*
///   permit (no second permit is taken), and a task inside
///   [`LockGuard::scope`] of a permit that asks for a permit of the same key
///   gets such a hold. A permit and the key's lock are apart: holding one
///   does not re-enter the other.
/// * [`LockGuard::finish`] has no meaning for a permit: it releases the
///   permit and answers [`Error::Config`].
///
/// `permits` is 1 to 65,536: [`Locker::semaphore`] refuses 0 and anything
/// larger with [`Error::Config`], before any store call. The memory store
/// and the Redis store (one primary, Sentinel, Cluster) have semaphores;
/// [`RedlockStore`](crate::RedlockStore) answers [`Error::Config`] ("not
/// supported").
///
/// ```
/// use std::time::Duration;
/// use tower_redis_lock::{LockKey, Locker, MemoryStore};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower_redis_lock::Error> {
/// let locker = Locker::new(MemoryStore::new());
/// // At most 2 exports per tenant at once.
/// let exports = locker.semaphore(&LockKey::new("exports", "tenant-7")?, 2)?;
///
/// let a = exports.try_acquire().await?;
/// let b = exports.try_acquire().await?;
/// let err = exports.try_acquire().await.unwrap_err();
/// assert!(err.is_contended());
/// // Each permit has its own fencing token, rising per key.
/// assert!(b.fencing_token().unwrap() > a.fencing_token().unwrap());
///
/// a.release().await?;
/// let c = exports.acquire_within(Duration::from_secs(1)).await?;
/// assert!(c.is_held());
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
#[must_use = "a semaphore takes nothing until it is asked for a permit"]
pub struct Semaphore<S> {
    locker: Locker<S>,
    key: LockKey,
    permits: u32,
}

impl<S> std::fmt::Debug for Semaphore<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Semaphore")
            .field("key", &self.key)
            .field("permits", &self.permits)
            .finish_non_exhaustive()
    }
}

/// `permits` if it is a semaphore's count (1 to [`MAX_PERMITS`]).
pub(crate) fn check_permits(permits: u32) -> Result<u32, ConfigError> {
    if permits == 0 {
        return Err(ConfigError::new(
            "permits",
            "a semaphore needs at least 1 permit",
        ));
    }
    if permits > MAX_PERMITS {
        return Err(ConfigError::new(
            "permits",
            format!("at most {MAX_PERMITS} permits per semaphore, got {permits}"),
        ));
    }
    Ok(permits)
}

impl<S: LockStore> Locker<S> {
    /// The semaphore of `key` with `permits` permits: at most that many
    /// holders at once (see [`Semaphore`]). Takes nothing yet.
    ///
    /// Fails with [`Error::Config`] when `permits` is 0 or above 65,536, or
    /// when the store keeps no semaphores ([`LockStore::supports`]:
    /// Redlock), without asking the store.
    ///
    /// ```
    /// use tower_redis_lock::{Error, LockKey, Locker, MemoryStore};
    ///
    /// # fn main() -> Result<(), tower_redis_lock::KeyError> {
    /// let locker = Locker::new(MemoryStore::new());
    /// let key = LockKey::new("exports", "tenant-7")?;
    /// assert!(matches!(locker.semaphore(&key, 0), Err(Error::Config(_))));
    /// assert!(matches!(locker.semaphore(&key, 100_000), Err(Error::Config(_))));
    /// assert!(locker.semaphore(&key, 4).is_ok());
    /// # Ok(())
    /// # }
    /// ```
    pub fn semaphore(&self, key: &LockKey, permits: u32) -> Result<Semaphore<S>, Error> {
        crate::store::kind_unsupported(self.store(), LeaseKind::Permit)?;
        Ok(Semaphore {
            locker: self.clone(),
            key: key.clone(),
            permits: check_permits(permits)?,
        })
    }
}

impl<S: LockStore> Semaphore<S> {
    /// The key.
    pub fn key(&self) -> &LockKey {
        &self.key
    }

    /// How many holders it admits at once.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// Takes a permit, waiting up to the locker's wait timeout.
    pub async fn acquire(&self) -> Result<LockGuard, Error> {
        self.acquire_within(self.locker.wait_timeout()).await
    }

    /// Takes a permit if one is free right now ([`Error::Contended`]
    /// otherwise, with the time until the soonest permit's lease ends as
    /// its `retry_after`).
    pub async fn try_acquire(&self) -> Result<LockGuard, Error> {
        self.acquire_within(Duration::ZERO).await
    }

    /// Takes a permit, waiting up to `wait` (0 = try once) as
    /// [`Locker::acquire_within`] waits for a lock: this process's waiters
    /// of the key in turn, woken by the store's release notification (or
    /// a poll bounded by the soonest permit's remaining lease). No permit
    /// by then: [`Error::WaitTimeout`]. Dropping the future at any point is
    /// safe: a permit granted to an attempt whose answer was not received
    /// is released in the background.
    pub async fn acquire_within(&self, wait: Duration) -> Result<LockGuard, Error> {
        let ask = Ask::Permit {
            permits: self.permits,
        };
        match self.locker.take(&self.key, wait, ask).await? {
            Acquired::Locked(guard) => Ok(guard),
            Acquired::Completed(_) => Err(Error::Record {
                key: self.key.clone(),
                reason: "the store answered a permit with a completed record",
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permit_counts_out_of_range_are_refused() {
        assert!(check_permits(0).is_err());
        assert_eq!(check_permits(1).unwrap(), 1);
        assert_eq!(check_permits(MAX_PERMITS).unwrap(), MAX_PERMITS);
        let err = check_permits(MAX_PERMITS + 1).unwrap_err();
        assert_eq!(err.setting(), "permits");
        assert!(check_permits(u32::MAX).is_err());
    }
}
