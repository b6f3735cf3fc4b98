//! A webhook receiver that applies every event exactly once, however often
//! and however concurrently the sender delivers it.
//!
//! ```text
//! cargo run --example webhook                                       # in-memory store
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --example webhook     # Redis
//! ```
//!
//! Then, in another terminal, sign and send a Stripe-style event twice:
//!
//! ```text
//! body='{"id":"evt_1","type":"payment_intent.succeeded"}'
//! t=$(date +%s)
//! sig=$(printf '%s.%s' "$t" "$body" | openssl dgst -sha256 -hmac whsec_demo -r | cut -d' ' -f1)
//! curl -i localhost:3000/webhooks/stripe -H "Stripe-Signature: t=$t,v1=$sig" -d "$body"
//! curl -i localhost:3000/webhooks/stripe -H "Stripe-Signature: t=$t,v1=$sig" -d "$body"
//! curl -s localhost:3000/ledger                                # {"evt_1":1}
//! ```
//!
//! The second answer is the first one replayed (`idempotent-replayed: true`);
//! sent while the first still runs, it gets `409` and Stripe retries later.
//!
//! Routes:
//!
//! * `POST /webhooks/stripe` checks `Stripe-Signature: t=<unix secs>,v1=<hex
//!   HMAC-SHA256 of "<t>.<raw body>">` (5-minute tolerance) *before* any
//!   lock: a bad, missing or expired signature gets `400`
//!   `application/problem+json` and touches no Redis key. The event is then
//!   locked and deduplicated on its JSON `id` (namespace `stripe`): a
//!   duplicate in flight gets `409`, a completed one its stored answer.
//! * `POST /webhooks/github` checks `X-Hub-Signature-256: sha256=<hex
//!   HMAC-SHA256 of the raw body>` the same way (and wants one
//!   `X-GitHub-Delivery` header), then locks and deduplicates on the
//!   SHA-256 digest of the body ([`KeyFrom::body_digest`], namespace
//!   `github`). GitHub signs the body and nothing else: the delivery id is
//!   unsigned, and anyone who captured a delivery can send it again under
//!   fresh delivery ids. Keyed on the body, such a replay is the same
//!   delivery: it gets the stored answer (or waits for the first) and
//!   applies nothing. The delivery id is kept as information, in the logs,
//!   the ledger entry and the answer. GitHub does not retry by itself, so a
//!   duplicate that arrives while the first runs *waits* (up to 10 s) and
//!   gets the first one's answer replayed.
//! * `POST /webhooks/github/jobs` is the GitHub route for work that takes
//!   longer than GitHub waits for an answer (10 s): checked and locked the
//!   same way (namespace `github-jobs`), it answers `202 Accepted
//!   {"accepted": true, "id": ...}` at once and hands the lock to a task
//!   ([`HandOff`](tower_redis_lock::HandOff)) that does the work under
//!   it, renewed. The task's answer (`200 {"received": true, ...}`) is
//!   stored with the release, as the record later deliveries get; a
//!   duplicate meanwhile waits for it (then `409`). Work that fails
//!   releases the lock, so that a redelivery runs it again.
//! * `GET /ledger` answers `{"<event id>": <times applied>, ...}`.
//!
//! Applying an event means counting it in the ledger, with the lock's
//! fencing token: in Redis (`ledger:{webhooks}:<id>`, a
//! [`FencedResource`]) with `REDIS_URL`, in memory otherwise. A holder whose
//! lock was taken over (paused past its lease) is refused by the ledger
//! instead of counting twice. Each handler works `WORK_MS` first, then
//! applies and answers `200 {"received": true, "id": ...}`.
//!
//! What the lock and the record cannot cover:
//!
//! * The ledger write and the stored answer are two steps. A crash between
//!   them (after the count, before the record), or the request timeout
//!   striking there, lets the next delivery count again. Where that
//!   matters, make the effect itself idempotent as well (a unique
//!   constraint on the event id in the same transaction as the effect):
//!   `examples/webhook_pg/` does that on PostgreSQL.
//! * GitHub signs no timestamp: a captured delivery replayed *after* its
//!   record expired (`RETENTION`, three days) is applied again, and nothing
//!   in the request can tell it from a new one. Stripe's signed timestamp
//!   (5-minute tolerance) closes that door for Stripe.
//! * Two genuinely different GitHub deliveries whose bodies are byte for
//!   byte the same count as one (the second gets the first's answer).
//!   GitHub's payloads name the repository, the hook and the commit or
//!   object they report, so two distinct events rarely share every byte.
//!
//! Slow clients are cut off (see [`DEFAULT_TIMEOUTS`]): a head not sent
//! whole within `HEADER_TIMEOUT_MS` closes the connection, a body that stops
//! short of its `Content-Length` gets `408` after `BODY_TIMEOUT_MS`, and a
//! declared `Content-Length` over [`MAX_BODY`] gets `413` before a byte of
//! the body is read.
//!
//! Environment:
//!
//! | variable         | default      | meaning                                        |
//! |------------------|--------------|------------------------------------------------|
//! | `PORT`           | 3000         | port on 127.0.0.1 (0 picks a free one)         |
//! | `REDIS_URL`      | unset        | locks, records and ledger in Redis; unset: in memory |
//! | `WEBHOOK_SECRET` | `whsec_demo` | signing secret (the demo uses one for both providers) |
//! | `WORK_MS`        | 200          | how long a delivery works before it applies    |
//! | `HEADER_TIMEOUT_MS`  | 10000    | a request head must arrive whole within this, or the connection is closed |
//! | `BODY_TIMEOUT_MS`    | 10000    | a body must arrive whole within this after the head, or `408` |
//! | `REQUEST_TIMEOUT_MS` | 30000    | answer within this, or the delivery is dropped (lock released, nothing stored) and the sender gets `408` |
//! | `RUST_LOG`       | info         | log filter (`tracing_subscriber::EnvFilter`)   |
//!
//! A bad value is reported with the variable's name and exits with code 2.

#[path = "../common/mod.rs"]
mod common;

mod app;
mod ledger;
mod settings;
mod signature;
mod verify;

use std::future::Future;
use std::process::ExitCode;
use std::time::Duration;

use axum::Router;

#[allow(unused_imports)]
pub use self::{
    app::{BeforeApply, Options, app},
    common::Timeouts,
    ledger::{Applied, Ledger},
    settings::Settings,
    signature::{sign, sign_github, unix_now, verify_github, verify_stripe},
};
use common::Failure;

/// Default signing secret.
pub const DEFAULT_SECRET: &str = "whsec_demo";
/// How far a `Stripe-Signature` timestamp may be from now.
pub const TOLERANCE: Duration = Duration::from_secs(300);
/// Default work per delivery.
pub const DEFAULT_WORK: Duration = Duration::from_millis(200);
/// How long a duplicate GitHub delivery waits for the first one.
pub const GITHUB_WAIT: Duration = Duration::from_secs(10);
/// How long completed deliveries are remembered (Stripe retries for up to
/// three days).
pub const RETENTION: Duration = Duration::from_secs(3 * 24 * 3600);
/// Largest webhook body read.
pub const MAX_BODY: usize = 1 << 20;
/// Redis key prefix of the ledger entries.
pub const LEDGER_PREFIX: &str = "ledger:{webhooks}:";
/// Namespace of the Stripe event locks.
pub const STRIPE_NAMESPACE: &str = "stripe";
/// Namespace of the GitHub delivery locks.
pub const GITHUB_NAMESPACE: &str = "github";
/// Namespace of the GitHub job locks (deliveries whose work is handed off).
pub const GITHUB_JOBS_NAMESPACE: &str = "github-jobs";
/// Time limits when the environment sets none. The request timeout leaves
/// a waiting GitHub duplicate ([`GITHUB_WAIT`]) and the work time to end.
pub const DEFAULT_TIMEOUTS: Timeouts = Timeouts {
    header: Duration::from_secs(10),
    body: Duration::from_secs(10),
    request: Duration::from_secs(30),
};

#[tokio::main]
async fn main() -> ExitCode {
    common::main("webhook", run).await
}

async fn run() -> Result<(), Failure> {
    let settings =
        Settings::from_lookup(|name| std::env::var(name).ok()).map_err(Failure::Usage)?;
    let (store, described) = common::store(settings.redis_url.as_deref())?;
    let ledger = match &settings.redis_url {
        Some(url) => {
            let ledger = Ledger::redis(url).map_err(Failure::Usage)?;
            println!("store: {described} (locks, records and ledger)");
            ledger
        }
        None => {
            println!("store: {described}");
            Ledger::memory()
        }
    };
    let router = app(store, ledger, settings.options())
        .map_err(|e| Failure::Usage(format!("settings are not valid: {e}")))?;
    let t = settings.timeouts;
    common::listen(settings.port, router, t, |local| {
        println!("work {} ms; {t}", settings.work.as_millis());
        println!("listening on http://{local}");
        println!(
            "routes: POST /webhooks/stripe, POST /webhooks/github, POST /webhooks/github/jobs, GET /ledger"
        );
    })
    .await
}

/// Serves `router` (an [`app`]) on `listener` within `timeouts` until
/// `shutdown` completes.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    timeouts: Timeouts,
    shutdown: impl Future<Output = ()>,
) {
    common::serve(listener, router, timeouts, shutdown).await;
}
