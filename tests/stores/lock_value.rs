//! The lock's value with fencing on Redis: the owner token, a space and the
//! holder record (`<token> <granted µs> <label>`), in one key. Every owner
//! check takes the owner alone (a lock without fencing) or the owner and a
//! space, nothing else; a fenced cycle costs the commands it should, and an
//! attempt that does not grant leaves the bucket's counter where it was or
//! above.
use std::time::Duration;

use bytes::Bytes;

use crate::support;
use support::{RedisServer, stores};

use tower_redis_lock::{
    AcquireAllOutcome, AcquireOutcome, Ask, FencingToken, Grant, HolderId, HolderLabel, LeaseKind,
    LockKey, LockStore, LockStoreExt, OperatorStore, OwnerToken, RedisStore,
};

const NS: &str = "value";
const LEASE: Duration = Duration::from_secs(20);

fn key(id: &str) -> LockKey {
    LockKey::new(NS, id).unwrap()
}

fn name(id: &str, suffix: &str) -> String {
    stores::redis_name(NS, id, suffix)
}

fn get(server: &RedisServer, name: &str) -> Option<String> {
    server.cmd(&["GET", name]).as_string()
}

fn pttl(server: &RedisServer, name: &str) -> i64 {
    server.cmd(&["PTTL", name]).as_int().unwrap()
}

fn granted(outcome: AcquireOutcome) -> FencingToken {
    match outcome {
        AcquireOutcome::Granted(t) => t,
        other => panic!("not granted: {other:?}"),
    }
}

/// A fenced grant writes the lock's value as the owner, a space, the
/// token, the grant's server time and the label (spaces and all), and no
/// other name beside the counter; `inspect` reads it back.
#[tokio::test]
async fn the_value_carries_the_holder_record_and_inspect_reads_it() {
    let (store, server) = stores::redis();
    let owner = OwnerToken::generate();
    let label = HolderLabel::new("web 7 pid 42 (blue)").unwrap();
    let k = key("record");
    let before = std::time::SystemTime::now();
    let token = granted(
        store
            .grant(Grant::new(&k, &owner, LEASE, Ask::Lock { replay: false }).label(Some(&label)))
            .await
            .unwrap(),
    );
    let value = get(&server, &name("record", "lock")).unwrap();
    let (head, record) = value.split_at(OwnerToken::LEN);
    assert_eq!(head, owner.as_str());
    let mut parts = record.splitn(4, ' ');
    assert_eq!(parts.next(), Some(""), "{value}");
    assert_eq!(parts.next(), Some(token.to_string().as_str()), "{value}");
    let granted_us: u64 = parts.next().unwrap().parse().unwrap();
    assert!(granted_us <= token.get(), "{value}");
    assert_eq!(parts.next(), Some(label.as_str()), "{value}");
    assert_eq!(
        server.keys(),
        [name("record", "fence"), name("record", "lock")],
        "a name beside the lock and the counter"
    );
    let seen = store.inspect(&k).await.unwrap().unwrap();
    assert_eq!(seen.holder, HolderId::of(&owner));
    assert_eq!(seen.label.as_ref(), Some(&label));
    assert_eq!(seen.fencing_token, Some(token));
    let at = seen.granted_at.unwrap();
    let drift = Duration::from_secs(5);
    assert!(at + drift >= before && at <= std::time::SystemTime::now() + drift);
    assert!(seen.remaining.unwrap() <= LEASE);
    // Without a label: the record still reads back, without one.
    let other = OwnerToken::generate();
    let k2 = key("unlabelled");
    let t2 = granted(store.acquire(&k2, &other, LEASE).await.unwrap());
    let seen = store.inspect(&k2).await.unwrap().unwrap();
    assert_eq!((seen.fencing_token, seen.label), (Some(t2), None));
}

/// Values that only look like the owner's are not: another owner's token
/// (exactly 32 characters, or with a record), the owner's token followed by anything but a
/// space, a value cut inside the token, its first 31 characters with a
/// space. Each refuses release, renewal, hand-over, finish, the multi-key
/// release and a re-entry, and is left as it was; the owner's own value,
/// with a record or without one (a lock without fencing), is its.
#[tokio::test]
async fn only_the_owner_alone_or_the_owner_and_a_space_is_the_owners() {
    let (store, server) = stores::redis();
    let owner = OwnerToken::generate();
    let lock = name("trick", "lock");
    let k = key("trick");
    let next = OwnerToken::generate();
    let tricks = [
        OwnerToken::generate().as_str().to_owned(),
        format!("{} 5 6 web", OwnerToken::generate().as_str()),
        format!("{}x", owner.as_str()),
        format!("{}0 5 6 web", owner.as_str()),
        format!("{}\t5 6 web", owner.as_str()),
        owner.as_str()[..31].to_owned(),
        format!("{} 5 6 web", &owner.as_str()[..31]),
    ];
    for v in &tricks {
        server.cmd(&["SET", &lock, v, "PX", "20000"]);
        assert!(
            !store.release(LeaseKind::Lock, &k, &owner).await.unwrap(),
            "{v:?}"
        );
        assert!(
            !store
                .renew(LeaseKind::Lock, &k, &owner, LEASE)
                .await
                .unwrap(),
            "{v:?}"
        );
        assert!(
            !store.transfer(&k, &owner, &next, LEASE).await.unwrap(),
            "{v:?}"
        );
        let record = Bytes::from_static(b"done");
        assert!(
            !store.finish(&k, &owner, record, LEASE).await.unwrap(),
            "{v:?}"
        );
        assert_eq!(
            store
                .release_all(std::slice::from_ref(&k), &owner)
                .await
                .unwrap(),
            [false],
            "{v:?}"
        );
        assert!(
            matches!(
                store.acquire(&k, &owner, LEASE).await.unwrap(),
                AcquireOutcome::Held { .. }
            ),
            "{v:?}"
        );
        assert_eq!(get(&server, &lock).as_deref(), Some(v.as_str()));
        assert!(pttl(&server, &lock) <= 20_000, "{v:?}: renewed");
    }
    // The owner's own: with a record, then alone (a lock without fencing).
    for v in [
        format!("{} 5 6 web 7", owner.as_str()),
        owner.as_str().to_owned(),
    ] {
        server.cmd(&["SET", &lock, &v, "PX", "20000"]);
        assert!(
            store
                .renew(LeaseKind::Lock, &k, &owner, Duration::from_secs(60))
                .await
                .unwrap()
        );
        assert!(pttl(&server, &lock) > 40_000, "{v:?}: not renewed");
        assert!(
            store.release(LeaseKind::Lock, &k, &owner).await.unwrap(),
            "{v:?}"
        );
        assert_eq!(get(&server, &lock), None);
    }
}

/// A hand-over keeps the holder record (the hold is the same grant) under
/// the new owner; the old owner is refused from then on.
#[tokio::test]
async fn a_hand_over_keeps_the_record_under_the_new_owner() {
    let (store, server) = stores::redis();
    let (from, to) = (OwnerToken::generate(), OwnerToken::generate());
    let k = key("handover");
    let token = granted(store.acquire(&k, &from, LEASE).await.unwrap());
    let before = get(&server, &name("handover", "lock")).unwrap();
    assert!(store.transfer(&k, &from, &to, LEASE).await.unwrap());
    let after = get(&server, &name("handover", "lock")).unwrap();
    assert_eq!(
        after,
        format!("{}{}", to.as_str(), &before[OwnerToken::LEN..])
    );
    let seen = store.inspect(&k).await.unwrap().unwrap();
    assert_eq!(
        (seen.holder, seen.fencing_token),
        (HolderId::of(&to), Some(token))
    );
    assert!(!store.release(LeaseKind::Lock, &k, &from).await.unwrap());
    assert!(store.release(LeaseKind::Lock, &k, &to).await.unwrap());
}

/// The counter is written before the grant is known: an attempt that
/// finds the lock held leaves it at least where it was (put back where it
/// is ahead of the clock), and a re-entry leaves it exactly as it was, so
/// that a second re-entry still answers the grant's token.
#[tokio::test]
async fn attempts_that_do_not_grant_never_lower_the_counter() {
    let (store, server) = stores::redis();
    let (a, b) = (OwnerToken::generate(), OwnerToken::generate());
    let k = key("counter");
    let fence = name("counter", "fence");
    let first = granted(store.acquire(&k, &a, LEASE).await.unwrap());
    for _ in 0..2 {
        assert_eq!(granted(store.acquire(&k, &a, LEASE).await.unwrap()), first);
        assert_eq!(get(&server, &fence), Some(first.to_string()));
    }
    let ahead = "9000000000000000";
    server.cmd(&["SET", &fence, ahead, "PX", "600000"]);
    assert!(matches!(
        store.acquire(&k, &b, LEASE).await.unwrap(),
        AcquireOutcome::Held { remaining: Some(r) } if r <= LEASE && r > LEASE / 2
    ));
    assert_eq!(get(&server, &fence).as_deref(), Some(ahead), "lowered");
    assert!(store.release(LeaseKind::Lock, &k, &a).await.unwrap());
    assert_eq!(
        granted(store.acquire(&k, &b, LEASE).await.unwrap()).get(),
        9_000_000_000_000_001
    );
}

/// A re-entry answers at least the token of the grant it enters, even
/// where the counter lapsed while the lock was held (a retention shorter
/// than the hold, an eviction) and that token was minted ahead of the
/// clock (a counter raised by a Redlock write-back): the value carries
/// the token, and the counter is put back to it, so that the next grant
/// of the bucket is above it too. (With the counter's answer alone the
/// re-entry answered a fresh token, the server's time, far below, and
/// the next holder's token fell below the first's.)
#[tokio::test]
async fn a_reentry_after_the_counter_lapsed_keeps_its_grants_token() {
    let (store, server) = stores::redis();
    reentry_after_the_counter_lapsed(&store, &server, "lapsed").await;
}

/// The same on a Cluster: the re-entry answers its grant's token and puts
/// the lapsed counter back to it, so that the next grant is above it.
/// (Without the put-back there, the next grant fell to the server's time,
/// below the token the re-entry had just answered.)
#[tokio::test]
async fn a_reentry_on_a_cluster_after_the_counter_lapsed_keeps_its_grants_token() {
    let (store, cluster) = stores::cluster();
    let fence = store.fence_key(&key("lapsed-cluster"));
    let node = &cluster.nodes[cluster.node_for_slot(cluster.slot_of(&fence))];
    reentry_after_the_counter_lapsed(&store, node, "lapsed-cluster").await;
}

/// `id`'s lock granted from a counter far ahead of the clock, its counter
/// deleted (on `server`, the node that has it), re-entered by its owner,
/// released, and granted to another owner: the re-entry answers the
/// grant's token, the next grant one above it.
async fn reentry_after_the_counter_lapsed(store: &RedisStore, server: &RedisServer, id: &str) {
    let (a, b) = (OwnerToken::generate(), OwnerToken::generate());
    let k = key(id);
    let fence = store.fence_key(&k);
    server.cmd(&["SET", &fence, "9000000000000000"]);
    let first = granted(store.acquire(&k, &a, LEASE).await.unwrap());
    assert_eq!(first.get(), 9_000_000_000_000_001);
    server.cmd(&["DEL", &fence]);
    let again = match store.acquire(&k, &a, LEASE).await.unwrap() {
        AcquireOutcome::Granted(t) => t,
        other => panic!("the re-entry was not granted: {other:?}"),
    };
    assert_eq!(again, first, "the re-entry's token");
    assert!(store.release(LeaseKind::Lock, &k, &a).await.unwrap());
    let next = granted(store.acquire(&k, &b, LEASE).await.unwrap());
    assert!(
        next > first,
        "the next holder's token {next:?} is not above {first:?}"
    );
}

/// The same for a multi-key grant that finds a lock ours already (one
/// script for every key): the fresh token is above the one the lock had.
#[tokio::test]
async fn a_multi_key_grant_after_the_counter_lapsed_mints_above_the_lock_it_holds() {
    let (store, server) = stores::redis();
    let owner = OwnerToken::generate();
    let (k, other) = (key("lapsed-all"), key("lapsed-other"));
    let fence = store.fence_key(&k);
    server.cmd(&["SET", &fence, "9000000000000000"]);
    let first = granted(store.acquire(&k, &owner, LEASE).await.unwrap());
    server.cmd(&["DEL", &fence]);
    match store
        .grant_all(&[k.clone(), other.clone()], &owner, LEASE, None)
        .await
        .unwrap()
    {
        AcquireAllOutcome::Granted(tokens) => {
            let again = tokens[0].expect("fenced");
            assert!(
                again > first,
                "the fresh token {again:?} is not above {first:?}"
            );
        }
        held => panic!("not granted: {held:?}"),
    }
}

/// What a fenced cycle costs on one primary: the grant's `EVALSHA` and its
/// `TIME`, `SET` of the counter and `SET` of the lock, the release's
/// `EVALSHA`, `GET` and `DEL`; a renewal is `EVALSHA`, `GET` and `PEXPIRE`.
/// No holder record of its own to write, renew or delete.
#[tokio::test]
async fn a_fenced_cycle_costs_seven_commands_and_a_renewal_three() {
    let server = RedisServer::start();
    let store = RedisStore::from_url(&server.url()).unwrap();
    let owner = OwnerToken::generate();
    let k = key("cost");
    // Warm: connection and script loads.
    store.acquire(&k, &owner, LEASE).await.unwrap();
    assert!(store.release(LeaseKind::Lock, &k, &owner).await.unwrap());
    let ran = || {
        let mut stats = server.command_stats();
        stats.retain(|name, _| !name.starts_with("config") && !name.starts_with("info"));
        stats.into_iter().collect::<Vec<_>>()
    };
    server.reset_stats();
    store.acquire(&k, &owner, LEASE).await.unwrap();
    assert!(store.release(LeaseKind::Lock, &k, &owner).await.unwrap());
    let cycle: Vec<(String, u64)> = [
        ("del", 1),
        ("evalsha", 2),
        ("get", 1),
        ("set", 2),
        ("time", 1),
    ]
    .map(|(n, c)| (n.to_owned(), c))
    .into();
    assert_eq!(ran(), cycle, "a fenced acquire and release");
    store.acquire(&k, &owner, LEASE).await.unwrap();
    server.reset_stats();
    assert!(
        store
            .renew(LeaseKind::Lock, &k, &owner, LEASE)
            .await
            .unwrap()
    );
    let renewal: Vec<(String, u64)> = [("evalsha", 1), ("get", 1), ("pexpire", 1)]
        .map(|(n, c)| (n.to_owned(), c))
        .into();
    assert_eq!(ran(), renewal, "a renewal");
}

/// A grant that fails (the lock's name holds another type) leaves the
/// bucket's counter as it was: the script had already written the server's
/// clock into it, and Redis does not undo a failed script's writes, so a
/// counter ahead of the clock (after a Redlock write-back, a failover to a
/// node whose clock is behind) would have fallen, and the next grant's
/// token with it.
#[tokio::test]
async fn a_grant_that_fails_leaves_the_counter_as_it_was() {
    let (store, server) = stores::redis();
    let owner = OwnerToken::generate();
    let k = key("wrong-type");
    let (lock, fence) = (name("wrong-type", "lock"), store.fence_key(&k));
    server.cmd(&["SET", &fence, "9000000000000000"]);
    server.cmd(&["HSET", &lock, "f", "v"]);
    assert!(store.acquire(&k, &owner, LEASE).await.is_err());
    assert_eq!(get(&server, &fence).as_deref(), Some("9000000000000000"));
    server.cmd(&["DEL", &lock]);
    match store.acquire(&k, &owner, LEASE).await.unwrap() {
        AcquireOutcome::Granted(t) => assert!(t.get() > 9_000_000_000_000_000, "{t:?}"),
        other => panic!("{other:?}"),
    }
}
