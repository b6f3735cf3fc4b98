//! The state of one granted lease: its validity deadline and whether it is
//! held, lost or released. Shared by every hold of the grant, the watchdog
//! and the key's local queue.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::key::LockKey;
use crate::store::LeaseKind;
use crate::sync::Signal;
use crate::time::far_add;
use crate::token::{FencingToken, OwnerToken, Unfenced};

const HELD: u8 = 0;
const LOST: u8 = 1;
const RELEASED: u8 = 2;

/// What an acquire asks the store for: the store's [`Ask`](crate::store::Ask)
/// as the engine keeps it from try to try (`Copy`: a writer's waiter is
/// 128 bits, made an owner token for each try).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ask {
    /// The key's lock; with `replay`, its completed record instead if it
    /// has one.
    Lock { replay: bool },
    /// One of `permits` permits of the key's semaphore.
    Permit { permits: u32 },
    /// A shared hold of the key's reader-writer lock.
    Read,
    /// The exclusive hold of the key's reader-writer lock; `waiter` (one
    /// per acquire that waits) marks it waiting while it finds it busy.
    Write { waiter: Option<u128> },
}

impl Ask {
    /// The store's ask: the same, a writer's waiter as an owner token.
    pub(crate) fn for_store(self) -> crate::store::Ask {
        use crate::store::Ask as StoreAsk;
        match self {
            Ask::Lock { replay } => StoreAsk::Lock { replay },
            Ask::Permit { permits } => StoreAsk::Permit { permits },
            Ask::Read => StoreAsk::Read,
            Ask::Write { waiter } => StoreAsk::Write {
                waiter: waiter.map(OwnerToken::from_u128),
            },
        }
    }

    /// The kind of lease a grant of this ask is.
    pub(crate) fn kind(self) -> LeaseKind {
        match self {
            Ask::Lock { .. } => LeaseKind::Lock,
            Ask::Permit { .. } => LeaseKind::Permit,
            Ask::Read => LeaseKind::Read,
            Ask::Write { .. } => LeaseKind::Write,
        }
    }
}

/// Why a lease was lost (for logs).
#[derive(Debug, Clone, Copy)]
pub(crate) enum LossReason {
    NotOwner,
    Expired,
    /// The watchdog's runtime shut down and no runtime the lock's grants
    /// were made on still runs: nothing can renew it.
    Stopped,
}

impl LossReason {
    /// For metrics.
    pub(crate) fn label(self) -> &'static str {
        match self {
            LossReason::NotOwner => "not_owner",
            LossReason::Expired => "expired",
            LossReason::Stopped => "stopped",
        }
    }
}

/// State of one granted lease, shared by its guard clones and the watchdog.
pub(crate) struct Lease {
    pub(crate) id: u64,
    pub(crate) key: LockKey,
    /// What the lease holds: the key's lock or one of its permits.
    pub(crate) kind: LeaseKind,
    pub(crate) owner: OwnerToken,
    pub(crate) token: Result<FencingToken, Unfenced>,
    pub(crate) lease: Duration,
    /// The full lease's margin ([`drift`](crate::time::drift) of `lease`): a
    /// renewal the hold cap shortens below twice this is not sent.
    pub(crate) drift: Duration,
    pub(crate) acquired_at: Instant,
    pub(crate) hold_deadline: Option<Instant>,
    /// Nanoseconds after `acquired_at` until which the lease is valid.
    valid_until_ns: AtomicU64,
    status: AtomicU8,
    pub(crate) lost: Signal,
    /// Holds not yet given back: 1 for the grant, +1 per re-entry. The lock
    /// is released when this reaches zero (see `hold.rs`).
    pub(crate) holds: AtomicU32,
    /// The `lock.hold` span (see `observe.rs`), set once granted.
    pub(crate) span: OnceLock<tracing::Span>,
}

impl Lease {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        id: u64,
        (key, kind): (LockKey, LeaseKind),
        owner: OwnerToken,
        token: Result<FencingToken, Unfenced>,
        lease: Duration,
        drift: Duration,
        attempt_start: Instant,
        max_hold: Option<Duration>,
    ) -> Lease {
        let l = Lease {
            id,
            key,
            kind,
            owner,
            token,
            lease,
            drift,
            acquired_at: attempt_start,
            hold_deadline: max_hold.map(|h| far_add(attempt_start, h)),
            valid_until_ns: AtomicU64::new(0),
            status: AtomicU8::new(HELD),
            lost: Signal::default(),
            holds: AtomicU32::new(1),
            span: OnceLock::new(),
        };
        // Granted for what the hold cap leaves of the lease (see
        // `Locker::attempt`), so valid no longer than that either.
        l.renewed(attempt_start, l.renewal_at(attempt_start));
        l
    }

    pub(crate) fn valid_until(&self) -> Instant {
        self.acquired_at + Duration::from_nanos(self.valid_until_ns.load(Ordering::Acquire))
    }

    /// Records a successful renewal sent at `started` for `lease`: the lease
    /// is valid until `started + lease - drift(lease)` (never moves
    /// backwards), and never past the hold cap less that margin. The margin
    /// is that of the TTL the store set, not of the locker's lease: a grant
    /// or renewal shortened by the hold cap (250 ms of a 30 s lease) is
    /// valid for 250 ms less its own margin, where the 30 s lease's margin
    /// (302 ms) would leave nothing.
    ///
    /// Why the cap bounds it: a renewal asks for what the cap leaves when
    /// its length is chosen, and goes out a little later (the watchdog's
    /// batch task runs after the table was read), so counted from its
    /// sending it would end past the cap by that delay; the next renewal,
    /// asking for what is left then, sets the store's expiry back to the
    /// cap, and the validity, which never moves backwards, would outlast
    /// the lock in the store.
    pub(crate) fn renewed(&self, started: Instant, lease: Duration) {
        let margin = crate::time::drift(lease);
        let mut until = started + lease.saturating_sub(margin);
        if let Some(cap) = self.hold_deadline {
            until = until.min(cap.checked_sub(margin).unwrap_or(self.acquired_at));
        }
        let until = until.saturating_duration_since(self.acquired_at).as_nanos() as u64;
        self.valid_until_ns.fetch_max(until, Ordering::AcqRel);
    }

    /// How long the lease is certainly valid from now on (zero once lost,
    /// released or past its deadline).
    pub(crate) fn valid_for(&self) -> Duration {
        if !self.is_active() {
            return Duration::ZERO;
        }
        self.valid_until().saturating_duration_since(Instant::now())
    }

    /// The lease to ask for in a renewal sent `now`: the full lease, or what
    /// the hold cap leaves of it.
    pub(crate) fn renewal_at(&self, now: Instant) -> Duration {
        match self.hold_deadline {
            Some(cap) => self.lease.min(cap.saturating_duration_since(now)),
            None => self.lease,
        }
    }

    pub(crate) fn is_active(&self) -> bool {
        self.status.load(Ordering::Acquire) == HELD
    }

    /// Neither released nor lost, and the validity deadline not passed.
    pub(crate) fn is_valid_now(&self) -> bool {
        self.is_active() && Instant::now() < self.valid_until()
    }

    /// Opens this lease's `lock.hold` span (see `observe.rs`).
    pub(crate) fn hold_started(&self) {
        crate::observe::hold_started(&self.span, &self.key, self.kind, self.token.ok());
    }

    /// The `lock.release` span of a release of this lease (`op`:
    /// "release", "finish" or "background").
    pub(crate) fn release_span(&self, op: &'static str) -> tracing::Span {
        crate::observe::release_span(&self.span, &self.key, op)
    }

    /// Flips a held lease to lost and tells every observer. Returns whether
    /// this call did it.
    pub(crate) fn mark_lost(&self, reason: LossReason) -> bool {
        let flipped = self
            .status
            .compare_exchange(HELD, LOST, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if flipped {
            // The metrics and the span first, so that whoever `lost` wakes
            // finds them (a deadline check meanwhile reads the status).
            crate::observe::lost(&self.span, (&self.key, self.kind), reason.label());
            self.lost.cancel();
            tracing::warn!(
                key = %self.key,
                fencing_token = self.token.ok().map(FencingToken::get),
                reason = ?reason,
                held_ms = self.acquired_at.elapsed().as_millis() as u64,
                "lock lost"
            );
        }
        flipped
    }

    /// Flips a held lease whose validity deadline has passed to lost: the
    /// watchdog does so at the deadline, and a guard that looks first (its
    /// watchdog's task cannot run: its runtime is alive but not driven)
    /// does it itself. Whether the lease is lost now.
    ///
    /// Read from the status and from `lost`: a lease another thread is
    /// flipping (the status flipped, `lost` told just after) is lost here
    /// already, and a lost lease stays lost when a clone releases it
    /// afterwards (the status then says released; `lost` was told).
    pub(crate) fn expire_if_due(&self) -> bool {
        if self.is_active() && Instant::now() >= self.valid_until() {
            self.mark_lost(LossReason::Expired);
        }
        self.status.load(Ordering::Acquire) == LOST || self.lost.is_cancelled()
    }

    /// Resolves once the lease is lost: told by the watchdog, or found
    /// past its validity deadline here (see [`expire_if_due`]); pends
    /// forever once it is released cleanly. The body of
    /// `LockGuard::lost`.
    ///
    /// [`expire_if_due`]: Self::expire_if_due
    pub(crate) async fn until_lost(&self) {
        loop {
            tokio::select! {
                biased;
                () = self.lost.cancelled() => return,
                () = tokio::time::sleep_until(self.valid_until()) => {
                    if self.expire_if_due() {
                        return;
                    }
                    if !self.is_active() {
                        // Released: lost only if `lost` is told (a clone's
                        // release inside another thread's flip to lost);
                        // after a clean release, never.
                        self.lost.cancelled().await;
                        return;
                    }
                    // Renewed meanwhile: watch the new deadline.
                }
            }
        }
    }

    /// Marks the lease released; returns whether it was not released before.
    pub(crate) fn mark_released(&self) -> bool {
        self.status.swap(RELEASED, Ordering::AcqRel) != RELEASED
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{grant, key};
    use super::*;
    use crate::store::LockStore;
    use crate::store::memory::MemoryStore;
    use crate::time::drift;

    const LEASE: Duration = Duration::from_secs(30);

    #[tokio::test(start_paused = true)]
    async fn a_fresh_lease_is_valid_for_lease_minus_drift_and_not_one_instant_more() {
        let l = grant(&MemoryStore::new(), &key("fresh"), LEASE, None).await;
        let margin = drift(LEASE);
        assert_eq!(margin, Duration::from_millis(302));
        assert_eq!(l.valid_until(), l.acquired_at + LEASE - margin);
        assert_eq!(l.valid_for(), LEASE - margin);

        tokio::time::advance(LEASE - margin - Duration::from_millis(1)).await;
        assert!(l.is_valid_now());
        assert_eq!(l.valid_for(), Duration::from_millis(1));
        // The deadline itself is already too late.
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(!l.is_valid_now());
        assert_eq!(l.valid_for(), Duration::ZERO);
        // Expiry is judged by the clock: the state is still "held" until the
        // watchdog marks it lost.
        assert!(l.is_active());
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewal_counts_from_when_it_was_sent_and_never_moves_the_deadline_back() {
        let l = grant(&MemoryStore::new(), &key("renew"), LEASE, None).await;
        let t0 = l.acquired_at;
        tokio::time::advance(Duration::from_secs(10)).await;
        let sent = Instant::now();
        tokio::time::advance(Duration::from_secs(2)).await; // the reply took 2 s
        l.renewed(sent, LEASE);
        assert_eq!(l.valid_until(), sent + LEASE - drift(LEASE));
        assert_eq!(l.valid_for(), LEASE - drift(LEASE) - Duration::from_secs(2));

        // A late answer to an older renewal (sent at t0 + 1 s) changes nothing.
        l.renewed(t0 + Duration::from_secs(1), LEASE);
        assert_eq!(l.valid_until(), sent + LEASE - drift(LEASE));
        // Nor does a shorter renewal sent later.
        l.renewed(Instant::now(), Duration::from_secs(1));
        assert_eq!(l.valid_until(), sent + LEASE - drift(LEASE));
    }

    #[tokio::test(start_paused = true)]
    async fn renewals_ask_for_what_the_hold_cap_leaves() {
        let cap = Duration::from_secs(40);
        let l = grant(&MemoryStore::new(), &key("cap"), LEASE, Some(cap)).await;
        let t0 = l.acquired_at;
        assert_eq!(l.renewal_at(t0 + Duration::from_secs(10)), LEASE);
        assert_eq!(
            l.renewal_at(t0 + Duration::from_secs(25)),
            Duration::from_secs(15)
        );
        assert_eq!(l.renewal_at(t0 + Duration::from_secs(50)), Duration::ZERO);
        let free = grant(&MemoryStore::new(), &key("free"), LEASE, None).await;
        assert_eq!(free.renewal_at(t0 + Duration::from_secs(3600)), LEASE);
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewal_sent_after_its_length_was_chosen_is_not_valid_past_the_hold_cap() {
        // A 300 ms lease capped at 300 ms. The renewal at a third of it
        // asks for what the cap leaves then (200 ms) and goes out 13 ms
        // later (the batch task ran late); the next, on time, asks for
        // what is left (87 ms), and the store's expiry falls back to the
        // cap. The guard must not call the lock valid past it. (Seen in a
        // history: another worker was granted the key 6.8 ms before the
        // end of the validity the guard claimed.)
        let cap = Duration::from_millis(300);
        let store = MemoryStore::new();
        let l = grant(&store, &key("late-renewal"), cap, Some(cap)).await;
        let t0 = l.acquired_at;
        tokio::time::advance(Duration::from_millis(100)).await;
        let first = l.renewal_at(Instant::now());
        assert_eq!(first, Duration::from_millis(200));
        tokio::time::advance(Duration::from_millis(13)).await;
        let sent = Instant::now();
        assert!(
            store
                .renew(LeaseKind::Lock, &l.key, &l.owner, first)
                .await
                .unwrap()
        );
        l.renewed(sent, first);
        tokio::time::advance(Duration::from_millis(100)).await;
        let second = l.renewal_at(Instant::now());
        assert_eq!(second, Duration::from_millis(87));
        assert!(
            store
                .renew(LeaseKind::Lock, &l.key, &l.owner, second)
                .await
                .unwrap()
        );
        l.renewed(Instant::now(), second);
        assert!(
            l.valid_until() <= t0 + cap,
            "valid until {:?} after the grant, past the 300 ms cap",
            l.valid_until() - t0
        );
        // (Advanced exactly: a timer would round up to the millisecond.)
        tokio::time::advance(l.valid_until() - Instant::now() - Duration::from_micros(1)).await;
        assert!(l.is_valid_now());
        assert!(
            store.is_locked(&l.key),
            "the guard calls the lock valid, the store has let it go"
        );
    }

    /// A lease another thread is flipping to lost (its status flipped,
    /// `lost` not yet told) when the guard's own deadline check runs:
    /// `until_lost` resolves, never taking it for a clean release. (It
    /// pended forever when the check read `lost`: a
    /// `renewal_isolation` test saw a frozen node's lock never reported
    /// lost under load, the watchdog and the guard both at the deadline.)
    #[tokio::test(start_paused = true)]
    async fn a_lease_flipping_to_lost_at_its_deadline_is_lost_not_released() {
        let l = grant(&MemoryStore::new(), &key("flipping"), LEASE, None).await;
        // The flip's first half, as `mark_lost` makes it on another thread.
        l.status.store(LOST, Ordering::Release);
        assert!(!l.lost.is_cancelled());
        assert!(l.expire_if_due(), "a flipped lease is lost");
        tokio::time::timeout(LEASE * 2, l.until_lost())
            .await
            .expect("until_lost took the lease for released");
    }

    /// A lost lease that a clone releases afterwards (the layer's end of a
    /// request while the handler holds a clone, `MultiGuard::release`)
    /// stays lost. (With the status alone read, it turned not lost.)
    #[tokio::test(start_paused = true)]
    async fn a_lost_lease_released_afterwards_stays_lost() {
        let l = grant(&MemoryStore::new(), &key("lost-then-released"), LEASE, None).await;
        assert!(l.mark_lost(LossReason::NotOwner));
        assert!(l.expire_if_due());
        l.mark_released();
        assert!(
            l.expire_if_due(),
            "a lost lease read as not lost once released"
        );
    }

    /// A clone's release landing inside another thread's flip to lost (the
    /// status flipped, then released, then `lost` told): `until_lost`
    /// resolves once `lost` is told. (It pended for ever when it took the
    /// lease for cleanly released at its deadline.)
    #[tokio::test(start_paused = true)]
    async fn a_release_inside_the_flip_to_lost_still_resolves_until_lost() {
        let l = grant(&MemoryStore::new(), &key("flip-window"), LEASE, None).await;
        l.status.store(LOST, Ordering::Release);
        l.mark_released();
        let waiter = l.until_lost();
        tokio::pin!(waiter);
        assert!(
            tokio::time::timeout(LEASE * 2, &mut waiter).await.is_err(),
            "resolved before lost was told"
        );
        l.lost.cancel();
        tokio::time::timeout(LEASE * 2, &mut waiter)
            .await
            .expect("until_lost pends although lost was told");
    }

    #[tokio::test(start_paused = true)]
    async fn a_hold_cap_shorter_than_the_lease_bounds_the_first_validity() {
        let cap = Duration::from_secs(12);
        let l = grant(&MemoryStore::new(), &key("short-cap"), LEASE, Some(cap)).await;
        assert_eq!(l.valid_until(), l.acquired_at + cap - drift(cap));
        let long = grant(
            &MemoryStore::new(),
            &key("long-cap"),
            LEASE,
            Some(LEASE * 3),
        )
        .await;
        assert_eq!(long.valid_until(), long.acquired_at + LEASE - drift(LEASE));
    }

    #[tokio::test(start_paused = true)]
    async fn loss_is_flipped_once_and_told_and_a_released_lease_is_not_valid() {
        let l = grant(&MemoryStore::new(), &key("lost"), LEASE, None).await;
        assert!(!l.lost.is_cancelled());
        assert!(l.mark_lost(LossReason::NotOwner));
        assert!(l.lost.is_cancelled());
        assert!(
            !l.mark_lost(LossReason::Expired),
            "only the first flip counts"
        );
        assert!(!l.is_valid_now());
        assert_eq!(l.valid_for(), Duration::ZERO);

        let r = grant(&MemoryStore::new(), &key("released"), LEASE, None).await;
        assert!(r.mark_released());
        assert!(!r.mark_released());
        assert!(!r.is_valid_now());
        assert!(
            !r.mark_lost(LossReason::Expired),
            "a released lease is not lost"
        );
        assert!(!r.lost.is_cancelled());
    }
}
