//! The memory store's reader-writer locks: per key, the readers and the
//! writer (owner -> lease end) and the marks of writers waiting (waiter ->
//! mark end). A key whose three are empty is removed, so the state is
//! bounded by what is held and waited for, whatever keys callers send.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use super::State;
use crate::key::LockKey;
use crate::store::{AcquireOutcome, LeaseKind};
use crate::time::far_add;
use crate::token::{FencingToken, OwnerToken};

/// One key's reader-writer lock.
#[derive(Default)]
pub(super) struct RwState {
    readers: HashMap<OwnerToken, Instant>,
    writer: Option<(OwnerToken, Instant)>,
    /// Writers waiting: while one is marked, no new reader is granted.
    waiting: HashMap<OwnerToken, Instant>,
}

impl RwState {
    /// Drops what ended by `now`; whether anything is left.
    pub(super) fn prune(&mut self, now: Instant) -> bool {
        self.readers.retain(|_, ends| *ends > now);
        self.waiting.retain(|_, ends| *ends > now);
        if self.writer.as_ref().is_some_and(|(_, ends)| *ends <= now) {
            self.writer = None;
        }
        !(self.readers.is_empty() && self.writer.is_none() && self.waiting.is_empty())
    }

    /// Whether nothing at all is in it, not even what ended.
    #[cfg(test)]
    pub(super) fn is_empty(&self) -> bool {
        self.readers.is_empty() && self.writer.is_none() && self.waiting.is_empty()
    }

    /// How many readers hold it (a test hook's answer).
    #[cfg(any(test, feature = "test-util"))]
    pub(super) fn readers(&self) -> usize {
        self.readers.len()
    }

    /// Whether a writer holds it.
    #[cfg(any(test, feature = "test-util"))]
    pub(super) fn has_writer(&self) -> bool {
        self.writer.is_some()
    }

    /// How many writers are marked waiting.
    #[cfg(any(test, feature = "test-util"))]
    pub(super) fn writers_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// The lease left of whoever keeps a new reader out, if anyone does:
    /// the writer's, or the longest waiting writer's mark.
    fn reader_blocked_for(&self, now: Instant) -> Option<Duration> {
        if let Some((_, ends)) = &self.writer {
            return Some(*ends - now);
        }
        self.waiting.values().max().map(|ends| *ends - now)
    }

    /// The lease left of whoever keeps a writer out, if anyone does: the
    /// writer's, or the last reader's.
    fn writer_blocked_for(&self, owner: &OwnerToken, now: Instant) -> Option<Duration> {
        match &self.writer {
            Some((o, _)) if o == owner => None,
            Some((_, ends)) => Some(*ends - now),
            None => self.readers.values().max().map(|ends| *ends - now),
        }
    }
}

impl State {
    /// `key`'s reader-writer lock as it stands at `now` (ended holds and
    /// marks dropped; an empty one removed), if anything is left of it.
    pub(super) fn live_rw(&mut self, key: &LockKey, now: Instant) -> Option<&mut RwState> {
        let rw = self.rwlocks.get_mut(key)?;
        if !rw.prune(now) {
            self.rwlocks.remove(key);
            return None;
        }
        self.rwlocks.get_mut(key)
    }

    pub(super) fn acquire_read(
        &mut self,
        key: &LockKey,
        owner: &OwnerToken,
        lease: Duration,
        now: Instant,
    ) -> AcquireOutcome {
        self.sweep_now_and_then(now);
        if let Some(rw) = self.live_rw(key, now)
            && !rw.readers.contains_key(owner)
            && let Some(remaining) = rw.reader_blocked_for(now)
        {
            return AcquireOutcome::Held {
                remaining: Some(remaining),
            };
        }
        let rw = self.rwlocks.entry(key.clone()).or_default();
        rw.readers.insert(owner.clone(), far_add(now, lease));
        AcquireOutcome::Granted(self.epoch())
    }

    pub(super) fn acquire_write(
        &mut self,
        key: &LockKey,
        owner: &OwnerToken,
        waiter: Option<&OwnerToken>,
        lease: Duration,
        now: Instant,
    ) -> AcquireOutcome {
        self.sweep_now_and_then(now);
        if let Some(rw) = self.live_rw(key, now)
            && let Some(remaining) = rw.writer_blocked_for(owner, now)
        {
            if let Some(waiter) = waiter {
                rw.waiting.insert(waiter.clone(), far_add(now, lease));
            }
            return AcquireOutcome::Held {
                remaining: Some(remaining),
            };
        }
        let rw = self.rwlocks.entry(key.clone()).or_default();
        rw.writer = Some((owner.clone(), far_add(now, lease)));
        if let Some(waiter) = waiter {
            rw.waiting.remove(waiter);
        }
        AcquireOutcome::Granted(self.next_token())
    }

    pub(super) fn extend_rw(
        &mut self,
        key: &LockKey,
        owner: &OwnerToken,
        kind: LeaseKind,
        lease: Duration,
        now: Instant,
    ) -> bool {
        let Some(rw) = self.live_rw(key, now) else {
            return false;
        };
        let ends = match kind {
            LeaseKind::Read => rw.readers.get_mut(owner),
            LeaseKind::Write => match &mut rw.writer {
                Some((o, ends)) if o == owner => Some(ends),
                _ => None,
            },
            LeaseKind::WriterMark => rw.waiting.get_mut(owner),
            LeaseKind::Lock | LeaseKind::Permit => None,
        };
        ends.map(|ends| *ends = far_add(now, lease)).is_some()
    }

    pub(super) fn release_rw(
        &mut self,
        key: &LockKey,
        owner: &OwnerToken,
        kind: LeaseKind,
        now: Instant,
    ) -> bool {
        let Some(rw) = self.live_rw(key, now) else {
            return false;
        };
        let ours = match kind {
            LeaseKind::Read => rw.readers.remove(owner).is_some(),
            LeaseKind::Write => {
                let ours = rw.writer.as_ref().is_some_and(|(o, _)| o == owner);
                if ours {
                    rw.writer = None;
                }
                ours
            }
            // A waiting writer's mark taken back.
            LeaseKind::WriterMark => rw.waiting.remove(owner).is_some(),
            LeaseKind::Lock | LeaseKind::Permit => false,
        };
        self.rw_changed(key, now, ours)
    }

    /// After a release or withdrawal: drops `key`'s lock if nothing is
    /// left of it and, if something `changed`, wakes the key's waiters.
    fn rw_changed(&mut self, key: &LockKey, now: Instant, changed: bool) -> bool {
        let _ = self.live_rw(key, now);
        if changed && let Some(tx) = self.watchers.get(key) {
            tx.send_modify(|n| *n = n.wrapping_add(1));
        }
        changed
    }

    /// The token a read grant carries: the counter, raised to the clock
    /// where it is behind but not advanced, so that it is at least every
    /// token minted before and below every one minted after.
    fn epoch(&mut self) -> FencingToken {
        let wall_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0);
        self.last_token = self.last_token.max(wall_us);
        FencingToken::new(self.last_token)
    }
}
