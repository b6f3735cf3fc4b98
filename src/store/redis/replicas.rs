//! `WAIT` for replicas after each grant: the settings, and the grant run on
//! a connection of its own so that `WAIT` blocks nobody else.

use std::time::Duration;

use redis::RedisError;

use super::connection::lock;
use super::scripts::ScriptCall;
use super::{RedisStore, ms};
use crate::store::LockStore;
use crate::{Error, LockKey, Operation, OwnerToken};

/// Idle `WAIT` connections kept per store.
const MAX_IDLE_WAIT_CONNS: usize = 16;

/// `WAIT numreplicas timeout` after each grant.
#[derive(Debug, Clone, Copy)]
pub(super) struct WaitReplicas {
    replicas: u32,
    timeout: Duration,
    on_shortfall: ReplicaShortfall,
}

/// What to do when fewer replicas than asked acknowledge a grant in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ReplicaShortfall {
    /// Release the grant and fail the acquire with
    /// [`Error::Unavailable`] (default): the handler does not run on a grant
    /// a failover could lose.
    #[default]
    Fail,
    /// Keep the grant and log a warning.
    Proceed,
}

impl WaitReplicas {
    pub(super) fn new(replicas: u32, timeout: Duration, on_shortfall: ReplicaShortfall) -> Self {
        WaitReplicas {
            replicas,
            timeout,
            on_shortfall,
        }
    }
}

impl RedisStore {
    /// A grant that waits for replicas: the acquire script and `WAIT` (see
    /// [`grant_and_wait`](Self::grant_and_wait)), then, if it granted, the
    /// check of how many replicas acknowledged it.
    pub(super) async fn grant_on_replicas(
        &self,
        call: &ScriptCall,
        key: &LockKey,
        owner: &OwnerToken,
        w: WaitReplicas,
    ) -> Result<(i64, redis::Value), Error> {
        let (kind, value, acked) = self.grant_and_wait(call, key, w).await?;
        if let Some(acked) = acked {
            self.check_replicas(key, owner, w, acked).await?;
        }
        Ok((kind, value))
    }

    /// The acquire script, then (if it granted) `WAIT`, on a connection of
    /// their own: `WAIT` blocks the connection it runs on, and it must run
    /// where the grant was written (it counts that client's writes). The
    /// connection is reused only after a clean answer.
    pub(super) async fn grant_and_wait(
        &self,
        call: &ScriptCall,
        key: &LockKey,
        w: WaitReplicas,
    ) -> Result<(i64, redis::Value, Option<i64>), Error> {
        let op = Operation::Acquire;
        let bound = self.inner.timeout.saturating_add(w.timeout);
        let work = async {
            let idle = lock(&self.inner.wait_conns).pop();
            let mut conn = match idle {
                Some(c) => c,
                None => {
                    let mut c = Box::pin(self.open_single(op, Some(key))).await?;
                    c.set_response_timeout(bound);
                    c
                }
            };
            let fail = |e: RedisError| {
                self.forget_connection_on(&e);
                Error::from_redis(op, Some(key), e)
            };
            let (kind, value): (i64, redis::Value) = call.invoke(&mut conn).await.map_err(fail)?;
            let acked = if kind == 1 || kind == 3 {
                let n: i64 = redis::cmd("WAIT")
                    .arg(w.replicas)
                    .arg(ms(w.timeout))
                    .query_async(&mut conn)
                    .await
                    .map_err(fail)?;
                Some(n)
            } else {
                None
            };
            let mut idle = lock(&self.inner.wait_conns);
            if idle.len() < MAX_IDLE_WAIT_CONNS {
                idle.push(conn);
            }
            Ok((kind, value, acked))
        };
        self.bounded(op, Some(key), bound, work).await
    }

    /// On too few replica acknowledgements with [`ReplicaShortfall::Fail`],
    /// releases the grant and fails.
    pub(super) async fn check_replicas(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        w: WaitReplicas,
        acked: i64,
    ) -> Result<(), Error> {
        if acked >= i64::from(w.replicas) {
            return Ok(());
        }
        match w.on_shortfall {
            ReplicaShortfall::Proceed => {
                tracing::warn!(key = %key, acked, wanted = w.replicas, "grant not yet on enough replicas; proceeding");
                Ok(())
            }
            ReplicaShortfall::Fail => {
                let _ = self.release(key, owner).await;
                Err(Error::Unavailable {
                    op: Operation::Acquire,
                    key: Some(key.clone()),
                    source: format!(
                        "only {acked} of {} replicas acknowledged the grant within {} ms",
                        w.replicas,
                        w.timeout.as_millis()
                    )
                    .into(),
                })
            }
        }
    }
}
