//! The wait loop: try, queue behind this process's waiters, subscribe to
//! release notifications, try again before every wait; and one try at the
//! store.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{Instrument, Span};

use super::guard::LockGuard;
use super::lease::{Ask, Lease};
use super::locker::{Acquired, Locker};
use super::options::Options;
use super::pending::{Ending, PendingAttempt, UndoOf};
use super::reentry;
use crate::error::Error;
use crate::error::{Chain, ConfigError};
use crate::key::LockKey;
use crate::observe::{self, Outcome};
use crate::store::{AcquireOutcome, Grant, LeaseKind, LockStore, ReleaseWatch};
use crate::time::{drift, far_add};
use crate::token::{OwnerToken, Unfenced};

/// What one try found.
enum Step {
    Done(Acquired),
    Held(Option<Duration>),
}

/// The tries of one acquire, and what they found.
struct Tries<'a> {
    key: &'a LockKey,
    ask: Ask,
    start: Instant,
    deadline: Instant,
    /// Tries sent.
    count: u32,
    /// What the last try found left of the holder's lease.
    remaining: Option<Duration>,
    /// A waiting writer's mark (`None` for any other ask).
    mark: Option<Mark>,
}

/// When a waiting writer's mark must be renewed. Each try writes it for
/// what it asks the store for (`Options::first_lease`: the lease, or the
/// hold cap if shorter), not for the lease: it is renewed at a third of
/// that, on every path of the wait (napping, waiting for this process's
/// turn, subscribing), as a lease is renewed at a third of its own.
struct Mark {
    every: Duration,
    /// When the next try must start (`None` before the first).
    due: Option<Instant>,
}

impl Mark {
    fn of(ask: Ask, o: &Options) -> Option<Mark> {
        matches!(ask, Ask::Write { waiter: Some(_) }).then(|| Mark {
            every: o.first_lease() / 3,
            due: None,
        })
    }
}

/// How a part of the wait that asks the store nothing ended (see
/// `Locker::keeping_mark`).
enum Kept<T> {
    /// It ended with this.
    Done(T),
    /// A try that renewed the mark on the way was granted.
    Acquired(Acquired),
    /// The deadline passed.
    TimedOut,
}

impl<S: LockStore> Locker<S> {
    pub(crate) async fn take(
        &self,
        key: &LockKey,
        wait: Duration,
        ask: Ask,
    ) -> Result<Acquired, Error> {
        let span = observe::acquire_span(key, ask.kind(), wait);
        let start = Instant::now();
        let res = self
            .take_in_span(key, wait, ask)
            .instrument(span.clone())
            .await;
        // A re-entry asked the store nothing: it says nothing of its health.
        if !matches!(&res, Ok(Acquired::Locked(g)) if g.hold_count() > 1) {
            self.inner.recovery.saw(&res);
        }
        match &res {
            // (Granted, completed and refused are recorded where they happen.)
            Ok(Acquired::Locked(guard)) => guard.lease_state().hold_started(),
            Err(e) if !e.is_contended() => {
                observe::acquired(&span, (key, ask.kind()), start.elapsed(), false, &Err(e));
            }
            _ => {}
        }
        res
    }

    async fn take_in_span(
        &self,
        key: &LockKey,
        wait: Duration,
        ask: Ask,
    ) -> Result<Acquired, Error> {
        let kind = ask.kind();
        // The task already runs under this very lock (a nested call in the
        // same work): one more hold, not a wait for ourselves.
        if let Some(outer) = reentry::held_by_task(key, kind, self.store_id())
            && let Ok(again) = LockGuard::from_hold(outer).reenter()
        {
            tracing::trace!(key = %key, holds = again.hold_count(), "lock re-entered");
            observe::acquired(
                &Span::current(),
                (key, kind),
                Duration::ZERO,
                false,
                &Ok(Outcome::Reentered),
            );
            return Ok(Acquired::Locked(again));
        }
        let o = &self.inner.opts;
        let start = Instant::now();
        let mut t = Tries {
            key,
            ask,
            start,
            // (A wait of `Duration::MAX` means "for ever", not an overflow.)
            deadline: far_add(start, wait),
            count: 0,
            remaining: None,
            mark: Mark::of(ask, o),
        };
        let deadline = t.deadline;

        // Other tasks of this process already waiting for the key go first:
        // a new (or just-released) acquirer that means to wait queues behind
        // them instead of barging in.
        let queues = self.queues(kind);
        let queue_first = !wait.is_zero() && queues.has_waiters(key);
        if !queue_first {
            if let Step::Done(done) = self.try_once(&mut t, false).await? {
                return Ok(done);
            }
            if Instant::now() >= deadline {
                return Err(self.contended((key, kind), wait, start, t.count, t.remaining));
            }
        }

        // Wait for our turn among this process's waiters of the key: only
        // the task whose turn it is talks to the store, so one release wakes
        // one local task, not all of them. (A writer that marked itself
        // waiting on its try above keeps its mark meanwhile.)
        let queue = queues.join(key);
        if let Some(r) = t.remaining {
            queue.saw_held(r);
        }
        let _turn = match self.keeping_mark(&mut t, queue.turn.acquire()).await? {
            Kept::Done(Ok(turn)) => turn,
            Kept::Acquired(done) => return Ok(done),
            Kept::Done(Err(_)) | Kept::TimedOut => {
                // Timed out behind this process's other waiters, without
                // asking the store: what they last heard of the holder.
                let remaining = t.remaining.or_else(|| queue.held_for());
                return Err(self.contended((key, kind), wait, start, t.count, remaining));
            }
        };
        // The subscription stays with the queue from one waiter to the next.
        let mut watch = queue.take_watch();
        let mut subscribed = watch.is_some();
        // Having just tried, go straight to subscribing (and trying again).
        let mut skip_try = !queue_first && !subscribed;
        loop {
            // Every step from here on ends at the deadline, whatever the
            // store's command timeout: an attempt cut short is released in
            // the background (see `PendingAttempt`).
            if std::mem::take(&mut skip_try) {
                subscribed = true;
                match self.keeping_mark(&mut t, self.subscribe(key)).await? {
                    Kept::Done(w) => watch = Some(w),
                    Kept::Acquired(done) => return Ok(done),
                    Kept::TimedOut => {
                        return Err(self.contended((key, kind), wait, start, t.count, t.remaining));
                    }
                }
            }
            // Held by a task of ours: its release will wake us locally, so
            // there is nothing to ask the store yet. (Not for a permit: one
            // held here says nothing of the others.)
            let held_here = match kind {
                LeaseKind::Lock => queue.held_here(),
                _ => None,
            };
            let step = match held_here {
                Some(valid_for) => Ok(Step::Held(Some(valid_for))),
                None => {
                    // (Contended: it found the lock held, or queued behind a waiter.)
                    match tokio::time::timeout_at(deadline, self.try_once(&mut t, true)).await {
                        Ok(step) => step,
                        Err(_) => {
                            queue.put_watch(watch);
                            return Err(self.contended(
                                (key, kind),
                                wait,
                                start,
                                t.count,
                                t.remaining,
                            ));
                        }
                    }
                }
            };
            let step = match step {
                Ok(step) => step,
                Err(e) => {
                    queue.put_watch(watch);
                    return Err(e);
                }
            };
            match step {
                Step::Done(done) => {
                    queue.put_watch(watch);
                    if let Acquired::Locked(guard) = &done
                        && kind == LeaseKind::Lock
                    {
                        // The next waiters need not ask the store until
                        // this lease ends.
                        queue.set_holder(guard.lease_state());
                    }
                    return Ok(done);
                }
                Step::Held(r) => {
                    if let Some(r) = r {
                        queue.saw_held(r);
                    }
                    t.remaining = r;
                }
            }
            let now = Instant::now();
            if now >= deadline {
                queue.put_watch(watch);
                return Err(self.contended((key, kind), wait, start, t.count, t.remaining));
            }
            if !subscribed {
                // Subscribe, then try again at once before waiting.
                subscribed = true;
                match self.keeping_mark(&mut t, self.subscribe(key)).await? {
                    Kept::Done(w) => watch = Some(w),
                    Kept::Acquired(done) => return Ok(done),
                    Kept::TimedOut => {
                        return Err(self.contended((key, kind), wait, start, t.count, t.remaining));
                    }
                }
                continue;
            }
            let mut cap = match t.remaining {
                Some(r) => o.poll.min(r + Duration::from_millis(1)),
                None => o.poll,
            };
            if let Some(mark) = &t.mark {
                // A waiting writer's mark lasts what each try asks for (the
                // lease, or the hold cap if shorter): renewed by a try every
                // third of that at the least, as a lease is.
                cap = cap.min(mark.every);
            }
            // Jitter in [cap/2, cap] so waiters do not poll in lockstep.
            // (Saturating: a poll interval of `Duration::MAX` means "only
            // on notifications and at the deadline".)
            let nap = (cap / 2).saturating_add((cap / 2).mul_f64(fastrand::f64()));
            let mut wake = far_add(now, nap).min(deadline);
            if let Some(due) = t.mark.as_ref().and_then(|m| m.due) {
                wake = wake.min(due);
            }
            let store_release = async {
                match watch.as_mut() {
                    Some(w) => w.released().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = queue.released.notified() => {}
                _ = store_release => {}
                _ = tokio::time::sleep_until(wake) => {}
            }
        }
    }

    /// One try at the store, counted; the mark of a waiting writer is
    /// renewed by it (due again a third of its length after the try
    /// starts: it lasts from when the store runs the try, no earlier).
    async fn try_once(&self, t: &mut Tries<'_>, contended: bool) -> Result<Step, Error> {
        t.count += 1;
        if let Some(mark) = &mut t.mark {
            mark.due = Some(far_add(Instant::now(), mark.every));
        }
        let step = self
            .attempt(t.key, t.ask, t.start, (t.count, contended))
            .await?;
        if let Step::Held(r) = step {
            t.remaining = r;
        }
        Ok(step)
    }

    /// Runs `step`, a part of the wait that asks the store nothing (waiting
    /// for this process's turn, subscribing), until it ends or the deadline
    /// passes. Meanwhile a waiting writer's mark is renewed by a try each
    /// time it falls due, so that it never lapses while the writer waits,
    /// whatever `step` waits for; such a try may be granted, which ends it.
    async fn keeping_mark<T>(
        &self,
        t: &mut Tries<'_>,
        step: impl Future<Output = T>,
    ) -> Result<Kept<T>, Error> {
        let mut step = std::pin::pin!(step);
        loop {
            let due = t.mark.as_ref().and_then(|m| m.due);
            let renew = async {
                match due {
                    Some(due) => tokio::time::sleep_until(due).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                out = &mut step => return Ok(Kept::Done(out)),
                () = tokio::time::sleep_until(t.deadline) => return Ok(Kept::TimedOut),
                () = renew => {}
            }
            let deadline = t.deadline;
            match tokio::time::timeout_at(deadline, self.try_once(t, true)).await {
                Ok(Ok(Step::Done(done))) => return Ok(Kept::Acquired(done)),
                Ok(Ok(Step::Held(_))) => {}
                Ok(Err(e)) => return Err(e),
                Err(_) => return Ok(Kept::TimedOut),
            }
        }
    }

    /// The key's release notifications, or a watch that never fires (then
    /// waiters poll).
    pub(super) async fn subscribe(&self, key: &LockKey) -> ReleaseWatch {
        match self.inner.store.subscribe(key).await {
            Ok(w) => w,
            Err(e) => {
                observe::store_error(&e);
                tracing::debug!(key = %key, error = %Chain(&e), "no release notifications; polling");
                ReleaseWatch::never()
            }
        }
    }

    /// One try at the store.
    async fn attempt(
        &self,
        key: &LockKey,
        ask: Ask,
        start: Instant,
        (attempts, contended): (u32, bool),
    ) -> Result<Step, Error> {
        let o = &self.inner.opts;
        let store = &self.inner.store;
        // Where this lock's renewals and background releases run: the
        // caller's runtime (found before anything is granted).
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            Error::Config(ConfigError::new(
                "runtime",
                "locks must be taken inside a Tokio runtime",
            ))
        })?;
        // A fresh owner token for every attempt, never one per acquire: what
        // an attempt that did not count leaves running in the background
        // (a release after a timeout, Redlock's undo of a late grant on a
        // slow node) is owner-checked, and must not match the lock a later
        // attempt of the same acquire was granted.
        let owner = &OwnerToken::generate();
        let attempt_start = Instant::now();
        // The first lease, like every renewal, ends by the hold cap: a cap
        // shorter than the lease shortens the grant itself.
        let first = o.first_lease();
        let kind = ask.kind();
        let undo = UndoOf::Grant(kind, key, owner);
        let pending = PendingAttempt::new(&self.inner.recovery, undo, &runtime);
        // On an error (timeout, connection lost) or a drop the grant may
        // still have happened, or happen later: `pending` has it released.
        let grant = Grant::new(key, owner, first, ask.for_store()).label(o.label.as_ref());
        let outcome = store.grant(grant).await;
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(e) => {
                pending.failed();
                return Err(e);
            }
        };
        pending.disarm();
        let token = match outcome {
            AcquireOutcome::Granted(token) => Ok(token),
            AcquireOutcome::GrantedUnfenced => Err(Unfenced),
            AcquireOutcome::Held { remaining } => return Ok(Step::Held(remaining)),
            AcquireOutcome::Completed(raw) => {
                let completed = Ok(Outcome::Completed);
                observe::acquired(
                    &Span::current(),
                    (key, kind),
                    start.elapsed(),
                    contended,
                    &completed,
                );
                return Ok(Step::Done(Acquired::Completed(raw)));
            }
        };
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let lease = Arc::new(Lease::new(
            id,
            (key.clone(), kind),
            owner.clone(),
            token,
            o.lease,
            drift(o.lease),
            attempt_start,
            o.max_hold,
        ));
        // (Looked up only now: an attempt that finds the lock held
        // needs no watchdog.)
        let watchdog = self.watchdog(&runtime);
        watchdog.add(lease.clone());
        tracing::debug!(
            key = %key,
            kind = ?kind,
            fencing_token = token.ok().map(crate::token::FencingToken::get),
            waited_us = start.elapsed().as_micros() as u64,
            contended,
            attempts,
            "lock acquired"
        );
        let granted = Ok(Outcome::Granted(
            token.ok().map(crate::token::FencingToken::get),
        ));
        observe::acquired(
            &Span::current(),
            (key, kind),
            start.elapsed(),
            contended,
            &granted,
        );
        let end = Ending {
            lease,
            store: self.inner.erased.clone(),
            recovery: self.inner.recovery.clone(),
            local: self.queues(kind).clone(),
            runtime: Some(runtime),
        };
        Ok(Step::Done(Acquired::Locked(LockGuard::new(end, watchdog))))
    }

    /// The error for a lock that stayed held.
    pub(super) fn contended(
        &self,
        (key, kind): (&LockKey, LeaseKind),
        wait: Duration,
        start: Instant,
        attempts: u32,
        remaining: Option<Duration>,
    ) -> Error {
        let waited = start.elapsed();
        let retry_after = remaining.unwrap_or(self.inner.opts.lease);
        tracing::debug!(
            key = %key,
            waited_us = waited.as_micros() as u64,
            attempts,
            retry_after_ms = retry_after.as_millis() as u64,
            "lock contended"
        );
        let err = if wait.is_zero() {
            Error::Contended {
                key: key.clone(),
                retry_after,
            }
        } else {
            Error::WaitTimeout {
                key: key.clone(),
                waited,
                retry_after,
            }
        };
        observe::acquired(&Span::current(), (key, kind), waited, true, &Err(&err));
        err
    }
}

#[cfg(test)]
mod tests;
