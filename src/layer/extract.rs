//! `LockGuard` and `FencingToken` as axum extractors.

use std::convert::Infallible;

use axum::extract::{FromRequestParts, OptionalFromRequestParts};
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use http::request::Parts;

use super::problem::Problem;
use crate::{FencingToken, LockGuard};

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

/// The fencing token of the current request's lock, put in the request
/// extensions by [`LockLayer`](super::LockLayer) — for a handler that only
/// needs to hand the token to the resource it writes.
///
/// A request without one is a wiring mistake, answered with 500: no lock
/// layer on the route, or a store built with
/// [`fencing(false)`](crate::RedisStoreBuilder::fencing), which mints no
/// tokens. Use `Option<FencingToken>` where the layer may pass a request
/// through unlocked.
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl<S: Send + Sync> FromRequestParts<S> for FencingToken {
    type Rejection = MissingFencingToken;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<FencingToken>()
            .copied()
            .ok_or(MissingFencingToken)
    }
}

#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl<S: Send + Sync> OptionalFromRequestParts<S> for FencingToken {
    type Rejection = Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        _state: &S,
    ) -> Result<Option<Self>, Self::Rejection> {
        Ok(parts.extensions.get::<FencingToken>().copied())
    }
}

/// Rejection of the [`FencingToken`] extractor on a request whose lock has
/// no token (or that holds no lock): a 500 problem answer.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct MissingFencingToken;

impl std::fmt::Display for MissingFencingToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(
            "no FencingToken in the request extensions: is `LockLayer` enabled on this route, \
             over a store that fences (not built with `fencing(false)`)? (Use \
             `Option<FencingToken>` where the layer may pass requests through unlocked.)",
        )
    }
}

impl std::error::Error for MissingFencingToken {}

impl IntoResponse for MissingFencingToken {
    fn into_response(self) -> Response {
        tracing::error!("{self}");
        Problem::new(StatusCode::INTERNAL_SERVER_ERROR, self.to_string()).into_response()
    }
}
