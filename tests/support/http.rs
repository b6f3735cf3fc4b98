//! Sending requests to a router in tests and reading whole responses.

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::BodyExt;
use tokio::time::timeout;
use tower::ServiceExt;

/// How long a test waits for an answer or for a body to end.
const LIMIT: Duration = Duration::from_secs(10);

/// A response with its body read. Test files add their own checks in
/// `impl Reply` blocks.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// Reads a whole response.
pub async fn read<B>(res: Response<B>) -> Reply
where
    B: http_body::Body<Data = Bytes>,
    B::Error: std::fmt::Debug,
{
    let (parts, body) = res.into_parts();
    let body = timeout(LIMIT, body.collect())
        .await
        .expect("the response body did not end")
        .unwrap()
        .to_bytes();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}

/// Sends `req` through `app` and reads the answer.
pub async fn send(app: &Router, req: Request<Body>) -> Reply {
    let res = timeout(LIMIT, app.clone().oneshot(req))
        .await
        .expect("no answer")
        .unwrap();
    read(res).await
}
