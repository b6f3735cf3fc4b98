//! Where a request's lock key comes from.

use std::fmt;
use std::sync::Arc;

use axum::extract::rejection::RawPathParamsRejection;
use axum::extract::{FromRequestParts, MatchedPath, RawPathParams};
use axum::response::IntoResponse;
use http::request::Parts;
use http::{HeaderName, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;

mod canonical;
mod extract;
mod json;
mod member;
mod param;
mod path;
mod query;
mod sf;

/// The source of a request's lock id. The layer adds its namespace (see
/// [`LockLayerBuilder::namespace`](crate::LockLayerBuilder::namespace)) and
/// turns the id into a [`LockKey`](crate::LockKey), so a client-chosen id is
/// bounded, hashed when odd, and can never pick the Redis hash tag.
///
/// **The key is the value the handler reads.** Prefer a typed source: the
/// id is read into the same type, by the same rules, as the handler's
/// extractor reads it ([`path_param`](KeyFrom::path_param) as axum's
/// `Path`, [`query`](KeyFrom::query) as `Query`,
/// [`json_pointer`](KeyFrom::json_pointer) as `Json`, or
/// [`extract`](KeyFrom::extract) with the handler's extractor itself), and
/// the lock is keyed on that value, not on how the request spelled it. So
/// `/orders/7` and `/orders/07` are one lock for a handler that reads
/// `Path<u64>`, and `?id=x%FF` and `?id=x%FE` one lock for a handler that
/// reads a `String` from `Query` (both decode to `x\u{FFFD}`). A value the
/// handler's extractor would refuse is refused with its status (400; 422
/// for JSON of the wrong shape), as `application/problem+json`, before any
/// store call. Sources that key on a string (`path`, `header`,
/// `body_digest`, `custom`) say what the handler must read for the promise
/// to hold.
///
/// ```
/// use axum::{Router, body::Body, extract::Path, routing::post};
/// use http::Request;
/// use tower::ServiceExt;
/// use tower_redis_lock::{KeyFrom, LockGuard, LockLayer, Locker, MemoryStore};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// async fn capture(Path(id): Path<u64>, guard: LockGuard) -> String {
///     format!("order {id} under {}", guard.key())
/// }
///
/// let layer = LockLayer::builder(Locker::new(MemoryStore::new()), KeyFrom::path_param::<u64>("id"))
///     .namespace("orders")
///     .build()?;
/// let app = Router::new().route("/orders/{id}/capture", post(capture).route_layer(layer));
/// let send = |uri: &str| app.clone().oneshot(Request::post(uri).body(Body::empty()).unwrap());
///
/// // Two spellings of order 7: one lock.
/// for uri in ["/orders/7/capture", "/orders/07/capture", "/orders/%37/capture"] {
///     let body = axum::body::to_bytes(send(uri).await?.into_body(), 1024).await?;
///     assert_eq!(body, "order 7 under orders:7");
/// }
/// // Not an order number: the 400 `Path<u64>` would answer, and no lock.
/// let res = send("/orders/seven/capture").await?;
/// assert_eq!(res.status(), 400);
/// assert_eq!(res.headers()["content-type"], "application/problem+json");
/// # Ok(())
/// # }
/// ```
///
/// A warning where trust matters: every source but a server-side closure is
/// chosen by the client. A client that can pick the id can make its request
/// contend with another client's — key on ids the client is entitled to
/// (its own order, a signed webhook's event id), and verify signatures
/// *before* this layer.
#[derive(Clone)]
pub struct KeyFrom {
    kind: Kind,
}

type CustomFn = Arc<dyn Fn(&Parts) -> Option<String> + Send + Sync>;

/// A typed key's id from a value in the request head: `(name, value)` for
/// a path parameter, `(query, name)` for a query parameter.
type HeadKey = fn(&str, &str) -> Result<Option<Vec<u8>>, Refused>;

/// A typed key's id from the JSON value at the pointer.
type BodyKey = fn(&RawValue) -> Result<Option<Vec<u8>>, Refused>;

#[derive(Clone)]
enum Kind {
    Path,
    PathParam(Typed<HeadKey>),
    Header(HeaderName),
    IdempotencyKey,
    Query(Typed<HeadKey>),
    JsonPointer(Typed<BodyKey>),
    BodyDigest,
    Custom(CustomFn),
    Extract {
        extractor: &'static str,
        key: Arc<dyn extract::ExtractKey>,
    },
}

/// A named value read into a type: the name (or pointer), the type's name
/// for messages, and the function that reads and encodes it.
#[derive(Clone)]
struct Typed<F> {
    name: Arc<str>,
    ty: &'static str,
    key: F,
}

impl<F> Typed<F> {
    fn new<T>(name: &str, key: F) -> Self {
        Typed {
            name: name.into(),
            ty: std::any::type_name::<T>(),
            key,
        }
    }
}

impl KeyFrom {
    /// The whole request path (without the query), in one spelling per
    /// path, so that every spelling a router sends to one handler shares one
    /// key:
    ///
    /// - the path is percent-decoded to bytes first (`%61` is `a`, `%2f` is
    ///   `%2F`), then split on `/`; so `%2F` counts as a `/`, which may make
    ///   two paths that route apart (`/a%2Fb`, `/a/b`) exclude each other:
    ///   more exclusion, never less;
    /// - empty segments are dropped (`/a//b` is `/a/b`); a trailing slash is
    ///   kept (`/a/` is not `/a`, routers tell them apart);
    /// - a `.` or `..` segment, however spelled (`%2e`, `.%2E`, or made by a
    ///   decoded `%2F`), is refused with 400: a file server resolves it and a
    ///   router does not, so which resource it names is not ours to guess;
    /// - a `%` not followed by two hex digits is refused with 400: kept as it
    ///   is, `/a%zz` would be one spelling of `/a%25zz`.
    ///
    /// What the handler must read for the key to be its id: the decoded
    /// path's non-empty segments, e.g. a wildcard `Path<String>` on
    /// `/{*rest}` split on `/` — two paths it reads as different segments
    /// never share a key, and two it reads alike always do. A handler that
    /// acts on the raw `Uri` instead (`/a//b` and `/a/b` as two resources)
    /// sees fewer resources than keys merge, which costs only concurrency.
    /// A refused request never reaches the inner service, whatever the
    /// [`OnMissingKey`](crate::OnMissingKey) choice.
    pub fn path() -> Self {
        KeyFrom { kind: Kind::Path }
    }

    /// A parameter of the matched axum route, e.g. `"id"` for
    /// `/orders/{id}/capture`, read into `T` exactly as axum's `Path` reads
    /// it (percent-decoded; numbers, `bool` and `char` parsed with
    /// `FromStr`; strings as they are; unit enum variants by name) and
    /// keyed on that value (see [`KeyFrom`]). The handler reads the
    /// parameter as a `T` with `Path<T>`, a field of `Path<Params>` or an
    /// element of `Path<(A, T)>`.
    ///
    /// A parameter `T` cannot be read from gets axum's answer: 400 (and
    /// axum's text, "Cannot parse `id` with value `x` to a `u64`") for a
    /// value that does not parse or is not UTF-8 once decoded; 500 for a
    /// type `Path` cannot read (a struct, a sequence). `T` must write one
    /// JSON text per value with `Serialize` (any derived type; not a
    /// `HashMap`). A value that keys as nothing (an empty string, a float
    /// `NaN` or infinity, which serialize as `null`) is no key: the
    /// [`OnMissingKey`](crate::OnMissingKey) answer (400 by default; with
    /// `PassThrough`, such requests run unlocked).
    ///
    /// ```
    /// use axum::{Router, extract::Path, routing::post};
    /// use tower_redis_lock::{KeyFrom, LockLayer, Locker, MemoryStore};
    ///
    /// // The handler reads the tenant and the order; the lock is per order.
    /// async fn capture(Path((tenant, order)): Path<(String, u64)>) -> String {
    ///     format!("{tenant}: order {order} captured")
    /// }
    ///
    /// let layer = LockLayer::new(Locker::new(MemoryStore::new()), KeyFrom::path_param::<u64>("order"));
    /// let app: Router = Router::new()
    ///     .route("/tenants/{tenant}/orders/{order}", post(capture).route_layer(layer));
    /// # let _ = app;
    /// ```
    pub fn path_param<T>(name: &str) -> Self
    where
        T: DeserializeOwned + Serialize,
    {
        KeyFrom {
            kind: Kind::PathParam(Typed::new::<T>(name, param_key::<T>)),
        }
    }

    /// A request header, e.g. `Idempotency-Key` or `X-GitHub-Delivery`, by
    /// its raw bytes. A request that carries the header twice is refused
    /// (400).
    ///
    /// What the handler must read for the key to be its id: the header's
    /// exact bytes (`HeaderMap::get(..)` and `HeaderValue::as_bytes` or
    /// `to_str`): two values that differ in any byte, case included, are two
    /// keys. A handler that folds spellings together (trims, lowercases,
    /// parses a number) must be keyed on what it reads instead: give
    /// [`extract`](KeyFrom::extract) the extractor, or a function, that does
    /// the folding.
    pub fn header(name: HeaderName) -> Self {
        KeyFrom {
            kind: Kind::Header(name),
        }
    }

    /// The `Idempotency-Key` header as the IETF draft
    /// (draft-ietf-httpapi-idempotency-key-header) has it: a Structured
    /// Field string (`Idempotency-Key: "8e03978e-40d5"`), or the bare value
    /// Stripe's clients send (`Idempotency-Key: 8e03978e-40d5`); both
    /// spellings of one key are one lock and one record. A quoted value that
    /// is not a valid sf-string, a bare one with spaces or bytes outside
    /// printable ASCII, a key longer than 255 bytes, or the header given
    /// twice is refused with 400 before any store call; a missing or empty
    /// one is no key (the [`OnMissingKey`](crate::OnMissingKey) answer: 400
    /// by default, as the draft asks).
    ///
    /// ```
    /// use axum::{Router, routing::post};
    /// use tower_redis_lock::{Idempotency, KeyFrom, LockLayer, Locker, MemoryStore};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let layer = LockLayer::builder(Locker::new(MemoryStore::new()), KeyFrom::idempotency_key())
    ///     .namespace("payments")
    ///     .idempotent(Idempotency::new())
    ///     .build()?;
    /// let app: Router = Router::new().route("/payments", post(|| async { "created" }).route_layer(layer));
    /// # let _ = app;
    /// # Ok(())
    /// # }
    /// ```
    pub fn idempotency_key() -> Self {
        KeyFrom {
            kind: Kind::IdempotencyKey,
        }
    }

    /// A query-string parameter, read into `T` exactly as axum's `Query`
    /// reads a field of a derived `Query<Params>` (serde_urlencoded over
    /// `form_urlencoded`: escapes of either case and `+` decoded, invalid
    /// UTF-8 replaced by U+FFFD, numbers parsed with `FromStr`) and keyed
    /// on that value (see [`KeyFrom`]). So `?q=a+b` and `?q=a%20b` are one
    /// lock, as are `?id=x%FF` and `?id=x%FE` for a `String` (the handler
    /// reads `x\u{FFFD}` from both).
    ///
    /// A request that gives the parameter twice (`?id=a&id=b`, also as
    /// `?id=a&i%64=b`) is refused with 400, as a derived `Query<Params>`
    /// refuses it; one whose value does not parse as `T` gets `Query`'s
    /// 400. A missing parameter, an empty value (`?id=`) or one that keys
    /// as nothing (`NaN`) is no key: the [`OnMissingKey`](crate::OnMissingKey)
    /// answer (400 by default; with `PassThrough`, such requests run
    /// unlocked).
    ///
    /// ```
    /// use axum::{Router, extract::Query, routing::post};
    /// use serde::Deserialize;
    /// use tower_redis_lock::{KeyFrom, LockLayer, Locker, MemoryStore};
    ///
    /// #[derive(Deserialize)]
    /// struct Params {
    ///     event: String,
    /// }
    ///
    /// async fn on_event(Query(p): Query<Params>) -> String {
    ///     format!("applied {}", p.event)
    /// }
    ///
    /// let layer = LockLayer::new(Locker::new(MemoryStore::new()), KeyFrom::query::<String>("event"));
    /// let app: Router = Router::new().route("/events", post(on_event).route_layer(layer));
    /// # let _ = app;
    /// ```
    pub fn query<T>(name: &str) -> Self
    where
        T: DeserializeOwned + Serialize,
    {
        KeyFrom {
            kind: Kind::Query(Typed::new::<T>(name, query_key::<T>)),
        }
    }

    /// A field of a JSON body, by JSON pointer (RFC 6901), e.g. `"/id"` or
    /// `"/data/object/id"`, read into `T` with serde_json (as axum's `Json`
    /// reads the field of a derived struct) and keyed on that value (see
    /// [`KeyFrom`]). The body is read (within the body limit), checked to
    /// be JSON in full, and handed to the service unchanged.
    ///
    /// - A `Content-Type` that is not JSON (`application/json` or
    ///   `application/*+json`): 415, as `Json` answers, before the body is
    ///   read or any lock taken.
    /// - A body that is not JSON: 400. A value of another shape than `T` (a
    ///   number for a `String`, `1.5` or `"7"` for a `u64`): 422, as `Json`
    ///   answers.
    /// - Nothing at the pointer, or a value `T` reads as `None` (`null` for
    ///   an `Option<T>`) or as an empty string: no key (the
    ///   [`OnMissingKey`](crate::OnMissingKey) answer).
    /// - An object on the way that names the pointer's member twice
    ///   (`{"id":"a","id":"b"}` for `/id`) is refused (400), like a
    ///   repeated query parameter: a derived struct refuses it, a `Value`
    ///   reads the last one.
    ///
    /// ```
    /// use axum::{Json, Router, routing::post};
    /// use serde::Deserialize;
    /// use tower_redis_lock::{KeyFrom, LockLayer, Locker, MemoryStore};
    ///
    /// #[derive(Deserialize)]
    /// struct Event {
    ///     id: String,
    /// }
    ///
    /// async fn on_event(Json(event): Json<Event>) -> String {
    ///     format!("applied {}", event.id)
    /// }
    ///
    /// let layer = LockLayer::new(Locker::new(MemoryStore::new()), KeyFrom::json_pointer::<String>("/id"));
    /// let app: Router = Router::new().route("/events", post(on_event).route_layer(layer));
    /// # let _ = app;
    /// ```
    pub fn json_pointer<T>(pointer: &str) -> Self
    where
        T: DeserializeOwned + Serialize,
    {
        KeyFrom {
            kind: Kind::JsonPointer(Typed::new::<T>(pointer, json_key::<T>)),
        }
    }

    /// The SHA-256 digest of the exact request body bytes, as lowercase hex
    /// (the key reads `<namespace>:<sha256sum of the body>`): one key per
    /// payload, whatever the headers say. The body is read (within the body
    /// limit, `Content-Length` checked first) and handed to the service
    /// unchanged; an empty body is no key.
    ///
    /// What the handler must read for the key to be its id: the exact
    /// bytes. Two bodies one byte apart are two keys, even where they are
    /// the same JSON; a handler that acts on one id inside the body should
    /// be keyed on it with [`json_pointer`](KeyFrom::json_pointer).
    ///
    /// For senders that sign the body and nothing else, such as GitHub
    /// (`X-Hub-Signature-256` covers the body; `X-GitHub-Delivery` is
    /// unsigned): keyed on the delivery header, a captured delivery replayed
    /// with fresh delivery ids is a new request each time; keyed on the body,
    /// it is the same one, and an idempotent layer answers it with the
    /// stored response. What it cannot tell apart: two genuinely different
    /// deliveries whose bodies are byte for byte the same count as one, and
    /// a replay after the record's retention runs again (the body carries no
    /// signed time).
    ///
    /// ```
    /// use axum::{Router, body::Body, routing::post};
    /// use http::Request;
    /// use tower::ServiceExt;
    /// use tower_redis_lock::{Idempotency, KeyFrom, LockLayer, Locker, MemoryStore};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let app = Router::new().route(
    ///     "/webhooks/github",
    ///     post(|body: String| async move { format!("applied {body}") }).route_layer(
    ///         LockLayer::builder(Locker::new(MemoryStore::new()), KeyFrom::body_digest())
    ///             .namespace("github")
    ///             .idempotent(Idempotency::new())
    ///             .build()?,
    ///     ),
    /// );
    /// let delivery = |id: &str| {
    ///     Request::post("/webhooks/github")
    ///         .header("x-github-delivery", id)
    ///         .body(Body::from(r#"{"after":"abc123"}"#))
    /// };
    /// let first = app.clone().oneshot(delivery("d-1")?).await?;
    /// assert!(first.headers().get("idempotent-replayed").is_none());
    /// // The same body under a new delivery id: the first answer, replayed.
    /// let replay = app.oneshot(delivery("d-2")?).await?;
    /// assert_eq!(replay.headers()["idempotent-replayed"], "true");
    /// # Ok(())
    /// # }
    /// ```
    pub fn body_digest() -> Self {
        KeyFrom {
            kind: Kind::BodyDigest,
        }
    }

    /// The value a function of any extractor gives, e.g. the one the
    /// handler reads: `KeyFrom::extract(|Path((tenant, id)): Path<(String,
    /// u64)>| (tenant, id))`, or a tenant extractor of your own. The
    /// extractor runs on the request head before the lock (with `()` as
    /// its state) and again in the handler; the key is the value the
    /// function returns, encoded as for the typed sources (see
    /// [`KeyFrom`]); `None` (anything written as `null`) or an empty string
    /// is no key.
    ///
    /// An extractor that rejects the request answers with its rejection's
    /// status and text, as an `application/problem+json` refusal, before
    /// any store call (its headers are not kept).
    ///
    /// ```
    /// use axum::{Router, body::Body, extract::Path, routing::post};
    /// use http::Request;
    /// use tower::ServiceExt;
    /// use tower_redis_lock::{KeyFrom, LockGuard, LockLayer, Locker, MemoryStore};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// async fn capture(Path((tenant, id)): Path<(String, u64)>, guard: LockGuard) -> String {
    ///     format!("{tenant}/{id} under {}", guard.key())
    /// }
    ///
    /// let key = KeyFrom::extract(|Path((tenant, id)): Path<(String, u64)>| (tenant, id));
    /// let layer = LockLayer::builder(Locker::new(MemoryStore::new()), key)
    ///     .namespace("orders")
    ///     .build()?;
    /// let app = Router::new().route("/{tenant}/orders/{id}", post(capture).route_layer(layer));
    /// let res = app.oneshot(Request::post("/acme/orders/007").body(Body::empty())?).await?;
    /// let body = axum::body::to_bytes(res.into_body(), 1024).await?;
    /// assert_eq!(body, r#"acme/7 under orders:["acme",7]"#);
    /// # Ok(())
    /// # }
    /// ```
    pub fn extract<E, K, F>(f: F) -> Self
    where
        E: FromRequestParts<()> + 'static,
        E::Rejection: IntoResponse,
        K: Serialize,
        F: Fn(E) -> K + Send + Sync + 'static,
    {
        KeyFrom {
            kind: Kind::Extract {
                extractor: std::any::type_name::<E>(),
                key: Arc::new(extract::Extractor::<E, F>::new(f)),
            },
        }
    }

    /// Any function of the request head; `None` means "no key". The id is
    /// the returned string's bytes.
    ///
    /// What the handler must read for the key to be its id: the same
    /// function of the request (or one that tells ids apart exactly where
    /// it does). To key on a typed value an extractor reads, use
    /// [`extract`](KeyFrom::extract).
    pub fn custom<F>(f: F) -> Self
    where
        F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    {
        KeyFrom {
            kind: Kind::Custom(Arc::new(f)),
        }
    }

    /// Where the key was expected, for a 400 answer.
    pub(crate) fn describe(&self) -> String {
        match &self.kind {
            Kind::Path => "the request path".to_owned(),
            Kind::PathParam(t) => format!("path parameter `{}` (a {})", t.name, short(t.ty)),
            Kind::Header(n) => format!("header `{n}`"),
            Kind::IdempotencyKey => {
                "header `idempotency-key` (a Structured Field string or a bare key)".to_owned()
            }
            Kind::Query(t) => format!("query parameter `{}` (a {})", t.name, short(t.ty)),
            Kind::JsonPointer(t) => format!("JSON body field `{}` (a {})", t.name, short(t.ty)),
            Kind::BodyDigest => "the request body's SHA-256 digest (a non-empty body)".to_owned(),
            Kind::Custom(_) => "a key from the request (custom extractor)".to_owned(),
            Kind::Extract { extractor, .. } => {
                format!("a key from the request (extractor `{}`)", short(extractor))
            }
        }
    }

    /// Whether the key is a path parameter of a matched route.
    pub(crate) fn is_path_param(&self) -> bool {
        matches!(self.kind, Kind::PathParam(_))
    }

    /// Whether the body must be read to find the key.
    pub(crate) fn needs_body(&self) -> bool {
        matches!(self.kind, Kind::JsonPointer(_) | Kind::BodyDigest)
    }

    /// Finds the id in the request head (every source but the body): a
    /// typed value's canonical encoding, or a string source's raw bytes
    /// (never lossily decoded). A source that appears twice is refused:
    /// which one the handler reads is not ours to guess; so is an
    /// ambiguous path, and a value the handler's extractor would refuse.
    pub(crate) async fn id_in_head(&self, parts: &mut Parts) -> Result<Option<Vec<u8>>, Refused> {
        let id = match &self.kind {
            Kind::Path => Some(path::canonical(parts.uri.path())?),
            Kind::PathParam(t) => match RawPathParams::from_request_parts(parts, &()).await {
                Ok(params) => match params.iter().find(|(k, _)| *k == &*t.name) {
                    Some((name, value)) => (t.key)(name, value)?,
                    None => None,
                },
                Err(RawPathParamsRejection::InvalidUtf8InPathParam(e)) => {
                    return Err(Refused::Rejected {
                        status: e.status(),
                        detail: format!("Invalid URL: {}", e.body_text()),
                    });
                }
                // No route matched: the layer is misplaced (see `service`).
                Err(_) => None,
            },
            Kind::Header(name) => one_header(parts, name)?.map(|v| v.as_bytes().to_vec()),
            Kind::IdempotencyKey => match one_header(parts, &IDEMPOTENCY_KEY)? {
                Some(v) => sf::idempotency_key(v.as_bytes())?,
                None => None,
            },
            Kind::Query(t) => (t.key)(parts.uri.query().unwrap_or_default(), &t.name)?,
            Kind::Custom(f) => f(parts).map(String::into_bytes),
            Kind::Extract { key, .. } => key.key(parts).await?,
            Kind::JsonPointer(_) | Kind::BodyDigest => None,
        };
        Ok(id.filter(|id| !id.is_empty()))
    }

    /// Refuses, before the body is read, what the handler's extractor
    /// refuses by the request head: for a JSON key, a `Content-Type` that
    /// is not JSON (`application/json` or `application/*+json`), which
    /// axum's `Json` answers with 415. (Keyed and locked, such a request
    /// would reach a handler that refuses it, and an idempotent layer
    /// would store that refusal as the event's outcome.)
    pub(crate) fn check_head(&self, headers: &http::HeaderMap) -> Result<(), Refused> {
        if matches!(self.kind, Kind::JsonPointer(_)) && !is_json(headers) {
            return Err(Refused::Rejected {
                status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
                detail: "Expected request with `Content-Type: application/json`".to_owned(),
            });
        }
        Ok(())
    }

    /// Finds the id in the body: for a JSON pointer, the body is checked to
    /// be JSON in full, then walked along the pointer on its text, and the
    /// value found read into the key's type; for [`KeyFrom::body_digest`],
    /// the body's digest, JSON or not.
    pub(crate) fn id_in_body(&self, body: &[u8]) -> Result<Option<Vec<u8>>, Refused> {
        let t = match &self.kind {
            Kind::JsonPointer(t) => t,
            Kind::BodyDigest => return Ok(body_digest(body).map(String::into_bytes)),
            _ => return Ok(None),
        };
        let id = match json::find(body, &t.name)? {
            Some(value) => (t.key)(value)?,
            None => None,
        };
        Ok(id.filter(|id| !id.is_empty()))
    }
}

/// Whether the request says its body is JSON, as axum's `Json` reads the
/// first `Content-Type`: type `application`, subtype `json` or `…+json`.
fn is_json(headers: &http::HeaderMap) -> bool {
    let Some(value) = headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or_default().trim();
    let Some((ty, sub)) = essence.split_once('/') else {
        return false;
    };
    let sub = sub.trim().to_ascii_lowercase();
    ty.trim().eq_ignore_ascii_case("application") && (sub == "json" || sub.ends_with("+json"))
}

fn param_key<T>(name: &str, value: &str) -> Result<Option<Vec<u8>>, Refused>
where
    T: DeserializeOwned + Serialize,
{
    canonical::encode(&param::parse::<T>(name, value)?)
}

fn query_key<T>(query: &str, name: &str) -> Result<Option<Vec<u8>>, Refused>
where
    T: DeserializeOwned + Serialize,
{
    match query::parse::<T>(query, name)? {
        Some(value) => canonical::encode(&value),
        None => Ok(None),
    }
}

fn json_key<T>(value: &RawValue) -> Result<Option<Vec<u8>>, Refused>
where
    T: DeserializeOwned + Serialize,
{
    canonical::encode(&json::read::<T>(value)?)
}

/// The header of the IETF idempotency draft.
const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// A header's one value, if any; given twice, it is refused.
fn one_header<'a>(
    parts: &'a Parts,
    name: &HeaderName,
) -> Result<Option<&'a http::HeaderValue>, Refused> {
    let mut all = parts.headers.get_all(name).iter();
    let first = all.next();
    if all.next().is_some() {
        return Err(Refused::Repeated);
    }
    Ok(first)
}

/// The lowercase hex SHA-256 of a non-empty body.
fn body_digest(body: &[u8]) -> Option<String> {
    use sha2::Digest;
    if body.is_empty() {
        return None;
    }
    let mut hex = String::with_capacity(64);
    crate::key::push_hex(&mut hex, &sha2::Sha256::digest(body));
    Some(hex)
}

/// Why a request's key source is refused rather than keyed: each is a
/// request where the layer cannot know which id the handler will act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refused {
    /// A key source that appears more than once (`?id=a&id=b`, a repeated
    /// header, a JSON member named twice).
    Repeated,
    /// A `.` or `..` path segment.
    DotSegment,
    /// A `%` in the path not followed by two hex digits.
    BadEscape,
    /// The body is not JSON.
    NotJson(String),
    /// The handler's extractor would refuse the value: its status and why.
    Rejected { status: StatusCode, detail: String },
}

impl Refused {
    /// The status of the refusal's answer.
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            Refused::Rejected { status, .. } => *status,
            _ => StatusCode::BAD_REQUEST,
        }
    }
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refused::Repeated => f.write_str("the lock key source appears more than once"),
            Refused::DotSegment => f.write_str(
                "the request path has a `.` or `..` segment (servers disagree on what it names)",
            ),
            Refused::BadEscape => {
                f.write_str("the request path has a `%` not followed by two hex digits")
            }
            Refused::NotJson(e) => write!(f, "the request body is not valid JSON: {e}"),
            Refused::Rejected { detail, .. } => f.write_str(detail),
        }
    }
}

/// The default namespace of a layer: the matched route template, so that
/// two routes under one layer never share locks by accident.
pub(crate) fn route_namespace(extensions: &http::Extensions) -> Option<String> {
    let route = extensions.get::<MatchedPath>()?.as_str();
    Some(crate::key::namespace_from(
        route.trim_start_matches('/'),
        route.as_bytes(),
    ))
}

/// A type's name without its module paths: `Path<(String, u64)>` for
/// `axum::extract::path::Path<(alloc::string::String, u64)>`.
fn short(ty: &str) -> String {
    let mut out = String::with_capacity(ty.len());
    // Where the path being written began.
    let mut start = 0;
    let mut chars = ty.chars().peekable();
    while let Some(c) = chars.next() {
        if c == ':' && chars.peek() == Some(&':') {
            chars.next();
            out.truncate(start);
            continue;
        }
        out.push(c);
        if !(c.is_alphanumeric() || c == '_') {
            start = out.len();
        }
    }
    out
}

impl fmt::Debug for KeyFrom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Path => f.write_str("KeyFrom::path()"),
            Kind::PathParam(t) => write!(f, "KeyFrom::path_param::<{}>({:?})", short(t.ty), t.name),
            Kind::Header(n) => write!(f, "KeyFrom::header({n:?})"),
            Kind::IdempotencyKey => f.write_str("KeyFrom::idempotency_key()"),
            Kind::Query(t) => write!(f, "KeyFrom::query::<{}>({:?})", short(t.ty), t.name),
            Kind::JsonPointer(t) => {
                write!(f, "KeyFrom::json_pointer::<{}>({:?})", short(t.ty), t.name)
            }
            Kind::BodyDigest => f.write_str("KeyFrom::body_digest()"),
            Kind::Custom(_) => f.write_str("KeyFrom::custom(..)"),
            Kind::Extract { extractor, .. } => {
                write!(f, "KeyFrom::extract(|_: {}| ..)", short(extractor))
            }
        }
    }
}

#[cfg(test)]
mod tests;
