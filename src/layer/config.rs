//! The settings of a lock layer, shared by the layer, its builder and the
//! service, and their checks.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::response::Response;
use http::{HeaderName, StatusCode};

use super::idempotency::Idempotency;
use super::key::KeyFrom;
use super::problem::Problem;
use crate::engine::Locker;
use crate::error::ConfigError;
use crate::key::validate_name;
use crate::store::LockStore;

/// Default name of the response header that carries the fencing token.
pub const FENCING_TOKEN: HeaderName = HeaderName::from_static("fencing-token");
/// Longest locker wait timeout a layer accepts (24 h).
const MAX_WAIT: std::time::Duration = std::time::Duration::from_secs(24 * 3600);
/// Default body limit for keys read from the body: 1 MiB.
pub(crate) const DEFAULT_BODY_LIMIT: usize = 1 << 20;

/// What to do when the lock store fails (down, frozen, auth, ACL).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OnStoreError {
    /// Answer 503 with `Retry-After`; the handler does not run (default).
    #[default]
    FailClosed,
    /// Run the handler without a lock (no `LockGuard`, no fencing header).
    /// Only for work that tolerates duplicates.
    FailOpen,
}

/// What to do when the lock is lost while the handler runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OnLockLost {
    /// Let the handler finish; it can watch [`LockGuard::lost`](crate::LockGuard::lost)
    /// itself (default).
    #[default]
    KeepRunning,
    /// Drop the handler's future at once and answer 503 with `Retry-After`,
    /// so the sender retries.
    Abort,
}

/// What to do with a request that has no lock key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OnMissingKey {
    /// Answer 400 (default).
    #[default]
    Reject,
    /// Run the handler without a lock.
    PassThrough,
}

/// A user's answer to a refused request (see
/// [`LockLayerBuilder::on_rejection`]).
pub(crate) type RejectionHook = Arc<dyn Fn(&Problem) -> Response + Send + Sync>;

/// Settings shared by every clone of the service.
pub(crate) struct Config<St> {
    pub(crate) locker: Locker<St>,
    pub(crate) key: KeyFrom,
    pub(crate) namespace: Option<String>,
    pub(crate) contention: StatusCode,
    pub(crate) header: HeaderName,
    pub(crate) body_limit: usize,
    pub(crate) on_store_error: OnStoreError,
    pub(crate) on_lock_lost: OnLockLost,
    pub(crate) on_missing_key: OnMissingKey,
    pub(crate) hold_until_body_end: bool,
    pub(crate) idempotency: Option<Idempotency>,
    pub(crate) expose_lock_key: bool,
    pub(crate) on_rejection: Option<RejectionHook>,
    /// Whether a misplacement of this layer was logged (once per layer).
    pub(crate) misplaced_logged: AtomicBool,
}

impl<St> Config<St> {
    /// Runs `log` the first time this layer finds itself misplaced.
    pub(crate) fn misplaced_once(&self, log: impl FnOnce()) {
        if !self.misplaced_logged.swap(true, Ordering::Relaxed) {
            log();
        }
    }
}

impl<St: LockStore> Config<St> {
    /// The checks of [`LockLayerBuilder::build`](super::LockLayerBuilder::build)
    /// (and of `LockLayer::new`): every bound is refused here, never left
    /// to overflow on the request path.
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        let c = self;
        if let Some(idem) = &c.idempotency {
            idem.check()?;
            if c.namespace.is_none() {
                return Err(ConfigError::new(
                    "namespace",
                    "an idempotent layer needs an explicit namespace: its records outlive \
                 deploys, and the default one (the route template) changes with the route",
                ));
            }
            if c.hold_until_body_end {
                return Err(ConfigError::new(
                    "hold_until_body_end",
                    "an idempotent layer reads the whole response to store it; \
                 it cannot also stream it under the lock",
                ));
            }
        }
        if c.contention != StatusCode::CONFLICT && c.contention != StatusCode::LOCKED {
            return Err(ConfigError::new(
                "contention_status",
                format!("must be 409 or 423, not {}", c.contention.as_u16()),
            ));
        }
        if let Some(ns) = &c.namespace {
            validate_name(ns, false).map_err(|e| ConfigError::new("namespace", e.to_string()))?;
        }
        if c.body_limit == 0 {
            return Err(ConfigError::new("body_limit", "must be at least 1 byte"));
        }
        if c.hold_until_body_end && c.on_lock_lost == OnLockLost::Abort {
            return Err(ConfigError::new(
                "on_lock_lost",
                "Abort cannot stop a response body that is already being sent; \
             use KeepRunning with hold_until_body_end",
            ));
        }
        if c.locker.wait_timeout() > MAX_WAIT {
            // (A deadline past the clock's range would panic on the request
            // path; no HTTP client waits that long anyway.)
            return Err(ConfigError::new(
                "wait_timeout",
                "a lock layer waits at most 24 h for a lock",
            ));
        }
        if c.body_limit > 64 << 20 {
            return Err(ConfigError::new("body_limit", "must be at most 64 MiB"));
        }
        Ok(())
    }
}
