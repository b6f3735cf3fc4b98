//! `LockLayer` and its builder.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use axum::response::IntoResponse;
use http::{HeaderName, StatusCode};
use tower_layer::Layer;

use super::config::{
    Config, DEFAULT_BODY_LIMIT, FENCING_TOKEN, HoldTimes, OnLockLost, OnMissingKey, OnStoreError,
    RetryAfter,
};
use super::idempotency::Idempotency;
use super::key::KeyFrom;
use super::problem::Problem;
use super::service::Lock;
use crate::engine::Locker;
use crate::error::ConfigError;
use crate::store::LockStore;

/// Takes a lock per request before the inner service runs.
///
/// ```
/// use axum::{Router, routing::post};
/// use tower_redis_lock::{KeyFrom, LockGuard, LockLayer, Locker, MemoryStore};
///
/// async fn capture(guard: LockGuard) -> String {
///     format!("captured under fencing token {}", guard.fencing_token().unwrap())
/// }
///
/// // One locker for the app; each layer gets a clone.
/// let locker = Locker::new(MemoryStore::new());
/// let app: Router = Router::new().route(
///     "/orders/{id}/capture",
///     post(capture).route_layer(LockLayer::new(locker.clone(), KeyFrom::path_param::<u64>("id"))),
/// );
/// ```
///
/// Put the layer on the method router with `route_layer`, as above, so that
/// only the handled method is locked: a request with a wrong method gets its
/// 405 without taking (or waiting for) the lock. `Router::layer` locks the
/// routes too, but a 405 is then also answered under the lock, and a
/// request that matches no route reaches the layer without a route.
///
/// A layer outside routing (around a whole `Router`, or reached by a
/// request that matched no route) sees no path parameters: with
/// [`KeyFrom::path_param`] it never runs the inner service unlocked, but
/// answers [`OnMissingKey`] (400 by default, saying that the layer should be
/// a `route_layer`) and logs the misplacement once, at error level. Its
/// default namespace is the matched route; without one, a layer with no
/// [`namespace`](LockLayerBuilder::namespace) puts every key in the
/// namespace `http` (requests of different routes with the same id then
/// exclude each other), and an idempotent one refuses with 500 rather than
/// let one route's record answer another's request.
///
/// Per request: find the key (400 if missing; body keys within the body
/// limit, 413 past it) → acquire (409 or 423 with `Retry-After` on
/// contention, 503 when the store fails) → put the [`LockGuard`](crate::LockGuard)
/// and [`FencingToken`](crate::FencingToken) into the request extensions →
/// run the service → add the `Fencing-Token` header → release before the
/// response is handed on (or when its body ends). Every refusal is an
/// `application/problem+json` answer; `Service::Error` stays the inner
/// service's.
pub struct LockLayer<St> {
    config: Arc<Config<St>>,
}

impl<St> Clone for LockLayer<St> {
    fn clone(&self) -> Self {
        LockLayer {
            config: self.config.clone(),
        }
    }
}

impl<St> std::fmt::Debug for LockLayer<St> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let c = &self.config;
        f.debug_struct("LockLayer")
            .field("locker", &c.locker)
            .field("key", &c.key)
            .field("namespace", &c.namespace)
            .field("contention", &c.contention)
            .field("header", &c.header)
            .field("body_limit", &c.body_limit)
            .field("on_store_error", &c.on_store_error)
            .field("on_lock_lost", &c.on_lock_lost)
            .field("on_missing_key", &c.on_missing_key)
            .field("hold_until_body_end", &c.hold_until_body_end)
            .field("idempotency", &c.idempotency)
            .field("expose_lock_key", &c.expose_lock_key)
            .field("on_rejection", &c.on_rejection.as_ref().map(|_| ".."))
            .finish()
    }
}

impl<St: LockStore> LockLayer<St> {
    /// A layer over `locker` with the layer's defaults: fail closed, keep
    /// running on loss, 409 on contention, 400 on a missing key, 1 MiB body
    /// limit, namespace = the matched route (see
    /// [`namespace`](LockLayerBuilder::namespace)). The lease, wait timeout
    /// and hold cap are the locker's.
    ///
    /// Give every layer of an app a clone of one [`Locker`]: a locker runs
    /// one watchdog task, and a [`RedisStore`](crate::RedisStore) keeps one
    /// command connection and one pub/sub connection, shared by its clones.
    /// A locker per route multiplies them.
    ///
    /// # Panics
    ///
    /// If the settings are refused, as [`LockLayerBuilder::build`] would
    /// refuse them (with the layer's defaults, only a locker wait timeout
    /// over 24 h): use the builder to get the [`ConfigError`] instead.
    pub fn new(locker: Locker<St>, key: KeyFrom) -> Self {
        match Self::builder(locker, key).build() {
            Ok(layer) => layer,
            Err(e) => panic!("LockLayer::new: {e}"),
        }
    }

    /// A builder over `locker`, for the layer's settings.
    pub fn builder(locker: Locker<St>, key: KeyFrom) -> LockLayerBuilder<St> {
        LockLayerBuilder {
            config: Config {
                locker,
                key,
                namespace: None,
                contention: StatusCode::CONFLICT,
                contention_set: false,
                permits: None,
                rw: None,
                header: FENCING_TOKEN,
                body_limit: DEFAULT_BODY_LIMIT,
                on_store_error: OnStoreError::default(),
                on_lock_lost: OnLockLost::default(),
                on_missing_key: OnMissingKey::default(),
                hold_until_body_end: false,
                idempotency: None,
                expose_lock_key: false,
                expose_holder: None,
                on_rejection: None,
                retry_after: RetryAfter::default(),
                holds: HoldTimes::for_policy(RetryAfter::default()),
                misplaced_logged: AtomicBool::new(false),
            },
        }
    }

    /// The locker behind the layer.
    pub fn locker(&self) -> &Locker<St> {
        &self.config.locker
    }
}

impl<S, St> Layer<S> for LockLayer<St> {
    type Service = Lock<S, St>;

    fn layer(&self, inner: S) -> Self::Service {
        Lock::new(inner, self.config.clone())
    }
}

/// Builds a [`LockLayer`]; [`build`](LockLayerBuilder::build) checks the
/// settings.
#[must_use = "a builder does nothing until `build` is called"]
pub struct LockLayerBuilder<St> {
    config: Config<St>,
}

impl<St> std::fmt::Debug for LockLayerBuilder<St> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockLayerBuilder")
            .field("key", &self.config.key)
            .finish_non_exhaustive()
    }
}

impl<St: LockStore> LockLayerBuilder<St> {
    /// Namespace of the keys: 1 to 64 bytes of `A-Z a-z 0-9 _ - . /`. A
    /// lock's key is `namespace:id`; give two layers the same namespace to
    /// make their routes exclude each other on purpose.
    ///
    /// **Default: the matched route template**, with its leading `/`
    /// dropped and every byte outside that set turned into `_` (over 64
    /// bytes: the first 47, `.` and 16 hex digits of its SHA-256):
    /// `/orders/{id}/capture` gives `orders/_id_/capture`, so the request
    /// `/orders/42/capture` locks `orders/_id_/capture:42`. Two routes never
    /// share locks by accident — but renaming a route, or its parameter,
    /// changes every key. During a rolling deploy the old and new instances
    /// would then not exclude each other. Set a namespace for anything that
    /// must hold across deploys.
    ///
    /// An [idempotent](LockLayerBuilder::idempotent) layer must have one:
    /// its records outlive deploys, and a record found under a changed
    /// namespace would be missed (the event would run again).
    pub fn namespace(mut self, namespace: &str) -> Self {
        self.config.namespace = Some(namespace.to_owned());
        self
    }

    /// The `Retry-After` of a request refused because another request holds
    /// the lock (default [`RetryAfter::Observed`]: how long this layer's
    /// requests have held their lock lately, at most the holder's remaining
    /// lease).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redis_lock::{KeyFrom, LockLayer, Locker, MemoryStore, RetryAfter};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let layer = LockLayer::builder(Locker::new(MemoryStore::new()), KeyFrom::path_param::<u64>("id"))
    ///     .retry_after(RetryAfter::Fixed(Duration::from_secs(5)))
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok(())
    /// # }
    /// ```
    pub fn retry_after(mut self, policy: RetryAfter) -> Self {
        self.config.retry_after = policy;
        self.config.holds = HoldTimes::for_policy(policy);
        self
    }

    /// Status on contention: 409 Conflict (default) or 423 Locked; with a
    /// [`concurrency_limit`](LockLayerBuilder::concurrency_limit), 429 Too
    /// Many Requests (its default), 409, 423 or 503.
    pub fn contention_status(mut self, status: StatusCode) -> Self {
        self.config.contention = status;
        self.config.contention_set = true;
        self
    }

    /// Makes the layer a concurrency limit across every instance of the
    /// service: at most `permits` requests per key run at once ("at most 4
    /// exports per tenant"), each holding a permit of the key's
    /// [`Semaphore`](crate::Semaphore) instead of its lock. Everything else
    /// is as for the lock: the key, the wait (the locker's wait timeout),
    /// the lease renewed while the handler runs, the `LockGuard` and the
    /// fencing token (each permit has its own, rising per key) in the
    /// request, the release when the response is ready (or its body ends).
    ///
    /// | answer | when |
    /// |---|---|
    /// | the handler's | a permit was free, or freed within the wait |
    /// | 429 Too Many Requests (or the [`contention_status`](LockLayerBuilder::contention_status)), `Retry-After`, problem+json | every permit stayed held for the whole wait |
    /// | 503, `Retry-After`, problem+json | the store failed (unless [`OnStoreError::FailOpen`]) |
    /// | 400 | no key, or a key the handler would refuse |
    ///
    /// `permits` is 1 to 65,536 (checked by [`build`](LockLayerBuilder::build));
    /// every instance should use the same number (each request counts the
    /// permits held against its own layer's). Not with
    /// [`idempotent`](LockLayerBuilder::idempotent), which needs one request
    /// per key. The store must have semaphores: the memory and Redis stores
    /// do; [`RedlockStore`](crate::RedlockStore) answers every request 500
    /// (a misconfiguration).
    ///
    /// ```
    /// use std::time::Duration;
    /// use axum::{Router, routing::post};
    /// use tower_redis_lock::{KeyFrom, LockLayer, Locker, MemoryStore};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let locker = Locker::builder(MemoryStore::new())
    ///     .wait_timeout(Duration::from_millis(200))
    ///     .build()?;
    /// let exports = LockLayer::builder(locker, KeyFrom::path_param::<String>("tenant"))
    ///     .namespace("exports")
    ///     .concurrency_limit(4)
    ///     .build()?;
    /// let app: Router = Router::new().route(
    ///     "/tenants/{tenant}/export",
    ///     post(|| async { "exported" }).route_layer(exports),
    /// );
    /// # let _ = app;
    /// # Ok(())
    /// # }
    /// ```
    pub fn concurrency_limit(mut self, permits: u32) -> Self {
        self.config.permits = Some(permits);
        self
    }

    /// Makes the layer a reader-writer lock across every instance of the
    /// service: requests with a safe method (GET, HEAD, OPTIONS, TRACE)
    /// take the key's [`ReadWriteLock`](crate::ReadWriteLock) shared, and
    /// run side by side; every other method takes it exclusive, alone.
    /// Writer-preferring: a write request that waits stops new reads, so a
    /// stream of reads cannot starve it. Everything else is as for the
    /// lock: the key, the wait (the locker's wait timeout), the lease
    /// renewed while the handler runs, the `LockGuard` in the request, the
    /// fencing token (a write's own; a read carries the last write's
    /// epoch), the release when the response is ready (or its body ends).
    /// [`read_write_by`](LockLayerBuilder::read_write_by) maps methods
    /// otherwise.
    ///
    /// | answer | when |
    /// |---|---|
    /// | the handler's | the lock was free for the request's side, or freed within the wait |
    /// | 409 Conflict (or 423, the [`contention_status`](LockLayerBuilder::contention_status)), `Retry-After`, problem+json | a writer (for a read: or a waiting writer), or for a write any reader, held it for the whole wait |
    /// | 503, `Retry-After`, problem+json | the store failed (unless [`OnStoreError::FailOpen`]) |
    /// | 400 | no key, or a key the handler would refuse |
    /// | 500 | a write request nested in a read layer of the same key (no upgrade), or a store without reader-writer locks ([`RedlockStore`](crate::RedlockStore)) |
    ///
    /// Not with [`concurrency_limit`](LockLayerBuilder::concurrency_limit)
    /// or [`idempotent`](LockLayerBuilder::idempotent) (refused by
    /// [`build`](LockLayerBuilder::build)).
    ///
    /// ```
    /// use axum::{Router, routing::get};
    /// use tower_redis_lock::{KeyFrom, LockLayer, Locker, MemoryStore};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let locker = Locker::new(MemoryStore::new());
    /// let docs = LockLayer::builder(locker, KeyFrom::path_param::<String>("doc"))
    ///     .namespace("docs")
    ///     .read_write()
    ///     .build()?;
    /// let app: Router = Router::new().route(
    ///     "/docs/{doc}",
    ///     get(|| async { "read side by side" })
    ///         .put(|| async { "written alone" })
    ///         .route_layer(docs),
    /// );
    /// # let _ = app;
    /// # Ok(())
    /// # }
    /// ```
    pub fn read_write(mut self) -> Self {
        self.config.rw = Some(super::rwlock::ModeOf::safe_methods_read());
        self
    }

    /// As [`read_write`](LockLayerBuilder::read_write), with the side of
    /// each method as `mode_of` says: e.g. a `POST` that only queries
    /// (`/search`) taken shared.
    ///
    /// ```
    /// use http::Method;
    /// use tower_redis_lock::{KeyFrom, LockLayer, Locker, MemoryStore, RwMode};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let locker = Locker::new(MemoryStore::new());
    /// let layer = LockLayer::builder(locker, KeyFrom::path_param::<String>("doc"))
    ///     .read_write_by(|m: &Method| match *m {
    ///         Method::GET | Method::HEAD | Method::POST => RwMode::Read,
    ///         _ => RwMode::Write,
    ///     })
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok(())
    /// # }
    /// ```
    pub fn read_write_by(
        mut self,
        mode_of: impl Fn(&http::Method) -> crate::store::RwMode + Send + Sync + 'static,
    ) -> Self {
        self.config.rw = Some(super::rwlock::ModeOf::by(mode_of));
        self
    }

    /// Name of the fencing-token response header (default
    /// [`FENCING_TOKEN`], `fencing-token`).
    pub fn fencing_header(mut self, name: HeaderName) -> Self {
        self.config.header = name;
        self
    }

    /// Largest body read to find a body key (default 1 MiB); larger bodies
    /// get 413 without being read past the limit.
    pub fn body_limit(mut self, limit: usize) -> Self {
        self.config.body_limit = limit;
        self
    }

    /// Fail closed (default) or open when the store fails.
    pub fn on_store_error(mut self, policy: OnStoreError) -> Self {
        self.config.on_store_error = policy;
        self
    }

    /// Keep running (default) or abort when the lock is lost mid-request.
    pub fn on_lock_lost(mut self, policy: OnLockLost) -> Self {
        self.config.on_lock_lost = policy;
        self
    }

    /// Reject with 400 (default) or pass through requests without a key,
    /// including every request of a path-parameter layer that sits outside
    /// routing (see [`LockLayer`]): `PassThrough` runs those unlocked.
    pub fn on_missing_key(mut self, policy: OnMissingKey) -> Self {
        self.config.on_missing_key = policy;
        self
    }

    /// Keep the lock until the response body has been sent (for streaming
    /// responses) instead of releasing it when the response head is ready.
    pub fn hold_until_body_end(mut self, hold: bool) -> Self {
        self.config.hold_until_body_end = hold;
        self
    }

    /// Turns on idempotent processing: a completed request's response is
    /// stored with the release, and duplicates get it replayed (see
    /// [`Idempotency`]). A duplicate that arrives while the first is running
    /// gets 409 — or, with a locker wait timeout, waits for the record (for
    /// senders such as GitHub that do not retry by themselves).
    pub fn idempotent(mut self, idempotency: Idempotency) -> Self {
        self.config.idempotency = Some(idempotency);
        self
    }

    /// Answers every request the layer refuses (400, 409/423, 413, 422,
    /// 500, 503…) with `hook`'s response instead of the default
    /// `application/problem+json` one, so that a route's own errors and the
    /// lock's come out in one format. The hook gets the [`Problem`] the
    /// layer would have answered: status, detail, `Retry-After`, the lock
    /// key (for logs or a body of your own) and why
    /// ([`Problem::kind`](crate::Problem::kind)). Keep the status unless you
    /// mean to change what clients do; the problem's `Retry-After` is sent
    /// whatever the hook answers (added when the hook's answer has none). The hook's
    /// body is read whole before it is sent (at most 64 KiB; a longer or
    /// failing one is replaced by the default answer, with an error log).
    ///
    /// ```
    /// use axum::{Json, Router, routing::post};
    /// use tower_redis_lock::{KeyFrom, LockLayer, Locker, MemoryStore, Problem};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let layer = LockLayer::builder(Locker::new(MemoryStore::new()), KeyFrom::path_param::<String>("id"))
    ///     .namespace("orders")
    ///     .on_rejection(|p: &Problem| {
    ///         (p.status(), Json(serde_json::json!({ "error": p.detail() })))
    ///     })
    ///     .build()?;
    /// let app: Router = Router::new().route("/orders/{id}", post(|| async { "ok" }).route_layer(layer));
    /// # let _ = app;
    /// # Ok(())
    /// # }
    /// ```
    pub fn on_rejection<F, R>(mut self, hook: F) -> Self
    where
        F: Fn(&Problem) -> R + Send + Sync + 'static,
        R: IntoResponse,
    {
        self.config.on_rejection = Some(Arc::new(move |p| hook(p).into_response()));
        self
    }

    /// Puts the lock key (`namespace:id`, in its log-safe form) in the
    /// default problem body as `lock_key` (default: off). The key names the
    /// namespace (by default the route template) and the id as the server
    /// spells them; useful while debugging a client, not something to show
    /// every client. It is always in the layer's logs.
    pub fn expose_lock_key(mut self, expose: bool) -> Self {
        self.config.expose_lock_key = expose;
        self
    }

    /// On contention (409, or 423), adds who holds the lock to the
    /// problem body as `holder`: `{"id": <opaque holder id>, "label":
    /// <the holder's label or null>}` (see
    /// [`Locker::inspect`](crate::Locker::inspect)), and to the
    /// [`Problem`](crate::Problem) a rejection hook sees. Default: off.
    /// It tells a client about another client's request (its label names
    /// a host or a request id): turn it on for internal callers only. It
    /// costs one more store call per refused request; a failed look leaves
    /// the member out.
    ///
    /// The store must keep the operator's view ([`OperatorStore`]): every
    /// store of this crate does.
    ///
    /// [`OperatorStore`]: crate::OperatorStore
    pub fn expose_holder(mut self, expose: bool) -> Self
    where
        St: crate::store::OperatorStore,
    {
        self.config.expose_holder =
            expose.then(|| crate::store::BoxStore::operator_view(self.config.locker.store_arc()));
        self
    }

    /// Checks the settings: among others, the idempotency retention (at
    /// most [`MAX_RETENTION`](super::MAX_RETENTION)) and the locker's wait
    /// timeout (at most 24 h) are refused past their bounds, never left to
    /// overflow on the request path.
    pub fn build(mut self) -> Result<LockLayer<St>, ConfigError> {
        if self.config.permits.is_some() && !self.config.contention_set {
            self.config.contention = StatusCode::TOO_MANY_REQUESTS;
        }
        self.config.check()?;
        Ok(self.into_layer())
    }

    fn into_layer(self) -> LockLayer<St> {
        LockLayer {
            config: Arc::new(self.config),
        }
    }
}
