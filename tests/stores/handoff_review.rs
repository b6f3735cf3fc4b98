//! Hostile-review findings on the hand-off of a lock (`LockGuard::export`,
//! `Locker::resume`), written to fail on the code they were found in.
//!
//! * An exported lease resumed twice (a job queue that delivers at least
//!   once redelivers the job while the first worker still runs) gives two
//!   guards that both hold the lock: two holders of one key.
//! * A lease length read back from the wire is not held to the bounds the
//!   locker builder enforces (10 ms ..= 24 h): a damaged or forged job can
//!   resume a lock renewed every few microseconds or one that outlives its
//!   worker by years.

use crate::support;

use support::stores;

use std::time::Duration;

use tower_redis_lock::{Error, ExportedLease, LockKey, LockStore, Locker};

/// Nobody renews an exported lease until it is resumed: long enough that
/// the resume comes within it on a loaded machine.
const LEASE: Duration = Duration::from_millis(1_200);

fn key(id: &str) -> LockKey {
    LockKey::new("handoff-review", id).unwrap()
}

fn locker<S: LockStore>(store: S) -> Locker<S> {
    Locker::builder(store).lease(LEASE).build().unwrap()
}

macro_rules! resumed_twice {
    ($name:ident, $fixture:expr) => {
        /// Two workers resume the same exported lease (the job was
        /// delivered twice). Only one may hold the lock: the second
        /// resume must be `LockLost`, as a lease taken over is.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let (store, _keep) = $fixture;
            let web = locker(store.clone());
            let (first, second) = (locker(store.clone()), locker(store));
            let k = key("twice");
            let lease = web.acquire(&k).await.unwrap().export().unwrap();
            let job = serde_json::to_string(&lease).unwrap();
            let a = first
                .resume(serde_json::from_str(&job).unwrap())
                .await
                .unwrap();
            let b = second.resume(serde_json::from_str(&job).unwrap()).await;
            let both = matches!(&b, Ok(g) if g.is_held()) && a.is_held();
            if let Ok(b) = b {
                drop(b);
            }
            a.release().await.unwrap();
            assert!(
                !both,
                "one exported lease resumed twice: two guards hold {k} at once"
            );
        }
    };
}

resumed_twice!(
    a_lease_resumed_twice_has_one_holder_memory,
    stores::memory()
);
resumed_twice!(a_lease_resumed_twice_has_one_holder_redis, stores::redis());
resumed_twice!(
    a_lease_resumed_twice_has_one_holder_redlock,
    stores::redlock(3)
);
resumed_twice!(
    a_lease_resumed_twice_has_one_holder_cluster,
    stores::cluster()
);
resumed_twice!(
    a_lease_resumed_twice_has_one_holder_boxed,
    stores::boxed(stores::redis())
);

/// A lease length the locker builder would refuse (under 10 ms, over
/// 24 h) is refused when an exported lease is read back too.
#[tokio::test]
async fn an_exported_lease_length_is_held_to_the_builders_bounds() {
    let web = locker(stores::memory().0);
    let lease = web.acquire(&key("bounds")).await.unwrap().export().unwrap();
    let v = serde_json::to_value(&lease).unwrap();
    for bad in [1u64, 9, 24 * 3_600_000 + 1, u64::MAX] {
        let mut w = v.clone();
        w["lease_ms"] = bad.into();
        let read = serde_json::from_value::<ExportedLease>(w);
        assert!(
            read.is_err(),
            "an exported lease of {bad} ms read back: {:?}",
            read.map(|l| l.lease())
        );
    }
    drop(web.resume(lease).await.map_err(|e: Error| e));
}
