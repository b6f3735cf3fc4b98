//! `LockGuard` and `FencingToken` as axum extractors.

use std::convert::Infallible;

use axum::extract::{FromRequestParts, OptionalFromRequestParts};
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use http::request::Parts;

use super::handoff::{HandOff, Slot};
use super::problem::Problem;
use crate::engine::LockGuard;
use crate::token::FencingToken;

/// A wiring mistake found by an extractor: a 500 problem answer, its status
/// and text readable, logged at DEBUG (a route missing its layer would
/// otherwise log an error per request).
macro_rules! rejection {
    ($name:ident, $text:expr) => {
        impl $name {
            /// The status of the answer: 500.
            pub fn status(&self) -> StatusCode {
                StatusCode::INTERNAL_SERVER_ERROR
            }

            /// The text of the answer (its problem `detail`).
            pub fn body_text(&self) -> String {
                $text.to_owned()
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str($text)
            }
        }

        impl std::error::Error for $name {}

        impl IntoResponse for $name {
            fn into_response(self) -> Response {
                tracing::debug!(
                    target: "tower_redis_lock::rejection",
                    status = self.status().as_u16(),
                    "{self}"
                );
                Problem::new(self.status(), self.body_text()).into_response()
            }
        }
    };
}

/// The lock of the current request, put in the request extensions by
/// [`LockLayer`](crate::LockLayer).
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
///
/// Like axum's own rejections it tells its [`status`](Self::status) and
/// [`body_text`](Self::body_text), for a handler that answers it its own
/// way, and logs at DEBUG (target `tower_redis_lock::rejection`) when it is
/// turned into a response.
///
/// ```
/// use http::StatusCode;
/// use tower_redis_lock::MissingLockGuard;
///
/// # fn wiring(rejection: MissingLockGuard) {
/// assert_eq!(rejection.status(), StatusCode::INTERNAL_SERVER_ERROR);
/// assert!(rejection.body_text().contains("LockLayer"));
/// # }
/// ```
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct MissingLockGuard;

rejection!(
    MissingLockGuard,
    "no LockGuard in the request extensions. Is `LockLayer` enabled on this route? \
     (Use `Option<LockGuard>` where the layer may pass requests through unlocked.)"
);

/// The fencing token of the current request's lock, put in the request
/// extensions by [`LockLayer`](crate::LockLayer) — for a handler that only
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
/// no token (or that holds no lock): a 500 problem answer, with
/// [`status`](Self::status) and [`body_text`](Self::body_text) as
/// [`MissingLockGuard`] has.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct MissingFencingToken;

rejection!(
    MissingFencingToken,
    "no FencingToken in the request extensions: is `LockLayer` enabled on this route, \
     over a store that fences (not built with `fencing(false)`)? (Use \
     `Option<FencingToken>` where the layer may pass requests through unlocked.)"
);

/// Takes the request's lock over for background work (see [`HandOff`]);
/// from then on the layer leaves the lock and the record to it.
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl<S: Send + Sync> FromRequestParts<S> for HandOff {
    type Rejection = MissingHandOff;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<Slot>()
            .and_then(Slot::take)
            .ok_or(MissingHandOff)
    }
}

/// Rejection of the [`HandOff`] extractor: the request holds no lock to
/// hand off (no lock layer on the route, a request the layer passed
/// through unlocked), or its lock was handed off already. A 500 problem
/// answer, with [`status`](Self::status) and [`body_text`](Self::body_text)
/// as [`MissingLockGuard`] has.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct MissingHandOff;

rejection!(
    MissingHandOff,
    "no lock to hand off in this request. Is `LockLayer` enabled on this route? \
     (A request's lock is handed off once.)"
);

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;

    async fn answered(response: Response) -> (StatusCode, String) {
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn a_rejection_answers_what_it_says() {
        for (status, text, response) in [
            (
                MissingLockGuard.status(),
                MissingLockGuard.body_text(),
                MissingLockGuard.into_response(),
            ),
            (
                MissingFencingToken.status(),
                MissingFencingToken.body_text(),
                MissingFencingToken.into_response(),
            ),
        ] {
            assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
            let (answered_status, body) = answered(response).await;
            assert_eq!(answered_status, status);
            let detail = serde_json::from_str::<serde_json::Value>(&body).unwrap()["detail"]
                .as_str()
                .unwrap()
                .to_owned();
            assert_eq!(detail, text);
        }
        assert!(MissingFencingToken.body_text().contains("fencing(false)"));
        assert!(MissingLockGuard.body_text().contains("Option<LockGuard>"));
    }
}
