//! What an operator may learn about a lock's holder: [`HolderInfo`] (from
//! [`LockStore::inspect`](crate::LockStore::inspect)), the label a process
//! sets ([`HolderLabel`]), the opaque [`HolderId`], and a page of held
//! locks ([`HolderPage`], from [`LockStore::list`](crate::LockStore::list)).

use std::fmt;
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};

use crate::error::ConfigError;
use crate::key::LockKey;
use crate::token::{FencingToken, OwnerToken};

/// The longest label, in bytes.
pub(crate) const MAX_LABEL: usize = 128;

/// A label a holder's process stores with each grant (its hostname, pod
/// name, a request id): printable ASCII and spaces, 1 to 128 bytes, so that
/// it can be shown in a terminal or a log line as it is.
///
/// Set with [`LockerBuilder::label`](crate::LockerBuilder::label); read
/// back by [`Locker::inspect`](crate::Locker::inspect). A label is shown to
/// operators, never to HTTP clients unless a layer opts in: put nothing in
/// it that a client of another client must not see.
///
/// ```
/// use tower_redis_lock::HolderLabel;
///
/// assert_eq!(HolderLabel::new("web-7 pid 4242").unwrap().as_str(), "web-7 pid 4242");
/// assert!(HolderLabel::new("").is_err());
/// assert!(HolderLabel::new("line\nbreak").is_err());
/// assert!(HolderLabel::new("x".repeat(129)).is_err());
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct HolderLabel(Box<str>);

impl HolderLabel {
    /// Checks `label`: 1 to 128 bytes of printable ASCII (`0x20..=0x7e`).
    pub fn new(label: impl Into<String>) -> Result<Self, ConfigError> {
        let label = label.into();
        if label.is_empty() || label.len() > MAX_LABEL {
            return Err(ConfigError::new("label", "must be 1 to 128 bytes"));
        }
        if !label.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
            return Err(ConfigError::new(
                "label",
                "must be printable ASCII (no control bytes, no UTF-8 beyond ASCII)",
            ));
        }
        Ok(HolderLabel(label.into_boxed_str()))
    }

    /// The label's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A label read back from a store: kept only if it is still one a
    /// builder would accept (a store written by something else may hold
    /// anything).
    pub(crate) fn from_stored(text: &str) -> Option<Self> {
        HolderLabel::new(text).ok()
    }
}

impl fmt::Debug for HolderLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HolderLabel({:?})", &*self.0)
    }
}

impl fmt::Display for HolderLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// An opaque id of one grant's holder: 16 hex digits of a one-way hash of
/// the owner token.
///
/// The owner token is a secret (whoever has it can extend or release the
/// lock); this id cannot be used for either, and cannot be turned back
/// into the token. Two inspections of one hold show the same id; another
/// grant of the same key shows another one.
///
/// ```
/// use tower_redis_lock::{HolderId, OwnerToken};
///
/// let owner = OwnerToken::generate();
/// let id = HolderId::of(&owner);
/// assert_eq!(id, HolderId::of(&owner));
/// assert_eq!(id.as_str().len(), 16);
/// assert!(!owner.as_str().contains(id.as_str()));
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct HolderId([u8; 16]);

impl HolderId {
    /// The id of the holder with `owner`.
    pub fn of(owner: &OwnerToken) -> Self {
        HolderId::of_text(owner.as_str())
    }

    /// The id of an owner token read back from a store as text.
    pub(crate) fn of_text(owner: &str) -> Self {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let digest = Sha256::new()
            .chain_update(b"tower-redis-lock holder id\0")
            .chain_update(owner.as_bytes())
            .finalize();
        let mut hex = [0u8; 16];
        for (pair, b) in hex.chunks_exact_mut(2).zip(digest.iter()) {
            pair[0] = HEX[usize::from(b >> 4)];
            pair[1] = HEX[usize::from(b & 0xf)];
        }
        HolderId(hex)
    }

    /// The id as 16 lowercase hex digits.
    pub fn as_str(&self) -> &str {
        // Only ASCII hex digits are ever stored.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl fmt::Debug for HolderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HolderId({})", self.as_str())
    }
}

impl fmt::Display for HolderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who holds a lock, as the store knows it (see
/// [`Locker::inspect`](crate::Locker::inspect)).
///
/// Fields the store could not know are `None`: a lock written by something
/// else than this crate has no holder record (no label, token or grant
/// time); an unfenced [`RedisStore`](crate::RedisStore)
/// ([`fencing(false)`](crate::RedisStoreBuilder::fencing)) keeps its grant
/// one plain `SET` and stores no holder record either.
///
/// There is no re-entry count: re-entering a hold
/// ([`LockGuard::reenter`](crate::LockGuard::reenter), a nested layer)
/// happens in the holder's process and sends nothing to the store, so no
/// other process can know it. `Locker::renewing` (feature `test-util`)
/// and [`Locker::status`](crate::Locker::status) count a process's own
/// holds.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HolderInfo {
    /// The lock.
    pub key: LockKey,
    /// The holder's opaque id (never its owner token).
    pub holder: HolderId,
    /// The label the holder's process set, if any.
    pub label: Option<HolderLabel>,
    /// The grant's fencing token, when the store mints them.
    pub fencing_token: Option<FencingToken>,
    /// When the store granted it, on the store's clock (Redis `TIME`).
    pub granted_at: Option<SystemTime>,
    /// The lease left, `None` when the key has no expiry (written by
    /// something else).
    pub remaining: Option<Duration>,
    /// Whether a waiter marked the lock (someone found it held and waits
    /// for its release).
    pub waiters: bool,
}

impl HolderInfo {
    /// What a store knows at least: the lock and its holder; the rest
    /// unknown (set the public fields a store does know). For a
    /// [`LockStore`](crate::LockStore) of another crate, which cannot
    /// build this non-exhaustive struct with a literal.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redis_lock::{HolderId, HolderInfo, LockKey, OwnerToken};
    ///
    /// let mut info = HolderInfo::new(LockKey::new("jobs", "1")?, HolderId::of(&OwnerToken::generate()));
    /// info.remaining = Some(Duration::from_secs(5));
    /// assert_eq!(info.label, None);
    /// # Ok::<(), tower_redis_lock::KeyError>(())
    /// ```
    pub fn new(key: LockKey, holder: HolderId) -> Self {
        HolderInfo {
            key,
            holder,
            label: None,
            fencing_token: None,
            granted_at: None,
            remaining: None,
            waiters: false,
        }
    }
}

/// Where a listing goes on: [`HolderPage::next`] of the page before, or
/// [`ListCursor::start`] for the first page.
///
/// Opaque; it names a position in the store's own scan (on a Cluster, the
/// primary and the position in that primary's scan).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ListCursor(pub(crate) String);

impl ListCursor {
    /// The first page.
    pub fn start() -> Self {
        ListCursor::default()
    }

    /// A cursor as text (for a URL or a CLI argument); read back with
    /// [`parse`](ListCursor::parse).
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A cursor from its text: `None` when it is not one (at most 512
    /// bytes of `0-9 a-z A-Z . : -`).
    pub fn parse(text: &str) -> Option<Self> {
        let ok = text.len() <= 512
            && text
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b':' | b'-'));
        ok.then(|| ListCursor(text.to_owned()))
    }
}

/// One page of a namespace's held locks (see
/// [`Locker::list`](crate::Locker::list)).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct HolderPage {
    /// The locks found on this page: at most about the count asked for (a
    /// Redis `SCAN` step may answer a few more), possibly none while the
    /// listing goes on.
    pub locks: Vec<HolderInfo>,
    /// Where the listing goes on; `None` when it is done.
    pub next: Option<ListCursor>,
}

impl HolderPage {
    /// A page of `locks`, going on at `next` (`None`: the listing is done).
    pub fn new(locks: Vec<HolderInfo>, next: Option<ListCursor>) -> Self {
        HolderPage { locks, next }
    }
}

/// What [`force_release`](crate::Locker::force_release) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ForcedRelease {
    /// Whether a lock was there to remove.
    pub released: bool,
    /// With fencing, a token above every token issued for the lock so
    /// far, to which the store raised the lock's fencing counter: every
    /// later grant's token is larger. Present it to a fenced resource
    /// ([`FencedResource::raise`](crate::FencedResource::raise), or the
    /// `fencing_token` column of your table) to refuse the old holder's
    /// writes at once, before a new holder writes.
    pub fence: Option<FencingToken>,
}

impl ForcedRelease {
    /// Whether a lock was removed, and the fence raised, if any.
    pub fn new(released: bool, fence: Option<FencingToken>) -> Self {
        ForcedRelease { released, fence }
    }
}

/// The text a holder record keeps: `<token> <granted µs> <label>` (the
/// Redis stores' layout, after the owner token and a space in the lock's
/// value; the label is last, so it may hold spaces; the memory store keeps
/// the fields).
pub(crate) fn parse_record(
    record: &str,
) -> (
    Option<FencingToken>,
    Option<SystemTime>,
    Option<HolderLabel>,
) {
    let mut parts = record.splitn(3, ' ');
    let token = parts
        .next()
        .and_then(|t| t.parse::<u64>().ok())
        .filter(|&t| t > 0)
        .map(FencingToken::new);
    let granted = parts
        .next()
        .and_then(|t| t.parse::<u64>().ok())
        .map(|us| SystemTime::UNIX_EPOCH + Duration::from_micros(us));
    let label = parts.next().and_then(HolderLabel::from_stored);
    (token, granted, label)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_its_fields() {
        let (t, g, l) = parse_record("1700000000000001 1700000000000000 web-7 pid 42");
        assert_eq!(t, Some(FencingToken::new(1_700_000_000_000_001)));
        assert_eq!(
            g,
            Some(SystemTime::UNIX_EPOCH + Duration::from_micros(1_700_000_000_000_000))
        );
        assert_eq!(l.as_ref().map(HolderLabel::as_str), Some("web-7 pid 42"));
        assert_eq!(
            parse_record("5 6 "),
            (
                Some(FencingToken::new(5)),
                Some(SystemTime::UNIX_EPOCH + Duration::from_micros(6)),
                None
            )
        );
        assert_eq!(parse_record("garbage"), (None, None, None));
    }

    #[test]
    fn cursors_round_trip_and_refuse_odd_text() {
        let c = ListCursor("n2:1234".into());
        assert_eq!(ListCursor::parse(c.as_str()), Some(c));
        assert_eq!(ListCursor::parse("a b"), None);
        assert_eq!(ListCursor::parse(&"1".repeat(513)), None);
    }
}
