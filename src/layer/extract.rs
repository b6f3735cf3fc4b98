//! `LockGuard` as an axum extractor.

use std::convert::Infallible;

use axum::extract::{FromRequestParts, OptionalFromRequestParts};
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use http::request::Parts;

use super::problem::Problem;
use crate::LockGuard;

/// The lock of the current request, put in the request extensions by
/// [`LockLayer`](super::LockLayer).
///
/// Use `Option<LockGuard>` on routes where the layer may pass a request
/// through unlocked (missing key with pass-through, or fail-open).
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl<S: Send + Sync> FromRequestParts<S> for LockGuard {
    type Rejection = MissingLockGuard;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<LockGuard>()
            .cloned()
            .ok_or(MissingLockGuard)
    }
}

#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl<S: Send + Sync> OptionalFromRequestParts<S> for LockGuard {
    type Rejection = Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        _state: &S,
    ) -> Result<Option<Self>, Self::Rejection> {
        Ok(parts.extensions.get::<LockGuard>().cloned())
    }
}

/// Rejection of the [`LockGuard`] extractor on a request that holds no lock:
/// a 500 problem answer, since it is a wiring mistake, not a client error.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct MissingLockGuard;

impl std::fmt::Display for MissingLockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(
            "no LockGuard in the request extensions. Is `LockLayer` enabled on this route? \
             (Use `Option<LockGuard>` where the layer may pass requests through unlocked.)",
        )
    }
}

impl std::error::Error for MissingLockGuard {}

impl IntoResponse for MissingLockGuard {
    fn into_response(self) -> Response {
        tracing::error!("{self}");
        Problem::new(StatusCode::INTERNAL_SERVER_ERROR, self.to_string()).into_response()
    }
}
