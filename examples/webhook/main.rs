//! A webhook receiver that applies every event exactly once, however often
//! and however concurrently the sender delivers it.
//!
//! ```text
//! cargo run --example webhook                                       # in-memory store
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --example webhook     # Redis
//! ```
//!
//! Then, in another terminal, sign and send a Stripe-style event twice:
//!
//! ```text
//! body='{"id":"evt_1","type":"payment_intent.succeeded"}'
//! t=$(date +%s)
//! sig=$(printf '%s.%s' "$t" "$body" | openssl dgst -sha256 -hmac whsec_demo -r | cut -d' ' -f1)
//! curl -i localhost:3000/webhooks/stripe -H "Stripe-Signature: t=$t,v1=$sig" -d "$body"
//! curl -i localhost:3000/webhooks/stripe -H "Stripe-Signature: t=$t,v1=$sig" -d "$body"
//! curl -s localhost:3000/ledger                                # {"evt_1":1}
//! ```
//!
//! The second answer is the first one replayed (`idempotent-replayed: true`);
//! sent while the first still runs, it gets `409` and Stripe retries later.
//!
//! Routes:
//!
//! * `POST /webhooks/stripe` checks `Stripe-Signature: t=<unix secs>,v1=<hex
//!   HMAC-SHA256 of "<t>.<raw body>">` (5-minute tolerance) *before* any
//!   lock: a bad, missing or expired signature gets `400`
//!   `application/problem+json` and touches no Redis key. The event is then
//!   locked and deduplicated on its JSON `id` (namespace `stripe`): a
//!   duplicate in flight gets `409`, a completed one its stored answer.
//! * `POST /webhooks/github` checks `X-Hub-Signature-256: sha256=<hex
//!   HMAC-SHA256 of the raw body>` the same way (and wants one
//!   `X-GitHub-Delivery` header), then locks and deduplicates on the
//!   SHA-256 digest of the body ([`KeyFrom::body_digest`], namespace
//!   `github`). GitHub signs the body and nothing else: the delivery id is
//!   unsigned, and anyone who captured a delivery can send it again under
//!   fresh delivery ids. Keyed on the body, such a replay is the same
//!   delivery: it gets the stored answer (or waits for the first) and
//!   applies nothing. The delivery id is kept as information, in the logs,
//!   the ledger entry and the answer. GitHub does not retry by itself, so a
//!   duplicate that arrives while the first runs *waits* (up to 10 s) and
//!   gets the first one's answer replayed.
//! * `GET /ledger` answers `{"<event id>": <times applied>, ...}`.
//!
//! Applying an event means counting it in the ledger, with the lock's
//! fencing token: in Redis (`ledger:{webhooks}:<id>`, a
//! [`FencedResource`]) with `REDIS_URL`, in memory otherwise. A holder whose
//! lock was taken over (paused past its lease) is refused by the ledger
//! instead of counting twice. Each handler works `WORK_MS` first, then
//! applies and answers `200 {"received": true, "id": ...}`.
//!
//! What the lock and the record cannot cover:
//!
//! * The ledger write and the stored answer are two steps. A crash between
//!   them (after the count, before the record), or the request timeout
//!   striking there, lets the next delivery count again. Where that
//!   matters, make the effect itself idempotent as well (a unique
//!   constraint on the event id in the same transaction as the effect).
//! * GitHub signs no timestamp: a captured delivery replayed *after* its
//!   record expired (`RETENTION`, three days) is applied again, and nothing
//!   in the request can tell it from a new one. Stripe's signed timestamp
//!   (5-minute tolerance) closes that door for Stripe.
//! * Two genuinely different GitHub deliveries whose bodies are byte for
//!   byte the same count as one (the second gets the first's answer).
//!   GitHub's payloads name the repository, the hook and the commit or
//!   object they report, so two distinct events rarely share every byte.
//!
//! Slow clients are cut off (see [`DEFAULT_TIMEOUTS`]): a head not sent
//! whole within `HEADER_TIMEOUT_MS` closes the connection, a body that stops
//! short of its `Content-Length` gets `408` after `BODY_TIMEOUT_MS`, and a
//! declared `Content-Length` over [`MAX_BODY`] gets `413` before a byte of
//! the body is read.
//!
//! Environment:
//!
//! | variable         | default      | meaning                                        |
//! |------------------|--------------|------------------------------------------------|
//! | `PORT`           | 3000         | port on 127.0.0.1 (0 picks a free one)         |
//! | `REDIS_URL`      | unset        | locks, records and ledger in Redis; unset: in memory |
//! | `WEBHOOK_SECRET` | `whsec_demo` | signing secret (the demo uses one for both providers) |
//! | `WORK_MS`        | 200          | how long a delivery works before it applies    |
//! | `HEADER_TIMEOUT_MS`  | 10000    | a request head must arrive whole within this, or the connection is closed |
//! | `BODY_TIMEOUT_MS`    | 10000    | a body must arrive whole within this after the head, or `408` |
//! | `REQUEST_TIMEOUT_MS` | 30000    | answer within this, or the delivery is dropped (lock released, nothing stored) and the sender gets `408` |
//! | `RUST_LOG`       | info         | log filter (`tracing_subscriber::EnvFilter`)   |
//!
//! A bad value is reported with the variable's name and exits with code 2.

#[path = "common/mod.rs"]
mod common;

pub use common::Timeouts;
use common::{Failure, redact};
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use hmac::{Hmac, Mac};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use sha2::Sha256;
use tower_http::timeout::TimeoutError;
use tower_redis_lock::deadpool_redis;
use tower_redis_lock::layer::PROBLEM_JSON;
use tower_redis_lock::{
    ConfigError, DEFAULT_LEASE, FenceOutcome, FencedResource, FencingToken, Idempotency, KeyFrom,
    LockGuard, LockLayer, LockStore, Locker, MemoryStore, RedisStore,
};

type HmacSha256 = Hmac<Sha256>;

/// Default signing secret.
pub const DEFAULT_SECRET: &str = "whsec_demo";
/// How far a `Stripe-Signature` timestamp may be from now.
pub const TOLERANCE: Duration = Duration::from_secs(300);
/// Default work per delivery.
pub const DEFAULT_WORK: Duration = Duration::from_millis(200);
/// How long a duplicate GitHub delivery waits for the first one.
pub const GITHUB_WAIT: Duration = Duration::from_secs(10);
/// How long completed deliveries are remembered (Stripe retries for up to
/// three days).
pub const RETENTION: Duration = Duration::from_secs(3 * 24 * 3600);
/// Largest webhook body read.
pub const MAX_BODY: usize = 1 << 20;
/// Redis key prefix of the ledger entries.
pub const LEDGER_PREFIX: &str = "ledger:{webhooks}:";
/// Namespace of the Stripe event locks.
pub const STRIPE_NAMESPACE: &str = "stripe";
/// Namespace of the GitHub delivery locks.
pub const GITHUB_NAMESPACE: &str = "github";
/// Time limits when the environment sets none. The request timeout leaves
/// a waiting GitHub duplicate ([`GITHUB_WAIT`]) and the work time to end.
pub const DEFAULT_TIMEOUTS: Timeouts = Timeouts {
    header: Duration::from_secs(10),
    body: Duration::from_secs(10),
    request: Duration::from_secs(30),
};

const STRIPE_SIGNATURE: HeaderName = HeaderName::from_static("stripe-signature");
const GITHUB_SIGNATURE: HeaderName = HeaderName::from_static("x-hub-signature-256");
const GITHUB_DELIVERY: HeaderName = HeaderName::from_static("x-github-delivery");
/// Bound on each ledger call, so a frozen Redis answers 503, not a hang.
const LEDGER_TIMEOUT: Duration = Duration::from_secs(2);

// ---------------------------------------------------------------------------
// Signatures
// ---------------------------------------------------------------------------

/// The `Stripe-Signature` header value for `body` signed at `t` (unix
/// seconds) with `secret`: `t=<t>,v1=<hex HMAC-SHA256 of "<t>.<body>">`.
pub fn sign(secret: &str, t: u64, body: &[u8]) -> String {
    let mut mac = mac(secret);
    mac.update(format!("{t}.").as_bytes());
    mac.update(body);
    format!("t={t},v1={}", hex::encode(mac.finalize().into_bytes()))
}

/// The `X-Hub-Signature-256` header value for `body`: `sha256=<hex HMAC>`.
pub fn sign_github(secret: &str, body: &[u8]) -> String {
    let mut mac = mac(secret);
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

fn mac(secret: &str) -> HmacSha256 {
    // HMAC takes keys of any length; this never fails.
    <HmacSha256 as Mac>::new_from_slice(secret.as_bytes())
        .unwrap_or_else(|_| unreachable!("HMAC accepts keys of any length"))
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Checks a `Stripe-Signature` header against `body`: the timestamp within
/// `tolerance` of `now`, and one of the `v1` signatures (there are several
/// while a secret is rolled) the HMAC of `"<t>.<body>"`, compared in
/// constant time.
pub fn verify_stripe(
    secret: &str,
    header: &str,
    body: &[u8],
    now: u64,
    tolerance: Duration,
) -> Result<(), &'static str> {
    let mut t = None;
    let mut candidates = Vec::new();
    for part in header.split(',') {
        match part.trim().split_once('=') {
            Some(("t", v)) if t.is_none() => t = Some(v),
            Some(("t", _)) => return Err("the signature header has more than one timestamp"),
            Some(("v1", v)) => candidates.push(v),
            _ => {}
        }
    }
    let t = t.ok_or("the signature header has no timestamp `t=`")?;
    let ts: u64 = t
        .parse()
        .map_err(|_| "the signature timestamp is not a whole number of seconds")?;
    if candidates.is_empty() {
        return Err("the signature header has no `v1=` signature");
    }
    let mut expected = mac(secret);
    expected.update(t.as_bytes());
    expected.update(b".");
    expected.update(body);
    let matches = candidates
        .iter()
        .any(|c| hex::decode(c).is_ok_and(|sig| expected.clone().verify_slice(&sig).is_ok()));
    if !matches {
        return Err("no `v1` signature matches the body");
    }
    if now.abs_diff(ts) > tolerance.as_secs() {
        return Err("the signature timestamp is outside the tolerance");
    }
    Ok(())
}

/// Checks an `X-Hub-Signature-256` header against `body`, in constant time.
pub fn verify_github(secret: &str, header: &str, body: &[u8]) -> Result<(), &'static str> {
    let hex_sig = header
        .trim()
        .strip_prefix("sha256=")
        .ok_or("the signature is not of the form `sha256=<hex>`")?;
    let sig = hex::decode(hex_sig).map_err(|_| "the signature is not hex")?;
    let mut expected = mac(secret);
    expected.update(body);
    expected
        .verify_slice(&sig)
        .map_err(|_| "the signature does not match the body")
}

/// Which signature scheme a route checks.
#[derive(Debug, Clone, Copy)]
enum Scheme {
    Stripe,
    GitHub,
}

#[derive(Debug)]
struct Verifier {
    secret: String,
    tolerance: Duration,
    scheme: Scheme,
}

/// Middleware in front of the lock layer: reads the body (within
/// [`MAX_BODY`]), checks the signature, and hands the same bytes on. A
/// refused request never reaches the lock layer, so it costs no Redis work.
///
/// A declared `Content-Length` over the limit is answered `413` before a
/// byte of the body is read; a body that stops short of its declared length
/// runs into the server's body deadline and gets `408`.
async fn verify_signature(State(v): State<Arc<Verifier>>, req: Request, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    let too_large = || {
        problem(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!("the webhook body is larger than {MAX_BODY} bytes"),
        )
    };
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY as u64) {
        return too_large();
    }
    if matches!(v.scheme, Scheme::GitHub) && !one_delivery_id(&parts.headers) {
        // The ledger and the logs name each delivery by it; without one,
        // the request is not GitHub's.
        return problem(
            StatusCode::BAD_REQUEST,
            &format!("missing, repeated or unreadable `{GITHUB_DELIVERY}` header"),
        );
    }
    let body = match Limited::new(body, MAX_BODY).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => return too_large(),
        Err(e) if is_timeout(&*e) => {
            tracing::info!(scheme = ?v.scheme, "webhook body not received in time");
            return problem(
                StatusCode::REQUEST_TIMEOUT,
                "the webhook body did not arrive in time",
            );
        }
        Err(_) => {
            return problem(
                StatusCode::BAD_REQUEST,
                "the webhook body could not be read",
            );
        }
    };
    let (name, checked) = match v.scheme {
        Scheme::Stripe => (
            STRIPE_SIGNATURE,
            header_str(&parts.headers, &STRIPE_SIGNATURE)
                .map(|h| verify_stripe(&v.secret, h, &body, unix_now(), v.tolerance)),
        ),
        Scheme::GitHub => (
            GITHUB_SIGNATURE,
            header_str(&parts.headers, &GITHUB_SIGNATURE)
                .map(|h| verify_github(&v.secret, h, &body)),
        ),
    };
    match checked {
        None => problem(
            StatusCode::BAD_REQUEST,
            &format!("missing or unreadable `{name}` header"),
        ),
        Some(Err(why)) => {
            tracing::info!(scheme = ?v.scheme, why, "webhook signature refused");
            problem(StatusCode::BAD_REQUEST, &format!("`{name}`: {why}"))
        }
        Some(Ok(())) => {
            let delivery = header_str(&parts.headers, &GITHUB_DELIVERY).map(str::to_owned);
            let res = next.run(Request::from_parts(parts, Body::from(body))).await;
            if res.headers().get("idempotent-replayed").is_some() {
                // A duplicate (for GitHub maybe a replay under a new delivery
                // id): answered from the record, nothing applied.
                tracing::info!(
                    scheme = ?v.scheme,
                    delivery = delivery.as_deref().unwrap_or("-"),
                    "duplicate delivery answered with the stored response"
                );
            }
            res
        }
    }
}

/// Whether the request has exactly one readable, non-empty delivery id.
fn one_delivery_id(headers: &HeaderMap) -> bool {
    let mut all = headers.get_all(&GITHUB_DELIVERY).iter();
    let one = all.next().and_then(|v| v.to_str().ok());
    all.next().is_none() && one.is_some_and(|v| !v.is_empty())
}

/// Whether a body error is (or wraps) the server's body deadline.
fn is_timeout(mut e: &(dyn std::error::Error + 'static)) -> bool {
    loop {
        if e.is::<TimeoutError>() {
            return true;
        }
        match e.source() {
            Some(inner) => e = inner,
            None => return false,
        }
    }
}

fn header_str<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// An RFC 9457 answer, like the lock layer's own.
fn problem(status: StatusCode, detail: &str) -> Response {
    let body = serde_json::json!({
        "type": "about:blank",
        "title": status.canonical_reason().unwrap_or("Error"),
        "status": status.as_u16(),
        "detail": detail,
    });
    let mut res = (status, body.to_string()).into_response();
    res.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    res
}

// ---------------------------------------------------------------------------
// The ledger: the effect, guarded by fencing tokens
// ---------------------------------------------------------------------------

/// What applying an event did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// Counted; the event's count is now `count`.
    Counted {
        /// Times the event has been applied, this one included.
        count: u64,
    },
    /// Refused: a holder with a newer fencing token has written.
    Stale {
        /// The newest token the ledger has seen for this event.
        seen: u64,
    },
}

/// How often each event was applied: the effect the lock protects.
#[derive(Clone)]
pub enum Ledger {
    /// event id → (count, last fencing token).
    Memory(Arc<Mutex<HashMap<String, (u64, u64)>>>),
    /// `ledger:{webhooks}:<id>` hashes written by [`FencedResource`].
    Redis(deadpool_redis::Pool),
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Ledger::Memory(_) => f.write_str("Ledger::Memory"),
            Ledger::Redis(_) => f.write_str("Ledger::Redis"),
        }
    }
}

impl Ledger {
    /// An in-memory ledger.
    pub fn memory() -> Ledger {
        Ledger::Memory(Arc::default())
    }

    /// A ledger in Redis at `url` (connects lazily).
    pub fn redis(url: &str) -> Result<Ledger, String> {
        deadpool_redis::Config::from_url(url)
            .create_pool(Some(deadpool_redis::Runtime::Tokio1))
            .map(Ledger::Redis)
            .map_err(|e| format!("REDIS_URL is not valid: {e}"))
    }

    /// The Redis key of an event's entry.
    pub fn key(id: &str) -> String {
        format!("{LEDGER_PREFIX}{id}")
    }

    /// Counts one application of `id`, if `token` is at least the newest
    /// token the entry has seen.
    pub async fn apply(&self, id: &str, token: FencingToken) -> Result<Applied, String> {
        match self {
            Ledger::Memory(map) => {
                let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
                let (count, last) = map.entry(id.to_owned()).or_default();
                if *last > token.get() {
                    return Ok(Applied::Stale { seen: *last });
                }
                *count += 1;
                *last = token.get();
                Ok(Applied::Counted { count: *count })
            }
            Ledger::Redis(pool) => {
                let work = async {
                    let mut conn = pool.get().await.map_err(|e| e.to_string())?;
                    let entry = FencedResource::new(Ledger::key(id));
                    let current = match entry.get(&mut conn).await.map_err(|e| e.to_string())? {
                        None => 0,
                        Some((value, _)) => std::str::from_utf8(&value)
                            .ok()
                            .and_then(|v| v.parse::<u64>().ok())
                            .ok_or_else(|| format!("ledger entry {id:?} is not a count"))?,
                    };
                    // Read, then write with the token: a newer holder that
                    // wrote in between makes this write Stale.
                    match entry
                        .set(&mut conn, token, current + 1)
                        .await
                        .map_err(|e| e.to_string())?
                    {
                        FenceOutcome::Applied => Ok(Applied::Counted { count: current + 1 }),
                        FenceOutcome::Stale { seen } => Ok(Applied::Stale { seen: seen.get() }),
                    }
                };
                tokio::time::timeout(LEDGER_TIMEOUT, work)
                    .await
                    .map_err(|_| "the ledger did not answer in time".to_owned())?
            }
        }
    }

    /// Every event's count.
    pub async fn counts(&self) -> Result<BTreeMap<String, u64>, String> {
        match self {
            Ledger::Memory(map) => {
                let map = map.lock().unwrap_or_else(|p| p.into_inner());
                Ok(map.iter().map(|(id, (n, _))| (id.clone(), *n)).collect())
            }
            Ledger::Redis(pool) => {
                let work = async {
                    let mut conn = pool.get().await.map_err(|e| e.to_string())?;
                    let mut out = BTreeMap::new();
                    let mut cursor = 0u64;
                    loop {
                        let (next, keys): (u64, Vec<String>) = redis_cmd("SCAN")
                            .arg(cursor)
                            .arg("MATCH")
                            .arg(format!("{LEDGER_PREFIX}*"))
                            .arg("COUNT")
                            .arg(500)
                            .query_async(&mut conn)
                            .await
                            .map_err(|e| e.to_string())?;
                        for key in keys {
                            let value: Option<u64> = redis_cmd("HGET")
                                .arg(&key)
                                .arg("value")
                                .query_async(&mut conn)
                                .await
                                .map_err(|e| e.to_string())?;
                            if let (Some(id), Some(n)) = (key.strip_prefix(LEDGER_PREFIX), value) {
                                out.insert(id.to_owned(), n);
                            }
                        }
                        if next == 0 {
                            return Ok(out);
                        }
                        cursor = next;
                    }
                };
                tokio::time::timeout(LEDGER_TIMEOUT, work)
                    .await
                    .map_err(|_| "the ledger did not answer in time".to_owned())?
            }
        }
    }
}

fn redis_cmd(name: &str) -> tower_redis_lock::redis::Cmd {
    tower_redis_lock::redis::cmd(name)
}

// ---------------------------------------------------------------------------
// The app
// ---------------------------------------------------------------------------

/// A hook run by each delivery under its lock, before it works and applies
/// (tests use it to hold a delivery, fail it or panic in it). `Err` answers
/// 500, so the sender retries.
pub type BeforeApply =
    Arc<dyn Fn(&str) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync>;

/// Settings of [`app`].
#[derive(Clone)]
pub struct Options {
    /// Signing secret of both providers.
    pub secret: String,
    /// Allowed distance of a Stripe signature timestamp from now.
    pub tolerance: Duration,
    /// Work per delivery before it applies.
    pub work: Duration,
    /// Lock lease (renewed while a delivery runs).
    pub lease: Duration,
    /// How long a duplicate GitHub delivery waits for the first.
    pub github_wait: Duration,
    /// How long completed deliveries are remembered (at least 1 s).
    pub retention: Duration,
    /// Run by each delivery before it works (none by default).
    pub before_apply: Option<BeforeApply>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            secret: DEFAULT_SECRET.to_owned(),
            tolerance: TOLERANCE,
            work: DEFAULT_WORK,
            lease: DEFAULT_LEASE,
            github_wait: GITHUB_WAIT,
            retention: RETENTION,
            before_apply: None,
        }
    }
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("tolerance", &self.tolerance)
            .field("work", &self.work)
            .field("lease", &self.lease)
            .field("github_wait", &self.github_wait)
            .field("retention", &self.retention)
            .field("before_apply", &self.before_apply.is_some())
            .finish_non_exhaustive()
    }
}

struct AppState {
    ledger: Ledger,
    work: Duration,
    before_apply: Option<BeforeApply>,
}

/// The receiver's routes over `store` (locks and records) and `ledger`.
///
/// Each webhook route is, from the outside in: signature check → lock layer
/// (idempotent) → handler. The signature is checked first so that an
/// unsigned request can neither hold a lock nor leave a record.
pub fn app<St: LockStore + Clone>(
    store: St,
    ledger: Ledger,
    opts: Options,
) -> Result<Router, ConfigError> {
    let remember = Idempotency::new().retention(opts.retention);
    // Stripe retries for days: an in-flight duplicate gets 409 at once.
    let stripe_lock = LockLayer::builder(
        Locker::builder(store.clone()).lease(opts.lease).build()?,
        KeyFrom::json_pointer("/id"),
    )
    .namespace(STRIPE_NAMESPACE)
    .body_limit(MAX_BODY)
    .idempotent(remember.clone())
    .build()?;
    // GitHub does not retry: an in-flight duplicate waits for the answer.
    // Keyed on the signed body, not on the unsigned delivery id: a captured
    // delivery replayed under new delivery ids is still a duplicate.
    let github_lock = LockLayer::builder(
        Locker::builder(store)
            .lease(opts.lease)
            .wait_timeout(opts.github_wait)
            .build()?,
        KeyFrom::body_digest(),
    )
    .namespace(GITHUB_NAMESPACE)
    .body_limit(MAX_BODY)
    .idempotent(remember)
    .build()?;
    let verifier = |scheme| {
        middleware::from_fn_with_state(
            Arc::new(Verifier {
                secret: opts.secret.clone(),
                tolerance: opts.tolerance,
                scheme,
            }),
            verify_signature,
        )
    };
    let state = Arc::new(AppState {
        ledger,
        work: opts.work,
        before_apply: opts.before_apply.clone(),
    });
    // Each layer wraps what is already there: the last one added runs first.
    // `route_layer` keeps both off the 405 answer for other methods.
    Ok(Router::new()
        .route(
            "/webhooks/stripe",
            post(stripe)
                .route_layer(stripe_lock)
                .route_layer(verifier(Scheme::Stripe)),
        )
        .route(
            "/webhooks/github",
            post(github)
                .route_layer(github_lock)
                .route_layer(verifier(Scheme::GitHub)),
        )
        .route("/ledger", get(show_ledger))
        .with_state(state))
}

async fn stripe(State(app): State<Arc<AppState>>, guard: LockGuard, body: Bytes) -> Response {
    // The lock layer found the id already; this cannot fail for a request
    // that got here, but a handler does not rely on that.
    let id = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| match v.get("id") {
            Some(serde_json::Value::String(s)) => Some(s.clone()),
            Some(serde_json::Value::Number(n)) => Some(n.to_string()),
            _ => None,
        });
    match id {
        Some(id) => deliver(&app, "stripe", &id, &guard).await,
        None => problem(StatusCode::BAD_REQUEST, "the event has no `id`"),
    }
}

async fn github(
    State(app): State<Arc<AppState>>,
    guard: LockGuard,
    headers: HeaderMap,
) -> Response {
    // Checked before the lock (`verify_signature`); the lock and the
    // record are the body's, the delivery id names the entry in the ledger.
    match header_str(&headers, &GITHUB_DELIVERY) {
        Some(id) => deliver(&app, "github", id, &guard).await,
        None => problem(StatusCode::BAD_REQUEST, "missing `X-GitHub-Delivery`"),
    }
}

/// Works, then applies the event with the lock's fencing token.
async fn deliver(app: &AppState, source: &str, id: &str, guard: &LockGuard) -> Response {
    let token = guard.fencing_token();
    tracing::info!(
        source,
        id,
        lock_key = %guard.key(),
        fencing_token = token.get(),
        "delivery started"
    );
    if let Some(hook) = &app.before_apply
        && let Err(e) = hook(id).await
    {
        tracing::warn!(source, id, error = %e, "delivery failed; the sender will retry");
        return problem(StatusCode::INTERNAL_SERVER_ERROR, &e);
    }
    if !app.work.is_zero() {
        tokio::time::sleep(app.work).await;
    }
    match app.ledger.apply(id, token).await {
        Ok(Applied::Counted { count }) => {
            tracing::info!(
                source,
                id,
                fencing_token = token.get(),
                count,
                "event applied"
            );
            Json(serde_json::json!({ "received": true, "id": id })).into_response()
        }
        Ok(Applied::Stale { seen }) => {
            // Our lock was taken over and the new holder has written: this
            // attempt must not count. Not stored (409), so a retry gets the
            // new holder's answer.
            tracing::warn!(
                source,
                id,
                fencing_token = token.get(),
                seen,
                "stale delivery refused by the ledger"
            );
            problem(
                StatusCode::CONFLICT,
                "a newer delivery of this event has been applied; this one was not",
            )
        }
        Err(e) => {
            tracing::error!(source, id, error = %e, "ledger unavailable");
            let mut res = problem(StatusCode::SERVICE_UNAVAILABLE, "the ledger is unavailable");
            res.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            res
        }
    }
}

async fn show_ledger(State(app): State<Arc<AppState>>) -> Response {
    match app.ledger.counts().await {
        Ok(counts) => Json(counts).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "ledger unavailable");
            problem(StatusCode::SERVICE_UNAVAILABLE, "the ledger is unavailable")
        }
    }
}

// ---------------------------------------------------------------------------
// Settings and main
// ---------------------------------------------------------------------------

/// The receiver's settings, read from the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Port on 127.0.0.1.
    pub port: u16,
    /// Redis URL, if any.
    pub redis_url: Option<String>,
    /// Signing secret.
    pub secret: String,
    /// Work per delivery.
    pub work: Duration,
    /// How long a client may take.
    pub timeouts: Timeouts,
}

impl Settings {
    /// Reads the settings through `var` (the process environment in
    /// `main`). An unset or empty variable takes its default.
    pub fn from_lookup(var: impl Fn(&str) -> Option<String>) -> Result<Settings, String> {
        let get = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        let port = match get("PORT") {
            None => 3000,
            Some(v) => v
                .trim()
                .parse::<u16>()
                .map_err(|_| format!("PORT={v:?} is not valid: expected a port, 0 to 65535"))?,
        };
        let work = match get("WORK_MS") {
            None => DEFAULT_WORK,
            Some(v) => Duration::from_millis(v.trim().parse::<u64>().map_err(|_| {
                format!("WORK_MS={v:?} is not valid: expected a whole number of milliseconds")
            })?),
        };
        Ok(Settings {
            port,
            redis_url: get("REDIS_URL"),
            secret: get("WEBHOOK_SECRET").unwrap_or_else(|| DEFAULT_SECRET.to_owned()),
            work,
            timeouts: Timeouts::from_lookup(&var, DEFAULT_TIMEOUTS)?,
        })
    }

    /// The [`Options`] of these settings.
    pub fn options(&self) -> Options {
        Options {
            secret: self.secret.clone(),
            work: self.work,
            ..Options::default()
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    common::exit_code("webhook", run().await)
}

async fn run() -> Result<(), Failure> {
    common::init_tracing()?;

    let settings =
        Settings::from_lookup(|name| std::env::var(name).ok()).map_err(Failure::Usage)?;
    match &settings.redis_url {
        Some(url) => {
            let store = RedisStore::from_url(url)
                .map_err(|e| Failure::Usage(format!("REDIS_URL is not valid: {e}")))?;
            let ledger = Ledger::redis(url).map_err(Failure::Usage)?;
            println!(
                "store: Redis at {} (locks, records and ledger)",
                redact(url)
            );
            listen(&settings, store, ledger).await
        }
        None => {
            println!("store: in-memory (set REDIS_URL to use Redis)");
            listen(&settings, MemoryStore::new(), Ledger::memory()).await
        }
    }
}

/// Serves `router` (an [`app`]) on `listener` within `timeouts` until
/// `shutdown` completes.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    timeouts: Timeouts,
    shutdown: impl Future<Output = ()>,
) {
    common::serve(listener, router, timeouts, shutdown).await;
}

async fn listen<St: LockStore + Clone>(
    settings: &Settings,
    store: St,
    ledger: Ledger,
) -> Result<(), Failure> {
    let router = app(store, ledger, settings.options())
        .map_err(|e| Failure::Usage(format!("settings are not valid: {e}")))?;
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, settings.port));
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| Failure::Runtime(format!("cannot listen on {addr}: {e}")))?;
    let local = listener.local_addr().unwrap_or(addr);
    let t = settings.timeouts;
    println!(
        "work {} ms; timeouts: header {} ms, body {} ms, request {} ms",
        settings.work.as_millis(),
        t.header.as_millis(),
        t.body.as_millis(),
        t.request.as_millis(),
    );
    println!("listening on http://{local}");
    println!("routes: POST /webhooks/stripe, POST /webhooks/github, GET /ledger");
    serve(listener, router, t, async {
        let _ = tokio::signal::ctrl_c().await;
        tracing::info!("shutting down");
    })
    .await;
    Ok(())
}
