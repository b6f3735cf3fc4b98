//! RFC 9457 `application/problem+json` answers.

use std::time::Duration;

use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderValue, StatusCode, header};

use crate::error::Error;
use crate::store::holder::HolderInfo;

/// Media type of every error body the layer writes.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// An RFC 9457 `application/problem+json` answer: what the lock layer
/// refuses a request with, and a type your own handlers can answer with, so
/// that a route's 400s and 409s come out in one format.
///
/// The body has `type` (`about:blank`), `title` (the status' reason),
/// `status` and `detail`, and a `Retry-After` header goes with it when
/// [`retry_after`](Problem::retry_after) is set. The lock key is kept for
/// logs and for a [rejection hook](crate::LockLayerBuilder::on_rejection)
/// but is not in the default body: the body tells a client what to do, not
/// how the server names its locks (see
/// [`expose_lock_key`](crate::LockLayerBuilder::expose_lock_key)).
///
/// ```
/// use std::time::Duration;
/// use axum::response::IntoResponse;
/// use http::StatusCode;
/// use tower_redis_lock::Problem;
///
/// let res = Problem::new(StatusCode::CONFLICT, "the order is already being captured")
///     .with_retry_after(Duration::from_secs(2))
///     .into_response();
/// assert_eq!(res.status(), StatusCode::CONFLICT);
/// assert_eq!(res.headers()["content-type"], "application/problem+json");
/// assert_eq!(res.headers()["retry-after"], "2");
/// ```
#[derive(Debug, Clone)]
pub struct Problem {
    status: StatusCode,
    detail: String,
    key: Option<String>,
    retry_after: Option<Duration>,
    kind: ProblemKind,
    /// Who holds the lock: only on contention, only where the layer opted
    /// in (`LockLayerBuilder::expose_holder`).
    holder: Option<Box<HolderInfo>>,
}

/// Why the lock layer refused a request: what a
/// [rejection hook](crate::LockLayerBuilder::on_rejection) can `match` on
/// instead of the status (409 and 423 are both contention; 503 is a store
/// outage or a lost lock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProblemKind {
    /// Another request holds the lock and the layer does not wait.
    Contended,
    /// Another request held the lock for the whole wait.
    WaitTimedOut,
    /// The lock store failed or refused the credentials.
    StoreUnavailable,
    /// The lock was lost while the handler ran, and the handler was stopped.
    LockLost,
    /// The request has no lock key.
    MissingKey,
    /// Keys are scoped per client and the request names none.
    MissingScope,
    /// The request's key cannot be read as the handler would read it (or
    /// makes no valid lock key).
    BadKey,
    /// The body to read the key from is larger than the layer reads.
    PayloadTooLarge,
    /// The request body could not be read.
    BodyUnreadable,
    /// An idempotency key reused with a different request.
    PayloadMismatch,
    /// The handler's response body failed before it could be stored.
    ResponseFailed,
    /// A completed request's record cannot be read by this server.
    RecordUnreadable,
    /// The layer is wired or configured wrong (a server error).
    Misconfigured,
    /// A problem made with [`Problem::new`], not by the layer.
    Other,
}

impl Problem {
    /// A problem with this status and human-readable `detail`.
    pub fn new(status: StatusCode, detail: impl Into<String>) -> Self {
        Problem {
            status,
            detail: detail.into(),
            key: None,
            retry_after: None,
            kind: ProblemKind::Other,
            holder: None,
        }
    }

    /// Why the layer refused ([`ProblemKind::Other`] for a problem of your
    /// own).
    pub fn kind(&self) -> ProblemKind {
        self.kind
    }

    pub(crate) fn of_kind(mut self, kind: ProblemKind) -> Self {
        self.kind = kind;
        self
    }

    /// Adds a `Retry-After` (whole seconds, rounded up, at least 1).
    pub fn with_retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self
    }

    /// The status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The human-readable explanation.
    pub fn detail(&self) -> &str {
        &self.detail
    }

    /// When the client may retry, if the problem says.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// The lock key concerned (its log-safe form), when the layer had
    /// one: contention, a store failure, a lost lock, a replay refused.
    pub fn lock_key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    pub(crate) fn with_detail(mut self, detail: &str) -> Self {
        detail.clone_into(&mut self.detail);
        self
    }

    /// Who holds the lock, on contention, when the layer
    /// [exposes it](crate::LockLayerBuilder::expose_holder) (never by
    /// default).
    pub fn holder(&self) -> Option<&HolderInfo> {
        self.holder.as_deref()
    }

    pub(crate) fn with_holder(mut self, holder: Option<HolderInfo>) -> Self {
        self.holder = holder.map(Box::new);
        self
    }

    pub(crate) fn key(mut self, key: Option<&crate::key::LockKey>) -> Self {
        self.key = key.map(|k| k.to_string());
        self
    }

    /// The answer for an engine error. Store failures get a generic detail:
    /// what failed is logged, not told to the client; nor is the lock key
    /// or how long another request still holds it (beyond `Retry-After`).
    pub(crate) fn from_error(e: &Error, contention: StatusCode) -> Self {
        let status = match e {
            Error::Contended { .. } | Error::WaitTimeout { .. } => contention,
            _ => e.status(),
        };
        let detail = match e {
            Error::Contended { .. } => {
                "another request holds the lock on this resource; retry later".to_owned()
            }
            Error::WaitTimeout { .. } => {
                "another request held the lock on this resource for the whole wait; retry later"
                    .to_owned()
            }
            Error::Unavailable { .. } | Error::Auth { .. } => {
                "the lock service is unavailable; retry later".to_owned()
            }
            Error::LockLost { .. } => {
                "the lock was lost while the request ran; it was stopped and can be retried"
                    .to_owned()
            }
            Error::Config(_) => "the lock layer is misconfigured".to_owned(),
            Error::Record { .. } => {
                "the stored outcome of this request cannot be read by this server".to_owned()
            }
            other => other.to_string(),
        };
        let kind = match e {
            Error::Contended { .. } => ProblemKind::Contended,
            Error::WaitTimeout { .. } => ProblemKind::WaitTimedOut,
            Error::Unavailable { .. } | Error::Auth { .. } => ProblemKind::StoreUnavailable,
            Error::LockLost { .. } => ProblemKind::LockLost,
            Error::InvalidKey { .. } => ProblemKind::BadKey,
            Error::Record { .. } => ProblemKind::RecordUnreadable,
            Error::Config(_) => ProblemKind::Misconfigured,
        };
        let mut p = Problem::new(status, detail).key(e.key()).of_kind(kind);
        p.retry_after = match e {
            Error::Contended { .. } | Error::WaitTimeout { .. } => e.retry_after(),
            Error::Unavailable { .. } | Error::Auth { .. } | Error::LockLost { .. } => {
                Some(Duration::from_secs(1))
            }
            _ => None,
        };
        p
    }

    /// The JSON body; with the `lock_key` member when `with_key`.
    pub(crate) fn body(&self, with_key: bool) -> Bytes {
        let mut v = serde_json::json!({
            "type": "about:blank",
            "title": self.status.canonical_reason().unwrap_or("Error"),
            "status": self.status.as_u16(),
            "detail": self.detail,
        });
        if let (true, Some(key), Some(obj)) = (with_key, &self.key, v.as_object_mut()) {
            obj.insert("lock_key".into(), key.clone().into());
        }
        if let (Some(h), Some(obj)) = (&self.holder, v.as_object_mut()) {
            obj.insert(
                "holder".into(),
                serde_json::json!({
                    "id": h.holder.as_str(),
                    "label": h.label.as_ref().map(|l| l.as_str()),
                }),
            );
        }
        Bytes::from(v.to_string())
    }

    /// Status and headers of the answer, with `body` as its body.
    pub(crate) fn response<B>(&self, body: B) -> http::Response<B> {
        let mut res = http::Response::new(body);
        *res.status_mut() = self.status;
        let h = res.headers_mut();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(after) = self.retry_after_header() {
            h.insert(header::RETRY_AFTER, after);
        }
        res
    }

    /// `Retry-After` in whole seconds, rounded up, at least 1.
    pub(crate) fn retry_after_header(&self) -> Option<HeaderValue> {
        let after = self.retry_after?;
        let secs = after.as_millis().div_ceil(1000).max(1);
        // `Duration::MAX` is one second past `u64::MAX`: saturate, never wrap
        // to 0 (come back at once).
        Some(HeaderValue::from(u64::try_from(secs).unwrap_or(u64::MAX)))
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        self.response(axum::body::Body::from(self.body(false)))
    }
}

#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl Error {
    /// The HTTP status this error answers with: 409 on contention (the layer
    /// can use 423), 503 when the store failed or the lock was lost, 400 for
    /// an invalid key, 500 for a configuration error.
    pub fn status(&self) -> StatusCode {
        match self {
            Error::Contended { .. } | Error::WaitTimeout { .. } => StatusCode::CONFLICT,
            Error::LockLost { .. } | Error::Unavailable { .. } | Error::Auth { .. } => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Error::InvalidKey { .. } => StatusCode::BAD_REQUEST,
            Error::Config(_) | Error::Record { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// An `application/problem+json` answer with the status of
/// [`Error::status`] and `Retry-After` where it helps.
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl IntoResponse for Error {
    fn into_response(self) -> Response {
        Problem::from_error(&self, StatusCode::CONFLICT).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::LockKey;

    #[test]
    fn contention_answers_with_retry_after_rounded_up() {
        let e = Error::Contended {
            key: LockKey::new("ns", "k").unwrap(),
            retry_after: Duration::from_millis(1_200),
        };
        let p = Problem::from_error(&e, StatusCode::LOCKED);
        let res = p.response(());
        assert_eq!(res.status(), StatusCode::LOCKED);
        assert_eq!(res.headers()[header::RETRY_AFTER], "2");
        assert_eq!(res.headers()[header::CONTENT_TYPE], PROBLEM_JSON);
        let body: serde_json::Value = serde_json::from_slice(&p.body(false)).unwrap();
        assert_eq!(body["status"], 423);
        assert_eq!(body.get("lock_key"), None, "the default body names no key");
        assert!(!body["detail"].as_str().unwrap().contains("ns:k"), "{body}");
        assert!(
            body["detail"]
                .as_str()
                .unwrap()
                .contains("another request holds the lock")
        );
        let body: serde_json::Value = serde_json::from_slice(&p.body(true)).unwrap();
        assert_eq!(body["lock_key"], "ns:k");
        assert_eq!(p.lock_key(), Some("ns:k"));
    }

    #[test]
    fn store_failures_do_not_leak_details() {
        let e = Error::Auth {
            op: crate::error::Operation::Acquire,
            key: None,
            source: "WRONGPASS invalid username-password pair".into(),
        };
        let p = Problem::from_error(&e, StatusCode::CONFLICT);
        assert_eq!(p.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(!String::from_utf8_lossy(&p.body(true)).contains("WRONGPASS"));
        assert_eq!(p.response(()).headers()[header::RETRY_AFTER], "1");
    }
}
