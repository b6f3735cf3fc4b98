//! Hostile-review findings on `HandOff` in the layer, written to fail on
//! the code they were found in.
//!
//! Two idempotent lock layers nested on one route (a client's operation id
//! outside, a delivery id inside): the handler hands the inner lock off
//! and answers `202`; the outer layer, which knows nothing of it, stores
//! that `202` as its key's final record. When the work then fails and
//! releases (so that a retry runs it again), a retry with the same ids is
//! answered the stored `202` for as long as the record is kept, and the
//! work never runs again: accepted, lost, and nobody told.

use crate::support;

use support::eventually;
use support::http::send;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::routing::post;
use http::{HeaderName, Request, StatusCode};
use tower_redis_lock::{
    HandOff, Idempotency, KeyFrom, LockKey, LockLayer, LockStore, Locker, MemoryStore,
};

const LIMIT: Duration = Duration::from_secs(10);
const OPERATION: HeaderName = HeaderName::from_static("x-operation");
const DELIVERY: HeaderName = HeaderName::from_static("x-delivery");

/// Hands the work off; the work fails, and releases so that a retry runs.
async fn failing_job(State(runs): State<Arc<AtomicU64>>, handoff: HandOff) -> StatusCode {
    runs.fetch_add(1, Ordering::SeqCst);
    tokio::spawn(async move {
        assert!(handoff.release().await.unwrap());
    });
    StatusCode::ACCEPTED
}

#[tokio::test]
async fn nested_idempotent_layers_let_a_retry_run_work_that_failed_after_a_hand_off() {
    let store = MemoryStore::new();
    let locker = Locker::new(store.clone());
    let layer = |ns: &str, key: HeaderName| {
        LockLayer::builder(locker.clone(), KeyFrom::header(key))
            .namespace(ns)
            .idempotent(Idempotency::new())
            .build()
            .unwrap()
    };
    let runs = Arc::new(AtomicU64::new(0));
    let router = Router::new()
        .route(
            "/jobs",
            post(failing_job)
                .route_layer(layer("inner", DELIVERY))
                .route_layer(layer("outer", OPERATION)),
        )
        .with_state(runs.clone());
    let req = || {
        Request::post("/jobs")
            .header(OPERATION, "op-1")
            .header(DELIVERY, "d-1")
            .body(Body::empty())
            .unwrap()
    };
    assert_eq!(send(&router, req()).await.status, StatusCode::ACCEPTED);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // The work failed and released its lock: a retry may run it.
    let inner = LockKey::new("inner", "d-1").unwrap();
    assert!(eventually(LIMIT, async || !store.is_locked(&inner)).await);

    let retry = send(&router, req()).await;
    let outer_record = store
        .read_record(&LockKey::new("outer", "op-1").unwrap())
        .await
        .unwrap()
        .is_some();
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the retry of work that failed after its hand-off did not run: answered {} \
         (a record under the outer key: {outer_record})",
        retry.status
    );
}

/// "Every field checked": an exported hand-off read back holds its record
/// settings to the bounds `Idempotency` enforces (retention 1 s ..= 365
/// days, a stored body of at most 64 MiB), and its fencing header to a
/// name a record may keep. A damaged or forged job now gets a record kept
/// 0 ms or for centuries, a body limit of 1 TiB, or a `content-length`
/// header with the fencing token stored into every replay.
#[tokio::test]
async fn an_exported_hand_off_reads_back_only_with_the_settings_a_layer_allows() {
    let locker = Locker::new(MemoryStore::new());
    let lease = locker
        .acquire(&LockKey::new("wire", "1").unwrap())
        .await
        .unwrap()
        .export()
        .unwrap();
    let job = |record: serde_json::Value| serde_json::json!({ "lease": serde_json::to_value(&lease).unwrap(), "record": record });
    let good = serde_json::json!({
        "fingerprint": null,
        "retention_ms": 86_400_000u64,
        "max_body": 65_536,
        "headers": ["location"],
        "fencing_header": "fencing-token",
    });
    assert!(serde_json::from_value::<tower_redis_lock::ExportedHandOff>(job(good.clone())).is_ok());
    for (field, bad) in [
        ("retention_ms", serde_json::json!(0)),
        ("retention_ms", serde_json::json!(400u64 * 86_400_000)),
        ("max_body", serde_json::json!(1u64 << 40)),
        ("fencing_header", serde_json::json!("content-length")),
    ] {
        let mut r = good.clone();
        r[field] = bad.clone();
        assert!(
            serde_json::from_value::<tower_redis_lock::ExportedHandOff>(job(r)).is_err(),
            "an exported hand-off with {field} = {bad} read back"
        );
    }
}
