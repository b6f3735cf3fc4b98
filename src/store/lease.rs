//! What the store core speaks in: the kind of a lease, what a grant asks
//! for ([`Ask`], [`Grant`]), what it found ([`AcquireOutcome`]), and a
//! renewal of a batch ([`Renewal`]). One vocabulary for every kind: the
//! store's methods take the kind as a parameter, so a promise written once
//! holds for each.

use std::time::Duration;

use bytes::Bytes;

use super::holder::HolderLabel;
use crate::key::LockKey;
use crate::token::{FencingToken, OwnerToken};

/// What an attempt found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AcquireOutcome {
    /// The lease is ours, with this fencing token.
    Granted(FencingToken),
    /// The lease is ours, and the store mints no fencing tokens (a
    /// [`RedisStore`](crate::RedisStore) built
    /// [`fencing(false)`](crate::RedisStoreBuilder::fencing)). The
    /// guard's [`fencing_token`](crate::LockGuard::fencing_token) answers
    /// [`Unfenced`](crate::Unfenced).
    GrantedUnfenced,
    /// Someone else holds it. `remaining` is the holder's remaining lease,
    /// `None` when the key has no expiry (written by something else).
    Held {
        /// The holder's remaining lease.
        remaining: Option<Duration>,
    },
    /// The key's work is done: its completed record (see the layer's
    /// `Record`). Only a grant of [`Ask::Lock`] with `replay` answers
    /// this.
    Completed(Bytes),
}

impl AcquireOutcome {
    /// Whether the lease was granted (fenced or not).
    pub fn is_granted(&self) -> bool {
        matches!(
            self,
            AcquireOutcome::Granted(_) | AcquireOutcome::GrantedUnfenced
        )
    }
}

/// What a lease holds: the lock of a key, one permit of the key's
/// semaphore, a side of its reader-writer lock, or a waiting writer's
/// mark. The store's methods take it as a parameter
/// ([`LockStore::renew`](super::LockStore::renew),
/// [`release`](super::LockStore::release)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum LeaseKind {
    /// The key's lock.
    #[default]
    Lock,
    /// One permit of the key's semaphore.
    Permit,
    /// A shared (read) hold of the key's reader-writer lock.
    Read,
    /// The exclusive (write) hold of the key's reader-writer lock.
    Write,
    /// A writer's mark: it waits for the key's write hold, and while the
    /// mark lasts no new reader is granted. Written by a grant of
    /// [`Ask::Write`] with a `waiter` that finds the lock busy (the owner
    /// of the mark is that waiter), renewed by the next such grant, taken
    /// back by [`release`](super::LockStore::release) of this kind. Never
    /// a lease a guard holds.
    WriterMark,
}

impl LeaseKind {
    /// The kinds a guard can hold, in the order of the conformance matrix.
    pub const HELD: [LeaseKind; 4] = [
        LeaseKind::Lock,
        LeaseKind::Permit,
        LeaseKind::Read,
        LeaseKind::Write,
    ];

    /// The kind as metrics, spans and logs name it.
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseKind::Lock => "lock",
            LeaseKind::Permit => "permit",
            LeaseKind::Read => "read",
            LeaseKind::Write => "write",
            LeaseKind::WriterMark => "writer_mark",
        }
    }
}

/// What a grant asks for: its kind, with what only that kind needs.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Ask {
    /// The key's lock; with `replay`, the key's completed record instead
    /// ([`AcquireOutcome::Completed`]) if it has one, and nothing taken.
    Lock {
        /// Answer the completed record instead if there is one.
        replay: bool,
    },
    /// One of `permits` permits of the key's semaphore. `permits` is the
    /// caller's: callers that disagree each count against their own (one
    /// asking for 5 is granted while 4 are held, one asking for 3 is not).
    /// The engine checks it (1 to 65,536) before calling.
    Permit {
        /// How many permits the semaphore has.
        permits: u32,
    },
    /// A shared (read) hold of the key's reader-writer lock.
    Read,
    /// The exclusive (write) hold of the key's reader-writer lock. With a
    /// `waiter`, a finding of "busy" marks that waiter as a writer waiting
    /// (a lease of kind [`LeaseKind::WriterMark`], as long as the grant's
    /// lease), and the grant takes the waiter's mark back.
    Write {
        /// The owner of the waiting writer's mark: one per acquire that
        /// waits, the same for all its tries. `None` for a try that does
        /// not wait.
        waiter: Option<OwnerToken>,
    },
}

impl Ask {
    /// The kind of lease a grant of this ask is.
    pub fn kind(&self) -> LeaseKind {
        match self {
            Ask::Lock { .. } => LeaseKind::Lock,
            Ask::Permit { .. } => LeaseKind::Permit,
            Ask::Read => LeaseKind::Read,
            Ask::Write { .. } => LeaseKind::Write,
        }
    }
}

/// One grant to try ([`LockStore::grant`](super::LockStore::grant)):
/// `ask` for `key`, to `owner`, for `lease`, with the holder's `label`.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Grant<'a> {
    /// The key.
    pub key: &'a LockKey,
    /// The owner of the lease if granted: fresh for every attempt.
    pub owner: &'a OwnerToken,
    /// The lease, counted from when the store applies the grant.
    pub lease: Duration,
    /// What is asked for.
    pub ask: Ask,
    /// Who holds it, kept with the grant for the operator view.
    pub label: Option<&'a HolderLabel>,
}

impl<'a> Grant<'a> {
    /// A grant of `ask` for `key` to `owner` for `lease`, with no label.
    pub fn new(key: &'a LockKey, owner: &'a OwnerToken, lease: Duration, ask: Ask) -> Self {
        Grant {
            key,
            owner,
            lease,
            ask,
            label: None,
        }
    }

    /// The same grant with `label` kept beside it.
    pub fn label(mut self, label: Option<&'a HolderLabel>) -> Self {
        self.label = label;
        self
    }

    /// The kind of lease it asks for.
    pub fn kind(&self) -> LeaseKind {
        self.ask.kind()
    }
}

/// One lease to renew in [`LockStore::renew_many`](super::LockStore::renew_many).
#[derive(Debug, Clone)]
pub struct Renewal {
    /// The key.
    pub key: LockKey,
    /// Our owner token.
    pub owner: OwnerToken,
    /// The new lease, counted from when the store applies it.
    pub lease: Duration,
    /// What the lease holds.
    pub kind: LeaseKind,
}
