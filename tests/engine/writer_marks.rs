//! A waiting writer's mark (reader-writer locks): kept on every path of
//! the wait, whatever the poll interval and the hold cap, and taken back
//! however the wait ends, its runtime's shutdown included.
//!
//! The paths of the wait that ask the store nothing (waiting for this
//! process's turn, subscribing) run on the memory store wrapped so that a
//! write try's answer or a subscription can be held at a gate, on a paused
//! clock; the runtime's shutdown runs on the memory store and on a real
//! `redis-server`.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use support::{RedisServer, eventually};
use tokio::sync::watch;
use tower_redis_lock::{
    AcquireOutcome, Error, Grant, LeaseKind, LockKey, LockStore, Locker, MemoryStore, OwnerToken,
    RedisStore, ReleaseWatch,
};

fn key(id: &str) -> LockKey {
    LockKey::new("marks", id).unwrap()
}

/// The memory store, with a gate in front of the answers of write tries
/// and one in front of subscriptions: closed, they wait there (a slow
/// answer, a pub/sub connection slow to open) until it opens.
#[derive(Clone)]
struct Gates {
    inner: MemoryStore,
    /// `true`: a write try's answer (the try itself done) waits.
    write_answers: Arc<watch::Sender<bool>>,
    /// `true`: a subscription waits.
    subscriptions: Arc<watch::Sender<bool>>,
    /// Calls waiting at either gate right now.
    at_gate: Arc<AtomicU32>,
}

impl Gates {
    fn new(inner: &MemoryStore) -> Self {
        Gates {
            inner: inner.clone(),
            write_answers: Arc::new(watch::channel(false).0),
            subscriptions: Arc::new(watch::channel(false).0),
            at_gate: Arc::default(),
        }
    }

    async fn pass(&self, gate: &watch::Sender<bool>) {
        let mut rx = gate.subscribe();
        if *rx.borrow() {
            self.at_gate.fetch_add(1, Ordering::SeqCst);
            let _ = rx.wait_for(|closed| !closed).await;
            self.at_gate.fetch_sub(1, Ordering::SeqCst);
        }
    }

    fn at_gate(&self) -> u32 {
        self.at_gate.load(Ordering::SeqCst)
    }
}

impl LockStore for Gates {
    fn supports(&self, kind: LeaseKind) -> bool {
        self.inner.supports(kind)
    }
    async fn grant(&self, grant: Grant<'_>) -> Result<AcquireOutcome, Error> {
        let write = grant.kind() == LeaseKind::Write;
        let answer = self.inner.grant(grant).await;
        if write {
            self.pass(&self.write_answers).await;
        }
        answer
    }
    async fn renew(
        &self,
        kind: LeaseKind,
        k: &LockKey,
        o: &OwnerToken,
        l: Duration,
    ) -> Result<bool, Error> {
        self.inner.renew(kind, k, o, l).await
    }
    async fn release(&self, kind: LeaseKind, k: &LockKey, o: &OwnerToken) -> Result<bool, Error> {
        self.inner.release(kind, k, o).await
    }
    async fn finish(
        &self,
        k: &LockKey,
        o: &OwnerToken,
        r: bytes::Bytes,
        t: Duration,
    ) -> Result<bool, Error> {
        self.inner.finish(k, o, r, t).await
    }
    async fn read_record(&self, k: &LockKey) -> Result<Option<bytes::Bytes>, Error> {
        self.inner.read_record(k).await
    }
    async fn subscribe(&self, k: &LockKey) -> Result<ReleaseWatch, Error> {
        self.pass(&self.subscriptions).await;
        self.inner.subscribe(k).await
    }
}

/// The hold cap, and so each mark's length: 300 ms, far below the lease.
const CAP: Duration = Duration::from_millis(300);

/// A locker (this "process") whose waiting writers mark themselves for
/// [`CAP`] and which polls once an hour.
fn capped<S: LockStore>(store: S) -> Locker<S> {
    Locker::builder(store)
        .lease(Duration::from_secs(30))
        .max_hold(CAP)
        .wait_timeout(Duration::from_secs(60))
        .poll_interval(Duration::from_secs(3600))
        .build()
        .unwrap()
}

/// Another process's locker.
fn other(store: &MemoryStore) -> Locker<MemoryStore> {
    Locker::new(store.clone())
}

/// Whether a new reader of `l` is refused as contended right now (a
/// reader granted is released at once).
async fn read_refused<S: LockStore>(l: &Locker<S>, k: &LockKey) -> bool {
    match l.rwlock(k).unwrap().try_read().await {
        Err(e) if e.is_contended() => true,
        Err(e) => panic!("{e}"),
        Ok(g) => {
            g.release().await.unwrap();
            false
        }
    }
}

/// Asserts, every 10 ms for `how_long` of the paused clock, that no new
/// reader of `l` gets in.
async fn readers_kept_out<S: LockStore>(l: &Locker<S>, k: &LockKey, how_long: Duration) {
    let from = tokio::time::Instant::now();
    while from.elapsed() < how_long {
        assert!(
            read_refused(l, k).await,
            "a reader got in {:?} into the writer's wait",
            from.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits (5 s at most) for the writer's grant, asserting every 10 ms until
/// then that no new reader of `l` gets in ahead of it.
async fn writer_first<S: LockStore>(
    l: &Locker<S>,
    k: &LockKey,
    mut writing: tokio::task::JoinHandle<Result<tower_redis_lock::LockGuard, Error>>,
) -> tower_redis_lock::LockGuard {
    let from = tokio::time::Instant::now();
    loop {
        assert!(
            read_refused(l, k).await,
            "a reader got in ahead of the writer, {:?} after the release",
            from.elapsed()
        );
        let next = tokio::time::sleep(Duration::from_millis(10));
        tokio::select! {
            w = &mut writing => return w.unwrap().unwrap(),
            () = next => {}
        }
        assert!(
            from.elapsed() < Duration::from_secs(5),
            "the writer was not granted"
        );
    }
}

/// A writer that marked itself on its first try, then waits for its turn
/// behind a reader of its own process (which came in while the writer's
/// answer was on its way, and which the mark itself keeps waiting): the
/// writer renews its mark while it waits for the turn, so that when the
/// other process's writer releases, neither that reader nor one of
/// another process gets in ahead of it; the writer goes first. (The turn
/// was awaited without a try: the mark lapsed there, and the local reader
/// it held back got in, then any reader.)
#[tokio::test(start_paused = true)]
async fn a_writer_waiting_for_its_turn_behind_a_local_reader_keeps_its_mark() {
    let store = MemoryStore::new();
    let gates = Gates::new(&store);
    let here = capped(gates.clone());
    let (elsewhere, others) = (other(&store), other(&store));
    let k = key("turn");
    let held = elsewhere.rwlock(&k).unwrap().try_write().await.unwrap();

    // The writer's first try marks it; its answer waits at the gate.
    gates.write_answers.send_replace(true);
    let writer = here.rwlock(&k).unwrap();
    let writing = tokio::spawn(async move { writer.write().await });
    assert!(eventually(Duration::from_secs(5), async || gates.at_gate() == 1).await);
    // Meanwhile a reader of this process finds the key busy and queues
    // first: it has the turn.
    let reader = here.rwlock(&k).unwrap();
    let reading = tokio::spawn(async move { reader.read().await });
    assert!(eventually(Duration::from_secs(5), async || here.has_waiters(&k)).await);
    // The writer's answer arrives: it queues behind the reader.
    gates.write_answers.send_replace(false);
    assert!(eventually(Duration::from_secs(5), async || gates.at_gate() == 0).await);

    readers_kept_out(&others, &k, CAP * 10).await;
    assert!(held.release().await.unwrap());
    let w = writer_first(&others, &k, writing).await;
    assert!(
        !reading.is_finished(),
        "the reader got in ahead of the writer"
    );
    assert!(w.release().await.unwrap());
    let r = tokio::time::timeout(Duration::from_secs(5), reading)
        .await
        .expect("the reader was not granted after the writer")
        .unwrap()
        .unwrap();
    r.release().await.unwrap();
}

/// A writer whose subscription is slow to come (a pub/sub connection
/// being opened) renews its mark meanwhile: no reader of another process
/// gets in, however long the subscription takes. (Awaited without a
/// try, the mark lapsed at its length.)
#[tokio::test(start_paused = true)]
async fn a_writer_whose_subscription_is_slow_keeps_its_mark() {
    let store = MemoryStore::new();
    let gates = Gates::new(&store);
    let here = capped(gates.clone());
    let (elsewhere, others) = (other(&store), other(&store));
    let k = key("subscribe");
    let held = elsewhere.rwlock(&k).unwrap().try_read().await.unwrap();
    gates.subscriptions.send_replace(true);
    let writer = here.rwlock(&k).unwrap();
    let writing = tokio::spawn(async move { writer.write().await });
    assert!(eventually(Duration::from_secs(5), async || gates.at_gate() == 1).await);
    readers_kept_out(&others, &k, CAP * 10).await;
    gates.subscriptions.send_replace(false);
    readers_kept_out(&others, &k, CAP * 3).await;
    assert!(held.release().await.unwrap());
    let w = writer_first(&others, &k, writing).await;
    assert!(w.release().await.unwrap());
}

/// How a runtime goes.
#[derive(Clone, Copy, Debug)]
enum Shutdown {
    /// `Runtime::shutdown_timeout`, a worker thread running the writer.
    Timeout,
    /// Dropped (a current-thread runtime, its tasks not driven).
    Drop,
}

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A writer waits (its mark lasts 30 s, its locker's lease) on a runtime
/// of its own; the runtime shuts down: the mark is taken back then,
/// though no task of that runtime runs any more, and a reader of another
/// process gets in right after, not when the mark's 30 s end. `writer`
/// is used on the writer's runtime only, `other` on the main one.
fn a_writers_mark_goes_with_its_runtime<S: LockStore, T: LockStore>(
    writer: Locker<S>,
    other: Locker<T>,
    how: Shutdown,
) {
    let k = key(&format!("runtime-{how:?}"));
    let main = current_thread();
    let held = main.block_on(async { other.rwlock(&k).unwrap().try_read().await.unwrap() });
    let rt = match how {
        Shutdown::Timeout => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap(),
        Shutdown::Drop => current_thread(),
    };
    let rw = writer.rwlock(&k).unwrap();
    let writing = rt.spawn(async move { rw.write_within(Duration::from_secs(60)).await });
    assert!(
        rt.block_on(eventually(Duration::from_secs(5), async || writer.has_waiters(&k))),
        "the writer never waited"
    );
    main.block_on(async {
        assert!(read_refused(&other, &k).await, "the writer was not marked");
    });
    match how {
        Shutdown::Timeout => rt.shutdown_timeout(Duration::from_secs(5)),
        Shutdown::Drop => drop(rt),
    }
    drop(writing);
    main.block_on(async {
        assert!(
            eventually(Duration::from_secs(5), async || !read_refused(&other, &k)
                .await)
            .await,
            "readers kept out after the writer's runtime shut down"
        );
        held.release().await.unwrap();
    });
}

fn marked_for_30_s<S: LockStore>(store: S) -> Locker<S> {
    Locker::builder(store)
        .lease(Duration::from_secs(30))
        .build()
        .unwrap()
}

#[test]
fn memory_a_writers_mark_is_taken_back_when_its_runtime_is_dropped() {
    let store = MemoryStore::new();
    a_writers_mark_goes_with_its_runtime(
        marked_for_30_s(store.clone()),
        other(&store),
        Shutdown::Drop,
    );
}

#[test]
fn memory_a_writers_mark_is_taken_back_when_its_runtime_shuts_down() {
    let store = MemoryStore::new();
    a_writers_mark_goes_with_its_runtime(
        marked_for_30_s(store.clone()),
        other(&store),
        Shutdown::Timeout,
    );
}

/// On Redis, the writer's store (its own connections, opened on the
/// writer's runtime and dead with it) is another process's.
fn redis_lockers(server: &RedisServer) -> (Locker<RedisStore>, Locker<RedisStore>) {
    let writer = RedisStore::from_url(&server.url()).unwrap();
    let other = RedisStore::from_url(&server.url()).unwrap();
    (marked_for_30_s(writer), Locker::new(other))
}

#[test]
fn redis_a_writers_mark_is_taken_back_when_its_runtime_is_dropped() {
    let server = RedisServer::start();
    let (writer, other) = redis_lockers(&server);
    a_writers_mark_goes_with_its_runtime(writer, other, Shutdown::Drop);
}

#[test]
fn redis_a_writers_mark_is_taken_back_when_its_runtime_shuts_down() {
    let server = RedisServer::start();
    let (writer, other) = redis_lockers(&server);
    a_writers_mark_goes_with_its_runtime(writer, other, Shutdown::Timeout);
}
