//! Renewals: one lock's (`renew`) and a batch's (`renew_many`, the
//! watchdog's) on one primary or Sentinel. What Redis runs per renewal:
//!
//! | server, lease | command |
//! |---|---|
//! | Valkey 8.1 and later, a lock without fencing | `SET <lock> <owner> IFEQ <owner> PX <ms>` (server.rs): no script |
//! | any other (a fenced lock, a permit, a side of a reader-writer lock; Redis; a server not named) | extend.lua or extend_permit.lua |
//!
//! A batch sends its renewals in one pipeline: the `SET … IFEQ`s, then the
//! scripted renewals in one call of extend_batch.lua per [`SCRIPT_BATCH`]
//! (the watchdog's default batch: one call), which runs the one-key
//! scripts' bodies unchanged for each and answers each on its own. Without
//! the batch script, each renewal was an `EVALSHA` of its own: Redis'
//! work per call (parsing, the script's lookup and its `KEYS`/`ARGV`)
//! is paid once per batch instead.
//!
//! A fenced lock keeps its script: its value is not the owner token alone
//! once the grant writes more into it, so the client cannot name the
//! whole value that `IFEQ` compares.

use redis::Value;

use super::keys::{LOCK, Name, PERMITS};
use super::scripts::{Argv, EXTEND, EXTEND_BATCH, ScriptCall, evalsha, is_no_script};
use super::server::set_ifeq;
use super::{RedisStore, ms, rwlock};
use crate::error::{Error, Operation};
use crate::key::LockKey;
use crate::store::{LeaseKind, Renewal, RwMode};
use crate::sync::lock;
use crate::token::OwnerToken;

/// Renewals per call of the batch script. A call holds Redis for its
/// whole run (about a microsecond per renewal): a larger batch (the
/// locker's `renew_batch`) is sent as several calls in one pipeline, so
/// that no call holds Redis for long.
pub(super) const SCRIPT_BATCH: usize = 512;

/// Where a renewal's answer is: a command of the pipeline, or an item of a
/// batch script call's answer.
#[derive(Clone, Copy)]
enum Slot {
    Set(usize),
    Script { call: usize, item: usize },
}

impl RedisStore {
    /// Whether a lock is renewed with `SET … IFEQ` on the server the
    /// connection found: without fencing (the lock's value is exactly its
    /// owner token), on a server that has it (server.rs).
    fn renews_with_set_ifeq(&self) -> bool {
        !self.inner.fencing && lock(&self.inner.server).is_some_and(|s| s.has_set_ifeq())
    }

    /// The server the shared connection found when it opened, as
    /// `valkey 9.1.2` or `redis 7.0.15`; `None` before the first
    /// connection, on a Cluster, or for a server it could not name.
    #[cfg(any(test, feature = "test-util"))]
    #[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
    pub fn detected_server(&self) -> Option<String> {
        lock(&self.inner.server).map(super::server::Server::describe)
    }

    /// One lock's renewal (see the table above).
    pub(super) async fn extend_lock(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        lease: std::time::Duration,
    ) -> Result<bool, Error> {
        if self.renews_with_set_ifeq() {
            let set = set_ifeq(self.name(key, LOCK), owner.as_str(), ms(lease));
            let answer: Value = self
                .with_conn(Operation::Extend, Some(key), |mut c| async move {
                    set.query_async(&mut c).await
                })
                .await?;
            return set_answer(&answer)
                .map_err(|e| Error::from_redis(Operation::Extend, Some(key), e));
        }
        let call = ScriptCall::new(
            &EXTEND,
            &[self.name(key, LOCK)],
            &[Argv::Str(owner.as_str()), Argv::Int(ms(lease))],
        );
        let n: i64 = self
            .with_conn(Operation::Extend, Some(key), |mut c| async move {
                call.invoke(&mut c).await
            })
            .await?;
        Ok(n == 1)
    }

    /// A batch's renewals on one connection (see the table above): one
    /// pipeline, one answer per renewal.
    pub(super) async fn extend_batch(&self, renewals: &[Renewal]) -> Vec<Result<bool, Error>> {
        let native = self.renews_with_set_ifeq();
        let mut pipe = redis::pipe();
        // One answer per command: a server error of one (a key of the
        // wrong type) must not fail the others.
        pipe.ignore_errors();
        let mut slots = vec![Slot::Set(0); renewals.len()];
        let mut scripted = Vec::with_capacity(renewals.len());
        let mut commands = 0;
        for (i, r) in renewals.iter().enumerate() {
            if native && r.kind == LeaseKind::Lock {
                pipe.add_command(set_ifeq(
                    self.name(&r.key, LOCK),
                    r.owner.as_str(),
                    ms(r.lease),
                ));
                slots[i] = Slot::Set(commands);
                commands += 1;
            } else {
                scripted.push(i);
            }
        }
        // The batch script's layout (extend_batch.lua): the kinds, the
        // lease when every renewal has the same, then each renewal's
        // owner (and its own lease where they differ).
        for chunk in scripted.chunks(SCRIPT_BATCH) {
            let lease = renewals[chunk[0]].lease;
            let shared = chunk.iter().all(|&i| renewals[i].lease == lease);
            let width = if shared { 1 } else { 2 };
            let mut keys: Vec<Name<'_>> = Vec::with_capacity(chunk.len());
            let mut kinds = String::with_capacity(chunk.len());
            let mut args: Vec<Argv<'_>> = Vec::with_capacity(2 + width * chunk.len());
            // ARGV[1], the kinds, once they are all known.
            args.extend([
                Argv::Str(""),
                if shared {
                    Argv::Int(ms(lease))
                } else {
                    Argv::Str("")
                },
            ]);
            for (item, &i) in chunk.iter().enumerate() {
                let r = &renewals[i];
                // A permit, a reader and a writer's mark are renewed by
                // extend_permit.lua, a lock and a writer by extend.lua.
                let (kind, name) = match r.kind {
                    LeaseKind::Permit => ('p', PERMITS),
                    LeaseKind::Read => ('p', rwlock::side(RwMode::Read)),
                    LeaseKind::WriterMark => ('p', super::keys::RW_WAITING),
                    LeaseKind::Write => ('l', rwlock::side(RwMode::Write)),
                    LeaseKind::Lock => ('l', LOCK),
                };
                keys.push(self.name(&r.key, name));
                kinds.push(kind);
                args.push(Argv::Str(r.owner.as_str()));
                if !shared {
                    args.push(Argv::Int(ms(r.lease)));
                }
                slots[i] = Slot::Script {
                    call: commands,
                    item,
                };
            }
            args[0] = Argv::Str(&kinds);
            pipe.add_command(evalsha(&EXTEND_BATCH, &keys, &args));
            commands += 1;
        }
        let key = (renewals.len() == 1).then(|| &renewals[0].key);
        let no_script =
            |a: &Value| matches!(a, Value::ServerError(e) if is_no_script(&e.clone().into()));
        let answers: Vec<Value> = match self
            .with_conn(Operation::Extend, key, |mut c| async move {
                let answers: Vec<Value> = pipe.query_async(&mut c).await?;
                if answers.iter().any(no_script) {
                    EXTEND_BATCH.load_async(&mut c).await?;
                    return pipe.query_async(&mut c).await;
                }
                Ok(answers)
            })
            .await
        {
            Ok(answers) => answers,
            // The connection failed or timed out: every lease on it.
            Err(e) => return crate::store::error_for_each(e, renewals),
        };
        if answers.len() != commands {
            return crate::store::error_for_each(wrong_count(), renewals);
        }
        renewals
            .iter()
            .zip(slots)
            .map(|(r, slot)| {
                let answer = match slot {
                    Slot::Set(at) => set_answer(&answers[at]),
                    Slot::Script { call, item } => script_answer(&answers[call], item),
                };
                answer.map_err(|e| {
                    self.forget_connection_on(&e);
                    Error::from_redis(Operation::Extend, Some(&r.key), e)
                })
            })
            .collect()
    }
}

fn wrong_count() -> Error {
    Error::Unavailable {
        op: Operation::Extend,
        key: None,
        source: "the renewal pipeline answered the wrong number of replies".into(),
    }
}

fn unexpected(what: &str, answer: &Value) -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::Parse,
        "unexpected answer to a renewal",
        format!("{what}: {answer:?}"),
    ))
}

/// `SET … IFEQ`'s answer as a renewal's: set (the owner's), or not.
fn set_answer(answer: &Value) -> redis::RedisResult<bool> {
    match answer {
        Value::Okay => Ok(true),
        Value::SimpleString(s) if s == "OK" => Ok(true),
        Value::Nil => Ok(false),
        Value::ServerError(e) => Err(e.clone().into()),
        other => Err(unexpected("SET IFEQ", other)),
    }
}

/// Renewal `item`'s answer in a batch script call's `answer`: its own
/// (1, 0 or its error), or the call's error (every renewal of the call).
fn script_answer(answer: &Value, item: usize) -> redis::RedisResult<bool> {
    match answer {
        Value::Array(items) => match items.get(item) {
            Some(Value::Int(n)) => Ok(*n == 1),
            Some(Value::ServerError(e)) => Err(e.clone().into()),
            other => Err(unexpected(
                "the batch renewal script",
                &other.cloned().unwrap_or(Value::Nil),
            )),
        },
        Value::ServerError(e) => Err(e.clone().into()),
        other => Err(unexpected("the batch renewal script", other)),
    }
}
