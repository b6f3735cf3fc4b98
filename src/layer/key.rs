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
    Custom(CustomFn),
}

impl KeyFrom {
    /// The whole request path (without the query).
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

    /// A request header, e.g. `Idempotency-Key` or `X-GitHub-Delivery`.
    pub fn header(name: HeaderName) -> Self {
        KeyFrom {
            kind: Kind::Header(name),
        }
    }

    /// A query-string parameter.
    pub fn query(name: &str) -> Self {
        KeyFrom {
            kind: Kind::Query(name.into()),
        }
    }

    /// A field of a JSON body, by JSON pointer (RFC 6901), e.g. `"/id"` or
    /// `"/data/object/id"`. Strings and numbers are accepted. The body is
    /// read (within the body limit) and handed to the service unchanged.
    pub fn json_pointer(pointer: &str) -> Self {
        KeyFrom {
            kind: Kind::JsonPointer(pointer.into()),
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
            Kind::JsonPointer(p) => format!("JSON body field `{p}` (a string or number)"),
            Kind::Custom(_) => "a key from the request (custom extractor)".to_owned(),
        }
    }

    /// Whether the key is a path parameter of a matched route.
    pub(crate) fn is_path_param(&self) -> bool {
        matches!(self.kind, Kind::PathParam(_))
    }

    /// Whether the body must be read to find the key.
    pub(crate) fn needs_body(&self) -> bool {
        matches!(self.kind, Kind::JsonPointer(_))
    }

    /// Finds the id in the request head (every source but the body).
    pub(crate) async fn id_in_head(&self, parts: &mut Parts) -> Option<String> {
        match &self.kind {
            Kind::Path => Some(parts.uri.path().to_owned()),
            Kind::PathParam(name) => {
                let params = RawPathParams::from_request_parts(parts, &()).await.ok()?;
                params
                    .iter()
                    .find(|(k, _)| *k == &**name)
                    .map(|(_, v)| v.to_owned())
            }
            Kind::Header(name) => parts
                .headers
                .get(name)
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned()),
            Kind::Query(name) => parts.uri.query().and_then(|q| {
                form_urlencoded::parse(q.as_bytes())
                    .find(|(k, _)| k == &**name)
                    .map(|(_, v)| v.into_owned())
            }),
            Kind::Custom(f) => f(parts),
            Kind::JsonPointer(_) => None,
        }
        .filter(|id| !id.is_empty())
    }

    /// Finds the id in a JSON body.
    pub(crate) fn id_in_json(&self, body: &[u8]) -> Result<Option<String>, serde_json::Error> {
        let Kind::JsonPointer(pointer) = &self.kind else {
            return Ok(None);
        };
        let value: serde_json::Value = serde_json::from_slice(body)?;
        Ok(match value.pointer(pointer) {
            Some(serde_json::Value::String(s)) if !s.is_empty() => Some(s.clone()),
            Some(serde_json::Value::Number(n)) => Some(n.to_string()),
            _ => None,
        })
    }
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
            Kind::Custom(_) => f.write_str("KeyFrom::custom(..)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(uri: &str) -> Parts {
        http::Request::builder()
            .uri(uri)
            .header("x-delivery", "d-1")
            .body(())
            .unwrap()
            .into_parts()
            .0
    }

    #[tokio::test]
    async fn head_sources() {
        let mut p = parts("/a/b?event=e%201&x=2");
        assert_eq!(
            KeyFrom::path().id_in_head(&mut p).await.as_deref(),
            Some("/a/b")
        );
        assert_eq!(
            KeyFrom::query("event").id_in_head(&mut p).await.as_deref(),
            Some("e 1")
        );
        assert_eq!(KeyFrom::query("nope").id_in_head(&mut p).await, None);
        assert_eq!(
            KeyFrom::header(HeaderName::from_static("x-delivery"))
                .id_in_head(&mut p)
                .await
                .as_deref(),
            Some("d-1")
        );
        let custom = KeyFrom::custom(|p| Some(p.method.to_string()));
        assert_eq!(custom.id_in_head(&mut p).await.as_deref(), Some("GET"));
        // Outside an axum router there are no path params.
        assert_eq!(KeyFrom::path_param("id").id_in_head(&mut p).await, None);
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
}
