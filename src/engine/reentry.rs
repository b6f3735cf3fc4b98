//! Task-local re-entry: the holds the current task runs under, so that a
//! [`Locker`](crate::Locker) call for a key the task already holds answers
//! one more hold instead of waiting for itself.

use std::future::Future;
use std::sync::{Arc, Weak};

use super::hold::Hold;
use crate::key::LockKey;
use crate::store::LeaseKind;

tokio::task_local! {
    /// The holds a task runs under (innermost last): see
    /// [`LockGuard::scope`](crate::LockGuard::scope).
    static TASK_HOLDS: Arc<[Weak<Hold>]>;
}

/// A hold of `key` of `kind` (the lock, or a permit), granted by `store`,
/// that the current task runs under and that is still held (innermost
/// first).
pub(crate) fn held_by_task(key: &LockKey, kind: LeaseKind, store: usize) -> Option<Arc<Hold>> {
    TASK_HOLDS
        .try_with(|held| {
            held.iter().rev().find_map(|w| {
                let hold = w.upgrade()?;
                (hold.key() == key
                    && hold.lease().kind == kind
                    && hold.is_from(store)
                    && hold.is_held())
                .then_some(hold)
            })
        })
        .ok()
        .flatten()
}

/// Runs `fut` with `hold` added to the current task's holds.
pub(crate) fn scope<F: Future>(hold: Weak<Hold>, fut: F) -> impl Future<Output = F::Output> {
    scope_all([hold], fut)
}

/// Runs `fut` with `holds` (a multi-key grant's, one per key) added to the
/// current task's holds.
pub(crate) fn scope_all<F: Future>(
    holds: impl IntoIterator<Item = Weak<Hold>>,
    fut: F,
) -> impl Future<Output = F::Output> {
    // Usually the first holds of the task: one allocation, no copy.
    let held: Arc<[Weak<Hold>]> = match TASK_HOLDS.try_with(Arc::clone) {
        Ok(outer) => outer.iter().cloned().chain(holds).collect(),
        Err(_) => holds.into_iter().collect(),
    };
    TASK_HOLDS.scope(held, fut)
}
