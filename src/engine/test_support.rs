//! Helpers for the engine's unit tests (compiled for tests only).

use crate::store::LockStoreExt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::lease::Lease;
use crate::key::LockKey;
use crate::store::memory::MemoryStore;
use crate::store::{AcquireOutcome, LockStore};
use crate::time::drift;
use crate::token::OwnerToken;

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
        (key.clone(), crate::store::LeaseKind::Lock),
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
    /// While set, every renewal panics (a store with a bug).
    pub(crate) panic_extends: std::sync::atomic::AtomicBool,
    /// While true, renewals hang, and answer once it is false again (a
    /// frozen server that thaws).
    pub(crate) stall_extends: tokio::sync::watch::Sender<bool>,
    /// Renewals sent per key.
    pub(crate) extends_of: std::sync::Mutex<std::collections::HashMap<LockKey, usize>>,
    /// While set, every release and record read fails at once (a store
    /// that is down; its default check reads a record).
    pub(crate) down: std::sync::atomic::AtomicBool,
    /// While set, every release fails although the store answers (the
    /// key's own error, such as a key of the wrong type).
    pub(crate) refuse_releases: std::sync::atomic::AtomicBool,
    /// Releases that reached the store (refused as the key's own error or
    /// answered).
    pub(crate) releases: std::sync::atomic::AtomicUsize,
    /// Releases and record reads asked, answered or not.
    pub(crate) calls: std::sync::atomic::AtomicUsize,
}

impl Counting {
    pub(crate) fn acquires(&self) -> usize {
        self.acquires.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub(crate) fn extends(&self) -> usize {
        self.extends.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub(crate) fn extends_of(&self, key: &LockKey) -> usize {
        let counts = self.extends_of.lock().unwrap();
        counts.get(key).copied().unwrap_or(0)
    }

    pub(crate) fn stall(&self, on: bool) {
        self.stall_extends.send_replace(on);
    }
}

impl Counting {
    /// Counts a release or read; fails it while the store is `down`.
    fn reach(&self, op: crate::error::Operation) -> Result<(), crate::error::Error> {
        use std::sync::atomic::Ordering::SeqCst;
        self.calls.fetch_add(1, SeqCst);
        if self.down.load(SeqCst) {
            return Err(crate::error::Error::Unavailable {
                op,
                key: None,
                source: "test: the store is down".into(),
            });
        }
        Ok(())
    }

    fn count_extend(&self, key: &LockKey) {
        self.extends
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        *self
            .extends_of
            .lock()
            .unwrap()
            .entry(key.clone())
            .or_default() += 1;
    }

    /// A renewal, once counted: panics, stalls or fails as told.
    async fn extend_counted(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        lease: Duration,
    ) -> Result<bool, crate::error::Error> {
        if self.panic_extends.load(std::sync::atomic::Ordering::SeqCst) {
            panic!("test: the store panics while renewing");
        }
        let _ = self.stall_extends.subscribe().wait_for(|s| !s).await;
        if self.fail_extends.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(crate::error::Error::Unavailable {
                op: crate::error::Operation::Extend,
                key: Some(key.clone()),
                source: "test: the store refuses at once".into(),
            });
        }
        self.inner
            .renew(crate::store::LeaseKind::Lock, key, owner, lease)
            .await
    }
}

impl LockStore for Counting {
    async fn grant(
        &self,
        grant: crate::store::Grant<'_>,
    ) -> Result<AcquireOutcome, crate::error::Error> {
        self.acquires
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.grant(grant).await
    }

    async fn renew(
        &self,
        _kind: crate::store::LeaseKind,
        key: &LockKey,
        owner: &OwnerToken,
        lease: Duration,
    ) -> Result<bool, crate::error::Error> {
        self.count_extend(key);
        self.extend_counted(key, owner, lease).await
    }

    /// Every renewal of the batch counts as sent at once, as over Redis
    /// (one pipelined write), before any of them stalls.
    async fn renew_many(
        &self,
        renewals: &[crate::store::Renewal],
    ) -> Vec<Result<bool, crate::error::Error>> {
        for r in renewals {
            self.count_extend(&r.key);
        }
        let mut out = Vec::with_capacity(renewals.len());
        for r in renewals {
            out.push(self.extend_counted(&r.key, &r.owner, r.lease).await);
        }
        out
    }

    async fn release(
        &self,
        kind: crate::store::LeaseKind,
        key: &LockKey,
        owner: &OwnerToken,
    ) -> Result<bool, crate::error::Error> {
        use std::sync::atomic::Ordering::SeqCst;
        self.reach(crate::error::Operation::Release)?;
        self.releases.fetch_add(1, SeqCst);
        if self.refuse_releases.load(SeqCst) {
            return Err(crate::error::Error::Unavailable {
                op: crate::error::Operation::Release,
                key: Some(key.clone()),
                source: "test: WRONGTYPE".into(),
            });
        }
        self.inner.release(kind, key, owner).await
    }

    async fn finish(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        record: bytes::Bytes,
        retention: Duration,
    ) -> Result<bool, crate::error::Error> {
        self.inner.finish(key, owner, record, retention).await
    }

    async fn read_record(
        &self,
        key: &LockKey,
    ) -> Result<Option<bytes::Bytes>, crate::error::Error> {
        self.reach(crate::error::Operation::Connect)?;
        self.inner.read_record(key).await
    }

    async fn subscribe(
        &self,
        key: &LockKey,
    ) -> Result<crate::store::ReleaseWatch, crate::error::Error> {
        self.inner.subscribe(key).await
    }
}
