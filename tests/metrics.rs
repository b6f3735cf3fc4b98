//! The metrics (feature `metrics`) move: a small recorder of this file,
//! installed per test on its thread (current-thread runtimes), counts what
//! the crate reports. Engine and layer logic on the memory store and
//! tokio's paused clock; store errors also against a real `redis-server`.
//!
//! Run as `cargo test --features metrics --test metrics`.

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use http::StatusCode;
use metrics::{
    Counter, CounterFn, Gauge, Histogram, HistogramFn, Key, KeyName, LocalRecorderGuard, Metadata,
    Recorder, SharedString, Unit,
};
use support::RedisServer;
use support::http::{post_to, send};
use tower_redis_lock::{Idempotency, KeyFrom, LockKey, LockLayer, Locker, MemoryStore, RedisStore};

/// A metric's unit and help text.
type Description = (Option<Unit>, String);

/// Counter totals and histogram samples by `name{label=value,…}` (labels
/// in the order given).
#[derive(Clone, Default)]
struct Recorded {
    counters: Arc<Mutex<HashMap<String, u64>>>,
    histograms: Arc<Mutex<HashMap<String, Vec<f64>>>>,
    gauges: Arc<Mutex<HashMap<String, f64>>>,
    /// name → (unit, help text), from `describe_*`.
    described: Arc<Mutex<HashMap<String, Description>>>,
}

struct Slot {
    name: String,
    into: Recorded,
}

impl CounterFn for Slot {
    fn increment(&self, value: u64) {
        *self
            .into
            .counters
            .lock()
            .unwrap()
            .entry(self.name.clone())
            .or_default() += value;
    }

    fn absolute(&self, value: u64) {
        self.into
            .counters
            .lock()
            .unwrap()
            .insert(self.name.clone(), value);
    }
}

impl metrics::GaugeFn for Slot {
    fn increment(&self, value: f64) {
        *self
            .into
            .gauges
            .lock()
            .unwrap()
            .entry(self.name.clone())
            .or_default() += value;
    }

    fn decrement(&self, value: f64) {
        metrics::GaugeFn::increment(self, -value);
    }

    fn set(&self, value: f64) {
        self.into
            .gauges
            .lock()
            .unwrap()
            .insert(self.name.clone(), value);
    }
}

impl HistogramFn for Slot {
    fn record(&self, value: f64) {
        self.into
            .histograms
            .lock()
            .unwrap()
            .entry(self.name.clone())
            .or_default()
            .push(value);
    }
}

fn render(key: &Key) -> String {
    let labels: Vec<String> = key
        .labels()
        .map(|l| format!("{}={}", l.key(), l.value()))
        .collect();
    if labels.is_empty() {
        key.name().to_owned()
    } else {
        format!("{}{{{}}}", key.name(), labels.join(","))
    }
}

impl Recorder for Recorded {
    fn describe_counter(&self, name: KeyName, unit: Option<Unit>, help: SharedString) {
        self.describe(name, unit, help);
    }
    fn describe_gauge(&self, name: KeyName, unit: Option<Unit>, help: SharedString) {
        self.describe(name, unit, help);
    }
    fn describe_histogram(&self, name: KeyName, unit: Option<Unit>, help: SharedString) {
        self.describe(name, unit, help);
    }

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(Arc::new(Slot {
            name: render(key),
            into: self.clone(),
        }))
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(Arc::new(Slot {
            name: render(key),
            into: self.clone(),
        }))
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(Arc::new(Slot {
            name: render(key),
            into: self.clone(),
        }))
    }
}

impl Recorded {
    fn describe(&self, name: KeyName, unit: Option<Unit>, help: SharedString) {
        self.described
            .lock()
            .unwrap()
            .insert(name.as_str().to_owned(), (unit, help.to_string()));
    }

    fn gauge(&self, name: &str) -> Option<f64> {
        self.gauges.lock().unwrap().get(name).copied()
    }

    fn counter(&self, name: &str) -> u64 {
        self.counters
            .lock()
            .unwrap()
            .get(name)
            .copied()
            .unwrap_or(0)
    }

    fn samples(&self, name: &str) -> Vec<f64> {
        self.histograms
            .lock()
            .unwrap()
            .get(name)
            .cloned()
            .unwrap_or_default()
    }

    fn names(&self) -> Vec<String> {
        let mut all: Vec<String> = self.counters.lock().unwrap().keys().cloned().collect();
        all.extend(self.histograms.lock().unwrap().keys().cloned());
        all.extend(self.gauges.lock().unwrap().keys().cloned());
        all.sort();
        all
    }
}

/// A recorder for this test's thread.
fn install(recorded: &Recorded) -> LocalRecorderGuard<'_> {
    metrics::set_default_local_recorder(recorded)
}

fn key(id: &str) -> LockKey {
    LockKey::new("orders", id).unwrap()
}

#[tokio::test(start_paused = true)]
async fn acquires_count_by_outcome_with_latency_wait_and_contention() {
    let m = Recorded::default();
    let _r = install(&m);
    let locker = Locker::builder(MemoryStore::new())
        .wait_timeout(Duration::from_secs(1))
        .build()
        .unwrap();

    let first = locker.acquire(&key("1")).await.unwrap();
    assert_eq!(
        m.counter("trl_acquires_total{namespace=orders,kind=lock,outcome=granted}"),
        1
    );
    let latency =
        m.samples("trl_acquire_duration_seconds{namespace=orders,kind=lock,outcome=granted}");
    assert_eq!(latency, [0.0], "paused clock: no time passed");
    assert_eq!(
        m.counter("trl_contended_total{namespace=orders,kind=lock}"),
        0
    );

    // Refused at once, then after a full wait.
    assert!(locker.try_acquire(&key("1")).await.is_err());
    assert!(locker.acquire(&key("1")).await.is_err());
    assert_eq!(
        m.counter("trl_acquires_total{namespace=orders,kind=lock,outcome=contended}"),
        1
    );
    assert_eq!(
        m.counter("trl_acquires_total{namespace=orders,kind=lock,outcome=timeout}"),
        1
    );
    assert_eq!(
        m.counter("trl_contended_total{namespace=orders,kind=lock}"),
        2
    );
    assert_eq!(
        m.samples("trl_acquire_wait_seconds{namespace=orders,kind=lock}"),
        [0.0, 1.0]
    );

    // Granted after waiting 0.25 s for a release.
    let waiter = {
        let locker = locker.clone();
        tokio::spawn(async move { locker.acquire(&key("1")).await })
    };
    tokio::time::sleep(Duration::from_millis(250)).await;
    first.release().await.unwrap();
    let second = waiter.await.unwrap().unwrap();
    assert_eq!(
        m.counter("trl_acquires_total{namespace=orders,kind=lock,outcome=granted}"),
        2
    );
    assert_eq!(
        m.counter("trl_contended_total{namespace=orders,kind=lock}"),
        3
    );
    assert_eq!(
        m.samples("trl_acquire_wait_seconds{namespace=orders,kind=lock}"),
        [0.0, 1.0, 0.25]
    );

    // A re-entry is counted as such.
    let _reentered = second
        .scope(async { locker.acquire(&key("1")).await.unwrap() })
        .await;
    assert_eq!(
        m.counter("trl_acquires_total{namespace=orders,kind=lock,outcome=reentered}"),
        1
    );
}

/// Each lease kind is counted under its own `kind`: a semaphore's permits,
/// a reader-writer lock's reads and writes apart from the key's lock.
#[tokio::test(start_paused = true)]
async fn acquires_are_counted_by_lease_kind() {
    let m = Recorded::default();
    let _r = install(&m);
    let locker = Locker::new(MemoryStore::new());
    let lock = locker.acquire(&key("k")).await.unwrap();
    let permit = locker
        .semaphore(&key("k"), 2)
        .unwrap()
        .try_acquire()
        .await
        .unwrap();
    let rw = locker.rwlock(&key("k")).unwrap();
    let read = rw.try_read().await.unwrap();
    assert!(rw.try_write().await.is_err());
    for (kind, outcome, n) in [
        ("lock", "granted", 1),
        ("permit", "granted", 1),
        ("read", "granted", 1),
        ("write", "contended", 1),
        ("write", "granted", 0),
    ] {
        assert_eq!(
            m.counter(&format!(
                "trl_acquires_total{{namespace=orders,kind={kind},outcome={outcome}}}"
            )),
            n,
            "{kind} {outcome}"
        );
    }
    assert_eq!(
        m.counter("trl_contended_total{namespace=orders,kind=write}"),
        1
    );
    drop((lock, permit, read));
}

#[tokio::test(start_paused = true)]
async fn renewals_report_their_lag_and_failures_and_losses_their_reason() {
    let m = Recorded::default();
    let _r = install(&m);
    let store = MemoryStore::new();
    let lease = Duration::from_secs(3);
    let locker = Locker::builder(store.clone()).lease(lease).build().unwrap();

    let guard = locker.acquire(&key("2")).await.unwrap();
    // Two renewals, each answered on time (paused clock: no lag).
    tokio::time::sleep(lease * 2 / 3 + Duration::from_millis(1)).await;
    assert_eq!(m.samples("trl_renewal_lag_seconds"), [0.0, 0.0]);

    // The next renewal fails: counted as a renewal failure and a store error.
    store.fail_next_calls(1);
    tokio::time::sleep(lease / 3).await;
    assert_eq!(m.counter("trl_renewal_failures_total{kind=unavailable}"), 1);
    assert_eq!(
        m.counter("trl_store_errors_total{op=extend,kind=unavailable}"),
        1
    );
    assert!(guard.is_held(), "one failure is retried, not a loss");

    // Taken over: the next renewal finds another owner.
    store.take_over(&key("2"), lease);
    guard.lost().await;
    assert_eq!(
        m.counter("trl_locks_lost_total{namespace=orders,kind=lock,reason=not_owner}"),
        1
    );

    // Renewals failing until the deadline: expired.
    let other = locker.acquire(&key("3")).await.unwrap();
    store.fail_next_calls(u32::MAX);
    other.lost().await;
    store.fail_next_calls(0);
    assert_eq!(
        m.counter("trl_locks_lost_total{namespace=orders,kind=lock,reason=expired}"),
        1
    );
}

#[tokio::test(start_paused = true)]
async fn the_layer_counts_refusals_by_status_and_replays() {
    let m = Recorded::default();
    let _r = install(&m);
    let locker = Locker::new(MemoryStore::new());
    let layer = LockLayer::builder(locker.clone(), KeyFrom::path_param::<String>("id"))
        .namespace("orders")
        .idempotent(Idempotency::new())
        .build()
        .unwrap();
    let app = Router::new()
        .route("/orders/{id}", post(|| async { "done" }))
        .layer(layer);

    let held = locker.acquire(&key("5")).await.unwrap();
    send(&app, post_to("/orders/5"))
        .await
        .problem(StatusCode::CONFLICT);
    assert_eq!(m.counter("trl_requests_refused_total{status=409}"), 1);
    held.release().await.unwrap();

    assert_eq!(
        send(&app, post_to("/orders/5")).await.status,
        StatusCode::OK
    );
    assert_eq!(m.counter("trl_replays_total{status=200}"), 0);
    let again = send(&app, post_to("/orders/5")).await;
    assert_eq!(again.status, StatusCode::OK);
    assert_eq!(m.counter("trl_replays_total{status=200}"), 1);
    assert_eq!(
        m.counter("trl_acquires_total{namespace=orders,kind=lock,outcome=completed}"),
        1
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_dead_redis_counts_store_errors_by_operation_and_kind() {
    let m = Recorded::default();
    let _r = install(&m);
    let mut server = RedisServer::start();
    let store = RedisStore::from_url(&server.url()).unwrap();
    let locker = Locker::new(store);
    let guard = locker.acquire(&key("6")).await.unwrap();
    assert!(m.names().iter().all(|n| !n.starts_with("trl_store_errors")));

    server.stop();
    let err = locker.acquire(&key("7")).await.unwrap_err();
    assert!(err.is_store_failure(), "{err:?}");
    assert_eq!(
        m.counter("trl_acquires_total{namespace=orders,kind=lock,outcome=error}"),
        1
    );
    let errors: Vec<String> = m
        .names()
        .into_iter()
        .filter(|n| n.starts_with("trl_store_errors_total{"))
        .collect();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].ends_with(",kind=unavailable}"), "{errors:?}");
    assert_eq!(m.counter(&errors[0]), 1);

    // The release fails too, and is counted under its own operation.
    assert!(guard.release().await.unwrap_err().is_store_failure());
    assert!(m.counter("trl_store_errors_total{op=release,kind=unavailable}") >= 1);
}

/// `describe()` gives every metric the crate reports its help text and
/// unit, and `ALL` names every metric it reports: the metrics a run of
/// the dead-Redis test and the layer's refusals produce are all in it.
#[tokio::test(flavor = "current_thread")]
async fn every_metric_is_named_and_described() {
    use tower_redis_lock::metrics;

    let m = Recorded::default();
    let _r = install(&m);
    metrics::describe();
    let described = m.described.lock().unwrap().clone();
    let mut names: Vec<&str> = described.keys().map(String::as_str).collect();
    names.sort();
    let mut all = metrics::ALL.to_vec();
    all.sort();
    assert_eq!(names, all);
    for (name, (unit, help)) in &described {
        assert!(!help.is_empty(), "{name}");
        let seconds = name.ends_with("_seconds");
        assert_eq!(*unit == Some(Unit::Seconds), seconds, "{name}: {unit:?}");
    }

    // An outage and its end: the store-up gauge, and names the crate
    // reports are all named in `ALL`.
    let mut server = RedisServer::start();
    let locker = Locker::new(RedisStore::from_url(&server.url()).unwrap());
    drop(locker.acquire(&key("8")).await.unwrap());
    server.stop();
    assert!(locker.acquire(&key("9")).await.is_err());
    assert_eq!(m.gauge(metrics::STORE_UP), Some(0.0));
    server.restart();
    drop(locker.acquire(&key("9")).await.unwrap());
    assert_eq!(m.gauge(metrics::STORE_UP), Some(1.0));
    for name in m.names() {
        let bare = name.split('{').next().unwrap();
        assert!(
            metrics::ALL.contains(&bare),
            "{name} is not in metrics::ALL"
        );
    }
}

/// What README's Prometheus example prints: with the exporter's recorder,
/// each metric the crate reported carries its `# HELP` text from
/// `describe()`, its type, and its labels.
#[test]
fn a_prometheus_scrape_names_each_metric_with_its_help() {
    use metrics_exporter_prometheus::PrometheusBuilder;
    use tower_redis_lock::metrics as m;

    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || {
        m::describe();
        rt.block_on(async {
            let locker = Locker::new(MemoryStore::new());
            let key = LockKey::new("jobs", "nightly").unwrap();
            let held = locker.acquire(&key).await.unwrap();
            assert!(locker.try_acquire(&key).await.unwrap_err().is_contended());
            held.release().await.unwrap();
        });
    });
    let text = handle.render();
    for (name, kind) in [
        (m::ACQUIRES, "counter"),
        (m::CONTENDED, "counter"),
        (m::ACQUIRE_DURATION, "summary"),
    ] {
        assert!(
            text.contains(&format!("# HELP {name} ")),
            "{name} without its help text:\n{text}"
        );
        assert!(
            text.contains(&format!("# TYPE {name} {kind}")),
            "{name} not a {kind}:\n{text}"
        );
    }
    assert!(
        text.lines().any(|l| l.starts_with(m::ACQUIRES)
            && l.contains("outcome=\"granted\"")
            && l.ends_with(" 1")),
        "no granted acquire counted:\n{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with(m::CONTENDED) && l.ends_with(" 1")),
        "no contended acquire counted:\n{text}"
    );
}
