//! Helpers for the engine's unit tests (compiled for tests only).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::lease::Lease;
use crate::store::{AcquireOutcome, LockStore};
use crate::time::drift;
use crate::{LockKey, MemoryStore, OwnerToken};

pub(crate) fn key(id: &str) -> LockKey {
    LockKey::new("unit", id).unwrap()
}

/// Takes `key` in `store` and returns its lease state, granted now.
pub(crate) async fn grant(
    store: &MemoryStore,
    key: &LockKey,
    lease: Duration,
    max_hold: Option<Duration>,
) -> Arc<Lease> {
    let owner = OwnerToken::generate();
    let start = Instant::now();
    // As the locker does: a hold cap shorter than the lease shortens the grant.
    let first = max_hold.map_or(lease, |cap| lease.min(cap));
    let AcquireOutcome::Granted(token) = store.acquire(key, &owner, first).await.unwrap() else {
        panic!("{key} is held");
    };
    // Distinct ids, as the locker gives them (the watchdog keys on them).
    static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    Arc::new(Lease::new(
        NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        key.clone(),
        owner,
        Ok(token),
        lease,
        drift(lease),
        start,
        max_hold,
    ))
}

/// A [`MemoryStore`] that counts the acquires and renewals it is sent.
#[derive(Default)]
pub(crate) struct Counting {
    pub(crate) inner: MemoryStore,
    pub(crate) extends: std::sync::atomic::AtomicUsize,
    pub(crate) acquires: std::sync::atomic::AtomicUsize,
    /// While set, every renewal fails at once (a store that is down and
    /// refuses connections).
    pub(crate) fail_extends: std::sync::atomic::AtomicBool,
}

impl Counting {
    pub(crate) fn acquires(&self) -> usize {
        self.acquires.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub(crate) fn extends(&self) -> usize {
        self.extends.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl LockStore for Counting {
    async fn acquire(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        lease: Duration,
    ) -> Result<AcquireOutcome, crate::Error> {
        self.acquires
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.acquire(key, owner, lease).await
    }

    async fn extend(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        lease: Duration,
    ) -> Result<bool, crate::Error> {
        self.extends
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if self.fail_extends.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(crate::Error::Unavailable {
                op: crate::Operation::Extend,
                key: Some(key.clone()),
                source: "test: the store refuses at once".into(),
            });
        }
        self.inner.extend(key, owner, lease).await
    }

    async fn release(&self, key: &LockKey, owner: &OwnerToken) -> Result<bool, crate::Error> {
        self.inner.release(key, owner).await
    }

    async fn finish(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        record: bytes::Bytes,
        retention: Duration,
    ) -> Result<bool, crate::Error> {
        self.inner.finish(key, owner, record, retention).await
    }

    async fn read_record(&self, key: &LockKey) -> Result<Option<bytes::Bytes>, crate::Error> {
        self.inner.read_record(key).await
    }

    async fn subscribe(&self, key: &LockKey) -> Result<crate::ReleaseWatch, crate::Error> {
        self.inner.subscribe(key).await
    }
}
