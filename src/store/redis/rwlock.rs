//! The Redis store's reader-writer locks (see `scripts/acquire_rw.lua`).
//! A reader is a member of a sorted set scored by its lease end, as a
//! permit is, and a waiting writer's mark is one too: both are renewed and
//! removed by the permit's scripts. The writer is a string like the lock,
//! renewed by the lock's script.

use std::time::Duration;

use super::keys::{FENCE, RW_READERS, RW_WAITED, RW_WAITING, RW_WRITER};
use super::replicas::Grant;
use super::scripts::{
    ACQUIRE_RW, Argv, EXTEND, EXTEND_PERMIT, RELEASE_PERMIT, RELEASE_WRITER, ScriptCall,
    grant_outcome,
};
use super::{RedisStore, ms};
use crate::error::{Error, Operation};
use crate::key::LockKey;
use crate::store::{AcquireOutcome, LeaseKind, RwMode};
use crate::token::OwnerToken;

/// The name holding `mode`'s side: the readers' set, or the writer.
pub(super) fn side(mode: RwMode) -> &'static str {
    match mode {
        RwMode::Read => RW_READERS,
        RwMode::Write => RW_WRITER,
    }
}

/// The names a grant of `mode` depends on beside its own side, which a
/// {4} answer of acquire_rw.lua asks about: the writer and the writers
/// waiting for a read, the readers for a write.
fn depends_on(mode: RwMode) -> &'static [&'static str] {
    match mode {
        RwMode::Read => &[RW_WRITER, RW_WAITING],
        RwMode::Write => &[RW_READERS],
    }
}

impl RedisStore {
    /// A grant of `mode` (acquire_rw.lua); a writer's `waiter` marks it
    /// waiting when it finds the lock busy. The grant declares its own
    /// side alone (so that a Cluster serves it while its slot migrates);
    /// where a name it depends on may be on the other node of a migrating
    /// slot (answer 4), that name's `PTTL` is asked where the Cluster
    /// routes it: held there, the grant is refused for as long; on neither
    /// node, the script runs again saying so (flags `cm`): no such name
    /// can appear on the node the slot leaves meanwhile, which creates no
    /// name of it.
    pub(super) async fn acquire_rw_script(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        (mode, waiter): (RwMode, Option<&OwnerToken>),
        lease: Duration,
    ) -> Result<AcquireOutcome, Error> {
        let fencing = self.inner.fencing;
        let other = match mode {
            RwMode::Read => RW_WRITER,
            RwMode::Write => RW_READERS,
        };
        let mut args = [
            Argv::Str(owner.as_str()),
            Argv::Int(ms(lease)),
            Argv::Str(if mode == RwMode::Read { "r" } else { "w" }),
            // The flags of migration.lua.
            Argv::Str(if self.inner.source.is_cluster() {
                "c"
            } else {
                ""
            }),
            Argv::Str(waiter.map_or("", OwnerToken::as_str)),
            Argv::Name(self.name(key, other)),
            Argv::Name(self.name(key, RW_WAITING)),
            Argv::Name(self.name(key, RW_WAITED)),
            Argv::Str(""),
            Argv::Str(""),
        ];
        if fencing {
            args[8] = Argv::Name(self.name(key, FENCE));
            args[9] = Argv::Int(self.inner.fence_retention_ms);
        }
        // (Confirmed by replicas where grants wait for them, as every
        // kind's grant is.)
        let grant = Grant {
            kind: match mode {
                RwMode::Read => LeaseKind::Read,
                RwMode::Write => LeaseKind::Write,
            },
            key,
            owner,
        };
        let own = [self.name(key, side(mode))];
        for _ in 0..3 {
            let call = ScriptCall::new(&ACQUIRE_RW, &own, &args);
            let (kind, value) = self.run_grant(&call, grant).await?;
            if kind != 4 {
                return grant_outcome(key, fencing, kind, value, "the reader-writer script");
            }
            if let Some(remaining) = self.held_where_routed(key, depends_on(mode)).await? {
                return Ok(AcquireOutcome::Held { remaining });
            }
            // On neither node: the flags with `m` (and `c`: a migrating
            // slot is a Cluster's).
            args[3] = Argv::Str("cm");
        }
        Err(Error::Unavailable {
            op: Operation::Acquire,
            key: Some(key.clone()),
            source: "the reader-writer lock's names kept moving between the nodes of a \
                     migrating slot"
                .into(),
        })
    }

    /// Whether any of `key`'s names `names` is held where a Cluster routes
    /// a plain `PTTL` of it (the node that has it, or, after ASK, the one
    /// its slot goes to), and for how long: `Some` (the longest; `None`
    /// within it where one has no expiry), or `None` where every one is
    /// on neither node.
    async fn held_where_routed(
        &self,
        key: &LockKey,
        names: &[&'static str],
    ) -> Result<Option<Option<Duration>>, Error> {
        let mut held: Option<Option<Duration>> = None;
        for &name in names {
            let name = self.name(key, name);
            let pttl: i64 = self
                .with_conn(Operation::Acquire, Some(key), |mut c| async move {
                    redis::cmd("PTTL").arg(name).query_async(&mut c).await
                })
                .await?;
            let this = match pttl {
                -2 => continue,
                n if n < 0 => None,
                n => Some(Duration::from_millis(n as u64)),
            };
            held = Some(match (held, this) {
                (Some(Some(a)), Some(b)) => Some(a.max(b)),
                (Some(None), _) | (_, None) => None,
                (None, b) => b,
            });
        }
        Ok(held)
    }

    /// The renewal of `owner`'s `mode` hold: a reader's as a permit's, the
    /// writer's as a lock's.
    pub(super) async fn extend_rw_script(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        mode: RwMode,
        lease: Duration,
    ) -> Result<bool, Error> {
        let script = match mode {
            RwMode::Read => &EXTEND_PERMIT,
            RwMode::Write => &EXTEND,
        };
        self.extend_by(script, (key, side(mode)), owner, lease)
            .await
    }

    /// The release of `owner`'s `mode` hold: a reader's as a permit's, the
    /// writer's by release_writer.lua.
    pub(super) async fn release_rw_script(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        mode: RwMode,
    ) -> Result<bool, Error> {
        let script = match mode {
            RwMode::Read => &RELEASE_PERMIT,
            RwMode::Write => &RELEASE_WRITER,
        };
        self.release_by(script, (key, side(mode), RW_WAITED), owner)
            .await
    }

    /// A waiting writer's mark renewed, as a permit is.
    pub(super) async fn renew_mark_script(
        &self,
        key: &LockKey,
        waiter: &OwnerToken,
        lease: Duration,
    ) -> Result<bool, Error> {
        self.extend_by(&EXTEND_PERMIT, (key, RW_WAITING), waiter, lease)
            .await
    }

    /// A waiting writer's mark taken back, as a permit is released.
    pub(super) async fn withdraw_writer_script(
        &self,
        key: &LockKey,
        waiter: &OwnerToken,
    ) -> Result<bool, Error> {
        self.release_by(&RELEASE_PERMIT, (key, RW_WAITING, RW_WAITED), waiter)
            .await
    }

    /// The Redis keys of `key`'s reader-writer lock: its readers (a sorted
    /// set), its writer and its writers waiting (a sorted set). A test
    /// hook, not part of the stable API.
    #[cfg(any(test, feature = "test-util"))]
    #[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
    pub fn rw_keys(&self, key: &LockKey) -> [String; 3] {
        [RW_READERS, RW_WRITER, RW_WAITING].map(|n| self.name(key, n).to_string())
    }
}
