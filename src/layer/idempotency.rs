//! Idempotent replay of completed requests (webhooks, `Idempotency-Key`).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, StatusCode, header};

use super::key::KeyFrom;
use crate::error::ConfigError;

mod fingerprint;
mod record;

pub use record::Record;

/// Header set on replayed responses.
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// Default retention of completed records: 4 days. Stripe retries a
/// delivery for up to 3 days, and GitHub lets you redeliver the last 3 days;
/// a duplicate must still find its record then, so the default covers both
/// with a day to spare.
pub(crate) const DEFAULT_RETENTION: Duration = Duration::from_secs(4 * 24 * 3600);
/// Default largest response body stored for replay: 256 KiB.
pub(crate) const DEFAULT_MAX_STORED_BODY: usize = 256 << 10;
/// Longest retention of completed records [`Idempotency::retention`]
/// accepts: 365 days.
pub const MAX_RETENTION: Duration = Duration::from_secs(365 * 24 * 3600);

/// Representation headers: they give the stored bytes their meaning, so they
/// are always stored and replayed, whatever
/// [`replay_headers`](Idempotency::replay_headers) says.
pub(crate) static REPRESENTATION_HEADERS: [HeaderName; 7] = [
    header::CONTENT_TYPE,
    header::CONTENT_ENCODING,
    header::CONTENT_LANGUAGE,
    header::CONTENT_LOCATION,
    header::CONTENT_RANGE,
    HeaderName::from_static("content-digest"),
    HeaderName::from_static("repr-digest"),
];

/// Headers that are part of the answer, not of one transfer of it: where
/// the created resource is, its validators and links, how it may be
/// cached. Stored and replayed by default, so a replayed `201 Created`
/// still says where.
pub(crate) static ANSWER_HEADERS: [HeaderName; 8] = [
    header::LOCATION,
    header::ETAG,
    header::LAST_MODIFIED,
    header::LINK,
    header::CACHE_CONTROL,
    header::EXPIRES,
    header::VARY,
    header::ALLOW,
];

/// The bounds on how a record is kept: a retention of 1 s to
/// [`MAX_RETENTION`] and a stored body of at most 64 MiB (a layer's
/// settings, and a hand-off's read back from a worker's job).
pub(crate) fn check_record(retention: Duration, max_body: usize) -> Result<(), ConfigError> {
    if retention < Duration::from_secs(1) {
        return Err(ConfigError::new("retention", "must be at least 1 s"));
    }
    if retention > MAX_RETENTION {
        return Err(ConfigError::new("retention", "must be at most 365 days"));
    }
    if max_body > 64 << 20 {
        return Err(ConfigError::new(
            "max_stored_body",
            "must be at most 64 MiB",
        ));
    }
    Ok(())
}

/// A fencing-token header may not be one that describes the connection or
/// the transfer ([`never_stored`]): the token would replace it.
pub(crate) fn check_fencing_header(name: &HeaderName) -> Result<(), ConfigError> {
    if never_stored(name) {
        return Err(ConfigError::new(
            "fencing_header",
            format!("`{name}` describes the connection or the transfer, not the answer"),
        ));
    }
    Ok(())
}

/// Headers never stored, whatever the list says: they describe one
/// connection, one transfer or one moment (`Date`: a replay is sent now),
/// not the answer.
pub(crate) fn never_stored(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "content-length"
            | "transfer-encoding"
            | "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "te"
            | "trailer"
            | "upgrade"
            | "date"
    )
}

/// The headers that describe the stored bytes themselves (their coding,
/// range, digest and validator): left out of the replay of a record whose
/// body was not stored, whose empty body they would misdescribe (a cache
/// would keep the empty body under the `ETag`).
pub(crate) fn describes_bytes(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "content-encoding" | "content-range" | "content-digest" | "repr-digest" | "etag"
    )
}

/// How a request is fingerprinted, so that a key reused with a different
/// request is refused (422) instead of replaying an unrelated response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Fingerprint {
    /// SHA-256 of the request body, byte for byte (default; the body is
    /// read within the layer's body limit): the same JSON with other
    /// whitespace or member order is a different request (422).
    #[default]
    Body,
    /// SHA-256 of the body's JSON in one canonical form: members sorted by
    /// name, no whitespace, strings and numbers as serde_json reads and
    /// writes them (so `1.0` and `1e0` are one number, `1` another). A body
    /// that is not JSON, names a member twice in one object, or has an
    /// integral number past 64 bits (which serde_json would round into an
    /// `f64`) is fingerprinted byte for byte, as with `Body`.
    Json,
    /// No fingerprint: any request with the key gets the stored response.
    None,
}

type StorePredicate = Arc<dyn Fn(StatusCode) -> bool + Send + Sync>;

/// Settings for idempotent processing; turn it on with
/// [`LockLayerBuilder::idempotent`](crate::LockLayerBuilder::idempotent).
///
/// Three states per key: *in flight* (the lock is held: a duplicate gets 409,
/// or waits up to the locker's wait timeout and gets the record),
/// *completed* (a record: the duplicate gets the stored response with
/// `Idempotent-Replayed: true`, without running the handler) and *absent*
/// (the request runs). Storing the record and releasing the lock are one
/// atomic step.
///
/// By default 2xx and final 4xx answers are stored (not 408, 409, 425 and
/// 429, which invite a retry), never 5xx: a failed attempt can be retried,
/// and so can a request whose handler panicked or whose client went away,
/// since those store nothing. Refusals of a lock layer inside this one are
/// never stored (see [`store_when`](Idempotency::store_when)).
///
/// A handler that releases the lock itself
/// ([`LockGuard::release`](crate::LockGuard::release) on the guard it
/// extracted) opts that request out of the record: its response is sent as
/// it is, nothing is stored, and the next duplicate runs the handler again.
/// (To keep an outcome, let the layer store it; to end early, answer.)
#[derive(Clone)]
pub struct Idempotency {
    pub(crate) retention: Duration,
    pub(crate) max_body: usize,
    pub(crate) headers: Vec<HeaderName>,
    pub(crate) fingerprint: Fingerprint,
    pub(crate) store_when: StorePredicate,
    pub(crate) scope: Option<KeyFrom>,
}

impl Default for Idempotency {
    fn default() -> Self {
        Idempotency {
            retention: DEFAULT_RETENTION,
            max_body: DEFAULT_MAX_STORED_BODY,
            headers: Vec::new(),
            fingerprint: Fingerprint::default(),
            store_when: Arc::new(default_store_when),
            scope: None,
        }
    }
}

/// 2xx and final 4xx; not 408, 409, 425, 429; never 5xx.
fn default_store_when(status: StatusCode) -> bool {
    status.is_success()
        || (status.is_client_error() && !matches!(status.as_u16(), 408 | 409 | 425 | 429))
}

impl Idempotency {
    /// The defaults: 4 days' retention (Stripe retries for up to 3 days,
    /// GitHub redelivers the last 3), bodies up to 256 KiB, representation
    /// headers and trailers replayed, body fingerprint.
    pub fn new() -> Self {
        Self::default()
    }

    /// How long a completed record answers duplicates (default 4 days,
    /// beyond the 3 days of Stripe's retries and GitHub's redeliveries): at least 1 s, at
    /// most [`MAX_RETENTION`] (365 days); [`LockLayerBuilder::build`](crate::LockLayerBuilder::build)
    /// refuses anything else with a `ConfigError`.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// Largest response body stored (default 256 KiB, at most 64 MiB).
    ///
    /// A response whose body is over it is still sent whole to its client,
    /// streamed **under the lock**: the lock is held until the body ends.
    /// Only a body that ends cleanly is recorded, then as status, headers and
    /// trailers without the body (`Record::body_omitted`), stored with the
    /// release in one step before the client sees the end of the body; a
    /// replay has an empty body and leaves out the headers that describe the
    /// omitted bytes (`Content-Encoding`, `Content-Range`, digests). A body
    /// that fails, or whose client goes away, stores nothing and frees the
    /// key: the next duplicate runs the handler again.
    pub fn max_stored_body(mut self, max: usize) -> Self {
        self.max_body = max;
        self
    }

    /// More response headers kept for replay (default: none). Always kept,
    /// so that a replay is the same answer:
    ///
    /// - the representation headers that give the stored bytes their
    ///   meaning: `Content-Type`, `Content-Encoding`, `Content-Language`,
    ///   `Content-Location`, `Content-Range`, `Content-Digest`,
    ///   `Repr-Digest`;
    /// - the headers that are part of the answer: `Location`, `ETag`,
    ///   `Last-Modified`, `Link`, `Cache-Control`, `Expires`, `Vary`,
    ///   `Allow`;
    /// - the layer's fencing-token header (the token of the run that
    ///   answered), and the response's trailers.
    ///
    /// Never kept, even when listed: `Date` (a replay is sent now) and the
    /// headers of one connection or transfer (`Content-Length`,
    /// `Transfer-Encoding`, `Connection`, `Keep-Alive`, `TE`, `Trailer`,
    /// `Upgrade`, `Proxy-*`). `Set-Cookie` and your own headers are kept
    /// only when listed here. Each name is stored once.
    pub fn replay_headers(mut self, headers: impl IntoIterator<Item = HeaderName>) -> Self {
        self.headers = headers.into_iter().collect();
        self
    }

    /// Scopes keys per client: the value `principal` reads from each request
    /// (the authenticated account, from an extension your auth layer sets,
    /// read with [`KeyFrom::extract`]; a tenant header your gateway sets
    /// after authentication) is part of the record's key. Client B sending
    /// the `Idempotency-Key` client A used never gets A's stored response;
    /// A still gets its replay. A request without a principal is refused
    /// with 400 before any store call. The source must read the request
    /// head (not a body field): [`LockLayerBuilder::build`](crate::LockLayerBuilder::build)
    /// refuses a body source with a `ConfigError`.
    ///
    /// ```
    /// use axum::http::HeaderName;
    /// use tower_redis_lock::{Idempotency, KeyFrom};
    ///
    /// // The account id your authentication layer put in the request.
    /// #[derive(Clone)]
    /// struct Account(u64);
    ///
    /// let idempotency = Idempotency::new().scope(KeyFrom::extract(
    ///     |axum::Extension(Account(id)): axum::Extension<Account>| id,
    /// ));
    /// # let _ = idempotency;
    /// ```
    pub fn scope(mut self, principal: KeyFrom) -> Self {
        self.scope = Some(principal);
        self
    }

    /// How requests are fingerprinted (default: body hash).
    pub fn fingerprint(mut self, fingerprint: Fingerprint) -> Self {
        self.fingerprint = fingerprint;
        self
    }

    /// Which statuses are stored (default: 2xx and final 4xx).
    ///
    /// A refusal by a lock layer of this crate inside this one (contention,
    /// the store unavailable, a bad key, a lost lock) is never stored,
    /// whatever its status (`contention_status(LOCKED)`, a rejection hook's
    /// choice) and whatever this predicate says: it is not the request's
    /// outcome, and a duplicate must be able to run.
    pub fn store_when<F>(mut self, predicate: F) -> Self
    where
        F: Fn(StatusCode) -> bool + Send + Sync + 'static,
    {
        self.store_when = Arc::new(predicate);
        self
    }

    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        check_record(self.retention, self.max_body)?;
        if self.scope.as_ref().is_some_and(KeyFrom::needs_body) {
            return Err(ConfigError::new(
                "scope",
                "the client scope must be read from the request head, not its body",
            ));
        }
        Ok(())
    }
}

impl fmt::Debug for Idempotency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Idempotency")
            .field("retention", &self.retention)
            .field("max_body", &self.max_body)
            .field("headers", &self.headers)
            .field("fingerprint", &self.fingerprint)
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_policy_stores_final_answers_only() {
        for ok in [200, 201, 204, 400, 404, 410, 422] {
            assert!(
                default_store_when(StatusCode::from_u16(ok).unwrap()),
                "{ok}"
            );
        }
        for retry in [408, 409, 425, 429, 500, 502, 503, 504, 302] {
            assert!(
                !default_store_when(StatusCode::from_u16(retry).unwrap()),
                "{retry}"
            );
        }
    }

    #[test]
    fn a_client_scope_is_read_from_the_head_only() {
        let head = Idempotency::new().scope(KeyFrom::header(HeaderName::from_static("x-client")));
        assert!(head.check().is_ok());
        let body = Idempotency::new().scope(KeyFrom::json_pointer::<String>("/client"));
        assert_eq!(body.check().unwrap_err().setting(), "scope");
    }
}
