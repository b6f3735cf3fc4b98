//! The `MultiLock` service: find every key, take them all, run the
//! service, release them; a refusal is answered as problem+json in one
//! place ([`refuse`]).

use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode};
use tower_service::Service;

use super::config::MultiConfig;
use crate::engine::MultiGuard;
use crate::error::{BoxError, Chain};
use crate::key::LockKey;
use crate::layer::body::ResponseBody;
use crate::layer::future::ResponseFuture;
use crate::layer::key::route_namespace;
use crate::layer::problem::{Problem, ProblemKind};
use crate::layer::service::read_body;
use crate::store::LockStore;

/// Namespace used when no namespace is set and no route matched.
const FALLBACK_NAMESPACE: &str = "http";

/// The service made by [`MultiLockLayer`](crate::MultiLockLayer).
pub struct MultiLock<S, St> {
    inner: S,
    config: Arc<MultiConfig<St>>,
}

impl<S: Clone, St> Clone for MultiLock<S, St> {
    fn clone(&self) -> Self {
        MultiLock {
            inner: self.inner.clone(),
            config: self.config.clone(),
        }
    }
}

impl<S: std::fmt::Debug, St> std::fmt::Debug for MultiLock<S, St> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultiLock")
            .field("inner", &self.inner)
            .field("keys", &self.config.keys)
            .finish_non_exhaustive()
    }
}

impl<S, St> MultiLock<S, St> {
    pub(crate) fn new(inner: S, config: Arc<MultiConfig<St>>) -> Self {
        MultiLock { inner, config }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, St, ReqBody, ResBody> Service<Request<ReqBody>> for MultiLock<S, St>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    St: LockStore,
    ReqBody: http_body::Body + From<Bytes> + Send + 'static,
    ReqBody::Data: Send,
    ReqBody::Error: Into<BoxError>,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        // The clone may not be ready; use the one that is and leave the clone
        // in its place. See https://docs.rs/tower/latest/tower/trait.Service.html#be-careful-when-cloning-inner-services
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let config = self.config.clone();
        ResponseFuture::new(async move {
            let c = &*config;
            let (mut req, keys) = match find_keys(c, req).await {
                Ok(found) => found,
                Err(p) => return Ok(refuse(p)),
            };
            let guard = match take(c, &keys).await {
                Ok(guard) => guard,
                Err(p) => return Ok(refuse(p)),
            };
            let tokens = guard.fencing_tokens();
            req.extensions_mut().insert(guard.clone());
            // In the guard's scope: a `LockLayer` inside on one of the keys,
            // or the handler asking the locker for one, re-enters that key
            // instead of waiting for this guard. (Dropped before the answer,
            // the guard's keys are released in the background.)
            let res = guard.scope(inner.call(req)).await;
            if let Err(e) = guard.release().await {
                tracing::debug!(error = %Chain(&e), "releasing the request's keys failed; retrying in the background");
            }
            let mut res = res?;
            // One value per key of this layer's, whatever a layer inside set
            // (a lock layer re-entering one of the keys sets its token):
            // the outer layer's tokens are the answer's, as a lock layer's
            // are over a layer inside it.
            res.headers_mut().remove(&c.header);
            for token in tokens.into_iter().flatten() {
                res.headers_mut()
                    .append(c.header.clone(), HeaderValue::from(token.get()));
            }
            Ok(res.map(|b| ResponseBody::inner(b, None)))
        })
    }
}

/// The answer to a refused request: counted, logged, problem+json.
fn refuse<B>(p: Problem) -> Response<ResponseBody<B>> {
    crate::observe::refused(p.status().as_u16());
    tracing::debug!(
        status = p.status().as_u16(),
        detail = %p.detail(),
        "request refused by the multi-key lock layer"
    );
    p.response(ResponseBody::full(p.body(false)))
}

/// Step 1: every key of the request, in its namespace. The body is read
/// only when a source needs it, and never past the limit.
async fn find_keys<St, B>(
    c: &MultiConfig<St>,
    req: Request<B>,
) -> Result<(Request<B>, Vec<LockKey>), Problem>
where
    B: http_body::Body + From<Bytes>,
    B::Error: Into<BoxError>,
{
    let (mut parts, body) = req.into_parts();
    let refused = |k: &crate::layer::key::KeyFrom, r: crate::layer::key::Refused| {
        Problem::new(r.status(), format!("{r}: expected {}", k.describe()))
            .of_kind(ProblemKind::BadKey)
    };
    for k in &c.keys {
        k.check_head(&parts.headers).map_err(|r| refused(k, r))?;
    }
    let (body, bytes) = if c.keys.iter().any(|k| k.needs_body()) {
        let bytes = read_body(&parts, body, c.body_limit).await?;
        (B::from(bytes.clone()), bytes)
    } else {
        (body, Bytes::new())
    };
    let mut ids = Vec::with_capacity(c.keys.len());
    for k in &c.keys {
        let id = if k.needs_body() {
            k.id_in_body(&bytes)
        } else {
            k.id_in_head(&mut parts).await
        };
        match id.map_err(|r| refused(k, r))? {
            Some(id) => ids.push(id),
            None => {
                return Err(Problem::new(
                    StatusCode::BAD_REQUEST,
                    format!("the request has no lock key: expected {}", k.describe()),
                )
                .of_kind(ProblemKind::MissingKey));
            }
        }
    }
    let namespace = match (&c.namespace, route_namespace(&parts.extensions)) {
        (Some(ns), _) => ns.clone(),
        (None, Some(ns)) => ns,
        (None, None) => FALLBACK_NAMESPACE.to_owned(),
    };
    let keys = ids
        .iter()
        .map(|id| LockKey::new(&namespace, id))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Problem::from_error(&e.into(), c.contention))?;
    Ok((Request::from_parts(parts, body), keys))
}

/// Step 2: every key, or the refusal (contention with `Retry-After`, the
/// store's trouble as 503).
async fn take<St: LockStore>(c: &MultiConfig<St>, keys: &[LockKey]) -> Result<MultiGuard, Problem> {
    c.locker.acquire_all(keys).await.map_err(|e| {
        if e.is_store_failure() {
            tracing::debug!(error = %Chain(&e), "lock store failed; answering 503");
        }
        Problem::from_error(&e, c.contention)
    })
}
