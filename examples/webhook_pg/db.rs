//! The database side: the event's effect and its "processed" mark in one
//! PostgreSQL transaction, fenced by the lock's token.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio_postgres::{Client, NoTls};
use tower_redis_lock::FencingToken;

/// Bound on one delivery's database work (connect, transaction, commit),
/// so that a stuck database answers 503, not a hang.
const DB_TIMEOUT: Duration = Duration::from_secs(5);

/// The tables, made on start if missing.
///
/// * `webhook_fences`: per event, the highest fencing token that wrote for
///   it. The lock is per event, so its tokens are comparable per event:
///   this row is what the token guards.
/// * `processed_events`: the "processed" mark, inserted in the same
///   transaction as the effect.
/// * `ledger_entries` and `balances`: the effect. An entry per application
///   (no unique constraint: applying twice would show as two rows) and a
///   running balance per customer.
pub const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS webhook_fences (
    event_id      TEXT PRIMARY KEY,
    fencing_token BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS processed_events (
    event_id      TEXT PRIMARY KEY,
    fencing_token BIGINT NOT NULL,
    processed_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS ledger_entries (
    entry         BIGSERIAL PRIMARY KEY,
    event_id      TEXT NOT NULL,
    customer      TEXT NOT NULL,
    amount        BIGINT NOT NULL,
    fencing_token BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS balances (
    customer      TEXT PRIMARY KEY,
    balance       BIGINT NOT NULL
);
";

/// Claims the event's fence row for `$2`: inserted, or raised to `$2` only
/// if no newer token has written (`fencing_token <= $2`). No row touched
/// means a newer holder has been here: this one is stale. The row stays
/// locked until the transaction ends, so a newer holder waits for it, and
/// a late writer waits for a newer one in flight and then re-reads the row.
const CLAIM: &str = "
INSERT INTO webhook_fences AS f (event_id, fencing_token) VALUES ($1, $2)
ON CONFLICT (event_id) DO UPDATE SET fencing_token = EXCLUDED.fencing_token
WHERE f.fencing_token <= EXCLUDED.fencing_token";
const SEEN: &str = "SELECT fencing_token FROM webhook_fences WHERE event_id = $1";
const PROCESSED: &str = "SELECT 1 FROM processed_events WHERE event_id = $1";
const ENTRY: &str = "
INSERT INTO ledger_entries (event_id, customer, amount, fencing_token)
VALUES ($1, $2, $3, $4)";
const CREDIT: &str = "
INSERT INTO balances AS b (customer, balance) VALUES ($1, $2)
ON CONFLICT (customer) DO UPDATE SET balance = b.balance + EXCLUDED.balance";
const MARK: &str = "
INSERT INTO processed_events (event_id, fencing_token) VALUES ($1, $2)";

/// A charge event: credit `amount` to `customer`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Charge {
    /// The event id (the lock key and the mark).
    pub id: String,
    /// Whose balance the charge credits.
    pub customer: String,
    /// How much, in the smallest currency unit.
    pub amount: i64,
}

/// What one delivery did in the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The effect and the mark were committed together.
    Applied,
    /// The mark was there already (an earlier delivery committed and then
    /// could not answer, e.g. the process died): nothing applied again.
    AlreadyProcessed,
    /// A newer holder of the event's lock has written: nothing written.
    Stale {
        /// The newest token the fence row holds.
        seen: i64,
    },
}

/// Points inside a delivery at which the process can be made to stop
/// itself (SIGSTOP) for tests (`WEBHOOK_PG_STOP_AT`): a test then kills it
/// (a crash there) or lets it go on late (a paused holder).
pub const STOP_POINTS: [&str; 5] = ["locked", "fenced", "applied", "marked", "committed"];

/// The database: a connection string and the stop point, if any.
#[derive(Debug, Clone)]
pub struct Db {
    url: String,
    stop_at: Option<String>,
}

impl Db {
    /// A database at `url` (a libpq-style string or a `postgresql://` URL);
    /// makes the tables if missing. `stop_at` is one of [`STOP_POINTS`].
    pub async fn open(url: &str, stop_at: Option<String>) -> Result<Db, String> {
        let db = Db {
            url: url.to_owned(),
            stop_at,
        };
        let client = db.connect().await?;
        client
            .batch_execute(SCHEMA)
            .await
            .map_err(|e| format!("cannot make the tables: {e}"))?;
        Ok(db)
    }

    /// A new connection (one per delivery: a real service would pool them).
    async fn connect(&self) -> Result<Client, String> {
        let (client, conn) = tokio_postgres::connect(&self.url, NoTls)
            .await
            .map_err(|e| format!("cannot connect to the database: {e}"))?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::warn!(error = %e, "database connection ended");
            }
        });
        Ok(client)
    }

    /// For tests: stops this process (SIGSTOP) if it was started with
    /// `WEBHOOK_PG_STOP_AT=<point>`.
    pub fn stop_point(&self, point: &str) {
        if self.stop_at.as_deref() == Some(point) {
            tracing::warn!(point, "stopping at the configured stop point");
            // SAFETY: plain syscall; SIGSTOP stops the whole process.
            unsafe {
                libc::raise(libc::SIGSTOP);
            }
        }
    }

    /// Applies `charge` with `token`: the fence claim, the effect and the
    /// mark commit together or not at all.
    pub async fn apply(&self, charge: &Charge, token: FencingToken) -> Result<Outcome, String> {
        match tokio::time::timeout(DB_TIMEOUT, self.apply_once(charge, token)).await {
            Ok(result) => result,
            Err(_) => Err(format!("no answer from the database within {DB_TIMEOUT:?}")),
        }
    }

    async fn apply_once(&self, charge: &Charge, token: FencingToken) -> Result<Outcome, String> {
        // PostgreSQL's BIGINT is signed; tokens fit for two centuries.
        let token = i64::try_from(token.get())
            .map_err(|_| format!("fencing token {token} does not fit in BIGINT"))?;
        let sql = |e: tokio_postgres::Error| format!("database error: {e}");
        let mut client = self.connect().await?;
        let tx = client.transaction().await.map_err(sql)?;
        if tx
            .execute(CLAIM, &[&charge.id, &token])
            .await
            .map_err(sql)?
            == 0
        {
            let seen: i64 = tx.query_one(SEEN, &[&charge.id]).await.map_err(sql)?.get(0);
            tx.rollback().await.map_err(sql)?;
            return Ok(Outcome::Stale { seen });
        }
        self.stop_point("fenced");
        if tx
            .query_opt(PROCESSED, &[&charge.id])
            .await
            .map_err(sql)?
            .is_some()
        {
            // Commit, not roll back: the fence keeps the newest token.
            tx.commit().await.map_err(sql)?;
            return Ok(Outcome::AlreadyProcessed);
        }
        tx.execute(
            ENTRY,
            &[&charge.id, &charge.customer, &charge.amount, &token],
        )
        .await
        .map_err(sql)?;
        tx.execute(CREDIT, &[&charge.customer, &charge.amount])
            .await
            .map_err(sql)?;
        self.stop_point("applied");
        tx.execute(MARK, &[&charge.id, &token]).await.map_err(sql)?;
        self.stop_point("marked");
        tx.commit().await.map_err(sql)?;
        self.stop_point("committed");
        Ok(Outcome::Applied)
    }

    /// How often each event was applied (ledger entries per event id).
    pub async fn counts(&self) -> Result<BTreeMap<String, i64>, String> {
        let client = self.connect().await?;
        let rows = client
            .query(
                "SELECT event_id, count(*) FROM ledger_entries GROUP BY event_id",
                &[],
            )
            .await
            .map_err(|e| format!("database error: {e}"))?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }
}
