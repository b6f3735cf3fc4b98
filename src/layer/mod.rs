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

//!
//! The types an application names (`LockLayer`, `KeyFrom`, `Idempotency`,
//! `HandOff`, the policies, the extractor rejections, `Problem`) are at the crate
//! root. This module holds the rest of the Tower plumbing (the service
//! the layer makes, its future and body) and the header and content-type
//! names, each reachable by this one path:
//!
//! ```compile_fail
//! // `LockLayer` has one path, the crate root's.
//! use tower_redis_lock::layer::LockLayer;
//! ```

mod body;
pub(crate) mod config;
pub(crate) mod extract;
mod future;
pub(crate) mod handoff;
pub(crate) mod idempotency;
pub(crate) mod key;
#[allow(clippy::module_inception)]
pub(crate) mod layer;
pub(crate) mod multi;
pub(crate) mod problem;
mod replay;
mod rwlock;
mod service;

pub use body::ResponseBody;
pub use config::FENCING_TOKEN;
pub use future::ResponseFuture;
pub use idempotency::{IDEMPOTENT_REPLAYED, MAX_RETENTION};
pub use multi::service::MultiLock;
pub use problem::PROBLEM_JSON;
pub use service::Lock;
