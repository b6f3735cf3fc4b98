//! Out-of-range durations never reach Redis as invalid expiries:
//! settings are refused with a clear error, per-call durations are capped.

use crate::support;

use std::time::Duration;

use bytes::Bytes;
use support::RedisServer;
use tower_redis_lock::{
    AcquireOutcome, LeaseKind, LockKey, LockStore, LockStoreExt, OwnerToken, RedisStore,
    RedisStoreBuilder, ReplicaShortfall, redis,
};

const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

fn builder() -> RedisStoreBuilder {
    RedisStore::builder("redis://127.0.0.1:1/")
}

#[test]
fn a_fence_retention_past_what_redis_accepts_is_refused() {
    let err = builder()
        .fence_retention(Duration::MAX)
        .build()
        .unwrap_err();
    assert_eq!(err.setting(), "fence_retention");
    assert!(err.to_string().contains("at most"), "{err}");
    assert!(builder().fence_retention(CENTURY).build().is_ok());
    let over = CENTURY + Duration::from_secs(1);
    assert!(builder().fence_retention(over).build().is_err());
    let under = Duration::from_millis(999);
    assert_eq!(
        builder()
            .fence_retention(under)
            .build()
            .unwrap_err()
            .setting(),
        "fence_retention"
    );
}

#[test]
fn a_command_timeout_past_an_hour_is_refused() {
    let err = builder()
        .command_timeout(Duration::MAX)
        .build()
        .unwrap_err();
    assert_eq!(err.setting(), "command_timeout");
    assert!(
        builder()
            .command_timeout(Duration::from_secs(3600))
            .build()
            .is_ok()
    );
    let err = builder()
        .command_timeout(Duration::from_micros(999))
        .build()
        .unwrap_err();
    assert_eq!(err.setting(), "command_timeout");
}

/// Every setting is checked by `build`, which names the first one wrong;
/// a URL that does not parse is a configuration error too.
#[test]
fn build_names_the_setting_it_refuses() {
    let setting = |b: RedisStoreBuilder| b.build().unwrap_err().setting().to_owned();
    assert_eq!(setting(RedisStore::builder("not a url")), "url");
    assert_eq!(
        RedisStore::from_url("not a url").unwrap_err().setting(),
        "url"
    );
    assert_eq!(setting(builder().prefix("")), "prefix");
    assert_eq!(setting(builder().prefix("a b")), "prefix");
    let wait = |n, ms| {
        setting(
            builder()
                .command_timeout(Duration::from_secs(1))
                .wait_replicas(n, Duration::from_millis(ms), ReplicaShortfall::Fail),
        )
    };
    assert_eq!(wait(0, 100), "wait_replicas");
    assert_eq!(wait(1, 0), "wait_replicas");
    assert_eq!(
        wait(1, 1000),
        "wait_replicas",
        "WAIT must end before the call's timeout"
    );
    assert!(
        builder()
            .command_timeout(Duration::from_secs(1))
            .wait_replicas(1, Duration::from_millis(999), ReplicaShortfall::Fail)
            .build()
            .is_ok()
    );
    let aof = |local, n, ms| {
        setting(builder().command_timeout(Duration::from_secs(1)).wait_aof(
            local,
            n,
            Duration::from_millis(ms),
            ReplicaShortfall::Fail,
        ))
    };
    assert_eq!(aof(false, 0, 100), "wait_aof", "nothing to wait for");
    assert_eq!(aof(true, 0, 0), "wait_aof");
    assert_eq!(aof(true, 1, 1000), "wait_aof");
    for (local, n) in [(true, 0), (false, 1), (true, 1)] {
        assert!(
            builder()
                .command_timeout(Duration::from_secs(1))
                .wait_aof(local, n, Duration::from_millis(999), ReplicaShortfall::Fail)
                .build()
                .is_ok()
        );
    }
    assert_eq!(
        setting(
            builder()
                .wait_replicas(1, Duration::from_millis(10), ReplicaShortfall::Fail)
                .wait_aof(true, 0, Duration::from_millis(10), ReplicaShortfall::Fail)
        ),
        "wait_aof",
        "WAIT and WAITAOF together"
    );
    #[cfg(feature = "cluster")]
    {
        let cluster = || RedisStore::cluster_builder(&["redis://127.0.0.1:1/"]);
        // WAIT and WAITAOF on a cluster store: per lock, on its slot's
        // primary (tests/stores/cluster.rs).
        let ten = Duration::from_millis(10);
        assert!(
            cluster()
                .wait_aof(true, 1, ten, ReplicaShortfall::Fail)
                .build()
                .is_ok()
        );
        assert!(
            cluster()
                .wait_replicas(1, ten, ReplicaShortfall::Fail)
                .build()
                .is_ok()
        );
        let client = redis::Client::open("redis://127.0.0.1:1/").unwrap();
        assert_eq!(setting(cluster().notifications(client)), "notifications");
        // The slot-map refresh: on a cluster only, and never more often
        // than a refresh can take.
        let every = |b: RedisStoreBuilder| b.topology_refresh(Duration::from_millis(999));
        assert_eq!(setting(every(builder())), "topology_refresh");
        assert_eq!(
            setting(every(cluster().command_timeout(Duration::from_secs(1)))),
            "topology_refresh"
        );
        assert!(
            every(cluster().command_timeout(Duration::from_millis(999)))
                .build()
                .is_ok()
        );
        assert!(cluster().build().is_ok());
    }
}

/// The longest fence retention allowed works against a real server: the
/// grant succeeds and the counter carries that expiry.
#[tokio::test]
async fn the_longest_fence_retention_grants() {
    let server = RedisServer::start();
    let store = RedisStore::builder(&server.url())
        .fence_retention(CENTURY)
        .build()
        .unwrap();
    let k = LockKey::new("config", "retention").unwrap();
    let owner = OwnerToken::generate();
    assert!(matches!(
        store
            .acquire(&k, &owner, Duration::from_secs(5))
            .await
            .unwrap(),
        AcquireOutcome::Granted(_)
    ));
    let pttl = server
        .cmd(&["PTTL", &store.fence_key(&k)])
        .as_int()
        .unwrap();
    assert!(
        pttl > (CENTURY - Duration::from_secs(60)).as_millis() as i64,
        "{pttl}"
    );
}

/// A lease or record retention of `Duration::MAX` is capped to an expiry
/// Redis accepts instead of wrapping into an invalid one (every such call
/// answered an error).
#[tokio::test]
async fn unbounded_lease_and_retention_are_capped() {
    let server = RedisServer::start();
    let store = RedisStore::from_url(&server.url()).unwrap();
    let k = LockKey::new("config", "max").unwrap();
    let owner = OwnerToken::generate();
    assert!(matches!(
        store.acquire(&k, &owner, Duration::MAX).await.unwrap(),
        AcquireOutcome::Granted(_)
    ));
    assert!(
        store
            .renew(LeaseKind::Lock, &k, &owner, Duration::MAX)
            .await
            .unwrap()
    );
    assert!(
        store
            .finish(&k, &owner, Bytes::from_static(b"done"), Duration::MAX)
            .await
            .unwrap()
    );
    assert_eq!(
        store.read_record(&k).await.unwrap(),
        Some(Bytes::from_static(b"done"))
    );
    let pttl = server
        .cmd(&["PTTL", &store.record_key(&k)])
        .as_int()
        .unwrap();
    assert!(pttl > 0, "{pttl}");
}

/// The command timeout bounds each call, not the client's own response
/// timeout (500 ms by default): a server that stalls for 800 ms (frozen,
/// then thawed) answers a grant within a 3 s command timeout — over a
/// store made from a URL (its connections have no response timeout of
/// their own) and over a pool handed in (whose connections' timeout the
/// store moves past the command timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_slower_than_the_clients_response_timeout_answers_within_the_command_timeout() {
    let server = RedisServer::start();
    let timeout = Duration::from_secs(3);
    let manager = tower_redis_lock::deadpool_redis::Manager::new(server.url()).unwrap();
    let pool = tower_redis_lock::deadpool_redis::Pool::builder(manager)
        .runtime(tower_redis_lock::deadpool_redis::Runtime::Tokio1)
        .build()
        .unwrap();
    let stores = [
        (
            "url",
            RedisStore::builder(&server.url())
                .command_timeout(timeout)
                .build()
                .unwrap(),
        ),
        (
            "pool",
            RedisStore::pool_builder(pool)
                .command_timeout(timeout)
                .build()
                .unwrap(),
        ),
    ];
    for (source, store) in stores {
        let k = LockKey::new("slow", source).unwrap();
        // Connected first, so that the stall is the grant's alone.
        let warm = OwnerToken::generate();
        assert!(matches!(
            store.acquire(&k, &warm, timeout).await,
            Ok(AcquireOutcome::Granted(_))
        ));
        assert!(store.release(LeaseKind::Lock, &k, &warm).await.unwrap());
        server.freeze();
        let grant = tokio::spawn({
            let (store, k) = (store.clone(), k.clone());
            async move { store.acquire(&k, &OwnerToken::generate(), timeout).await }
        });
        // The stall.
        tokio::time::sleep(Duration::from_millis(800)).await;
        server.thaw();
        let answer = grant.await.unwrap();
        assert!(
            matches!(answer, Ok(AcquireOutcome::Granted(_))),
            "{source}: {answer:?}"
        );
    }
}
