//! Lock keys: what a lock is named, and how that name reaches Redis safely.

use std::fmt;
use std::sync::Arc;

use sha2::{Digest, Sha256};

/// Longest id kept verbatim; longer ids are hashed.
pub(crate) const MAX_VERBATIM_ID: usize = 128;
/// Longest namespace accepted.
pub(crate) const MAX_NAMESPACE: usize = 64;

/// The name of one lock: a namespace chosen by the developer plus an id that
/// may come from a client (path segment, header, JSON body field).
///
/// The id can never pick the Redis hash tag, grow a key without bound, or put
/// control bytes on the wire:
///
/// * ids of 1 to 128 printable ASCII bytes, without `{`, `}` and not starting
///   with `~`, are kept verbatim (readable in `redis-cli` and in logs);
/// * every other non-empty id is replaced by `~` and the first 128 bits of its
///   SHA-256, in hex, so the key length stays bounded and two different ids
///   can only share a key through a SHA-256 collision;
/// * an empty id is rejected ([`KeyError`]).
///
/// The namespace (1 to 64 bytes of `A-Z a-z 0-9 _ - . /`) keeps two routes
/// or two kinds of work from sharing locks by accident.
///
/// ```
/// use tower_redis_lock::LockKey;
///
/// let key = LockKey::new("orders", "ord_123").unwrap();
/// assert_eq!(key.to_string(), "orders:ord_123");
///
/// // Odd or long ids are hashed; the result is still stable.
/// let odd = LockKey::new("orders", "a}b{c").unwrap();
/// assert!(odd.id().starts_with('~'));
/// assert_eq!(odd, LockKey::new("orders", "a}b{c").unwrap());
///
/// assert!(LockKey::new("orders", "").is_err());
/// assert!(LockKey::new("bad namespace", "x").is_err());
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct LockKey {
    /// `namespace:id`, both parts already validated or hashed.
    full: Arc<str>,
    ns_len: usize,
}

impl LockKey {
    /// Builds a key from a namespace and an id (any bytes).
    pub fn new(namespace: &str, id: impl AsRef<[u8]>) -> Result<Self, KeyError> {
        validate_name(namespace, false)?;
        let id = id.as_ref();
        if id.is_empty() {
            return Err(KeyError {
                reason: "the lock id is empty",
            });
        }
        let verbatim = id.len() <= MAX_VERBATIM_ID
            && id[0] != b'~'
            && id
                .iter()
                .all(|&b| (0x21..=0x7e).contains(&b) && b != b'{' && b != b'}');
        let mut full = String::with_capacity(namespace.len() + 1 + MAX_VERBATIM_ID.min(id.len()));
        full.push_str(namespace);
        full.push(':');
        if verbatim {
            // All bytes are printable ASCII, so this is valid UTF-8.
            full.extend(id.iter().map(|&b| b as char));
        } else {
            full.push('~');
            push_hex(&mut full, &Sha256::digest(id)[..16]);
        }
        Ok(LockKey {
            full: full.into(),
            ns_len: namespace.len(),
        })
    }

    /// A key from its stored form `namespace:id` (as [`as_str`](LockKey::as_str)
    /// writes it), checked to be one that [`new`](LockKey::new) makes: a
    /// valid namespace, and an id that is verbatim-safe or `~` and 32 hex
    /// digits. (For an exported lease read back from elsewhere.)
    #[cfg_attr(not(feature = "serde"), allow(dead_code))]
    pub(crate) fn from_stored(full: &str) -> Result<Self, KeyError> {
        let (namespace, id) = full.split_once(':').ok_or(KeyError {
            reason: "not a stored lock key (namespace:id)",
        })?;
        Self::from_shown(namespace, id)
    }

    /// The key whose [`id`](LockKey::id) is `id`, as logs, errors and
    /// listings ([`Locker::list`](crate::Locker::list)) show it: a verbatim
    /// id, or `~` and the hash of a long or odd one (which
    /// [`new`](LockKey::new) would hash again). For operators, who find a
    /// lock by what they were shown.
    ///
    /// ```
    /// use tower_redis_lock::LockKey;
    ///
    /// let long = LockKey::new("orders", "x".repeat(300))?;
    /// assert!(long.is_hashed());
    /// assert_eq!(LockKey::from_shown("orders", long.id())?, long);
    /// assert_eq!(LockKey::from_shown("orders", "42")?, LockKey::new("orders", "42")?);
    /// assert!(LockKey::from_shown("orders", "~not-a-hash").is_err());
    /// # Ok::<(), tower_redis_lock::KeyError>(())
    /// ```
    pub fn from_shown(namespace: &str, id: &str) -> Result<Self, KeyError> {
        validate_name(namespace, false)?;
        // `new` writes the hash in lowercase hex.
        let hashed = id.len() == 33
            && id.starts_with('~')
            && id[1..]
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        let verbatim = !id.is_empty()
            && id.len() <= MAX_VERBATIM_ID
            && !id.starts_with('~')
            && id
                .bytes()
                .all(|b| (0x21..=0x7e).contains(&b) && b != b'{' && b != b'}');
        if !(hashed || verbatim) {
            return Err(KeyError {
                reason: "not an id as this crate shows it (verbatim, or `~` and 32 hex digits)",
            });
        }
        Ok(LockKey {
            full: format!("{namespace}:{id}").into(),
            ns_len: namespace.len(),
        })
    }

    /// The namespace part.
    pub fn namespace(&self) -> &str {
        &self.full[..self.ns_len]
    }

    /// The id part as it reaches Redis and the logs: verbatim, or `~` and a
    /// hash.
    pub fn id(&self) -> &str {
        &self.full[self.ns_len + 1..]
    }

    /// `namespace:id`, the form used in logs, errors and problem details.
    pub fn as_str(&self) -> &str {
        &self.full
    }

    /// Whether the id was replaced by its hash.
    pub fn is_hashed(&self) -> bool {
        self.id().starts_with('~')
    }
}

impl fmt::Display for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.full)
    }
}

impl fmt::Debug for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LockKey({:?})", &*self.full)
    }
}

/// Why a [`LockKey`] could not be built: an empty id, or a namespace (or a
/// store's key prefix) outside its alphabet or length.
///
/// Converts into [`Error::InvalidKey`](crate::Error::InvalidKey), so `?`
/// works in a function that returns the crate's [`Error`](crate::Error).
///
/// ```
/// use tower_redis_lock::{Error, LockKey};
///
/// let err = LockKey::new("orders", "").unwrap_err();
/// assert_eq!(err.reason(), "the lock id is empty");
/// assert!(matches!(Error::from(err), Error::InvalidKey { .. }));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyError {
    reason: &'static str,
}

impl KeyError {
    /// What is wrong with the namespace or id.
    pub fn reason(&self) -> &'static str {
        self.reason
    }
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid lock key: {}", self.reason)
    }
}

impl std::error::Error for KeyError {}

/// Checks a namespace (1..=64 bytes of `A-Za-z0-9_-./`) or, with
/// `colon`, a store's key prefix (the same, plus `:`). A namespace has no `:`
/// so that `namespace:id` splits one way only.
pub(crate) fn validate_name(name: &str, colon: bool) -> Result<(), KeyError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAMESPACE
        && name.bytes().all(|b| {
            b.is_ascii_alphanumeric()
                || matches!(b, b'_' | b'-' | b'.' | b'/')
                || (colon && b == b':')
        });
    match (ok, colon) {
        (true, _) => Ok(()),
        (false, false) => Err(KeyError {
            reason: "a namespace must be 1 to 64 bytes of A-Z a-z 0-9 _ - . /",
        }),
        (false, true) => Err(KeyError {
            reason: "a key prefix must be 1 to 64 bytes of A-Z a-z 0-9 _ - . / :",
        }),
    }
}

/// A valid namespace made from any `text` (a route template, say): bytes
/// outside `A-Z a-z 0-9 _ - . /` become `_`, an empty result is `_`, and a
/// result over 64 bytes keeps its first 47 bytes, then `.` and 16
/// hex digits of the SHA-256 of `identity` (the whole original), so two
/// long texts that share a beginning still get two namespaces.
#[cfg_attr(not(feature = "axum"), allow(dead_code))]
pub(crate) fn namespace_from(text: &str, identity: &[u8]) -> String {
    let mut ns: String = text
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'/') {
                b as char
            } else {
                '_'
            }
        })
        .collect();
    if ns.is_empty() {
        ns.push('_');
    }
    if ns.len() > MAX_NAMESPACE {
        ns.truncate(MAX_NAMESPACE - 17);
        ns.push('.');
        push_hex(&mut ns, &Sha256::digest(identity)[..8]);
    }
    ns
}

pub(crate) fn push_hex(out: &mut String, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for &b in bytes {
        out.push(HEX[(b >> 4) as usize] as char);
        out.push(HEX[(b & 15) as usize] as char);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbatim_ids_stay_readable() {
        let k = LockKey::new("jobs", "evt_1Nq-9.x:y").unwrap();
        assert_eq!(k.as_str(), "jobs:evt_1Nq-9.x:y");
        assert_eq!(k.namespace(), "jobs");
        assert_eq!(k.id(), "evt_1Nq-9.x:y");
        assert!(!k.is_hashed());
    }

    #[test]
    fn braces_control_bytes_spaces_and_unicode_are_hashed() {
        for id in [
            &b"a{b}"[..],
            b"}",
            b"{",
            b"a\r\nSET x y",
            b"a b",
            b"\0",
            "caf\u{e9}".as_bytes(),
            b"~abc",
        ] {
            let k = LockKey::new("ns", id).unwrap();
            assert!(k.is_hashed(), "{id:?}");
            assert_eq!(k.id().len(), 33);
            assert!(
                k.as_str()
                    .bytes()
                    .all(|b| (0x21..=0x7e).contains(&b) && b != b'{' && b != b'}')
            );
        }
    }

    #[test]
    fn long_ids_are_hashed_and_bounded() {
        let at_limit = "x".repeat(MAX_VERBATIM_ID);
        assert!(!LockKey::new("ns", &at_limit).unwrap().is_hashed());
        let over = "x".repeat(MAX_VERBATIM_ID + 1);
        let k = LockKey::new("ns", &over).unwrap();
        assert!(k.is_hashed());
        assert!(k.as_str().len() <= MAX_NAMESPACE + 1 + MAX_VERBATIM_ID);
        let huge = vec![b'y'; 1 << 20];
        assert_eq!(LockKey::new("ns", &huge).unwrap().id().len(), 33);
    }

    #[test]
    fn distinct_ids_give_distinct_keys() {
        let a = LockKey::new("ns", "~").unwrap();
        let b = LockKey::new("ns", "~~").unwrap();
        let hashed_form = LockKey::new("ns", "a b").unwrap();
        // An id that spells out another id's hashed form is hashed itself.
        let forged = LockKey::new("ns", hashed_form.id()).unwrap();
        assert_ne!(a, b);
        assert_ne!(forged, hashed_form);
        // `namespace:id` splits one way only.
        assert!(LockKey::new("a", "b:c").is_ok());
        assert!(LockKey::new("a:b", "c").is_err());
    }

    #[test]
    fn a_stored_key_reads_back_as_the_same_key_and_nothing_else_does() {
        for id in [&b"evt_1"[..], b"a b", b"~abc", &[b'x'; 200]] {
            let k = LockKey::new("ns", id).unwrap();
            assert_eq!(LockKey::from_stored(k.as_str()).unwrap(), k);
        }
        for bad in [
            "ns",
            "ns:",
            "bad ns:x",
            "ns:a b",
            "ns:{x}",
            "ns:~abc",
            "ns:~0123456789abcdef0123456789ABCDEF",
        ] {
            assert!(LockKey::from_stored(bad).is_err(), "{bad}");
        }
    }

    proptest::proptest! {
        /// Every key `new` makes reads back as itself, and whatever reads
        /// back is a key `new` could have made, spelled as it is.
        #[test]
        fn stored_keys_read_back_as_themselves_only(
            id in proptest::collection::vec(proptest::prelude::any::<u8>(), 1..200),
            text in "([a-z./_-]{1,8}|.{0,6}):(~[0-9a-fA-F]{30,34}|[ -~]{0,130}|.{0,8})",
        ) {
            let k = LockKey::new("ns", &id).unwrap();
            proptest::prop_assert_eq!(LockKey::from_stored(k.as_str()).unwrap(), k);
            if let Ok(read) = LockKey::from_stored(&text) {
                proptest::prop_assert_eq!(read.as_str(), text.as_str());
                if !read.is_hashed() {
                    proptest::prop_assert_eq!(
                        LockKey::new(read.namespace(), read.id()).unwrap(),
                        read
                    );
                }
            }
        }
    }

    #[test]
    fn bad_namespaces_and_empty_ids_are_rejected() {
        assert!(LockKey::new("", "x").is_err());
        assert!(LockKey::new("a{b}", "x").is_err());
        assert!(LockKey::new("a b", "x").is_err());
        assert!(LockKey::new(&"n".repeat(MAX_NAMESPACE + 1), "x").is_err());
        assert!(matches!(
            LockKey::new("ns", ""),
            Err(KeyError {
                reason: "the lock id is empty"
            })
        ));
    }

    #[test]
    fn namespaces_made_from_text_are_valid_readable_and_distinct() {
        let route = "/orders/{id}/capture";
        let ns = namespace_from(route.trim_start_matches('/'), route.as_bytes());
        assert_eq!(ns, "orders/_id_/capture");
        assert_eq!(namespace_from("", b""), "_");
        let a = format!("{}/a", "x".repeat(80));
        let b = format!("{}/b", "x".repeat(80));
        let (na, nb) = (
            namespace_from(&a, a.as_bytes()),
            namespace_from(&b, b.as_bytes()),
        );
        assert_ne!(na, nb, "long texts that share a beginning");
        for ns in [&ns, &na, &nb] {
            assert!(ns.len() <= MAX_NAMESPACE, "{ns}");
            assert!(validate_name(ns, false).is_ok(), "{ns}");
        }
        assert!(na.starts_with(&"x".repeat(MAX_NAMESPACE - 17)));
    }
}
