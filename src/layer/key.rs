//! Where a request's lock key comes from.

use std::fmt;
use std::sync::Arc;

use axum::extract::{FromRequestParts, MatchedPath, RawPathParams};
use http::HeaderName;
use http::request::Parts;

mod json;

/// The source of a request's lock id. The layer adds its namespace (see
/// [`LockLayerBuilder::namespace`](super::LockLayerBuilder::namespace)) and
/// turns the id into a [`LockKey`](crate::LockKey), so a client-chosen id is
/// bounded, hashed when odd, and can never pick the Redis hash tag.
///
/// A warning where trust matters: every source but a server-side closure is
/// chosen by the client. A client that can pick the id can make its request
/// contend with another client's — key on ids the client is entitled to
/// (its own order, a signed webhook's event id), and verify signatures
/// *before* this layer.
#[derive(Clone)]
pub struct KeyFrom {
    pub(crate) kind: Kind,
}

type CustomFn = Arc<dyn Fn(&Parts) -> Option<String> + Send + Sync>;

#[derive(Clone)]
pub(crate) enum Kind {
    Path,
    PathParam(Arc<str>),
    Header(HeaderName),
    Query(Arc<str>),
    JsonPointer(Arc<str>),
    BodyDigest,
    Custom(CustomFn),
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
    /// A refused request never reaches the inner service, whatever the
    /// [`OnMissingKey`](super::OnMissingKey) choice.
    pub fn path() -> Self {
        KeyFrom { kind: Kind::Path }
    }

    /// A parameter of the matched axum route, e.g. `"id"` for
    /// `/orders/{id}/capture`.
    pub fn path_param(name: &str) -> Self {
        KeyFrom {
            kind: Kind::PathParam(name.into()),
        }
    }

    /// A request header, e.g. `Idempotency-Key` or `X-GitHub-Delivery`, by
    /// its raw bytes. A request that carries the header twice is refused
    /// (400).
    pub fn header(name: HeaderName) -> Self {
        KeyFrom {
            kind: Kind::Header(name),
        }
    }

    /// A query-string parameter, decoded to raw bytes (never lossily). A
    /// request that gives the parameter twice is refused (400).
    pub fn query(name: &str) -> Self {
        KeyFrom {
            kind: Kind::Query(name.into()),
        }
    }

    /// A field of a JSON body, by JSON pointer (RFC 6901), e.g. `"/id"` or
    /// `"/data/object/id"`. The body is read (within the body limit), checked
    /// to be JSON in full, and handed to the service unchanged.
    ///
    /// - A string keys as its decoded text.
    /// - A number keys by its exact value (never through an `f64`), written
    ///   in one canonical text: `1`, `1.0`, `1e0`, `10e-1`, `0.1e1` all key
    ///   as `1`, `-0` as `0`, `1.50` as `1.5`, `25e2` as `2500`; while
    ///   `1180591620717411303424` (2^70) and `…425` stay two keys. Values
    ///   whose decimal exponent is beyond ±64 are written `1.5e100`. So a
    ///   number and the string of its canonical text share a key (`1` and
    ///   `"1"`; but not `1.0` and `"1.0"`): two spellings of one id may
    ///   exclude each other, two ids never share a lock. A number whose
    ///   exponent does not fit 18 digits is refused (400).
    /// - Anything else (`null`, `true`, an object, an empty string) is no
    ///   key.
    /// - An object on the way that names the pointer's member twice
    ///   (`{"id":"a","id":"b"}` for `/id`) is refused (400), like a repeated
    ///   query parameter: parsers disagree on which one the handler reads.
    pub fn json_pointer(pointer: &str) -> Self {
        KeyFrom {
            kind: Kind::JsonPointer(pointer.into()),
        }
    }

    /// The SHA-256 digest of the exact request body bytes, as lowercase hex
    /// (the key reads `<namespace>:<sha256sum of the body>`): one key per
    /// payload, whatever the headers say. The body is read (within the body
    /// limit, `Content-Length` checked first) and handed to the service
    /// unchanged; an empty body is no key.
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

    /// Any function of the request head; `None` means "no key".
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
            Kind::PathParam(n) => format!("path parameter `{n}`"),
            Kind::Header(n) => format!("header `{n}`"),
            Kind::Query(n) => format!("query parameter `{n}`"),
            Kind::JsonPointer(p) => format!("JSON body field `{p}` (a string or a number)"),
            Kind::BodyDigest => "the request body's SHA-256 digest (a non-empty body)".to_owned(),
            Kind::Custom(_) => "a key from the request (custom extractor)".to_owned(),
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

    /// Finds the id in the request head (every source but the body), as raw
    /// bytes: never lossily decoded, so two different ids never share a key.
    /// A source that appears twice is refused: which one the handler reads
    /// is not ours to guess; so is an ambiguous path.
    pub(crate) async fn id_in_head(&self, parts: &mut Parts) -> Result<Option<Vec<u8>>, Refused> {
        let id = match &self.kind {
            Kind::Path => Some(canonical_path(parts.uri.path())?),
            Kind::PathParam(name) => match RawPathParams::from_request_parts(parts, &()).await {
                Ok(params) => params
                    .iter()
                    .find(|(k, _)| *k == &**name)
                    .map(|(_, v)| v.as_bytes().to_vec()),
                Err(_) => None,
            },
            Kind::Header(name) => {
                let mut all = parts.headers.get_all(name).iter();
                let first = all.next();
                if all.next().is_some() {
                    return Err(Refused::Repeated);
                }
                first.map(|v| v.as_bytes().to_vec())
            }
            Kind::Query(name) => match parts.uri.query() {
                Some(q) => query_value(q, name)?,
                None => None,
            },
            Kind::Custom(f) => f(parts).map(String::into_bytes),
            Kind::JsonPointer(_) | Kind::BodyDigest => None,
        };
        Ok(id.filter(|id| !id.is_empty()))
    }

    /// Finds the id in the body: for a JSON pointer, the body is checked to
    /// be JSON in full, then walked along the pointer on its text, so a
    /// number keeps its exact value; for [`KeyFrom::body_digest`], the
    /// body's digest, JSON or not.
    pub(crate) fn id_in_body(&self, body: &[u8]) -> Result<Option<Vec<u8>>, Refused> {
        let pointer = match &self.kind {
            Kind::JsonPointer(pointer) => pointer,
            Kind::BodyDigest => return Ok(body_digest(body).map(String::into_bytes)),
            _ => return Ok(None),
        };
        let id = json::find(body, pointer)?;
        Ok(id.filter(|id| !id.is_empty()))
    }
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

/// Why a request's key source is refused (400) rather than keyed: each is a
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
    /// A JSON number whose exponent cannot be kept exactly.
    HugeExponent,
    /// The body is not JSON.
    NotJson(String),
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
            Refused::HugeExponent => {
                f.write_str("the JSON number's exponent is too large to key exactly")
            }
            Refused::NotJson(e) => write!(f, "the request body is not valid JSON: {e}"),
        }
    }
}

/// Appends `s` to `out` with each `%XX` decoded to its byte (a `%` not
/// followed by two hex digits stays as it is) and, for a query, `+` as a
/// space. False if such a stray `%` was met.
fn percent_decode(out: &mut Vec<u8>, s: &[u8], plus_is_space: bool) -> bool {
    let mut clean = true;
    let mut i = 0;
    while i < s.len() {
        let escape = (s[i] == b'%')
            .then(|| Some((hex(*s.get(i + 1)?)?, hex(*s.get(i + 2)?)?)))
            .flatten();
        match (s[i], escape) {
            (_, Some((h, l))) => {
                out.push(h << 4 | l);
                i += 3;
            }
            (b'+', None) if plus_is_space => {
                out.push(b' ');
                i += 1;
            }
            (c, None) => {
                clean &= c != b'%';
                out.push(c);
                i += 1;
            }
        }
    }
    clean
}

fn form_decode(s: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    percent_decode(&mut out, s.as_bytes(), true);
    out
}

fn hex(c: u8) -> Option<u8> {
    (c as char).to_digit(16).map(|d| d as u8)
}

/// The value of query parameter `name`, decoded to bytes; refused if it
/// appears twice.
fn query_value(query: &str, name: &str) -> Result<Option<Vec<u8>>, Refused> {
    let mut found = None;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if form_decode(k) == name.as_bytes() {
            if found.is_some() {
                return Err(Refused::Repeated);
            }
            found = Some(form_decode(v));
        }
    }
    Ok(found)
}

/// One spelling per path (see [`KeyFrom::path`]): decoded to bytes, then
/// split on `/`, empty segments dropped, trailing slash kept; dot segments
/// and stray `%`s refused.
fn canonical_path(path: &str) -> Result<Vec<u8>, Refused> {
    let mut decoded = Vec::with_capacity(path.len());
    if !percent_decode(&mut decoded, path.as_bytes(), false) {
        return Err(Refused::BadEscape);
    }
    let mut out = Vec::with_capacity(decoded.len() + 1);
    for seg in decoded.split(|&b| b == b'/').filter(|s| !s.is_empty()) {
        if seg == b"." || seg == b".." {
            return Err(Refused::DotSegment);
        }
        out.push(b'/');
        out.extend_from_slice(seg);
    }
    if out.is_empty() || decoded.ends_with(b"/") {
        out.push(b'/');
    }
    Ok(out)
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

impl fmt::Debug for KeyFrom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Path => f.write_str("KeyFrom::path()"),
            Kind::PathParam(n) => write!(f, "KeyFrom::path_param({n:?})"),
            Kind::Header(n) => write!(f, "KeyFrom::header({n:?})"),
            Kind::Query(n) => write!(f, "KeyFrom::query({n:?})"),
            Kind::JsonPointer(p) => write!(f, "KeyFrom::json_pointer({p:?})"),
            Kind::BodyDigest => f.write_str("KeyFrom::body_digest()"),
            Kind::Custom(_) => f.write_str("KeyFrom::custom(..)"),
        }
    }
}

#[cfg(test)]
mod tests;
