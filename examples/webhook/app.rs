//! The receiver's routes: signature check, lock layer (idempotent) and
//! the handlers that apply an event to the ledger.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use tower_redis_lock::{
    ConfigError, HandOff, Idempotency, KeyFrom, LockGuard, LockLayer, LockStore, Locker,
};

use super::ledger::{Applied, Ledger};
use super::verify::{GITHUB_DELIVERY, Scheme, Verifier, header_str, verify_signature};
use super::{
    DEFAULT_SECRET, DEFAULT_WORK, GITHUB_JOBS_NAMESPACE, GITHUB_NAMESPACE, GITHUB_WAIT, MAX_BODY,
    RETENTION, STRIPE_NAMESPACE, TOLERANCE,
};

/// A hook run by each delivery under its lock, before it works and applies
/// (tests use it to hold a delivery, fail it or panic in it). `Err` answers
/// 500, so the sender retries.
pub type BeforeApply =
    Arc<dyn Fn(&str) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync>;

/// Settings of [`app`].
#[derive(Clone)]
pub struct Options {
    /// Signing secret of both providers.
    pub secret: String,
    /// Allowed distance of a Stripe signature timestamp from now.
    pub tolerance: Duration,
    /// Work per delivery before it applies.
    pub work: Duration,
    /// Lock lease (renewed while a delivery runs).
    pub lease: Duration,
    /// How long a duplicate GitHub delivery waits for the first.
    pub github_wait: Duration,
    /// How long completed deliveries are remembered (at least 1 s).
    pub retention: Duration,
    /// Run by each delivery before it works (none by default).
    pub before_apply: Option<BeforeApply>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            secret: DEFAULT_SECRET.to_owned(),
            tolerance: TOLERANCE,
            work: DEFAULT_WORK,
            lease: Duration::from_secs(30),
            github_wait: GITHUB_WAIT,
            retention: RETENTION,
            before_apply: None,
        }
    }
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("tolerance", &self.tolerance)
            .field("work", &self.work)
            .field("lease", &self.lease)
            .field("github_wait", &self.github_wait)
            .field("retention", &self.retention)
            .field("before_apply", &self.before_apply.is_some())
            .finish_non_exhaustive()
    }
}

struct AppState {
    ledger: Ledger,
    work: Duration,
    before_apply: Option<BeforeApply>,
}

/// The receiver's routes over `store` (locks and records) and `ledger`.
///
/// Each webhook route is, from the outside in: signature check → lock layer
/// (idempotent) → handler. The signature is checked first so that an
/// unsigned request can neither hold a lock nor leave a record.
pub fn app<St: LockStore + Clone>(
    store: St,
    ledger: Ledger,
    opts: Options,
) -> Result<Router, ConfigError> {
    let remember = Idempotency::new().retention(opts.retention);
    // Stripe retries for days: an in-flight duplicate gets 409 at once.
    let stripe_lock = LockLayer::builder(
        Locker::builder(store.clone()).lease(opts.lease).build()?,
        KeyFrom::json_pointer::<String>("/id"),
    )
    .namespace(STRIPE_NAMESPACE)
    .body_limit(MAX_BODY)
    .idempotent(remember.clone())
    .build()?;
    // GitHub does not retry: an in-flight duplicate waits for the answer.
    // Keyed on the signed body, not on the unsigned delivery id: a captured
    // delivery replayed under new delivery ids is still a duplicate.
    let github_lock = |namespace: &str| -> Result<LockLayer<St>, ConfigError> {
        LockLayer::builder(
            Locker::builder(store.clone())
                .lease(opts.lease)
                .wait_timeout(opts.github_wait)
                .build()?,
            KeyFrom::body_digest(),
        )
        .namespace(namespace)
        .body_limit(MAX_BODY)
        .idempotent(remember.clone())
        .build()
    };
    let verifier = |scheme| {
        middleware::from_fn_with_state(
            Arc::new(Verifier {
                secret: opts.secret.clone(),
                tolerance: opts.tolerance,
                scheme,
            }),
            verify_signature,
        )
    };
    let state = Arc::new(AppState {
        ledger,
        work: opts.work,
        before_apply: opts.before_apply.clone(),
    });
    // Each layer wraps what is already there: the last one added runs first.
    // `route_layer` keeps both off the 405 answer for other methods.
    Ok(Router::new()
        .route(
            "/webhooks/stripe",
            post(stripe)
                .route_layer(stripe_lock)
                .route_layer(verifier(Scheme::Stripe)),
        )
        .route(
            "/webhooks/github",
            post(github)
                .route_layer(github_lock(GITHUB_NAMESPACE)?)
                .route_layer(verifier(Scheme::GitHub)),
        )
        // The same, for work that outlasts GitHub's 10 s: answered 202 at
        // once, the work handed off to a task that keeps the lock.
        .route(
            "/webhooks/github/jobs",
            post(github_job)
                .route_layer(github_lock(GITHUB_JOBS_NAMESPACE)?)
                .route_layer(verifier(Scheme::GitHub)),
        )
        .route("/ledger", get(show_ledger))
        .with_state(state))
}

async fn stripe(State(app): State<Arc<AppState>>, guard: LockGuard, body: Bytes) -> Response {
    // The lock layer found the id already; this cannot fail for a request
    // that got here, but a handler does not rely on that.
    let id = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| match v.get("id") {
            Some(serde_json::Value::String(s)) => Some(s.clone()),
            Some(serde_json::Value::Number(n)) => Some(n.to_string()),
            _ => None,
        });
    match id {
        Some(id) => deliver(&app, "stripe", &id, &guard).await,
        None => problem(StatusCode::BAD_REQUEST, "the event has no `id`"),
    }
}

async fn github(
    State(app): State<Arc<AppState>>,
    guard: LockGuard,
    headers: HeaderMap,
) -> Response {
    // Checked before the lock (`verify_signature`); the lock and the
    // record are the body's, the delivery id names the entry in the ledger.
    match header_str(&headers, &GITHUB_DELIVERY) {
        Some(id) => deliver(&app, "github", id, &guard).await,
        None => problem(StatusCode::BAD_REQUEST, "missing `X-GitHub-Delivery`"),
    }
}

/// A GitHub delivery whose work takes longer than GitHub waits for an
/// answer (10 s): `202 Accepted` at once, and the work handed off to a
/// task that keeps the lock renewed. Its final answer is stored with the
/// release, as if the handler had given it: a duplicate meanwhile waits
/// for it (up to `github_wait`, then 409), a later one gets it replayed.
/// Work that fails releases the lock instead, so that a redelivery runs
/// it again; a task that dies (a panic, the process gone) does the same
/// at once, or when the lease lapses.
async fn github_job(
    State(app): State<Arc<AppState>>,
    handoff: HandOff,
    headers: HeaderMap,
) -> Response {
    let Some(id) = header_str(&headers, &GITHUB_DELIVERY).map(str::to_owned) else {
        // Nothing handed off: dropping the hand-off releases the lock.
        return problem(StatusCode::BAD_REQUEST, "missing `X-GitHub-Delivery`");
    };
    let answer = Json(serde_json::json!({ "accepted": true, "id": id }));
    tokio::spawn(async move {
        let res = deliver(&app, "github-jobs", &id, handoff.guard()).await;
        let ended = if res.status().is_success() {
            handoff.finish(res).await
        } else {
            handoff.release().await
        };
        if let Err(e) = ended {
            tracing::warn!(id, error = %e, "the job's lock could not be ended; it lapses at its lease");
        }
    });
    (StatusCode::ACCEPTED, answer).into_response()
}

/// Works, then applies the event with the lock's fencing token.
async fn deliver(app: &AppState, source: &str, id: &str, guard: &LockGuard) -> Response {
    // The example's stores are fenced (the default).
    let token = guard.fencing_token().expect("a fenced store");
    tracing::info!(
        source,
        id,
        lock_key = %guard.key(),
        fencing_token = token.get(),
        "delivery started"
    );
    if let Some(hook) = &app.before_apply
        && let Err(e) = hook(id).await
    {
        tracing::warn!(source, id, error = %e, "delivery failed; the sender will retry");
        return problem(StatusCode::INTERNAL_SERVER_ERROR, &e);
    }
    if !app.work.is_zero() {
        tokio::time::sleep(app.work).await;
    }
    match app.ledger.apply(id, token).await {
        Ok(Applied::Counted { count }) => {
            tracing::info!(
                source,
                id,
                fencing_token = token.get(),
                count,
                "event applied"
            );
            Json(serde_json::json!({ "received": true, "id": id })).into_response()
        }
        Ok(Applied::Stale { seen }) => {
            // Our lock was taken over and the new holder has written: this
            // attempt must not count. Not stored (409), so a retry gets the
            // new holder's answer.
            tracing::warn!(
                source,
                id,
                fencing_token = token.get(),
                seen,
                "stale delivery refused by the ledger"
            );
            problem(
                StatusCode::CONFLICT,
                "a newer delivery of this event has been applied; this one was not",
            )
        }
        Err(e) => {
            tracing::error!(source, id, error = %e, "ledger unavailable");
            unavailable("the ledger is unavailable")
        }
    }
}

async fn show_ledger(State(app): State<Arc<AppState>>) -> Response {
    match app.ledger.counts().await {
        Ok(counts) => Json(counts).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "ledger unavailable");
            problem(StatusCode::SERVICE_UNAVAILABLE, "the ledger is unavailable")
        }
    }
}

pub(super) use super::common::{problem, unavailable};
