//! The operator's view on real servers, beyond the behaviour suite: the
//! holder record's life in Redis (bounded: it goes with the lock), the
//! fence a forced release raises against the old holder's writes, the
//! WARN line naming who forced it, and Redlock's majority view.
use std::time::Duration;

use crate::support;
use support::{RedisServer, Reply, eventually, logs::Logs, stores};

use tower_redis_lock::{
    AcquireOutcome, FenceOutcome, FencedResource, HolderId, LeaseKind, LockKey, LockStore,
    LockStoreExt, Locker, MemoryStore, OperatorStore, OwnerToken, RedisStore,
};

fn key(id: &str) -> LockKey {
    LockKey::new("ops", id).unwrap()
}

fn int(r: Reply) -> i64 {
    match r {
        Reply::Int(n) => n,
        other => panic!("not an integer: {other:?}"),
    }
}

/// The holder record lives exactly as long as the lock: it is the lock's
/// value (after the owner token), so it is written with the grant,
/// renewed with it, gone with the release, the finish or the lease's end,
/// and never kept in a name of its own. Redis memory stays bounded by the
/// locks held.
#[tokio::test]
async fn the_holder_record_lives_and_dies_with_the_lock() {
    let server = RedisServer::start();
    let store = RedisStore::from_url(&server.url()).unwrap();
    let lock = stores::redis_name("ops", "life", "lock");
    let owner = OwnerToken::generate();
    let k = key("life");
    let granted = store
        .acquire(&k, &owner, Duration::from_secs(20))
        .await
        .unwrap();
    let AcquireOutcome::Granted(token) = granted else {
        panic!("not granted: {granted:?}");
    };
    let ttl = |name: &str| int(server.cmd(&["PTTL", name]));
    let value = || server.cmd(&["GET", &lock]).as_string().unwrap();
    assert!(
        value().starts_with(&format!("{} {token} ", owner.as_str())),
        "{}",
        value()
    );
    assert_eq!(
        server.keys(),
        [stores::redis_name("ops", "life", "fence"), lock.clone()],
        "a name of its own"
    );
    assert!(ttl(&lock) > 15_000, "{}", ttl(&lock));
    assert!(
        store
            .renew(LeaseKind::Lock, &k, &owner, Duration::from_secs(60))
            .await
            .unwrap()
    );
    assert!(ttl(&lock) > 40_000, "renewed with the lock: {}", ttl(&lock));
    assert_eq!(
        store.inspect(&k).await.unwrap().unwrap().fencing_token,
        Some(token),
        "the record after a renewal"
    );
    assert!(store.release(LeaseKind::Lock, &k, &owner).await.unwrap());
    assert_eq!(store.inspect(&k).await.unwrap(), None, "after the release");

    // Finished (a record stored): the holder record goes with the lock.
    store
        .acquire(&k, &owner, Duration::from_secs(20))
        .await
        .unwrap();
    assert!(
        store
            .finish(
                &k,
                &owner,
                bytes::Bytes::from_static(b"done"),
                Duration::from_secs(60)
            )
            .await
            .unwrap()
    );
    assert_eq!(int(server.cmd(&["EXISTS", &lock])), 0, "after the finish");

    // Left to expire: it goes at the lease's end.
    let short = key("short");
    store
        .acquire(&short, &owner, Duration::from_millis(200))
        .await
        .unwrap();
    assert!(store.inspect(&short).await.unwrap().is_some());
    assert!(
        eventually(Duration::from_secs(5), async || store
            .inspect(&short)
            .await
            .unwrap()
            .is_none())
        .await,
        "the holder record outlived its lock"
    );
    assert!(
        server.keys().iter().all(|n| !n.ends_with(":holder")),
        "{:?}",
        server.keys()
    );
}

/// The holder id is a one-way derivation of the owner token, the same on
/// every store, and not a part of the token.
#[tokio::test]
async fn the_holder_id_is_derived_from_the_owner_token_and_is_not_it() {
    let (store, _server) = stores::redis();
    let owner = OwnerToken::generate();
    let k = key("id");
    store
        .acquire(&k, &owner, Duration::from_secs(10))
        .await
        .unwrap();
    let seen = store.inspect(&k).await.unwrap().unwrap();
    assert_eq!(seen.holder, HolderId::of(&owner));
    assert!(!owner.as_str().contains(seen.holder.as_str()));
    let memory = MemoryStore::new();
    memory
        .acquire(&k, &owner, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(
        memory.inspect(&k).await.unwrap().unwrap().holder,
        seen.holder
    );
}

/// After a forced release, the fence it answers, written to a fenced
/// resource, refuses the old holder's writes at once (before any new
/// holder wrote); and a new holder's token is above it.
#[tokio::test]
async fn a_forced_release_fences_the_old_holder_out() {
    let server = RedisServer::start();
    let l = Locker::new(RedisStore::from_url(&server.url()).unwrap());
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let res = FencedResource::new("balance:{acc_9}");
    let k = key("fenced");

    let old = l.acquire(&k).await.unwrap();
    let old_token = old.fencing_token().unwrap();
    assert_eq!(
        res.set(&mut conn, old_token, "100").await.unwrap(),
        FenceOutcome::Applied
    );

    let forced = l.force_release(&k, "test: stuck holder").await.unwrap();
    let fence = forced.fence.expect("fenced");
    assert!(res.raise(&mut conn, fence).await.unwrap() >= fence);
    assert_eq!(
        res.set(&mut conn, old_token, "101").await.unwrap(),
        FenceOutcome::Stale { seen: fence },
        "the old holder's write after the forced release"
    );
    let new = l.acquire(&k).await.unwrap();
    let new_token = new.fencing_token().unwrap();
    assert!(new_token > fence);
    assert_eq!(
        res.set(&mut conn, new_token, "200").await.unwrap(),
        FenceOutcome::Applied
    );
    assert_eq!(res.get(&mut conn).await.unwrap().unwrap().0, b"200");
    assert!(
        old.extend().await.is_err(),
        "the old holder learns at its next renewal"
    );
}

/// A forced release is logged at WARN with who asked, the key and
/// whether a lock was there.
#[tokio::test]
async fn a_forced_release_is_logged_with_who_asked() {
    let (logs, _guard) = Logs::capture();
    let l = Locker::new(MemoryStore::new());
    let k = key("logged");
    let _held = l.acquire(&k).await.unwrap();
    l.force_release(&k, "alice: INC-42").await.unwrap();
    let lines = logs.lines_with("released by force");
    assert_eq!(lines.len(), 1, "{}", logs.text());
    let line = &lines[0];
    assert!(line.contains("WARN"), "{line}");
    assert!(line.contains("alice: INC-42"), "{line}");
    assert!(line.contains("ops:logged"), "{line}");
    assert!(line.contains("released=true"), "{line}");
}

/// Redlock reports what a majority of its nodes shows: a lock written on a
/// minority is nobody's; on a quorum, its holder.
#[tokio::test]
async fn redlock_inspect_reports_the_majority_view() {
    let (store, _servers) = stores::redlock(3);
    let k = key("majority");
    let owner = OwnerToken::generate();
    let lease = Duration::from_secs(10);
    let node = &store.nodes()[0];
    node.acquire(&k, &owner, lease).await.unwrap();
    assert_eq!(store.inspect(&k).await.unwrap(), None, "one node of three");
    store.nodes()[1].acquire(&k, &owner, lease).await.unwrap();
    let seen = store
        .inspect(&k)
        .await
        .unwrap()
        .expect("two nodes of three");
    assert_eq!(seen.holder, HolderId::of(&owner));
    // Listed from the first node, inspected on all.
    let page = store
        .list("ops", &tower_redis_lock::ListCursor::start(), 100)
        .await
        .unwrap();
    assert_eq!(
        page.locks.iter().map(|h| h.holder).collect::<Vec<_>>(),
        [seen.holder]
    );
}

/// A bucket counter ahead of the clock (a primary whose clock runs behind
/// the one before a failover): the old holder's token is the counter, and
/// the fence must still be above it, not equal (a fenced resource accepts
/// an equal token).
#[tokio::test]
async fn a_forced_release_fences_out_a_holder_whose_token_is_ahead_of_the_clock() {
    let server = RedisServer::start();
    let l = Locker::new(RedisStore::from_url(&server.url()).unwrap());
    let ahead = "9000000000000000";
    server.cmd(&[
        "SET",
        &stores::redis_name("ops", "ahead", "fence"),
        ahead,
        "PX",
        "600000",
    ]);
    let k = key("ahead");
    let old = l.acquire(&k).await.unwrap();
    let old_token = old.fencing_token().unwrap();
    assert!(old_token.get() > 9_000_000_000_000_000);
    let fence = l.force_release(&k, "test").await.unwrap().fence.unwrap();
    assert!(fence > old_token, "{fence} is not above {old_token}");
    let next = l.acquire(&k).await.unwrap();
    assert!(next.fencing_token().unwrap() > fence);
}

/// Redlock: one node's counter ahead of the others. The forced release's
/// fence is raised on every node, so that the next grant (the
/// quorum-th largest of the nodes' tokens when all grant) is above it.
#[tokio::test]
async fn redlock_a_forced_release_raises_the_fence_on_every_node() {
    let (store, servers) = stores::redlock(3);
    let l = Locker::new(store);
    let k = key("redlock-fence");
    let old = l.acquire(&k).await.unwrap();
    let ahead = old.fencing_token().unwrap().get() + 1_000_000_000_000;
    servers[0].cmd(&[
        "SET",
        &stores::redis_name("ops", "redlock-fence", "fence"),
        &ahead.to_string(),
        "PX",
        "600000",
    ]);
    let fence = l
        .force_release(&k, "test")
        .await
        .unwrap()
        .fence
        .expect("every node answered");
    assert!(fence.get() > ahead);
    let next = l.acquire(&k).await.unwrap();
    assert!(
        next.fencing_token().unwrap() > fence,
        "{} after {fence}",
        next.fencing_token().unwrap()
    );
}
