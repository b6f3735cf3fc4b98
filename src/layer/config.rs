//! The settings of a lock layer, shared by the layer, its builder and the
//! service, and their checks.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

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

/// The `Retry-After` of a request refused because another holds the lock
/// (see [`LockLayerBuilder::retry_after`](crate::LockLayerBuilder::retry_after)).
/// The header is in whole seconds, rounded up, at least 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum RetryAfter {
    /// How long this layer's requests have held their lock lately (a moving
    /// average of the time from grant to release, the handler's run), at
    /// most the holder's remaining lease; the remaining lease until the
    /// layer has seen a request through. A handler that takes 1.5 s under a
    /// 30 s lease tells clients 2 s, not 30 s. (Default.)
    #[default]
    Observed,
    /// The holder's remaining lease: when the lock is free at the latest,
    /// if its holder crashed (clients that obey it may wait far longer than
    /// the handler takes).
    RemainingLease,
    /// Always this long.
    Fixed(Duration),
}

/// The hold times a layer has seen: a moving average (the last eight
/// weigh most), in microseconds; 0 before the first. Clones share it (a
/// body held under the lock notes its hold when it ends). Kept only for
/// [`RetryAfter::Observed`]: under another policy nothing reads it, and
/// a request notes nothing.
#[derive(Debug, Default, Clone)]
pub(crate) struct HoldTimes(Option<Arc<AtomicU64>>);

impl HoldTimes {
    /// Hold times kept for `policy` (or not).
    pub(crate) fn for_policy(policy: RetryAfter) -> Self {
        HoldTimes((policy == RetryAfter::Observed).then(Arc::default))
    }

    pub(crate) fn saw(&self, held: Duration) {
        let Some(avg) = &self.0 else { return };
        let held = u64::try_from(held.as_micros()).unwrap_or(u64::MAX).max(1);
        let _ = avg.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |avg| {
            Some(match avg {
                0 => held,
                avg if held >= avg => avg + (held - avg) / 8,
                avg => (avg - (avg - held) / 8).max(1),
            })
        });
    }

    pub(crate) fn average(&self) -> Option<Duration> {
        match self.0.as_ref()?.load(Ordering::Relaxed) {
            0 => None,
            us => Some(Duration::from_micros(us)),
        }
    }
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
    /// Whether the contention status was set (else a permit layer answers
    /// 429).
    pub(crate) contention_set: bool,
    /// A permit layer: at most this many requests per key at once (see
    /// `LockLayerBuilder::concurrency_limit`); a lock layer without.
    pub(crate) permits: Option<u32>,
    /// A reader-writer layer: which side each request takes (see
    /// `LockLayerBuilder::read_write`); a lock layer without.
    pub(crate) rw: Option<super::rwlock::ModeOf>,
    pub(crate) header: HeaderName,
    pub(crate) body_limit: usize,
    pub(crate) on_store_error: OnStoreError,
    pub(crate) on_lock_lost: OnLockLost,
    pub(crate) on_missing_key: OnMissingKey,
    pub(crate) hold_until_body_end: bool,
    pub(crate) idempotency: Option<Idempotency>,
    pub(crate) expose_lock_key: bool,
    /// The store's operator view, when the layer exposes the holder.
    pub(crate) expose_holder: Option<crate::store::BoxStore>,
    pub(crate) on_rejection: Option<RejectionHook>,
    pub(crate) retry_after: RetryAfter,
    pub(crate) holds: HoldTimes,
    /// Whether a misplacement of this layer was logged (once per layer).
    pub(crate) misplaced_logged: AtomicBool,
}

impl<St> Config<St> {
    /// The `Retry-After` for contention, from the holder's `remaining`
    /// lease and the policy.
    pub(crate) fn contention_retry(&self, remaining: Duration) -> Duration {
        match self.retry_after {
            RetryAfter::Observed => self
                .holds
                .average()
                .map_or(remaining, |avg| avg.min(remaining)),
            RetryAfter::RemainingLease => remaining,
            RetryAfter::Fixed(after) => after,
        }
    }

    /// Runs `log` the first time this layer finds itself misplaced.
    pub(crate) fn misplaced_once(&self, log: impl FnOnce()) {
        if !self.misplaced_logged.swap(true, Ordering::Relaxed) {
            log();
        }
    }
}

impl<St: LockStore> Config<St> {
    /// The checks of [`LockLayerBuilder::build`](crate::LockLayerBuilder::build)
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
        if c.rw.is_some() && (c.permits.is_some() || c.idempotency.is_some()) {
            return Err(ConfigError::new(
                "read_write",
                "a reader-writer layer is neither a concurrency limit nor idempotent \
                 (those need permits, or one request per key)",
            ));
        }
        // A kind the store does not keep is refused here, not per request.
        if c.rw.is_some() {
            crate::store::kind_unsupported(c.locker.store(), crate::store::LeaseKind::Read)?;
        }
        if let Some(permits) = c.permits {
            crate::engine::check_permits(permits)?;
            crate::store::kind_unsupported(c.locker.store(), crate::store::LeaseKind::Permit)?;
            if c.idempotency.is_some() {
                return Err(ConfigError::new(
                    "concurrency_limit",
                    "an idempotent layer needs a lock (one request per key), not permits",
                ));
            }
            let allowed = [
                StatusCode::TOO_MANY_REQUESTS,
                StatusCode::CONFLICT,
                StatusCode::LOCKED,
                StatusCode::SERVICE_UNAVAILABLE,
            ];
            if !allowed.contains(&c.contention) {
                return Err(ConfigError::new(
                    "contention_status",
                    format!(
                        "a concurrency limit answers 429, 409, 423 or 503, not {}",
                        c.contention.as_u16()
                    ),
                ));
            }
        } else if c.contention != StatusCode::CONFLICT && c.contention != StatusCode::LOCKED {
            return Err(ConfigError::new(
                "contention_status",
                format!("must be 409 or 423, not {}", c.contention.as_u16()),
            ));
        }
        if let Some(ns) = &c.namespace {
            validate_name(ns, false).map_err(|e| ConfigError::new("namespace", e.to_string()))?;
        }
        crate::layer::idempotency::check_fencing_header(&c.header)?;
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
