//! Owner tokens (who holds a lock) and fencing tokens (which grant it was).

use std::fmt;

const HEX_DIGITS: &[u8; 16] = b"0123456789abcdef";

/// A secret that identifies one holder of one lock: 128 bits from the OS
/// random source, written as 32 lowercase hex characters.
///
/// Every write to a lock compares it (compare-and-delete release,
/// compare-and-pexpire extend), so a holder whose lease ran out can never
/// touch a newer holder's lock. It is never logged and never sent to a
/// client: `Debug` prints `OwnerToken(..)` and there is no `Display`.
#[derive(Clone, PartialEq, Eq, Hash)]
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
        Self::from_u128(u128::from_be_bytes(raw))
    }

    /// The token whose 128 bits are `n` (a writer's waiting mark: see
    /// `Ask::Write`).
    pub(crate) fn from_u128(n: u128) -> Self {
        let mut hex = [0u8; 32];
        for (pair, b) in hex.chunks_exact_mut(2).zip(n.to_be_bytes()) {
            pair[0] = HEX_DIGITS[usize::from(b >> 4)];
            pair[1] = HEX_DIGITS[usize::from(b & 15)];
        }
        OwnerToken { hex }
    }

    /// A token from its text (32 lowercase hex digits, as
    /// [`as_str`](OwnerToken::as_str) writes it), for an exported lease
    /// read back from elsewhere.
    #[cfg_attr(not(feature = "serde"), allow(dead_code))]
    pub(crate) fn from_hex(text: &str) -> Option<Self> {
        let hex: [u8; 32] = text.as_bytes().try_into().ok()?;
        hex.iter()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
            .then_some(OwnerToken { hex })
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
///
/// Stores never mint 0: it is left for "never written" (the SQL column's
/// default in README's snippet), below every real token.
///
/// For an SQL `BIGINT` column, convert with the checked
/// [`TryFrom<FencingToken> for i64`](#impl-TryFrom%3CFencingToken%3E-for-i64)
/// (a token above `i64::MAX` is an error, never a wrapped negative number):
///
/// ```
/// use tower_redis_lock::{FencingToken, TokenRangeError};
///
/// let token = FencingToken::new(1_764_000_000_000_001);
/// let bound: i64 = token.try_into()?;
/// assert_eq!(bound, 1_764_000_000_000_001);
///
/// let err = i64::try_from(FencingToken::new(u64::MAX)).unwrap_err();
/// assert_eq!(err.token(), FencingToken::new(u64::MAX));
/// # Ok::<(), TokenRangeError>(())
/// ```
///
/// With the `serde` feature it serializes as a plain number, and
/// deserializing refuses 0 (never a minted token).
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
/// grants without fencing ([`RedisStoreBuilder::fencing`](crate::RedisStoreBuilder::fencing)`(false)`,
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

/// A [`FencingToken`] too large for the integer type asked for (an SQL
/// `BIGINT` is `i64`: tokens above `i64::MAX` do not fit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenRangeError {
    token: FencingToken,
}

impl TokenRangeError {
    /// The token that did not fit.
    pub fn token(&self) -> FencingToken {
        self.token
    }
}

impl fmt::Display for TokenRangeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "fencing token {} does not fit in i64 (an SQL BIGINT): it is above {}",
            self.token.0,
            i64::MAX
        )
    }
}

impl std::error::Error for TokenRangeError {}

/// Checked: tokens above `i64::MAX` are a [`TokenRangeError`], never a
/// negative number.
impl TryFrom<FencingToken> for i64 {
    type Error = TokenRangeError;

    fn try_from(t: FencingToken) -> Result<i64, TokenRangeError> {
        i64::try_from(t.0).map_err(|_| TokenRangeError { token: t })
    }
}

/// A plain number (`u64`).
#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
impl serde::Serialize for FencingToken {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(self.0)
    }
}

/// From a plain number; 0 is refused (stores never mint it).
///
/// ```
/// use tower_redis_lock::FencingToken;
///
/// let token: FencingToken = serde_json::from_str("1764000000000001")?;
/// assert_eq!(token, FencingToken::new(1_764_000_000_000_001));
/// assert_eq!(serde_json::to_string(&token)?, "1764000000000001");
/// assert!(serde_json::from_str::<FencingToken>("0").is_err());
/// assert!(serde_json::from_str::<FencingToken>("-1").is_err());
/// # Ok::<(), serde_json::Error>(())
/// ```
#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
impl<'de> serde::Deserialize<'de> for FencingToken {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match <u64 as serde::Deserialize>::deserialize(deserializer)? {
            0 => Err(serde::de::Error::invalid_value(
                serde::de::Unexpected::Unsigned(0),
                &"a fencing token (stores never mint 0)",
            )),
            n => Ok(FencingToken(n)),
        }
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
    fn an_owner_token_reads_back_from_its_text_only() {
        let a = OwnerToken::generate();
        assert_eq!(OwnerToken::from_hex(a.as_str()), Some(a.clone()));
        let upper = a.as_str().to_ascii_uppercase();
        for bad in [
            "",
            "abc",
            &upper,
            &format!("{}0", a.as_str()),
            &"g".repeat(32),
        ] {
            assert!(
                OwnerToken::from_hex(bad).is_none() || bad == a.as_str(),
                "{bad}"
            );
        }
    }

    #[test]
    fn fencing_tokens_order_and_print() {
        assert!(FencingToken::new(2) > FencingToken::new(1));
        assert_eq!(FencingToken::new(42).to_string(), "42");
        assert_eq!(u64::from(FencingToken::new(7)), 7);
    }

    #[test]
    fn tokens_convert_to_i64_checked() {
        assert_eq!(i64::try_from(FencingToken::new(7)), Ok(7));
        let max = i64::MAX as u64;
        assert_eq!(i64::try_from(FencingToken::new(max)), Ok(i64::MAX));
        let err = i64::try_from(FencingToken::new(max + 1)).unwrap_err();
        assert_eq!(err.token(), FencingToken::new(max + 1));
        let msg = err.to_string();
        assert!(
            msg.contains("9223372036854775808") && msg.contains("i64"),
            "{msg}"
        );
        assert!(i64::try_from(FencingToken::new(u64::MAX)).is_err());
    }

    #[cfg(feature = "serde")]
    #[test]
    fn tokens_serialize_as_numbers_and_zero_is_refused() {
        let t = FencingToken::new(1_764_000_000_000_001);
        assert_eq!(serde_json::to_string(&t).unwrap(), "1764000000000001");
        let back: FencingToken = serde_json::from_str("1764000000000001").unwrap();
        assert_eq!(back, t);
        let err = serde_json::from_str::<FencingToken>("0").unwrap_err();
        assert!(err.to_string().contains("never mint 0"), "{err}");
        assert!(serde_json::from_str::<FencingToken>("\"5\"").is_err());
    }
}
