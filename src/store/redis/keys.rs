//! Redis names of a lock: its key, record, release channel and its
//! bucket's fencing counter, all under one hash tag.

use super::RedisStore;
use crate::key::LockKey;

pub(super) const LOCK: &str = "lock";
pub(super) const FENCE: &str = "fence";
pub(super) const RECORD: &str = "record";
pub(super) const RECORD_WRITER: &str = "record-writer";
pub(super) const RELEASED: &str = "released";
/// A key's semaphore: a sorted set of the permits held (owner -> lease end).
pub(super) const PERMITS: &str = "permits";
/// The semaphore's waited-for mark (as [`WAITED`] is the lock's).
pub(super) const PERMITS_WAITED: &str = "permits-waited";
/// A key's reader-writer lock: its readers (a sorted set, owner -> lease
/// end), its writer (the owner, expiring with the lease), the writers
/// waiting (a sorted set, waiter -> mark end) and its waited-for mark.
pub(super) const RW_READERS: &str = "rw-readers";
pub(super) const RW_WRITER: &str = "rw-writer";
pub(super) const RW_WAITING: &str = "rw-waiting";
pub(super) const RW_WAITED: &str = "rw-waited";
/// The waited-for mark: set by an acquire that finds the lock held, so the
/// release publishes (only then); deleted by the release, and never
/// outliving the holder's lease.
pub(super) const WAITED: &str = "waited";

/// Fencing counters per namespace. The counter of a lock is shared by every
/// id whose [`bucket`] is the same, so the fencing state in Redis is bounded
/// by the namespaces in use (at most this many keys each), never by the ids
/// ever seen. Part of the key layout: changing it changes every name.
pub(crate) const FENCE_BUCKETS: u32 = 1024;

/// The fencing bucket of `key`: 32-bit FNV-1a of `namespace:id`, modulo
/// [`FENCE_BUCKETS`]. Stable across processes, versions and languages (the
/// names it picks are in Redis), and cheap: no allocation, a few ns.
pub(crate) fn bucket(key: &LockKey) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for &b in key.as_str().as_bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h % FENCE_BUCKETS
}

/// One Redis name of a lock. The hash tag is the namespace and the lock's
/// fencing bucket, `{<namespace>:<bucket, 3 hex digits>}`, so every name of
/// a lock, its bucket's counter among them, is in one slot, and a Cluster
/// still spreads a namespace over 1,024 tags:
///
/// * `<prefix>:{<ns>:<bucket>}:<id>:<suffix>` for the lock, its record and
///   its release channel;
/// * `<prefix>:{<ns>:<bucket>}:fence` for the bucket's fencing counter.
///
/// Written into commands without an intermediate `String`.
#[derive(Clone, Copy)]
pub(super) struct Name<'a> {
    prefix: &'a str,
    key: &'a LockKey,
    suffix: &'static str,
}

impl Name<'_> {
    /// Hands the name to `put` in pieces, without formatting machinery:
    /// this runs for every key of every command (the hot path).
    fn emit(&self, mut put: impl FnMut(&[u8])) {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let b = bucket(self.key) as usize;
        let bucket = [HEX[(b >> 8) & 0xf], HEX[(b >> 4) & 0xf], HEX[b & 0xf]];
        put(self.prefix.as_bytes());
        put(b":{");
        put(self.key.namespace().as_bytes());
        put(b":");
        put(&bucket);
        put(b"}:");
        if self.suffix != FENCE {
            // The bucket's counter has no id in it; every other name does.
            put(self.key.id().as_bytes());
            put(b":");
        }
        put(self.suffix.as_bytes());
    }

    /// The length of the name in bytes (what [`emit`](Name::emit) writes),
    /// so that a command can be sized before the name is written into it.
    pub(super) fn byte_len(&self) -> usize {
        // `<prefix>:{<ns>:<3 hex digits>}:[<id>:]<suffix>`
        let id = if self.suffix != FENCE {
            self.key.id().len() + 1
        } else {
            0
        };
        self.prefix.len() + 2 + self.key.namespace().len() + 1 + 3 + 2 + id + self.suffix.len()
    }
}

impl std::fmt::Display for Name<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut name = Vec::with_capacity(64);
        self.emit(|part| name.extend_from_slice(part));
        f.write_str(&String::from_utf8_lossy(&name))
    }
}

impl redis::ToRedisArgs for Name<'_> {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        // Put together on the stack and written in one piece (one copy into
        // the command, not one per part); a longer name in parts.
        let mut buf = [0u8; 256];
        let len = self.byte_len();
        if len <= buf.len() {
            let mut at = 0;
            self.emit(|part| {
                buf[at..at + part.len()].copy_from_slice(part);
                at += part.len();
            });
            out.write_arg(&buf[..at]);
        } else {
            use std::io::Write as _;
            let mut arg = out.writer_for_next_arg();
            // Writing into the argument buffer cannot fail.
            self.emit(|part| {
                let _ = arg.write_all(part);
            });
        }
    }
}

impl RedisStore {
    /// The Redis key that holds `key`'s lock. A test hook (README's "Key
    /// layout" documents the names), not part of the stable API.
    #[cfg(any(test, feature = "test-util"))]
    #[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
    pub fn lock_key(&self, key: &LockKey) -> String {
        self.name(key, LOCK).to_string()
    }

    /// The Redis key that holds `key`'s semaphore (a sorted set of the
    /// permits held). A test hook, not part of the stable API.
    #[cfg(any(test, feature = "test-util"))]
    #[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
    pub fn permits_key(&self, key: &LockKey) -> String {
        self.name(key, PERMITS).to_string()
    }

    /// The Redis key that marks `key`'s semaphore as waited-for (set by a
    /// permit acquire that finds none free; a permit release publishes only
    /// then). A test hook, not part of the stable API.
    #[cfg(any(test, feature = "test-util"))]
    #[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
    pub fn permits_waited_key(&self, key: &LockKey) -> String {
        self.name(key, PERMITS_WAITED).to_string()
    }

    /// The Redis key that holds the fencing counter of `key`'s bucket (shared
    /// with the other ids of the bucket: see the store's key layout).
    pub fn fence_key(&self, key: &LockKey) -> String {
        self.name(key, FENCE).to_string()
    }

    /// The Redis key that holds `key`'s completed record. A test hook, not
    /// part of the stable API.
    #[cfg(any(test, feature = "test-util"))]
    #[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
    pub fn record_key(&self, key: &LockKey) -> String {
        self.name(key, RECORD).to_string()
    }

    /// The Redis key that marks `key`'s lock as waited-for (set by an
    /// acquire that finds it held; the release publishes only then).
    pub fn waited_key(&self, key: &LockKey) -> String {
        self.name(key, WAITED).to_string()
    }

    /// The channel on which `key`'s releases are published.
    pub fn release_channel(&self, key: &LockKey) -> String {
        self.name(key, RELEASED).to_string()
    }

    /// One of `key`'s Redis names, written straight into a command.
    pub(super) fn name<'a>(&'a self, key: &'a LockKey, suffix: &'static str) -> Name<'a> {
        Name {
            prefix: &self.inner.prefix,
            key,
            suffix,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(id: &str, suffix: &'static str) -> String {
        let key = LockKey::new("orders", id).unwrap();
        Name {
            prefix: "trl",
            key: &key,
            suffix,
        }
        .to_string()
    }

    #[test]
    fn names_follow_the_documented_layout() {
        assert_eq!(name("42", LOCK), "trl:{orders:170}:42:lock");
        assert_eq!(name("42", RELEASED), "trl:{orders:170}:42:released");
        assert_eq!(name("42", WAITED), "trl:{orders:170}:42:waited");
        assert_eq!(name("ord_1", RECORD), "trl:{orders:2b1}:ord_1:record");
        // The fencing counter is the bucket's, shared by its ids.
        assert_eq!(name("42", FENCE), "trl:{orders:170}:fence");
        assert_eq!(name("ord_1", FENCE), "trl:{orders:2b1}:fence");
    }

    #[test]
    fn a_name_is_written_into_a_command_as_it_prints() {
        use redis::ToRedisArgs as _;
        // Short (built on the stack) and longer than the stack buffer
        // (written in parts): the same bytes as its text either way.
        let long_prefix = "p".repeat(300);
        for prefix in ["trl", long_prefix.as_str()] {
            let key = LockKey::new("orders", "ord_1").unwrap();
            for suffix in [LOCK, FENCE] {
                let name = Name {
                    prefix,
                    key: &key,
                    suffix,
                };
                let written = name.to_redis_args();
                assert_eq!(written, vec![name.to_string().into_bytes()], "{name}");
            }
        }
    }

    #[test]
    fn byte_len_is_the_length_written() {
        for id in ["42", "ord_1", "a-much-longer-id-0123456789"] {
            let key = LockKey::new("orders", id).unwrap();
            for suffix in [LOCK, FENCE, RECORD, RECORD_WRITER, RELEASED, WAITED] {
                let name = Name {
                    prefix: "trl",
                    key: &key,
                    suffix,
                };
                assert_eq!(name.byte_len(), name.to_string().len(), "{name}");
            }
        }
    }

    #[test]
    fn buckets_are_stable_and_bounded() {
        let b = |id: &str| bucket(&LockKey::new("orders", id).unwrap());
        assert_eq!((b("42"), b("ord_1")), (0x170, 0x2b1));
        assert!((0..5_000).all(|i| b(&i.to_string()) < FENCE_BUCKETS));
    }
}
