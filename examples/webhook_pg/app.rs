//! The receiver's routes: signature check, lock layer (idempotent) and the
//! handler that applies a charge in one database transaction.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use tower_redis_lock::{
    ConfigError, Idempotency, KeyFrom, LockGuard, LockLayer, LockStore, Locker,
};

pub(super) use super::common::{problem, unavailable};
use super::db::{Charge, Db, Outcome};
use super::verify::{Scheme, Verifier, verify_signature};
use super::{MAX_BODY, NAMESPACE, RETENTION, TOLERANCE};

struct AppState {
    db: Db,
}

/// The receiver's routes over `store` (locks and records) and `db`.
pub fn app<St: LockStore + Clone>(
    store: St,
    db: Db,
    secret: &str,
    lease: Duration,
) -> Result<Router, ConfigError> {
    let lock = LockLayer::builder(
        Locker::builder(store).lease(lease).build()?,
        KeyFrom::json_pointer::<String>("/id"),
    )
    .namespace(NAMESPACE)
    .body_limit(MAX_BODY)
    .idempotent(Idempotency::new().retention(RETENTION))
    .build()?;
    let verifier = middleware::from_fn_with_state(
        Arc::new(Verifier {
            secret: secret.to_owned(),
            tolerance: TOLERANCE,
            scheme: Scheme::Stripe,
        }),
        verify_signature,
    );
    Ok(Router::new()
        .route(
            "/webhooks/stripe",
            post(stripe).route_layer(lock).route_layer(verifier),
        )
        .route("/ledger", get(show_ledger))
        .with_state(Arc::new(AppState { db })))
}

/// `{"id": .., "data": {"object": {"customer": .., "amount": ..}}}`.
fn parse(body: &[u8]) -> Option<Charge> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let object = v.pointer("/data/object")?;
    Some(Charge {
        id: v.get("id")?.as_str()?.to_owned(),
        customer: object.get("customer")?.as_str()?.to_owned(),
        amount: object.get("amount")?.as_i64()?,
    })
}

async fn stripe(State(app): State<Arc<AppState>>, guard: LockGuard, body: Bytes) -> Response {
    let Some(charge) = parse(&body) else {
        return problem(
            StatusCode::UNPROCESSABLE_ENTITY,
            "expected a string `id` and `data.object` with a string `customer` and an \
             integer `amount`",
        );
    };
    // The example's stores are fenced (the default): a token is what makes
    // the late writer's transaction refuse.
    let token = guard.fencing_token().expect("a fenced store");
    tracing::info!(
        id = charge.id,
        fencing_token = token.get(),
        "delivery started"
    );
    app.db.stop_point("locked");
    match app.db.apply(&charge, token).await {
        Ok(outcome @ (Outcome::Applied | Outcome::AlreadyProcessed)) => {
            let applied = outcome == Outcome::Applied;
            tracing::info!(
                id = charge.id,
                fencing_token = token.get(),
                applied,
                "event done"
            );
            Json(serde_json::json!({ "received": true, "id": charge.id, "applied": applied }))
                .into_response()
        }
        Ok(Outcome::Stale { seen }) => {
            // Our lock was taken over and the new holder has written: not
            // stored (409), so a retry gets the new holder's answer.
            tracing::warn!(
                id = charge.id,
                fencing_token = token.get(),
                seen,
                "stale delivery refused by the fencing token"
            );
            problem(
                StatusCode::CONFLICT,
                "a newer delivery of this event has written; this one wrote nothing",
            )
        }
        Err(e) => {
            tracing::error!(id = charge.id, error = %e, "database unavailable");
            unavailable("the database is unavailable")
        }
    }
}

async fn show_ledger(State(app): State<Arc<AppState>>) -> Response {
    match app.db.counts().await {
        Ok(counts) => Json(counts).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "database unavailable");
            problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "the database is unavailable",
            )
        }
    }
}
