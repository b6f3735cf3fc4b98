//! Several locks at once on Redis: one script (acquire_all.lua,
//! release_all.lua) where the locks are in one place (one primary,
//! Sentinel's primary, one Cluster slot), the one-by-one path of
//! `store/multi.rs` otherwise.

use std::time::Duration;

use super::keys::{FENCE, LOCK, WAITED};
use super::scripts::{ACQUIRE_ALL, Argv, RELEASE_ALL, ScriptCall};
use super::{RedisStore, ms};
use crate::error::{Error, Operation};
use crate::key::LockKey;
use crate::store::AcquireAllOutcome;
use crate::store::multi::{acquire_in_order, release_each};
use crate::token::{FencingToken, OwnerToken, Unfenced};

impl RedisStore {
    /// Whether one script can take `keys`: they are on one node and the
    /// grant is not followed by a `WAIT` for replicas (which the
    /// one-by-one path does per key, through `acquire`).
    fn one_script_for(&self, keys: &[LockKey]) -> bool {
        if self.inner.wait_replicas.is_some() {
            return false;
        }
        !self.inner.source.is_cluster() || self.same_slot(keys)
    }

    /// Whether every lock of `keys` hashes to one Cluster slot.
    #[cfg(feature = "cluster")]
    fn same_slot(&self, keys: &[LockKey]) -> bool {
        use redis::cluster_routing::Slot;
        let slot = |k: &LockKey| Slot::for_key(self.name(k, LOCK).to_string());
        let Some(first) = keys.first().map(slot) else {
            return true;
        };
        keys.iter().skip(1).all(|k| slot(k) == first)
    }

    #[cfg(not(feature = "cluster"))]
    fn same_slot(&self, _keys: &[LockKey]) -> bool {
        true
    }

    /// `LockStore::grant_all`: one script where it can, else the keys
    /// one by one in the order given, rolled back on the first held.
    pub(super) async fn acquire_all_keys(
        &self,
        keys: &[LockKey],
        owner: &OwnerToken,
        lease: Duration,
    ) -> Result<AcquireAllOutcome, Error> {
        if self.one_script_for(keys)
            && let Some(outcome) = self.acquire_all_script(keys, owner, lease).await?
        {
            return Ok(outcome);
        }
        acquire_in_order(self, keys, owner, lease, None).await
    }

    /// The acquire_all.lua call; `None` when the slot migrates (the
    /// script took nothing).
    async fn acquire_all_script(
        &self,
        keys: &[LockKey],
        owner: &OwnerToken,
        lease: Duration,
    ) -> Result<Option<AcquireAllOutcome>, Error> {
        let fencing = self.inner.fencing;
        // The first lock declared, every lock named in `ARGV` (see
        // acquire_all.lua): a Cluster serves a call of one declared key
        // while its slot migrates.
        let mut args = Vec::with_capacity(5 + 3 * keys.len());
        args.extend([
            Argv::Str(owner.as_str()),
            Argv::Int(ms(lease)),
            // The flags of migration.lua.
            Argv::Str(if self.inner.source.is_cluster() {
                "c"
            } else {
                ""
            }),
            if fencing {
                Argv::Int(self.inner.fence_retention_ms)
            } else {
                Argv::Str("")
            },
            Argv::Str(""),
        ]);
        for k in keys {
            args.push(Argv::Name(self.name(k, LOCK)));
            args.push(Argv::Name(self.name(k, WAITED)));
            args.push(if fencing {
                Argv::Name(self.name(k, FENCE))
            } else {
                Argv::Str("")
            });
        }
        let first = keys.first().map(|k| self.name(k, LOCK));
        let call = ScriptCall::new(&ACQUIRE_ALL, first.as_slice(), &args);
        let answer: Vec<redis::Value> = self
            .with_conn(Operation::Acquire, keys.first(), |mut c| async move {
                call.invoke(&mut c).await
            })
            .await?;
        let unexpected = || Error::Unavailable {
            op: Operation::Acquire,
            key: keys.first().cloned(),
            source: "unexpected reply from the acquire_all script".into(),
        };
        let int = |v: &redis::Value| match v {
            redis::Value::Int(n) => Some(*n),
            _ => None,
        };
        match answer.first().and_then(int) {
            Some(4) => Ok(None),
            Some(0) => {
                let index = answer.get(1).and_then(int).ok_or_else(unexpected)?;
                let pttl = answer.get(2).and_then(int).ok_or_else(unexpected)?;
                let index = index
                    .checked_sub(1)
                    .and_then(|i| usize::try_from(i).ok())
                    .ok_or_else(unexpected)?;
                Ok(Some(AcquireAllOutcome::Held {
                    index,
                    remaining: (pttl >= 0).then(|| Duration::from_millis(pttl as u64)),
                }))
            }
            Some(1) if answer.len() == keys.len() + 1 => {
                let tokens = answer[1..]
                    .iter()
                    .map(|v| match v {
                        _ if !fencing => Ok(Err(Unfenced)),
                        redis::Value::BulkString(digits) => std::str::from_utf8(digits)
                            .ok()
                            .and_then(|d| d.parse().ok())
                            .map(|t| Ok(FencingToken::new(t)))
                            .ok_or_else(unexpected),
                        _ => Err(unexpected()),
                    })
                    .collect::<Result<_, _>>()?;
                Ok(Some(AcquireAllOutcome::Granted(tokens)))
            }
            _ => Err(unexpected()),
        }
    }

    /// `LockStore::release_all`: one script where the locks are in one
    /// place, else each released on its own.
    pub(super) async fn release_all_keys(
        &self,
        keys: &[LockKey],
        owner: &OwnerToken,
    ) -> Result<Vec<bool>, Error> {
        if self.inner.source.is_cluster() && !self.same_slot(keys) {
            return release_each(self, keys, owner).await;
        }
        // The first lock declared, every lock named in `ARGV` (see
        // release_all.lua).
        let mut args = Vec::with_capacity(2 + 2 * keys.len());
        args.extend([
            Argv::Str(owner.as_str()),
            // The flags of migration.lua.
            Argv::Str(if self.inner.source.is_cluster() {
                "c"
            } else {
                ""
            }),
        ]);
        for k in keys {
            args.push(Argv::Name(self.name(k, LOCK)));
            args.push(Argv::Name(self.name(k, WAITED)));
        }
        let first = keys.first().map(|k| self.name(k, LOCK));
        let call = ScriptCall::new(&RELEASE_ALL, first.as_slice(), &args);
        let answer: Vec<i64> = self
            .with_conn(Operation::Release, keys.first(), |mut c| async move {
                call.invoke(&mut c).await
            })
            .await?;
        if answer.len() != keys.len() {
            return Err(Error::Unavailable {
                op: Operation::Release,
                key: keys.first().cloned(),
                source: "unexpected reply from the release_all script".into(),
            });
        }
        // A lock the script did not find where it ran (the other node of a
        // migrating slot, or maybe): released alone, where the Cluster
        // routes it. The first error is answered, after every key.
        let mut owned = Vec::with_capacity(keys.len());
        let mut first_error = None;
        for (k, n) in keys.iter().zip(answer) {
            owned.push(match n {
                -1 => match self.release_lock(k, owner).await {
                    Ok(ours) => ours,
                    Err(e) => {
                        first_error.get_or_insert(e);
                        false
                    }
                },
                n => n == 1,
            });
        }
        first_error.map_or(Ok(owned), Err)
    }
}
