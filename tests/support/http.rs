//! Sending requests to a router in tests, reading whole responses, checking
//! problem answers, and holding handlers at a gate.

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::BodyExt;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
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

impl Reply {
    /// A header's value as text, if present and text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// Every value of a header, as text, in order.
    pub fn all(&self, name: &http::HeaderName) -> Vec<&str> {
        self.headers
            .get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect()
    }

    /// The `fencing-token` header, which must be there.
    pub fn fencing(&self) -> u64 {
        self.fencing_in("fencing-token")
            .unwrap_or_else(|| panic!("no fencing-token on {self:?}"))
    }

    /// A token in the header `name`, if present.
    pub fn fencing_in(&self, name: &str) -> Option<u64> {
        self.header(name).map(|v| v.parse().unwrap())
    }

    /// Whether the answer is a replay (`idempotent-replayed: true`; any other
    /// value of that header fails the test).
    pub fn replayed(&self) -> bool {
        match self.header("idempotent-replayed") {
            None => false,
            Some(v) => {
                assert_eq!(v, "true", "{self:?}");
                true
            }
        }
    }

    /// The body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The `Retry-After` seconds; panics without one.
    pub fn retry_after(&self) -> u64 {
        self.headers
            .get(RETRY_AFTER)
            .unwrap_or_else(|| panic!("no Retry-After on {self:?}"))
            .to_str()
            .unwrap()
            .parse()
            .unwrap()
    }

    /// Checks an RFC 9457 answer with `status` (one `application/problem+json`
    /// content type, the status and a detail in the JSON, never marked as a
    /// replay) and returns its JSON.
    pub fn problem(&self, status: StatusCode) -> serde_json::Value {
        assert_eq!(self.status, status, "{self:?}");
        let types: Vec<_> = self.headers.get_all(CONTENT_TYPE).iter().collect();
        assert_eq!(types, ["application/problem+json"], "{self:?}");
        assert!(
            !self.headers.contains_key("idempotent-replayed"),
            "{self:?}"
        );
        let v: serde_json::Value = serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {self:?}"));
        assert_eq!(v["status"], status.as_u16(), "{v}");
        assert!(v["detail"].as_str().is_some_and(|d| !d.is_empty()), "{v}");
        v
    }
}

/// An empty `POST` to `uri`.
pub fn post_to(uri: &str) -> Request<Body> {
    Request::post(uri).body(Body::empty()).unwrap()
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

/// Sends in a task, so the test can go on while the handler runs.
pub fn spawn_send(app: &Router, req: Request<Body>) -> JoinHandle<Reply> {
    let app = app.clone();
    tokio::spawn(async move { send(&app, req).await })
}

/// The answer of a [`spawn_send`].
pub async fn join(task: JoinHandle<Reply>) -> Reply {
    timeout(LIMIT, task)
        .await
        .expect("request did not finish")
        .unwrap()
}

/// Lets handlers report that they started and then wait for the test: the
/// test receives one `oneshot::Sender` per started handler and sends (or
/// drops) it to let that handler finish.
#[derive(Clone)]
pub struct Gate {
    started: mpsc::UnboundedSender<oneshot::Sender<()>>,
}

/// The test's side of a [`Gate`].
pub struct Gates(mpsc::UnboundedReceiver<oneshot::Sender<()>>);

impl Gate {
    pub fn new() -> (Gate, Gates) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Gate { started: tx }, Gates(rx))
    }

    /// Called by a handler: reports that it started, then waits to be let go.
    pub async fn pass(&self) {
        let (tx, rx) = oneshot::channel();
        let _ = self.started.send(tx);
        let _ = rx.await;
    }
}

impl Gates {
    /// Waits until a handler is inside the gate; the returned sender lets it out.
    pub async fn started(&mut self) -> oneshot::Sender<()> {
        timeout(LIMIT, self.0.recv())
            .await
            .expect("the handler did not start")
            .unwrap()
    }

    /// Whether no handler has reached the gate (since the last `started`).
    pub fn none_started(&mut self) -> bool {
        self.0.try_recv().is_err()
    }
}
