//! Holder information on contention: never in a 409/423 answer by
//! default (it tells a client about another client's request), in the
//! body and the rejection hook's `Problem` where a layer opts in.

use crate::support;

use axum::Router;
use axum::routing::post;
use http::StatusCode;
use support::RedisServer;
use support::http::{post_to, read};
use tower::ServiceExt;
use tower_redis_lock::{BoxStore, KeyFrom, LockKey, LockLayer, Locker, MemoryStore, RedisStore};

const LABEL: &str = "billing-7 req 4f2a";

/// A route on `orders/{id}` whose lock on id `status` a labelled locker
/// holds already,
/// and that holder's opaque id and guard.
async fn held(
    store: BoxStore,
    expose: bool,
    status: StatusCode,
) -> (Router, String, tower_redis_lock::LockGuard) {
    let holder = Locker::builder(store.clone()).label(LABEL).build().unwrap();
    // One id per status: the guard of the last round may still be
    // releasing in the background.
    let guard = holder
        .acquire(&LockKey::new("orders", status.as_u16().to_string()).unwrap())
        .await
        .unwrap();
    let id = holder
        .inspect(guard.key())
        .await
        .unwrap()
        .unwrap()
        .holder
        .to_string();
    let layer = LockLayer::builder(Locker::new(store), KeyFrom::path_param::<u64>("id"))
        .namespace("orders")
        .contention_status(status)
        .expose_holder(expose)
        .build()
        .unwrap();
    let app = Router::new().route("/orders/{id}", post(|| async { "ok" }).route_layer(layer));
    (app, id, guard)
}

fn stores(server: &RedisServer) -> Vec<BoxStore> {
    vec![
        BoxStore::new(MemoryStore::new()),
        BoxStore::new(RedisStore::from_url(&server.url()).unwrap()),
    ]
}

#[tokio::test]
async fn no_holder_information_in_a_refusal_by_default() {
    let server = RedisServer::start();
    for store in stores(&server) {
        for status in [StatusCode::CONFLICT, StatusCode::LOCKED] {
            let (app, id, _guard) = held(store.clone(), false, status).await;
            let uri = format!("/orders/{}", status.as_u16());
            let r = read(app.oneshot(post_to(&uri)).await.unwrap()).await;
            assert_eq!(r.status, status);
            let all = format!("{:?} {}", r.headers, r.text());
            assert!(!all.contains(LABEL) && !all.contains(&id), "{all}");
            assert!(r.problem(status).get("holder").is_none());
        }
    }
}

#[tokio::test]
async fn a_layer_that_opts_in_names_the_holder_in_the_body_and_to_the_hook() {
    let server = RedisServer::start();
    for store in stores(&server) {
        for status in [StatusCode::CONFLICT, StatusCode::LOCKED] {
            let (app, id, _guard) = held(store.clone(), true, status).await;
            let uri = format!("/orders/{}", status.as_u16());
            let r = read(app.oneshot(post_to(&uri)).await.unwrap()).await;
            let body = r.problem(status);
            assert_eq!(body["holder"]["id"], id.as_str());
            assert_eq!(body["holder"]["label"], LABEL);
            assert!(r.retry_after() >= 1, "Retry-After stays");
            // Headers carry nothing of it.
            assert!(!format!("{:?}", r.headers).contains(LABEL));
        }
        // The hook sees it too.
        let holder = Locker::builder(store.clone()).label(LABEL).build().unwrap();
        let _g = holder
            .acquire(&LockKey::new("hooked", "1").unwrap())
            .await
            .unwrap();
        let layer =
            LockLayer::builder(Locker::new(store.clone()), KeyFrom::path_param::<u64>("id"))
                .namespace("hooked")
                .expose_holder(true)
                .on_rejection(|p: &tower_redis_lock::Problem| {
                    let label = p
                        .holder()
                        .and_then(|h| h.label.clone())
                        .map(|l| l.to_string());
                    (p.status(), label.unwrap_or_default())
                })
                .build()
                .unwrap();
        let app = Router::new().route("/h/{id}", post(|| async { "ok" }).route_layer(layer));
        let r = read(app.oneshot(post_to("/h/1")).await.unwrap()).await;
        assert_eq!(r.status, StatusCode::CONFLICT);
        assert_eq!(r.text(), LABEL);
    }
}
