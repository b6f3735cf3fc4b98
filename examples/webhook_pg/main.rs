//! The webhook receiver made crash-safe: the event's effect and its
//! "processed" mark commit in one PostgreSQL transaction, fenced by the
//! lock's token.
//!
//! ```text
//! DATABASE_URL='host=/var/run/postgresql user=postgres' \
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --example webhook_pg
//! ```
//!
//! Then sign and send a Stripe-style charge event (as in
//! `examples/webhook`), twice, and look at the ledger:
//!
//! ```text
//! body='{"id":"evt_1","type":"charge.succeeded","data":{"object":{"customer":"cus_1","amount":500}}}'
//! t=$(date +%s)
//! sig=$(printf '%s.%s' "$t" "$body" | openssl dgst -sha256 -hmac whsec_demo -r | cut -d' ' -f1)
//! curl -i localhost:3000/webhooks/stripe -H "Stripe-Signature: t=$t,v1=$sig" -d "$body"
//! curl -s localhost:3000/ledger                                # {"evt_1":1}
//! ```
//!
//! `examples/webhook` stores its effect and the layer's record in two
//! steps, so a crash between them lets the next delivery apply the event
//! again. Here the handler, under the event's lock, runs one transaction:
//!
//! 1. claim the event's fence row with the lock's fencing token: written
//!    only where `fencing_token <= $token` (the row keeps the highest token
//!    that wrote it); no row written means a newer holder has been there,
//!    and this delivery writes nothing and answers `409`;
//! 2. if the event's "processed" mark exists, commit and answer `200`
//!    (`"applied": false`): an earlier delivery committed and died before
//!    it could answer;
//! 3. else apply the effect (a ledger entry and the customer's balance),
//!    insert the mark, commit, answer `200` (`"applied": true`).
//!
//! A crash anywhere before the commit rolls the whole transaction back; a
//! crash after it leaves the mark, which the next delivery finds. The lock
//! (and the layer's stored answer) keep concurrent and later duplicates
//! away from the database; the transaction makes the effect count once
//! even when the process dies between the commit and the answer, and the
//! token refuses a former holder that was paused past its lease.
//!
//! The fenced row is the event's own: the lock is per event, so its tokens
//! only compare within one event. Rows shared by many events (a customer's
//! balance) are serialised by PostgreSQL's row locks and written only in a
//! transaction that holds the event's fence row.
//!
//! Environment:
//!
//! | variable            | default      | meaning                                        |
//! |---------------------|--------------|------------------------------------------------|
//! | `DATABASE_URL`      | required     | PostgreSQL (`host=… user=… dbname=…` or `postgresql://…`) |
//! | `REDIS_URL`         | unset        | locks and records in Redis; unset: in memory (one process only) |
//! | `PORT`              | 3000         | port on 127.0.0.1 (0 picks a free one)         |
//! | `WEBHOOK_SECRET`    | `whsec_demo` | Stripe signing secret                          |
//! | `LEASE_MS`          | 30000        | lock lease (renewed while a delivery runs)     |
//! | `HEADER_TIMEOUT_MS`, `BODY_TIMEOUT_MS`, `REQUEST_TIMEOUT_MS` | as `examples/webhook` | client time limits |
//! | `WEBHOOK_PG_STOP_AT`| unset        | tests only: SIGSTOP this process at `locked`, `fenced`, `applied`, `marked` or `committed` |
//! | `RUST_LOG`          | info         | log filter                                     |
//!
//! A bad value is reported with the variable's name and exits with code 2.

#[path = "../common/mod.rs"]
mod common;

mod app;
mod db;
#[allow(dead_code)]
#[path = "../webhook/signature.rs"]
mod signature;
#[allow(dead_code)]
#[path = "../webhook/verify.rs"]
mod verify;

use std::process::ExitCode;
use std::time::Duration;

/// The lease when `LEASE_MS` is not set (the locker's own default).
const DEFAULT_LEASE: Duration = Duration::from_secs(30);

#[allow(unused_imports)]
pub use self::{
    app::app,
    common::Timeouts,
    db::{Charge, Db, Outcome, SCHEMA, STOP_POINTS},
    signature::{sign, unix_now},
};
use common::{Env, Failure};

/// Default signing secret.
pub const DEFAULT_SECRET: &str = "whsec_demo";
/// How far a `Stripe-Signature` timestamp may be from now.
pub const TOLERANCE: Duration = Duration::from_secs(300);
/// How long completed deliveries are remembered by the layer (Stripe
/// retries for up to three days). The database mark is kept for ever.
pub const RETENTION: Duration = Duration::from_secs(3 * 24 * 3600);
/// Largest webhook body read.
pub const MAX_BODY: usize = 1 << 20;
/// Namespace of the event locks.
pub const NAMESPACE: &str = "stripe-pg";
/// Time limits when the environment sets none.
pub const DEFAULT_TIMEOUTS: Timeouts = Timeouts {
    header: Duration::from_secs(10),
    body: Duration::from_secs(10),
    request: Duration::from_secs(30),
};

/// Serves until Ctrl-C (the tests run it in a child process).
#[tokio::main]
pub async fn main() -> ExitCode {
    common::main("webhook_pg", run).await
}

/// Reads the environment, opens the database and serves until Ctrl-C.
pub async fn run() -> Result<(), Failure> {
    let var = |name: &str| std::env::var(name).ok();
    let env = Env(&var);
    let database_url = env.get("DATABASE_URL").ok_or_else(|| {
        Failure::Usage("DATABASE_URL is not set: a PostgreSQL connection string".to_owned())
    })?;
    let port = env.port().map_err(Failure::Usage)?;
    let secret = env
        .get("WEBHOOK_SECRET")
        .unwrap_or_else(|| DEFAULT_SECRET.to_owned());
    let lease = env
        .millis("LEASE_MS", DEFAULT_LEASE)
        .map_err(Failure::Usage)?;
    let timeouts = Timeouts::from_lookup(var, DEFAULT_TIMEOUTS).map_err(Failure::Usage)?;
    let stop_at = env.get("WEBHOOK_PG_STOP_AT");
    if let Some(p) = &stop_at
        && !STOP_POINTS.contains(&p.as_str())
    {
        return Err(Failure::Usage(format!(
            "WEBHOOK_PG_STOP_AT={p:?} is not valid: expected one of {STOP_POINTS:?}"
        )));
    }
    let redis_url = env.get("REDIS_URL");
    let (store, described) = common::store(redis_url.as_deref())?;
    let db = Db::open(&database_url, stop_at)
        .await
        .map_err(Failure::Runtime)?;
    let router = app(store, db, &secret, lease)
        .map_err(|e| Failure::Usage(format!("settings are not valid: {e}")))?;
    common::listen(port, router, timeouts, |local| {
        println!("store: {described}; database: PostgreSQL");
        println!("lease {} ms; {timeouts}", lease.as_millis());
        println!("listening on http://{local}");
        println!("routes: POST /webhooks/stripe, GET /ledger");
    })
    .await
}
