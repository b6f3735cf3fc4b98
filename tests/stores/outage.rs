//! After an outage nothing stays stuck (README, "Promises"): a call its
//! client gave up on while the server was frozen, and that the server runs
//! when it resumes, is taken back, owner-checked, once the store answers,
//! for every kind (a lock, a permit, a read, a write and its waiting mark,
//! several keys at once, a resume's hand-off), whether the call timed out
//! or its future was dropped; and the locker's health recovers without
//! traffic.
//!
//! Each test freezes a real `redis-server` (SIGSTOP) while a call is on its
//! way, lets the call give up, resumes the server, and asks again from
//! another locker on its own connection. Leases are 30 s, so a key left
//! held by nobody would stay held for the whole of the test's budget.

use crate::support;

use support::topology::{Cluster, start_independent};
use support::{RedisServer, eventually};

use std::time::Duration;

use tower_redis_lock::{
    BoxStore, Error, LockGuard, LockKey, Locker, RedisStore, RedlockStore, RwMode,
};

/// The lease of every grant: far longer than any wait below, so a key
/// left held is seen held.
const LEASE: Duration = Duration::from_secs(30);
/// The command timeout of the locker that gives up during the freeze.
const TIMEOUT: Duration = Duration::from_millis(300);
/// How long a key may take to be free again after the server resumes: the
/// promise is about a second; this budget is for a loaded machine.
const BUDGET: Duration = Duration::from_secs(10);

fn key(id: &str) -> LockKey {
    LockKey::new("outage", id).unwrap()
}

/// Servers that are frozen and resumed together, and a store over them.
trait Frozen: Sized {
    fn start() -> Self;
    /// A store whose every command is bounded by `timeout`.
    fn store(&self, timeout: Duration) -> BoxStore;
    fn freeze(&self);
    fn thaw(&self);
    /// Every key held, but the fencing counters (which outlive locks by
    /// design): what a recovered store may still hold.
    fn left(&self) -> Vec<String>;

    fn locker(&self, timeout: Duration) -> Locker<BoxStore> {
        Locker::builder(self.store(timeout))
            .lease(LEASE)
            .build()
            .unwrap()
    }
}

/// One Redis primary.
impl Frozen for RedisServer {
    fn start() -> Self {
        RedisServer::start()
    }
    fn store(&self, timeout: Duration) -> BoxStore {
        let store = RedisStore::builder(&self.url()).command_timeout(timeout);
        BoxStore::new(store.build().unwrap())
    }
    fn freeze(&self) {
        RedisServer::freeze(self);
    }
    fn thaw(&self) {
        RedisServer::thaw(self);
    }
    fn left(&self) -> Vec<String> {
        self.keys_besides_counters()
    }
}

/// A Redis Cluster of three primaries, all frozen.
impl Frozen for Cluster {
    fn start() -> Self {
        Cluster::start(3)
    }
    fn store(&self, timeout: Duration) -> BoxStore {
        let urls = self.urls();
        let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
        let store = RedisStore::cluster_builder(&urls).command_timeout(timeout);
        BoxStore::new(store.build().unwrap())
    }
    fn freeze(&self) {
        self.nodes.iter().for_each(RedisServer::freeze);
    }
    fn thaw(&self) {
        self.nodes.iter().for_each(RedisServer::thaw);
    }
    fn left(&self) -> Vec<String> {
        let mut keys = self.keys_total();
        keys.retain(|k| !k.ends_with(":fence"));
        keys
    }
}

/// Redlock over three primaries, all frozen.
struct Redlock(Vec<RedisServer>);

impl Frozen for Redlock {
    fn start() -> Self {
        Redlock(start_independent(3))
    }
    fn store(&self, timeout: Duration) -> BoxStore {
        let nodes = self.0.iter().map(|s| {
            let store = RedisStore::builder(&s.url()).command_timeout(timeout);
            store.build().unwrap()
        });
        BoxStore::new(RedlockStore::new(nodes.collect()).unwrap())
    }
    fn freeze(&self) {
        self.0.iter().for_each(RedisServer::freeze);
    }
    fn thaw(&self) {
        self.0.iter().for_each(RedisServer::thaw);
    }
    /// The keys a majority of the nodes hold: a copy on a minority holds
    /// nothing (the next grant takes the key at a quorum without it), and
    /// lapses at its lease end, as in any Redlock.
    fn left(&self) -> Vec<String> {
        let mut seen = std::collections::BTreeMap::<String, usize>::new();
        for k in self.0.iter().flat_map(RedisServer::keys_besides_counters) {
            *seen.entry(k).or_default() += 1;
        }
        seen.into_iter()
            .filter(|(_, on)| *on > self.0.len() / 2)
            .map(|(k, _)| k)
            .collect()
    }
}

/// How the call gives up.
#[derive(Clone, Copy, Debug)]
enum GiveUp {
    /// Its command timeout answers `Unavailable`.
    TimedOut,
    /// Its future is dropped before that (a client gone, a timeout layer).
    Dropped,
}

/// Runs `call` while `server` is frozen, the way `how` says, then resumes
/// the server.
async fn abandoned_during_a_freeze<T: std::fmt::Debug>(
    server: &impl Frozen,
    how: GiveUp,
    call: impl Future<Output = Result<T, Error>>,
) {
    // A connection older than the command timeout, as in a service that
    // has run a while: the one a call times out on is then given up, and
    // what follows goes on a new one (the grant stays queued on the old).
    // (An age, not an event: the scenario's setting.)
    tokio::time::sleep(TIMEOUT * 2).await;
    server.freeze();
    match how {
        GiveUp::TimedOut => {
            let answer = call.await;
            assert!(
                matches!(answer, Err(Error::Unavailable { .. })),
                "a call to a frozen server: {answer:?}"
            );
        }
        GiveUp::Dropped => {
            let cut = tokio::time::timeout(TIMEOUT / 3, call).await;
            assert!(cut.is_err(), "a call to a frozen server answered: {cut:?}");
        }
    }
    // How long the server stays frozen after the call gave up (the
    // scenario's setting: its undo tries at once and fails at least once,
    // nothing outside the locker shows it).
    tokio::time::sleep(TIMEOUT * 2).await;
    server.thaw();
}

/// Whether `take` gets its lease within the budget (released at once).
async fn gets_in(mut take: impl AsyncFnMut() -> Result<LockGuard, Error>) -> bool {
    eventually(BUDGET, async || match take().await {
        Ok(g) => g.release().await.is_ok(),
        Err(_) => false,
    })
    .await
}

/// The servers, a locker that gives up (short command timeout) and one
/// that asks after the outage, both connected.
async fn start<F: Frozen>() -> (F, Locker<BoxStore>, Locker<BoxStore>) {
    let server = F::start();
    let (gives_up, other) = (server.locker(TIMEOUT), server.locker(TIMEOUT * 10));
    other.check().await.unwrap();
    gives_up.check().await.unwrap();
    (server, gives_up, other)
}

async fn nothing_left(server: &impl Frozen) {
    let mut left = Vec::new();
    let clean = eventually(BUDGET, async || {
        left = server.left();
        left.is_empty()
    })
    .await;
    assert!(clean, "left in Redis after the outage: {left:?}");
}

/// The mutex: the key is free again, and another locker gets it.
async fn a_lock<F: Frozen>(how: GiveUp) {
    let (server, gives_up, other) = start::<F>().await;
    let k = key("lock");
    abandoned_during_a_freeze(&server, how, gives_up.try_acquire(&k)).await;
    let freed = gets_in(async || other.try_acquire(&k).await).await;
    assert!(
        freed,
        "{how:?}: the key stayed held after the server resumed"
    );
    nothing_left(&server).await;
    let done = eventually(BUDGET, async || gives_up.status().undos_waiting == 0).await;
    assert!(done, "undos still wait: {:?}", gives_up.status());
}

/// A permit of one: a stuck permit would take the only place.
async fn a_permit<F: Frozen>(how: GiveUp) {
    let (server, gives_up, other) = start::<F>().await;
    let k = key("permit");
    let sem = gives_up.semaphore(&k, 1).unwrap();
    abandoned_during_a_freeze(&server, how, sem.try_acquire()).await;
    let theirs = other.semaphore(&k, 1).unwrap();
    let freed = gets_in(async || theirs.try_acquire().await).await;
    assert!(
        freed,
        "{how:?}: the permit stayed taken after the server resumed"
    );
    nothing_left(&server).await;
}

/// One side of a reader-writer lock, abandoned; the other side asked for
/// after the outage: a stuck read would keep every writer out, a stuck
/// write everyone.
async fn a_side<F: Frozen>(how: GiveUp, abandoned: RwMode) {
    let (server, gives_up, other) = start::<F>().await;
    let k = key(&format!("{abandoned:?}"));
    let (rw, theirs) = (gives_up.rwlock(&k).unwrap(), other.rwlock(&k).unwrap());
    let freed = match abandoned {
        RwMode::Read => {
            abandoned_during_a_freeze(&server, how, rw.try_read()).await;
            gets_in(async || theirs.try_write().await).await
        }
        _ => {
            abandoned_during_a_freeze(&server, how, rw.try_write()).await;
            gets_in(async || theirs.try_read().await).await
        }
    };
    assert!(
        freed,
        "{how:?}: the {abandoned:?} stayed held after the server resumed"
    );
    nothing_left(&server).await;
}

async fn a_read<F: Frozen>(how: GiveUp) {
    a_side::<F>(how, RwMode::Read).await;
}

async fn a_write<F: Frozen>(how: GiveUp) {
    a_side::<F>(how, RwMode::Write).await;
}

/// A waiting writer's mark, set when the server runs the writer's queued
/// try on resuming and finds a reader in: a mark left would refuse every
/// new reader for a lease.
async fn a_writers_mark<F: Frozen>(how: GiveUp) {
    let (server, gives_up, other) = start::<F>().await;
    let k = key("mark");
    let theirs = other.rwlock(&k).unwrap();
    let reading = theirs.try_read().await.unwrap();
    let rw = gives_up.rwlock(&k).unwrap();
    abandoned_during_a_freeze(&server, how, rw.write_within(Duration::from_secs(5))).await;
    let joined = gets_in(async || theirs.try_read().await).await;
    assert!(
        joined,
        "{how:?}: the writer's mark stayed after the server resumed: a new reader is refused"
    );
    reading.release().await.unwrap();
    nothing_left(&server).await;
}

/// Several keys at once: every one of them is free again.
async fn several_keys<F: Frozen>(how: GiveUp) {
    let (server, gives_up, other) = start::<F>().await;
    let keys = [key("multi-a"), key("multi-b"), key("multi-c")];
    abandoned_during_a_freeze(&server, how, gives_up.acquire_all(&keys)).await;
    for k in &keys {
        let freed = gets_in(async || other.try_acquire(k).await).await;
        assert!(freed, "{how:?}: {k} stayed held after the server resumed");
    }
    nothing_left(&server).await;
}

/// A resume's hand-off that the server runs late is handed back: a retry of
/// the resume finds the exported lease, as `Locker::resume` promises.
async fn a_hand_off<F: Frozen>(how: GiveUp) {
    let server = F::start();
    let (web, worker) = (server.locker(TIMEOUT * 10), server.locker(TIMEOUT));
    let k = key("hand-off");
    web.check().await.unwrap();
    worker.check().await.unwrap();
    let guard = web.acquire(&k).await.unwrap();
    let token = guard.fencing_token().unwrap();
    let exported = serde_json::to_string(&guard.export().unwrap()).unwrap();
    let lease = || serde_json::from_str(&exported).unwrap();
    abandoned_during_a_freeze(&server, how, worker.resume(lease())).await;
    let mut last = None;
    let resumed = eventually(BUDGET, async || match worker.resume(lease()).await {
        Ok(g) => {
            last = Some(g);
            true
        }
        Err(_) => false,
    })
    .await;
    assert!(
        resumed,
        "{how:?}: a retry of the resume never found the lease"
    );
    let resumed = last.unwrap();
    assert_eq!(resumed.fencing_token().unwrap(), token);
    resumed.release().await.unwrap();
    nothing_left(&server).await;
}

/// `status().store_up` recovers by itself: no acquire after the outage.
async fn the_store_is_seen_up_again_without_traffic<F: Frozen>() {
    let server = F::start();
    let l = server.locker(TIMEOUT);
    l.check().await.unwrap();
    assert!(l.status().store_up);
    server.freeze();
    // (A check, not an acquire: nothing is left to undo, so only the
    // locker's probe can find the store up again.)
    let err = l.check().await.unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    assert!(!l.status().store_up);
    let report = err.report().to_string();
    assert!(
        report.contains("unavailable") && report.contains(':'),
        "the check's report tells the cause: {report}"
    );
    server.thaw();
    let up = eventually(BUDGET, async || l.status().store_up).await;
    assert!(up, "store_up stayed false after the server resumed");
}

/// Each scenario named, both ways of giving up, as tests of a topology.
macro_rules! outage {
    ($topology:ty; $($scenario:ident),*) => {
        $(
            mod $scenario {
                use super::*;

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn timed_out() {
                    super::super::$scenario::<$topology>(GiveUp::TimedOut).await;
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn dropped() {
                    super::super::$scenario::<$topology>(GiveUp::Dropped).await;
                }
            }
        )*

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn the_store_is_seen_up_again_without_traffic() {
            super::the_store_is_seen_up_again_without_traffic::<$topology>().await;
        }
    };
}

mod redis {
    use super::*;
    outage!(RedisServer; a_lock, a_permit, a_read, a_write, a_writers_mark, several_keys, a_hand_off);
}

mod cluster {
    use super::*;
    outage!(Cluster; a_lock, a_permit, a_read, a_write, a_writers_mark, several_keys);
}

/// Redlock keeps locks and hand-offs (no permits, reads or writes).
mod redlock {
    use super::*;
    outage!(Redlock; a_lock, a_hand_off);
}
