//! The conformance matrix: every promise × every lease kind × every store
//! that keeps the kind, generated.
//!
//! A promise is written once, as a function of a store and a [`Kind`];
//! `matrix!(store, fixture, [kinds])` makes a module per store with a
//! module per kind it keeps and a test per promise in each
//! (`conformance::matrix::redis::read::renewals_and_releases_are_owner_checked`).
//! A new kind is one more [`Kind`] (what it asks for, what stands in its
//! way, how many may hold it) and one more name in the rows below; a new
//! store, one `matrix!` line. `the_rows_are_the_kinds_the_store_keeps`
//! fails when a store keeps a kind its row leaves out (or the other way),
//! and checks that a kind a store lacks is refused when it is made.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tower_redis_lock::{
    AcquireOutcome, Ask, Error, Grant, LeaseKind, LockGuard, LockKey, LockStore, Locker,
    OwnerToken, Renewal,
};

use crate::support::{eventually, stores};

/// A lease meant to lapse soon (see the suite's `SHORT_LEASE`).
const SHORT_LEASE: Duration = Duration::from_secs(1);
/// A lease nothing in a test outlives.
const LONG_LEASE: Duration = Duration::from_secs(10);
/// What a loaded machine meets for something that should happen at once.
const BUDGET: Duration = Duration::from_secs(5);

/// A lease kind as the matrix takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The key's lock.
    Lock,
    /// One permit of a semaphore of this many.
    Permit(u32),
    /// A read of the key's reader-writer lock.
    Read,
    /// The write of the key's reader-writer lock.
    Write,
}

/// How many permits the matrix's semaphore has.
const PERMITS: u32 = 3;

impl Kind {
    pub const ALL: [Kind; 4] = [Kind::Lock, Kind::Permit(PERMITS), Kind::Read, Kind::Write];

    pub fn lease_kind(self) -> LeaseKind {
        match self {
            Kind::Lock => LeaseKind::Lock,
            Kind::Permit(_) => LeaseKind::Permit,
            Kind::Read => LeaseKind::Read,
            Kind::Write => LeaseKind::Write,
        }
    }

    fn ask(self) -> Ask {
        match self {
            Kind::Lock => Ask::Lock { replay: false },
            Kind::Permit(permits) => Ask::Permit { permits },
            Kind::Read => Ask::Read,
            Kind::Write => Ask::Write { waiter: None },
        }
    }

    /// The most holders of this kind a key has at once (`None`: any
    /// number, as readers).
    fn capacity(self) -> Option<usize> {
        match self {
            Kind::Lock | Kind::Write => Some(1),
            Kind::Permit(n) => Some(n as usize),
            Kind::Read => None,
        }
    }

    /// Whether each grant mints a token of its own (a read answers the
    /// key's epoch instead: every earlier write's token or above).
    fn mints(self) -> bool {
        self != Kind::Read
    }

    /// The kind whose holders stand in this kind's way, and how many of
    /// them it takes.
    fn blocker(self) -> (Kind, usize) {
        match self {
            Kind::Lock => (Kind::Lock, 1),
            Kind::Permit(n) => (self, n as usize),
            Kind::Read => (Kind::Write, 1),
            Kind::Write => (Kind::Read, 1),
        }
    }

    /// One grant at the store.
    async fn grant<S: LockStore>(
        self,
        store: &S,
        key: &LockKey,
        owner: &OwnerToken,
        lease: Duration,
    ) -> AcquireOutcome {
        store
            .grant(Grant::new(key, owner, lease, self.ask()))
            .await
            .unwrap()
    }

    /// Grants `key` to a fresh owner, which is answered.
    async fn granted<S: LockStore>(
        self,
        store: &S,
        key: &LockKey,
        lease: Duration,
    ) -> (OwnerToken, AcquireOutcome) {
        let owner = OwnerToken::generate();
        let outcome = self.grant(store, key, &owner, lease).await;
        assert!(outcome.is_granted(), "{self:?} of a free key: {outcome:?}");
        (owner, outcome)
    }

    /// Puts this kind's blockers on `key`: their owners.
    async fn block<S: LockStore>(
        self,
        store: &S,
        key: &LockKey,
        lease: Duration,
    ) -> Vec<(Kind, OwnerToken)> {
        let (kind, n) = self.blocker();
        let mut owners = Vec::new();
        for _ in 0..n {
            owners.push((kind, kind.granted(store, key, lease).await.0));
        }
        owners
    }

    /// One lease of this kind through the engine, waiting up to `wait`.
    async fn take<S: LockStore>(
        self,
        l: &Locker<S>,
        key: &LockKey,
        wait: Duration,
    ) -> Result<LockGuard, Error> {
        match self {
            Kind::Lock => l.acquire_within(key, wait).await,
            Kind::Permit(n) => l.semaphore(key, n)?.acquire_within(wait).await,
            Kind::Read => l.rwlock(key)?.read_within(wait).await,
            Kind::Write => l.rwlock(key)?.write_within(wait).await,
        }
    }
}

fn token(outcome: &AcquireOutcome) -> u64 {
    match outcome {
        AcquireOutcome::Granted(t) => t.get(),
        other => panic!("not a fenced grant: {other:?}"),
    }
}

fn key(kind: Kind, id: &str) -> LockKey {
    LockKey::new("matrix", format!("{}-{id}", kind.lease_kind().as_str())).unwrap()
}

async fn release_all<S: LockStore>(store: &S, key: &LockKey, owners: &[(Kind, OwnerToken)]) {
    for (kind, owner) in owners {
        assert!(store.release(kind.lease_kind(), key, owner).await.unwrap());
    }
}

/// A grant while the kind's blockers hold is refused, with the time until
/// the soonest of their leases ends; once they release, it is granted.
pub async fn refused_while_in_the_way_then_granted<S: LockStore>(store: S, kind: Kind) {
    let k = key(kind, "in-the-way");
    let blockers = kind.block(&store, &k, LONG_LEASE).await;
    let other = OwnerToken::generate();
    match kind.grant(&store, &k, &other, LONG_LEASE).await {
        AcquireOutcome::Held { remaining: Some(r) } => {
            assert!(r <= LONG_LEASE && r > LONG_LEASE / 2, "remaining {r:?}")
        }
        outcome => panic!("{kind:?} beside its blockers: {outcome:?}"),
    }
    release_all(&store, &k, &blockers).await;
    assert!(
        kind.grant(&store, &k, &other, LONG_LEASE)
            .await
            .is_granted()
    );
}

/// A retried grant by the holder's own owner (its answer was lost) is
/// granted again, with a token valid for that hold.
pub async fn a_retry_by_the_holder_is_granted_again<S: LockStore>(store: S, kind: Kind) {
    let k = key(kind, "retry");
    let (owner, first) = kind.granted(&store, &k, LONG_LEASE).await;
    let again = kind.grant(&store, &k, &owner, LONG_LEASE).await;
    assert!(again.is_granted(), "{again:?}");
    assert!(token(&again) >= token(&first), "{first:?} then {again:?}");
    // Still one hold: one release gives it back.
    assert!(store.release(kind.lease_kind(), &k, &owner).await.unwrap());
    assert!(!store.release(kind.lease_kind(), &k, &owner).await.unwrap());
}

/// Tokens rise across releases and expiries: a grant of a minting kind
/// is above every earlier grant of the key (of any kind), a read at least
/// every earlier write's.
pub async fn tokens_rise_across_release_and_expiry<S: LockStore>(store: S, kind: Kind) {
    let k = key(kind, "tokens");
    let mut last = 0u64;
    let check = |kind: Kind, t: u64, last: &mut u64, when: &str| {
        if kind.mints() {
            assert!(t > *last, "{when}: {kind:?}'s {t} after {last}");
        } else {
            assert!(t >= *last, "{when}: a read's {t} below a write's {last}");
        }
        *last = t;
    };
    for round in 0..8 {
        let expire = round % 4 == 3;
        let lease = if expire { SHORT_LEASE } else { LONG_LEASE };
        let (owner, outcome) = kind.granted(&store, &k, lease).await;
        check(kind, token(&outcome), &mut last, &format!("round {round}"));
        if !expire {
            assert!(store.release(kind.lease_kind(), &k, &owner).await.unwrap());
        } else {
            // Until it lapsed: then its blockers are granted.
            let mut blockers = Vec::new();
            assert!(
                eventually(BUDGET, async || {
                    blockers = take_blockers(&store, &k, kind).await.unwrap_or_default();
                    !blockers.is_empty()
                })
                .await,
                "round {round}: the lease never lapsed"
            );
            for (_, _, t) in &blockers {
                check(
                    kind.blocker().0,
                    *t,
                    &mut last,
                    &format!("round {round}, after"),
                );
            }
            let owners: Vec<_> = blockers.into_iter().map(|(b, o, _)| (b, o)).collect();
            release_all(&store, &k, &owners).await;
        }
        if !kind.mints() {
            // Reads answer the epoch: a write moves it on.
            let (w, outcome) = Kind::Write.granted(&store, &k, LONG_LEASE).await;
            check(
                Kind::Write,
                token(&outcome),
                &mut last,
                "a write between reads",
            );
            assert!(store.release(LeaseKind::Write, &k, &w).await.unwrap());
        }
    }
}

/// All of `kind`'s blockers granted at once (owner and token each), or
/// `None` with nothing left taken.
async fn take_blockers<S: LockStore>(
    store: &S,
    k: &LockKey,
    kind: Kind,
) -> Option<Vec<(Kind, OwnerToken, u64)>> {
    let (blocker, n) = kind.blocker();
    let mut taken = Vec::new();
    for _ in 0..n {
        let owner = OwnerToken::generate();
        let outcome = blocker.grant(store, k, &owner, LONG_LEASE).await;
        if !outcome.is_granted() {
            for (b, o, _) in &taken {
                assert!(store.release(Kind::lease_kind(*b), k, o).await.unwrap());
            }
            return None;
        }
        taken.push((blocker, owner, token(&outcome)));
    }
    Some(taken)
}

/// A holder whose lease lapsed and was taken by another can neither
/// release nor renew the newer holder's lease.
pub async fn a_stale_owner_cannot_touch_the_next_holders_lease<S: LockStore>(store: S, kind: Kind) {
    let k = key(kind, "stale");
    let (old, _) = kind.granted(&store, &k, SHORT_LEASE).await;
    // Until it lapsed: its blockers are granted in its place.
    let mut new = Vec::new();
    assert!(
        eventually(BUDGET, async || {
            new = take_blockers(&store, &k, kind).await.unwrap_or_default();
            !new.is_empty()
        })
        .await,
        "the old lease never lapsed"
    );
    let new: Vec<_> = new.into_iter().map(|(b, o, _)| (b, o)).collect();
    let lk = kind.lease_kind();
    assert!(
        !store.release(lk, &k, &old).await.unwrap(),
        "a stale release"
    );
    assert!(
        !store.renew(lk, &k, &old, LONG_LEASE).await.unwrap(),
        "a stale renewal"
    );
    // The new holders still hold, each renewed and released once.
    for (blocker, owner) in &new {
        assert!(
            store
                .renew(blocker.lease_kind(), &k, owner, LONG_LEASE)
                .await
                .unwrap()
        );
    }
    release_all(&store, &k, &new).await;
}

/// Renewals and releases are owner-checked and say what they found; a
/// batch's renewals answer each for itself; a renewal after the release
/// does not bring the lease back.
pub async fn renewals_and_releases_are_owner_checked<S: LockStore>(store: S, kind: Kind) {
    let k = key(kind, "owner-checked");
    let lk = kind.lease_kind();
    let (owner, _) = kind.granted(&store, &k, Duration::from_secs(3)).await;
    let stranger = OwnerToken::generate();
    assert!(!store.renew(lk, &k, &stranger, LONG_LEASE).await.unwrap());
    assert!(!store.release(lk, &k, &stranger).await.unwrap());
    assert!(store.renew(lk, &k, &owner, LONG_LEASE).await.unwrap());
    // The renewal applied: what a grant beside it finds in its way ends
    // in more than 5 s (it was 3). A semaphore's other permits are taken
    // first, a reader-writer lock is probed from the other side.
    let mut fill = Vec::new();
    for _ in 1..kind.blocker().1 {
        fill.push((kind, kind.granted(&store, &k, LONG_LEASE).await.0));
    }
    let probe_kind = match kind {
        Kind::Read => Kind::Write,
        Kind::Write => Kind::Read,
        other => other,
    };
    let probe = OwnerToken::generate();
    match probe_kind
        .grant(&store, &k, &probe, Duration::from_secs(1))
        .await
    {
        AcquireOutcome::Held { remaining: Some(r) } => {
            assert!(r > Duration::from_secs(5), "renewal not applied: {r:?}")
        }
        other => panic!("{probe_kind:?} beside a {kind:?}: {other:?}"),
    }
    release_all(&store, &k, &fill).await;
    let renewal = |owner: &OwnerToken, key: &LockKey| Renewal {
        key: key.clone(),
        owner: owner.clone(),
        lease: LONG_LEASE,
        kind: lk,
    };
    let many = store
        .renew_many(&[
            renewal(&owner, &k),
            renewal(&stranger, &k),
            renewal(&owner, &key(kind, "nobody")),
        ])
        .await;
    let many: Vec<bool> = many.into_iter().map(Result::unwrap).collect();
    assert_eq!(many, [true, false, false]);
    assert!(store.release(lk, &k, &owner).await.unwrap());
    assert!(
        !store.release(lk, &k, &owner).await.unwrap(),
        "released twice"
    );
    assert!(
        !store.renew(lk, &k, &owner, LONG_LEASE).await.unwrap(),
        "renewed after release"
    );
}

/// Through the engine, under contention: never more holders than the
/// kind allows (a writer beside nobody), and every minting grant has its
/// own token. Reads and writes run together.
pub async fn never_more_holders_than_the_kind_allows<S: LockStore>(store: S, kind: Kind) {
    let l = Locker::builder(store)
        .lease(Duration::from_secs(5))
        .wait_timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let k = key(kind, "capacity");
    // Per kind taken: holders inside now; overlaps seen.
    let inside = Arc::new([AtomicU32::new(0), AtomicU32::new(0)]);
    let overlaps = Arc::new(AtomicU32::new(0));
    let mut tasks = Vec::new();
    for t in 0..6 {
        // Reader-writer rows mix both sides: one task in three writes.
        let mine = match kind {
            Kind::Read | Kind::Write if t % 3 == 0 => Kind::Write,
            Kind::Read | Kind::Write => Kind::Read,
            other => other,
        };
        let (l, k, inside, overlaps) = (l.clone(), k.clone(), inside.clone(), overlaps.clone());
        tasks.push(tokio::spawn(async move {
            let mut tokens = Vec::new();
            for _ in 0..40 {
                let g = mine.take(&l, &k, Duration::from_secs(60)).await.unwrap();
                let side = usize::from(mine == Kind::Write);
                let now = inside[side].fetch_add(1, Ordering::SeqCst) + 1;
                let others = inside[1 - side].load(Ordering::SeqCst);
                let over = match mine {
                    Kind::Write => now > 1 || others > 0,
                    Kind::Read => others > 0,
                    _ => now as usize > mine.capacity().unwrap(),
                };
                if over {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                if mine.mints() {
                    tokens.push(g.fencing_token().unwrap());
                }
                tokio::task::yield_now().await;
                inside[side].fetch_sub(1, Ordering::SeqCst);
                assert!(g.release().await.unwrap());
            }
            tokens
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    assert_eq!(
        overlaps.load(Ordering::SeqCst),
        0,
        "holders beyond what {kind:?} allows"
    );
    let n = all.len();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), n, "every minting grant has its own token");
}

/// The watchdog keeps a lease of the kind across several lease lengths:
/// its blocker stays refused all along.
pub async fn the_watchdog_keeps_the_lease<S: LockStore>(store: S, kind: Kind) {
    // A 1.2 s lease renewed every 400 ms, watched over three leases.
    let l = Locker::builder(store)
        .lease(Duration::from_millis(1_200))
        .wait_timeout(Duration::ZERO)
        .build()
        .unwrap();
    let k = key(kind, "watchdog");
    let mut held = Vec::new();
    // A permit stands in its own way only once all are taken.
    for _ in 0..kind.blocker().1 {
        held.push(kind.take(&l, &k, Duration::ZERO).await.unwrap());
    }
    let (blocker, _) = kind.blocker();
    let until = tokio::time::Instant::now() + Duration::from_millis(3_600);
    while tokio::time::Instant::now() < until {
        assert!(held.iter().all(LockGuard::is_held), "a lease lapsed");
        let err = blocker.take(&l, &k, Duration::ZERO).await.unwrap_err();
        assert!(err.is_contended(), "{err:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for g in held {
        assert!(
            g.release().await.unwrap(),
            "still owned after three lease lengths"
        );
    }
    drop(blocker.take(&l, &k, Duration::ZERO).await.unwrap());
}

/// The hold cap ends a lease of the kind, reported lost, and the store
/// lets the next holder in.
pub async fn the_hold_cap_ends_the_lease<S: LockStore>(store: S, kind: Kind) {
    let (lease, cap) = (Duration::from_millis(1_200), Duration::from_millis(2_400));
    let l = Locker::builder(store)
        .lease(lease)
        .max_hold(cap)
        .wait_timeout(Duration::ZERO)
        .build()
        .unwrap();
    let k = key(kind, "cap");
    let g = kind.take(&l, &k, Duration::ZERO).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), g.lost())
        .await
        .expect("lost() never resolved");
    assert!(!g.is_held());
    assert!(
        g.acquired_at().elapsed() >= cap - lease,
        "lost before the cap"
    );
    let (blocker, _) = kind.blocker();
    assert!(
        eventually(Duration::from_secs(3), async || blocker
            .take(&l, &k, Duration::ZERO)
            .await
            .is_ok())
        .await,
        "the capped lease still stands in the way"
    );
}

/// Liveness: a waiter of the kind is granted once what stood in its way
/// is released, woken by the release itself. The poll is a minute and
/// the wait a minute and a half, so a missed wake-up fails the test: the
/// bound stated is the release's notification, within [`BUDGET`].
pub async fn a_waiter_is_woken_by_the_release<S: LockStore + Clone>(store: S, kind: Kind) {
    // Two lockers, as two processes: the waiter is not woken by the
    // holder's own local queue, only by the store.
    let locker = |store: S| {
        Locker::builder(store)
            .lease(LONG_LEASE)
            .poll_interval(Duration::from_secs(60))
            .wait_timeout(Duration::from_secs(90))
            .build()
            .unwrap()
    };
    let (l, other) = (locker(store.clone()), locker(store));
    let k = key(kind, "woken");
    let (blocker, n) = kind.blocker();
    let mut held = Vec::new();
    for _ in 0..n {
        held.push(blocker.take(&l, &k, Duration::ZERO).await.unwrap());
    }
    let waiter = {
        let k = k.clone();
        tokio::spawn(async move { kind.take(&other, &k, Duration::from_secs(90)).await })
    };
    // Until the waiter has tried and found it held (its first try and the
    // one after subscribing run at once), give it a moment, then release.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "granted beside its blockers");
    let released = tokio::time::Instant::now();
    for g in held {
        assert!(g.release().await.unwrap());
    }
    let g = tokio::time::timeout(BUDGET, waiter)
        .await
        .expect("the release did not wake the waiter")
        .unwrap()
        .unwrap();
    assert!(
        g.is_held(),
        "woken {:?} after the release",
        released.elapsed()
    );
}

/// A guard dropped without a release frees its lease at once (released
/// in the background), not at its lease's end.
pub async fn a_dropped_guard_frees_the_lease<S: LockStore>(store: S, kind: Kind) {
    let l = Locker::builder(store)
        .lease(Duration::from_secs(30))
        .wait_timeout(Duration::ZERO)
        .build()
        .unwrap();
    let k = key(kind, "dropped");
    let mut held = Vec::new();
    for _ in 0..kind.blocker().1 {
        held.push(kind.take(&l, &k, Duration::ZERO).await.unwrap());
    }
    drop(held);
    let (blocker, _) = kind.blocker();
    assert!(
        eventually(BUDGET, async || blocker
            .take(&l, &k, Duration::ZERO)
            .await
            .is_ok())
        .await,
        "a dropped {kind:?} still stands in the way"
    );
}

/// The store keeps exactly the kinds of its row, and a kind it lacks is
/// refused when a semaphore or reader-writer lock is made, before any
/// store call.
pub fn rows_are_kept<S: LockStore>(store: S, rows: &[Kind]) {
    for kind in Kind::ALL {
        let kept = store.supports(kind.lease_kind());
        assert_eq!(
            kept,
            rows.contains(&kind),
            "{kind:?}: kept {kept}, in the matrix {}",
            !kept
        );
    }
    let l = Locker::new(store);
    let k = key(Kind::Lock, "rows");
    if !rows.contains(&Kind::Permit(PERMITS)) {
        assert!(matches!(l.semaphore(&k, PERMITS), Err(Error::Config(_))));
    }
    if !rows.contains(&Kind::Read) {
        assert!(matches!(l.rwlock(&k), Err(Error::Config(_))));
    }
}

/// One test per promise for one store and kind.
macro_rules! promises {
    ($fixture:expr, $kind:expr) => {
        use super::super::*;

        promises!(@each $fixture, $kind;
            refused_while_in_the_way_then_granted,
            a_retry_by_the_holder_is_granted_again,
            tokens_rise_across_release_and_expiry,
            a_stale_owner_cannot_touch_the_next_holders_lease,
            renewals_and_releases_are_owner_checked,
            the_watchdog_keeps_the_lease,
            the_hold_cap_ends_the_lease,
            a_waiter_is_woken_by_the_release,
            a_dropped_guard_frees_the_lease,
        );

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn never_more_holders_than_the_kind_allows() {
            let (store, _keep) = $fixture;
            super::super::never_more_holders_than_the_kind_allows(store, $kind).await;
        }
    };
    (@each $fixture:expr, $kind:expr; $($promise:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $promise() {
                let (store, _keep) = $fixture;
                super::super::$promise(store, $kind).await;
            }
        )*
    };
}

/// A store's row: a module per kind it keeps.
macro_rules! matrix {
    ($store:ident, $fixture:expr, [$($kind:ident: $value:expr),* $(,)?]) => {
        mod $store {
            use super::*;

            $(
                mod $kind {
                    promises!($fixture, $value);
                }
            )*

            #[tokio::test]
            async fn the_rows_are_the_kinds_the_store_keeps() {
                let (store, _keep) = $fixture;
                rows_are_kept(store, &[$($value),*]);
            }
        }
    };
}

matrix!(memory, stores::memory(), [
    lock: Kind::Lock, permit: Kind::Permit(PERMITS), read: Kind::Read, write: Kind::Write,
]);
matrix!(redis, stores::redis(), [
    lock: Kind::Lock, permit: Kind::Permit(PERMITS), read: Kind::Read, write: Kind::Write,
]);
matrix!(cluster, stores::cluster(), [
    lock: Kind::Lock, permit: Kind::Permit(PERMITS), read: Kind::Read, write: Kind::Write,
]);
matrix!(sentinel, stores::sentinel(), [
    lock: Kind::Lock, permit: Kind::Permit(PERMITS), read: Kind::Read, write: Kind::Write,
]);
matrix!(redlock, stores::redlock(3), [lock: Kind::Lock]);
matrix!(boxed_memory, stores::boxed(stores::memory()), [
    lock: Kind::Lock, permit: Kind::Permit(PERMITS), read: Kind::Read, write: Kind::Write,
]);
matrix!(boxed_redis, stores::boxed(stores::redis()), [
    lock: Kind::Lock, permit: Kind::Permit(PERMITS), read: Kind::Read, write: Kind::Write,
]);
