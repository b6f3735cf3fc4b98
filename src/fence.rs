//! The resource side of fencing: refuse writes from stale holders.

use std::sync::LazyLock;

use redis::Script;

use crate::token::FencingToken;

// KEYS[1] resource hash; ARGV[1] token, ARGV[2] value
// -> {1, token} applied, {0, highest token seen} refused
static FENCED_SET: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local seen = tonumber(redis.call('HGET', KEYS[1], 'fencing_token'))
local token = tonumber(ARGV[1])
if seen and seen > token then
  return {0, seen}
end
redis.call('HSET', KEYS[1], 'value', ARGV[2], 'fencing_token', ARGV[1])
return {1, token}
"#,
    )
});

/// What a fenced write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceOutcome {
    /// The write was applied.
    Applied,
    /// Refused: the resource has seen a newer holder's token.
    Stale {
        /// The highest token the resource has seen.
        seen: FencingToken,
    },
}

// KEYS[1] resource hash; ARGV[1] token
// -> the highest token seen afterwards (the value is left as it is)
static FENCED_RAISE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local seen = tonumber(redis.call('HGET', KEYS[1], 'fencing_token'))
local token = tonumber(ARGV[1])
if seen and seen >= token then
  return seen
end
redis.call('HSET', KEYS[1], 'fencing_token', ARGV[1])
return token
"#,
    )
});

/// A value in Redis that only accepts writes carrying a fencing token at
/// least as high as any it has seen — the check that makes fencing tokens
/// useful. A holder that was paused past its lease (GC, swap, a frozen VM)
/// and wakes up after someone else took the lock gets
/// [`FenceOutcome::Stale`] instead of overwriting newer work.
///
/// The value lives in a hash with the fields `value` and `fencing_token`;
/// check and write are one Lua script. Equal tokens are accepted, so one
/// holder may write several times.
///
/// ```no_run
/// use tower_redis_lock::{FenceOutcome, FencedResource, LockKey, Locker, RedisStore};
///
/// # async fn demo(mut conn: redis::aio::MultiplexedConnection) -> Result<(), Box<dyn std::error::Error>> {
/// let locker = Locker::new(RedisStore::from_url("redis://127.0.0.1/")?);
/// let guard = locker.acquire(&LockKey::new("accounts", "acc_1")?).await?;
/// let balance = FencedResource::new("balance:acc_1");
/// match balance.set(&mut conn, guard.fencing_token()?, "100").await? {
///     FenceOutcome::Applied => {}
///     FenceOutcome::Stale { seen } => eprintln!("a newer holder ({seen}) got there first"),
/// }
/// # Ok(())
/// # }
/// ```
///
/// The same rule in SQL, with a `fencing_token BIGINT NOT NULL DEFAULT 0`
/// column on the protected row:
///
/// ```sql
/// UPDATE accounts
///    SET balance = $1, fencing_token = $2
///  WHERE id = $3 AND fencing_token <= $2;
/// -- 0 rows updated: a newer holder has written; stop.
/// ```
#[derive(Debug, Clone)]
pub struct FencedResource {
    key: String,
}

impl FencedResource {
    /// The resource stored at Redis key `key`.
    pub fn new(key: impl Into<String>) -> Self {
        FencedResource { key: key.into() }
    }

    /// Writes `value` if `token` is at least the highest token seen.
    pub async fn set<C>(
        &self,
        conn: &mut C,
        token: FencingToken,
        value: impl redis::ToRedisArgs + Send + Sync,
    ) -> redis::RedisResult<FenceOutcome>
    where
        C: redis::aio::ConnectionLike + Send,
    {
        let (applied, n): (i64, u64) = FENCED_SET
            .key(&self.key)
            .arg(token.get())
            .arg(value)
            .invoke_async(conn)
            .await?;
        Ok(if applied == 1 {
            FenceOutcome::Applied
        } else {
            FenceOutcome::Stale {
                seen: FencingToken::new(n),
            }
        })
    }

    /// Raises the highest token seen to `token` without writing a value
    /// (nothing if it is higher already), so that every write with a lower
    /// token is refused from now on: the fence of a
    /// [`force_release`](crate::Locker::force_release), applied before the
    /// next holder writes. Answers the highest token seen afterwards.
    ///
    /// ```no_run
    /// use tower_redis_lock::{FencedResource, LockKey, Locker, RedisStore};
    ///
    /// # async fn demo(mut conn: redis::aio::MultiplexedConnection) -> Result<(), Box<dyn std::error::Error>> {
    /// let locker = Locker::new(RedisStore::from_url("redis://127.0.0.1/")?);
    /// let key = LockKey::new("accounts", "acc_1")?;
    /// let forced = locker.force_release(&key, "ops: stuck batch").await?;
    /// if let Some(fence) = forced.fence {
    ///     FencedResource::new("balance:acc_1").raise(&mut conn, fence).await?;
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn raise<C>(
        &self,
        conn: &mut C,
        token: FencingToken,
    ) -> redis::RedisResult<FencingToken>
    where
        C: redis::aio::ConnectionLike + Send,
    {
        let seen: u64 = FENCED_RAISE
            .key(&self.key)
            .arg(token.get())
            .invoke_async(conn)
            .await?;
        Ok(FencingToken::new(seen))
    }

    /// The current value and the token that wrote it.
    pub async fn get<C>(&self, conn: &mut C) -> redis::RedisResult<Option<(Vec<u8>, FencingToken)>>
    where
        C: redis::aio::ConnectionLike + Send,
    {
        let (value, token): (Option<Vec<u8>>, Option<u64>) = redis::cmd("HMGET")
            .arg(&self.key)
            .arg("value")
            .arg("fencing_token")
            .query_async(conn)
            .await?;
        Ok(value.zip(token).map(|(v, t)| (v, FencingToken::new(t))))
    }
}
