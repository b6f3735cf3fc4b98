//! An in-process store with the same semantics as Redis.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tokio::sync::watch;
use tokio::time::Instant;

use super::holder::{ForcedRelease, HolderId, HolderInfo, HolderLabel, HolderPage, ListCursor};
use super::{
    AcquireAllOutcome, AcquireOutcome, Ask, Grant, LeaseKind, LockStore, OperatorStore,
    ReleaseWatch,
};
use crate::error::{Error, Operation};
use crate::key::LockKey;
use crate::time::far_add;
use crate::token::{FencingToken, OwnerToken};

/// Locks kept in this process's memory.
///
/// Same semantics as [`RedisStore`](crate::RedisStore) — lease expiry,
/// owner-checked writes, strictly increasing fencing tokens, release
/// notifications — and it passes the same conformance suite. Use it for
/// tests of your own handlers, for local development without Redis, and for
/// deployments that run one process. It does not coordinate processes.
///
/// Time is [`tokio::time::Instant`], so tests can drive expiry with
/// `tokio::time::pause()` and `advance()`. Fencing tokens come from one
/// store-wide counter, `max(last + 1, wall clock in µs)`: strictly
/// increasing for every key with no per-key state left behind.
///
/// ```
/// use std::time::Duration;
/// use tower_redis_lock::{LockKey, Locker, MemoryStore};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower_redis_lock::Error> {
/// let locker = Locker::new(MemoryStore::new());
/// let key = LockKey::new("jobs", "42")?;
/// let guard = locker.try_acquire(&key).await?;
/// assert!(locker.try_acquire(&key).await.unwrap_err().is_contended());
/// assert!(guard.release().await?);
/// # Ok(())
/// # }
/// ```
///
/// With the `test-util` feature it has hooks for testing your handlers'
/// unhappy paths: `lose` a held lock, `take_over` one as another owner,
/// and `fail_next_calls` for a store outage.
#[derive(Clone, Default)]
pub struct MemoryStore {
    state: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    locks: HashMap<LockKey, Held>,
    /// Each key's permits held: owner and lease end. An empty set is
    /// removed, so the state is bounded by the permits held.
    semaphores: HashMap<LockKey, HashMap<OwnerToken, Instant>>,
    /// Each key's reader-writer lock (see `rwlock.rs`), removed when
    /// nothing is held or waited for.
    rwlocks: HashMap<LockKey, rwlock::RwState>,
    records: HashMap<LockKey, (Bytes, Instant)>,
    watchers: HashMap<LockKey, watch::Sender<u64>>,
    last_token: u64,
    ops_since_sweep: u32,
    /// Store calls left to fail (`fail_next_calls`).
    failing: u32,
}

struct Held {
    owner: OwnerToken,
    token: FencingToken,
    expires: Instant,
    /// For operators (`inspect`): the holder's label, when it was granted,
    /// and whether an acquire found it held (a waiter).
    label: Option<HolderLabel>,
    granted_at: SystemTime,
    waited: bool,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.lock();
        f.debug_struct("MemoryStore")
            .field("locks", &st.locks.len())
            .field("semaphores", &st.semaphores.len())
            .field("rwlocks", &st.rwlocks.len())
            .field("watched_keys", &st.watchers.len())
            .finish()
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many unexpired locks the store holds.
    #[cfg(any(test, feature = "test-util"))]
    #[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
    pub fn held_count(&self) -> usize {
        let now = Instant::now();
        self.lock()
            .locks
            .values()
            .filter(|h| h.expires > now)
            .count()
    }

    /// Whether `key` is held right now.
    #[cfg(any(test, feature = "test-util"))]
    #[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
    pub fn is_locked(&self, key: &LockKey) -> bool {
        let now = Instant::now();
        self.lock().locks.get(key).is_some_and(|h| h.expires > now)
    }

    /// How many unexpired permits of `key`'s semaphore are held.
    #[cfg(any(test, feature = "test-util"))]
    #[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
    pub fn permits_held(&self, key: &LockKey) -> usize {
        let now = Instant::now();
        self.lock()
            .live_permits(key, now)
            .map_or(0, |held| held.len())
    }

    /// Makes every permit of `key`'s semaphore disappear, as if their
    /// leases had run out; their holders are not told (their next renewal
    /// finds out, as with [`lose`](MemoryStore::lose)). Returns how many
    /// were held.
    #[cfg(any(test, feature = "test-util"))]
    #[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
    pub fn lose_permits(&self, key: &LockKey) -> usize {
        let now = Instant::now();
        let mut st = self.lock();
        let n = st.live_permits(key, now).map_or(0, |held| held.len());
        st.semaphores.remove(key);
        n
    }

    /// `key`'s reader-writer lock right now: how many readers hold it,
    /// whether a writer does, how many writers are marked waiting.
    #[cfg(any(test, feature = "test-util"))]
    #[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
    pub fn rw_held(&self, key: &LockKey) -> (usize, bool, usize) {
        let now = Instant::now();
        self.lock().live_rw(key, now).map_or((0, false, 0), |rw| {
            (rw.readers(), rw.has_writer(), rw.writers_waiting())
        })
    }

    /// Whether a waiter is subscribed to `key`'s release notifications
    /// (tests wait for this before they release).
    #[cfg(any(test, feature = "test-util"))]
    #[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
    pub fn is_watched(&self, key: &LockKey) -> bool {
        self.lock()
            .watchers
            .get(key)
            .is_some_and(|tx| tx.receiver_count() > 0)
    }

    /// How many keys the store keeps any state for (locks, permits,
    /// records, release channels), expired entries included until they
    /// are swept: what a flood of distinct keys leaves behind.
    #[cfg(any(test, feature = "test-util"))]
    #[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
    pub fn keys_kept(&self) -> usize {
        let st = self.lock();
        st.locks.len()
            + st.semaphores.len()
            + st.rwlocks.len()
            + st.records.len()
            + st.watchers.len()
    }

    /// Makes the lock on `key` disappear, as if its lease had run out
    /// (or a Redis had lost it): nobody holds it any more, and its holder
    /// is not told. Returns whether it was held.
    ///
    /// The holder finds out like in production: its next renewal (the
    /// watchdog's, every lease/3, or [`LockGuard::extend`](crate::LockGuard::extend))
    /// answers "not owner", so the guard flips to lost and
    /// [`lost()`](crate::LockGuard::lost) resolves; its
    /// [`finish`](crate::LockGuard::finish) stores nothing.
    ///
    /// ```
    /// use tower_redis_lock::{LockKey, Locker, MemoryStore};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_redis_lock::Error> {
    /// let store = MemoryStore::new();
    /// let locker = Locker::new(store.clone());
    /// let key = LockKey::new("orders", "42")?;
    /// let guard = locker.acquire(&key).await?;
    ///
    /// assert!(store.lose(&key));
    /// let err = guard.extend().await.unwrap_err();
    /// assert!(matches!(err, tower_redis_lock::Error::LockLost { .. }));
    /// guard.lost().await; // resolves at once now
    /// assert!(!guard.is_held());
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(any(test, feature = "test-util"))]
    #[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
    pub fn lose(&self, key: &LockKey) -> bool {
        let now = Instant::now();
        let mut st = self.lock();
        st.live(key, now).is_some() && st.locks.remove(key).is_some()
    }

    /// Gives the lock on `key` to another owner for `lease`, with a fresh,
    /// higher fencing token (returned), whether or not someone held it: a
    /// takeover after the first holder's lease ran out. The first holder is
    /// not told; its next renewal finds the new owner (the guard flips to
    /// lost) and every fenced write with its older token is refused.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redis_lock::{LockKey, Locker, MemoryStore};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_redis_lock::Error> {
    /// let store = MemoryStore::new();
    /// let locker = Locker::new(store.clone());
    /// let key = LockKey::new("orders", "42")?;
    /// let guard = locker.acquire(&key).await?;
    ///
    /// let newer = store.take_over(&key, Duration::from_secs(30));
    /// assert!(newer > guard.fencing_token().expect("the memory store fences"));
    /// let err = guard.extend().await.unwrap_err();
    /// assert!(matches!(err, tower_redis_lock::Error::LockLost { .. }));
    /// assert!(!guard.release().await?, "no longer ours to release");
    /// assert!(locker.try_acquire(&key).await.unwrap_err().is_contended());
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(any(test, feature = "test-util"))]
    #[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
    pub fn take_over(&self, key: &LockKey, lease: Duration) -> FencingToken {
        let now = Instant::now();
        let mut st = self.lock();
        st.sweep_now_and_then(now);
        let token = st.next_token();
        let taker = Held {
            owner: OwnerToken::generate(),
            token,
            expires: far_add(now, lease),
            label: None,
            granted_at: SystemTime::now(),
            waited: false,
        };
        st.locks.insert(key.clone(), taker);
        token
    }

    /// Makes the next `n` store calls fail with
    /// [`Error::Unavailable`] (as a Redis that stopped answering would),
    /// whatever they are: acquire, renewal, release, finish, reading a
    /// record, subscribing. `0` cancels what is left. The
    /// [`LockLayer`](crate::LockLayer) answers such a failure with 503 and
    /// `Retry-After` (by default).
    ///
    /// ```
    /// use tower_redis_lock::{LockKey, Locker, MemoryStore};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_redis_lock::Error> {
    /// let store = MemoryStore::new();
    /// let locker = Locker::new(store.clone());
    /// let key = LockKey::new("orders", "42")?;
    ///
    /// store.fail_next_calls(1);
    /// assert!(locker.acquire(&key).await.unwrap_err().is_store_failure());
    /// assert!(locker.acquire(&key).await.is_ok(), "only the next call fails");
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(any(test, feature = "test-util"))]
    #[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
    pub fn fail_next_calls(&self, n: u32) {
        self.lock().failing = n;
    }

    /// The state, for a store call: or the failure asked for by
    /// `fail_next_calls`, if any is left (checked under the same lock).
    fn lock_for<'k>(
        &self,
        op: Operation,
        key: impl Into<Option<&'k LockKey>>,
    ) -> Result<MutexGuard<'_, State>, Error> {
        let mut st = self.lock();
        if st.failing == 0 {
            return Ok(st);
        }
        st.failing -= 1;
        Err(Error::Unavailable {
            op,
            key: key.into().cloned(),
            source: "MemoryStore::fail_next_calls: a failure asked for by a test".into(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        crate::sync::lock(&self.state)
    }
}

impl State {
    fn sweep_now_and_then(&mut self, now: Instant) {
        self.ops_since_sweep += 1;
        if self.ops_since_sweep >= 1024 {
            self.ops_since_sweep = 0;
            self.locks.retain(|_, h| h.expires > now);
            self.semaphores.retain(|_, held| {
                held.retain(|_, expires| *expires > now);
                !held.is_empty()
            });
            self.records.retain(|_, (_, expires)| *expires > now);
            self.rwlocks.retain(|_, rw| rw.prune(now));
        }
    }

    /// Resets `key`'s lease to `lease` if `owner` holds it, handing it to
    /// `to` on the way (extend: `None`; transfer: the new owner).
    fn renew(
        &mut self,
        key: &LockKey,
        owner: &OwnerToken,
        to: Option<&OwnerToken>,
        lease: Duration,
        now: Instant,
    ) -> bool {
        match self.live(key, now) {
            Some(h) if h.owner == *owner => {
                if let Some(to) = to {
                    h.owner = to.clone();
                }
                h.expires = far_add(now, lease);
                true
            }
            _ => false,
        }
    }

    fn live(&mut self, key: &LockKey, now: Instant) -> Option<&mut Held> {
        if self.locks.get(key).is_some_and(|h| h.expires <= now) {
            self.locks.remove(key);
        }
        self.locks.get_mut(key)
    }

    fn record(&mut self, key: &LockKey, now: Instant) -> Option<Bytes> {
        if self.records.get(key).is_some_and(|(_, e)| *e <= now) {
            self.records.remove(key);
        }
        self.records.get(key).map(|(r, _)| r.clone())
    }

    /// Removes `key` if `owner` holds it, and wakes its waiters.
    fn release(&mut self, key: &LockKey, owner: &OwnerToken, now: Instant) -> bool {
        let ours = matches!(self.live(key, now), Some(h) if h.owner == *owner);
        if ours {
            self.locks.remove(key);
            if let Some(tx) = self.watchers.get(key) {
                tx.send_modify(|n| *n = n.wrapping_add(1));
            }
        }
        ours
    }

    fn acquire(
        &mut self,
        key: &LockKey,
        owner: &OwnerToken,
        lease: Duration,
        label: Option<&HolderLabel>,
        now: Instant,
    ) -> AcquireOutcome {
        self.sweep_now_and_then(now);
        if let Some(h) = self.live(key, now) {
            if h.owner == *owner {
                h.expires = far_add(now, lease);
                return AcquireOutcome::Granted(h.token);
            }
            h.waited = true;
            return AcquireOutcome::Held {
                remaining: Some(h.expires - now),
            };
        }
        let token = self.next_token();
        self.locks.insert(
            key.clone(),
            Held {
                owner: owner.clone(),
                token,
                expires: far_add(now, lease),
                label: label.cloned(),
                granted_at: SystemTime::now(),
                waited: false,
            },
        );
        AcquireOutcome::Granted(token)
    }

    /// The live permits of `key` (expired ones removed; an empty set
    /// dropped), if any are held.
    fn live_permits(
        &mut self,
        key: &LockKey,
        now: Instant,
    ) -> Option<&mut HashMap<OwnerToken, Instant>> {
        let held = self.semaphores.get_mut(key)?;
        held.retain(|_, expires| *expires > now);
        if held.is_empty() {
            self.semaphores.remove(key);
            return None;
        }
        self.semaphores.get_mut(key)
    }

    fn acquire_permit(
        &mut self,
        key: &LockKey,
        owner: &OwnerToken,
        permits: u32,
        lease: Duration,
        now: Instant,
    ) -> AcquireOutcome {
        self.sweep_now_and_then(now);
        let expires = far_add(now, lease);
        // (Ours already, an attempt whose answer was lost: its lease is
        // reset below, and a token minted now is valid for it.)
        if let Some(held) = self.live_permits(key, now)
            && !held.contains_key(owner)
            && held.len() >= permits as usize
        {
            let soonest = held.values().min().copied().unwrap_or(now);
            return AcquireOutcome::Held {
                remaining: Some(soonest - now),
            };
        }
        self.semaphores
            .entry(key.clone())
            .or_default()
            .insert(owner.clone(), expires);
        AcquireOutcome::Granted(self.next_token())
    }

    /// Gives back `owner`'s permit of `key` and wakes its waiters.
    fn release_permit(&mut self, key: &LockKey, owner: &OwnerToken, now: Instant) -> bool {
        let Some(held) = self.live_permits(key, now) else {
            return false;
        };
        let ours = held.remove(owner).is_some();
        if held.is_empty() {
            self.semaphores.remove(key);
        }
        if ours && let Some(tx) = self.watchers.get(key) {
            tx.send_modify(|n| *n = n.wrapping_add(1));
        }
        ours
    }

    /// What an operator sees of `key`'s holder.
    fn inspect(&mut self, key: &LockKey, now: Instant) -> Option<HolderInfo> {
        let h = self.live(key, now)?;
        Some(HolderInfo {
            key: key.clone(),
            holder: HolderId::of(&h.owner),
            label: h.label.clone(),
            fencing_token: Some(h.token),
            granted_at: Some(h.granted_at),
            remaining: Some(h.expires - now),
            waiters: h.waited,
        })
    }

    fn next_token(&mut self) -> FencingToken {
        let wall_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0);
        self.last_token = wall_us.max(self.last_token + 1);
        FencingToken::new(self.last_token)
    }
}

impl LockStore for MemoryStore {
    fn instance_id(&self) -> usize {
        Arc::as_ptr(&self.state).cast::<()>() as usize
    }

    fn supports(&self, _kind: LeaseKind) -> bool {
        true
    }

    async fn grant(&self, grant: Grant<'_>) -> Result<AcquireOutcome, Error> {
        let now = Instant::now();
        let (key, owner, lease) = (grant.key, grant.owner, grant.lease);
        let mut st = self.lock_for(Operation::Acquire, key)?;
        Ok(match grant.ask {
            Ask::Lock { replay } => {
                if replay && let Some(record) = st.record(key, now) {
                    return Ok(AcquireOutcome::Completed(record));
                }
                st.acquire(key, owner, lease, grant.label, now)
            }
            Ask::Permit { permits } => st.acquire_permit(key, owner, permits, lease, now),
            Ask::Read => st.acquire_read(key, owner, lease, now),
            Ask::Write { waiter } => st.acquire_write(key, owner, waiter.as_ref(), lease, now),
        })
    }

    async fn renew(
        &self,
        kind: LeaseKind,
        key: &LockKey,
        owner: &OwnerToken,
        lease: Duration,
    ) -> Result<bool, Error> {
        let now = Instant::now();
        let mut st = self.lock_for(Operation::Extend, key)?;
        Ok(match kind {
            LeaseKind::Lock => st.renew(key, owner, None, lease, now),
            LeaseKind::Permit => match st
                .live_permits(key, now)
                .and_then(|held| held.get_mut(owner))
            {
                Some(expires) => {
                    *expires = far_add(now, lease);
                    true
                }
                None => false,
            },
            _ => st.extend_rw(key, owner, kind, lease, now),
        })
    }

    async fn transfer(
        &self,
        key: &LockKey,
        from: &OwnerToken,
        to: &OwnerToken,
        lease: Duration,
    ) -> Result<bool, Error> {
        let mut st = self.lock_for(Operation::Extend, key)?;
        Ok(st.renew(key, from, Some(to), lease, Instant::now()))
    }

    async fn release(
        &self,
        kind: LeaseKind,
        key: &LockKey,
        owner: &OwnerToken,
    ) -> Result<bool, Error> {
        let now = Instant::now();
        let mut st = self.lock_for(Operation::Release, key)?;
        Ok(match kind {
            LeaseKind::Lock => st.release(key, owner, now),
            LeaseKind::Permit => st.release_permit(key, owner, now),
            _ => st.release_rw(key, owner, kind, now),
        })
    }

    async fn finish(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        record: Bytes,
        retention: Duration,
    ) -> Result<bool, Error> {
        let now = Instant::now();
        let mut st = self.lock_for(Operation::Release, key)?;
        let ours = matches!(st.live(key, now), Some(h) if h.owner == *owner);
        if ours {
            st.records
                .insert(key.clone(), (record, far_add(now, retention)));
            st.release(key, owner, now);
        }
        Ok(ours)
    }

    async fn read_record(&self, key: &LockKey) -> Result<Option<Bytes>, Error> {
        let now = Instant::now();
        Ok(self.lock_for(Operation::Acquire, key)?.record(key, now))
    }

    async fn grant_all(
        &self,
        keys: &[LockKey],
        owner: &OwnerToken,
        lease: Duration,
        _label: Option<&HolderLabel>,
    ) -> Result<AcquireAllOutcome, Error> {
        let now = Instant::now();
        Ok(self
            .lock_for(Operation::Acquire, keys.first())?
            .acquire_all(keys, owner, lease, now))
    }

    async fn release_all(&self, keys: &[LockKey], owner: &OwnerToken) -> Result<Vec<bool>, Error> {
        let now = Instant::now();
        Ok(self
            .lock_for(Operation::Release, keys.first())?
            .release_all(keys, owner, now))
    }

    async fn subscribe(&self, key: &LockKey) -> Result<ReleaseWatch, Error> {
        let rx = {
            let mut st = self.lock_for(Operation::Subscribe, key)?;
            st.watchers
                .entry(key.clone())
                .or_insert_with(|| watch::channel(0).0)
                .subscribe()
        };
        Ok(ReleaseWatch::new(rx).with_guard(Unwatch {
            state: Arc::downgrade(&self.state),
            key: key.clone(),
        }))
    }
}

impl OperatorStore for MemoryStore {
    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, Error> {
        let now = Instant::now();
        Ok(self.lock_for(Operation::Inspect, key)?.inspect(key, now))
    }

    /// Pages in the order of the ids; the cursor is the last id answered
    /// (in hex).
    async fn list(
        &self,
        namespace: &str,
        cursor: &ListCursor,
        count: usize,
    ) -> Result<HolderPage, Error> {
        let after = hex_decode(cursor.as_str()).ok_or_else(|| {
            Error::Config(crate::error::ConfigError::new(
                "cursor",
                "not a list cursor this store gave",
            ))
        })?;
        let now = Instant::now();
        let count = count.max(1);
        let mut st = self.lock_for(Operation::List, None)?;
        let mut keys: Vec<LockKey> = st
            .locks
            .iter()
            .filter(|(k, h)| {
                k.namespace() == namespace
                    && h.expires > now
                    && (cursor.as_str().is_empty() || k.id().as_bytes() > after.as_slice())
            })
            .map(|(k, _)| k.clone())
            .collect();
        keys.sort_by(|a, b| a.id().cmp(b.id()));
        let more = keys.len() > count;
        keys.truncate(count);
        let next = if more {
            keys.last()
                .map(|k| ListCursor(hex_encode(k.id().as_bytes())))
        } else {
            None
        };
        let locks = keys.iter().filter_map(|k| st.inspect(k, now)).collect();
        Ok(HolderPage { locks, next })
    }

    async fn force_release(&self, key: &LockKey) -> Result<ForcedRelease, Error> {
        let now = Instant::now();
        let mut st = self.lock_for(Operation::ForceRelease, key)?;
        let released = st.live(key, now).is_some();
        if released {
            st.locks.remove(key);
            if let Some(tx) = st.watchers.get(key) {
                tx.send_modify(|n| *n = n.wrapping_add(1));
            }
        }
        // Every later grant's token is above this one.
        let fence = st.next_token();
        Ok(ForcedRelease {
            released,
            fence: Some(fence),
        })
    }
}

/// Drops the per-key notification channel once nobody waits on it, so the
/// store keeps no state per distinct key.
struct Unwatch {
    state: Weak<Mutex<State>>,
    key: LockKey,
}

impl Drop for Unwatch {
    fn drop(&mut self) {
        if let Some(state) = self.state.upgrade() {
            let mut st = crate::sync::lock(&state);
            if st
                .watchers
                .get(&self.key)
                .is_some_and(|tx| tx.receiver_count() == 0)
            {
                st.watchers.remove(&self.key);
            }
        }
    }
}

mod multi;
mod rwlock;
#[cfg(test)]
mod rwlock_model;
#[cfg(test)]
mod semaphore_model;
/// `bytes` as lowercase hex (a list cursor).
fn hex_encode(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A list cursor's bytes back; `None` when it is not hex.
fn hex_decode(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}
