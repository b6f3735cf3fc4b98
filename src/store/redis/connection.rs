//! The one shared command connection kept per store, opened from its
//! [`Source`], and the bound on every call.

use std::time::Duration;

use redis::RedisError;
use redis::aio::MultiplexedConnection;

use super::RedisStore;
#[cfg(feature = "cluster")]
use super::cluster::load_on_primaries;
use super::scripts::preloaded;
use super::server::Server;
use super::source::{Conn, Source, timeout_error, unbounded_responses};
use crate::error::{ConfigError, Error, Operation};
use crate::key::LockKey;
use crate::sync::lock;

impl RedisStore {
    /// The shared command connection, opened (scripts loaded, eviction
    /// policy checked) if there is none.
    pub(super) async fn connection(
        &self,
        op: Operation,
        key: Option<&LockKey>,
    ) -> Result<Conn, Error> {
        if let Some(c) = lock(&self.inner.conn).as_ref() {
            return Ok(c.clone());
        }
        // Boxed: opening is rare, and its future (the pool, Sentinel or
        // Cluster client, several layers deep, and the script loads) would
        // otherwise be nested into the future of every call, and copied
        // with it at each layer (kilobytes per command).
        Box::pin(self.connect(op, key)).await
    }

    /// Opens the store's connection now, as the first lock would (scripts
    /// loaded, the eviction policy checked), and has the server answer a
    /// `PING`, all within the command timeout: a readiness check at boot
    /// or behind a `/ready` route. A bad URL, password or certificate, a
    /// server that is down, or one the store refuses, answers here with
    /// the error the first lock would get, not at the first request:
    /// [`Error::Auth`], [`Error::Unavailable`] (the cause in its source
    /// chain), or [`Error::Config`] for a server whose `maxmemory-policy`
    /// can evict locks (refused by default, see
    /// [`EvictionCheck`](crate::EvictionCheck)) or on which scripting is
    /// unavailable (an ACL user without `@scripting`, a server without
    /// Lua: the store needs `EVAL`/`EVALSHA`/`SCRIPT LOAD`). A server that
    /// refuses `CONFIG` (an ACL user without `@admin`, a managed service)
    /// passes: its policy cannot be read, which is logged once.
    ///
    /// ```no_run
    /// use tower_redis_lock::RedisStore;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = RedisStore::from_url("redis://127.0.0.1/")?;
    /// store.check().await?; // fail at boot, not at the first request
    /// # Ok(())
    /// # }
    /// ```
    pub async fn check(&self) -> Result<(), Error> {
        self.with_conn(Operation::Connect, None, |mut c| async move {
            redis::cmd("PING").query_async::<()>(&mut c).await
        })
        .await
    }

    /// Opens the shared command connection (one task at a time).
    async fn connect(&self, op: Operation, key: Option<&LockKey>) -> Result<Conn, Error> {
        let _one_at_a_time = self.inner.connecting.lock().await;
        if let Some(c) = lock(&self.inner.conn).as_ref() {
            return Ok(c.clone());
        }
        let conn = match &self.inner.source {
            #[cfg(feature = "cluster")]
            Source::Cluster(client) => Conn::Cluster(Box::new(
                client
                    .get_async_connection()
                    .await
                    .map_err(|e| Error::from_redis(op, key, e))?,
            )),
            _ => Conn::Single(self.open_single(op, key).await?),
        };
        #[cfg_attr(not(feature = "deadpool"), allow(unused_mut))]
        let mut conn = conn;
        #[cfg(feature = "deadpool")]
        if let (Conn::Single(c), Source::Pool(_)) = (&mut conn, &self.inner.source) {
            // A pool handed in: the client's own response timeout (500 ms
            // by default) would cut every call short of a longer command
            // timeout; set past it, so that the command timeout is what
            // answers. (Connections the store opens itself have none.)
            c.set_response_timeout(self.inner.timeout.saturating_add(Duration::from_secs(1)));
        }
        let mut server = None;
        // Every script loaded with the connection, so that no first use
        // pays for a NOSCRIPT answer (see `preloaded`). (EVALSHA still
        // falls back to loading if the script cache is flushed; on a
        // cluster that fallback loads them where they are needed.)
        #[cfg(feature = "cluster")]
        if let Conn::Cluster(c) = &conn {
            load_on_primaries(c)
                .await
                .map_err(|e| script_load_error(op, key, e))?;
        }
        #[cfg_attr(not(feature = "cluster"), allow(irrefutable_let_patterns))]
        if let Conn::Single(_) = conn {
            // In one round trip, and in the same one, which server this
            // is (server.rs).
            let mut load = redis::pipe();
            load.ignore_errors();
            for src in preloaded() {
                load.cmd("SCRIPT").arg("LOAD").arg(src);
            }
            load.cmd("INFO").arg("server");
            let mut answers: Vec<redis::RedisResult<redis::Value>> = load
                .query_async(&mut conn)
                .await
                .map_err(|e| Error::from_redis(op, key, e))?;
            let info = answers.pop();
            for loaded in answers {
                loaded.map_err(|e| script_load_error(op, key, e))?;
            }
            server = match info {
                Some(Ok(text)) => redis::from_redis_value::<String>(text)
                    .ok()
                    .and_then(|text| Server::from_info(&text)),
                // `INFO` refused (an ACL, a renamed command): a server we
                // cannot name takes the Lua paths, which every server runs.
                _ => None,
            };
        }
        self.check_eviction(&mut conn, op, key).await?;
        // Before the connection is shared: a call on it reads the server
        // it found.
        *lock(&self.inner.server) = server;
        *lock(&self.inner.conn) = Some(conn.clone());
        *lock(&self.inner.conn_opened) = Some(std::time::Instant::now());
        #[cfg(feature = "cluster")]
        self.keep_slot_map_fresh();
        Ok(conn)
    }

    /// A new connection to the primary (pool or Sentinel source).
    pub(super) async fn open_single(
        &self,
        op: Operation,
        key: Option<&LockKey>,
    ) -> Result<MultiplexedConnection, Error> {
        match &self.inner.source {
            Source::Url(client) => client
                .get_multiplexed_async_connection_with_config(&unbounded_responses())
                .await
                .map_err(|e| Error::from_redis(op, key, e)),
            #[cfg(feature = "deadpool")]
            Source::Pool(pool) => {
                let obj = pool.get().await.map_err(|e| pool_error(op, key, e))?;
                Ok(deadpool_redis::Connection::take(obj))
            }
            #[cfg(feature = "sentinel")]
            Source::Sentinel(sentinel) => {
                let redis_err = |e| Error::from_redis(op, key, e);
                sentinel.watch(&self.inner);
                let client = sentinel.primary().await.map_err(redis_err)?;
                client
                    .get_multiplexed_async_connection_with_config(&unbounded_responses())
                    .await
                    .map_err(redis_err)
            }
            #[cfg(feature = "cluster")]
            Source::Cluster(_) => Err(Error::Config(ConfigError::new(
                "source",
                "a cluster store has no single primary",
            ))),
        }
    }

    pub(super) fn forget_connection_on(&self, err: &RedisError) {
        let readonly = err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly);
        if err.is_io_error()
            || err.is_connection_dropped()
            || err.is_unrecoverable_error()
            || readonly
        {
            self.forget_connections();
        }
    }

    /// Drops the shared connection and the idle `WAIT` connections: the next
    /// call opens new ones (and, behind Sentinel, asks for the primary).
    /// The server they found is forgotten with them: until a new
    /// connection reads it again, renewals take the Lua path, which every
    /// server runs (the next connection may reach another server: a
    /// failover, a restart on an older version).
    pub(super) fn forget_connections(&self) {
        *lock(&self.inner.conn) = None;
        *lock(&self.inner.server) = None;
        self.inner.wait_conns.clear();
    }

    /// Runs `f` on the shared connection within the command timeout.
    pub(super) async fn with_conn<T, F, Fut>(
        &self,
        op: Operation,
        key: Option<&LockKey>,
        f: F,
    ) -> Result<T, Error>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
    {
        let work = async {
            let conn = self.connection(op, key).await?;
            f(conn).await.map_err(|e| {
                self.forget_connection_on(&e);
                Error::from_redis(op, key, e)
            })
        };
        self.bounded(op, key, self.inner.timeout, work).await
    }

    /// Runs `work` within `bound`; a timeout is an [`Error::Unavailable`].
    pub(super) async fn bounded<T>(
        &self,
        op: Operation,
        key: Option<&LockKey>,
        bound: Duration,
        work: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        match tokio::time::timeout(bound, work).await {
            Ok(r) => r,
            Err(_) => {
                // Behind Sentinel a silent primary may have been replaced:
                // ask again on the next call.
                #[cfg(feature = "sentinel")]
                if let Source::Sentinel(_) = self.inner.source {
                    self.forget_connections();
                }
                // Elsewhere, at most once per command timeout (so that a
                // server that stays frozen does not have every call wait
                // for a reconnect):
                // - One primary: the next call opens a new connection. The
                //   connection may be half-open (its peer gone without a
                //   word, a NAT or firewall that dropped it), and it would
                //   answer nothing until TCP gives up on it, many minutes
                //   later.
                // - A cluster: the slot map is read afresh in the
                //   background. A silent primary may have been replaced by
                //   its replica, and the client would never learn it (it
                //   reads the slot map only on an error or a redirect, and
                //   a frozen node gives neither). The current connection
                //   goes on serving every other slot meanwhile: opening a
                //   new one waits on the frozen node (its seed query, its
                //   connection, its `CONFIG GET`), and a call made to wait
                //   for that would pay for another key's trouble.
                let opened = *lock(&self.inner.conn_opened);
                if opened.is_some_and(|at| at.elapsed() >= self.inner.timeout) {
                    #[cfg(feature = "cluster")]
                    if self.inner.source.is_cluster() {
                        // The idle connections of grants that wait for
                        // replicas have slot maps of their own, as old.
                        self.inner.wait_conns.clear();
                        self.reread_slot_map();
                        return Err(timeout_error(op, key, bound));
                    }
                    self.forget_connections();
                }
                Err(timeout_error(op, key, bound))
            }
        }
    }
}

/// A refused `SCRIPT LOAD`: where the server answered that it will not
/// run scripts for this user (`NOPERM`: an ACL without `@scripting`) or
/// at all (an `ERR`: no such command, a server built without Lua), an
/// [`Error::Config`] naming scripting; anything else (a dropped
/// connection, a server still loading its data, no password given) as any
/// other call's error.
fn script_load_error(op: Operation, key: Option<&LockKey>, e: RedisError) -> Error {
    if !matches!(e.code(), Some("NOPERM" | "ERR")) {
        return Error::from_redis(op, key, e);
    }
    Error::Config(ConfigError::server(
        "scripting",
        format!(
            "scripting unavailable on this server: {e}; the lock store needs \
             EVAL/EVALSHA/SCRIPT LOAD (ACL category @scripting)"
        ),
    ))
}

#[cfg(feature = "deadpool")]
fn pool_error(op: Operation, key: Option<&LockKey>, e: deadpool_redis::PoolError) -> Error {
    match e {
        deadpool_redis::PoolError::Backend(e) => Error::from_redis(op, key, e),
        other => Error::Unavailable {
            op,
            key: key.cloned(),
            source: Box::new(other) as crate::error::BoxError,
        },
    }
}
