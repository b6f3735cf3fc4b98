//! What the replica and failover tests take on a key: its lock, or every
//! permit of its semaphore. Written once, so that each failover test runs
//! for both kinds and counts holders the same way: at most `capacity` per
//! key while their leases are valid.

use tower_redis_lock::{Error, LockGuard, LockKey, LockStore, Locker};

/// A lease kind and how many holders a key may have of it.
#[derive(Debug, Clone, Copy)]
pub enum Take {
    /// The key's lock: one holder.
    Lock,
    /// The key's semaphore of this many permits.
    Permits(u32),
}

impl Take {
    /// Holders a key may have at once.
    pub fn capacity(self) -> usize {
        match self {
            Take::Lock => 1,
            Take::Permits(n) => n as usize,
        }
    }

    /// One try (wait 0) at one lease of `k`.
    pub async fn one<S: LockStore>(self, l: &Locker<S>, k: &LockKey) -> Result<LockGuard, Error> {
        match self {
            Take::Lock => l.try_acquire(k).await,
            Take::Permits(n) => l.semaphore(k, n)?.try_acquire().await,
        }
    }

    /// [`capacity`](Take::capacity) tries at `k`: the guards granted, and
    /// the errors of the others.
    pub async fn all<S: LockStore>(
        self,
        l: &Locker<S>,
        k: &LockKey,
    ) -> (Vec<LockGuard>, Vec<Error>) {
        let (mut granted, mut refused) = (Vec::new(), Vec::new());
        for _ in 0..self.capacity() {
            match self.one(l, k).await {
                Ok(g) => granted.push(g),
                Err(e) => refused.push(e),
            }
        }
        (granted, refused)
    }

    /// The store's name of what this kind writes for `id` (see
    /// `support::stores::redis_name`).
    pub fn suffix(self) -> &'static str {
        match self {
            Take::Lock => "lock",
            Take::Permits(_) => "permits",
        }
    }
}
