//! [`MultiGuard`]: several keys held as one, from
//! [`Locker::acquire_all`](crate::Locker::acquire_all).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use super::guard::LockGuard;
use super::hold::Hold;
use super::pending::{EndOp, PendingEnd, trace_release};
use super::reentry;
use crate::error::Error;
use crate::key::LockKey;
use crate::observe;
use crate::store::LockStore;
use crate::token::{FencingToken, Unfenced};

/// Proof that we hold every key of a [`Locker::acquire_all`](crate::Locker::acquire_all),
/// for as long as [`is_held`](MultiGuard::is_held) says so.
///
/// Each key is a lease of its own, the same as a single lock of that key
/// (a [`Locker::acquire`](crate::Locker::acquire) of one of them waits for
/// this guard, and this guard's grant waited for it), with its own fencing
/// token from the key's own counter; they share one owner token and are
/// renewed together by the locker's one watchdog, every lease/3.
///
/// * **Loss**: [`lost()`](MultiGuard::lost) resolves when *any* key is lost
///   (a renewal found another owner, or its validity deadline passed), and
///   [`is_held`](MultiGuard::is_held) turns false: the guard holds all of
///   its keys or it does not count as held.
/// * **Release**: [`release`](MultiGuard::release) gives every key back in
///   one store call (one script on a Redis primary, or where the keys
///   share a Cluster slot); dropping the last clone releases every key in
///   the background and never blocks. A release dropped or failed midway
///   goes on in the background, per key, retried until the store answers.
/// * **Tokens**: [`fencing_tokens`](MultiGuard::fencing_tokens), one per key
///   in the guard's key order (sorted, duplicates removed; see
///   [`keys`](MultiGuard::keys)).
/// * **Re-entry**, in [`scope`](MultiGuard::scope) (the
///   `MultiLockLayer` (feature `axum`) runs its inner service in it): a
///   single [`Locker::acquire`](crate::Locker::acquire) of one of the keys
///   (or a `LockLayer` nested inside on that key) is one more hold of that
///   key's lease, with its fencing token, lost when it is, instead of a
///   wait for this guard; an
///   [`acquire_all`](crate::Locker::acquire_all) of any of them is
///   refused ([`Error::Config`]) as it would wait for itself.
/// * No record: a multi-key hold has no [`finish`](LockGuard::finish) or
///   [`export`](LockGuard::export).
#[derive(Clone)]
#[must_use = "the keys are released as soon as their guard is dropped; keep the guard while the work runs"]
pub struct MultiGuard {
    /// One hold per key, in the guard's key order.
    holds: Arc<[Arc<Hold>]>,
}

impl MultiGuard {
    /// The guard of a fresh grant: one hold per key, in key order.
    pub(crate) fn new(holds: Vec<Arc<Hold>>) -> Self {
        MultiGuard {
            holds: holds.into(),
        }
    }

    /// The holds, one per key in key order.
    pub(crate) fn holds(&self) -> &[Arc<Hold>] {
        &self.holds
    }

    /// Whether `guard` is a hold of one of this guard's leases (a single
    /// acquire that re-entered it). (Only the HTTP layer asks.)
    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    pub(crate) fn has_grant(&self, guard: &LockGuard) -> bool {
        self.holds
            .iter()
            .any(|h| Arc::ptr_eq(h.lease(), guard.lease_state()))
    }

    /// Runs `fut` with every key of this guard registered as held by the
    /// current task, as [`LockGuard::scope`] does for one: a
    /// [`Locker`](crate::Locker) call for one of the keys inside it (through
    /// any locker on the same store or a clone of it) re-enters that key's
    /// lease instead of waiting for this guard. The re-entered
    /// [`LockGuard`] is one more hold of that key's lease: the key's
    /// fencing token, lost when the key is, and the key stays held until
    /// its last hold is given back, this guard's
    /// [`release`](MultiGuard::release) included. (Its
    /// [`finish`](LockGuard::finish) or [`export`](LockGuard::export) ends
    /// the key's lease for this guard too, which then no longer counts as
    /// held.) An [`acquire_all`](crate::Locker::acquire_all) of any of the
    /// keys inside it answers [`Error::Config`]. Tasks spawned from `fut`
    /// are not inside the scope.
    ///
    /// ```
    /// use tower_redis_lock::{LockKey, Locker, MemoryStore};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_redis_lock::Error> {
    /// let locker = Locker::new(MemoryStore::new());
    /// let (a, b) = (LockKey::new("accounts", "A-1")?, LockKey::new("accounts", "B-7")?);
    /// let both = locker.acquire_all(&[a.clone(), b]).await?;
    /// let token = both
    ///     .scope(async {
    ///         // Deep inside the same work: no wait for ourselves.
    ///         let one = locker.acquire(&a).await?;
    ///         assert_eq!(one.hold_count(), 2);
    ///         Ok::<_, tower_redis_lock::Error>(one.fencing_token())
    ///     })
    ///     .await?;
    /// assert_eq!(Some(token), both.fencing_token(&a));
    /// assert!(both.release().await?);
    /// # Ok(())
    /// # }
    /// ```
    pub fn scope<F: Future>(&self, fut: F) -> impl Future<Output = F::Output> {
        reentry::scope_all(self.holds.iter().map(Arc::downgrade), fut)
    }

    /// The keys, in the guard's order: sorted (the fixed global order the
    /// keys are taken in), each once.
    pub fn keys(&self) -> impl ExactSizeIterator<Item = &LockKey> + '_ {
        self.holds.iter().map(|h| h.key())
    }

    /// How many keys the guard holds.
    pub fn len(&self) -> usize {
        self.holds.len()
    }

    /// Always `false`: a guard holds at least one key.
    pub fn is_empty(&self) -> bool {
        self.holds.is_empty()
    }

    /// One fencing token per key, in the order of [`keys`](MultiGuard::keys),
    /// each from its key's own counter ([`Unfenced`] from a store that mints
    /// none).
    pub fn fencing_tokens(&self) -> Vec<Result<FencingToken, Unfenced>> {
        self.holds.iter().map(|h| h.lease().token).collect()
    }

    /// The fencing token of `key`, or `None` if the guard does not hold it.
    pub fn fencing_token(&self, key: &LockKey) -> Option<Result<FencingToken, Unfenced>> {
        self.holds
            .iter()
            .find(|h| h.key() == key)
            .map(|h| h.lease().token)
    }

    /// The lease length the watchdog keeps renewing.
    pub fn lease(&self) -> Duration {
        self.holds
            .first()
            .map_or(Duration::ZERO, |h| h.lease().lease)
    }

    /// When the keys were granted (start of the winning attempt).
    pub fn acquired_at(&self) -> Instant {
        self.holds
            .first()
            .map_or_else(Instant::now, |h| h.lease().acquired_at)
    }

    /// Whether we still hold every key: not released, none lost, and no
    /// key's validity deadline passed.
    pub fn is_held(&self) -> bool {
        self.holds.iter().all(|h| h.is_held())
    }

    /// Whether any key has been lost (as opposed to held or released).
    pub fn is_lost(&self) -> bool {
        self.holds.iter().any(|h| h.lease().expire_if_due())
    }

    /// How long every key is certainly valid from now on: the shortest of
    /// the keys' (zero once one is lost or the guard released).
    pub fn valid_for(&self) -> Duration {
        self.holds
            .iter()
            .map(|h| {
                if h.is_ended() {
                    Duration::ZERO
                } else {
                    h.lease().valid_for()
                }
            })
            .min()
            .unwrap_or(Duration::ZERO)
    }

    /// Resolves once any key is lost. Pends forever while every key is
    /// held, and after a clean release. Cancel-safe; any number of clones
    /// may wait.
    pub async fn lost(&self) {
        let guards: Vec<LockGuard> = self
            .holds
            .iter()
            .map(|h| LockGuard::from_hold(h.clone()))
            .collect();
        let each = guards.iter().map(|g| Box::pin(g.lost()));
        futures_util::future::select_all(each).await;
    }

    /// Renews every key right now, on top of the watchdog. Fails with
    /// [`Error::LockLost`] naming a key we no longer own (that key's lease
    /// flips to lost, and with it the guard).
    pub async fn extend(&self) -> Result<(), Error> {
        let guards: Vec<LockGuard> = self
            .holds
            .iter()
            .map(|h| LockGuard::from_hold(h.clone()))
            .collect();
        let answers = futures_util::future::join_all(guards.iter().map(LockGuard::extend)).await;
        answers.into_iter().collect()
    }

    /// Gives every key back, in one store call
    /// ([`LockStore::release_all`]).
    ///
    /// `Ok(true)` if every key was still ours, `Ok(false)` if any had
    /// expired or been taken over (the others are released all the same),
    /// or the guard was released before through a clone. A key re-entered
    /// in its [`scope`](MultiGuard::scope) whose other hold is not given
    /// back yet is not sent: it stays held for that hold (and counts as
    /// ours while it is valid), and goes with it. An `Err` (the store did
    /// not answer) leaves no key to its lease: each is released in the
    /// background, retried until the store answers or its lease is over;
    /// dropping the future before the answer does the same.
    pub async fn release(self) -> Result<bool, Error> {
        // Renewal stops for every key before anything is sent.
        let mut ours = Vec::with_capacity(self.holds.len());
        let mut all = true;
        for h in self.holds.iter() {
            match h.end_hold() {
                Some(true) if h.stop_renewal() => ours.push(h),
                // Re-entered: held on for the other hold, which ends it.
                Some(false) => all &= h.lease().is_valid_now(),
                _ => all = false,
            }
        }
        let Some(first) = ours.first() else {
            return Ok(all);
        };
        let mut pending: Vec<PendingEnd<'_>> = ours
            .iter()
            .map(|h| PendingEnd::arm(&h.end, EndOp::Release))
            .collect();
        let keys: Vec<LockKey> = ours.iter().map(|h| h.key().clone()).collect();
        let owner = &first.lease().owner;
        let span = first.lease().release_span("release");
        let res = first
            .end
            .store
            .release_all(&keys, owner)
            .instrument(span.clone())
            .await;
        match res {
            Ok(owned) => {
                for ((p, h), owned) in pending.iter_mut().zip(&ours).zip(&owned) {
                    p.disarm();
                    span.in_scope(|| trace_release(h.lease(), &Ok(*owned)));
                    h.end.local.wake(h.key());
                }
                Ok(all && owned.len() == ours.len() && owned.iter().all(|o| *o))
            }
            Err(e) => {
                span.in_scope(|| {
                    observe::store_error(&e);
                    tracing::warn!(
                        keys = keys.len(),
                        error = %crate::error::Chain(&e),
                        "releasing the keys failed; retrying in the background"
                    );
                });
                // The error goes to the caller; each key is released in
                // the background until the store answers or its lease is
                // over.
                for p in pending {
                    p.retry_later();
                }
                Err(e)
            }
        }
    }
}

impl fmt::Debug for MultiGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiGuard")
            .field("keys", &self.keys().collect::<Vec<_>>())
            .field("fencing_tokens", &self.fencing_tokens())
            .field("held", &self.is_held())
            .field("valid_for", &self.valid_for())
            .finish_non_exhaustive()
    }
}
