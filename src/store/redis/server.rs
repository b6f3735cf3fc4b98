//! Which server the store talks to (Redis or Valkey, and its version),
//! read from `INFO server` in the round trip that opens a connection (with
//! the script loads), and the commands that choice allows.
//!
//! One primary or Sentinel: read again at each new connection, since a
//! failover may land on another server (a rolling upgrade). A Cluster's
//! nodes may differ from each other: nothing is read there, and every call
//! takes the Lua path, which every server runs.

use redis::Cmd;

use super::keys::Name;
use super::scripts::digits;

/// The server's make.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Make {
    Redis,
    Valkey,
}

/// A server, as `INFO server` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Server {
    pub(super) make: Make,
    /// major, minor, patch
    pub(super) version: (u32, u32, u32),
}

impl Server {
    /// Reads `INFO server`'s text: Valkey says `server_name:valkey` and
    /// `valkey_version:…` (its `redis_version` is the Redis it is
    /// compatible with, 7.2.4); Redis has no `server_name` (or says
    /// `redis`) and gives `redis_version`. `None` for another server, or
    /// a text without a version: the store then takes the Lua paths.
    pub(super) fn from_info(info: &str) -> Option<Server> {
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.trim().strip_prefix(name)?.strip_prefix(':'))
        };
        let (make, version) = match field("server_name") {
            Some("valkey") => (Make::Valkey, field("valkey_version")?),
            None | Some("redis") => (Make::Redis, field("redis_version")?),
            Some(_) => return None,
        };
        let mut parts = version.split('.').map(|p| p.parse::<u32>().ok());
        let mut next = || parts.next().flatten();
        let version = (next()?, next()?, next().unwrap_or(0));
        Some(Server { make, version })
    }

    /// Whether the server has `SET … IFEQ` (set only if the value is the
    /// one given): Valkey 8.1 and later. (Redis has it from 8.4, which the
    /// tests do not run against: Redis keeps the Lua paths.)
    pub(super) fn has_set_ifeq(self) -> bool {
        self.make == Make::Valkey && self.version >= (8, 1, 0)
    }

    /// As the tests print it: `valkey 9.1.2`, `redis 7.0.15`.
    #[cfg(any(test, feature = "test-util"))]
    pub(super) fn describe(self) -> String {
        let make = match self.make {
            Make::Redis => "redis",
            Make::Valkey => "valkey",
        };
        let (a, b, c) = self.version;
        format!("{make} {a}.{b}.{c}")
    }
}

/// `SET <lock> <owner> IFEQ <owner> PX <ms>`: the renewal of a lock whose
/// value is exactly its owner token (without fencing), with the meaning of
/// extend.lua's and no script. Answers `OK` when the value was the owner's
/// (the expiry is then reset), nil otherwise (another owner, or no key:
/// `IFEQ` never creates one), and `WRONGTYPE` for a key that is not a
/// string: all three as extend.lua answers them (1, 0, the error).
pub(super) fn set_ifeq(lock: Name<'_>, owner: &str, px: u64) -> Cmd {
    let bytes = "SETIFEQPX".len() + lock.byte_len() + 2 * owner.len() + digits(px);
    let mut set = Cmd::with_capacity(7, bytes);
    set.arg("SET")
        .arg(lock)
        .arg(owner)
        .arg("IFEQ")
        .arg(owner)
        .arg("PX")
        .arg(px);
    set
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_are_told_apart_from_info_server() {
        let valkey = "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\n\
                      valkey_version:9.1.2\r\nredis_mode:standalone\r\n";
        let server = Server::from_info(valkey).unwrap();
        assert_eq!(server.make, Make::Valkey);
        assert_eq!(server.version, (9, 1, 2));
        assert!(server.has_set_ifeq());
        let redis = "# Server\r\nredis_version:7.0.15\r\nredis_git_sha1:00000000\r\n";
        let server = Server::from_info(redis).unwrap();
        assert_eq!(
            server,
            Server {
                make: Make::Redis,
                version: (7, 0, 15)
            }
        );
        assert!(!server.has_set_ifeq());
        let redis8 = "redis_version:8.4.0\r\nserver_name:redis\r\n";
        assert!(!Server::from_info(redis8).unwrap().has_set_ifeq());
    }

    #[test]
    fn set_ifeq_comes_with_valkey_8_1() {
        let valkey = |v: &str| {
            Server::from_info(&format!("server_name:valkey\nvalkey_version:{v}\n")).unwrap()
        };
        assert!(!valkey("8.0.6").has_set_ifeq());
        assert!(valkey("8.1.0").has_set_ifeq());
        assert!(valkey("8.1.8").has_set_ifeq());
        assert!(valkey("10.0").has_set_ifeq());
    }

    #[test]
    fn an_unknown_server_or_version_takes_the_lua_paths() {
        assert_eq!(Server::from_info(""), None);
        assert_eq!(
            Server::from_info("server_name:dragonfly\nredis_version:7.4.0\n"),
            None
        );
        assert_eq!(
            Server::from_info("server_name:valkey\nredis_version:7.2.4\n"),
            None
        );
        assert_eq!(Server::from_info("redis_version:seven\n"), None);
    }
}
