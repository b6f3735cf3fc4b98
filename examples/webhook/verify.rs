//! The signature check in front of the lock layer: reads the body within
//! [`MAX_BODY`], checks its signature, and hands the same bytes on.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use tower_http::timeout::TimeoutError;

use super::MAX_BODY;
use super::app::problem;
use super::signature::{unix_now, verify_github, verify_stripe};

pub(super) const STRIPE_SIGNATURE: HeaderName = HeaderName::from_static("stripe-signature");
pub(super) const GITHUB_SIGNATURE: HeaderName = HeaderName::from_static("x-hub-signature-256");
pub(super) const GITHUB_DELIVERY: HeaderName = HeaderName::from_static("x-github-delivery");

/// Which signature scheme a route checks.
#[derive(Debug, Clone, Copy)]
pub(super) enum Scheme {
    Stripe,
    GitHub,
}

#[derive(Debug)]
pub(super) struct Verifier {
    pub(super) secret: String,
    pub(super) tolerance: Duration,
    pub(super) scheme: Scheme,
}

/// Middleware in front of the lock layer: reads the body (within
/// [`MAX_BODY`]), checks the signature, and hands the same bytes on. A
/// refused request never reaches the lock layer, so it costs no Redis work.
///
/// A declared `Content-Length` over the limit is answered `413` before a
/// byte of the body is read; a body that stops short of its declared length
/// runs into the server's body deadline and gets `408`.
pub(super) async fn verify_signature(
    State(v): State<Arc<Verifier>>,
    req: Request,
    next: Next,
) -> Response {
    let (parts, body) = req.into_parts();
    let too_large = || {
        problem(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!("the webhook body is larger than {MAX_BODY} bytes"),
        )
    };
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY as u64) {
        return too_large();
    }
    if matches!(v.scheme, Scheme::GitHub) && !one_delivery_id(&parts.headers) {
        // The ledger and the logs name each delivery by it; without one,
        // the request is not GitHub's.
        return problem(
            StatusCode::BAD_REQUEST,
            &format!("missing, repeated or unreadable `{GITHUB_DELIVERY}` header"),
        );
    }
    let body = match Limited::new(body, MAX_BODY).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => return too_large(),
        Err(e) if is_timeout(&*e) => {
            tracing::info!(scheme = ?v.scheme, "webhook body not received in time");
            return problem(
                StatusCode::REQUEST_TIMEOUT,
                "the webhook body did not arrive in time",
            );
        }
        Err(_) => {
            return problem(
                StatusCode::BAD_REQUEST,
                "the webhook body could not be read",
            );
        }
    };
    let (name, checked) = match v.scheme {
        Scheme::Stripe => (
            STRIPE_SIGNATURE,
            header_str(&parts.headers, &STRIPE_SIGNATURE)
                .map(|h| verify_stripe(&v.secret, h, &body, unix_now(), v.tolerance)),
        ),
        Scheme::GitHub => (
            GITHUB_SIGNATURE,
            header_str(&parts.headers, &GITHUB_SIGNATURE)
                .map(|h| verify_github(&v.secret, h, &body)),
        ),
    };
    match checked {
        None => problem(
            StatusCode::BAD_REQUEST,
            &format!("missing or unreadable `{name}` header"),
        ),
        Some(Err(why)) => {
            tracing::info!(scheme = ?v.scheme, why, "webhook signature refused");
            problem(StatusCode::BAD_REQUEST, &format!("`{name}`: {why}"))
        }
        Some(Ok(())) => {
            let delivery = header_str(&parts.headers, &GITHUB_DELIVERY).map(str::to_owned);
            let res = next.run(Request::from_parts(parts, Body::from(body))).await;
            if res.headers().get("idempotent-replayed").is_some() {
                // A duplicate (for GitHub maybe a replay under a new delivery
                // id): answered from the record, nothing applied.
                tracing::info!(
                    scheme = ?v.scheme,
                    delivery = delivery.as_deref().unwrap_or("-"),
                    "duplicate delivery answered with the stored response"
                );
            }
            res
        }
    }
}

/// Whether the request has exactly one readable, non-empty delivery id.
fn one_delivery_id(headers: &HeaderMap) -> bool {
    let mut all = headers.get_all(&GITHUB_DELIVERY).iter();
    let one = all.next().and_then(|v| v.to_str().ok());
    all.next().is_none() && one.is_some_and(|v| !v.is_empty())
}

/// Whether a body error is (or wraps) the server's body deadline.
fn is_timeout(mut e: &(dyn std::error::Error + 'static)) -> bool {
    loop {
        if e.is::<TimeoutError>() {
            return true;
        }
        match e.source() {
            Some(inner) => e = inner,
            None => return false,
        }
    }
}

pub(super) fn header_str<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}
