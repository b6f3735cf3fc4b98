//! An operator's view of the locks: who holds what, and a forced release.
//! An HTTP admin API behind a bearer token, and the same as a small CLI.
//!
//! ```text
//! LOCK_ADMIN_TOKEN=$(openssl rand -hex 32) REDIS_URL=redis://127.0.0.1:6379/ \
//!     cargo run --example admin                        # the admin API on :3001
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --example admin -- list jobs
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --example admin -- show jobs 42
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --example admin -- release jobs 42 "alice: INC-42"
//! ```
//!
//! Routes (every one needs `Authorization: Bearer $LOCK_ADMIN_TOKEN`):
//!
//! * `GET /locks/{ns}?cursor=..&count=..`: one page of the namespace's held
//!   locks, `{"locks": [...], "next": "<cursor>" | null}` (a bounded
//!   `SCAN`: go on with `next` until it is `null`);
//! * `GET /locks/{ns}/{id}`: the holder of one lock, or `404`;
//! * `DELETE /locks/{ns}/{id}?by=<who and why>`: a forced release, logged
//!   at WARN with `by` (required); answers the fence token that shuts the
//!   old holder out of fenced resources.
//!
//! `{id}` is the id as listings and logs show it (a long or odd id is
//! shown as `~` and a hash, and is found by that).
//!
//! Environment:
//!
//! | variable           | default | meaning                                         |
//! |--------------------|---------|-------------------------------------------------|
//! | `LOCK_ADMIN_TOKEN` | unset   | the bearer token, at least 32 bytes: unset, the API refuses to start |
//! | `REDIS_URL`        | unset   | the store (unset: an empty in-memory store, to try the routes) |
//! | `PORT`             | 3001    | port on 127.0.0.1                               |
//!
//! The CLI talks to Redis directly (its credentials are Redis'), so it
//! needs no admin token.

#[path = "common/mod.rs"]
mod common;

use std::process::ExitCode;
use std::time::{Duration, UNIX_EPOCH};

use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use common::Env;
pub use common::Failure;
use serde::Deserialize;
use tower_redis_lock::{HolderInfo, ListCursor, LockKey, Locker, OperatorStore};

/// The shortest bearer token the API accepts.
pub const MIN_TOKEN: usize = 32;

/// The admin API's bearer token.
#[derive(Clone)]
pub struct AdminToken(String);

impl AdminToken {
    /// The token in `LOCK_ADMIN_TOKEN`; unset, blank or short, an error
    /// that says so (the API then refuses to start).
    pub fn from_lookup(var: impl Fn(&str) -> Option<String>) -> Result<AdminToken, String> {
        match Env(var).get("LOCK_ADMIN_TOKEN") {
            None => Err(
                "LOCK_ADMIN_TOKEN is not set: the admin API refuses to start without a bearer token"
                    .to_owned(),
            ),
            Some(t) if t.len() < MIN_TOKEN => Err(format!(
                "LOCK_ADMIN_TOKEN is too short: at least {MIN_TOKEN} bytes"
            )),
            Some(t) => Ok(AdminToken(t)),
        }
    }

    /// Whether `presented` is the token, compared in constant time.
    fn accepts(&self, presented: &[u8]) -> bool {
        let want = self.0.as_bytes();
        presented.len() == want.len()
            && presented
                .iter()
                .zip(want)
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
    }
}

/// The admin routes over `locker`, behind `token`.
pub fn app<St: OperatorStore>(locker: Locker<St>, token: AdminToken) -> Router {
    Router::new()
        .route("/locks/{ns}", get(list::<St>))
        .route("/locks/{ns}/{id}", get(show::<St>).delete(release::<St>))
        .route_layer(middleware::from_fn_with_state(token, bearer))
        .with_state(locker)
}

/// Refuses a request without the bearer token: `401` with
/// `WWW-Authenticate: Bearer`.
async fn bearer(State(token): State<AdminToken>, req: Request, next: Next) -> Response {
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "));
    if presented.is_some_and(|p| token.accepts(p)) {
        return next.run(req).await;
    }
    let mut res = common::problem(StatusCode::UNAUTHORIZED, "a valid bearer token is required");
    res.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    res
}

/// One holder as JSON.
pub fn holder_json(h: &HolderInfo) -> serde_json::Value {
    serde_json::json!({
        "namespace": h.key.namespace(),
        "id": h.key.id(),
        "holder": h.holder.as_str(),
        "label": h.label.as_ref().map(|l| l.as_str()),
        "fencing_token": h.fencing_token.map(|t| t.get()),
        "granted_at_ms": h.granted_at
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map(|d| d.as_millis() as u64),
        "remaining_ms": h.remaining.map(|d| d.as_millis() as u64),
        "waiters": h.waiters,
    })
}

fn bad_request(detail: &str) -> Response {
    common::problem(StatusCode::BAD_REQUEST, detail)
}

fn failed(e: &tower_redis_lock::Error) -> Response {
    tracing::error!(error = %e, "admin: the store failed");
    common::unavailable("the lock store is unavailable")
}

#[derive(Deserialize)]
struct Page {
    cursor: Option<String>,
    count: Option<usize>,
}

async fn list<St: OperatorStore>(
    State(locker): State<Locker<St>>,
    Path(ns): Path<String>,
    Query(page): Query<Page>,
) -> Response {
    let Some(cursor) = ListCursor::parse(page.cursor.as_deref().unwrap_or("")) else {
        return bad_request("not a cursor this API gave");
    };
    if LockKey::new(&ns, "x").is_err() {
        return bad_request("not a namespace");
    }
    match locker.list(&ns, &cursor, page.count.unwrap_or(100)).await {
        Ok(page) => Json(serde_json::json!({
            "locks": page.locks.iter().map(holder_json).collect::<Vec<_>>(),
            "next": page.next.as_ref().map(ListCursor::as_str),
        }))
        .into_response(),
        Err(e) => failed(&e),
    }
}

async fn show<St: OperatorStore>(
    State(locker): State<Locker<St>>,
    Path((ns, id)): Path<(String, String)>,
) -> Response {
    let Ok(key) = LockKey::from_shown(&ns, &id) else {
        return bad_request("not a lock key");
    };
    match locker.inspect(&key).await {
        Ok(Some(h)) => Json(holder_json(&h)).into_response(),
        Ok(None) => common::problem(StatusCode::NOT_FOUND, "nobody holds this lock"),
        Err(e) => failed(&e),
    }
}

#[derive(Deserialize)]
struct By {
    by: Option<String>,
}

async fn release<St: OperatorStore>(
    State(locker): State<Locker<St>>,
    Path((ns, id)): Path<(String, String)>,
    Query(by): Query<By>,
) -> Response {
    let Ok(key) = LockKey::from_shown(&ns, &id) else {
        return bad_request("not a lock key");
    };
    let by = match by.by {
        Some(by) if !by.trim().is_empty() && by.len() <= 200 => by,
        _ => return bad_request("say who releases it and why: ?by=..."),
    };
    match locker.force_release(&key, &by).await {
        Ok(f) => Json(serde_json::json!({
            "released": f.released,
            "fence": f.fence.map(|t| t.get()),
        }))
        .into_response(),
        Err(e) => failed(&e),
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    common::main("admin", || run(args, |name: &str| std::env::var(name).ok())).await
}

/// The program: `args` after the program's name, the environment through
/// `var`. Without a token, `serve` fails before it listens.
pub async fn run(
    args: Vec<String>,
    var: impl Fn(&str) -> Option<String> + Copy,
) -> Result<(), Failure> {
    let redis_url = Env(var).get("REDIS_URL");
    let (store, described) = common::store(redis_url.as_deref())?;
    let locker = Locker::new(store);
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        [] | ["serve"] => {
            let token = AdminToken::from_lookup(var).map_err(Failure::Usage)?;
            let port = match Env(var).get("PORT") {
                None => 3001,
                Some(_) => Env(var).port().map_err(Failure::Usage)?,
            };
            println!("store: {described}");
            let banner = |local| println!("admin API on http://{local}/locks/{{ns}}");
            let timeouts =
                common::Timeouts::from_lookup(var, ADMIN_TIMEOUTS).map_err(Failure::Usage)?;
            common::listen(port, app(locker, token), timeouts, banner).await
        }
        ["list", ns] => cli(list_all(&locker, ns).await),
        ["show", ns, id] => {
            let key = LockKey::from_shown(ns, id).map_err(|e| Failure::Usage(e.to_string()))?;
            cli(locker.inspect(&key).await.map(|h| match h {
                Some(h) => holder_json(&h).to_string(),
                None => "nobody holds it".to_owned(),
            }))
        }
        ["release", ns, id, by] => {
            let key = LockKey::from_shown(ns, id).map_err(|e| Failure::Usage(e.to_string()))?;
            cli(locker.force_release(&key, by).await.map(|f| {
                serde_json::json!({"released": f.released, "fence": f.fence.map(|t| t.get())})
                    .to_string()
            }))
        }
        _ => Err(Failure::Usage(
            "usage: admin [serve] | list <ns> | show <ns> <id> | release <ns> <id> <by>".to_owned(),
        )),
    }
}

/// Every page of `ns`'s held locks, one JSON line per lock.
pub async fn list_all<St: OperatorStore>(
    locker: &Locker<St>,
    ns: &str,
) -> Result<String, tower_redis_lock::Error> {
    let mut out = String::new();
    let mut cursor = Some(ListCursor::start());
    while let Some(at) = cursor {
        let page = locker.list(ns, &at, 100).await?;
        for h in &page.locks {
            out.push_str(&holder_json(h).to_string());
            out.push('\n');
        }
        cursor = page.next;
    }
    Ok(out.trim_end().to_owned())
}

fn cli(answer: Result<String, tower_redis_lock::Error>) -> Result<(), Failure> {
    match answer {
        Ok(text) => {
            if !text.is_empty() {
                println!("{text}");
            }
            Ok(())
        }
        Err(e) => Err(Failure::Runtime(e.to_string())),
    }
}

/// The admin API's time limits: short, its answers are small.
const ADMIN_TIMEOUTS: common::Timeouts = common::Timeouts {
    header: Duration::from_secs(10),
    body: Duration::from_secs(10),
    request: Duration::from_secs(30),
};
