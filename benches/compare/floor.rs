//! The floor cases: the least Redis and the client library must do for a
//! safe cycle, sent on plain redis-rs connections, with none of the
//! crate's own work (no guard, watchdog, waiter mark, holder record,
//! re-entry, metrics). What a case here reaches is what any crate built
//! on redis-rs could reach against the same server for that cycle.
//!
//! * `floor-unfenced`: `SET lock owner NX PX ttl`, then an owner-checked
//!   release: one script of a `GET` and a `DEL` (rslock's release). The
//!   owner is unique per acquire (a counter: no random source).
//! * `floor-unfenced-os`: the same, with each owner drawn from the OS
//!   random source (`OwnerToken::generate`, one `getrandom` system call),
//!   as DESIGN.md asks of ours: the floor for our owner-token rule.
//! * `floor-unfenced-marked`: `floor-unfenced-os` with the one thing
//!   our unfenced cycle adds that a waiter depends on: the release also
//!   deletes the lock's waited-for mark (its name made from the lock's,
//!   as release.lua makes it) and announces the release where a waiter
//!   had set the mark. The least cycle that keeps DESIGN.md's owner rule
//!   and wakes waiters by notification instead of their polling.
//! * `floor-fenced`: a grant that mints a fencing token on the server,
//!   floored by its clock as ours is (a counter that lapses or is lost
//!   must not make tokens fall): one script of `TIME`, the counter's
//!   `SET … PX … GET` (a fourth call, `SET`, only when the counter is at
//!   or past the clock) and the lock's `SET … NX PX … GET`; the release
//!   as above, matching the owner as the value's prefix. Over several
//!   servers (S4), every server at once, the token the quorum-th largest
//!   (every server granted: no write-back, as ours when all grant).

use std::sync::atomic::{AtomicU64, Ordering};

use futures_util::future::join_all;
use redis::aio::MultiplexedConnection;

const GRANT: &str = r"
local t = redis.call('TIME')
local now = t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
local last = redis.call('SET', KEYS[2], now, 'PX', ARGV[3], 'GET')
local token = now
if last and (#last > #now or (#last == #now and last >= now)) then
  token = string.format('%.0f', tonumber(last) + 1)
  redis.call('SET', KEYS[2], token, 'PX', ARGV[3])
end
if redis.call('SET', KEYS[1], ARGV[1] .. ' ' .. token, 'NX', 'PX', ARGV[2], 'GET') then
  return 0
end
return token
";

const RELEASE: &str = r"
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, #ARGV[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";

/// The release that also deletes the waited-for mark and, where a waiter
/// set it, announces the release (the lock's name ends in `lock`).
const RELEASE_MARKED: &str = r"
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
  local base = string.sub(KEYS[1], 1, -5)
  if redis.call('DEL', KEYS[1], base .. 'waited') > 1 then
    redis.call('PUBLISH', base .. 'released', '')
  end
  return 1
end
return 0
";

/// Which floor a cycle is.
#[derive(Clone, Copy)]
pub struct Kind {
    /// A token minted on the server (`floor-fenced`).
    pub fenced: bool,
    /// Owners from the OS random source, not a counter.
    pub os_owner: bool,
    /// The release deletes the waited-for mark and announces itself.
    pub marked: bool,
}

/// The counter's retention (ours by default: a day).
const RETENTION_MS: u64 = 86_400_000;

static OWNERS: AtomicU64 = AtomicU64::new(1);

/// `SCRIPT LOAD`s `script` on `c`: its SHA1.
async fn load(c: &mut MultiplexedConnection, script: &str) -> String {
    redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(script)
        .query_async(c)
        .await
        .unwrap()
}

/// Connections to each server, with both scripts loaded.
pub struct Floor {
    conns: Vec<MultiplexedConnection>,
    grant: String,
    release: String,
    release_marked: String,
}

impl Floor {
    pub async fn new(urls: &[String]) -> Floor {
        let mut conns = Vec::new();
        let (mut grant, mut release, mut release_marked) =
            (String::new(), String::new(), String::new());
        for u in urls {
            let client = redis::Client::open(u.as_str()).unwrap();
            let mut c = client.get_multiplexed_async_connection().await.unwrap();
            grant = load(&mut c, GRANT).await;
            release = load(&mut c, RELEASE).await;
            release_marked = load(&mut c, RELEASE_MARKED).await;
            conns.push(c);
        }
        Floor {
            conns,
            grant,
            release,
            release_marked,
        }
    }

    /// One acquire + release of `task`'s lock, as `kind` says.
    pub async fn cycle(&self, kind: Kind, task: usize) {
        let Kind {
            fenced,
            os_owner,
            marked,
        } = kind;
        let lock = if marked {
            format!("floor:{task}:lock")
        } else {
            format!("floor:{task}")
        };
        let release = if marked {
            &self.release_marked
        } else {
            &self.release
        };
        let owner = if os_owner {
            tower_redis_lock::OwnerToken::generate().as_str().to_owned()
        } else {
            format!("{:032x}", OWNERS.fetch_add(1, Ordering::Relaxed))
        };
        let ttl = super::TTL.as_millis() as u64;
        let grants = self.conns.iter().map(|c| {
            let mut c = c.clone();
            let (lock, owner) = (&lock, &owner);
            async move {
                if fenced {
                    let token: u64 = redis::cmd("EVALSHA")
                        .arg(&self.grant)
                        .arg(2)
                        .arg(lock)
                        .arg("floor:fence")
                        .arg(owner)
                        .arg(ttl)
                        .arg(RETENTION_MS)
                        .query_async(&mut c)
                        .await
                        .unwrap();
                    token
                } else {
                    let set: Option<String> = redis::cmd("SET")
                        .arg(lock)
                        .arg(owner)
                        .arg("NX")
                        .arg("PX")
                        .arg(ttl)
                        .query_async(&mut c)
                        .await
                        .unwrap();
                    u64::from(set.is_some())
                }
            }
        });
        let mut tokens = join_all(grants).await;
        // Uncontended: every server grants.
        assert!(
            tokens.iter().all(|&t| t > 0),
            "the floor's grant was refused"
        );
        tokens.sort_unstable();
        let quorum = self.conns.len() / 2 + 1;
        std::hint::black_box(tokens[self.conns.len() - quorum]);
        let releases = self.conns.iter().map(|c| {
            let mut c = c.clone();
            let (lock, owner) = (&lock, &owner);
            async move {
                let n: i64 = redis::cmd("EVALSHA")
                    .arg(release)
                    .arg(1)
                    .arg(lock)
                    .arg(owner)
                    .query_async(&mut c)
                    .await
                    .unwrap();
                n
            }
        });
        assert!(join_all(releases).await.iter().all(|&n| n == 1));
    }
}
