//! Several keys at once ([`LockStore::grant_all`]): what a multi-key
//! grant answers, and the path every store has by default, built from the
//! single-key operations: the keys one by one in the order given (the
//! engine's fixed global order), the ones taken released again (rolled
//! back) when one is found held.

use std::time::Duration;

use super::holder::HolderLabel;
use super::{AcquireOutcome, Ask, Grant, LeaseKind, LockStore};
use crate::error::Error;
use crate::key::LockKey;
use crate::token::{FencingToken, OwnerToken, Unfenced};

/// What [`LockStore::grant_all`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AcquireAllOutcome {
    /// Every key is ours: one fencing token per key (or [`Unfenced`], from
    /// a store that mints none), in the order of the keys asked for. Each
    /// comes from its key's own counter, as a single lock's would.
    Granted(Vec<Result<FencingToken, Unfenced>>),
    /// The key at `index` (of the keys asked for) is held by someone else,
    /// and none of the keys is ours: nothing was taken, or what was taken
    /// on the way has been given back. `remaining` is that holder's
    /// remaining lease (`None`: no expiry).
    Held {
        /// Which key was found held.
        index: usize,
        /// Its holder's remaining lease.
        remaining: Option<Duration>,
    },
}

/// The default [`LockStore::grant_all`]: each key in the order given,
/// and on the first one held, the ones taken so far released again (in
/// the reverse order) before answering [`AcquireAllOutcome::Held`].
///
/// Two callers that ask for overlapping keys in the same order cannot
/// deadlock: neither waits while holding (a held key ends the attempt),
/// and the one that takes the first shared key first is the only one that
/// can go on past it. A rollback that fails answers its error: the caller
/// (the engine) then releases every key in the background, owner-checked.
pub(crate) async fn acquire_in_order<S: LockStore + ?Sized>(
    store: &S,
    keys: &[LockKey],
    owner: &OwnerToken,
    lease: Duration,
    label: Option<&HolderLabel>,
) -> Result<AcquireAllOutcome, Error> {
    let mut tokens = Vec::with_capacity(keys.len());
    for (index, key) in keys.iter().enumerate() {
        let grant = Grant::new(key, owner, lease, Ask::Lock { replay: false }).label(label);
        let outcome = match store.grant(grant).await {
            Ok(outcome) => outcome,
            Err(e) => {
                roll_back(store, &keys[..index], owner).await?;
                return Err(e);
            }
        };
        match outcome {
            AcquireOutcome::Granted(token) => tokens.push(Ok(token)),
            AcquireOutcome::GrantedUnfenced => tokens.push(Err(Unfenced)),
            AcquireOutcome::Held { remaining } => {
                roll_back(store, &keys[..index], owner).await?;
                return Ok(AcquireAllOutcome::Held { index, remaining });
            }
            AcquireOutcome::Completed(_) => {
                roll_back(store, &keys[..=index], owner).await?;
                return Err(Error::Record {
                    key: key.clone(),
                    reason: "the store answered a plain acquire with a completed record",
                });
            }
        }
    }
    Ok(AcquireAllOutcome::Granted(tokens))
}

/// Releases `taken` (owner-checked), the last taken first. The first
/// error is answered, after every key was tried.
async fn roll_back<S: LockStore + ?Sized>(
    store: &S,
    taken: &[LockKey],
    owner: &OwnerToken,
) -> Result<(), Error> {
    let mut first_error = None;
    for key in taken.iter().rev() {
        if let Err(e) = store.release(LeaseKind::Lock, key, owner).await {
            first_error.get_or_insert(e);
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// The default [`LockStore::release_all`]: each key in turn. One answer
/// per key (whether it was still ours); the first error is answered after
/// every key was tried.
pub(crate) async fn release_each<S: LockStore + ?Sized>(
    store: &S,
    keys: &[LockKey],
    owner: &OwnerToken,
) -> Result<Vec<bool>, Error> {
    let mut owned = Vec::with_capacity(keys.len());
    let mut first_error = None;
    for key in keys {
        match store.release(LeaseKind::Lock, key, owner).await {
            Ok(ours) => owned.push(ours),
            Err(e) => {
                owned.push(false);
                first_error.get_or_insert(e);
            }
        }
    }
    first_error.map_or(Ok(owned), Err)
}
