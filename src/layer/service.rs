//! The `Lock` service: what happens to each request, in four steps — find
//! the key, take the lock, run the service, complete — each of which may
//! refuse the request with a [`Problem`]; [`refuse`] is the one place that
//! turns a refusal into the answer.

use std::sync::Arc;
use std::task::{Context, Poll};

use axum::extract::MatchedPath;
use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use tower_service::Service;

use super::body::ResponseBody;
use super::config::{Config, OnLockLost, OnMissingKey, OnStoreError};
use super::future::ResponseFuture;
use super::handoff::{RecordSpec, Slot};
use super::idempotency::{Fingerprint, Record};
use super::key::route_namespace;
use super::problem::{Problem, ProblemKind};
use super::replay::{finish, replay};
use crate::engine::{Acquired, LockGuard, MultiGuard};
use crate::error::{BoxError, Chain, Error};
use crate::key::LockKey;
use crate::store::{LockStore, OperatorStore, RwMode};
use crate::token::FencingToken;

/// Namespace used when no namespace is set and no route matched.
const FALLBACK_NAMESPACE: &str = "http";

/// Marks a request whose lock was taken by an idempotent layer (which
/// checks and stores the record of `key`).
#[derive(Clone)]
struct IdempotentHold(LockKey);

/// The service made by [`LockLayer`](crate::LockLayer).
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
            let c = &*config;
            match steps(c, inner, req).await {
                Ok(res) => Ok(res),
                Err(Exit::Refused(p)) => Ok(refuse(c, p).await),
                Err(Exit::Failed(e)) => Err(e),
            }
        })
    }
}

/// How a request leaves the steps early: refused by the layer, or failed
/// in the inner service (its error is the service's own).
enum Exit<E> {
    Refused(Problem),
    Failed(E),
}

impl<E> From<Problem> for Exit<E> {
    fn from(p: Problem) -> Self {
        Exit::Refused(p)
    }
}

/// Left on every answer [`refuse`] gives, whatever its final status or body
/// (the user's hook may pick any): an idempotent layer around this one
/// never stores it as a request's final answer. A refusal (contention, the
/// store unavailable, a bad key) says nothing about the request's outcome;
/// stored, it would answer every later delivery for the whole retention,
/// and the event would never run.
#[derive(Clone, Copy)]
struct Refusal;

/// Largest body of a rejection hook's answer.
const MAX_HOOK_BODY: usize = 64 << 10;

/// Every refusal of the layer ends here: counted, logged at DEBUG, and
/// answered by the user's rejection hook or the default problem body (with
/// the lock key if the layer exposes it), marked as a [`Refusal`].
async fn refuse<St, B>(c: &Config<St>, p: Problem) -> Response<ResponseBody<B>> {
    crate::observe::refused(p.status().as_u16());
    tracing::debug!(
        status = p.status().as_u16(),
        key = p.lock_key().unwrap_or("-"),
        detail = %p.detail(),
        "request refused by the lock layer"
    );
    let mut res = answer(c, &p).await;
    res.extensions_mut().insert(Refusal);
    res
}

/// A refusal's answer: the hook's, or the default problem body.
async fn answer<St, B>(c: &Config<St>, p: &Problem) -> Response<ResponseBody<B>> {
    if let Some(hook) = &c.on_rejection {
        let (mut parts, body) = hook(p).into_parts();
        // What the protocol needs survives any hook: a client told to
        // come back is told when.
        if let Some(after) = p.retry_after_header()
            && !parts.headers.contains_key(header::RETRY_AFTER)
        {
            parts.headers.insert(header::RETRY_AFTER, after);
        }
        match axum::body::to_bytes(body, MAX_HOOK_BODY).await {
            Ok(bytes) => return Response::from_parts(parts, ResponseBody::full(bytes)),
            Err(e) => tracing::error!(
                error = %e,
                "the lock layer's rejection hook gave a body that failed or is over 64 KiB; \
                 answering the default problem instead"
            ),
        }
    }
    let with_key = c.expose_lock_key && p.lock_key().is_some();
    p.response(ResponseBody::full(p.body(with_key)))
}

async fn run_unlocked<S, ReqBody, ResBody>(
    mut inner: S,
    req: Request<ReqBody>,
) -> Result<Response<ResponseBody<ResBody>>, Exit<S::Error>>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    match inner.call(req).await {
        Ok(res) => Ok(res.map(|b| ResponseBody::inner(b, None))),
        Err(e) => Err(Exit::Failed(e)),
    }
}

/// The request's way through the layer.
async fn steps<S, St, ReqBody, ResBody>(
    c: &Config<St>,
    inner: S,
    req: Request<ReqBody>,
) -> Result<Response<ResponseBody<ResBody>>, Exit<S::Error>>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    St: LockStore,
    ReqBody: http_body::Body + From<Bytes>,
    ReqBody::Error: Into<BoxError>,
    ResBody: http_body::Body<Data = Bytes>,
{
    // 1. The key (and the fingerprint).
    let (req, key, fingerprint) = match find_key(c, req).await? {
        Keyed::Key(req, key, fingerprint) => (req, key, fingerprint),
        Keyed::Unlocked(req) => return run_unlocked(inner, req).await,
    };
    // 2. The lock, or the completed record. An enclosing lock layer's guard
    // in the request (or a multi-key layer's) is the scope the locker
    // decides re-entry in (the same task-local check as for a handler that
    // asks the locker itself), so a request handed to another task, with
    // its extensions, still re-enters instead of waiting for its own lock.
    let parents = Parents::of(req.extensions());
    let mode = c.rw.as_ref().map(|m| m.of(req.method()));
    let guard = match take(c, &key, mode, &parents, fingerprint).await? {
        Taken::Locked(guard) => guard,
        Taken::Replayed(res) => return Ok(*res),
        Taken::FailedOpen => return run_unlocked(inner, req).await,
    };
    if parents.granted(&guard) {
        return reentered(c, inner, req, guard, &key).await;
    }
    // 3. The service, under the lock. A handler may take the lock over
    // for background work (`HandOff`): then the lock and the record are
    // the work's, and the layer neither stores nor releases anything.
    let held_from = tokio::time::Instant::now();
    let slot = Slot::new(&guard, record_spec(c, fingerprint));
    let res = run(c, inner, req, &guard, &key, &slot).await?;
    if slot.handed_off() {
        tracing::debug!(key = %key, status = res.status().as_u16(), "lock handed off to background work; answered without releasing it");
        // Marked, so that an enclosing idempotent layer does not store
        // this interim answer as its key's outcome either.
        let mut res = res;
        res.extensions_mut().insert(HandedOffBelow);
        return Ok(res.map(|b| ResponseBody::inner(b, None)));
    }
    // 4. Its outcome stored (idempotency), and the lock released. How long
    // that took tells later contenders when to come back.
    // (A body held under the lock notes its hold when it ends.)
    let res = complete(c, guard, res, &key, fingerprint, held_from).await?;
    if !c.hold_until_body_end {
        c.holds.saw(held_from.elapsed());
    }
    Ok(res)
}

/// In a response's extensions: a lock layer handed its request's lock off
/// to background work (see `HandOff`).
#[derive(Clone, Copy, Debug)]
struct HandedOffBelow;

/// What step 1 found.
enum Keyed<B> {
    Key(Request<B>, LockKey, Option<[u8; 32]>),
    /// No key, and the layer passes such requests through.
    Unlocked(Request<B>),
}

/// Step 1: the lock key, and the request fingerprint. The body is read
/// only when the key or the fingerprint needs it, and never past the limit.
async fn find_key<St, B>(c: &Config<St>, req: Request<B>) -> Result<Keyed<B>, Problem>
where
    B: http_body::Body + From<Bytes>,
    B::Error: Into<BoxError>,
{
    let (mut parts, body) = req.into_parts();
    let fingerprint = c
        .idempotency
        .as_ref()
        .map_or(Fingerprint::None, |i| i.fingerprint);
    let fingerprint_body = fingerprint != Fingerprint::None;
    let (id, body, fingerprint) = if let Err(refused) = c.key.check_head(&parts.headers) {
        (Err(refused), body, None)
    } else if c.key.needs_body() || fingerprint_body {
        let bytes = read_body(&parts, body, c.body_limit).await?;
        let id = if c.key.needs_body() {
            c.key.id_in_body(&bytes)
        } else {
            c.key.id_in_head(&mut parts).await
        };
        let fingerprint = fingerprint.of(&bytes);
        (id, B::from(bytes), fingerprint)
    } else {
        (c.key.id_in_head(&mut parts).await, body, None)
    };
    // The client the key belongs to, when keys are scoped per client.
    let scope = match c.idempotency.as_ref().and_then(|i| i.scope.as_ref()) {
        Some(principal) => Some(principal.id_in_head(&mut parts).await),
        None => None,
    };
    let req = Request::from_parts(parts, body);
    // Never guess which id the handler will act on (a source given twice, a
    // dot segment, a stray `%`, a value the handler's extractor refuses…),
    // whatever `OnMissingKey` says.
    let id = id.map_err(|refused| {
        Problem::new(
            refused.status(),
            format!("{refused}: expected {}", c.key.describe()),
        )
        .of_kind(ProblemKind::BadKey)
    })?;
    let Some(id) = id else {
        return match c.on_missing_key {
            OnMissingKey::PassThrough => Ok(Keyed::Unlocked(req)),
            OnMissingKey::Reject => Err(no_key(c, &req)),
        };
    };
    let id = match scope {
        None => id,
        Some(Ok(Some(principal))) => scoped(&principal, &id),
        Some(Ok(None)) => {
            return Err(Problem::new(
                StatusCode::BAD_REQUEST,
                "the request has no client to scope its idempotency key to",
            )
            .of_kind(ProblemKind::MissingScope));
        }
        Some(Err(refused)) => {
            return Err(Problem::new(
                refused.status(),
                format!("{refused}: the client scope cannot be read"),
            )
            .of_kind(ProblemKind::MissingScope));
        }
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
    let key = LockKey::new(&namespace, &id[..])
        .map_err(|e| Problem::from_error(&e.into(), c.contention))?;
    Ok(Keyed::Key(req, key, fingerprint))
}

/// A client's id: `<length of the principal>:<principal>:<id>`. The length
/// makes the split one way only, so two (principal, id) pairs never share
/// an id, whatever bytes either holds.
fn scoped(principal: &[u8], id: &[u8]) -> Vec<u8> {
    let mut out = format!("{}:", principal.len()).into_bytes();
    out.extend_from_slice(principal);
    out.push(b':');
    out.extend_from_slice(id);
    out
}

/// The 400 for a request without a key. A path-parameter key on a request
/// that matched no route means the layer sits outside routing (around a
/// whole `Router`, or on its fallback), where no path parameter exists:
/// said once in the log, and never a pass-through of its own (the inner
/// service may be a whole router whose handlers would run unlocked).
fn no_key<St, B>(c: &Config<St>, req: &Request<B>) -> Problem {
    let routed = req.extensions().get::<MatchedPath>().is_some();
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
    Problem::new(StatusCode::BAD_REQUEST, detail).of_kind(ProblemKind::MissingKey)
}

/// The holds of the layers around this one, as the request carries them:
/// a lock layer's guard, a multi-key layer's guard.
struct Parents {
    lock: Option<LockGuard>,
    multi: Option<MultiGuard>,
}

impl Parents {
    fn of(extensions: &http::Extensions) -> Self {
        Parents {
            lock: extensions.get::<LockGuard>().cloned(),
            multi: extensions.get::<MultiGuard>().cloned(),
        }
    }

    /// Runs `fut` in their scopes (they never share a key: a multi-key
    /// grant inside a lock's scope of one of its keys is refused, and a
    /// lock of one of a multi-key grant's keys inside its scope re-enters).
    async fn scope<F: Future>(&self, fut: F) -> F::Output {
        match (&self.lock, &self.multi) {
            (Some(lock), Some(multi)) => lock.scope(multi.scope(fut)).await,
            (Some(lock), None) => lock.scope(fut).await,
            (None, Some(multi)) => multi.scope(fut).await,
            (None, None) => fut.await,
        }
    }

    /// Whether `guard` re-entered one of their grants.
    fn granted(&self, guard: &LockGuard) -> bool {
        self.lock.as_ref().is_some_and(|p| p.same_grant(guard))
            || self.multi.as_ref().is_some_and(|m| m.has_grant(guard))
    }
}

/// What step 2 found.
enum Taken<B> {
    Locked(LockGuard),
    /// A completed request's stored answer.
    Replayed(Box<Response<ResponseBody<B>>>),
    /// The store failed, and the layer runs such requests unlocked.
    FailedOpen,
}

/// Step 2: the lock, or the completed record.
async fn take<St: LockStore, B>(
    c: &Config<St>,
    key: &LockKey,
    mode: Option<RwMode>,
    parents: &Parents,
    fingerprint: Option<[u8; 32]>,
) -> Result<Taken<B>, Problem> {
    let take = async {
        if let Some(mode) = mode {
            return super::rwlock::take_rw(&c.locker, key, mode)
                .await
                .map(Acquired::Locked);
        }
        match (&c.idempotency, c.permits) {
            (_, Some(permits)) => match c.locker.semaphore(key, permits) {
                Ok(sem) => sem.acquire().await.map(Acquired::Locked),
                Err(e) => Err(e),
            },
            (Some(_), None) => c.locker.acquire_or_replay(key).await,
            (None, None) => c.locker.acquire(key).await.map(Acquired::Locked),
        }
    };
    let taken = parents.scope(take).await;
    // The engine hands back the stored bytes; the record codec is ours.
    let taken = match taken {
        Ok(Acquired::Locked(guard)) => Ok(guard),
        Ok(Acquired::Completed(raw)) => match Record::decode(raw) {
            Some(record) => {
                return replay(record, fingerprint, key).map(|res| Taken::Replayed(Box::new(res)));
            }
            None => Err(Error::Record {
                key: key.clone(),
                reason: "the stored record is not in a format this version reads",
            }),
        },
        Err(e) => Err(e),
    };
    match taken {
        Ok(guard) => Ok(Taken::Locked(guard)),
        Err(e) if e.is_store_failure() && c.on_store_error == OnStoreError::FailOpen => {
            tracing::warn!(key = %key, error = %Chain(&e), "lock store failed; running unlocked (fail-open)");
            Ok(Taken::FailedOpen)
        }
        Err(e) => {
            if e.is_store_failure() {
                // The outage itself is logged once by the locker, when it
                // starts and when it ends; each request it refuses, here.
                tracing::debug!(key = %key, error = %Chain(&e), "lock store failed; answering 503");
            }
            let mut p = Problem::from_error(&e, c.contention).key(Some(key));
            if c.permits.is_some() && e.is_contended() {
                p = p.with_detail(match e {
                    Error::WaitTimeout { .. } => {
                        "too many requests for this resource ran at once for the whole wait; \
                         retry later"
                    }
                    _ => "too many requests for this resource are running at once; retry later",
                });
            }
            Err(match e {
                Error::Contended { retry_after, .. } | Error::WaitTimeout { retry_after, .. } => {
                    let p = p.with_retry_after(c.contention_retry(retry_after));
                    if let Some(view) = &c.expose_holder {
                        // Opted in: who holds it, if the store says.
                        p.with_holder(OperatorStore::inspect(view, key).await.ok().flatten())
                    } else {
                        p
                    }
                }
                _ => p,
            })
        }
    }
}

/// Steps 3 and 4 for a re-entered lock: one more hold on the enclosing
/// layer's grant (nested locked routes or services on the same key and
/// store; or a multi-key layer around this one, one of whose keys this
/// is). The handler finds this hold as its `LockGuard` and its token as its
/// `FencingToken` (the enclosing grant's token of the key); the response's
/// token header is the outer layer's to set. The record, if any, is the
/// outer layer's to store — so an idempotent layer re-enters only a lock
/// taken by an idempotent layer: under any other (a multi-key layer stores
/// none), no record would be checked or stored and every duplicate would
/// run again.
async fn reentered<S, St, ReqBody, ResBody>(
    c: &Config<St>,
    mut inner: S,
    mut req: Request<ReqBody>,
    guard: LockGuard,
    key: &LockKey,
) -> Result<Response<ResponseBody<ResBody>>, Exit<S::Error>>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    if c.idempotency.is_some()
        && req
            .extensions()
            .get::<IdempotentHold>()
            .is_none_or(|held| held.0 != *key)
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
        return Err(Problem::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the idempotent lock layer is misconfigured: it is nested inside a lock on \
             the same key that stores no records",
        )
        .key(Some(key))
        .of_kind(ProblemKind::Misconfigured)
        .into());
    }
    let token = guard.fencing_token();
    req.extensions_mut().insert(guard.clone());
    if let Ok(token) = token {
        req.extensions_mut().insert(token);
    }
    let res = guard.scope(inner.call(req)).await;
    let _ = guard.release().await;
    let mut res = res.map_err(Exit::Failed)?;
    if let Ok(token) = token {
        res.headers_mut()
            .insert(c.header.clone(), HeaderValue::from(token.get()));
    }
    Ok(res.map(|b| ResponseBody::inner(b, None)))
}

/// What a handed-off request's worker needs to store the record as this
/// layer would (`None` without idempotency).
fn record_spec<St>(c: &Config<St>, fingerprint: Option<[u8; 32]>) -> Option<RecordSpec> {
    c.idempotency.as_ref().map(|idem| RecordSpec {
        fingerprint,
        retention: idem.retention,
        max_body: idem.max_body,
        headers: idem.headers.clone(),
        fencing_header: c.header.clone(),
    })
}

/// Step 3: the service, with the guard and the token in the request, in the
/// guard's scope (so that the handler re-enters when it asks the locker for
/// the same key); its response gets the `Fencing-Token` header. An unfenced
/// lock (its store mints no tokens) shows no token anywhere.
async fn run<S, St, ReqBody, ResBody>(
    c: &Config<St>,
    mut inner: S,
    mut req: Request<ReqBody>,
    guard: &LockGuard,
    key: &LockKey,
    slot: &Slot,
) -> Result<Response<ResBody>, Exit<S::Error>>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    let token = guard.fencing_token().ok();
    req.extensions_mut().insert(guard.clone());
    req.extensions_mut().insert(slot.clone());
    if let Some(token) = token {
        req.extensions_mut().insert(token);
    }
    if c.idempotency.is_some() {
        req.extensions_mut().insert(IdempotentHold(key.clone()));
    }
    let fut = guard.scope(inner.call(req));
    let res = match c.on_lock_lost {
        OnLockLost::KeepRunning => fut.await,
        OnLockLost::Abort => {
            tokio::select! {
                res = fut => res,
                _ = guard.lost() => {
                    tracing::warn!(key = %key, fencing_token = token.map(FencingToken::get), "lock lost; handler aborted");
                    let _ = guard.clone().release().await;
                    let lost = Error::LockLost { key: key.clone() };
                    return Err(Problem::from_error(&lost, c.contention).into());
                }
            }
        }
    };
    let mut res = match res {
        Ok(res) => res,
        Err(e) => {
            // (A lock the service handed off before it failed is the
            // work's: left alone.)
            if !slot.handed_off() {
                let _ = guard.clone().release().await;
            }
            return Err(Exit::Failed(e));
        }
    };
    if let Some(token) = token {
        res.headers_mut()
            .insert(c.header.clone(), HeaderValue::from(token.get()));
    }
    Ok(res)
}

/// Step 4: the outcome stored with the release (idempotency), or the lock
/// released before the response leaves (so a client that got an answer
/// finds the lock free), or when its body ends.
async fn complete<St, B>(
    c: &Config<St>,
    guard: LockGuard,
    res: Response<B>,
    key: &LockKey,
    fingerprint: Option<[u8; 32]>,
    held_from: tokio::time::Instant,
) -> Result<Response<ResponseBody<B>>, Problem>
where
    B: http_body::Body<Data = Bytes>,
{
    if c.idempotency.is_some() && res.extensions().get::<HandedOffBelow>().is_some() {
        // A lock layer inside this one handed its lock off: this answer is
        // an interim one (a 202), the work's outcome is stored under the
        // inner key by the work. Nothing stored here, so that a retry after
        // work that failed (and released) runs again.
        tracing::debug!(
            key = %key,
            "a lock inside this one was handed off: the interim answer is not stored"
        );
    } else if c.idempotency.is_some() && guard.is_given_back() {
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
        return finish(idem, &c.header, guard, res, fingerprint).await;
    }
    if c.hold_until_body_end {
        Ok(res.map(|b| ResponseBody::inner(b, Some(guard)).held_from(&c.holds, held_from)))
    } else {
        let _ = guard.release().await;
        Ok(res.map(|b| ResponseBody::inner(b, None)))
    }
}

/// Reads a body key's or fingerprint's body: `Content-Length` first, then a
/// limited read.
pub(super) async fn read_body<B>(
    parts: &http::request::Parts,
    body: B,
    limit: usize,
) -> Result<Bytes, Problem>
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
        )
        .of_kind(ProblemKind::BodyUnreadable)),
    }
}

fn too_large(limit: usize) -> Problem {
    Problem::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("the request body is larger than the {limit} bytes read to find its lock key"),
    )
    .of_kind(ProblemKind::PayloadTooLarge)
}
