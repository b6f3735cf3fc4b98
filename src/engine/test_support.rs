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
    Arc::new(Lease::new(
        0,
        key.clone(),
        owner,
        token,
        lease,
        drift(lease),
        start,
        max_hold,
    ))
}
