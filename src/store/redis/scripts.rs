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

use redis::{Cmd, FromRedisValue, RedisError, RedisResult, Script, ToRedisArgs};

use super::keys::Name;
use crate::error::{Error, Operation};
use crate::key::LockKey;
use crate::store::AcquireOutcome;
use crate::token::FencingToken;

// Every script is one `.lua` file behind the shared pieces it uses, each
// written once and prepended here: the fencing token rule (token.lua), the
// owner check of a lock's value (owner.lua) and the slot-migration prelude
// (migration.lua, through `migration!`). A rule changed in its file is
// changed for every script that follows it.

/// The slot-migration prelude (migration.lua) of a script whose flags are
/// its `ARGV[$at]` ('c' on a Cluster, 'cm' after the caller looked for
/// what its {4} answer asked about): the prelude's first line names them.
macro_rules! migration {
    ($at:literal) => {
        concat!(
            "local flags = ARGV[",
            $at,
            "]\n",
            include_str!("scripts/migration.lua")
        )
    };
}

/// The lock's grant (acquire.lua).
pub(super) const ACQUIRE_SRC: &str = concat!(
    include_str!("scripts/token.lua"),
    include_str!("scripts/owner.lua"),
    migration!(6),
    include_str!("scripts/acquire.lua")
);
pub(super) const EXTEND_SRC: &str = concat!(
    include_str!("scripts/owner.lua"),
    include_str!("scripts/extend.lua")
);
pub(super) const RELEASE_SRC: &str = concat!(
    include_str!("scripts/owner.lua"),
    include_str!("scripts/release.lua")
);
pub(super) const FINISH_SRC: &str = concat!(
    include_str!("scripts/owner.lua"),
    include_str!("scripts/finish.lua")
);

pub(super) const TRANSFER_SRC: &str = concat!(
    include_str!("scripts/owner.lua"),
    include_str!("scripts/transfer.lua")
);
const ACQUIRE_PERMIT_SRC: &str = concat!(
    include_str!("scripts/token.lua"),
    migration!(7),
    include_str!("scripts/acquire_permit.lua")
);
pub(super) const EXTEND_PERMIT_SRC: &str = include_str!("scripts/extend_permit.lua");
const RELEASE_PERMIT_SRC: &str = include_str!("scripts/release_permit.lua");
const RAISE_FENCE_SRC: &str = concat!(
    include_str!("scripts/token.lua"),
    include_str!("scripts/owner.lua"),
    include_str!("scripts/raise_fence.lua")
);
const ROLLBACK_SRC: &str = include_str!("scripts/rollback.lua");
/// The renewal of a batch in one call: the owner check (owner.lua), the
/// bodies of extend.lua and
/// extend_permit.lua, unchanged, each wrapped as a function of its own
/// `KEYS` and `ARGV`, then extend_batch.lua's loop, which runs the right
/// one for each renewal. A renewal thus means the same alone and in a
/// batch, whatever those bodies come to say.
pub(super) const EXTEND_BATCH_SRC: &str = concat!(
    include_str!("scripts/owner.lua"),
    "local function extend_lock(KEYS, ARGV)\n",
    include_str!("scripts/extend.lua"),
    "\nend\nlocal function extend_permit(KEYS, ARGV)\n",
    include_str!("scripts/extend_permit.lua"),
    "\nend\n",
    include_str!("scripts/extend_batch.lua")
);
const INSPECT_SRC: &str = include_str!("scripts/inspect.lua");
const FORCE_RELEASE_SRC: &str = concat!(
    include_str!("scripts/token.lua"),
    migration!(2),
    include_str!("scripts/force_release.lua")
);

/// The multi-key grant: the token rule and the owner check of the single
/// grant (token.lua, owner.lua) and acquire_all.lua.
pub(super) const ACQUIRE_ALL_SRC: &str = concat!(
    include_str!("scripts/token.lua"),
    include_str!("scripts/owner.lua"),
    migration!(3),
    include_str!("scripts/acquire_all.lua")
);
pub(super) const RELEASE_ALL_SRC: &str = concat!(
    include_str!("scripts/owner.lua"),
    migration!(2),
    include_str!("scripts/release_all.lua")
);
/// The reader-writer lock's grant (either side) and the writer's release.
const ACQUIRE_RW_SRC: &str = concat!(
    include_str!("scripts/token.lua"),
    include_str!("scripts/owner.lua"),
    migration!(4),
    include_str!("scripts/acquire_rw.lua")
);
const RELEASE_WRITER_SRC: &str = concat!(
    include_str!("scripts/owner.lua"),
    include_str!("scripts/release_writer.lua")
);

/// A lease's read-back where it was granted (`replicas.rs`, a Cluster's
/// grant that waits for replicas), by its kind: a script of no declared
/// key (so that a node runs it without a redirect) answering 1 where
/// `ARGV[2]` holds the lease in the name `ARGV[1]` on the node it runs
/// on, else 0. A lock and a writer are owner-checked as every script
/// checks them (owner.lua). Run with `EVAL` (rare: not preloaded).
#[cfg(feature = "cluster")]
pub(super) const HELD_HERE_LOCK_SRC: &str = concat!(
    include_str!("scripts/owner.lua"),
    "return owned_by(redis.call('GET', ARGV[1]), ARGV[2]) and 1 or 0"
);
/// The same for a member of a sorted set (a permit, a reader).
#[cfg(feature = "cluster")]
pub(super) const HELD_HERE_MEMBER_SRC: &str =
    "return redis.call('ZSCORE', ARGV[1], ARGV[2]) and 1 or 0";

/// Defines each script the store runs as a `static` built from its source
/// on first use, and [`ALL`], every one of them with its source: a script
/// exists only through this list, so none can be left out of what a new
/// connection loads (`connection.rs`) or of [`source_of`].
macro_rules! scripts {
    ($($name:ident = $src:ident;)*) => {
        $(pub(super) static $name: LazyLock<Script> = LazyLock::new(|| Script::new($src));)*

        /// Every script the store runs, with its source.
        pub(super) static ALL: &[(&LazyLock<Script>, &str)] = &[$((&$name, $src)),*];
    };
}

scripts! {
    ACQUIRE = ACQUIRE_SRC;
    EXTEND = EXTEND_SRC;
    EXTEND_BATCH = EXTEND_BATCH_SRC;
    TRANSFER = TRANSFER_SRC;
    RELEASE = RELEASE_SRC;
    FINISH = FINISH_SRC;
    RAISE_FENCE = RAISE_FENCE_SRC;
    ROLLBACK = ROLLBACK_SRC;
    ACQUIRE_PERMIT = ACQUIRE_PERMIT_SRC;
    EXTEND_PERMIT = EXTEND_PERMIT_SRC;
    RELEASE_PERMIT = RELEASE_PERMIT_SRC;
    INSPECT = INSPECT_SRC;
    FORCE_RELEASE = FORCE_RELEASE_SRC;
    ACQUIRE_ALL = ACQUIRE_ALL_SRC;
    RELEASE_ALL = RELEASE_ALL_SRC;
    ACQUIRE_RW = ACQUIRE_RW_SRC;
    RELEASE_WRITER = RELEASE_WRITER_SRC;
}

impl super::RedisStore {
    /// The sources of the lock's grant and release scripts as the store
    /// loads them (each behind the shared pieces it uses): for a test that
    /// leaves a server these scripts alone. A test hook, not part of the
    /// stable API.
    #[cfg(any(test, feature = "test-util"))]
    #[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
    pub fn lock_script_sources() -> [&'static str; 2] {
        [ACQUIRE_SRC, RELEASE_SRC]
    }
}

/// The source of one of the scripts above (for loading it where a call
/// goes; redis-rs keeps a `Script`'s code to itself).
pub(super) fn source_of(script: &Script) -> &'static str {
    ALL.iter()
        .find(|(s, _)| std::ptr::eq(&***s, script))
        .map_or("", |(_, src)| src)
}

/// The sources a new command connection loads up front, in one round trip
/// (see `connection.rs`): every script the store runs, so that no call's
/// first use pays for a `NOSCRIPT` answer, a `SCRIPT LOAD` and its call
/// again (three round trips for one: to a far Redlock node, the time a
/// short lease's grant needs). Scripts are loaded per server, not per
/// connection: loading on a server that has them only checks their SHA1.
pub(super) fn preloaded() -> impl Iterator<Item = &'static str> {
    ALL.iter().map(|(_, src)| *src)
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

/// One `ARGV` value of a script call: the kinds the scripts take, each of a
/// known length, so that a call's command is sized before it is written.
#[derive(Clone, Copy)]
pub(super) enum Argv<'a> {
    Str(&'a str),
    Bytes(&'a [u8]),
    Int(u64),
    /// A name the script reaches without declaring it (see migration.lua,
    /// "Slot migration").
    Name(Name<'a>),
}

impl Argv<'_> {
    fn byte_len(&self) -> usize {
        match self {
            Argv::Str(s) => s.len(),
            Argv::Bytes(b) => b.len(),
            Argv::Int(n) => digits(*n),
            Argv::Name(n) => n.byte_len(),
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
            Argv::Name(n) => n.write_redis_args(out),
        }
    }
}

/// The decimal digits of `n`.
pub(super) fn digits(n: u64) -> usize {
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

/// A grant script's answer: `{kind, value}`, or a bare string, which is
/// a fenced grant's token (kind 1). acquire.lua answers its usual outcome
/// so: a table costs Redis about 4,800 instructions more to answer than a
/// string (see the script).
pub(super) struct GrantAnswer(pub(super) i64, pub(super) redis::Value);

impl FromRedisValue for GrantAnswer {
    fn from_redis_value(v: redis::Value) -> Result<Self, redis::ParsingError> {
        match v {
            redis::Value::BulkString(_) => Ok(GrantAnswer(1, v)),
            table => {
                let (kind, value) = <(i64, redis::Value)>::from_redis_value(table)?;
                Ok(GrantAnswer(kind, value))
            }
        }
    }
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
        match self.cmd.query_async(c).await {
            // On a Cluster the call can go to another node than the slot's
            // primary, where the script was loaded: the node importing a
            // migrating slot, after ASK. The script in full runs there (and
            // stays in its script cache).
            Err(e) if is_no_script(&e) => self.as_eval().query_async(c).await,
            answer => answer,
        }
    }

    /// The call as `EVAL <source> <numkeys> <keys> <args>`.
    fn as_eval(&self) -> Cmd {
        let mut eval = redis::cmd("EVAL");
        eval.arg(source_of(self.script));
        for arg in self.cmd.args_iter().skip(2) {
            if let redis::Arg::Simple(a) = arg {
                eval.arg(a);
            }
        }
        eval
    }
}

/// A grant script's answer (a permit's or a reader-writer lock's): `{1 or
/// 3, token}` granted, `{0, ms}` held for that long.
pub(super) fn grant_outcome(
    key: &LockKey,
    fencing: bool,
    kind: i64,
    value: redis::Value,
    script: &str,
) -> Result<AcquireOutcome, Error> {
    let unexpected = || Error::Unavailable {
        op: Operation::Acquire,
        key: Some(key.clone()),
        source: format!("unexpected reply from {script}").into(),
    };
    Ok(match (kind, value) {
        (1 | 3, _) if !fencing => AcquireOutcome::GrantedUnfenced,
        (1 | 3, redis::Value::BulkString(digits)) => AcquireOutcome::Granted(FencingToken::new(
            std::str::from_utf8(&digits)
                .ok()
                .and_then(|d| d.parse().ok())
                .ok_or_else(unexpected)?,
        )),
        (0, redis::Value::Int(n)) => AcquireOutcome::Held {
            remaining: Some(Duration::from_millis(n.max(0) as u64)),
        },
        _ => return Err(unexpected()),
    })
}

#[cfg(test)]
mod tests {
    use super::super::RedisStore;
    use super::super::keys::{FENCE, LOCK, RECORD, RECORD_WRITER, WAITED};
    use super::*;
    use crate::token::OwnerToken;

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
                vec![name(LOCK)],
                vec![
                    Argv::Str(owner.as_str()),
                    Argv::Int(30_000),
                    Argv::Name(name(WAITED)),
                    Argv::Name(name(FENCE)),
                    Argv::Int(u64::MAX),
                    Argv::Str("1"),
                    Argv::Name(name(RECORD)),
                    Argv::Str(""),
                ],
            ),
            (
                &EXTEND,
                vec![name(LOCK)],
                vec![Argv::Str(owner.as_str()), Argv::Int(1)],
            ),
            (
                &RELEASE,
                vec![name(LOCK)],
                vec![
                    Argv::Str(owner.as_str()),
                    Argv::Str("PUBLISH"),
                    Argv::Name(name(WAITED)),
                ],
            ),
            (
                &FINISH,
                vec![name(LOCK)],
                vec![
                    Argv::Str(owner.as_str()),
                    Argv::Bytes(&record),
                    Argv::Int(86_400_000),
                    Argv::Str("SPUBLISH"),
                    Argv::Name(name(RECORD)),
                    Argv::Name(name(WAITED)),
                    Argv::Name(name(RECORD_WRITER)),
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
                    Argv::Name(n) => plain.arg(n.to_string()),
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
