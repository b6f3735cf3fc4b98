//! RFC 9457 `application/problem+json` answers.

use std::time::Duration;

use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderValue, StatusCode, header};

use crate::Error;

/// Media type of every error body the layer writes.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// One problem answer: status, a human `detail`, the lock key (log-safe form)
/// and an optional `Retry-After`.
#[derive(Debug, Clone)]
pub(crate) struct Problem {
    pub(crate) status: StatusCode,
    pub(crate) detail: String,
    pub(crate) key: Option<String>,
    pub(crate) retry_after: Option<Duration>,
}

impl Problem {
    pub(crate) fn new(status: StatusCode, detail: impl Into<String>) -> Self {
        Problem {
            status,
            detail: detail.into(),
            key: None,
            retry_after: None,
        }
    }

    pub(crate) fn key(mut self, key: Option<&crate::LockKey>) -> Self {
        self.key = key.map(|k| k.to_string());
        self
    }

    /// The answer for an engine error. Store failures get a generic detail:
    /// what failed is logged, not told to the client.
    pub(crate) fn from_error(e: &Error, contention: StatusCode) -> Self {
        let status = match e {
            Error::Contended { .. } | Error::WaitTimeout { .. } => contention,
            _ => e.status(),
        };
        let detail = match e {
            Error::Unavailable { .. } | Error::Auth { .. } => {
                "the lock service is unavailable; retry later".to_owned()
            }
            Error::LockLost { .. } => {
                "the lock was lost while the request ran; it was stopped and can be retried"
                    .to_owned()
            }
            Error::Config(_) => "the lock layer is misconfigured".to_owned(),
            other => other.to_string(),
        };
        let mut p = Problem::new(status, detail).key(e.key());
        p.retry_after = match e {
            Error::Contended { .. } | Error::WaitTimeout { .. } => e.retry_after(),
            Error::Unavailable { .. } | Error::Auth { .. } | Error::LockLost { .. } => {
                Some(Duration::from_secs(1))
            }
            _ => None,
        };
        p
    }

    pub(crate) fn body(&self) -> Bytes {
        let mut v = serde_json::json!({
            "type": "about:blank",
            "title": self.status.canonical_reason().unwrap_or("Error"),
            "status": self.status.as_u16(),
            "detail": self.detail,
        });
        if let (Some(key), Some(obj)) = (&self.key, v.as_object_mut()) {
            obj.insert("lock_key".into(), key.clone().into());
        }
        Bytes::from(v.to_string())
    }

    /// Status and headers of the answer, with `body` as its body.
    pub(crate) fn response<B>(&self, body: B) -> http::Response<B> {
        let mut res = http::Response::new(body);
        *res.status_mut() = self.status;
        let h = res.headers_mut();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(after) = self.retry_after {
            // Whole seconds, rounded up, at least 1.
            let secs = after.as_millis().div_ceil(1000).max(1);
            h.insert(header::RETRY_AFTER, HeaderValue::from(secs as u64));
        }
        res
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
        let p = Problem::from_error(&self, StatusCode::CONFLICT);
        p.response(axum::body::Body::from(p.body()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LockKey;

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
        let body: serde_json::Value = serde_json::from_slice(&p.body()).unwrap();
        assert_eq!(body["status"], 423);
        assert_eq!(body["lock_key"], "ns:k");
        assert!(
            body["detail"]
                .as_str()
                .unwrap()
                .contains("held by another owner")
        );
    }

    #[test]
    fn store_failures_do_not_leak_details() {
        let e = Error::Auth {
            op: crate::Operation::Acquire,
            key: None,
            source: "WRONGPASS invalid username-password pair".into(),
        };
        let p = Problem::from_error(&e, StatusCode::CONFLICT);
        assert_eq!(p.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(!String::from_utf8_lossy(&p.body()).contains("WRONGPASS"));
        assert_eq!(p.response(()).headers()[header::RETRY_AFTER], "1");
    }
}
