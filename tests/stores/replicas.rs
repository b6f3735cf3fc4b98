//! Grants confirmed by replicas (`WAIT`) or by append-only files
//! (`WAITAOF`) on a primary with a replica, both real processes; `WAITAOF`
//! against Valkey (Redis 7.0 has no such command). Sentinel's are in
//! `tests/stores/sentinel.rs`, a Cluster's in `tests/stores/cluster.rs`.
//!
//! The waits are long (2 s): a confirmation answers as soon as it comes,
//! and a loaded machine has been seen to take over 100 ms (`WAIT`) and
//! 500 ms (`WAITAOF` with `appendfsync always`) to confirm.

use crate::support;

use std::time::Duration;

use support::RedisServer;
use support::stores::redis_name;
use tower_redis_lock::{Error, LockKey, LockStoreExt, Locker, RedisStore, ReplicaShortfall};

fn key(id: &str) -> LockKey {
    LockKey::new("replicas", id).unwrap()
}

/// A primary started by `start(extra)` and one replica of it, linked.
fn primary_and_replica(
    start: impl Fn(&[&str]) -> RedisServer,
    extra: &[&str],
) -> (RedisServer, RedisServer) {
    let primary = start(extra);
    let port = primary.port().to_string();
    let replica = start(&[extra, &["--replicaof", "127.0.0.1", &port]].concat());
    assert!(
        support::wait_until(Duration::from_secs(10), || {
            let info = replica.cmd(&["INFO", "replication"]);
            info.as_string()
                .unwrap_or_default()
                .contains("master_link_status:up")
        }),
        "the replica never linked"
    );
    (primary, replica)
}

fn locker(
    primary: &RedisServer,
    with: impl FnOnce(tower_redis_lock::RedisStoreBuilder) -> tower_redis_lock::RedisStoreBuilder,
) -> Locker<RedisStore> {
    let b = RedisStore::builder(&primary.url()).command_timeout(Duration::from_secs(4));
    Locker::new(with(b).build().unwrap())
}

/// `l`'s grant of `id` refused as unconfirmed (`Unavailable` naming
/// `what`), and taken back from `primary`.
async fn refused(l: &Locker<RedisStore>, primary: &RedisServer, id: &str, what: &str) {
    match l.try_acquire(&key(id)).await {
        Err(Error::Unavailable { source, .. }) => {
            assert!(source.to_string().contains(what), "{source}")
        }
        other => panic!("{other:?}"),
    }
    let name = redis_name("replicas", id, "lock");
    assert!(!primary.keys().contains(&name), "{:?}", primary.keys());
}

/// One primary with a replica (no Sentinel): `WAIT` confirms a grant the
/// replica has, and refuses (and takes back) one it does not get.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_with_a_replica_confirms_grants_and_refuses_unconfirmed_ones() {
    let (primary, replica) = primary_and_replica(RedisServer::start_with, &[]);
    let l = locker(&primary, |b| {
        b.wait_replicas(1, Duration::from_secs(2), ReplicaShortfall::Fail)
    });
    let g = l.try_acquire(&key("confirmed")).await.unwrap();
    assert!(
        replica
            .keys()
            .contains(&redis_name("replicas", "confirmed", "lock"))
    );
    assert_eq!(primary.command_calls("wait"), 1);
    drop(g);
    replica.freeze();
    refused(&l, &primary, "unconfirmed", "replicas acknowledged").await;
    replica.thaw();
}

/// A semaphore's permit goes through the same confirmation: a grant the
/// replica has is answered; one the frozen replica does not get is
/// refused (`Unavailable`) and its permit removed, owner-checked: the
/// permit held beside it stays, and the refused one is not counted. With
/// `ReplicaShortfall::Proceed` an unconfirmed permit is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_is_confirmed_by_the_replica_and_one_it_misses_is_removed() {
    let (primary, replica) = primary_and_replica(RedisServer::start_with, &[]);
    let l = locker(&primary, |b| {
        b.wait_replicas(1, Duration::from_secs(2), ReplicaShortfall::Fail)
    });
    let sem = l.semaphore(&key("permits"), 2).unwrap();
    let permits = redis_name("replicas", "permits", "permits");
    let held = sem.try_acquire().await.unwrap();
    assert_eq!(replica.cmd(&["ZCARD", &permits]).as_int(), Some(1));
    assert_eq!(primary.command_calls("wait"), 1);
    replica.freeze();
    match sem.try_acquire().await {
        Err(Error::Unavailable { source, .. }) => {
            assert!(
                source.to_string().contains("replicas acknowledged"),
                "{source}"
            )
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(primary.command_calls("wait"), 2);
    // Only the held permit is left: the refused one was removed.
    assert_eq!(primary.cmd(&["ZCARD", &permits]).as_int(), Some(1));
    // With `ReplicaShortfall::Proceed` the unconfirmed permit is kept, and
    // counts: the semaphore is full.
    let proceeding = locker(&primary, |b| {
        b.wait_replicas(1, Duration::from_millis(200), ReplicaShortfall::Proceed)
    });
    let kept = proceeding.semaphore(&key("permits"), 2).unwrap();
    let kept = kept.try_acquire().await.unwrap();
    assert_eq!(primary.cmd(&["ZCARD", &permits]).as_int(), Some(2));
    replica.thaw();
    let other = locker(&primary, |b| b);
    let second = other.semaphore(&key("permits"), 2).unwrap();
    assert!(second.try_acquire().await.unwrap_err().is_contended());
    assert!(kept.release().await.unwrap());
    let g = second.try_acquire().await.unwrap();
    assert!(g.release().await.unwrap());
    assert!(held.release().await.unwrap());
}

/// `WAITAOF` on Valkey: a grant is confirmed once it is in the primary's
/// append-only file and the replica's; with the replica frozen it is
/// refused and taken back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waitaof_confirms_a_grant_on_disk_and_refuses_one_the_replica_did_not_write() {
    // `appendfsync always`: with `everysec` a file is synced (and the
    // grant confirmed) up to a second later, past this test's timeout.
    let (primary, replica) = primary_and_replica(
        RedisServer::start_valkey,
        &["--appendonly", "yes", "--appendfsync", "always"],
    );
    let l = locker(&primary, |b| {
        b.wait_aof(true, 1, Duration::from_secs(2), ReplicaShortfall::Fail)
    });
    let g = l.try_acquire(&key("on-disk")).await.unwrap();
    assert_eq!(primary.command_calls("waitaof"), 1);
    assert!(
        replica
            .keys()
            .contains(&redis_name("replicas", "on-disk", "lock"))
    );
    drop(g);
    replica.freeze();
    refused(&l, &primary, "aof", "the AOF of 0 of 1 replicas").await;
    replica.thaw();
}

/// `WAITAOF` for the primary's own file where `appendonly` is off: the
/// first grant is a configuration error (and taken back), not a grant
/// confirmed by nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waitaof_without_appendonly_is_a_config_error() {
    let primary = RedisServer::start_valkey(&[]);
    let l = locker(&primary, |b| {
        b.wait_aof(true, 0, Duration::from_millis(300), ReplicaShortfall::Fail)
    });
    match l.try_acquire(&key("no-aof")).await {
        Err(Error::Config(e)) => assert_eq!(e.setting(), "wait_aof", "{e}"),
        other => panic!("{other:?}"),
    }
    let lock = redis_name("replicas", "no-aof", "lock");
    assert!(!primary.keys().contains(&lock), "{:?}", primary.keys());
}

/// `WAITAOF` on a server without it (Redis before 7.2, as `redis-server`
/// here is): the first grant is a configuration error naming the command,
/// and taken back. On a server that has it, the grant is confirmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waitaof_on_a_server_without_it_is_a_config_error() {
    let primary = RedisServer::start_with(&["--appendonly", "yes"]);
    let has_waitaof = primary
        .cmd(&["COMMAND", "INFO", "WAITAOF"])
        .as_array()
        .is_some_and(|a| a.first().is_some_and(|c| c.as_array().is_some()));
    let l = locker(&primary, |b| {
        b.wait_aof(true, 0, Duration::from_millis(300), ReplicaShortfall::Fail)
    });
    let got = l.try_acquire(&key("old-server")).await;
    if has_waitaof {
        assert!(got.is_ok(), "{got:?}");
        return;
    }
    match got {
        Err(Error::Config(e)) => {
            assert_eq!(e.setting(), "wait_aof");
            assert!(e.to_string().contains("no WAITAOF"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    let lock = redis_name("replicas", "old-server", "lock");
    assert!(!primary.keys().contains(&lock), "{:?}", primary.keys());
}

/// More permit grants at once than there are `WAIT` connections (16), on a
/// primary with no replica and `ReplicaShortfall::Fail`: every grant is
/// unconfirmed, so every acquire fails and every permit is taken back, the
/// ones that queued for a connection too. (A grant that waited for a
/// connection used up part of its bound there, and was cut mid-`WAIT`:
/// its permit stood for its whole lease, and its error named a timeout,
/// not the replicas.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permit_grants_queued_for_a_wait_connection_are_taken_back_too() {
    use std::sync::Arc;
    use tower_redis_lock::OwnerToken;
    let primary = RedisServer::start_with(&[]);
    let store = Arc::new(
        RedisStore::builder(&primary.url())
            .command_timeout(Duration::from_millis(500))
            .wait_replicas(1, Duration::from_millis(400), ReplicaShortfall::Fail)
            .build()
            .unwrap(),
    );
    let k = key("queued");
    let grants = (0..40).map(|_| {
        let (store, k) = (store.clone(), k.clone());
        tokio::spawn(async move {
            let owner = OwnerToken::generate();
            store
                .acquire_permit(&k, &owner, 100, Duration::from_secs(30))
                .await
        })
    });
    let answers = futures_util::future::join_all(grants).await;
    let permits = redis_name("replicas", "queued", "permits");
    let left = primary.cmd(&["ZCARD", &permits]).as_int();
    let mut why = Vec::new();
    for a in answers {
        match a.unwrap() {
            Err(Error::Unavailable { source, .. }) => why.push(source.to_string()),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(left, Some(0), "unconfirmed permits left standing: {why:?}");
    assert!(
        why.iter().all(|w| w.contains("replicas")),
        "an operator is not told why: {why:?}"
    );
}

/// A permit acquire dropped while its grant waits for a replica that does
/// not answer: the permit written is released in the background at once
/// (owner-checked), not left until its wait ends or its lease does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_acquire_dropped_mid_wait_is_released_at_once() {
    let (primary, replica) = primary_and_replica(RedisServer::start_with, &[]);
    let l = locker(&primary, |b| {
        b.wait_replicas(1, Duration::from_secs(3), ReplicaShortfall::Fail)
    });
    let sem = l.semaphore(&key("dropped"), 2).unwrap();
    let permits = redis_name("replicas", "dropped", "permits");
    replica.freeze();
    let acquire = tokio::spawn(async move { sem.try_acquire().await.map(|_| ()) });
    assert!(
        support::wait_until(Duration::from_secs(2), || {
            primary.cmd(&["ZCARD", &permits]).as_int() == Some(1)
        }),
        "the permit was never written"
    );
    let dropped_at = std::time::Instant::now();
    acquire.abort();
    assert!(
        support::wait_until(Duration::from_secs(2), || {
            primary.cmd(&["ZCARD", &permits]).as_int() == Some(0)
        }),
        "the dropped acquire's permit was left standing"
    );
    // Well before its 3 s wait would have ended (and taken it back).
    assert!(dropped_at.elapsed() < Duration::from_secs(2));
    replica.thaw();
}

/// `ReplicaShortfall::Proceed` while no replica confirms: the shortfall is
/// logged as a transition (once, with why), each further grant at DEBUG,
/// not a WARN line per grant (a flood under load; DESIGN: an outage is
/// logged as a transition).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proceeding_unconfirmed_grants_are_logged_once_not_per_grant() {
    let logs = support::logs::Logs::global();
    let primary = RedisServer::start_with(&[]);
    let l = locker(&primary, |b| {
        b.wait_replicas(1, Duration::from_millis(50), ReplicaShortfall::Proceed)
    });
    for n in 0..10 {
        let k = LockKey::new("proceed-flood", format!("k{n}")).unwrap();
        let permits = l.semaphore(&k, 2).unwrap();
        drop(permits.try_acquire().await.unwrap());
    }
    let lines = logs.lines_with("proceed-flood");
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(lines[0].contains("replicas"), "{lines:#?}");
}
