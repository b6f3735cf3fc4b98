//! Owner tokens (who holds a lock) and fencing tokens (which grant it was).

use std::fmt;

use crate::key::push_hex;

/// A secret that identifies one holder of one lock: 128 bits from the OS
/// random source, written as 32 lowercase hex characters.
///
/// Every write to a lock compares it (compare-and-delete release,
/// compare-and-pexpire extend), so a holder whose lease ran out can never
/// touch a newer holder's lock. It is never logged and never sent to a
/// client: `Debug` prints `OwnerToken(..)` and there is no `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct OwnerToken {
    hex: [u8; 32],
}

impl OwnerToken {
    /// Length of [`OwnerToken::as_str`].
    pub const LEN: usize = 32;

    /// Draws a fresh token from the OS random source.
    ///
    /// # Panics
    ///
    /// Only if the operating system cannot provide randomness at all, which
    /// `getrandom` treats as unrecoverable on the platforms tokio supports.
    pub fn generate() -> Self {
        let mut raw = [0u8; 16];
        // The OS source failing is not something a lock can work around:
        // locking with a guessable owner token would be unsafe.
        #[allow(clippy::expect_used)]
        getrandom::fill(&mut raw).expect("the OS random source failed");
        let mut s = String::with_capacity(32);
        push_hex(&mut s, &raw);
        let mut hex = [0u8; 32];
        hex.copy_from_slice(s.as_bytes());
        OwnerToken { hex }
    }

    /// The token as stores write it. Treat it as a secret.
    pub fn as_str(&self) -> &str {
        // Only ASCII hex digits are ever stored.
        std::str::from_utf8(&self.hex).unwrap_or_default()
    }
}

impl fmt::Debug for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("OwnerToken(..)")
    }
}

/// A fencing token: strictly increasing per lock key across every grant of
/// that key, including after release and expiry.
///
/// Pass it to the resource you protect and let the resource refuse writes
/// that carry a token lower than one it has already seen (see
/// [`FencedResource`](crate::FencedResource)); only the resource can enforce it.
///
/// Redis stores mint it as `max(last + 1, Redis TIME in µs)` in the same
/// script that grants the lock, so tokens keep growing even after the
/// per-key counter's retention lapses. They fit in `i64` (and in a
/// JavaScript number) for the next two centuries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(u64);

impl FencingToken {
    /// Wraps a raw value (for stores and for tests).
    pub const fn new(value: u64) -> Self {
        FencingToken(value)
    }

    /// The raw value.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// Why a [`LockGuard`](crate::LockGuard) has no fencing token: its store
/// grants without fencing ([`RedisStore::with_fencing`](crate::RedisStore::with_fencing)`(false)`,
/// for efficiency locks that guard no resource able to check a token).
/// The error of [`LockGuard::fencing_token`](crate::LockGuard::fencing_token)
/// for such a lock: there is no token, not a token of zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Unfenced;

impl fmt::Display for Unfenced {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the lock was granted without fencing: its store mints no fencing tokens")
    }
}

impl std::error::Error for Unfenced {}

impl From<FencingToken> for u64 {
    fn from(t: FencingToken) -> u64 {
        t.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_tokens_are_random_hex_and_redacted() {
        let a = OwnerToken::generate();
        let b = OwnerToken::generate();
        assert_ne!(a, b);
        assert_eq!(a.as_str().len(), OwnerToken::LEN);
        assert!(a.as_str().bytes().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(format!("{a:?}"), "OwnerToken(..)");
        assert!(!format!("{a:?}").contains(a.as_str()));
    }

    #[test]
    fn fencing_tokens_order_and_print() {
        assert!(FencingToken::new(2) > FencingToken::new(1));
        assert_eq!(FencingToken::new(42).to_string(), "42");
        assert_eq!(u64::from(FencingToken::new(7)), 7);
    }
}
