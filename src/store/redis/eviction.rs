//! The `maxmemory-policy` check on each new command connection: a server
//! that can evict keys with an expiry can delete a held lock.

use super::RedisStore;
use super::source::Conn;
use crate::error::{ConfigError, Error, Operation};
use crate::key::LockKey;
use crate::sync::lock;

/// What a store does on connecting to a server whose `maxmemory-policy` can
/// evict keys that have an expiry (`volatile-*`, `allkeys-*`): under memory
/// pressure such a server deletes a held lock, and a second holder gets in
/// while the first still runs. Run locks on `noeviction`, where a full server
/// refuses writes (the store answers [`Error::Unavailable`]) instead of
/// forgetting locks.
///
/// By default ([`Refuse`](Self::Refuse)) such a server is refused:
/// [`RedisStore::check`] and every call fail with [`Error::Config`] naming
/// the policy and the fix (`CONFIG SET maxmemory-policy noeviction`), until
/// the policy is changed. [`Log`](Self::Log) is the opt-out: log an error
/// and use the server anyway.
///
/// The policy is read with `CONFIG GET` each time the store opens a command
/// connection (on a Cluster, from every primary); a server that refuses
/// `CONFIG` (an ACL user without `@admin`, some managed services) is
/// reported once at warn level and used: there is nothing to check.
/// A [`RedlockStore`](crate::RedlockStore) is made of `RedisStore`s: each
/// node store has the setting its own builder gave it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum EvictionCheck {
    /// Log an error (once per policy) and use the server: the opt-out, for
    /// a server whose policy you cannot change and whose memory you watch.
    Log,
    /// Refuse the server (default): every call, and
    /// [`RedisStore::check`], fails with [`Error::Config`] naming the
    /// policy, until the policy is changed.
    #[default]
    Refuse,
    /// Do not read the policy.
    Off,
}

impl RedisStore {
    /// Reads the server's `maxmemory-policy` on a new connection and acts
    /// per [`EvictionCheck`].
    pub(super) async fn check_eviction(
        &self,
        conn: &mut Conn,
        op: Operation,
        key: Option<&LockKey>,
    ) -> Result<(), Error> {
        let check = self.inner.eviction_check;
        if check == EvictionCheck::Off {
            return Ok(());
        }
        let mut get = redis::cmd("CONFIG");
        get.arg("GET").arg("maxmemory-policy");
        let answer = match conn {
            Conn::Single(c) => get.query_async::<redis::Value>(c).await,
            #[cfg(feature = "cluster")]
            Conn::Cluster(c) => {
                use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};
                let all = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
                c.route_command(get, all).await
            }
        };
        let finding = match answer {
            Ok(v) => {
                let mut policies = Vec::new();
                eviction_policies(&v, &mut policies);
                policies.sort();
                policies.dedup();
                match policies.iter().find(|p| can_evict(p)) {
                    Some(p) => Finding::Evicting(p.clone()),
                    None if policies.is_empty() => {
                        Finding::Unknown("no maxmemory-policy in the CONFIG GET answer".into())
                    }
                    None => Finding::Safe,
                }
            }
            // Refused (ACL, a renamed command, a managed service).
            Err(e)
                if e.code().is_some()
                    || matches!(
                        e.kind(),
                        redis::ErrorKind::Server(_) | redis::ErrorKind::Extension
                    ) =>
            {
                Finding::Unknown(e.to_string())
            }
            Err(e) => return Err(Error::from_redis(op, key, e)),
        };
        let report = |text: String| {
            let mut last = lock(&self.inner.eviction_reported);
            let new = last.as_deref() != Some(text.as_str());
            if new {
                *last = Some(text);
            }
            new
        };
        match finding {
            Finding::Safe => Ok(()),
            Finding::Unknown(why) => {
                if report(format!("unknown: {why}")) {
                    tracing::warn!(
                        error = %why,
                        "could not read the Redis maxmemory-policy; locks are safe only on `noeviction`"
                    );
                }
                Ok(())
            }
            Finding::Evicting(policy) => {
                let refuse = check == EvictionCheck::Refuse;
                if report(policy.clone()) {
                    tracing::error!(
                        maxmemory_policy = %policy,
                        refused = refuse,
                        "Redis can evict keys with an expiry under memory pressure, held locks among them: \
                         two holders could then run at once; set `maxmemory-policy noeviction`"
                    );
                }
                if refuse {
                    return Err(Error::Config(ConfigError::server(
                        "maxmemory-policy",
                        format!(
                            "its maxmemory-policy `{policy}` can evict held locks (a second \
                             holder then gets in while the first still runs): run \
                             `CONFIG SET maxmemory-policy noeviction` on it (and set it in its \
                             config file), or opt out with `.eviction_check(EvictionCheck::Log)` \
                             on the store's builder"
                        ),
                    )));
                }
                Ok(())
            }
        }
    }
}

/// What a `CONFIG GET maxmemory-policy` found.
enum Finding {
    Safe,
    Evicting(String),
    Unknown(String),
}

/// Whether `policy` can evict a key that has an expiry: every policy but
/// `noeviction`.
fn can_evict(policy: &str) -> bool {
    !policy.eq_ignore_ascii_case("noeviction")
}

/// Collects the values of `maxmemory-policy` in a `CONFIG GET` answer: a
/// flat `[name, value]` array (RESP2), a map (RESP3), or a map of such
/// answers per node (a Cluster asked on every primary).
fn eviction_policies(v: &redis::Value, out: &mut Vec<String>) {
    use redis::Value;
    let text = |v: &Value| match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    let is_name = |v: &Value| text(v).is_some_and(|t| t.eq_ignore_ascii_case("maxmemory-policy"));
    match v {
        Value::Array(items) if items.len() == 2 && is_name(&items[0]) => {
            out.extend(text(&items[1]));
        }
        Value::Array(items) => items.iter().for_each(|i| eviction_policies(i, out)),
        Value::Map(pairs) => {
            for (k, v) in pairs {
                if is_name(k) {
                    out.extend(text(v));
                } else {
                    eviction_policies(v, out);
                }
            }
        }
        _ => {}
    }
}
