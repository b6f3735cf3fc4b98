//! The `Lock` service: what happens to each request.

use std::sync::Arc;
use std::task::{Context, Poll};

use axum::extract::MatchedPath;
use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use sha2::{Digest, Sha256};
use tower_service::Service;

use super::body::ResponseBody;
use super::future::ResponseFuture;
use super::idempotency::{Fingerprint, Record};
use super::key::route_namespace;
use super::layer::{Config, OnLockLost, OnMissingKey, OnStoreError};
use super::problem::Problem;
use super::replay::{finish, replay};
use crate::{Acquired, BoxError, Error, FencingToken, LockGuard, LockKey, LockStore};

/// Namespace used when no namespace is set and no route matched.
const FALLBACK_NAMESPACE: &str = "http";

/// Marks a request whose lock was taken by an idempotent layer (which
/// checks and stores the record of `key`).
#[derive(Clone)]
struct IdempotentHold(LockKey);

/// The service made by [`LockLayer`](super::LockLayer).
pub struct Lock<S, St> {
    inner: S,
    config: Arc<Config<St>>,
}

impl<S: Clone, St> Clone for Lock<S, St> {
    fn clone(&self) -> Self {
        Lock {
            inner: self.inner.clone(),
            config: self.config.clone(),
        }
    }
}

impl<S: std::fmt::Debug, St> std::fmt::Debug for Lock<S, St> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lock")
            .field("inner", &self.inner)
            .field("key", &self.config.key)
            .finish_non_exhaustive()
    }
}

impl<S, St> Lock<S, St> {
    pub(crate) fn new(inner: S, config: Arc<Config<St>>) -> Self {
        Lock { inner, config }
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

impl<S, St, ReqBody, ResBody> Service<Request<ReqBody>> for Lock<S, St>
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
        let inner = std::mem::replace(&mut self.inner, clone);
        let config = self.config.clone();
        ResponseFuture::new(async move {
            let res = handle(config.clone(), inner, req).await?;
            Ok(shape(&config, res).await)
        })
    }
}

/// Marks a refusal of the layer's own, for [`shape`].
#[derive(Clone)]
struct Refused(Problem);

/// Left by [`shape`] on every refusal it shapes, whatever its final status
/// or body (the user's hook may pick any): an idempotent layer around this
/// one never stores it as a request's final answer. A refusal (contention,
/// the store unavailable, a bad key) says nothing about the request's
/// outcome; stored, it would answer every later delivery for the whole
/// retention, and the event would never run.
#[derive(Clone, Copy)]
struct Refusal;

/// A refusal's default answer; [`shape`] gives it its final form.
fn problem<B>(p: Problem) -> Response<ResponseBody<B>> {
    let mut res = p.response(ResponseBody::full(p.body(false)));
    res.extensions_mut().insert(Refused(p));
    res
}

/// Largest body of a rejection hook's answer.
const MAX_HOOK_BODY: usize = 64 << 10;

/// Every refusal passes here: the user's rejection hook, or the default
/// problem body (with the lock key if the layer exposes it).
async fn shape<St, B>(
    c: &Config<St>,
    mut res: Response<ResponseBody<B>>,
) -> Response<ResponseBody<B>> {
    let Some(Refused(p)) = res.extensions_mut().remove::<Refused>() else {
        return res;
    };
    let mut res = shaped(c, p, res).await;
    res.extensions_mut().insert(Refusal);
    res
}

/// A refusal's final form: the user's rejection hook, or the default
/// problem body (with the lock key if the layer exposes it).
async fn shaped<St, B>(
    c: &Config<St>,
    p: Problem,
    res: Response<ResponseBody<B>>,
) -> Response<ResponseBody<B>> {
    if let Some(hook) = &c.on_rejection {
        let (parts, body) = hook(&p).into_parts();
        match axum::body::to_bytes(body, MAX_HOOK_BODY).await {
            Ok(bytes) => return Response::from_parts(parts, ResponseBody::full(bytes)),
            Err(e) => tracing::error!(
                error = %e,
                "the lock layer's rejection hook gave a body that failed or is over 64 KiB; \
                 answering the default problem instead"
            ),
        }
    }
    if c.expose_lock_key && p.lock_key().is_some() {
        return p.response(ResponseBody::full(p.body(true)));
    }
    res
}

async fn run_unlocked<S, ReqBody, ResBody>(
    mut inner: S,
    req: Request<ReqBody>,
) -> Result<Response<ResponseBody<ResBody>>, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    Ok(inner.call(req).await?.map(|b| ResponseBody::inner(b, None)))
}

async fn handle<S, St, ReqBody, ResBody>(
    config: Arc<Config<St>>,
    mut inner: S,
    req: Request<ReqBody>,
) -> Result<Response<ResponseBody<ResBody>>, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    St: LockStore,
    ReqBody: http_body::Body + From<Bytes>,
    ReqBody::Error: Into<BoxError>,
    ResBody: http_body::Body<Data = Bytes>,
{
    let c = &*config;
    let (mut parts, body) = req.into_parts();

    // 1. The key (and the fingerprint). The body is read only when the key
    // or the fingerprint needs it, and never past the limit.
    let fingerprint_body = c
        .idempotency
        .as_ref()
        .is_some_and(|i| i.fingerprint == Fingerprint::Body);
    let (id, body, fingerprint) = if let Err(refused) = c.key.check_head(&parts.headers) {
        (Err(refused), body, None)
    } else if c.key.needs_body() || fingerprint_body {
        let bytes = match read_body(&parts, body, c.body_limit).await {
            Ok(bytes) => bytes,
            Err(p) => return Ok(reject(p, None)),
        };
        let id = if c.key.needs_body() {
            c.key.id_in_body(&bytes)
        } else {
            c.key.id_in_head(&mut parts).await
        };
        let fingerprint = fingerprint_body.then(|| <[u8; 32]>::from(Sha256::digest(&bytes)));
        (id, ReqBody::from(bytes), fingerprint)
    } else {
        (c.key.id_in_head(&mut parts).await, body, None)
    };
    let mut req = Request::from_parts(parts, body);
    let routed = req.extensions().get::<MatchedPath>().is_some();
    let id = match id {
        Ok(id) => id,
        // Never guess which id the handler will act on (a source given
        // twice, a dot segment, a stray `%`, a value the handler's extractor
        // refuses…), whatever `OnMissingKey` says.
        Err(refused) => {
            return Ok(reject(
                Problem::new(
                    refused.status(),
                    format!("{refused}: expected {}", c.key.describe()),
                ),
                None,
            ));
        }
    };
    let Some(id) = id else {
        // A path-parameter key on a request that matched no route: the layer
        // sits outside routing (around a whole `Router`, or on its
        // fallback), where no path parameter exists. Never a pass-through of
        // its own: the inner service may be a whole router whose handlers
        // would run unlocked.
        let detail = if c.key.is_path_param() && !routed {
            c.misplaced_once(|| {
                tracing::error!(
                    key = ?c.key,
                    "lock layer misplaced: it sees requests before routing (around a whole \
                     Router?), where path parameters do not exist; put it on the route with \
                     `route_layer`. Requests without a key get the OnMissingKey answer."
                )
            });
            format!(
                "the request has no lock key: {} is only known on a matched route, and this \
                 lock layer sits outside routing (it should be a `route_layer` on the route)",
                c.key.describe()
            )
        } else {
            format!("the request has no lock key: expected {}", c.key.describe())
        };
        return match c.on_missing_key {
            OnMissingKey::PassThrough => run_unlocked(inner, req).await,
            OnMissingKey::Reject => Ok(reject(Problem::new(StatusCode::BAD_REQUEST, detail), None)),
        };
    };
    let namespace = match (&c.namespace, route_namespace(req.extensions())) {
        (Some(ns), _) => ns.clone(),
        (None, Some(ns)) => ns,
        // No namespace and no matched route: every request through this
        // layer shares one namespace. Safe for mutual exclusion (requests of
        // two routes at worst exclude each other); an idempotent layer, whose
        // records must not answer another route's request, always has a
        // namespace of its own (`build` requires one).
        (None, None) => FALLBACK_NAMESPACE.to_owned(),
    };
    let key = match LockKey::new(&namespace, &id[..]) {
        Ok(key) => key,
        Err(e) => return Ok(reject(Problem::from_error(&e, c.contention), None)),
    };

    // 2. The lock, or the completed record. An enclosing lock layer's guard
    // in the request is the scope the locker decides re-entry in (the same
    // task-local check as for a handler that asks the locker itself), so a
    // request handed to another task, with its extensions, still re-enters
    // instead of waiting for its own lock.
    let parent = req.extensions().get::<LockGuard>().cloned();
    let take = async {
        match &c.idempotency {
            Some(_) => c.locker.acquire_or_replay(&key).await,
            None => c.locker.acquire(&key).await.map(Acquired::Locked),
        }
    };
    let taken = match &parent {
        Some(parent) => parent.scope(take).await,
        None => take.await,
    };
    // The engine hands back the stored bytes; the record codec is ours.
    let taken = match taken {
        Ok(Acquired::Locked(guard)) => Ok(guard),
        Ok(Acquired::Completed(raw)) => match Record::decode(raw) {
            Some(record) => return Ok(replay(record, fingerprint, &key)),
            None => Err(Error::Record {
                key: key.clone(),
                reason: "the stored record is not in a format this version reads",
            }),
        },
        Err(e) => Err(e),
    };
    let guard = match taken {
        Ok(guard) => guard,
        Err(e) if e.is_store_failure() && c.on_store_error == OnStoreError::FailOpen => {
            tracing::warn!(key = %key, error = %e, "lock store failed; running unlocked (fail-open)");
            return run_unlocked(inner, req).await;
        }
        Err(e) => {
            if e.is_store_failure() {
                tracing::error!(key = %key, error = %e, "lock store failed; answering 503");
            }
            return Ok(reject(Problem::from_error(&e, c.contention), Some(&key)));
        }
    };
    // Re-entered: one more hold on the enclosing layer's grant (nested
    // locked routes or services on the same key and store). The record, if
    // any, is the outer layer's to store — so an idempotent layer re-enters
    // only a lock taken by an idempotent layer: under any other, no record
    // would be checked or stored and every duplicate would run again.
    if parent.as_ref().is_some_and(|p| p.same_grant(&guard)) {
        if c.idempotency.is_some()
            && req
                .extensions()
                .get::<IdempotentHold>()
                .is_none_or(|held| held.0 != key)
        {
            let _ = guard.release().await;
            c.misplaced_once(|| {
                tracing::error!(
                    key = %key,
                    "idempotent lock layer nested inside a lock layer on the same key that \
                     stores no records: duplicates would run again; make the outer layer \
                     idempotent or give the layers different namespaces"
                )
            });
            return Ok(reject(
                Problem::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the idempotent lock layer is misconfigured: it is nested inside a lock on \
                     the same key that stores no records",
                ),
                Some(&key),
            ));
        }
        let token = guard.fencing_token();
        req.extensions_mut().insert(guard.clone());
        let mut res = guard.scope(inner.call(req)).await?;
        if let Ok(token) = token {
            res.headers_mut()
                .insert(c.header.clone(), HeaderValue::from(token.get()));
        }
        let _ = guard.release().await;
        return Ok(res.map(|b| ResponseBody::inner(b, None)));
    }
    // An unfenced lock (its store mints no tokens) shows no token anywhere:
    // no extension, no header.
    let token = guard.fencing_token().ok();
    req.extensions_mut().insert(guard.clone());
    if let Some(token) = token {
        req.extensions_mut().insert(token);
    }
    if c.idempotency.is_some() {
        req.extensions_mut().insert(IdempotentHold(key.clone()));
    }

    // 3. The service, under the lock (and in its scope, so that the handler
    // re-enters when it asks the locker for the same key).
    let fut = guard.scope(inner.call(req));
    let res = match c.on_lock_lost {
        OnLockLost::KeepRunning => fut.await,
        OnLockLost::Abort => {
            tokio::select! {
                res = fut => res,
                _ = guard.lost() => {
                    let lost = Error::LockLost { key: key.clone() };
                    tracing::warn!(key = %key, fencing_token = token.map(FencingToken::get), "lock lost; handler aborted");
                    let _ = guard.release().await;
                    return Ok(problem(Problem::from_error(&lost, c.contention)));
                }
            }
        }
    };
    let mut res = match res {
        Ok(res) => res,
        Err(e) => {
            let _ = guard.release().await;
            return Err(e);
        }
    };
    if let Some(token) = token {
        res.headers_mut()
            .insert(c.header.clone(), HeaderValue::from(token.get()));
    }

    // 4. Record the outcome (idempotency), then release before the response
    // leaves (so a client that got an answer finds the lock free), or when
    // the body ends.
    if c.idempotency.is_some() && guard.is_given_back() {
        // The handler released (or finished) the lock itself: it chose not
        // to leave this response as the key's outcome (see `Idempotency`).
        tracing::debug!(
            key = %key,
            "the handler released the lock itself: its response is not stored, \
             and a duplicate runs the handler again"
        );
    } else if let Some(idem) = &c.idempotency
        && res.extensions().get::<Refusal>().is_none()
        && (idem.store_when)(res.status())
    {
        return Ok(finish(idem, guard, res, fingerprint).await);
    }
    if c.hold_until_body_end {
        Ok(res.map(|b| ResponseBody::inner(b, Some(guard))))
    } else {
        let _ = guard.release().await;
        Ok(res.map(|b| ResponseBody::inner(b, None)))
    }
}

/// Reads a body key's or fingerprint's body: `Content-Length` first, then a
/// limited read.
async fn read_body<B>(parts: &http::request::Parts, body: B, limit: usize) -> Result<Bytes, Problem>
where
    B: http_body::Body,
    B::Error: Into<BoxError>,
{
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large(limit));
    }
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => Err(too_large(limit)),
        Err(_) => Err(Problem::new(
            StatusCode::BAD_REQUEST,
            "the request body could not be read",
        )),
    }
}

fn too_large(limit: usize) -> Problem {
    Problem::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("the request body is larger than the {limit} bytes read to find its lock key"),
    )
}

pub(super) fn reject<B>(p: Problem, key: Option<&LockKey>) -> Response<ResponseBody<B>> {
    let p = if key.is_some() { p.key(key) } else { p };
    crate::observe::refused(p.status().as_u16());
    tracing::debug!(
        status = p.status().as_u16(),
        key = p.lock_key().unwrap_or("-"),
        detail = %p.detail(),
        "request refused by the lock layer"
    );
    problem(p)
}
