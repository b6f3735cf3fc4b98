//! The Redis store's reader-writer locks (see `scripts/acquire_rw.lua`).
//! A reader is a member of a sorted set scored by its lease end, as a
//! permit is, and a waiting writer's mark is one too: both are renewed and
//! removed by the permit's scripts. The writer is a string like the lock,
//! renewed by the lock's script.

use std::time::Duration;

use super::keys::{FENCE, Name, RW_READERS, RW_WAITED, RW_WAITING, RW_WRITER};
use super::replicas::Grant;
use super::scripts::{
    ACQUIRE_RW, Argv, EXTEND, EXTEND_PERMIT, RELEASE_PERMIT, RELEASE_WRITER, ScriptCall,
    grant_outcome,
};
use super::{RedisStore, ms};
use crate::error::Error;
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

impl RedisStore {
    /// The names the grant declares: readers, writer, writers waiting.
    fn rw_names<'a>(&'a self, key: &'a LockKey) -> [Name<'a>; 3] {
        [
            self.name(key, RW_READERS),
            self.name(key, RW_WRITER),
            self.name(key, RW_WAITING),
        ]
    }

    /// A grant of `mode` (acquire_rw.lua); a writer's `waiter` marks it
    /// waiting when it finds the lock busy.
    pub(super) async fn acquire_rw_script(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        (mode, waiter): (RwMode, Option<&OwnerToken>),
        lease: Duration,
    ) -> Result<AcquireOutcome, Error> {
        let fencing = self.inner.fencing;
        let mut args = [
            Argv::Str(owner.as_str()),
            Argv::Int(ms(lease)),
            Argv::Str(if mode == RwMode::Read { "r" } else { "w" }),
            Argv::Str(waiter.map_or("", OwnerToken::as_str)),
            Argv::Name(self.name(key, RW_WAITED)),
            Argv::Str(""),
            Argv::Str(""),
        ];
        if fencing {
            args[5] = Argv::Name(self.name(key, FENCE));
            args[6] = Argv::Int(self.inner.fence_retention_ms);
        }
        let call = ScriptCall::new(&ACQUIRE_RW, &self.rw_names(key), &args);
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
        let (kind, value) = self.run_grant(&call, grant).await?;
        grant_outcome(key, fencing, kind, value, "the reader-writer script")
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
        self.rw_names(key).map(|n| n.to_string())
    }
}
