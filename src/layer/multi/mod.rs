//! [`MultiLockLayer`]: several keys from one request, locked as one
//! (all or nothing, [`Locker::acquire_all`](crate::Locker::acquire_all)).
//!
//! ```
//! use axum::{Extension, Json, Router, body::Body, routing::post};
//! use http::Request;
//! use serde::Deserialize;
//! use tower::ServiceExt;
//! use tower_redis_lock::{KeyFrom, Locker, MemoryStore, MultiGuard, MultiLockLayer};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! #[derive(Deserialize)]
//! struct Transfer {
//!     from: String,
//!     to: String,
//! }
//!
//! async fn transfer(Extension(both): Extension<MultiGuard>, Json(t): Json<Transfer>) -> String {
//!     format!("{} -> {} under {} locks", t.from, t.to, both.len())
//! }
//!
//! let layer = MultiLockLayer::builder(
//!     Locker::new(MemoryStore::new()),
//!     [KeyFrom::json_pointer::<String>("/from"), KeyFrom::json_pointer::<String>("/to")],
//! )
//! .namespace("accounts")
//! .build()?;
//! let app = Router::new().route("/transfers", post(transfer).route_layer(layer));
//! let res = app
//!     .oneshot(
//!         Request::post("/transfers")
//!             .header("content-type", "application/json")
//!             .body(Body::from(r#"{"from":"A-1","to":"B-7","cents":500}"#))?,
//!     )
//!     .await?;
//! assert_eq!(res.status(), 200);
//! // One fencing token per key, in key order (accounts:A-1, then accounts:B-7).
//! assert_eq!(res.headers().get_all("fencing-token").iter().count(), 2);
//! # Ok(())
//! # }
//! ```

mod config;
#[allow(clippy::module_inception)]
pub(crate) mod layer;
pub(crate) mod service;
