//! Where the store's command connections come from (a client from a URL,
//! a pool, the primary a set of Sentinels names, a Cluster), the
//! connection they give, and the bounds on a cluster's node connections.
//! Below the notifier, the Sentinel and Cluster builders and the store's
//! connection handling, which all name these.

#[cfg(feature = "sentinel")]
use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
#[cfg(feature = "cluster")]
use redis::cluster::ClusterClientBuilder;
use redis::{Cmd, RedisError, RedisResult, Script};

use super::scripts::LoadFor;
#[cfg(feature = "cluster")]
use super::scripts::source_of;
#[cfg(feature = "sentinel")]
use super::sentinel_client::Sentinels;
use crate::error::{Error, Operation};
use crate::key::LockKey;

/// Where command connections come from.
#[derive(Clone)]
pub(super) enum Source {
    /// A client the store made from a URL: it opens one multiplexed
    /// connection at a time, with no response timeout of the client's own
    /// (the store's command timeout bounds every call: one timer per
    /// command, not two).
    Url(Box<redis::Client>),
    /// A pool handed in: its connections come with the response timeout
    /// its manager gives them, which the store moves past the command
    /// timeout, so that the command timeout is what answers.
    #[cfg(feature = "deadpool")]
    Pool(deadpool_redis::Pool),
    #[cfg(feature = "sentinel")]
    Sentinel(Arc<Sentinels>),
    #[cfg(feature = "cluster")]
    Cluster(Box<redis::cluster::ClusterClient>),
}

impl Source {
    /// The topology, for `Debug`.
    pub(super) fn topology(&self) -> &'static str {
        match self {
            Source::Url(_) => "primary",
            #[cfg(feature = "deadpool")]
            Source::Pool(_) => "primary",
            #[cfg(feature = "sentinel")]
            Source::Sentinel(_) => "sentinel",
            #[cfg(feature = "cluster")]
            Source::Cluster(_) => "cluster",
        }
    }

    /// Whether this is a Redis Cluster.
    pub(super) fn is_cluster(&self) -> bool {
        #[cfg(feature = "cluster")]
        if let Source::Cluster(_) = self {
            return true;
        }
        false
    }
}

/// A command connection: one multiplexed connection to a primary, or a
/// cluster connection that routes by slot and follows MOVED/ASK.
#[derive(Clone)]
pub(super) enum Conn {
    Single(MultiplexedConnection),
    #[cfg(feature = "cluster")]
    Cluster(Box<redis::cluster_async::ClusterConnection>),
}

impl Conn {
    /// Sends `cmd` to the node at `host:port` of a Cluster; on one primary,
    /// to that primary.
    pub(super) async fn route_to<T: redis::FromRedisValue>(
        &mut self,
        cmd: redis::Cmd,
        host: &str,
        port: u16,
    ) -> Result<T, RedisError> {
        match self {
            Conn::Single(c) => {
                let _ = (host, port);
                cmd.query_async(c).await
            }
            #[cfg(feature = "cluster")]
            Conn::Cluster(c) => {
                use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                    host: host.to_owned(),
                    port,
                });
                let value = c.route_command(cmd, routing).await?;
                Ok(redis::from_redis_value(value)?)
            }
        }
    }
}

impl redis::aio::ConnectionLike for Conn {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            #[cfg(feature = "cluster")]
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            #[cfg(feature = "cluster")]
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            #[cfg(feature = "cluster")]
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// Connections the store opens itself: no response timeout of the
/// client's own (the command timeout bounds every call, connecting
/// included), the client's other defaults.
pub(super) fn unbounded_responses() -> redis::AsyncConnectionConfig {
    redis::AsyncConnectionConfig::new().set_response_timeout(None)
}

pub(super) fn timeout_error(op: Operation, key: Option<&LockKey>, after: Duration) -> Error {
    Error::Unavailable {
        op,
        key: key.cloned(),
        source: format!("no answer from Redis within {} ms", after.as_millis()).into(),
    }
}

/// A script reloaded after `NOSCRIPT` where the call goes (see
/// [`LoadFor`]).
impl LoadFor for Conn {
    fn load_for(
        &mut self,
        script: &'static Script,
        call: &Cmd,
    ) -> impl Future<Output = RedisResult<()>> + Send {
        #[cfg(feature = "cluster")]
        let first_key = call.args_iter().nth(3).and_then(|a| match a {
            redis::Arg::Simple(k) => Some(k.to_vec()),
            _ => None,
        });
        #[cfg(not(feature = "cluster"))]
        let _ = call;
        async move {
            match self {
                Conn::Single(c) => script.load_async(c).await.map(drop),
                // `SCRIPT LOAD` as a plain command goes to every node the
                // cluster connection knows: one silent node (a frozen
                // primary of another slot) would fail the reload until the
                // command timeout. Load it where the call goes: the
                // primary of its first key's slot, the node that answered
                // NOSCRIPT.
                #[cfg(feature = "cluster")]
                Conn::Cluster(c) => {
                    use redis::cluster_routing::{
                        Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
                    };
                    let to = first_key.map_or(SingleNodeRoutingInfo::RandomPrimary, |k| {
                        SingleNodeRoutingInfo::SpecificNode(Route::with_key(k, SlotAddr::Master))
                    });
                    let mut load = redis::cmd("SCRIPT");
                    load.arg("LOAD").arg(source_of(script));
                    c.route_command(load, RoutingInfo::SingleNode(to))
                        .await
                        .map(drop)
                }
            }
        }
    }
}

#[cfg(feature = "cluster")]
/// The bounds on every connection a cluster store opens to a node.
#[derive(Clone, Copy, Debug)]
pub(super) struct NodeTimeouts {
    /// How long a node may take to answer one request (or to accept a
    /// connection): a quarter of the command timeout, so that a slot-map
    /// refresh that meets a frozen node (a ping, a reconnect) ends well
    /// within one command timeout.
    per_node: Duration,
}

#[cfg(feature = "cluster")]
impl NodeTimeouts {
    pub(super) fn new(command_timeout: Duration) -> Self {
        NodeTimeouts {
            per_node: (command_timeout / 4).max(Duration::from_millis(1)),
        }
    }

    /// The settings of a cluster connection of its own for grants that
    /// wait for replicas: a node may take `bound` to answer (the `WAIT`
    /// after a grant blocks until its timeout when replicas lag), and as
    /// long as any other to accept a connection.
    pub(super) fn for_waits(self, bound: Duration) -> redis::cluster::ClusterConfig {
        redis::cluster::ClusterConfig::new()
            .set_connection_timeout(self.per_node)
            .set_response_timeout(bound)
    }

    /// `builder` with these bounds. No overall bound of the client's own:
    /// the store's command timeout bounds every call (redirects included).
    pub(super) fn apply(self, builder: ClusterClientBuilder) -> ClusterClientBuilder {
        builder
            .response_timeout(self.per_node)
            .connection_timeout(self.per_node)
            .overall_response_timeout(None)
    }
}
