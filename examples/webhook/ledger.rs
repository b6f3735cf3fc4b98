//! The ledger: how often each event was applied, the effect the lock
//! protects, refusing stale holders by their fencing token.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tower_redis_lock::deadpool_redis;
use tower_redis_lock::{FenceOutcome, FencedResource, FencingToken};

use super::LEDGER_PREFIX;

/// Bound on each ledger call, so a frozen Redis answers 503, not a hang.
const LEDGER_TIMEOUT: Duration = Duration::from_secs(2);

/// What applying an event did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// Counted; the event's count is now `count`.
    Counted {
        /// Times the event has been applied, this one included.
        count: u64,
    },
    /// Refused: a holder with a newer fencing token has written.
    Stale {
        /// The newest token the ledger has seen for this event.
        seen: u64,
    },
}

/// How often each event was applied: the effect the lock protects.
#[derive(Clone)]
pub enum Ledger {
    /// event id → (count, last fencing token).
    Memory(Arc<Mutex<HashMap<String, (u64, u64)>>>),
    /// `ledger:{webhooks}:<id>` hashes written by [`FencedResource`].
    Redis(deadpool_redis::Pool),
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Ledger::Memory(_) => f.write_str("Ledger::Memory"),
            Ledger::Redis(_) => f.write_str("Ledger::Redis"),
        }
    }
}

impl Ledger {
    /// An in-memory ledger.
    pub fn memory() -> Ledger {
        Ledger::Memory(Arc::default())
    }

    /// A ledger in Redis at `url` (connects lazily).
    pub fn redis(url: &str) -> Result<Ledger, String> {
        deadpool_redis::Config::from_url(url)
            .create_pool(Some(deadpool_redis::Runtime::Tokio1))
            .map(Ledger::Redis)
            .map_err(|e| format!("REDIS_URL is not valid: {e}"))
    }

    /// The Redis key of an event's entry.
    pub fn key(id: &str) -> String {
        format!("{LEDGER_PREFIX}{id}")
    }

    /// Counts one application of `id`, if `token` is at least the newest
    /// token the entry has seen.
    pub async fn apply(&self, id: &str, token: FencingToken) -> Result<Applied, String> {
        match self {
            Ledger::Memory(map) => {
                let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
                let (count, last) = map.entry(id.to_owned()).or_default();
                if *last > token.get() {
                    return Ok(Applied::Stale { seen: *last });
                }
                *count += 1;
                *last = token.get();
                Ok(Applied::Counted { count: *count })
            }
            Ledger::Redis(pool) => {
                let work = async {
                    let mut conn = pool.get().await.map_err(|e| e.to_string())?;
                    let entry = FencedResource::new(Ledger::key(id));
                    let current = match entry.get(&mut conn).await.map_err(|e| e.to_string())? {
                        None => 0,
                        Some((value, _)) => std::str::from_utf8(&value)
                            .ok()
                            .and_then(|v| v.parse::<u64>().ok())
                            .ok_or_else(|| format!("ledger entry {id:?} is not a count"))?,
                    };
                    // Read, then write with the token: a newer holder that
                    // wrote in between makes this write Stale.
                    match entry
                        .set(&mut conn, token, current + 1)
                        .await
                        .map_err(|e| e.to_string())?
                    {
                        FenceOutcome::Applied => Ok(Applied::Counted { count: current + 1 }),
                        FenceOutcome::Stale { seen } => Ok(Applied::Stale { seen: seen.get() }),
                    }
                };
                tokio::time::timeout(LEDGER_TIMEOUT, work)
                    .await
                    .map_err(|_| "the ledger did not answer in time".to_owned())?
            }
        }
    }

    /// Every event's count.
    pub async fn counts(&self) -> Result<BTreeMap<String, u64>, String> {
        match self {
            Ledger::Memory(map) => {
                let map = map.lock().unwrap_or_else(|p| p.into_inner());
                Ok(map.iter().map(|(id, (n, _))| (id.clone(), *n)).collect())
            }
            Ledger::Redis(pool) => {
                let work = async {
                    let mut conn = pool.get().await.map_err(|e| e.to_string())?;
                    let mut out = BTreeMap::new();
                    let mut cursor = 0u64;
                    loop {
                        let (next, keys): (u64, Vec<String>) = redis_cmd("SCAN")
                            .arg(cursor)
                            .arg("MATCH")
                            .arg(format!("{LEDGER_PREFIX}*"))
                            .arg("COUNT")
                            .arg(500)
                            .query_async(&mut conn)
                            .await
                            .map_err(|e| e.to_string())?;
                        for key in keys {
                            let value: Option<u64> = redis_cmd("HGET")
                                .arg(&key)
                                .arg("value")
                                .query_async(&mut conn)
                                .await
                                .map_err(|e| e.to_string())?;
                            if let (Some(id), Some(n)) = (key.strip_prefix(LEDGER_PREFIX), value) {
                                out.insert(id.to_owned(), n);
                            }
                        }
                        if next == 0 {
                            return Ok(out);
                        }
                        cursor = next;
                    }
                };
                tokio::time::timeout(LEDGER_TIMEOUT, work)
                    .await
                    .map_err(|_| "the ledger did not answer in time".to_owned())?
            }
        }
    }
}

fn redis_cmd(name: &str) -> tower_redis_lock::redis::Cmd {
    tower_redis_lock::redis::cmd(name)
}
