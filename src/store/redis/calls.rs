//! The store's calls that run the scripts of `scripts.rs`: grants (through
//! `replicas.rs`, which waits for replicas where asked), renewals,
//! releases, finish and the permit's calls.

use std::time::Duration;

use bytes::Bytes;
use redis::{Cmd, Script};

use super::keys::{
    FENCE, LOCK, Name, PERMITS, PERMITS_WAITED, RECORD, RECORD_WRITER, RELEASED, WAITED,
};
use super::replicas::Grant;
use super::scripts::{
    ACQUIRE, ACQUIRE_PERMIT, Argv, EXTEND_PERMIT, FINISH, RAISE_FENCE, RELEASE_PERMIT, ROLLBACK,
    ScriptCall, TRANSFER, digits, grant_outcome,
};
use super::{RedisStore, ms};
use crate::error::{Error, Operation};
use crate::key::LockKey;
use crate::store::holder::HolderLabel;
use crate::store::{AcquireOutcome, LeaseKind};
use crate::token::{FencingToken, OwnerToken};

impl RedisStore {
    /// The acquire script: its outcome, and whether the lock was ours
    /// already (a re-entry: the token is the counter's, see acquire.lua).
    pub(crate) async fn acquire_script(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        lease: Duration,
        replay: bool,
        label: Option<&HolderLabel>,
    ) -> Result<(AcquireOutcome, bool), Error> {
        let fencing = self.inner.fencing;
        if !fencing && !replay && self.inner.wait_replicas.is_none() {
            // Without fencing, a free lock is one plain SET; the script
            // runs only when that found the key taken.
            let lock = self.name(key, LOCK);
            // Sized up front, as the scripts' commands are.
            let px = ms(lease);
            let bytes = "SETNXPX".len() + lock.byte_len() + owner.as_str().len() + digits(px);
            let mut set_nx = Cmd::with_capacity(6, bytes);
            set_nx
                .arg("SET")
                .arg(lock)
                .arg(owner.as_str())
                .arg("NX")
                .arg("PX")
                .arg(px);
            let set: Option<String> = self
                .with_conn(Operation::Acquire, Some(key), |mut c| async move {
                    set_nx.query_async(&mut c).await
                })
                .await?;
            if set.is_some() {
                return Ok((AcquireOutcome::GrantedUnfenced, false));
            }
        }
        let lock = [self.name(key, LOCK)];
        // The lock alone declared; the fence's name and retention only
        // with fencing; then the holder's label, the flags and the record
        // for a replay, each sent only where it or one after it is needed
        // (each argument costs Redis about 1,100 instructions: see
        // acquire.lua).
        let mut args = [
            Argv::Str(owner.as_str()),
            Argv::Int(ms(lease)),
            Argv::Str(""),
            Argv::Str(""),
            // (The label is written into a fenced lock's value only.)
            Argv::Str(match label {
                Some(l) if fencing => l.as_str(),
                _ => "",
            }),
            Argv::Str(if self.inner.source.is_cluster() {
                "c"
            } else {
                ""
            }),
            Argv::Str(""),
        ];
        if replay {
            args[6] = Argv::Name(self.name(key, RECORD));
        }
        if fencing {
            args[2] = Argv::Name(self.name(key, FENCE));
            args[3] = Argv::Int(self.inner.fence_retention_ms);
        }
        let (kind, value) = self.grant(key, owner, &lock, &mut args).await?;
        let unexpected = || Error::Unavailable {
            op: Operation::Acquire,
            key: Some(key.clone()),
            source: "unexpected reply from the acquire script".into(),
        };
        Ok(match (kind, value) {
            (1 | 3, _) if !fencing => (AcquireOutcome::GrantedUnfenced, kind == 3),
            (1 | 3, redis::Value::BulkString(digits)) => (
                AcquireOutcome::Granted(FencingToken::new(
                    std::str::from_utf8(&digits)
                        .ok()
                        .and_then(|d| d.parse().ok())
                        .ok_or_else(unexpected)?,
                )),
                kind == 3,
            ),
            (0, redis::Value::Int(n)) => (
                AcquireOutcome::Held {
                    remaining: (n >= 0).then(|| Duration::from_millis(n as u64)),
                },
                false,
            ),
            (2, redis::Value::BulkString(rec)) => {
                (AcquireOutcome::Completed(Bytes::from(rec)), false)
            }
            _ => return Err(unexpected()),
        })
    }

    /// Runs the acquire script with `args` (see [`acquire_script`]). A
    /// replay whose record may be on the other node of a migrating slot
    /// (answer 4) reads the record where the Cluster routes a plain `GET`,
    /// and, if there is none, runs the script again saying so: no record
    /// can appear meanwhile, as a new one is written where the lock is.
    ///
    /// [`acquire_script`]: RedisStore::acquire_script
    async fn grant(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        lock: &[Name<'_>],
        args: &mut [Argv<'_>; 7],
    ) -> Result<(i64, redis::Value), Error> {
        for _ in 0..3 {
            // Trailing empty arguments left out (acquire.lua reads an
            // absent one as empty).
            let len = args
                .iter()
                .rposition(|a| !matches!(a, Argv::Str("")))
                .map_or(0, |i| i + 1);
            let call = ScriptCall::new(&ACQUIRE, lock, &args[..len]);
            let grant = Grant {
                kind: LeaseKind::Lock,
                key,
                owner,
            };
            let answer = self.run_grant(&call, grant).await?;
            if answer.0 != 4 {
                return Ok(answer);
            }
            if let Some(rec) = Box::pin(crate::store::LockStore::read_record(self, key)).await? {
                return Ok((2, redis::Value::BulkString(rec.to_vec())));
            }
            // "Found no record on the node the slot leaves": the flags
            // with `m` (and `c`: a migrating slot is a Cluster's).
            args[5] = Argv::Str("cm");
        }
        Err(Error::Unavailable {
            op: Operation::Acquire,
            key: Some(key.clone()),
            source: "the record kept moving between the nodes of a migrating slot".into(),
        })
    }

    /// A lock handed from `from` to `to` (transfer.lua): `LockStore::transfer`.
    pub(super) async fn transfer_lock(
        &self,
        key: &LockKey,
        from: &OwnerToken,
        to: &OwnerToken,
        lease: Duration,
    ) -> Result<bool, Error> {
        let call = ScriptCall::new(
            &TRANSFER,
            &[self.name(key, LOCK)],
            &[
                Argv::Str(from.as_str()),
                Argv::Str(to.as_str()),
                Argv::Int(ms(lease)),
            ],
        );
        let n: i64 = self
            .with_conn(Operation::Extend, Some(key), |mut c| async move {
                call.invoke(&mut c).await
            })
            .await?;
        Ok(n == 1)
    }

    /// The permit grant (acquire_permit.lua).
    pub(super) async fn acquire_permit_script(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        permits: u32,
        lease: Duration,
    ) -> Result<AcquireOutcome, Error> {
        let fencing = self.inner.fencing;
        let mut args = [
            Argv::Str(owner.as_str()),
            Argv::Int(ms(lease)),
            Argv::Int(u64::from(permits)),
            Argv::Name(self.name(key, PERMITS_WAITED)),
            Argv::Str(""),
            Argv::Str(""),
            // The flags of migration.lua.
            Argv::Str(if self.inner.source.is_cluster() {
                "c"
            } else {
                ""
            }),
        ];
        if fencing {
            args[4] = Argv::Name(self.name(key, FENCE));
            args[5] = Argv::Int(self.inner.fence_retention_ms);
        }
        let call = ScriptCall::new(&ACQUIRE_PERMIT, &[self.name(key, PERMITS)], &args);
        let grant = Grant {
            kind: LeaseKind::Permit,
            key,
            owner,
        };
        let (kind, value) = self.run_grant(&call, grant).await?;
        grant_outcome(key, fencing, kind, value, "the permit script")
    }

    /// The permit renewal (extend_permit.lua).
    pub(super) async fn extend_permit_script(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        lease: Duration,
    ) -> Result<bool, Error> {
        self.extend_by(&EXTEND_PERMIT, (key, PERMITS), owner, lease)
            .await
    }

    /// The permit release (release_permit.lua).
    pub(super) async fn release_permit_script(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
    ) -> Result<bool, Error> {
        self.release_by(&RELEASE_PERMIT, (key, PERMITS, PERMITS_WAITED), owner)
            .await
    }

    /// Renews `owner`'s hold kept in `key`'s name `name` with `script`:
    /// extend_permit.lua for a member of a sorted set scored by its lease
    /// end (a permit, a reader of a reader-writer lock), extend.lua for a
    /// string holding the owner (a lock, a writer).
    pub(super) async fn extend_by(
        &self,
        script: &'static Script,
        (key, name): (&LockKey, &'static str),
        owner: &OwnerToken,
        lease: Duration,
    ) -> Result<bool, Error> {
        let call = ScriptCall::new(
            script,
            &[self.name(key, name)],
            &[Argv::Str(owner.as_str()), Argv::Int(ms(lease))],
        );
        let n: i64 = self
            .with_conn(Operation::Extend, Some(key), |mut c| async move {
                call.invoke(&mut c).await
            })
            .await?;
        Ok(n == 1)
    }

    /// Removes `owner`'s hold kept in `key`'s name `name` with `script`
    /// and, if its waited-for `mark` was set, announces the release:
    /// release_permit.lua for a member of a sorted set (a permit, a reader
    /// of a reader-writer lock, a waiting writer's mark),
    /// release_writer.lua for a writer.
    pub(super) async fn release_by(
        &self,
        script: &'static Script,
        (key, name, mark): (&LockKey, &'static str, &'static str),
        owner: &OwnerToken,
    ) -> Result<bool, Error> {
        let call = ScriptCall::new(
            script,
            &[self.name(key, name)],
            &[
                Argv::Str(owner.as_str()),
                Argv::Str(self.publish_command()),
                Argv::Name(self.name(key, mark)),
                Argv::Name(self.name(key, RELEASED)),
            ],
        );
        let n: i64 = self
            .with_conn(Operation::Release, Some(key), |mut c| async move {
                call.invoke(&mut c).await
            })
            .await?;
        Ok(n == 1)
    }

    /// Raises `key`'s fencing counter to at least `token`, so that the next
    /// grant on this node mints a larger token (Redlock write-back, forced
    /// release). With `owner` (a write-back), the lock's holder record
    /// takes the token too where the lock is still `owner`'s.
    pub(crate) async fn raise_fence(
        &self,
        key: &LockKey,
        token: FencingToken,
        owner: Option<&OwnerToken>,
    ) -> Result<(), Error> {
        let fence = self.name(key, FENCE);
        let call = match owner {
            None => ScriptCall::new(
                &RAISE_FENCE,
                &[fence],
                &[
                    Argv::Int(token.get()),
                    Argv::Int(self.inner.fence_retention_ms),
                ],
            ),
            Some(owner) => ScriptCall::new(
                &RAISE_FENCE,
                &[fence, self.name(key, LOCK)],
                &[
                    Argv::Int(token.get()),
                    Argv::Int(self.inner.fence_retention_ms),
                    Argv::Str(owner.as_str()),
                ],
            ),
        };
        let _: i64 = self
            .with_conn(Operation::Acquire, Some(key), |mut c| async move {
                call.invoke(&mut c).await
            })
            .await?;
        Ok(())
    }

    /// The finish script; with `mark`, it also stores who wrote the record
    /// (for [`rollback_record`](RedisStore::rollback_record)).
    pub(super) async fn finish_script(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        record: Bytes,
        retention: Duration,
        mark: bool,
    ) -> Result<bool, Error> {
        // The lock alone declared (see finish.lua); the record writer only
        // when marking (Redlock).
        let args = [
            Argv::Str(owner.as_str()),
            Argv::Bytes(record.as_ref()),
            Argv::Int(ms(retention)),
            Argv::Str(self.publish_command()),
            Argv::Name(self.name(key, RECORD)),
            Argv::Name(self.name(key, WAITED)),
            Argv::Name(self.name(key, RECORD_WRITER)),
        ];
        let args = if mark { &args[..] } else { &args[..6] };
        let call = ScriptCall::new(&FINISH, &[self.name(key, LOCK)], args);
        let migrating = !mark && self.inner.source.is_cluster();
        let n: i64 = self
            .with_conn(Operation::Release, Some(key), |mut c| async move {
                match call.invoke(&mut c).await {
                    // The lock's slot is leaving this node, and the record's
                    // name is not here: see `finish_while_migrating`.
                    Err(e) if migrating && e.to_string().contains("non local key") => Ok(-1),
                    other => other,
                }
            })
            .await?;
        if n == -1 {
            return self
                .finish_while_migrating(key, owner, record, retention)
                .await;
        }
        Ok(n == 1)
    }

    /// A finish whose lock is on the node its slot leaves, while the record
    /// is not there. That node creates no name of the slot any more (it may
    /// have moved), so the record cannot appear there before the move ends
    /// (records are written only by a holder of the lock, and we hold it):
    /// it is written where the slot goes, by a routed `SET` the node answers
    /// with ASK, once the lock is known ours for a while more; then the lock
    /// is released (the release script copes with the move).
    async fn finish_while_migrating(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        record: Bytes,
        retention: Duration,
    ) -> Result<bool, Error> {
        // Ours for the `SET` and the release at least.
        if !self.extend_lock(key, owner, self.inner.timeout * 4).await? {
            return Ok(false);
        }
        let mut set = Cmd::new();
        set.arg("SET")
            .arg(self.name(key, RECORD))
            .arg(record.as_ref())
            .arg("PX")
            .arg(ms(retention));
        let () = self
            .with_conn(Operation::Release, Some(key), |mut c| async move {
                set.query_async(&mut c).await
            })
            .await?;
        self.release_lock(key, owner).await
    }

    /// Finish that remembers the record's writer (Redlock).
    pub(crate) async fn finish_marked(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        record: Bytes,
        retention: Duration,
    ) -> Result<bool, Error> {
        self.finish_script(key, owner, record, retention, true)
            .await
    }

    /// Deletes `key`'s record if `owner` wrote it with
    /// [`finish_marked`](RedisStore::finish_marked): never a later holder's.
    pub(crate) async fn rollback_record(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
    ) -> Result<bool, Error> {
        let call = ScriptCall::new(
            &ROLLBACK,
            &[self.name(key, RECORD), self.name(key, RECORD_WRITER)],
            &[Argv::Str(owner.as_str())],
        );
        let n: i64 = self
            .with_conn(Operation::Release, Some(key), |mut c| async move {
                call.invoke(&mut c).await
            })
            .await?;
        Ok(n == 1)
    }
}
