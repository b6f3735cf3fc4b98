//! The contract of `examples/admin.rs`: the admin routes refuse to start
//! without a bearer token, refuse requests without it, and list, show and
//! force-release locks on a real Redis; the CLI's listing pages through.

use crate::support;

#[allow(dead_code)]
#[path = "../../examples/admin.rs"]
mod admin;

use std::collections::HashMap;

use axum::body::Body;
use http::{Method, Request, StatusCode, header};
use support::http::{Reply, read};
use support::{RedisServer, logs::Logs};
use tower::ServiceExt;
use tower_redis_lock::{LockKey, Locker, RedisStore};

const TOKEN: &str = "0123456789abcdef0123456789abcdef";

/// An environment as a table.
struct Table(HashMap<String, String>);

impl Table {
    /// The lookup the example takes (`Copy`: it borrows the table).
    fn as_fn(&self) -> impl Fn(&str) -> Option<String> + Copy + '_ {
        move |name| self.0.get(name).cloned()
    }
}

fn env(pairs: &[(&str, &str)]) -> Table {
    Table(
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    )
}

async fn send(app: &axum::Router, method: Method, uri: &str, token: Option<&str>) -> Reply {
    let mut req = Request::builder().method(method).uri(uri);
    if let Some(t) = token {
        req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    read(
        app.clone()
            .oneshot(req.body(Body::empty()).unwrap())
            .await
            .unwrap(),
    )
    .await
}

#[test]
fn the_admin_api_refuses_to_start_without_a_token() {
    let err = admin::AdminToken::from_lookup(env(&[]).as_fn())
        .err()
        .expect("no token: no start");
    assert!(err.contains("LOCK_ADMIN_TOKEN is not set"), "{err}");
    let blank = admin::AdminToken::from_lookup(env(&[("LOCK_ADMIN_TOKEN", "  ")]).as_fn());
    assert!(blank.is_err(), "a blank token is no token");
    let short = admin::AdminToken::from_lookup(env(&[("LOCK_ADMIN_TOKEN", "secret")]).as_fn());
    assert!(short.err().unwrap().contains("too short"));
    assert!(admin::AdminToken::from_lookup(env(&[("LOCK_ADMIN_TOKEN", TOKEN)]).as_fn()).is_ok());
}

/// The program with no token (`main` maps a usage failure to exit code
/// 2): it fails before it listens, saying why; with one, it would serve.
#[tokio::test]
async fn the_admin_program_stops_before_listening_without_a_token() {
    for args in [vec![], vec!["serve".to_owned()]] {
        match admin::run(args, env(&[("PORT", "0")]).as_fn()).await {
            Err(admin::Failure::Usage(m)) => {
                assert!(m.contains("LOCK_ADMIN_TOKEN is not set"), "{m}")
            }
            Err(admin::Failure::Runtime(m)) => panic!("not a usage failure: {m}"),
            Ok(()) => panic!("served without a token"),
        }
    }
}

#[tokio::test]
async fn the_admin_routes_need_the_bearer_token_and_show_and_release_locks() {
    let (logs, _guard) = Logs::capture();
    let server = RedisServer::start();
    let store = RedisStore::from_url(&server.url()).unwrap();
    let holder = Locker::builder(store.clone())
        .label("web-7")
        .build()
        .unwrap();
    let long = "x".repeat(300);
    let a = holder
        .acquire(&LockKey::new("jobs", "42").unwrap())
        .await
        .unwrap();
    let b = holder
        .acquire(&LockKey::new("jobs", &long).unwrap())
        .await
        .unwrap();
    let token =
        admin::AdminToken::from_lookup(env(&[("LOCK_ADMIN_TOKEN", TOKEN)]).as_fn()).unwrap();
    let app = admin::app(Locker::new(store), token);

    for bad in [None, Some("wrong"), Some(&TOKEN[1..])] {
        for (method, uri) in [
            (Method::GET, "/locks/jobs"),
            (Method::GET, "/locks/jobs/42"),
            (Method::DELETE, "/locks/jobs/42?by=mallory"),
        ] {
            let r = send(&app, method, uri, bad).await;
            assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{uri} with {bad:?}");
            assert_eq!(r.header("www-authenticate"), Some("Bearer"));
            assert!(
                !r.text().contains("web-7"),
                "no holder information without the token"
            );
        }
    }
    assert!(a.is_held(), "a refused DELETE released nothing");

    let list = send(&app, Method::GET, "/locks/jobs?count=1", Some(TOKEN)).await;
    assert_eq!(list.status, StatusCode::OK, "{}", list.text());
    let mut ids = Vec::new();
    let mut page: serde_json::Value = serde_json::from_slice(&list.body).unwrap();
    loop {
        for l in page["locks"].as_array().unwrap() {
            assert_eq!(l["label"], "web-7");
            assert!(l["remaining_ms"].as_u64().unwrap() > 0);
            ids.push(l["id"].as_str().unwrap().to_owned());
        }
        let Some(next) = page["next"].as_str() else {
            break;
        };
        let r = send(
            &app,
            Method::GET,
            &format!("/locks/jobs?count=1&cursor={next}"),
            Some(TOKEN),
        )
        .await;
        page = serde_json::from_slice(&r.body).unwrap();
    }
    ids.sort();
    let mut want = vec!["42".to_owned(), b.key().id().to_owned()];
    want.sort();
    assert_eq!(ids, want);

    // The long id, found by what the listing showed.
    let shown = send(
        &app,
        Method::GET,
        &format!("/locks/jobs/{}", b.key().id()),
        Some(TOKEN),
    )
    .await;
    assert_eq!(shown.status, StatusCode::OK, "{}", shown.text());
    let shown: serde_json::Value = serde_json::from_slice(&shown.body).unwrap();
    assert_eq!(shown["fencing_token"], b.fencing_token().unwrap().get());

    let nobody = send(&app, Method::GET, "/locks/jobs/7", Some(TOKEN)).await;
    assert_eq!(nobody.status, StatusCode::NOT_FOUND);

    let no_reason = send(&app, Method::DELETE, "/locks/jobs/42", Some(TOKEN)).await;
    assert_eq!(no_reason.status, StatusCode::BAD_REQUEST);
    let released = send(
        &app,
        Method::DELETE,
        "/locks/jobs/42?by=alice%20INC-42",
        Some(TOKEN),
    )
    .await;
    assert_eq!(released.status, StatusCode::OK, "{}", released.text());
    let body: serde_json::Value = serde_json::from_slice(&released.body).unwrap();
    assert_eq!(body["released"], true);
    assert!(body["fence"].as_u64().unwrap() > a.fencing_token().unwrap().get());
    assert!(a.extend().await.is_err(), "the old holder lost it");
    let line = logs.lines_with("released by force");
    assert_eq!(line.len(), 1, "{}", logs.text());
    assert!(line[0].contains("alice INC-42"), "{}", line[0]);

    assert_eq!(
        admin::list_all(&holder, "jobs")
            .await
            .unwrap()
            .lines()
            .count(),
        1,
        "one lock left"
    );
}
