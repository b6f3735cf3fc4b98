//! The operator's calls of a Redis store: who holds a lock (`inspect.lua`),
//! an operator's release that raises the fence (`force_release.lua`), and
//! a namespace's held locks by a bounded `SCAN` (on a Cluster, on every
//! primary in turn).

use std::time::Duration;

use redis::Cmd;

use super::RedisStore;
use super::keys::{FENCE, LOCK, WAITED};
use super::scripts::{Argv, FORCE_RELEASE, INSPECT, ScriptCall};
use crate::error::{ConfigError, Error, Operation};
use crate::key::LockKey;
use crate::store::holder::{
    ForcedRelease, HolderId, HolderInfo, HolderPage, ListCursor, parse_record,
};
use crate::token::FencingToken;

/// The most `SCAN` is asked for in one step.
const MAX_COUNT: usize = 1000;

impl RedisStore {
    /// Who holds `key` on this node (see [`LockStore::inspect`]).
    ///
    /// [`LockStore::inspect`]: crate::LockStore::inspect
    pub(crate) async fn inspect_script(&self, key: &LockKey) -> Result<Option<HolderInfo>, Error> {
        let call = ScriptCall::new(
            &INSPECT,
            &[self.name(key, LOCK)],
            &[Argv::Name(self.name(key, WAITED))],
        );
        let answer: Vec<redis::Value> = self
            .with_conn(Operation::Inspect, Some(key), |mut c| async move {
                call.invoke(&mut c).await
            })
            .await?;
        let unexpected = || Error::Unavailable {
            op: Operation::Inspect,
            key: Some(key.clone()),
            source: "unexpected reply from the inspect script".into(),
        };
        let text = |v: &redis::Value| match v {
            redis::Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
            _ => None,
        };
        match answer.as_slice() {
            [] => Ok(None),
            [
                owner,
                redis::Value::Int(pttl),
                record,
                redis::Value::Int(waited),
            ] => {
                let owner = text(owner).ok_or_else(unexpected)?;
                let record = text(record).unwrap_or_default();
                let (fencing_token, granted_at, label) = parse_record(&record);
                Ok(Some(HolderInfo {
                    key: key.clone(),
                    holder: HolderId::of_text(&owner),
                    label,
                    fencing_token,
                    granted_at,
                    remaining: (*pttl >= 0).then(|| Duration::from_millis(*pttl as u64)),
                    waiters: *waited == 1,
                }))
            }
            _ => Err(unexpected()),
        }
    }

    /// Removes `key`'s lock whoever holds it and raises its fence (see
    /// [`LockStore::force_release`]).
    ///
    /// [`LockStore::force_release`]: crate::LockStore::force_release
    pub(crate) async fn force_release_script(&self, key: &LockKey) -> Result<ForcedRelease, Error> {
        // The fence only with fencing.
        let mut args = [
            Argv::Name(self.name(key, WAITED)),
            // The flags of migration.lua.
            Argv::Str(if self.inner.source.is_cluster() {
                "c"
            } else {
                ""
            }),
            Argv::Str(""),
            Argv::Int(self.inner.fence_retention_ms),
        ];
        if self.inner.fencing {
            args[2] = Argv::Name(self.name(key, FENCE));
        }
        let call = ScriptCall::new(&FORCE_RELEASE, &[self.name(key, LOCK)], &args);
        let (released, fence): (i64, String) = self
            .with_conn(Operation::ForceRelease, Some(key), |mut c| async move {
                call.invoke(&mut c).await
            })
            .await?;
        Ok(ForcedRelease {
            released: released == 1,
            fence: fence.parse::<u64>().ok().map(FencingToken::new),
        })
    }

    /// One page of `namespace`'s held locks (see [`LockStore::list`]).
    ///
    /// [`LockStore::list`]: crate::LockStore::list
    pub(crate) async fn list_scan(
        &self,
        namespace: &str,
        cursor: &ListCursor,
        count: usize,
    ) -> Result<HolderPage, Error> {
        crate::key::validate_name(namespace, false)
            .map_err(|e| Error::InvalidKey { reason: e.reason() })?;
        let count = count.clamp(1, MAX_COUNT);
        // `<prefix>:{<ns>:<3 hex digits>}:<id>:lock`: a namespace and a
        // prefix have no glob characters (their alphabets), so the pattern
        // matches this namespace's locks and nothing else.
        let pattern = format!("{}:{{{namespace}:???}}:*:{LOCK}", self.inner.prefix);
        let (names, next) = if self.inner.source.is_cluster() {
            self.scan_cluster(&pattern, cursor, count).await?
        } else {
            let at: u64 = if cursor.as_str().is_empty() {
                0
            } else {
                cursor.as_str().parse().map_err(|_| bad_cursor())?
            };
            let (next, names) = self.scan_step(None, at, &pattern, count).await?;
            (names, (next != 0).then(|| ListCursor(next.to_string())))
        };
        let infos = futures_util::future::join_all(
            names
                .iter()
                .filter_map(|n| self.key_of(namespace, n))
                .map(|k| async move { self.inspect_script(&k).await }),
        )
        .await;
        let mut locks = Vec::with_capacity(infos.len());
        for info in infos {
            // Released between the scan and the look: not held any more.
            if let Some(info) = info? {
                locks.push(info);
            }
        }
        Ok(HolderPage { locks, next })
    }

    /// The lock of Redis name `name` in `namespace`, if it is one of this
    /// store's lock names.
    fn key_of(&self, namespace: &str, name: &str) -> Option<LockKey> {
        let rest = name.strip_prefix(self.inner.prefix.as_str())?;
        let rest = rest.strip_prefix(":{")?.strip_prefix(namespace)?;
        let rest = rest.get(..1).filter(|c| *c == ":").and(rest.get(1..))?;
        let id = rest.get(5..)?.strip_suffix(":lock")?;
        LockKey::from_shown(namespace, id).ok()
    }

    /// One `SCAN` step from `at`, on one node (a Cluster primary by its
    /// address) or on the store's one primary.
    async fn scan_step(
        &self,
        node: Option<(&str, u16)>,
        at: u64,
        pattern: &str,
        count: usize,
    ) -> Result<(u64, Vec<String>), Error> {
        let mut scan = Cmd::new();
        scan.arg("SCAN")
            .arg(at)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(count);
        self.with_conn(Operation::List, None, |c| async move {
            let mut c = c;
            match node {
                None => scan.query_async(&mut c).await,
                Some((host, port)) => c.route_to(scan, host, port).await,
            }
        })
        .await
    }

    /// A Cluster page: the cursor names a primary and the position of its
    /// scan (`<host>-<port>-<position>`); the primaries are taken in the
    /// order of their addresses, and a primary's scan done moves on to the
    /// next one.
    async fn scan_cluster(
        &self,
        pattern: &str,
        cursor: &ListCursor,
        count: usize,
    ) -> Result<(Vec<String>, Option<ListCursor>), Error> {
        let primaries = self.primaries().await?;
        let (mut index, at) = if cursor.as_str().is_empty() {
            (0, 0)
        } else {
            let mut parts = cursor.as_str().rsplitn(3, '-');
            let at: u64 = parts
                .next()
                .and_then(|p| p.parse().ok())
                .ok_or_else(bad_cursor)?;
            let port: u16 = parts
                .next()
                .and_then(|p| p.parse().ok())
                .ok_or_else(bad_cursor)?;
            let host = parts.next().ok_or_else(bad_cursor)?;
            // A primary that left since the last page: the next one by
            // address, from its start.
            match primaries.iter().position(|(h, p)| h == host && *p == port) {
                Some(i) => (i, at),
                None => (
                    primaries
                        .iter()
                        .position(|(h, p)| (h.as_str(), *p) > (host, port))
                        .unwrap_or(primaries.len()),
                    0,
                ),
            }
        };
        let Some((host, port)) = primaries.get(index) else {
            return Ok((Vec::new(), None));
        };
        let (next, names) = self
            .scan_step(Some((host, *port)), at, pattern, count)
            .await?;
        let next = if next != 0 {
            Some(format!("{host}-{port}-{next}"))
        } else {
            index += 1;
            primaries.get(index).map(|(h, p)| format!("{h}-{p}-0"))
        };
        Ok((names, next.and_then(|n| ListCursor::parse(&n))))
    }

    /// The Cluster's primaries (`CLUSTER SLOTS`), by address.
    async fn primaries(&self) -> Result<Vec<(String, u16)>, Error> {
        let slots: Vec<redis::Value> = self
            .with_conn(Operation::List, None, |mut c| async move {
                redis::cmd("CLUSTER").arg("SLOTS").query_async(&mut c).await
            })
            .await?;
        let mut primaries = Vec::new();
        for range in slots {
            let redis::Value::Array(parts) = range else {
                continue;
            };
            let Some(redis::Value::Array(node)) = parts.get(2) else {
                continue;
            };
            if let [redis::Value::BulkString(host), redis::Value::Int(port), ..] = node.as_slice()
                && let (Ok(host), Ok(port)) =
                    (String::from_utf8(host.clone()), u16::try_from(*port))
            {
                primaries.push((host, port));
            }
        }
        primaries.sort();
        primaries.dedup();
        Ok(primaries)
    }
}

fn bad_cursor() -> Error {
    Error::Config(ConfigError::new(
        "cursor",
        "not a list cursor this store gave",
    ))
}
