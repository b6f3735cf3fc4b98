//! The lock engine: acquiring with a wait, and handing out guards.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::error::ConfigError;
use crate::guard::{DynStore, Lease, LockGuard, far_add, spawn_detached};
use crate::store::{AcquireOutcome, LockStore, ReleaseWatch};
use crate::watchdog::{self, Cmd};
use crate::{Error, LockKey, OwnerToken, Record};

/// What [`Locker::acquire_or_replay`] found.
#[derive(Debug)]
pub enum Acquired {
    /// The lock is ours: do the work, then [`LockGuard::finish`] or release.
    Locked(LockGuard),
    /// The work was done before: replay this outcome.
    Completed(Record),
}

/// Default lease: 30 s, renewed every 10 s while held.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// Default wait timeout: 0, i.e. try-lock.
pub const DEFAULT_WAIT: Duration = Duration::ZERO;
/// Default cap on each poll while waiting (the release notification usually
/// wakes a waiter long before).
pub const DEFAULT_POLL: Duration = Duration::from_millis(250);
/// Default number of renewals per pipelined batch.
pub const DEFAULT_RENEW_BATCH: usize = 512;

/// Takes locks from a [`LockStore`] and keeps them alive.
///
/// A `Locker` is cheap to clone; clones share one watchdog task (spawned on
/// first use, on the caller's runtime, and spawned again on the caller's
/// runtime if the one it ran on has shut down) that renews every lease they
/// hold, every lease/3, in pipelined batches.
///
/// ```
/// use std::time::Duration;
/// use tower_redis_lock::{LockKey, Locker, MemoryStore};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower_redis_lock::Error> {
/// let locker = Locker::builder(MemoryStore::new())
///     .lease(Duration::from_secs(10))
///     .wait_timeout(Duration::from_secs(2))
///     .build()?;
///
/// let key = LockKey::new("reports", "2026-11")?;
/// let guard = locker.acquire(&key).await?;
/// println!("fencing token {}", guard.fencing_token());
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
pub struct Locker<S> {
    inner: Arc<Inner<S>>,
}

impl<S> Clone for Locker<S> {
    fn clone(&self) -> Self {
        Locker {
            inner: self.inner.clone(),
        }
    }
}

struct Inner<S> {
    store: Arc<S>,
    opts: Options,
    /// The renewal task's inbox; replaced when that task is gone (its
    /// runtime shut down).
    watchdog: RwLock<Option<mpsc::UnboundedSender<Cmd>>>,
    next_id: AtomicU64,
    renewing: Arc<AtomicUsize>,
    queues: Queues,
}

#[derive(Debug, Clone)]
struct Options {
    lease: Duration,
    wait: Duration,
    max_hold: Option<Duration>,
    poll: Duration,
    batch: usize,
}

impl<S> std::fmt::Debug for Locker<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Locker")
            .field("lease", &self.inner.opts.lease)
            .field("wait_timeout", &self.inner.opts.wait)
            .field("max_hold", &self.inner.opts.max_hold)
            .finish_non_exhaustive()
    }
}

/// Builds a [`Locker`]; settings are checked in [`build`](LockerBuilder::build).
#[derive(Debug)]
pub struct LockerBuilder<S> {
    store: S,
    opts: Options,
}

impl<S: LockStore> LockerBuilder<S> {
    /// Lease length (default 30 s, at least 10 ms). The watchdog renews every
    /// lease/3; validity is `lease − (lease/100 + 2 ms)` after each renewal
    /// started.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.opts.lease = lease;
        self
    }

    /// How long [`Locker::acquire`] waits for a held lock (default 0:
    /// try-lock).
    pub fn wait_timeout(mut self, wait: Duration) -> Self {
        self.opts.wait = wait;
        self
    }

    /// Total hold cap (default off): renewals stop so that the lock ends at
    /// most this long after it was granted, and the guard reports it lost
    /// then. Bounds a holder that never finishes.
    pub fn max_hold(mut self, cap: Duration) -> Self {
        self.opts.max_hold = Some(cap);
        self
    }

    /// Longest sleep between attempts while waiting (default 250 ms,
    /// jittered, and never past the holder's remaining lease). Release
    /// notifications wake waiters sooner; this is the fallback for missed
    /// notifications and stores without them.
    pub fn poll_interval(mut self, poll: Duration) -> Self {
        self.opts.poll = poll;
        self
    }

    /// Renewals per pipelined batch (default 512).
    pub fn renew_batch(mut self, batch: usize) -> Self {
        self.opts.batch = batch;
        self
    }

    /// Checks the settings.
    pub fn build(self) -> Result<Locker<S>, ConfigError> {
        let o = &self.opts;
        if o.lease < Duration::from_millis(10) {
            return Err(ConfigError::new("lease", "must be at least 10 ms"));
        }
        if o.lease > Duration::from_secs(86_400) {
            return Err(ConfigError::new("lease", "must be at most 24 h"));
        }
        if let Some(cap) = o.max_hold
            && cap < Duration::from_millis(10)
        {
            return Err(ConfigError::new("max_hold", "must be at least 10 ms"));
        }
        if o.poll < Duration::from_millis(1) {
            return Err(ConfigError::new("poll_interval", "must be at least 1 ms"));
        }
        if o.batch == 0 {
            return Err(ConfigError::new("renew_batch", "must be at least 1"));
        }
        Ok(Locker {
            inner: Arc::new(Inner {
                store: Arc::new(self.store),
                opts: self.opts,
                watchdog: RwLock::new(None),
                next_id: AtomicU64::new(0),
                renewing: Arc::default(),
                queues: Queues::default(),
            }),
        })
    }
}

/// Safety margin subtracted from a lease for clock drift and the time a
/// reply takes: 1 % of the lease plus 2 ms (as in Redlock).
pub(crate) fn drift(lease: Duration) -> Duration {
    lease / 100 + Duration::from_millis(2)
}

impl<S: LockStore> Locker<S> {
    /// A locker with the defaults: 30 s lease, try-lock, no hold cap.
    pub fn new(store: S) -> Self {
        Locker {
            inner: Arc::new(Inner {
                store: Arc::new(store),
                opts: default_options(),
                watchdog: RwLock::new(None),
                next_id: AtomicU64::new(0),
                renewing: Arc::default(),
                queues: Queues::default(),
            }),
        }
    }

    /// Starts a builder for non-default settings.
    pub fn builder(store: S) -> LockerBuilder<S> {
        LockerBuilder {
            store,
            opts: default_options(),
        }
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.inner.store
    }

    /// The configured lease.
    pub fn lease(&self) -> Duration {
        self.inner.opts.lease
    }

    /// How many leases the watchdog is renewing right now (granted and
    /// neither released nor lost). Updated by the watchdog task, so it lags
    /// a release by one scheduling step.
    pub fn renewing(&self) -> usize {
        self.inner.renewing.load(Ordering::Relaxed)
    }

    /// The configured wait timeout.
    pub fn wait_timeout(&self) -> Duration {
        self.inner.opts.wait
    }

    /// Takes the lock, waiting up to the configured wait timeout.
    pub async fn acquire(&self, key: &LockKey) -> Result<LockGuard, Error> {
        self.acquire_within(key, self.inner.opts.wait).await
    }

    /// Takes the lock if it is free right now ([`Error::Contended`]
    /// otherwise).
    pub async fn try_acquire(&self, key: &LockKey) -> Result<LockGuard, Error> {
        self.acquire_within(key, Duration::ZERO).await
    }

    /// Takes the lock, waiting up to `wait` (0 = try-lock).
    ///
    /// While waiting it first tries, then subscribes to the key's release
    /// notifications, then tries again before every wait — so a release
    /// between a failed try and the wait is never missed. It wakes on a
    /// notification, or after a jittered poll bounded by the holder's
    /// remaining lease (which covers expiry, which nobody announces).
    ///
    /// Every step after the first try — waiting for this process's earlier
    /// waiters, subscribing, each further try — ends at the deadline
    /// (`wait` after the call), whatever the store's command timeout: a wait
    /// answers [`Error::WaitTimeout`] on time even when the store stops
    /// answering. `Duration::MAX` waits for ever.
    ///
    /// Dropping the future at any point is safe: an attempt whose answer was
    /// not received (dropped, or cut at the deadline) is released in the
    /// background (owner-checked, on the current runtime).
    ///
    /// Re-entry: when the calling task already holds `key` through this
    /// locker's store or a clone of it (inside [`LockGuard::scope`]; the
    /// [`LockLayer`](crate::LockLayer) runs its inner service in one), the
    /// answer is one more hold on that grant, at once and with the same
    /// fencing token (see [`LockGuard::reenter`]).
    pub async fn acquire_within(&self, key: &LockKey, wait: Duration) -> Result<LockGuard, Error> {
        match self.take(key, wait, false).await? {
            Acquired::Locked(guard) => Ok(guard),
            Acquired::Completed(_) => Err(Error::Record {
                key: key.clone(),
                reason: "the store answered a plain acquire with a completed record",
            }),
        }
    }

    /// Takes the lock unless the key's work is already done: then answers
    /// its completed [`Record`] (stored by [`LockGuard::finish`]) without
    /// locking. Waits up to `wait` like
    /// [`acquire_within`](Locker::acquire_within), so a duplicate that
    /// arrives while the first is running can wait for its record.
    ///
    /// With the Redis store this is one round trip when the key is free or
    /// completed.
    pub async fn acquire_or_replay(
        &self,
        key: &LockKey,
        wait: Duration,
    ) -> Result<Acquired, Error> {
        self.take(key, wait, true).await
    }

    async fn take(&self, key: &LockKey, wait: Duration, replay: bool) -> Result<Acquired, Error> {
        // The task already runs under this very lock (a nested call in the
        // same work): one more hold, not a wait for ourselves.
        if let Some(outer) = crate::guard::held_by_task(key, self.store_id())
            && let Ok(again) = outer.reenter()
        {
            tracing::trace!(key = %key, holds = again.hold_count(), "lock re-entered");
            return Ok(Acquired::Locked(again));
        }
        let o = &self.inner.opts;
        let owner = OwnerToken::generate();
        let start = Instant::now();
        // (A wait of `Duration::MAX` means "for ever", not an overflow.)
        let deadline = far_add(start, wait);
        let mut attempts = 0u32;
        let mut remaining = None;

        // Other tasks of this process already waiting for the key go first:
        // a new (or just-released) acquirer that means to wait queues behind
        // them instead of barging in.
        let queue_first = !wait.is_zero() && self.has_waiters(key);
        if !queue_first {
            attempts += 1;
            match self.attempt(key, &owner, replay, start, attempts).await? {
                Step::Done(done) => return Ok(done),
                Step::Held(r) => remaining = r,
            }
            if Instant::now() >= deadline {
                return Err(self.contended(key, wait, start, attempts, remaining));
            }
        }

        // Wait for our turn among this process's waiters of the key: only
        // the task whose turn it is talks to the store, so one release wakes
        // one local task, not all of them.
        let queue = self.local_queue(key);
        let Ok(Ok(_turn)) = tokio::time::timeout_at(deadline, queue.turn.acquire()).await else {
            return Err(self.contended(key, wait, start, attempts, remaining));
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
                match tokio::time::timeout_at(deadline, self.subscribe(key)).await {
                    Ok(w) => watch = Some(w),
                    Err(_) => return Err(self.contended(key, wait, start, attempts, remaining)),
                }
            }
            // Held by a task of ours: its release will wake us locally, so
            // there is nothing to ask the store yet.
            let step = match queue.held_here() {
                Some(valid_for) => Ok(Step::Held(Some(valid_for))),
                None => {
                    attempts += 1;
                    let attempt = self.attempt(key, &owner, replay, start, attempts);
                    match tokio::time::timeout_at(deadline, attempt).await {
                        Ok(step) => step,
                        Err(_) => {
                            queue.put_watch(watch);
                            return Err(self.contended(key, wait, start, attempts, remaining));
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
                    if let Acquired::Locked(guard) = &done {
                        // The next waiters need not ask the store until
                        // this lease ends.
                        *queue.holder.lock().unwrap_or_else(|p| p.into_inner()) =
                            Arc::downgrade(guard.lease_state());
                    }
                    return Ok(done);
                }
                Step::Held(r) => remaining = r,
            }
            let now = Instant::now();
            if now >= deadline {
                queue.put_watch(watch);
                return Err(self.contended(key, wait, start, attempts, remaining));
            }
            if !subscribed {
                // Subscribe, then try again at once before waiting.
                subscribed = true;
                match tokio::time::timeout_at(deadline, self.subscribe(key)).await {
                    Ok(w) => watch = Some(w),
                    Err(_) => return Err(self.contended(key, wait, start, attempts, remaining)),
                }
                continue;
            }
            let cap = match remaining {
                Some(r) => o.poll.min(r + Duration::from_millis(1)),
                None => o.poll,
            };
            // Jitter in [cap/2, cap] so waiters do not poll in lockstep.
            // (Saturating: a poll interval of `Duration::MAX` means "only
            // on notifications and at the deadline".)
            let nap = (cap / 2).saturating_add((cap / 2).mul_f64(fastrand::f64()));
            let wake = far_add(now, nap).min(deadline);
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

    /// The key's release notifications, or a watch that never fires (then
    /// waiters poll).
    async fn subscribe(&self, key: &LockKey) -> ReleaseWatch {
        match self.inner.store.subscribe(key).await {
            Ok(w) => w,
            Err(e) => {
                tracing::debug!(key = %key, error = %e, "no release notifications; polling");
                ReleaseWatch::never()
            }
        }
    }

    /// One try at the store.
    async fn attempt(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        replay: bool,
        start: Instant,
        attempts: u32,
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
        let watchdog = self.watchdog(&runtime);
        let attempt_start = Instant::now();
        let pending = PendingAttempt::new(store, key, owner, o.lease, &runtime);
        // On an error (timeout, connection lost) the grant may still have
        // happened: `pending` releases it in the background.
        let outcome = if replay {
            store.acquire_or_replay(key, owner, o.lease).await?
        } else {
            store.acquire(key, owner, o.lease).await?
        };
        pending.disarm();
        match outcome {
            AcquireOutcome::Granted(token) => {
                let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
                let lease = Arc::new(Lease::new(
                    id,
                    key.clone(),
                    owner.clone(),
                    token,
                    o.lease,
                    drift(o.lease),
                    attempt_start,
                    o.max_hold,
                ));
                let watchdog = match watchdog.send(Cmd::Add(lease.clone())) {
                    Ok(()) => watchdog,
                    Err(mpsc::error::SendError(cmd)) => {
                        // Its runtime shut down meanwhile: start another.
                        let fresh = self.watchdog(&runtime);
                        let _ = fresh.send(cmd);
                        fresh
                    }
                };
                tracing::debug!(
                    key = %key,
                    fencing_token = token.get(),
                    waited_us = start.elapsed().as_micros() as u64,
                    contended = attempts > 1,
                    attempts,
                    "lock acquired"
                );
                let dyn_store: Arc<dyn DynStore> = store.clone();
                Ok(Step::Done(Acquired::Locked(LockGuard::new(
                    lease,
                    dyn_store,
                    watchdog,
                    Some(runtime),
                    self.inner.queues.clone(),
                ))))
            }
            AcquireOutcome::Held { remaining } => Ok(Step::Held(remaining)),
            AcquireOutcome::Completed(raw) => match Record::decode(raw) {
                Some(record) => Ok(Step::Done(Acquired::Completed(record))),
                None => Err(Error::Record {
                    key: key.clone(),
                    reason: "the stored record is not in a format this version reads",
                }),
            },
        }
    }

    /// The error for a lock that stayed held.
    fn contended(
        &self,
        key: &LockKey,
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
        if wait.is_zero() {
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
        }
    }

    /// Identifies the store behind this locker (for re-entry: a guard
    /// re-enters only through the store that granted it, or a clone).
    pub(crate) fn store_id(&self) -> usize {
        self.inner.store.instance_id()
    }

    /// Whether a task of this locker is waiting for `key` right now.
    pub fn has_waiters(&self, key: &LockKey) -> bool {
        lock_map(&self.inner.queues.0).contains_key(key)
    }

    fn local_queue<'a>(&'a self, key: &'a LockKey) -> QueueRef<'a> {
        let queue = lock_map(&self.inner.queues.0)
            .entry(key.clone())
            .or_insert_with(|| {
                Arc::new(KeyQueue {
                    turn: tokio::sync::Semaphore::new(1),
                    released: tokio::sync::Notify::new(),
                    watch: std::sync::Mutex::new(None),
                    holder: std::sync::Mutex::default(),
                })
            })
            .clone();
        QueueRef {
            queue,
            key,
            map: &self.inner.queues.0,
        }
    }

    /// The watchdog's inbox. The watchdog is spawned on `runtime` (the
    /// caller's) the first time, and again whenever the task it ran on is
    /// gone — its runtime shut down (a locker shared across `#[tokio::test]`s,
    /// built in a setup runtime, or outliving a restarted worker).
    fn watchdog(&self, runtime: &tokio::runtime::Handle) -> mpsc::UnboundedSender<Cmd> {
        let slot = &self.inner.watchdog;
        if let Some(tx) = slot.read().unwrap_or_else(|p| p.into_inner()).as_ref()
            && !tx.is_closed()
        {
            return tx.clone();
        }
        let mut slot = slot.write().unwrap_or_else(|p| p.into_inner());
        if let Some(tx) = slot.as_ref()
            && !tx.is_closed()
        {
            return tx.clone();
        }
        let (tx, rx) = mpsc::unbounded_channel();
        drop(runtime.spawn(watchdog::run(
            self.inner.store.clone(),
            rx,
            self.inner.opts.batch,
            // Renewals due within lease/12 of each other share a batch.
            self.inner.opts.lease / 12,
            self.inner.renewing.clone(),
        )));
        *slot = Some(tx.clone());
        tx
    }
}

/// What one try found.
enum Step {
    Done(Acquired),
    Held(Option<Duration>),
}

type QueueMap = std::sync::Mutex<HashMap<LockKey, Arc<KeyQueue>>>;

/// This process's waiting tasks, per key. Guards hold it too, so that a
/// local release wakes the local waiter at once, without waiting for the
/// store's notification (or, where there is none, for a poll).
#[derive(Clone, Default)]
pub(crate) struct Queues(Arc<QueueMap>);

impl Queues {
    /// Tells the key's waiting task (if any) that the lock was just released
    /// here.
    pub(crate) fn wake(&self, key: &LockKey) {
        if let Some(q) = lock_map(&self.0).get(key) {
            q.released.notify_one();
        }
    }
}

/// This process's waiters for one key: whoever holds `turn` waits on the
/// store; the others wait for the turn, first come first served.
struct KeyQueue {
    turn: tokio::sync::Semaphore,
    /// A release by this process.
    released: tokio::sync::Notify,
    /// The key's release subscription, handed from one waiter to the next
    /// and dropped (unsubscribed) with the queue.
    watch: std::sync::Mutex<Option<ReleaseWatch>>,
    /// The lease of the last grant to one of the queue's waiters. While it
    /// is valid, the lock is held here and its release will be local:
    /// waiters need not ask the store.
    holder: std::sync::Mutex<std::sync::Weak<Lease>>,
}

impl KeyQueue {
    /// How long the lock stays held by a task of this process, if it is.
    fn held_here(&self) -> Option<Duration> {
        let lease = self
            .holder
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .upgrade()?;
        lease.is_valid_now().then(|| {
            lease
                .valid_until()
                .saturating_duration_since(Instant::now())
        })
    }
}

/// A waiter's handle on its key's queue; the last one out removes the queue.
struct QueueRef<'a> {
    queue: Arc<KeyQueue>,
    key: &'a LockKey,
    map: &'a QueueMap,
}

impl QueueRef<'_> {
    fn take_watch(&self) -> Option<ReleaseWatch> {
        self.queue
            .watch
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    fn put_watch(&self, watch: Option<ReleaseWatch>) {
        if let Some(w) = watch {
            *self.queue.watch.lock().unwrap_or_else(|p| p.into_inner()) = Some(w);
        }
    }
}

impl std::ops::Deref for QueueRef<'_> {
    type Target = KeyQueue;

    fn deref(&self) -> &KeyQueue {
        &self.queue
    }
}

impl Drop for QueueRef<'_> {
    fn drop(&mut self) {
        let mut map = lock_map(self.map);
        // Only the map and this handle left: nobody else waits here.
        if Arc::strong_count(&self.queue) == 2 {
            map.remove(self.key);
        }
    }
}

fn lock_map(m: &QueueMap) -> std::sync::MutexGuard<'_, HashMap<LockKey, Arc<KeyQueue>>> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn default_options() -> Options {
    Options {
        lease: DEFAULT_LEASE,
        wait: DEFAULT_WAIT,
        max_hold: None,
        poll: DEFAULT_POLL,
        batch: DEFAULT_RENEW_BATCH,
    }
}

/// An acquire attempt whose answer has not arrived. If the future holding it
/// is dropped (client gone, timeout), the attempt may still have been
/// granted: release it in the background, owner-checked.
/// (Spawned on the current runtime, or on the attempt's own if the future
/// is dropped outside any runtime.)
struct PendingAttempt<'a, S: LockStore> {
    armed: Option<(&'a Arc<S>, &'a LockKey, &'a OwnerToken)>,
    lease: Duration,
    runtime: &'a tokio::runtime::Handle,
}

impl<'a, S: LockStore> PendingAttempt<'a, S> {
    fn new(
        store: &'a Arc<S>,
        key: &'a LockKey,
        owner: &'a OwnerToken,
        lease: Duration,
        runtime: &'a tokio::runtime::Handle,
    ) -> Self {
        PendingAttempt {
            armed: Some((store, key, owner)),
            lease,
            runtime,
        }
    }

    fn disarm(mut self) {
        self.armed = None;
    }
}

impl<S: LockStore> Drop for PendingAttempt<'_, S> {
    fn drop(&mut self) {
        if let Some((store, key, owner)) = self.armed.take() {
            let (key, owner, lease) = (key.clone(), owner.clone(), self.lease);
            let store: Arc<dyn DynStore> = store.clone();
            spawn_detached(Some(self.runtime), async move {
                // One try, bounded by a lease (after which a grant made now
                // has expired anyway). Not retried: failed acquires are not
                // bounded by the locks held, and retrying each of them
                // through an outage would pile up work for the recovery.
                let give_up = far_add(Instant::now(), lease);
                let _ = tokio::time::timeout_at(give_up, store.release_dyn(&key, &owner)).await;
            });
        }
    }
}
