//! `WAIT` for replicas (or `WAITAOF` for the append-only file) after each
//! grant, of every lease kind (a lock, a permit): the settings, and the
//! grant run on a connection of its own so that the wait blocks nobody
//! else. One grant not confirmed in time is taken back, owner-checked, by
//! its kind's release.

use std::time::Duration;

use redis::RedisError;

use super::scripts::{GrantAnswer, ScriptCall};
use super::source::Conn;
use super::{RedisStore, ms};
use crate::error::ConfigError;
use crate::error::{Error, Operation};
use crate::key::LockKey;
use crate::store::{LeaseKind, LockStore};
use crate::sync::lock;
use crate::token::OwnerToken;

/// `WAIT` connections per store: at most this many grants wait for
/// replicas at once (more queue for a connection, within the command
/// timeout), and as many are kept idle for reuse. On a Cluster each is a
/// cluster connection: a connection to every node.
const MAX_WAIT_CONNS: usize = 16;

/// The store's connections for grants that wait for replicas.
pub(super) struct WaitConns {
    idle: std::sync::Mutex<Idle<Conn>>,
    in_use: tokio::sync::Semaphore,
    /// With [`ReplicaShortfall::Proceed`]: how many grants proceeded
    /// unconfirmed since the last confirmed one (`None`: the last was
    /// confirmed). A shortfall is logged as a transition, not per grant.
    unconfirmed: std::sync::Mutex<Option<u64>>,
}

impl WaitConns {
    pub(super) fn new() -> Self {
        WaitConns {
            idle: std::sync::Mutex::default(),
            in_use: tokio::sync::Semaphore::new(MAX_WAIT_CONNS),
            unconfirmed: std::sync::Mutex::default(),
        }
    }

    /// Drops the idle ones (the next grant opens a new one), and every
    /// one in use when it comes back.
    pub(super) fn clear(&self) {
        lock(&self.idle).clear();
    }
}

/// The idle connections, and a generation that [`clear`](Idle::clear)
/// raises: a connection taken (or opened) before a clear is not kept when
/// it comes back. After a failover (`+switch-master`, a timeout) a grant
/// that was waiting on the old primary must not hand its connection to the
/// next grant, which would write there beside the new primary's holders.
#[derive(Debug)]
struct Idle<C> {
    generation: u64,
    conns: Vec<C>,
}

impl<C> Default for Idle<C> {
    fn default() -> Self {
        Idle {
            generation: 0,
            conns: Vec::new(),
        }
    }
}

impl<C> Idle<C> {
    fn clear(&mut self) {
        self.generation += 1;
        self.conns.clear();
    }

    /// An idle connection if there is one, and the generation to hand back
    /// with it (or with a connection opened in its place).
    fn take(&mut self) -> (Option<C>, u64) {
        (self.conns.pop(), self.generation)
    }

    /// Keeps `conn` for the next grant, unless the pool was cleared since
    /// it was taken (or is full).
    fn put(&mut self, conn: C, taken_in: u64) {
        if taken_in == self.generation && self.conns.len() < MAX_WAIT_CONNS {
            self.conns.push(conn);
        }
    }
}

/// `WAIT numreplicas timeout` or `WAITAOF numlocal numreplicas timeout`
/// after each grant.
#[derive(Debug, Clone, Copy)]
pub(super) struct WaitReplicas {
    /// `Some(local)` for `WAITAOF` (`local`: the primary's own AOF too).
    aof: Option<bool>,
    replicas: u32,
    timeout: Duration,
    on_shortfall: ReplicaShortfall,
}

/// How many confirmed a grant: the primary's own AOF (`WAITAOF` only) and
/// replicas.
#[derive(Debug, Clone, Copy)]
pub(super) struct Acks {
    local: i64,
    replicas: i64,
}

/// A grant to confirm: of which kind, of which key, to whom. Every grant
/// script answers `{1, ..}` (granted) or `{3, ..}` (ours already, its
/// lease reset) when it wrote a grant, anything else when it wrote none;
/// only those two are waited for.
#[derive(Debug, Clone, Copy)]
pub(super) struct Grant<'a> {
    pub(super) kind: LeaseKind,
    pub(super) key: &'a LockKey,
    pub(super) owner: &'a OwnerToken,
}

impl Grant<'_> {
    /// A script of no declared key (so a Cluster node runs it without a
    /// redirect) answering 1 where the grant is on the node it runs on,
    /// owner-checked, else 0.
    #[cfg(feature = "cluster")]
    fn held_here(&self, store: &RedisStore) -> redis::Cmd {
        use super::scripts::{HELD_HERE_LOCK_SRC, HELD_HERE_MEMBER_SRC};
        let (script, name) = match self.kind {
            LeaseKind::Lock => (HELD_HERE_LOCK_SRC, super::keys::LOCK),
            LeaseKind::Permit => (HELD_HERE_MEMBER_SRC, super::keys::PERMITS),
            LeaseKind::WriterMark => (HELD_HERE_MEMBER_SRC, super::keys::RW_WAITING),
            LeaseKind::Read => (HELD_HERE_MEMBER_SRC, super::keys::RW_READERS),
            LeaseKind::Write => (HELD_HERE_LOCK_SRC, super::keys::RW_WRITER),
        };
        let mut c = redis::cmd("EVAL");
        c.arg(script)
            .arg(0)
            .arg(store.name(self.key, name))
            .arg(self.owner.as_str());
        c
    }

    /// Takes the grant back (its kind's owner-checked release).
    async fn take_back(&self, store: &RedisStore) {
        let _ = store.release(self.kind, self.key, self.owner).await;
    }
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
    /// Keep the grant and log a warning: once when grants stop being
    /// confirmed (each further one at DEBUG), and once when one is
    /// confirmed again.
    Proceed,
}

impl WaitReplicas {
    pub(super) fn new(replicas: u32, timeout: Duration, on_shortfall: ReplicaShortfall) -> Self {
        WaitReplicas {
            aof: None,
            replicas,
            timeout,
            on_shortfall,
        }
    }

    /// `WAITAOF (local as 0 or 1) replicas timeout`.
    pub(super) fn aof(
        local: bool,
        replicas: u32,
        timeout: Duration,
        on_shortfall: ReplicaShortfall,
    ) -> Self {
        WaitReplicas {
            aof: Some(local),
            ..Self::new(replicas, timeout, on_shortfall)
        }
    }

    /// The setting's name, for errors.
    fn setting(&self) -> &'static str {
        if self.aof.is_some() {
            "wait_aof"
        } else {
            "wait_replicas"
        }
    }

    /// The command, and how to read its answer.
    fn command(&self) -> redis::Cmd {
        match self.aof {
            None => {
                let mut c = redis::cmd("WAIT");
                c.arg(self.replicas).arg(ms(self.timeout));
                c
            }
            Some(local) => {
                let mut c = redis::cmd("WAITAOF");
                c.arg(u8::from(local))
                    .arg(self.replicas)
                    .arg(ms(self.timeout));
                c
            }
        }
    }

    fn acks(&self, answer: redis::Value) -> redis::RedisResult<Acks> {
        if self.aof.is_none() {
            let replicas = redis::from_redis_value(answer)?;
            return Ok(Acks { local: 0, replicas });
        }
        let (local, replicas) = redis::from_redis_value(answer)?;
        Ok(Acks { local, replicas })
    }

    fn enough(&self, a: Acks) -> bool {
        a.replicas >= i64::from(self.replicas) && a.local >= i64::from(self.aof == Some(true))
    }
}

impl RedisStore {
    /// Runs a grant script (`call`, the grant of `grant.kind`): on the
    /// shared connection, or, where grants wait for replicas, with its
    /// `WAIT` (see [`grant_on_replicas`](Self::grant_on_replicas)). Every
    /// lease kind's grant goes through here.
    pub(super) async fn run_grant(
        &self,
        call: &ScriptCall,
        grant: Grant<'_>,
    ) -> Result<(i64, redis::Value), Error> {
        match self.inner.wait_replicas {
            None => {
                let GrantAnswer(kind, value) = self
                    .with_conn(Operation::Acquire, Some(grant.key), |mut c| async move {
                        call.invoke(&mut c).await
                    })
                    .await?;
                Ok((kind, value))
            }
            // Boxed: its futures would otherwise grow every grant's.
            Some(w) => Box::pin(self.grant_on_replicas(call, grant, w)).await,
        }
    }

    /// A grant that waits for replicas: the grant script and `WAIT` (see
    /// [`grant_and_wait`](Self::grant_and_wait)), then, if it granted, the
    /// check of how many replicas acknowledged it.
    async fn grant_on_replicas(
        &self,
        call: &ScriptCall,
        grant: Grant<'_>,
        w: WaitReplicas,
    ) -> Result<(i64, redis::Value), Error> {
        let (kind, value, acked) = self.grant_and_wait(call, grant, w).await?;
        match acked {
            None => {}
            Some(Ok(acked)) => self.check_replicas(grant, w, acked).await?,
            // Granted, but the wait failed: the grant is taken back, so
            // that it does not stand unconfirmed for a whole lease.
            Some(Err(e)) => {
                grant.take_back(self).await;
                return Err(wait_error(grant.key, w, e));
            }
        }
        Ok((kind, value))
    }

    /// The grant script, then (if it granted) `WAIT`, on a connection of
    /// their own: `WAIT` blocks the connection it runs on, and it must run
    /// where the grant was written (it counts that client's writes). The
    /// connection is reused only after a clean answer.
    async fn grant_and_wait(
        &self,
        call: &ScriptCall,
        grant: Grant<'_>,
        w: WaitReplicas,
    ) -> Result<(i64, redis::Value, Option<Result<Acks, RedisError>>), Error> {
        let op = Operation::Acquire;
        let key = grant.key;
        let bound = self.inner.timeout.saturating_add(w.timeout);
        let conns = &self.inner.wait_conns;
        // A connection first, within the command timeout (nothing is
        // written yet), and only then the grant and its wait within
        // `bound`: a grant that queued behind others must not use up its
        // bound there and be cut mid-wait.
        let in_use = match tokio::time::timeout(self.inner.timeout, conns.in_use.acquire()).await {
            Ok(Ok(permit)) => permit,
            Ok(Err(_)) => {
                return Err(Error::from_redis(
                    op,
                    Some(key),
                    RedisError::from((redis::ErrorKind::Io, "the store is closing")),
                ));
            }
            Err(_) => {
                return Err(Error::Unavailable {
                    op,
                    key: Some(key.clone()),
                    source: format!(
                        "{MAX_WAIT_CONNS} grants already wait for replicas ({}), and none \
                         ended within the command timeout ({} ms); nothing was granted",
                        w.setting(),
                        self.inner.timeout.as_millis()
                    )
                    .into(),
                });
            }
        };
        // Set once the grant is written: a wait cut by `bound` then takes
        // it back, as one that answered too few.
        let granted = std::sync::atomic::AtomicBool::new(false);
        let work = async {
            let (idle, generation) = lock(&conns.idle).take();
            let mut conn = match idle {
                Some(c) => c,
                None => Box::pin(self.open_wait_conn(op, key, bound)).await?,
            };
            let put = |conn| lock(&conns.idle).put(conn, generation);
            let GrantAnswer(kind, value) = call.invoke(&mut conn).await.map_err(|e| {
                self.forget_connection_on(&e);
                Error::from_redis(op, Some(key), e)
            })?;
            if kind != 1 && kind != 3 {
                put(conn);
                return Ok((kind, value, None));
            }
            granted.store(true, std::sync::atomic::Ordering::Relaxed);
            let acked = match self.wait_where_granted(&mut conn, w, grant).await {
                Ok(answer) => w.acks(answer),
                Err(e) => Err(e),
            };
            match &acked {
                Ok(_) => put(conn),
                Err(e) => self.forget_connection_on(e),
            }
            Ok((kind, value, Some(acked)))
        };
        match self.bounded(op, Some(key), bound, work).await {
            Err(e) if granted.load(std::sync::atomic::Ordering::Relaxed) => {
                drop(in_use);
                grant.take_back(self).await;
                Err(Error::Unavailable {
                    op,
                    key: Some(key.clone()),
                    source: format!(
                        "the grant's wait for replicas ({}) did not answer within {} ms; \
                         taken back ({})",
                        w.setting(),
                        bound.as_millis(),
                        crate::error::Chain(&e)
                    )
                    .into(),
                })
            }
            other => other,
        }
    }

    /// A connection of its own for a grant and its wait: to the primary,
    /// or on a Cluster a cluster connection of its own (its node
    /// connections carry nothing else, so a `WAIT` blocks nobody's calls),
    /// each answering within `bound`.
    async fn open_wait_conn(
        &self,
        op: Operation,
        key: &LockKey,
        bound: std::time::Duration,
    ) -> Result<Conn, Error> {
        // The shared connection first, if there is none yet (the first
        // call of the store is a grant): opening it loads the scripts and
        // checks the eviction policy, so that this first grant too pays
        // no NOSCRIPT answer.
        self.connection(op, Some(key)).await?;
        #[cfg(feature = "cluster")]
        if let super::source::Source::Cluster(client) = &self.inner.source {
            let config = super::source::NodeTimeouts::new(self.inner.timeout).for_waits(bound);
            return client
                .get_async_connection_with_config(config)
                .await
                .map(|c| Conn::Cluster(Box::new(c)))
                .map_err(|e| Error::from_redis(op, Some(key), e));
        }
        let mut c = self.open_single(op, Some(key)).await?;
        c.set_response_timeout(bound);
        Ok(Conn::Single(c))
    }

    /// `WAIT` (or `WAITAOF`) where the grant was written: on a Cluster,
    /// the primary of the key's slot, over the same node connection (the
    /// command counts that connection's writes). There the grant must be
    /// ours first: while the slot migrates, a free lock or permit is
    /// granted on the node importing it (after `ASK`), and a `WAIT` on the
    /// slot's owner would count writes that connection never made there
    /// and pass at once. Such a grant is not confirmed (the caller takes
    /// it back).
    async fn wait_where_granted(
        &self,
        conn: &mut Conn,
        w: WaitReplicas,
        grant: Grant<'_>,
    ) -> redis::RedisResult<redis::Value> {
        #[cfg(not(feature = "cluster"))]
        let _ = grant;
        match conn {
            Conn::Single(c) => w.command().query_async(c).await,
            #[cfg(feature = "cluster")]
            Conn::Cluster(c) => {
                use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
                // Every name of a key shares its hash tag, and so its slot.
                let slot = Route::with_key(self.fence_key(grant.key), SlotAddr::Master);
                let to = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(slot));
                // Read on that node itself (a name that is elsewhere reads
                // as absent, or fails).
                let here: i64 = redis::from_redis_value(
                    c.route_command(grant.held_here(self), to.clone()).await?,
                )?;
                if here != 1 {
                    return Err(RedisError::from((
                        redis::ErrorKind::Client,
                        "the grant is not on its slot's primary (the slot is migrating): \
                         its replicas cannot be asked",
                    )));
                }
                c.route_command(w.command(), to).await
            }
        }
    }

    /// On too few acknowledgements with [`ReplicaShortfall::Fail`],
    /// releases the grant and fails.
    async fn check_replicas(
        &self,
        grant: Grant<'_>,
        w: WaitReplicas,
        acked: Acks,
    ) -> Result<(), Error> {
        let key = grant.key;
        if w.enough(acked) {
            if let Some(proceeded) = lock(&self.inner.wait_conns.unconfirmed).take() {
                tracing::warn!(
                    proceeded_unconfirmed = proceeded,
                    setting = w.setting(),
                    "replicas confirm grants again"
                );
            }
            return Ok(());
        }
        let what = match w.aof {
            None => format!("only {} of {} replicas", acked.replicas, w.replicas),
            Some(local) => format!(
                "the AOF of {} of {} replicas{}",
                acked.replicas,
                w.replicas,
                if local && acked.local < 1 {
                    " and not the primary's own"
                } else {
                    ""
                }
            ),
        };
        match w.on_shortfall {
            ReplicaShortfall::Proceed => {
                let first = {
                    let mut unconfirmed = lock(&self.inner.wait_conns.unconfirmed);
                    let first = unconfirmed.is_none();
                    *unconfirmed = Some(unconfirmed.unwrap_or(0) + 1);
                    first
                };
                // Once per shortfall, as a store outage is: each further
                // grant at DEBUG, until one is confirmed.
                if first {
                    tracing::warn!(
                        key = %key,
                        kind = ?grant.kind,
                        %what,
                        setting = w.setting(),
                        "grant not confirmed by replicas in time; proceeding (further \
                         unconfirmed grants are logged at DEBUG until one is confirmed)"
                    );
                } else {
                    tracing::debug!(key = %key, kind = ?grant.kind, %what, "grant not yet confirmed; proceeding");
                }
                Ok(())
            }
            ReplicaShortfall::Fail => {
                grant.take_back(self).await;
                Err(Error::Unavailable {
                    op: Operation::Acquire,
                    key: Some(key.clone()),
                    source: format!(
                        "{what} acknowledged the grant within {} ms",
                        w.timeout.as_millis()
                    )
                    .into(),
                })
            }
        }
    }
}

/// A wait that failed after a grant. A server that does not know the
/// command (`WAITAOF` before Redis 7.2 or Valkey 7.2) or refuses it as set
/// (`WAITAOF` asking for the primary's own AOF where `appendonly` is off) is
/// a [`ConfigError`]: trying again cannot help.
fn wait_error(key: &LockKey, w: WaitReplicas, e: RedisError) -> Error {
    let text = e.to_string();
    let unknown = text.contains("unknown command");
    if unknown || text.contains("appendonly is disabled") {
        let reason = if unknown {
            let command = if w.aof.is_some() { "WAITAOF" } else { "WAIT" };
            format!("the server has no {command} command ({text})")
        } else {
            format!("the server refused it: {text}")
        };
        return Error::Config(ConfigError::new(w.setting(), reason));
    }
    Error::from_redis(Operation::Acquire, Some(key), e)
}

#[cfg(test)]
mod tests {
    use super::{Idle, MAX_WAIT_CONNS};

    #[test]
    fn a_connection_taken_before_a_clear_is_not_kept() {
        let mut idle = Idle::default();
        idle.put("a", 0);
        let (taken, generation) = idle.take();
        assert_eq!(taken, Some("a"));
        // A failover clears the pool while "a" waits on the old primary.
        idle.clear();
        idle.put("a", generation);
        assert_eq!(
            idle.take().0,
            None,
            "a connection of the old primary was kept"
        );
        // One taken (or opened) after the clear is kept.
        let (_, now) = idle.take();
        idle.put("b", now);
        assert_eq!(idle.take().0, Some("b"));
    }

    #[test]
    fn at_most_the_bound_is_kept_idle() {
        let mut idle = Idle::default();
        for i in 0..MAX_WAIT_CONNS + 3 {
            idle.put(i, 0);
        }
        assert_eq!(idle.conns.len(), MAX_WAIT_CONNS);
    }
}
