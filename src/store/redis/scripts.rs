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
use redis::{Cmd, FromRedisValue, RedisError, RedisResult, Script, ToRedisArgs};

use super::keys::{FENCE, LOCK, Name, RECORD, RECORD_WRITER, WAITED};
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
const RAISE_FENCE_SRC: &str = include_str!("scripts/raise_fence.lua");
const ROLLBACK_SRC: &str = include_str!("scripts/rollback.lua");
static RAISE_FENCE: LazyLock<Script> = LazyLock::new(|| Script::new(RAISE_FENCE_SRC));
static ROLLBACK: LazyLock<Script> = LazyLock::new(|| Script::new(ROLLBACK_SRC));

/// The source of one of the scripts above (for loading it where a call
/// goes; redis-rs keeps a `Script`'s code to itself).
#[cfg(feature = "cluster")]
pub(super) fn source_of(script: &Script) -> &'static str {
    let scripts: [(&Script, &'static str); 6] = [
        (&ACQUIRE, ACQUIRE_SRC),
        (&EXTEND, EXTEND_SRC),
        (&RELEASE, RELEASE_SRC),
        (&FINISH, FINISH_SRC),
        (&RAISE_FENCE, RAISE_FENCE_SRC),
        (&ROLLBACK, ROLLBACK_SRC),
    ];
    scripts
        .into_iter()
        .find(|(s, _)| std::ptr::eq(*s, script))
        .map_or("", |(_, src)| src)
}

/// A connection a script can be loaded on where a call of it goes.
pub(super) trait LoadFor: redis::aio::ConnectionLike + Send {
    /// Loads `script` where `call` (its `EVALSHA`) goes.
    fn load_for(
        &mut self,
        script: &'static Script,
        call: &Cmd,
    ) -> impl Future<Output = RedisResult<()>> + Send;
}

impl LoadFor for redis::aio::MultiplexedConnection {
    async fn load_for(&mut self, script: &'static Script, _call: &Cmd) -> RedisResult<()> {
        script.load_async(self).await.map(drop)
    }
}

/// The scripts every command connection loads up front (in one round trip,
/// so that first uses do not pay for a `NOSCRIPT` answer).
pub(super) const PRELOADED: [&str; 4] = [ACQUIRE_SRC, EXTEND_SRC, RELEASE_SRC, FINISH_SRC];

/// One `ARGV` value of a script call: the kinds the scripts take, each of a
/// known length, so that a call's command is sized before it is written.
#[derive(Clone, Copy)]
pub(super) enum Argv<'a> {
    Str(&'a str),
    Bytes(&'a [u8]),
    Int(u64),
}

impl Argv<'_> {
    fn byte_len(&self) -> usize {
        match self {
            Argv::Str(s) => s.len(),
            Argv::Bytes(b) => b.len(),
            Argv::Int(n) => digits(*n),
        }
    }
}

impl ToRedisArgs for Argv<'_> {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        // Each as its own type writes itself (one argument each).
        match self {
            Argv::Str(s) => s.write_redis_args(out),
            Argv::Bytes(b) => b.write_redis_args(out),
            Argv::Int(n) => n.write_redis_args(out),
        }
    }
}

/// The decimal digits of `n`.
fn digits(n: u64) -> usize {
    n.checked_ilog10().map_or(1, |d| d as usize + 1)
}

/// The bytes of `EVALSHA <sha1> <numkeys> <keys> <args>` (the arguments
/// only: the framing is added when the command is packed).
fn evalsha_len(script: &Script, keys: &[Name<'_>], args: &[Argv<'_>]) -> usize {
    "EVALSHA".len()
        + script.get_hash().len()
        + digits(keys.len() as u64)
        + keys.iter().map(Name::byte_len).sum::<usize>()
        + args.iter().map(Argv::byte_len).sum::<usize>()
}

/// `EVALSHA <sha1> <numkeys> <keys> <args>` as one command, its buffers
/// allocated once at their final size. (redis-rs' `ScriptInvocation` makes
/// a buffer per key and argument, then copies them into the command.)
pub(super) fn evalsha(script: &Script, keys: &[Name<'_>], args: &[Argv<'_>]) -> Cmd {
    let mut cmd = Cmd::with_capacity(3 + keys.len() + args.len(), evalsha_len(script, keys, args));
    cmd.arg("EVALSHA").arg(script.get_hash()).arg(keys.len());
    for k in keys {
        cmd.arg(k);
    }
    for a in args {
        cmd.arg(a);
    }
    cmd
}

/// Whether Redis answered that it does not have the script (its cache was
/// flushed, or the server restarted or failed over since it was loaded).
pub(super) fn is_no_script(e: &RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
}

/// One run of a script: its EVALSHA command (see [`evalsha`]), sent by
/// [`invoke`](ScriptCall::invoke).
pub(super) struct ScriptCall {
    script: &'static Script,
    cmd: Cmd,
}

impl ScriptCall {
    pub(super) fn new(script: &'static Script, keys: &[Name<'_>], args: &[Argv<'_>]) -> Self {
        ScriptCall {
            script,
            cmd: evalsha(script, keys, args),
        }
    }

    /// Sends the call; on `NOSCRIPT`, loads the script where the call goes
    /// (see [`LoadFor`]) and sends it once more.
    pub(super) async fn invoke<T: FromRedisValue>(&self, c: &mut impl LoadFor) -> RedisResult<T> {
        match self.cmd.query_async(c).await {
            // Boxed: rare, and it would otherwise grow every call's future.
            Err(e) if is_no_script(&e) => Box::pin(self.reload_and_send(c)).await,
            answer => answer,
        }
    }

    async fn reload_and_send<T: FromRedisValue>(&self, c: &mut impl LoadFor) -> RedisResult<T> {
        c.load_for(self.script, &self.cmd).await?;
        self.cmd.query_async(c).await
    }
}

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
        let (lock, waited) = (self.name(key, LOCK), self.name(key, WAITED));
        let (fence, record) = (self.name(key, FENCE), self.name(key, RECORD));
        // Lock and waited-for mark, then the fence counter with fencing and
        // the record last for a replay (see acquire.lua).
        let keys: &[Name<'_>] = match (fencing, replay) {
            (true, true) => &[lock, waited, fence, record],
            (true, false) => &[lock, waited, fence],
            (false, true) => &[lock, waited, record],
            (false, false) => &[lock, waited],
        };
        let args = [
            Argv::Str(owner.as_str()),
            Argv::Int(ms(lease)),
            Argv::Int(self.inner.fence_retention_ms),
        ];
        // The fence retention only with fencing: the script tells by it.
        let args = if fencing { &args[..] } else { &args[..2] };
        let call = ScriptCall::new(&ACQUIRE, keys, args);
        let (kind, value) = match self.inner.wait_replicas {
            None => {
                self.with_conn(Operation::Acquire, Some(key), |mut c| async move {
                    call.invoke(&mut c).await
                })
                .await?
            }
            // Boxed: its futures would otherwise grow every grant's.
            Some(w) => Box::pin(self.grant_on_replicas(&call, key, owner, w)).await?,
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
        let call = ScriptCall::new(
            &RAISE_FENCE,
            &[self.name(key, FENCE)],
            &[
                Argv::Int(token.get()),
                Argv::Int(self.inner.fence_retention_ms),
            ],
        );
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
        let keys = [
            self.name(key, LOCK),
            self.name(key, RECORD),
            self.name(key, WAITED),
            self.name(key, RECORD_WRITER),
        ];
        // The record writer only when marking (Redlock).
        let keys = if mark { &keys[..] } else { &keys[..3] };
        let call = ScriptCall::new(
            &FINISH,
            keys,
            &[
                Argv::Str(owner.as_str()),
                Argv::Bytes(record.as_ref()),
                Argv::Int(ms(retention)),
                Argv::Str(self.publish_command()),
            ],
        );
        let n: i64 = self
            .with_conn(Operation::Release, Some(key), |mut c| async move {
                call.invoke(&mut c).await
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes of a command's arguments (what its data buffer holds).
    fn written(cmd: &Cmd) -> usize {
        cmd.args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => b.len(),
                _ => unreachable!("only plain arguments in a script call"),
            })
            .sum()
    }

    /// Every call's command is sized exactly (so its buffer never grows)
    /// and holds the same bytes as one built argument by argument.
    #[test]
    fn script_calls_are_sized_exactly_and_unchanged() {
        let store = RedisStore::from_url("redis://127.0.0.1:1/").unwrap();
        let key = LockKey::new("orders", "ord_0123456789").unwrap();
        let owner = OwnerToken::generate();
        let name = |suffix| store.name(&key, suffix);
        let record = [7u8; 300];
        let calls: [(&Script, Vec<Name<'_>>, Vec<Argv<'_>>); 6] = [
            (
                &ACQUIRE,
                vec![name(LOCK), name(WAITED), name(FENCE), name(RECORD)],
                vec![
                    Argv::Str(owner.as_str()),
                    Argv::Int(30_000),
                    Argv::Int(u64::MAX),
                ],
            ),
            (
                &EXTEND,
                vec![name(LOCK)],
                vec![Argv::Str(owner.as_str()), Argv::Int(1)],
            ),
            (
                &RELEASE,
                vec![name(LOCK), name(WAITED)],
                vec![Argv::Str(owner.as_str()), Argv::Str("PUBLISH")],
            ),
            (
                &FINISH,
                vec![name(LOCK), name(RECORD), name(WAITED), name(RECORD_WRITER)],
                vec![
                    Argv::Str(owner.as_str()),
                    Argv::Bytes(&record),
                    Argv::Int(86_400_000),
                    Argv::Str("SPUBLISH"),
                ],
            ),
            (
                &RAISE_FENCE,
                vec![name(FENCE)],
                vec![Argv::Int(1_700_000_000_000_000), Argv::Int(0)],
            ),
            (
                &ROLLBACK,
                vec![name(RECORD), name(RECORD_WRITER)],
                vec![Argv::Str(owner.as_str())],
            ),
        ];
        for (script, keys, args) in &calls {
            let cmd = evalsha(script, keys, args);
            assert_eq!(written(&cmd), evalsha_len(script, keys, args));
            assert_eq!(cmd.args_iter().len(), 3 + keys.len() + args.len());
            let mut plain = redis::cmd("EVALSHA");
            plain.arg(script.get_hash()).arg(keys.len());
            for k in keys {
                plain.arg(k.to_string());
            }
            for a in args {
                match a {
                    Argv::Str(s) => plain.arg(*s),
                    Argv::Bytes(b) => plain.arg(*b),
                    Argv::Int(n) => plain.arg(*n),
                };
            }
            assert_eq!(cmd.get_packed_command(), plain.get_packed_command());
        }
    }

    #[test]
    fn digits_of_numbers() {
        for n in [0, 1, 9, 10, 99, 100, 30_000, u64::MAX] {
            assert_eq!(digits(n), n.to_string().len(), "{n}");
        }
    }
}
