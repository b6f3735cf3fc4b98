//! Several keys at once on the memory store: checked and granted under
//! the store's one mutex, so a partial grant is never seen.

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::{Held, State};
use crate::key::LockKey;
use crate::store::AcquireAllOutcome;
use crate::time::far_add;
use crate::token::OwnerToken;

impl State {
    /// Every key of `keys` to `owner`, or none. Every key found held by
    /// another owner is marked as waited-for (so that the release of any
    /// of them wakes the waiters); the answer names the one whose lease
    /// ends last (none can be granted before).
    pub(super) fn acquire_all(
        &mut self,
        keys: &[LockKey],
        owner: &OwnerToken,
        lease: Duration,
        now: Instant,
    ) -> AcquireAllOutcome {
        self.sweep_now_and_then(now);
        let mut held: Option<(usize, Duration)> = None;
        for (index, key) in keys.iter().enumerate() {
            if let Some(h) = self.live(key, now)
                && h.owner != *owner
            {
                h.waited = true;
                let remaining = h.expires - now;
                if held.is_none_or(|(_, r)| remaining > r) {
                    held = Some((index, remaining));
                }
            }
        }
        if let Some((index, remaining)) = held {
            return AcquireAllOutcome::Held {
                index,
                remaining: Some(remaining),
            };
        }
        let expires = far_add(now, lease);
        let mut tokens = Vec::with_capacity(keys.len());
        for key in keys {
            // (Ours already, an attempt whose answer was lost: its lease is
            // reset and its token stands, as for a single lock.)
            if let Some(h) = self.live(key, now) {
                h.expires = expires;
                tokens.push(Ok(h.token));
                continue;
            }
            let token = self.next_token();
            self.locks.insert(
                key.clone(),
                Held {
                    owner: owner.clone(),
                    token,
                    expires,
                    label: None,
                    granted_at: SystemTime::now(),
                    waited: false,
                },
            );
            tokens.push(Ok(token));
        }
        AcquireAllOutcome::Granted(tokens)
    }

    /// Releases each key `owner` holds (waking its waiters): whether each
    /// was ours.
    pub(super) fn release_all(
        &mut self,
        keys: &[LockKey],
        owner: &OwnerToken,
        now: Instant,
    ) -> Vec<bool> {
        keys.iter()
            .map(|key| self.release(key, owner, now))
            .collect()
    }
}
