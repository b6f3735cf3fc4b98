//! The Redis store behind Sentinel: one primary, one replica and three
//! sentinels, all real processes; failovers forced by `SENTINEL FAILOVER`
//! and by freezing the primary.

use crate::kinds::Take;
use crate::support;
use support::stores::redis_name;

use std::time::Duration;

use support::topology::SentinelSet;
use tokio::time::timeout;
use tower_redis_lock::{Error, LockKey, Locker, RedisStore, RedisStoreBuilder, ReplicaShortfall};

fn builder(set: &SentinelSet) -> RedisStoreBuilder {
    let urls = set.sentinel_urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    RedisStore::sentinel_builder(&urls, &set.master_name)
        .command_timeout(Duration::from_millis(300))
}

fn store(set: &SentinelSet) -> RedisStore {
    builder(set).build().unwrap()
}

fn key(id: &str) -> LockKey {
    LockKey::new("sentinel", id).unwrap()
}

/// Tries until a grant succeeds (errors are expected while the failover is
/// under way).
async fn acquire_eventually(l: &Locker<RedisStore>, k: &LockKey) -> tower_redis_lock::LockGuard {
    let mut last = None;
    support::eventually_some(Duration::from_secs(30), async || {
        l.try_acquire(k).await.map_err(|e| last = Some(e)).ok()
    })
    .await
    .unwrap_or_else(|| panic!("no grant after the failover: {last:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_grants_follow_a_failover_and_tokens_never_go_backwards() {
    let set = SentinelSet::start();
    // Every grant must be confirmed by the replica: a confirmation answers
    // as soon as it comes, so the bound is one a loaded machine meets
    // (200 ms within a 300 ms command timeout was not, in replicas.rs).
    let st = builder(&set)
        .command_timeout(Duration::from_secs(3))
        .wait_replicas(1, Duration::from_secs(2), ReplicaShortfall::Fail)
        .build()
        .unwrap();
    let l = Locker::builder(st)
        .lease(Duration::from_secs(5))
        .build()
        .unwrap();
    let k = key("follow");
    let mut last = 0;
    for _ in 0..5 {
        let g = l.try_acquire(&k).await.unwrap();
        assert!(g.fencing_token().unwrap().get() > last);
        last = g.fencing_token().unwrap().get();
        g.release().await.unwrap();
    }
    let old_port = set.primary.port();
    let new_port = set.failover();
    assert_ne!(new_port, old_port);

    let g = acquire_eventually(&l, &k).await;
    assert!(
        g.fencing_token().unwrap().get() > last,
        "token went backwards"
    );
    // The grant is on the new primary.
    let new_primary = set.server_on_port(new_port).unwrap();
    assert!(
        new_primary
            .keys()
            .contains(&redis_name("sentinel", "follow", "lock")),
        "{:?}",
        new_primary.keys()
    );
    assert!(g.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_refuses_a_grant_the_replica_did_not_get() {
    let set = SentinelSet::start();
    let st = builder(&set)
        .wait_replicas(1, Duration::from_millis(100), ReplicaShortfall::Fail)
        .build()
        .unwrap();
    let l = Locker::new(st);
    set.replica.freeze();
    // A lock's grant and a permit's alike.
    let res = [
        Take::Lock.one(&l, &key("unreplicated")).await,
        Take::Permits(3).one(&l, &key("unreplicated")).await,
    ];
    set.replica.thaw();
    for res in res {
        match res {
            Err(Error::Unavailable { source, .. }) => {
                assert!(
                    source.to_string().contains("replicas acknowledged"),
                    "{source}"
                )
            }
            other => panic!("{other:?}"),
        }
    }
    // The refused grants were taken back.
    assert!(
        set.primary
            .keys()
            .iter()
            .all(|k| !k.ends_with(":lock") && !k.ends_with(":permits")),
        "{:?}",
        set.primary.keys()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_grant_missed_the_new_primary_is_told_it_lost() {
    let set = SentinelSet::start();
    let l = Locker::builder(store(&set))
        .lease(Duration::from_secs(3))
        .build()
        .unwrap();
    let k = key("missed");
    // The grant reaches the primary only: the replica is frozen.
    set.replica.freeze();
    let g = l.try_acquire(&k).await.unwrap();
    let old_token = g.fencing_token().unwrap();
    // Now the primary goes silent and the replica is promoted.
    set.primary.freeze();
    set.replica.thaw();
    let new_port = set.wait_for_master_change(set.primary.port());
    assert_eq!(new_port, set.replica.port());
    // The replication stream may already have been sitting in the frozen
    // replica's socket buffer, in which case the promoted replica has the
    // grant and the holder rightly keeps it. Otherwise the holder must be
    // told it lost.
    let lock_key = redis_name("sentinel", "missed", "lock");
    if set.replica.keys().contains(&lock_key) {
        let counter = set
            .replica
            .cmd(&["GET", &redis_name("sentinel", "missed", "fence")])
            .as_string()
            .unwrap();
        assert_eq!(counter, old_token.get().to_string());
        // No second grant while it is there (the holder may or may not have
        // flipped to lost meanwhile, depending on how long the failover took).
        assert!(l.try_acquire(&k).await.unwrap_err().is_contended());
        let _ = g.release().await;
        set.primary.thaw();
        return;
    }
    timeout(Duration::from_secs(30), g.lost())
        .await
        .expect("the old holder was never told");
    assert!(!g.is_held());
    // The new primary grants the key, with a larger token.
    let g2 = acquire_eventually(&l, &k).await;
    assert!(g2.fencing_token().unwrap() > old_token);
    set.primary.thaw();
    assert!(g2.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_waiting_for_replicas_holds_up_no_other_command() {
    let set = SentinelSet::start();
    // WAIT may take up to 8 s here; the store's other commands must not
    // queue behind it.
    let st = builder(&set)
        .command_timeout(Duration::from_secs(10))
        .wait_replicas(1, Duration::from_secs(8), ReplicaShortfall::Proceed)
        .build()
        .unwrap();
    let l = Locker::new(st);
    let held = l.try_acquire(&key("held")).await.unwrap();

    set.replica.freeze();
    let waiting = {
        let l = l.clone();
        tokio::spawn(async move { l.try_acquire(&key("waiting")).await })
    };
    // The grant is written and its WAIT is blocked on the primary.
    let blocked = || {
        set.primary
            .cmd(&["INFO", "clients"])
            .as_string()
            .unwrap()
            .lines()
            .any(|l| l.trim() == "blocked_clients:1")
    };
    assert!(support::wait_until(Duration::from_secs(10), blocked));

    // Renewal, release and the grant of a free key all answer while the
    // WAIT is still blocked.
    held.extend().await.unwrap();
    assert!(held.release().await.unwrap());
    let other = Locker::new(store(&set));
    // Another key is granted meanwhile (the guard dropped at once).
    drop(other.try_acquire(&key("other")).await.unwrap());
    assert!(
        !waiting.is_finished(),
        "the WAIT ended before the other commands answered"
    );
    assert!(blocked());

    waiting.abort();
    set.replica.thaw();
}

/// A frozen first Sentinel costs a lookup nothing. The other
/// Sentinels answer at once, so a store whose command timeout (300 ms) is
/// below redis-rs' own per-Sentinel response timeout (500 ms) connects and
/// grants within a few of its own command timeouts, whatever the list
/// order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_first_sentinel_does_not_keep_a_short_timeout_store_from_connecting() {
    let set = SentinelSet::start();
    set.sentinels[0].freeze();
    let command_timeout = Duration::from_millis(300);
    let st = builder(&set)
        .command_timeout(command_timeout)
        .build()
        .unwrap();
    let l = Locker::new(st);
    // Each try is bounded by the command timeout, which a lookup that
    // waits 500 ms for the frozen Sentinel runs into every time. Ten tries
    // leave room for a loaded machine (four did, tightly).
    let bound = command_timeout * 10;
    let started = std::time::Instant::now();
    let mut last = None;
    let g = support::eventually_some(bound, async || {
        l.try_acquire(&key("frozen-sentinel"))
            .await
            .map_err(|e| last = Some(e))
            .ok()
    })
    .await
    .unwrap_or_else(|| panic!("no grant within {bound:?}: {last:?}"));
    assert!(
        started.elapsed() < bound + command_timeout,
        "{:?}",
        started.elapsed()
    );
    // Later connections (after the store forgets its connection) look up
    // again, still past the frozen Sentinel.
    assert!(g.release().await.unwrap());
    set.sentinels[0].thaw();
}

/// The grants of one key the caller was told about (its lock, or some of
/// its permits), and when the first acquire started (their leases run from
/// there at the latest).
struct Acked {
    key: LockKey,
    started: std::time::Instant,
    guards: Vec<tower_redis_lock::LockGuard>,
}

/// What a run of grants across a failover saw.
struct Across {
    acked: Vec<Acked>,
    refused: usize,
    /// From the moment the sentinels agreed on the new primary to the
    /// first grant script the store ran there.
    followed_after: Option<Duration>,
}

/// Workers taking fresh keys through `l` (`take` of each: its lock, or
/// every permit of its semaphore; one key every 10 ms, guards kept) while
/// `failover` runs; then on until the store runs a grant on the new
/// primary (at most 15 s), and two more keys per worker.
async fn grants_across_a_failover(
    set: &mut SentinelSet,
    l: &Locker<RedisStore>,
    take: Take,
    failover: impl FnOnce(&mut SentinelSet) -> u16,
) -> Across {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    const WORKERS: usize = 8;
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(Mutex::new(Vec::<Acked>::new()));
    let refused = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..WORKERS)
        .map(|w| {
            let (l, stop, acked, refused) =
                (l.clone(), stop.clone(), acked.clone(), refused.clone());
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_millis(10));
                for n in 0.. {
                    tick.tick().await;
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let key = key(&format!("w{w}-{n}"));
                    let started = std::time::Instant::now();
                    let (guards, errors) = take.all(&l, &key).await;
                    refused.fetch_add(errors.len(), Ordering::Relaxed);
                    if !guards.is_empty() {
                        acked.lock().unwrap().push(Acked {
                            key,
                            started,
                            guards,
                        });
                    }
                }
            })
        })
        .collect();
    // Some grants before the failover.
    assert!(
        support::eventually(Duration::from_secs(10), async || acked
            .lock()
            .unwrap()
            .len()
            >= 20)
        .await
    );
    let new_port = tokio::task::block_in_place(|| failover(set));
    let changed = std::time::Instant::now();
    let new_primary = set.server_on_port(new_port).unwrap();
    // The store talks to the primary it found only, so a grant script run
    // on the new primary is the store following it.
    let followed_after = support::eventually_some(Duration::from_secs(15), async || {
        (new_primary.command_calls("evalsha") > 0).then(|| changed.elapsed())
    })
    .await;
    // Two more tries per worker on the new primary.
    let attempts = || acked.lock().unwrap().len() + refused.load(Ordering::Relaxed);
    let then = attempts();
    support::eventually(Duration::from_secs(5), async || {
        attempts() >= then + 2 * WORKERS
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.unwrap();
    }
    let acked = std::mem::take(&mut *acked.lock().unwrap());
    Across {
        acked,
        refused: refused.load(Ordering::Relaxed),
        followed_after,
    }
}

/// The holders beyond a key's capacity (`take`'s) once a fresh store on
/// the new primary has taken what it can of each key of `run` while the
/// leases of `run` are valid: for a lock, a second holder each.
async fn granted_again(set: &SentinelSet, run: &Across, lease: Duration, take: Take) -> usize {
    let other = Locker::builder(store(set)).lease(lease).build().unwrap();
    let mut over = 0;
    for a in &run.acked {
        let (again, _) = take.all(&other, &a.key).await;
        if a.started.elapsed() < lease {
            over += (a.guards.len() + again.len()).saturating_sub(take.capacity());
        }
    }
    over
}

/// The lease of the failover runs: longer than a failover takes to be
/// followed, so that every grant is still valid when it is checked.
const FAILOVER_LEASE: Duration = Duration::from_secs(10);

fn failover_locker(st: RedisStore) -> Locker<RedisStore> {
    Locker::builder(st).lease(FAILOVER_LEASE).build().unwrap()
}

fn waiting_store(set: &SentinelSet) -> RedisStore {
    builder(set)
        .wait_replicas(1, Duration::from_millis(100), ReplicaShortfall::Fail)
        .build()
        .unwrap()
}

/// The replica falls behind (its link cut): the grants from here on reach
/// the primary only; after 16 more scripts there the primary is killed
/// (`SIGKILL`), and the Sentinels fail over on their own to the replica
/// that missed them. Returns the new primary's port.
fn kill_behind_replica(s: &mut SentinelSet) -> u16 {
    s.cut_replica_off();
    let calls = s.primary.command_calls("evalsha");
    assert!(support::wait_until(Duration::from_secs(5), || {
        s.primary.command_calls("evalsha") >= calls + 16
    }));
    let old = s.primary.port();
    s.primary.stop();
    s.replica.thaw();
    s.wait_for_master_change(old)
}

fn report(what: &str, run: &Across, twice: usize) {
    eprintln!(
        "{what}: {} grants acknowledged, {} refused, {twice} granted again; \
         followed {:?} after the sentinels agreed",
        run.acked.iter().map(|a| a.guards.len()).sum::<usize>(),
        run.refused,
        run.followed_after
    );
}

/// With `WAIT` and `ReplicaShortfall::Fail`, a `SENTINEL FAILOVER` while
/// eight tasks take locks costs refusals, never a second holder: every
/// grant acknowledged to a caller is refused to a fresh store on the new
/// primary while its lease is valid. The store follows the new primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_wait_a_sentinel_failover_in_the_middle_of_grants_gives_no_second_holder() {
    let mut set = SentinelSet::start();
    let l = failover_locker(waiting_store(&set));
    let run = grants_across_a_failover(&mut set, &l, Take::Lock, |s| s.failover()).await;
    let twice = granted_again(&set, &run, FAILOVER_LEASE, Take::Lock).await;
    report("WAIT, SENTINEL FAILOVER", &run, twice);
    assert_eq!(twice, 0, "grants given to a second holder");
    assert!(run.followed_after.is_some(), "the store never followed");
}

/// The same when the replica falls behind in the middle of the grants
/// (its link cut) and the primary is killed (`SIGKILL`): the Sentinels
/// fail over on their own to a replica that missed the last grants.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_wait_a_killed_primary_in_the_middle_of_grants_gives_no_second_holder() {
    let mut set = SentinelSet::start();
    let l = failover_locker(waiting_store(&set));
    let run = grants_across_a_failover(&mut set, &l, Take::Lock, kill_behind_replica).await;
    let twice = granted_again(&set, &run, FAILOVER_LEASE, Take::Lock).await;
    report("WAIT, primary killed", &run, twice);
    assert_eq!(twice, 0, "grants given to a second holder");
    let followed = run.followed_after.expect("the store never followed");
    // The Sentinels announce the switch (`+switch-master`) before they all
    // agree on it; the old primary stays a primary until they demote it
    // (about 10 s later), and the store must not wait for that.
    assert!(
        followed < Duration::from_secs(2),
        "followed after {followed:?}"
    );
}

/// Permits the same way: eight tasks take both permits of fresh
/// semaphores (of 2) while the replica falls behind and the primary is
/// killed. With `WAIT`, every permit acknowledged to a caller is on the
/// new primary: a fresh store there finds no key with more than 2 holders
/// while their leases are valid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_wait_a_killed_primary_in_the_middle_of_permit_grants_admits_no_more_than_n() {
    let mut set = SentinelSet::start();
    let l = failover_locker(waiting_store(&set));
    let take = Take::Permits(2);
    let run = grants_across_a_failover(&mut set, &l, take, kill_behind_replica).await;
    let over = granted_again(&set, &run, FAILOVER_LEASE, take).await;
    report("WAIT, permits, primary killed", &run, over);
    assert_eq!(over, 0, "permits beyond 2 per key");
    assert!(run.refused > 0, "no grant was refused while cut off");
}

/// Without `WAIT`, the same run admits more than N: the permits granted
/// while the replica was cut off are lost with the primary, and the new
/// primary grants them again while the first holders still hold them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_wait_a_killed_primary_in_the_middle_of_permit_grants_admits_more_than_n() {
    let mut set = SentinelSet::start();
    let l = failover_locker(store(&set));
    let take = Take::Permits(2);
    let run = grants_across_a_failover(&mut set, &l, take, kill_behind_replica).await;
    let over = granted_again(&set, &run, FAILOVER_LEASE, take).await;
    report("no WAIT, permits, primary killed", &run, over);
    assert!(over > 0, "no permit was lost in the failover");
}

/// Without `WAIT`, a `SENTINEL FAILOVER` while eight tasks take locks is
/// followed within 2 s of the Sentinels' agreement (the store hears
/// `+switch-master`; the old primary stays a primary for about 10 s more),
/// and the grants the old primary made after the promotion are granted
/// again (README, "Limits, plainly", has the figure).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_wait_a_sentinel_failover_in_the_middle_of_grants_is_followed_at_once() {
    let mut set = SentinelSet::start();
    let l = failover_locker(store(&set));
    let run = grants_across_a_failover(&mut set, &l, Take::Lock, |s| s.failover()).await;
    let twice = granted_again(&set, &run, FAILOVER_LEASE, Take::Lock).await;
    report("no WAIT, SENTINEL FAILOVER", &run, twice);
    let followed = run.followed_after.expect("the store never followed");
    assert!(
        followed < Duration::from_secs(2),
        "followed after {followed:?}"
    );
}

/// Without `WAIT`, every grant the replica missed before the primary died
/// is granted again by the new primary while its first lease is valid, and
/// each first holder is told it lost by its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_wait_every_grant_the_replica_missed_is_granted_again() {
    let mut set = SentinelSet::start();
    let lease = Duration::from_secs(6);
    let l = Locker::builder(store(&set)).lease(lease).build().unwrap();
    set.cut_replica_off();
    let mut first = Vec::new();
    for n in 0..20 {
        let k = key(&format!("missed-{n}"));
        let started = std::time::Instant::now();
        first.push((k.clone(), started, l.try_acquire(&k).await.unwrap()));
    }
    let old = set.primary.port();
    set.primary.stop();
    set.replica.thaw();
    tokio::task::block_in_place(|| set.wait_for_master_change(old));
    let other = Locker::builder(store(&set)).lease(lease).build().unwrap();
    let mut twice = 0;
    for (k, started, _) in &first {
        let again = acquire_eventually(&other, k).await;
        if started.elapsed() < lease {
            twice += 1;
        }
        drop(again);
    }
    eprintln!("no WAIT, replica cut off, primary killed: {twice} of 20 granted again");
    assert_eq!(twice, 20);
    for (_, started, g) in &first {
        let deadline = *started + lease;
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        timeout(left + Duration::from_millis(100), g.lost())
            .await
            .expect("a holder whose grant vanished was not told by its deadline");
    }
}

/// A primary frozen, a failover, the old primary thawed: until the
/// Sentinels demote it (seconds later) it still answers as a primary and
/// still holds a grant the new primary never got. The store takes no grant
/// from it (every grant lands on the new primary), the holder of the lost
/// grant is told by its deadline, a lease granted before the failover is
/// renewed on the new primary, and a waiter queued on it before the
/// failover is woken by its release there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demoted_primary_that_comes_back_is_never_granted_from() {
    let set = SentinelSet::start();
    // Longer than the failover takes, so that the lease from before it
    // is still valid when the new primary is found.
    let lease = Duration::from_secs(10);
    let l = Locker::builder(store(&set)).lease(lease).build().unwrap();
    let kept = l.try_acquire(&key("kept")).await.unwrap();
    // Another process waits once before the failover: its notification
    // connection is on the old primary.
    let other = Locker::builder(store(&set)).lease(lease).build().unwrap();
    let early = other
        .acquire_within(&key("kept"), Duration::from_millis(50))
        .await;
    assert!(matches!(early, Err(Error::WaitTimeout { .. })), "{early:?}");
    set.cut_replica_off();
    let started = std::time::Instant::now();
    let gone = l.try_acquire(&key("gone")).await.unwrap();
    let (old, new) = (set.primary.port(), set.replica.port());
    set.primary.freeze();
    set.replica.thaw();
    assert_eq!(
        tokio::task::block_in_place(|| set.wait_for_master_change(old)),
        new
    );
    set.primary.thaw();
    // The old primary's keys. When the Sentinels demote it they also kill
    // its clients (`CLIENT KILL TYPE normal`), the test's own connection
    // among them: a read cut off that way is made again.
    let old_keys = || {
        for _ in 0..5 {
            match set.primary.try_cmd(&["KEYS", "*"]) {
                Ok(support::Reply::Array(Some(items))) => {
                    return items
                        .iter()
                        .filter_map(|item| match item {
                            support::Reply::Bulk(Some(b)) => {
                                Some(String::from_utf8_lossy(b).into_owned())
                            }
                            _ => None,
                        })
                        .collect::<Vec<_>>();
                }
                Ok(other) => panic!("KEYS * on the old primary answered {other:?}"),
                Err(e) => eprintln!("KEYS * on the old primary: {e} (made again)"),
            }
        }
        panic!("KEYS * on the old primary failed five times")
    };
    // The Sentinels demote it 8 s after it went silent (their
    // `failover-timeout` x 2): usually seconds after the thaw, at once on
    // a machine slow enough to make the failover take that long.
    let back_as_primary =
        tokio::task::block_in_place(old_keys).contains(&redis_name("sentinel", "gone", "lock"));
    eprintln!(
        "the old primary came back {} the lost grant, {:?} after it",
        if back_as_primary { "with" } else { "without" },
        started.elapsed()
    );
    let demoted = || {
        matches!(
            support::topology::role(&set.primary),
            Ok(support::topology::Role::Replica { .. })
        )
    };
    // A grant the old primary would give (it has no such key): the store
    // takes it from the new one.
    let on_new_only = |id: &str| {
        let name = redis_name("sentinel", id, "lock");
        assert!(
            set.replica.keys().contains(&name),
            "{id} not on the new primary"
        );
        assert!(
            !old_keys().contains(&name) || demoted(),
            "{id} granted by the old primary"
        );
    };
    let g = acquire_eventually(&l, &key("after-0")).await;
    tokio::task::block_in_place(|| on_new_only("after-0"));
    drop(g);
    // The lost grant is reported lost by its deadline.
    let left = (started + lease).saturating_duration_since(std::time::Instant::now());
    timeout(left + Duration::from_millis(100), gone.lost())
        .await
        .expect("the holder of the lost grant was not told by its deadline");
    // The lease granted before the failover is renewed on the new primary.
    let kept_name = redis_name("sentinel", "kept", "lock");
    let pttl = || {
        set.replica
            .cmd(&["PTTL", &kept_name])
            .as_int()
            .unwrap_or(-2)
    };
    let mut least = pttl();
    assert!(
        support::eventually(lease, async || {
            let now = pttl();
            least = least.min(now);
            now > least + 200
        })
        .await,
        "the lease from before the failover was not renewed on the new primary \
         (PTTL down to {least} ms; held: {})",
        kept.is_held()
    );
    assert!(kept.is_held());
    // A waiter in the other process is woken by its release on the new
    // primary.
    let waiter = {
        let other = other.clone();
        tokio::spawn(async move {
            let g = other
                .acquire_within(&key("kept"), Duration::from_secs(20))
                .await;
            (g, std::time::Instant::now())
        })
    };
    let channel = redis_name("sentinel", "kept", "released");
    let subscribed = || {
        let reply = set.replica.cmd(&["PUBSUB", "NUMSUB", &channel]);
        matches!(reply.as_array(), Some([_, n]) if n.as_int() == Some(1))
    };
    assert!(
        support::eventually(Duration::from_secs(5), async || {
            tokio::task::block_in_place(subscribed)
        })
        .await,
        "the waiter did not subscribe on the new primary"
    );
    let released = std::time::Instant::now();
    assert!(kept.release().await.unwrap());
    let (g, woken) = timeout(Duration::from_secs(15), waiter)
        .await
        .unwrap()
        .unwrap();
    let g = g.expect("the waiter got no grant");
    eprintln!(
        "the waiter was woken {:?} after the release",
        woken - released
    );
    assert!(woken - released < Duration::from_secs(1));
    drop(g);
    // More grants until the Sentinels demote the old primary.
    let mut n = 1;
    while !tokio::task::block_in_place(demoted) {
        assert!(
            started.elapsed() < Duration::from_secs(40),
            "the old primary was never demoted"
        );
        let id = format!("after-{n}");
        n += 1;
        let g = acquire_eventually(&l, &key(&id)).await;
        tokio::task::block_in_place(|| on_new_only(&id));
        drop(g);
    }
    eprintln!("{n} grants while the old primary was back, none from it");
    assert!(
        !back_as_primary || n > 1,
        "no grant while the old primary was back"
    );
    // Made a replica of the new primary, the old one lost the grant.
    assert!(
        !tokio::task::block_in_place(old_keys).contains(&redis_name("sentinel", "gone", "lock"))
    );
}
