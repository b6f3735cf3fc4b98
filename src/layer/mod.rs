//! The HTTP layer: a lock per request, before the handler runs.
//!
//! ```
//! use std::time::Duration;
//! use axum::{Router, routing::post};
//! use tower_redis_lock::{KeyFrom, LockGuard, LockLayer, Locker, MemoryStore};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! async fn rebalance(guard: LockGuard) -> String {
//!     format!("fencing token {}", guard.fencing_token().unwrap())
//! }
//!
//! let locker = Locker::builder(MemoryStore::new())
//!     .lease(Duration::from_secs(10))
//!     .wait_timeout(Duration::from_millis(500))
//!     .build()?;
//! let app: Router = Router::new().route(
//!     "/accounts/{id}/rebalance",
//!     post(rebalance).route_layer(
//!         LockLayer::builder(locker, KeyFrom::path_param::<u64>("id"))
//!             .namespace("accounts")
//!             .contention_status(http::StatusCode::LOCKED)
//!             .build()?,
//!     ),
//! );
//! # Ok(())
//! # }
//! ```

mod body;
mod config;
mod extract;
mod future;
pub(crate) mod idempotency;
mod key;
#[allow(clippy::module_inception)]
mod layer;
mod problem;
mod replay;
mod service;

pub use body::ResponseBody;
pub use config::{FENCING_TOKEN, OnLockLost, OnMissingKey, OnStoreError};
pub use extract::{MissingFencingToken, MissingLockGuard};
pub use future::ResponseFuture;
pub use idempotency::{Fingerprint, IDEMPOTENT_REPLAYED, Idempotency, MAX_RETENTION};
pub use key::KeyFrom;
pub use layer::{LockLayer, LockLayerBuilder};
pub use problem::{PROBLEM_JSON, Problem};
pub use service::Lock;
