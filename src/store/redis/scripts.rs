//! The Lua scripts of the store, one `.lua` file each (their comments say
//! what they take and answer), built once and run with EVALSHA (reloaded
//! on `NOSCRIPT`), and the store's calls that run them.
//!
//! Release and finish announce the release on the release channel, when a
//! waiter marked the lock (an acquire that found it held), with the publish
//! command they are given (`PUBLISH`, or `SPUBLISH` on a cluster: the
//! channel shares the lock's hash tag, so it is in the script's slot).
//! `pcall`: a server that lacks the command (a cluster before Redis 7)
//! still releases; its waiters poll.

use std::sync::LazyLock;
use std::time::Duration;

use bytes::Bytes;
use redis::Script;

use super::keys::{FENCE, LOCK, RECORD, RECORD_WRITER, WAITED};
use super::{RedisStore, ms};
use crate::store::AcquireOutcome;
use crate::{Error, FencingToken, LockKey, Operation, OwnerToken};

pub(super) const ACQUIRE_SRC: &str = include_str!("scripts/acquire.lua");
pub(super) const EXTEND_SRC: &str = include_str!("scripts/extend.lua");
pub(super) const RELEASE_SRC: &str = include_str!("scripts/release.lua");
pub(super) const FINISH_SRC: &str = include_str!("scripts/finish.lua");

pub(super) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE_SRC));
pub(super) static EXTEND: LazyLock<Script> = LazyLock::new(|| Script::new(EXTEND_SRC));
pub(super) static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE_SRC));
static FINISH: LazyLock<Script> = LazyLock::new(|| Script::new(FINISH_SRC));
static RAISE_FENCE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/raise_fence.lua")));
static ROLLBACK: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/rollback.lua")));

/// The scripts every command connection loads up front (in one round trip,
/// so that first uses do not pay for a `NOSCRIPT` answer).
pub(super) const PRELOADED: [&str; 4] = [ACQUIRE_SRC, EXTEND_SRC, RELEASE_SRC, FINISH_SRC];

impl RedisStore {
    /// The acquire script: its outcome, and whether the lock was ours
    /// already (a re-entry: the token is the counter's, see acquire.lua).
    pub(crate) async fn acquire_script(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        lease: Duration,
        replay: bool,
    ) -> Result<(AcquireOutcome, bool), Error> {
        let fencing = self.inner.fencing;
        if !fencing && !replay && self.inner.wait_replicas.is_none() {
            // Without fencing, a free lock is one plain SET; the script
            // runs only when that found the key taken.
            let lock = self.name(key, LOCK);
            let set: Option<String> = self
                .with_conn(Operation::Acquire, Some(key), |mut c| async move {
                    redis::cmd("SET")
                        .arg(lock)
                        .arg(owner.as_str())
                        .arg("NX")
                        .arg("PX")
                        .arg(ms(lease))
                        .query_async(&mut c)
                        .await
                })
                .await?;
            if set.is_some() {
                return Ok((AcquireOutcome::GrantedUnfenced, false));
            }
        }
        let mut inv = ACQUIRE.key(self.name(key, LOCK));
        inv.key(self.name(key, WAITED));
        if fencing {
            inv.key(self.name(key, FENCE));
        }
        if replay {
            inv.key(self.name(key, RECORD));
        }
        inv.arg(owner.as_str()).arg(ms(lease));
        if fencing {
            inv.arg(self.inner.fence_retention_ms);
        }
        let (kind, value) = match self.inner.wait_replicas {
            None => {
                self.with_conn(Operation::Acquire, Some(key), |mut c| async move {
                    inv.invoke_async(&mut c).await
                })
                .await?
            }
            Some(w) => {
                let (kind, value, acked) = self.grant_and_wait(&inv, key, w).await?;
                if let Some(acked) = acked {
                    self.check_replicas(key, owner, w, acked).await?;
                }
                (kind, value)
            }
        };
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

    /// Raises `key`'s fencing counter to at least `token`, so that the next
    /// grant on this node mints a larger token (Redlock write-back).
    pub(crate) async fn raise_fence(
        &self,
        key: &LockKey,
        token: FencingToken,
    ) -> Result<(), Error> {
        let mut inv = RAISE_FENCE.key(self.name(key, FENCE));
        inv.arg(token.get()).arg(self.inner.fence_retention_ms);
        let _: i64 = self
            .with_conn(Operation::Acquire, Some(key), |mut c| async move {
                inv.invoke_async(&mut c).await
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
        let mut inv = FINISH.key(self.name(key, LOCK));
        inv.key(self.name(key, RECORD));
        inv.key(self.name(key, WAITED));
        if mark {
            inv.key(self.name(key, RECORD_WRITER));
        }
        inv.arg(owner.as_str())
            .arg(record.as_ref())
            .arg(ms(retention))
            .arg(self.publish_command());
        let n: i64 = self
            .with_conn(Operation::Release, Some(key), |mut c| async move {
                inv.invoke_async(&mut c).await
            })
            .await?;
        Ok(n == 1)
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
        let mut inv = ROLLBACK.key(self.name(key, RECORD));
        inv.key(self.name(key, RECORD_WRITER)).arg(owner.as_str());
        let n: i64 = self
            .with_conn(Operation::Release, Some(key), |mut c| async move {
                inv.invoke_async(&mut c).await
            })
            .await?;
        Ok(n == 1)
    }
}
