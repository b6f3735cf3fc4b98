//! A held lease handed to another task or process: [`ExportedLease`],
//! made by [`LockGuard::export`](crate::LockGuard::export) and taken up by
//! [`Locker::resume`](crate::Locker::resume) (`resume.rs`).

use std::fmt;
use std::time::{Duration, SystemTime};

use crate::key::LockKey;
use crate::token::{FencingToken, OwnerToken, Unfenced};

/// A held lock, given up by its guard ([`LockGuard::export`](crate::LockGuard::export)) so that
/// another task or process can go on holding it
/// ([`Locker::resume`](crate::Locker::resume)): the key, the owner token, the fencing token, the
/// lease length and the deadline by which it must be resumed.
///
/// Nothing renews the lock between the export and the resume: it stays
/// in the store until its lease runs out. A worker that never resumes it
/// (it died, the job was lost) lets it lapse then, and the next caller
/// takes the key.
///
/// # A capability
///
/// The owner token inside is the secret every write to the lock checks:
/// whoever has this value can renew, release or finish the lock — and,
/// on a key of an idempotent layer, store the answer every later
/// duplicate gets. Treat it like a credential: pass it only over channels
/// you trust (your job queue, not a client, a URL or a log). `Debug`
/// prints no owner token. The fencing token inside is taken as it is
/// given (the store keeps none to compare it with): a forged value that
/// also carries the real owner token could claim a higher token; a forged
/// value without it gets nothing.
///
/// With the `serde` feature it serializes as
/// `{"key","owner","fencing_token","lease_ms","deadline_ms"}` (the
/// deadline in milliseconds since the Unix epoch; `fencing_token` is
/// `null` for an unfenced lock), and reading it back checks every field.
///
/// ```
/// use std::time::Duration;
/// use tower_redis_lock::{LockKey, Locker, MemoryStore};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower_redis_lock::Error> {
/// let store = MemoryStore::new();
/// let web = Locker::new(store.clone());
/// let worker = Locker::new(store); // another process, on the same store
///
/// let key = LockKey::new("exports", "report-7")?;
/// let guard = web.acquire(&key).await?;
/// let token = guard.fencing_token();
/// let lease = guard.export()?; // no renewal here from now on
///
/// let resumed = worker.resume(lease).await?; // checked with the store
/// assert!(resumed.is_held());
/// assert_eq!(resumed.fencing_token(), token);
/// assert!(web.try_acquire(&key).await.is_err(), "still held, by the worker");
/// resumed.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, PartialEq, Eq)]
#[must_use = "an exported lease that is never resumed is a lock left to lapse at its lease"]
pub struct ExportedLease {
    pub(crate) key: LockKey,
    pub(crate) owner: OwnerToken,
    pub(crate) token: Result<FencingToken, Unfenced>,
    pub(crate) lease: Duration,
    pub(crate) deadline: SystemTime,
}

impl ExportedLease {
    /// The lock's key.
    pub fn key(&self) -> &LockKey {
        &self.key
    }

    /// The fencing token of the grant (the resumed guard has the same).
    pub fn fencing_token(&self) -> Result<FencingToken, Unfenced> {
        self.token
    }

    /// The lease length a resumed guard keeps renewing.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// When the lease ends unless it is resumed first, on the wall clock
    /// of the process that exported it (another machine's clock may
    /// differ: [`Locker::resume`](crate::Locker::resume) asks the store, never this clock).
    pub fn deadline(&self) -> SystemTime {
        self.deadline
    }
}

impl fmt::Debug for ExportedLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExportedLease")
            .field("key", &self.key)
            .field("owner", &self.owner)
            .field("fencing_token", &self.token)
            .field("lease", &self.lease)
            .field("deadline", &self.deadline)
            .finish()
    }
}

#[cfg(feature = "serde")]
mod wire {
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use super::ExportedLease;
    use crate::engine::options::{MAX_LEASE, MIN_LEASE};
    use crate::key::LockKey;
    use crate::token::{FencingToken, OwnerToken, Unfenced};

    /// The serialized form: plain fields, checked on the way in.
    #[derive(serde::Serialize, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    pub(super) struct Wire {
        key: String,
        owner: String,
        fencing_token: Option<FencingToken>,
        lease_ms: u64,
        deadline_ms: u64,
    }

    impl From<ExportedLease> for Wire {
        fn from(l: ExportedLease) -> Wire {
            Wire {
                key: l.key.as_str().to_owned(),
                owner: l.owner.as_str().to_owned(),
                fencing_token: l.token.ok(),
                lease_ms: u64::try_from(l.lease.as_millis()).unwrap_or(u64::MAX),
                deadline_ms: l
                    .deadline
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            }
        }
    }

    impl TryFrom<Wire> for ExportedLease {
        type Error = String;

        fn try_from(w: Wire) -> Result<ExportedLease, String> {
            let key = LockKey::from_stored(&w.key).map_err(|e| e.to_string())?;
            let owner = OwnerToken::from_hex(&w.owner)
                .ok_or("an owner token is 32 lowercase hex digits")?;
            let lease = Duration::from_millis(w.lease_ms);
            if !(MIN_LEASE..=MAX_LEASE).contains(&lease) {
                return Err(format!(
                    "a lease of {} ms (a locker takes 10 ms to 24 h)",
                    w.lease_ms
                ));
            }
            Ok(ExportedLease {
                key,
                owner,
                token: w.fencing_token.ok_or(Unfenced),
                lease,
                deadline: UNIX_EPOCH
                    .checked_add(Duration::from_millis(w.deadline_ms))
                    .unwrap_or(SystemTime::UNIX_EPOCH),
            })
        }
    }
}

/// The fields as plain values (the owner token as its hex text: see
/// [the warning](ExportedLease#a-capability)).
#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
impl serde::Serialize for ExportedLease {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serde::Serialize::serialize(&wire::Wire::from(self.clone()), serializer)
    }
}

/// Every field checked: a key `LockKey` could have made, an owner token
/// of 32 lowercase hex digits, a fencing token other than 0, a lease
/// above 0.
///
/// ```
/// use tower_redis_lock::{ExportedLease, LockKey, Locker, MemoryStore};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let locker = Locker::new(MemoryStore::new());
/// let guard = locker.acquire(&LockKey::new("jobs", "42")?).await?;
/// let text = serde_json::to_string(&guard.export()?)?;
/// let back: ExportedLease = serde_json::from_str(&text)?;
/// assert_eq!(back.key().as_str(), "jobs:42");
/// assert!(serde_json::from_str::<ExportedLease>(&text.replace("jobs:42", "jobs:{42}")).is_err());
/// # Ok(())
/// # }
/// ```
#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
impl<'de> serde::Deserialize<'de> for ExportedLease {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let wire = <wire::Wire as serde::Deserialize>::deserialize(deserializer)?;
        ExportedLease::try_from(wire).map_err(serde::de::Error::custom)
    }
}
