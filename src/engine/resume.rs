//! [`Locker::resume`]: going on holding a lock another guard exported,
//! once the store has confirmed it is still ours.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::time::Instant;

use super::exported::ExportedLease;
use super::guard::LockGuard;
use super::lease::Lease;
use super::locker::Locker;
use super::pending::{Ending, PendingAttempt, UndoOf};
use crate::error::{ConfigError, Error};
use crate::store::{LeaseKind, LockStore};
use crate::time::drift;
use crate::token::{FencingToken, OwnerToken};

impl<S: LockStore> Locker<S> {
    /// Goes on holding a lock another guard [exported](LockGuard::export)
    /// (in this process or another, through any locker on the same store):
    /// renews it at once, owner-checked, and answers a guard that this
    /// locker's watchdog keeps renewing, that can
    /// [`finish`](LockGuard::finish) or [`release`](LockGuard::release) it,
    /// and whose [`lost`](LockGuard::lost) resolves if it is lost — the
    /// guard of the original grant, with its fencing token (like
    /// redis-semaphore's `acquiredExternally`).
    ///
    /// The lock is taken up under an owner token of this guard's own, in
    /// one owner-checked step ([`LockStore::transfer`]): the exported token
    /// stops working, so an export is taken up once. A lease that already
    /// lapsed, that another holder has taken since, or that was resumed
    /// already (a job queue that delivers twice) is [`Error::LockLost`],
    /// never a guard that does not hold the lock: the answer is the
    /// store's. A store that does not answer is its error
    /// ([`Error::Unavailable`]); the lock is then left to its lease, so a
    /// retry of `resume` can still find it: a hand-off the store carries
    /// out after the call gave up (a frozen server that resumes), or after
    /// its future was dropped, is handed back to the exported token,
    /// owner-checked, once the store answers.
    ///
    /// The resumed lease is renewed for the exported lease length, and
    /// this locker's hold cap, if any, counts from the resume.
    pub async fn resume(&self, lease: ExportedLease) -> Result<LockGuard, Error> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            Error::Config(ConfigError::new(
                "runtime",
                "locks must be resumed inside a Tokio runtime",
            ))
        })?;
        let ExportedLease {
            key,
            owner,
            token,
            lease: length,
            ..
        } = lease;
        let o = &self.inner.opts;
        let started = Instant::now();
        let first = o.max_hold.map_or(length, |cap| length.min(cap));
        // Taken up under an owner token of its own, in one owner-checked
        // step: the exported token stops working, so a second resume of the
        // same export (a job delivered twice) finds the lock gone.
        let exported = owner;
        let owner = OwnerToken::generate();
        // Cut short or failed, the hand-off may still happen (a frozen
        // server runs it when it resumes): it is handed back then, so that
        // a retry of the resume finds the lease where it was.
        let undo = UndoOf::HandBack {
            key: &key,
            taker: &owner,
            exporter: &exported,
            lease: first,
        };
        let pending = PendingAttempt::new(&self.inner.recovery, undo, &runtime);
        let handed = match self
            .inner
            .store
            .transfer(&key, &exported, &owner, first)
            .await
        {
            Ok(handed) => handed,
            Err(e) => {
                pending.failed();
                return Err(e);
            }
        };
        pending.disarm();
        if !handed {
            tracing::debug!(
                key = %key,
                "resume refused: the exported lease lapsed, was taken over or was resumed already"
            );
            return Err(Error::LockLost { key });
        }
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let lease = Arc::new(Lease::new(
            id,
            (key, LeaseKind::Lock),
            owner,
            token,
            length,
            drift(length),
            started,
            o.max_hold,
        ));
        let watchdog = self.watchdog(&runtime);
        watchdog.add(lease.clone());
        tracing::debug!(
            key = %lease.key,
            fencing_token = token.ok().map(FencingToken::get),
            "exported lock resumed"
        );
        lease.hold_started();
        let end = Ending {
            lease,
            store: self.inner.erased.clone(),
            recovery: self.inner.recovery.clone(),
            local: self.inner.queues.clone(),
            runtime: Some(runtime),
        };
        Ok(LockGuard::new(end, watchdog))
    }
}
