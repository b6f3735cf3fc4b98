//! Where a request's lock key comes from.

use std::fmt;
use std::sync::Arc;

use axum::extract::{FromRequestParts, MatchedPath, RawPathParams};
use http::HeaderName;
use http::request::Parts;

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
    /// path: percent-escapes decoded, empty segments dropped, so `/a//%62`
    /// and `/a/b` share a key.
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
    /// `"/data/object/id"`. Strings and integers of up to 64 bits are
    /// accepted; other numbers (fractions, larger integers, which lose
    /// digits on the way) count as no key: send such ids as strings. The body is
    /// read (within the body limit) and handed to the service unchanged.
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
            Kind::JsonPointer(p) => {
                format!("JSON body field `{p}` (a string, or an integer of at most 64 bits)")
            }
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
    /// is not ours to guess.
    pub(crate) async fn id_in_head(&self, parts: &mut Parts) -> Result<Option<Vec<u8>>, Repeated> {
        let id = match &self.kind {
            Kind::Path => Some(canonical_path(parts.uri.path())),
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
                    return Err(Repeated);
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

    /// Finds the id in a JSON body (for [`KeyFrom::body_digest`]: the
    /// body's digest, JSON or not).
    pub(crate) fn id_in_json(&self, body: &[u8]) -> Result<Option<String>, serde_json::Error> {
        let pointer = match &self.kind {
            Kind::JsonPointer(pointer) => pointer,
            Kind::BodyDigest => return Ok(body_digest(body)),
            _ => return Ok(None),
        };
        let value: serde_json::Value = serde_json::from_slice(body)?;
        Ok(match value.pointer(pointer) {
            Some(serde_json::Value::String(s)) if !s.is_empty() => Some(s.clone()),
            // Integers only: any other number went through an `f64`, where
            // two different ids (`1e400`, 23-digit integers) can meet.
            Some(serde_json::Value::Number(n)) if n.is_i64() || n.is_u64() => Some(n.to_string()),
            _ => None,
        })
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

/// A key source that appears more than once in the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Repeated;

/// Appends `s` to `out` with each `%XX` decoded to its byte (a `%` not
/// followed by two hex digits stays as it is) and, for a query, `+` as a
/// space.
fn percent_decode(out: &mut Vec<u8>, s: &[u8], plus_is_space: bool) {
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
                out.push(c);
                i += 1;
            }
        }
    }
}

fn form_decode(s: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    percent_decode(&mut out, s.as_bytes(), true);
    out
}

fn hex(c: u8) -> Option<u8> {
    (c as char).to_digit(16).map(|d| d as u8)
}

/// The value of query parameter `name`, decoded to bytes; `Repeated` if it
/// appears twice.
fn query_value(query: &str, name: &str) -> Result<Option<Vec<u8>>, Repeated> {
    let mut found = None;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if form_decode(k) == name.as_bytes() {
            if found.is_some() {
                return Err(Repeated);
            }
            found = Some(form_decode(v));
        }
    }
    Ok(found)
}

/// One spelling per path: percent-escapes decoded to bytes, empty segments
/// dropped (`/a//%62` and `/a/b` share a key). Decoding `%2F` may merge two
/// paths that route apart; that only makes them exclude each other.
fn canonical_path(path: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(path.len());
    for seg in path.split('/').filter(|s| !s.is_empty()) {
        out.push(b'/');
        percent_decode(&mut out, seg.as_bytes(), false);
    }
    if out.is_empty() || (path.ends_with('/') && path.len() > 1) {
        out.push(b'/');
    }
    out
}

/// The default namespace of a layer: the matched route template, so that
/// two routes under one layer never share locks by accident.
pub(crate) fn route_namespace(extensions: &http::Extensions) -> Option<String> {
    let route = extensions.get::<MatchedPath>()?.as_str();
    let route_trimmed = route.trim_start_matches('/');
    let mut ns: String = route_trimmed
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'/') {
                b as char
            } else {
                '_'
            }
        })
        .collect();
    if ns.is_empty() {
        ns.push('_');
    }
    if ns.len() > crate::MAX_NAMESPACE {
        use sha2::Digest;
        let digest = sha2::Sha256::digest(route.as_bytes());
        ns.truncate(crate::MAX_NAMESPACE - 17);
        ns.push('.');
        crate::key::push_hex(&mut ns, &digest[..8]);
    }
    Some(ns)
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
mod tests {
    use super::*;
    use http::HeaderValue;

    fn parts(uri: &str) -> Parts {
        http::Request::builder()
            .uri(uri)
            .header("x-delivery", "d-1")
            .body(())
            .unwrap()
            .into_parts()
            .0
    }

    async fn id(k: &KeyFrom, p: &mut Parts) -> Result<Option<Vec<u8>>, Repeated> {
        k.id_in_head(p).await
    }

    fn found(id: &[u8]) -> Result<Option<Vec<u8>>, Repeated> {
        Ok(Some(id.to_vec()))
    }

    #[tokio::test]
    async fn head_sources() {
        let mut p = parts("/a/b?event=e%201&x=2");
        assert_eq!(id(&KeyFrom::path(), &mut p).await, found(b"/a/b"));
        assert_eq!(id(&KeyFrom::query("event"), &mut p).await, found(b"e 1"));
        assert_eq!(id(&KeyFrom::query("nope"), &mut p).await, Ok(None));
        let delivery = KeyFrom::header(HeaderName::from_static("x-delivery"));
        assert_eq!(id(&delivery, &mut p).await, found(b"d-1"));
        let custom = KeyFrom::custom(|p| Some(p.method.to_string()));
        assert_eq!(id(&custom, &mut p).await, found(b"GET"));
        // Outside an axum router there are no path params.
        assert_eq!(id(&KeyFrom::path_param("id"), &mut p).await, Ok(None));
    }

    #[tokio::test]
    async fn one_spelling_per_id_and_no_repeats() {
        let path = KeyFrom::path();
        for (a, b) in [
            ("/a/b", "/a//%62"),
            ("/a/b/", "//a/b//"),
            ("/", "//"),
            ("/%7Bx%7D", "/{x}"),
        ] {
            assert_eq!(
                id(&path, &mut parts(a)).await,
                id(&path, &mut parts(b)).await,
                "{a} vs {b}"
            );
        }
        assert_ne!(
            id(&path, &mut parts("/a/b")).await,
            id(&path, &mut parts("/a/b/")).await
        );
        // Raw bytes, never lossily decoded: %FF and %FE stay apart.
        let q = KeyFrom::query("id");
        assert_eq!(id(&q, &mut parts("/?id=%FF")).await, found(b"\xff"));
        assert_eq!(id(&q, &mut parts("/?i%64=a+b%2")).await, found(b"a b%2"));
        assert_eq!(id(&q, &mut parts("/?id=a&id=b")).await, Err(Repeated));
        assert_eq!(id(&q, &mut parts("/?id=a&id=a")).await, Err(Repeated));
        assert_eq!(id(&q, &mut parts("/?id=&x=1")).await, Ok(None));
        let h = KeyFrom::header(HeaderName::from_static("x-id"));
        let mut twice = http::Request::builder()
            .header("x-id", "a")
            .header("x-id", "b")
            .body(())
            .unwrap()
            .into_parts()
            .0;
        assert_eq!(id(&h, &mut twice).await, Err(Repeated));
        let mut odd = http::Request::builder()
            .header("x-id", HeaderValue::from_bytes(b"\xff").unwrap())
            .body(())
            .unwrap()
            .into_parts()
            .0;
        assert_eq!(id(&h, &mut odd).await, found(b"\xff"));
    }

    #[test]
    fn json_sources() {
        let k = KeyFrom::json_pointer("/data/object/id");
        assert_eq!(
            k.id_in_json(br#"{"data":{"object":{"id":"evt_1"}}}"#)
                .unwrap(),
            Some("evt_1".into())
        );
        assert_eq!(
            k.id_in_json(br#"{"data":{"object":{"id":42}}}"#).unwrap(),
            Some("42".into())
        );
        assert_eq!(k.id_in_json(br#"{"data":{}}"#).unwrap(), None);
        assert_eq!(
            k.id_in_json(br#"{"data":{"object":{"id":""}}}"#).unwrap(),
            None
        );
        assert!(k.id_in_json(b"{not json").is_err());
    }

    #[test]
    fn body_digest_source() {
        let k = KeyFrom::body_digest();
        assert!(k.needs_body());
        // `printf abc | sha256sum`
        assert_eq!(
            k.id_in_json(b"abc").unwrap().as_deref(),
            Some("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        );
        // The exact bytes: the same body, the same id; one byte apart (even
        // the same JSON spelled otherwise), another id.
        let a = br#"{"after":"abc123"}"#;
        assert_eq!(k.id_in_json(a).unwrap(), k.id_in_json(a).unwrap());
        for other in [
            &br#"{"after":"abc124"}"#[..],
            br#"{"after": "abc123"}"#,
            b"\xff",
        ] {
            assert_ne!(k.id_in_json(a).unwrap(), k.id_in_json(other).unwrap());
        }
        // Not JSON is fine; empty is no key.
        assert!(k.id_in_json(b"not json").unwrap().is_some());
        assert_eq!(k.id_in_json(b"").unwrap(), None);
        assert_eq!(format!("{k:?}"), "KeyFrom::body_digest()");
    }
}
