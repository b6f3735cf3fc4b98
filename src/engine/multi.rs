//! [`Locker::acquire_all`]: several keys, all or nothing, and its wait
//! loop (woken by the release of any key it waits on).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{Instrument, Span};

use super::hold::Hold;
use super::lease::Lease;
use super::locker::Locker;
use super::multi_guard::MultiGuard;
use super::pending::{Ending, PendingAttempt, UndoOf};
use super::reentry;
use crate::error::{ConfigError, Error};
use crate::key::LockKey;
use crate::observe::{self, Outcome};
use crate::store::{AcquireAllOutcome, LeaseKind, LockStore};
use crate::time::{drift, far_add};
use crate::token::OwnerToken;

/// The most keys one [`Locker::acquire_all`] takes: longer lists are
/// refused before any store call (every key is a lease to renew, and on
/// Redis one script holds the server for all of them).
pub(crate) const MAX_KEYS: usize = 64;

/// `keys` in the fixed global order (sorted by their `namespace:id`, the
/// same in every process), each once; or why the list is refused: empty,
/// or more than [`MAX_KEYS`] entries (duplicates counted).
pub(crate) fn check_keys(keys: &[LockKey]) -> Result<Vec<LockKey>, ConfigError> {
    if keys.is_empty() {
        return Err(ConfigError::new(
            "keys",
            "acquire_all needs at least one key",
        ));
    }
    if keys.len() > MAX_KEYS {
        return Err(ConfigError::new(
            "keys",
            format!("at most {MAX_KEYS} keys at once, got {}", keys.len()),
        ));
    }
    let mut sorted = keys.to_vec();
    sorted.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    sorted.dedup();
    Ok(sorted)
}

/// What one try found.
enum Step {
    Done(MultiGuard),
    /// The key at this index is held, for about this long.
    Held(usize, Option<Duration>),
}

impl<S: LockStore> Locker<S> {
    /// Takes every key of `keys`, or none, waiting up to the configured
    /// wait timeout. See [`acquire_all_within`](Locker::acquire_all_within).
    pub async fn acquire_all(&self, keys: &[LockKey]) -> Result<MultiGuard, Error> {
        self.acquire_all_within(keys, self.inner.opts.wait).await
    }

    /// Takes every key of `keys` if all are free right now
    /// ([`Error::Contended`] naming a held key otherwise); takes none if
    /// any is held.
    pub async fn try_acquire_all(&self, keys: &[LockKey]) -> Result<MultiGuard, Error> {
        self.acquire_all_within(keys, Duration::ZERO).await
    }

    /// Takes every key of `keys`, or none, waiting up to `wait` (0 = try
    /// once): all or nothing, never a part of them held while waiting.
    ///
    /// * **The list**: 1 to 64 entries, else [`Error::Config`] before any
    ///   store call. Duplicates are taken once. The keys are taken in one
    ///   fixed global order, sorted by `namespace:id` (the guard's
    ///   [`keys`](MultiGuard::keys) are in that order), whatever order
    ///   they are given in.
    /// * **How**: one atomic step where the store keeps the keys in one
    ///   place (the memory store; a Redis primary or Sentinel; a Cluster
    ///   when the keys share a slot: give them one namespace and ids whose
    ///   names hash alike, or see [`LockStore::grant_all`]); otherwise
    ///   (a Cluster across slots, [`RedlockStore`](crate::RedlockStore)) the
    ///   keys one by one in the fixed order, the ones taken given back when
    ///   one is found held. Either way two callers asking for `{a, b}` and
    ///   `{b, a}` cannot deadlock: nobody waits while holding a part.
    /// * **Waiting**: try; subscribe to the release notifications of every
    ///   key; try again before every wait. A release of any of the keys
    ///   wakes the waiter (and a jittered poll bounded by the held key's
    ///   remaining lease covers expiry). Unlike a single lock, waiters of a
    ///   key list do not queue behind this process's other waiters.
    /// * **Contention**: [`Error::Contended`] (try) or [`Error::WaitTimeout`]
    ///   naming a key found held, with its remaining lease as
    ///   `retry_after`.
    /// * **Cancellation**: dropping the future at any point is safe: every
    ///   key of an attempt whose answer was not received is released in the
    ///   background, owner-checked.
    /// * **Re-entry**: none for a list. Asked inside the
    ///   [`scope`](crate::LockGuard::scope) of one of its keys (a lock's,
    ///   or a [`MultiGuard`]'s) it would wait for itself, so it answers
    ///   [`Error::Config`] at once. The other way round, a single acquire
    ///   of one of the keys inside [`MultiGuard::scope`] re-enters that
    ///   key's lease.
    ///
    /// ```
    /// use tower_redis_lock::{LockKey, Locker, MemoryStore};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_redis_lock::Error> {
    /// let locker = Locker::new(MemoryStore::new());
    /// let (from, to) = (LockKey::new("accounts", "A-1")?, LockKey::new("accounts", "B-7")?);
    /// let both = locker.acquire_all(&[to.clone(), from.clone()]).await?;
    /// // Sorted: the guard's order is the same whatever order was asked.
    /// assert_eq!(both.keys().collect::<Vec<_>>(), [&from, &to]);
    /// assert!(locker.try_acquire(&from).await.unwrap_err().is_contended());
    /// assert!(both.release().await?);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn acquire_all_within(
        &self,
        keys: &[LockKey],
        wait: Duration,
    ) -> Result<MultiGuard, Error> {
        let keys = check_keys(keys)?;
        let store = self.store_id();
        if let Some(key) = keys
            .iter()
            .find(|k| reentry::held_by_task(k, LeaseKind::Lock, store).is_some())
        {
            return Err(Error::Config(ConfigError::new(
                "keys",
                format!(
                    "acquire_all inside a hold of {key} (LockGuard::scope) would wait for itself; \
                     take every key in one acquire_all"
                ),
            )));
        }
        let span = observe::acquire_span(&keys[0], LeaseKind::Lock, wait);
        let res = self.take_all(&keys, wait).instrument(span).await;
        self.inner.recovery.saw(&res);
        if let Ok(guard) = &res {
            for h in guard.holds() {
                h.lease().hold_started();
            }
        }
        res
    }

    async fn take_all(&self, keys: &[LockKey], wait: Duration) -> Result<MultiGuard, Error> {
        let start = Instant::now();
        let deadline = far_add(start, wait);
        let mut attempts = 1u32;
        let (mut index, mut remaining) = match self.attempt_all(keys, start, false).await? {
            Step::Done(guard) => return Ok(guard),
            Step::Held(index, r) => (index, r),
        };
        if Instant::now() >= deadline {
            return Err(self.contended(
                (&keys[index], LeaseKind::Lock),
                wait,
                start,
                attempts,
                remaining,
            ));
        }
        // Subscribed to every key, then try again before every wait: a
        // release between a try and the wait is never missed.
        let subscribe = futures_util::future::join_all(keys.iter().map(|k| self.subscribe(k)));
        let Ok(mut watches) = tokio::time::timeout_at(deadline, subscribe).await else {
            return Err(self.contended(
                (&keys[index], LeaseKind::Lock),
                wait,
                start,
                attempts,
                remaining,
            ));
        };
        loop {
            attempts += 1;
            let attempt = self.attempt_all(keys, start, true);
            match tokio::time::timeout_at(deadline, attempt).await {
                Ok(Ok(Step::Done(guard))) => {
                    tracing::trace!(attempts, "keys acquired after waiting");
                    return Ok(guard);
                }
                Ok(Ok(Step::Held(i, r))) => (index, remaining) = (i, r),
                Ok(Err(e)) => return Err(e),
                Err(_) => {
                    return Err(self.contended(
                        (&keys[index], LeaseKind::Lock),
                        wait,
                        start,
                        attempts,
                        remaining,
                    ));
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(self.contended(
                    (&keys[index], LeaseKind::Lock),
                    wait,
                    start,
                    attempts,
                    remaining,
                ));
            }
            let poll = self.inner.opts.poll;
            let cap = remaining.map_or(poll, |r| poll.min(r + Duration::from_millis(1)));
            // Jitter in [cap/2, cap] so waiters do not poll in lockstep.
            let nap = (cap / 2).saturating_add((cap / 2).mul_f64(fastrand::f64()));
            let wake = far_add(now, nap).min(deadline);
            let any_release = futures_util::future::select_all(
                watches.iter_mut().map(|w| Box::pin(w.released())),
            );
            tokio::select! {
                _ = any_release => {}
                _ = tokio::time::sleep_until(wake) => {}
            }
        }
    }

    /// One try at the store for every key.
    async fn attempt_all(
        &self,
        keys: &[LockKey],
        start: Instant,
        contended: bool,
    ) -> Result<Step, Error> {
        let o = &self.inner.opts;
        let store = &self.inner.store;
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            Error::Config(ConfigError::new(
                "runtime",
                "locks must be taken inside a Tokio runtime",
            ))
        })?;
        // A fresh owner per attempt, shared by its keys (see `attempt`).
        let owner = &OwnerToken::generate();
        let attempt_start = Instant::now();
        let first = o.max_hold.map_or(o.lease, |cap| o.lease.min(cap));
        // On an error or a drop before the answer, any key may have been
        // granted: each is released in the background, owner-checked.
        let recovery = &self.inner.recovery;
        let pending: Vec<_> = keys
            .iter()
            .map(|k| {
                PendingAttempt::new(recovery, UndoOf::Grant(LeaseKind::Lock, k, owner), &runtime)
            })
            .collect();
        let answer = match store.grant_all(keys, owner, first, o.label.as_ref()).await {
            Ok(answer) => answer,
            Err(e) => {
                pending.into_iter().for_each(PendingAttempt::failed);
                return Err(e);
            }
        };
        let tokens = match answer {
            AcquireAllOutcome::Held { index, remaining } if index < keys.len() => {
                pending.into_iter().for_each(PendingAttempt::disarm);
                return Ok(Step::Held(index, remaining));
            }
            AcquireAllOutcome::Granted(tokens) if tokens.len() == keys.len() => tokens,
            other => {
                return Err(Error::Unavailable {
                    op: crate::error::Operation::Acquire,
                    key: keys.first().cloned(),
                    source: format!("the store answered acquire_all with {other:?}").into(),
                });
            }
        };
        pending.into_iter().for_each(PendingAttempt::disarm);
        let watchdog = self.watchdog(&runtime);
        let holds = keys
            .iter()
            .zip(tokens)
            .map(|(key, token)| {
                let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
                let lease = Arc::new(Lease::new(
                    id,
                    (key.clone(), LeaseKind::Lock),
                    owner.clone(),
                    token,
                    o.lease,
                    drift(o.lease),
                    attempt_start,
                    o.max_hold,
                ));
                watchdog.add(lease.clone());
                let end = Ending {
                    lease,
                    store: self.inner.erased.clone(),
                    recovery: self.inner.recovery.clone(),
                    local: self.queues(LeaseKind::Lock).clone(),
                    runtime: Some(runtime.clone()),
                };
                Arc::new(Hold::new(end, watchdog.clone()))
            })
            .collect();
        let guard = MultiGuard::new(holds);
        tracing::debug!(
            keys = keys.len(),
            waited_us = start.elapsed().as_micros() as u64,
            contended,
            "keys acquired"
        );
        let granted = Ok(Outcome::Granted(None));
        observe::acquired(
            &Span::current(),
            (&keys[0], LeaseKind::Lock),
            start.elapsed(),
            contended,
            &granted,
        );
        Ok(Step::Done(guard))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::MemoryStore;

    fn key(id: &str) -> LockKey {
        LockKey::new("multi", id).unwrap()
    }

    #[test]
    fn a_key_list_is_sorted_deduplicated_and_bounded() {
        let got = check_keys(&[key("b"), key("a"), key("b")]).unwrap();
        assert_eq!(got, [key("a"), key("b")]);
        assert_eq!(check_keys(&[]).unwrap_err().setting(), "keys");
        let many: Vec<LockKey> = (0..=MAX_KEYS).map(|i| key(&i.to_string())).collect();
        assert!(check_keys(&many[..MAX_KEYS]).is_ok());
        let err = check_keys(&many).unwrap_err();
        assert!(err.to_string().contains("at most 64 keys"), "{err}");
        // Duplicates count against the bound: the list is refused before
        // any work on it.
        let same = vec![key("x"); MAX_KEYS + 1];
        assert!(check_keys(&same).is_err());
    }

    fn locker(store: &MemoryStore, wait: Duration) -> Locker<MemoryStore> {
        Locker::builder(store.clone())
            .lease(Duration::from_secs(30))
            .wait_timeout(wait)
            .build()
            .unwrap()
    }

    /// On a paused clock: a waiter of [a, b] while another holds b is
    /// granted both when b is released (its own try does not run before:
    /// the poll is bounded by the holder's 30 s lease), and one that
    /// stays refused answers `WaitTimeout` at its deadline, holding nothing.
    #[tokio::test(start_paused = true)]
    async fn a_waiter_gets_every_key_once_the_held_one_is_released() {
        let store = MemoryStore::new();
        let holder = locker(&store, Duration::ZERO);
        let waiter = locker(&store, Duration::from_secs(10));
        let (a, b) = (key("wait-a"), key("wait-b"));
        let held = holder.try_acquire(&b).await.unwrap();
        let start = Instant::now();
        let timed_out = waiter
            .acquire_all_within(&[a.clone(), b.clone()], Duration::from_secs(2))
            .await
            .unwrap_err();
        assert!(
            matches!(&timed_out, Error::WaitTimeout { key, .. } if *key == b),
            "{timed_out:?}"
        );
        assert_eq!(start.elapsed(), Duration::from_secs(2));
        assert!(!store.is_locked(&a), "a part was left held");

        let both = {
            let (waiter, keys) = (waiter.clone(), [a.clone(), b.clone()]);
            tokio::spawn(async move { waiter.acquire_all(&keys).await })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!both.is_finished() && !store.is_locked(&a));
        held.release().await.unwrap();
        let both = both.await.unwrap().unwrap();
        assert!(
            start.elapsed() < Duration::from_secs(4),
            "{:?}",
            start.elapsed()
        );
        assert!(store.is_locked(&a) && store.is_locked(&b));
        assert!(both.release().await.unwrap());
        assert_eq!(store.held_count(), 0);
    }

    /// Inside the scope of a lock of one of its keys, a list would wait
    /// for itself: refused at once, nothing taken.
    #[tokio::test(start_paused = true)]
    async fn a_list_inside_the_scope_of_one_of_its_keys_is_refused() {
        let store = MemoryStore::new();
        let l = locker(&store, Duration::from_secs(10));
        let (a, b) = (key("scope-a"), key("scope-b"));
        let outer = l.try_acquire(&a).await.unwrap();
        let err = outer
            .scope(l.acquire_all(&[a.clone(), b.clone()]))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, Error::Config(e) if e.setting() == "keys"),
            "{err:?}"
        );
        assert!(!store.is_locked(&b));
        // Outside the scope it is an ordinary wait for `a`.
        let err = l
            .acquire_all_within(&[a, b.clone()], Duration::from_millis(100))
            .await
            .unwrap_err();
        assert!(err.is_contended(), "{err:?}");
    }
}
