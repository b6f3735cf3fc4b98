//! A small HTTP server with one locked route: try the layer by hand.
//!
//! ```text
//! cargo run --example demo                                       # in-memory store
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --example demo     # Redis
//! ```
//!
//! Then, in another terminal:
//!
//! ```text
//! curl -i -X POST 'localhost:3000/jobs/42?work_ms=5000' &     # 200 after 5 s
//! curl -i -X POST 'localhost:3000/jobs/42'                    # 409 + Retry-After
//! curl -i localhost:3000/healthz                               # 200, never locked
//! for i in 1 2 3; do curl -si -X POST 'localhost:3000/tenants/acme/export?work_ms=5000' & done
//!                                    # two 200s after 5 s, one 429 + Retry-After
//! curl -i -X POST 'localhost:3000/transfers?work_ms=5000' -H 'content-type: application/json' \
//!      -d '{"from":"A-1","to":"B-7","cents":500}' &            # 200 after 5 s
//! curl -i -X POST localhost:3000/transfers -H 'content-type: application/json' \
//!      -d '{"from":"B-7","to":"A-1","cents":100}'              # 409 + Retry-After
//! curl -si 'localhost:3000/docs/readme?work_ms=5000' &         # reads run side by side:
//! curl -si 'localhost:3000/docs/readme?work_ms=5000' &         # two 200s after 5 s
//! curl -si -X PUT 'localhost:3000/docs/readme'                 # 409 + Retry-After
//! ```
//!
//! Routes:
//!
//! * `POST /jobs/{id}?work_ms=N` runs under a lock on `{id}`: it sleeps N ms
//!   (default 100, at most 60000) and answers `{"id": "...",
//!   "fencing_token": N}` with the same token in the `fencing-token`
//!   header. A second request for the same id while the first runs gets the
//!   layer's `409` `application/problem+json` answer with `Retry-After`.
//! * `POST /tenants/{tenant}/export?work_ms=N` is limited to
//!   [`EXPORTS_PER_TENANT`] (2) at once per tenant, across every instance
//!   on the same store (a permit of the tenant's semaphore instead of a
//!   lock): it answers `{"id": "<tenant>", "fencing_token": N}` like a job;
//!   a third export of the same tenant while two run gets `429`
//!   `application/problem+json` with `Retry-After`.
//! * `POST /transfers?work_ms=N` with a JSON body `{"from": "...", "to":
//!   "...", "cents": N}` runs under the locks of both accounts at once
//!   ([`MultiLockLayer`](tower_redis_lock::MultiLockLayer), namespace
//!   [`ACCOUNTS`]): it answers `{"from": ..., "to": ..., "fencing_tokens":
//!   [..]}` with one `fencing-token` header value per account, in key
//!   order. A transfer touching either account while it runs, in either
//!   direction, gets `409` `application/problem+json` with `Retry-After`.
//! * `GET /docs/{doc}?work_ms=N` and `PUT /docs/{doc}?work_ms=N` take the
//!   document's reader-writer lock: reads (GET) share it and run side by
//!   side, a write (PUT) runs alone and goes before reads that arrive while
//!   it waits. Each answers like a job; a write while reads run (or a read
//!   while a write runs) gets `409` with `Retry-After`. A read's token is
//!   the epoch of the last write.
//! * `GET /healthz` answers `200 ok`, outside the lock layer.
//!
//! Environment:
//!
//! | variable        | default | meaning                                           |
//! |-----------------|---------|---------------------------------------------------|
//! | `PORT`          | 3000    | port on 127.0.0.1 (0 picks a free one)            |
//! | `REDIS_URL`     | unset   | use Redis at this URL; unset: in-memory store     |
//! | `LOCK_LEASE_MS` | 30000   | lease, renewed every lease/3 while a job runs     |
//! | `LOCK_WAIT_MS`  | 0       | how long a request waits for a held lock (0: 409 at once) |
//! | `HEADER_TIMEOUT_MS`  | 10000 | a request head must arrive whole within this, or the connection is closed |
//! | `BODY_TIMEOUT_MS`    | 10000 | a request body must arrive whole within this after the head |
//! | `REQUEST_TIMEOUT_MS` | 75000 | answer within this, or the job is dropped (its lock released) and the client gets `408` |
//! | `RUST_LOG`      | info    | log filter (`tracing_subscriber::EnvFilter`)      |
//!
//! A bad value is reported with the variable's name and exits with code 2.
//!
//! The server closes a connection whose client is slow or silent (see
//! [`DEFAULT_TIMEOUTS`]): a head trickled a byte at a time is cut off after
//! `HEADER_TIMEOUT_MS`, as is an idle kept-alive connection. The default
//! request timeout leaves the longest job (60 s) the time to finish; a
//! shorter `REQUEST_TIMEOUT_MS` cuts longer jobs off with `408`.

#[path = "common/mod.rs"]
mod common;

pub use common::Timeouts;
use common::{Env, Failure};
use std::collections::HashMap;
use std::future::Future;
use std::process::ExitCode;
use std::time::Duration;

use axum::extract::{Path, Query};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use tower_redis_lock::{
    KeyFrom, LockGuard, LockLayer, LockStore, Locker, MultiGuard, MultiLockLayer,
};

/// Default `work_ms` of a job.
pub const DEFAULT_WORK: Duration = Duration::from_millis(100);
/// Largest `work_ms` a job accepts; larger values are capped.
pub const MAX_WORK: Duration = Duration::from_secs(60);
/// Namespace of the job locks.
pub const NAMESPACE: &str = "jobs";
/// Namespace of the export permits.
pub const EXPORTS: &str = "exports";
/// Namespace of the documents' reader-writer locks.
pub const DOCS: &str = "docs";
/// Exports that may run at once per tenant.
pub const EXPORTS_PER_TENANT: u32 = 2;
/// Namespace of the account locks a transfer takes.
pub const ACCOUNTS: &str = "accounts";
/// Time limits when the environment sets none. The request timeout leaves
/// the longest job ([`MAX_WORK`]) room to finish.
pub const DEFAULT_TIMEOUTS: Timeouts = Timeouts {
    header: Duration::from_secs(10),
    body: Duration::from_secs(10),
    request: Duration::from_secs(75),
};

/// The demo's routes around `locker`: `POST /jobs/{id}` under the lock
/// layer, `POST /tenants/{tenant}/export` under a concurrency limit,
/// `GET` and `PUT /docs/{doc}` under a reader-writer lock, `GET /healthz`
/// outside them.
pub fn app<St: LockStore>(locker: Locker<St>) -> Router {
    let exports = LockLayer::builder(locker.clone(), KeyFrom::path_param::<String>("tenant"))
        .namespace(EXPORTS)
        .concurrency_limit(EXPORTS_PER_TENANT)
        .build()
        .expect("the demo's export limit settings are valid");
    let accounts = MultiLockLayer::builder(
        locker.clone(),
        [
            KeyFrom::json_pointer::<String>("/from"),
            KeyFrom::json_pointer::<String>("/to"),
        ],
    )
    .namespace(ACCOUNTS)
    .build()
    .expect("the demo's transfer lock settings are valid");
    let docs = LockLayer::builder(locker.clone(), KeyFrom::path_param::<String>("doc"))
        .namespace(DOCS)
        .read_write()
        .build()
        .expect("the demo's reader-writer settings are valid");
    let layer = LockLayer::builder(locker, KeyFrom::path_param::<String>("id"))
        .namespace(NAMESPACE)
        .build()
        // The settings above are constants; a failure here is a bug in the
        // demo, found on the first start, never on a request.
        .expect("the demo's lock layer settings are valid");
    // `route_layer` on the method router wraps only the `POST` handler:
    // a `GET /jobs/{id}` (405), an unknown path (404) and `/healthz` never
    // take a lock. (`Router::layer` would also wrap the 404 fallback, which
    // has no `{id}` and would answer 400; `MethodRouter::layer` and
    // `Router::route_layer` would lock on the 405 answer.)
    Router::new()
        .route("/jobs/{id}", post(run_job).route_layer(layer))
        .route(
            "/tenants/{tenant}/export",
            post(run_job).route_layer(exports),
        )
        .route("/transfers", post(transfer).route_layer(accounts))
        .route("/docs/{doc}", get(run_job).put(run_job).route_layer(docs))
        .route("/healthz", get(healthz))
}

/// A transfer's body.
#[derive(serde::Deserialize)]
struct Transfer {
    from: String,
    to: String,
    cents: u64,
}

/// Runs under the locks of both accounts (the layer took them as one).
async fn transfer(
    Query(query): Query<HashMap<String, String>>,
    Extension(accounts): Extension<MultiGuard>,
    Json(t): Json<Transfer>,
) -> Response {
    let Some(work) = work_ms(&query) else {
        return bad_work_ms();
    };
    let tokens: Vec<u64> = accounts
        .fencing_tokens()
        .into_iter()
        .filter_map(|t| t.ok().map(|t| t.get()))
        .collect();
    tracing::info!(from = %t.from, to = %t.to, cents = t.cents, ?tokens, "transfer started");
    tokio::time::sleep(work).await;
    // The layer adds one `fencing-token` header per account and releases both.
    Json(serde_json::json!({ "from": t.from, "to": t.to, "fencing_tokens": tokens }))
        .into_response()
}

/// Runs under the lock the layer took for `{id}` (or, as an export, under
/// one of the tenant's permits; for a document, a read or the write of its
/// reader-writer lock).
async fn run_job(
    Path(id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    guard: LockGuard,
) -> Response {
    let Some(work) = work_ms(&query) else {
        return bad_work_ms();
    };
    let token = guard.fencing_token().unwrap();
    tracing::info!(%id, fencing_token = token.get(), work_ms = work.as_millis() as u64, "job started");
    tokio::time::sleep(work).await;
    tracing::info!(%id, fencing_token = token.get(), still_held = guard.is_held(), "job finished");
    // The layer adds the `fencing-token` header and releases the lock.
    Json(serde_json::json!({ "id": id, "fencing_token": token.get() })).into_response()
}

/// The `work_ms` of a request (default [`DEFAULT_WORK`], capped at
/// [`MAX_WORK`]), or `None` for one that is not a number.
fn work_ms(query: &HashMap<String, String>) -> Option<Duration> {
    match query.get("work_ms").map(|v| v.parse::<u64>()) {
        None => Some(DEFAULT_WORK),
        Some(Ok(ms)) => Some(Duration::from_millis(ms).min(MAX_WORK)),
        Some(Err(_)) => None,
    }
}

/// The answer to a `work_ms` that is not a number.
fn bad_work_ms() -> Response {
    (
        StatusCode::BAD_REQUEST,
        "work_ms must be a whole number of milliseconds\n",
    )
        .into_response()
}

async fn healthz() -> &'static str {
    "ok\n"
}

/// The demo's settings, read from the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Port on 127.0.0.1.
    pub port: u16,
    /// Redis URL, if any.
    pub redis_url: Option<String>,
    /// Lock lease.
    pub lease: Duration,
    /// Wait timeout for a held lock.
    pub wait: Duration,
    /// How long a client may take.
    pub timeouts: Timeouts,
}

impl Settings {
    /// Reads the settings through `var` (the process environment in
    /// `main`). An unset or empty variable takes its default.
    pub fn from_lookup(var: impl Fn(&str) -> Option<String>) -> Result<Settings, String> {
        let env = Env(&var);
        Ok(Settings {
            port: env.port()?,
            redis_url: env.get("REDIS_URL"),
            lease: env.millis("LOCK_LEASE_MS", Duration::from_secs(30))?,
            wait: env.millis("LOCK_WAIT_MS", Duration::ZERO)?,
            timeouts: Timeouts::from_lookup(&var, DEFAULT_TIMEOUTS)?,
        })
    }

    /// A locker over `store` with this lease and wait timeout.
    pub fn locker<St: LockStore>(&self, store: St) -> Result<Locker<St>, String> {
        Locker::builder(store)
            .lease(self.lease)
            .wait_timeout(self.wait)
            .build()
            .map_err(|e| match e.setting() {
                "lease" => format!("LOCK_LEASE_MS={} is not valid: {e}", self.lease.as_millis()),
                _ => format!("lock settings are not valid: {e}"),
            })
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    common::main("demo", run).await
}

async fn run() -> Result<(), Failure> {
    let settings =
        Settings::from_lookup(|name| std::env::var(name).ok()).map_err(Failure::Usage)?;
    let (store, described) = common::store(settings.redis_url.as_deref())?;
    let locker = settings.locker(store).map_err(Failure::Usage)?;
    println!("store: {described}");
    let banner = |local| {
        println!(
            "lease {} ms, wait {} ms; {}",
            locker.lease().as_millis(),
            locker.wait_timeout().as_millis(),
            settings.timeouts,
        );
        println!("listening on http://{local}");
        println!("try: curl -i -X POST 'http://{local}/jobs/42?work_ms=5000'");
    };
    common::listen(
        settings.port,
        app(locker.clone()),
        settings.timeouts,
        banner,
    )
    .await
}

/// Serves the demo's [`app`] on `listener` within `timeouts` until
/// `shutdown` completes.
pub async fn serve<St: LockStore>(
    listener: tokio::net::TcpListener,
    locker: Locker<St>,
    timeouts: Timeouts,
    shutdown: impl Future<Output = ()>,
) {
    common::serve(listener, app(locker), timeouts, shutdown).await;
}
