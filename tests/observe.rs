//! The `tracing` spans (`lock.acquire`, `lock.hold`, `lock.release`): their
//! nesting under the caller's span, the fields they record, and the level
//! of the layer's refusals. A subscriber of this file records every span and
//! event (on this thread: current-thread runtimes); the logic is local, so
//! the memory store on tokio's paused clock.

mod support;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use http::StatusCode;
use support::http::{post_to, send};
use tower_redis_lock::{KeyFrom, LockKey, LockLayer, Locker, MemoryStore};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Instrument, Level, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

#[derive(Debug, Clone, Default)]
struct SpanRec {
    name: &'static str,
    parent: Option<&'static str>,
    fields: BTreeMap<String, String>,
    closed: bool,
}

impl SpanRec {
    fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }
}

#[derive(Default)]
struct Seen {
    spans: Vec<SpanRec>,
    /// Open spans: the registry's id → index in `spans` (ids are reused).
    open: HashMap<u64, usize>,
    /// (level, message and fields) of every event.
    events: Vec<(Level, String)>,
}

/// Records every span and event.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Seen>>);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(
            field.name().to_owned(),
            format!("{value:?}").trim_matches('"').to_owned(),
        );
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let parent = ctx.span(id).and_then(|s| s.parent()).map(|p| p.name());
        let mut rec = SpanRec {
            name: attrs.metadata().name(),
            parent,
            ..SpanRec::default()
        };
        attrs.record(&mut Fields(&mut rec.fields));
        let mut seen = self.0.lock().unwrap();
        seen.spans.push(rec);
        let at = seen.spans.len() - 1;
        seen.open.insert(id.into_u64(), at);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        let mut seen = self.0.lock().unwrap();
        if let Some(&at) = seen.open.get(&id.into_u64()) {
            values.record(&mut Fields(&mut seen.spans[at].fields));
        }
    }

    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        // The message, then its fields (`key=value`), as one line.
        let mut line = fields.remove("message").unwrap_or_default();
        for (name, value) in fields {
            line.push_str(&format!(" {name}={value}"));
        }
        let level = *event.metadata().level();
        self.0.lock().unwrap().events.push((level, line));
    }

    fn on_close(&self, id: Id, _: Context<'_, S>) {
        let mut seen = self.0.lock().unwrap();
        if let Some(at) = seen.open.remove(&id.into_u64()) {
            seen.spans[at].closed = true;
        }
    }
}

impl Capture {
    fn install() -> (Capture, tracing::subscriber::DefaultGuard) {
        let capture = Capture::default();
        let subscriber = tracing_subscriber::registry().with(capture.clone());
        (capture, tracing::subscriber::set_default(subscriber))
    }

    fn named(&self, name: &str) -> Vec<SpanRec> {
        let seen = self.0.lock().unwrap();
        seen.spans
            .iter()
            .filter(|s| s.name == name)
            .cloned()
            .collect()
    }

    fn one(&self, name: &str) -> SpanRec {
        let all = self.named(name);
        assert_eq!(all.len(), 1, "{all:#?}");
        all.into_iter().next().unwrap()
    }

    fn events_with(&self, needle: &str) -> Vec<(Level, String)> {
        let seen = self.0.lock().unwrap();
        seen.events
            .iter()
            .filter(|(_, m)| m.contains(needle))
            .cloned()
            .collect()
    }
}

fn key(id: &str) -> LockKey {
    LockKey::new("orders", id).unwrap()
}

/// A memory store and a locker on it with a 3 s lease.
fn three_second_lease() -> (MemoryStore, Locker<MemoryStore>) {
    let store = MemoryStore::new();
    let locker = Locker::builder(store.clone())
        .lease(Duration::from_secs(3))
        .build()
        .unwrap();
    (store, locker)
}

/// Lets the watchdog and background tasks run (paused clock: no time passes).
async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn acquire_hold_and_release_spans_nest_under_the_callers_span() {
    let (seen, _guard) = Capture::install();
    let locker = Locker::new(MemoryStore::new());
    let request = tracing::info_span!("request");
    let guard = locker
        .acquire(&key("1"))
        .instrument(request.clone())
        .await
        .unwrap();
    let token = guard.fencing_token().unwrap().get().to_string();

    let acquire = seen.one("lock.acquire");
    assert_eq!(acquire.parent, Some("request"));
    assert!(acquire.closed);
    assert_eq!(acquire.field("key"), Some("orders:1"));
    assert_eq!(acquire.field("kind"), Some("lock"));
    assert_eq!(acquire.field("namespace"), Some("orders"));
    assert_eq!(acquire.field("outcome"), Some("granted"));
    assert_eq!(acquire.field("contended"), Some("false"));
    assert_eq!(acquire.field("fencing_token"), Some(token.as_str()));
    assert!(acquire.field("waited_us").is_some(), "{acquire:?}");

    // The hold is the acquire's sibling, open while the lock is held.
    let hold = seen.one("lock.hold");
    assert_eq!(hold.parent, Some("request"));
    assert_eq!(hold.field("fencing_token"), Some(token.as_str()));
    assert!(!hold.closed);

    assert!(guard.release().instrument(request).await.unwrap());
    let release = seen.one("lock.release");
    assert_eq!(release.parent, Some("lock.hold"));
    assert_eq!(release.field("op"), Some("release"));
    assert_eq!(release.field("owned"), Some("true"));
    settle().await;
    assert!(seen.one("lock.hold").closed, "the hold outlived its lock");
}

#[tokio::test(start_paused = true)]
async fn a_contended_acquire_records_its_wait_and_outcome() {
    let (seen, _guard) = Capture::install();
    let locker = Locker::builder(MemoryStore::new())
        .wait_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let first = locker.acquire(&key("2")).await.unwrap();

    assert!(locker.try_acquire(&key("2")).await.is_err());
    let timed_out = locker.acquire(&key("2")).await.unwrap_err();
    assert!(timed_out.is_contended());
    let spans = seen.named("lock.acquire");
    assert_eq!(spans.len(), 3);
    assert_eq!(spans[1].field("outcome"), Some("contended"));
    assert_eq!(spans[1].field("contended"), Some("true"));
    assert_eq!(spans[2].field("outcome"), Some("timeout"));
    assert_eq!(spans[2].field("waited_us"), Some("1000000"));

    // Released while a waiter waits: granted, contended, after its wait.
    let waiter = {
        let locker = locker.clone();
        tokio::spawn(async move { locker.acquire(&key("2")).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(first.release().await.unwrap());
    let second = waiter.await.unwrap().unwrap();
    let spans = seen.named("lock.acquire");
    let last = spans.last().unwrap();
    assert_eq!(last.field("outcome"), Some("granted"));
    assert_eq!(last.field("contended"), Some("true"));
    assert_eq!(last.field("waited_us"), Some("300000"));
    drop(second);
}

#[tokio::test(start_paused = true)]
async fn a_lost_lock_marks_its_hold_span() {
    let (seen, _guard) = Capture::install();
    let (store, locker) = three_second_lease();
    let guard = locker.acquire(&key("3")).await.unwrap();
    assert!(store.lose(&key("3")));
    guard.lost().await;
    assert_eq!(seen.one("lock.hold").field("outcome"), Some("lost"));
}

#[tokio::test(start_paused = true)]
async fn under_the_layer_the_spans_are_the_requests_and_refusals_log_at_debug() {
    let (seen, _guard) = Capture::install();
    let store = MemoryStore::new();
    let locker = Locker::new(store.clone());
    let layer = LockLayer::builder(locker.clone(), KeyFrom::path_param::<String>("id"))
        .namespace("orders")
        .build()
        .unwrap();
    let app = Router::new()
        .route("/orders/{id}", post(|| async { "done" }))
        .layer(layer);

    let reply = send(&app, post_to("/orders/4"))
        .instrument(tracing::info_span!("request"))
        .await;
    assert_eq!(reply.status, StatusCode::OK);
    let acquire = seen.one("lock.acquire");
    assert_eq!(acquire.parent, Some("request"));
    assert_eq!(acquire.field("outcome"), Some("granted"));
    assert_eq!(seen.one("lock.hold").parent, Some("request"));
    assert_eq!(seen.one("lock.release").parent, Some("lock.hold"));

    // A refusal (409 here) is a DEBUG line, not INFO: quiet in a retry storm.
    let held = locker.acquire(&key("4")).await.unwrap();
    send(&app, post_to("/orders/4"))
        .await
        .problem(StatusCode::CONFLICT);
    let refused = seen.events_with("request refused by the lock layer");
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0].0, Level::DEBUG);
    drop(held);
}

#[tokio::test(start_paused = true)]
async fn an_acquire_queued_behind_a_local_waiter_is_contended() {
    let (seen, _guard) = Capture::install();
    let locker = Locker::builder(MemoryStore::new())
        .wait_timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let first = locker.acquire(&key("5")).await.unwrap();
    let spawn_waiter = || {
        let locker = locker.clone();
        tokio::spawn(async move { locker.acquire(&key("5")).await })
    };
    let one = spawn_waiter();
    while !locker.has_waiters(&key("5")) {
        tokio::task::yield_now().await;
    }
    // Arrives behind a waiter: goes straight to the queue, never to the
    // store, until its turn; its one try then is still a contended one.
    let two = spawn_waiter();
    settle().await;
    first.release().await.unwrap();
    one.await.unwrap().unwrap().release().await.unwrap();
    drop(two.await.unwrap().unwrap());

    let spans = seen.named("lock.acquire");
    assert_eq!(spans.len(), 3);
    for waiter in &spans[1..] {
        assert_eq!(waiter.field("outcome"), Some("granted"), "{waiter:?}");
        assert_eq!(waiter.field("contended"), Some("true"), "{waiter:?}");
    }
}

/// A handler aborted because its lock was lost is refused like any other
/// request the layer answers itself: one DEBUG line (and one count), never
/// an exit of its own that skips them.
#[tokio::test(start_paused = true)]
async fn a_handler_aborted_on_loss_is_logged_as_a_refusal() {
    let (seen, _guard) = Capture::install();
    let (store, locker) = three_second_lease();
    let layer = LockLayer::builder(locker, KeyFrom::path_param::<u64>("id"))
        .namespace("orders")
        .on_lock_lost(tower_redis_lock::OnLockLost::Abort)
        .build()
        .unwrap();
    let app = Router::new()
        .route("/orders/{id}", post(std::future::pending::<&'static str>))
        .layer(layer);
    let k = LockKey::new("orders", "9").unwrap();
    let (reply, ()) = tokio::join!(send(&app, post_to("/orders/9")), async {
        while !store.is_locked(&k) {
            tokio::task::yield_now().await;
        }
        // Gone behind the holder's back: its next renewal finds out.
        assert!(store.lose(&k));
    });
    reply.problem(StatusCode::SERVICE_UNAVAILABLE);
    let refused = seen.events_with("request refused by the lock layer");
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0].0, Level::DEBUG);
}

#[tokio::test(start_paused = true)]
async fn a_route_without_its_layer_logs_the_extractors_rejection_at_debug() {
    let (seen, _guard) = Capture::install();
    // Wiring mistakes: an extractor on a route that has no lock layer.
    let app = Router::new()
        .route(
            "/guard",
            post(|_guard: tower_redis_lock::LockGuard| async { "ran" }),
        )
        .route(
            "/token",
            post(|_token: tower_redis_lock::FencingToken| async { "ran" }),
        );
    for (path, needle) in [
        ("/guard", "no LockGuard in the request extensions"),
        ("/token", "no FencingToken in the request extensions"),
    ] {
        send(&app, post_to(path))
            .await
            .problem(StatusCode::INTERNAL_SERVER_ERROR);
        let logged = seen.events_with(needle);
        assert_eq!(logged.len(), 1, "{path}: {logged:?}");
        // Per request, so not an error line each time: DEBUG, as axum's
        // own rejections are quiet.
        assert_eq!(logged[0].0, Level::DEBUG, "{path}");
    }
}

/// An outage is one ERROR line when it starts, with what failed under the
/// store error (its cause chain), and one WARN line when the store answers
/// again; the requests refused meanwhile are DEBUG lines, and
/// `Locker::status` says whether the store is up.
#[tokio::test(start_paused = true)]
async fn an_outage_logs_once_when_it_starts_and_once_when_it_ends() {
    let (seen, _guard) = Capture::install();
    let store = MemoryStore::new();
    let locker = Locker::new(store.clone());
    let layer = LockLayer::builder(locker.clone(), KeyFrom::path_param::<String>("id"))
        .namespace("outage")
        .build()
        .unwrap();
    let app = Router::new()
        .route("/outage/{id}", post(|| async { "done" }))
        .layer(layer);
    assert!(locker.status().store_up);

    store.fail_next_calls(5);
    for i in 0..5 {
        send(&app, post_to(&format!("/outage/{i}")))
            .await
            .problem(StatusCode::SERVICE_UNAVAILABLE);
    }
    assert!(!locker.status().store_up);
    let started = seen.events_with("acquires fail until it answers again");
    assert_eq!(started.len(), 1, "{started:?}");
    assert_eq!(started[0].0, Level::ERROR);
    // The cause under the store error, not only "unavailable".
    assert!(
        started[0].1.contains("a failure asked for by a test"),
        "{started:?}"
    );
    let per_request = seen.events_with("lock store failed; answering 503");
    assert_eq!(per_request.len(), 5, "{per_request:?}");
    assert!(per_request.iter().all(|(level, _)| *level == Level::DEBUG));

    let reply = send(&app, post_to("/outage/ok")).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(locker.status().store_up);
    let ended = seen.events_with("lock store answers again");
    assert_eq!(ended.len(), 1, "{ended:?}");
    assert_eq!(ended[0].0, Level::WARN);
    assert!(
        seen.events_with("acquires fail until it answers again")
            .len()
            == 1,
        "no second start"
    );
}

/// A permit's spans say so (`kind=permit`), and its hold span is open while
/// the permit is held.
#[tokio::test(start_paused = true)]
async fn a_permits_spans_name_their_kind() {
    let (seen, _guard) = Capture::install();
    let locker = Locker::new(MemoryStore::new());
    let guard = locker
        .semaphore(&key("2"), 3)
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let acquire = seen.one("lock.acquire");
    assert_eq!(acquire.field("kind"), Some("permit"));
    assert_eq!(acquire.field("outcome"), Some("granted"));
    let hold = seen.one("lock.hold");
    assert_eq!(hold.field("kind"), Some("permit"));
    assert!(!hold.closed);
    assert!(guard.release().await.unwrap());
    settle().await;
    assert!(seen.one("lock.hold").closed, "the hold outlived its permit");
}

/// A reader-writer lock's spans name the side (`kind=read`, `kind=write`).
#[tokio::test(start_paused = true)]
async fn a_rwlocks_spans_name_their_side() {
    let (seen, _guard) = Capture::install();
    let locker = Locker::new(MemoryStore::new());
    let rw = locker.rwlock(&key("3")).unwrap();
    rw.read().await.unwrap().release().await.unwrap();
    rw.write().await.unwrap().release().await.unwrap();
    settle().await;
    let kinds: Vec<Option<String>> = seen
        .named("lock.acquire")
        .iter()
        .map(|s| s.field("kind").map(str::to_owned))
        .collect();
    assert_eq!(kinds, [Some("read".to_owned()), Some("write".to_owned())]);
}

/// A lost lock released through one clone (the layer's end of the request
/// while the handler keeps a clone) still reads as lost through another.
#[tokio::test(start_paused = true)]
async fn a_lost_lock_released_through_a_clone_is_still_lost() {
    let (store, locker) = three_second_lease();
    let guard = locker.acquire(&key("released-lost")).await.unwrap();
    let clone = guard.clone();
    assert!(store.lose(&key("released-lost")));
    guard.lost().await;
    assert!(clone.is_lost(), "lost before the release");
    assert!(!guard.release().await.unwrap());
    assert!(
        clone.is_lost(),
        "a lost lock released through a clone reads as not lost"
    );
}
