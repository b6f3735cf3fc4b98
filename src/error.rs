//! The crate's one error type.

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

use crate::key::{KeyError, LockKey};

/// Boxed error from a backend client.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// Which lock operation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Operation {
    /// Opening a connection or checking one out of a pool.
    Connect,
    /// Trying to take a lock.
    Acquire,
    /// Renewing a lease.
    Extend,
    /// Releasing a lock.
    Release,
    /// Subscribing to release notifications.
    Subscribe,
    /// Reading who holds a lock (an operator's `inspect`).
    Inspect,
    /// Listing the held locks of a namespace.
    List,
    /// Removing a lock whoever holds it (an operator's `force_release`).
    ForceRelease,
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Operation::Connect => "connect",
            Operation::Acquire => "acquire",
            Operation::Extend => "extend",
            Operation::Release => "release",
            Operation::Subscribe => "subscribe",
            Operation::Inspect => "inspect",
            Operation::List => "list",
            Operation::ForceRelease => "force release",
        })
    }
}

/// Everything that can go wrong taking, keeping or giving back a lock.
///
/// Errors carry the key in its log-safe form ([`LockKey`]: long or odd ids
/// already hashed) and the operation, never the owner token. Backend errors
/// are never squashed into `false`: "someone else holds it" is
/// [`Error::Contended`], "Redis did not answer" is [`Error::Unavailable`].
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// A try-lock (wait timeout 0) found the lock held by someone else.
    Contended {
        /// The lock.
        key: LockKey,
        /// The holder's remaining lease: a fair `Retry-After`.
        retry_after: Duration,
    },
    /// The lock stayed held by someone else for the whole wait timeout.
    WaitTimeout {
        /// The lock.
        key: LockKey,
        /// How long we waited.
        waited: Duration,
        /// The holder's remaining lease when we gave up.
        retry_after: Duration,
    },
    /// The lease was lost: a renewal found another owner or no key, or the
    /// local validity deadline passed without a successful renewal.
    LockLost {
        /// The lock.
        key: LockKey,
    },
    /// The store could not be reached or failed (I/O, timeout, server
    /// error). Layers fail closed on this by default.
    Unavailable {
        /// What we were doing.
        op: Operation,
        /// The lock, when the operation had one.
        key: Option<LockKey>,
        /// The client's error.
        source: BoxError,
    },
    /// The store refused our credentials or an ACL denied a command.
    Auth {
        /// What we were doing.
        op: Operation,
        /// The lock, when the operation had one.
        key: Option<LockKey>,
        /// The client's error.
        source: BoxError,
    },
    /// A completed record could not be used (stored by an incompatible
    /// version, or corrupted).
    Record {
        /// The lock.
        key: LockKey,
        /// Why.
        reason: &'static str,
    },
    /// A key could not be built from the given namespace or id.
    InvalidKey {
        /// Why.
        reason: &'static str,
    },
    /// A setting is out of range or contradicts another one.
    Config(ConfigError),
}

impl Error {
    /// The error and each cause under it, once, on one line (`lock store
    /// unavailable during connect: <the client's error>: <what failed under
    /// it>`): what a readiness route or a log line shows. `Display` alone
    /// says only what failed, as is usual for errors with a
    /// [`source`](std::error::Error::source).
    ///
    /// ```
    /// # use tower_redis_lock::{Error, Operation};
    /// let e = Error::Unavailable {
    ///     op: Operation::Connect,
    ///     key: None,
    ///     source: "connection refused".into(),
    /// };
    /// assert!(e.report().to_string().ends_with(": connection refused"));
    /// ```
    pub fn report(&self) -> impl fmt::Display + '_ {
        Chain(self)
    }

    /// The lock this error is about, if any.
    pub fn key(&self) -> Option<&LockKey> {
        match self {
            Error::Contended { key, .. }
            | Error::WaitTimeout { key, .. }
            | Error::LockLost { key }
            | Error::Record { key, .. } => Some(key),
            Error::Unavailable { key, .. } | Error::Auth { key, .. } => key.as_ref(),
            Error::InvalidKey { .. } | Error::Config(_) => None,
        }
    }

    /// How long a client should wait before trying again, where that is
    /// known: the holder's remaining lease on contention.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::Contended { retry_after, .. } | Error::WaitTimeout { retry_after, .. } => {
                Some(*retry_after)
            }
            _ => None,
        }
    }

    /// Whether someone else holds the lock (try-lock refused or wait timed
    /// out).
    pub fn is_contended(&self) -> bool {
        matches!(self, Error::Contended { .. } | Error::WaitTimeout { .. })
    }

    /// Whether the store itself failed (unreachable, timed out, auth or ACL).
    pub fn is_store_failure(&self) -> bool {
        matches!(self, Error::Unavailable { .. } | Error::Auth { .. })
    }

    /// Classifies a Redis client error: authentication and ACL failures
    /// become [`Error::Auth`], everything else [`Error::Unavailable`].
    pub(crate) fn from_redis(op: Operation, key: Option<&LockKey>, err: redis::RedisError) -> Self {
        let auth = matches!(
            err.kind(),
            redis::ErrorKind::AuthenticationFailed
                | redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm)
        ) || matches!(err.code(), Some("NOAUTH" | "WRONGPASS" | "NOPERM"))
            // Errors of a pipeline, and a cluster client's failure to
            // connect, come wrapped; their codes or kinds show in the text.
            || {
                let text = err.to_string();
                ["NOAUTH", "WRONGPASS", "NOPERM", "AuthenticationFailed"]
                    .iter()
                    .any(|c| text.contains(c))
            };
        let key = key.cloned();
        let source = Box::new(err);
        if auth {
            Error::Auth { op, key, source }
        } else {
            Error::Unavailable { op, key, source }
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Contended { key, retry_after } => write!(
                f,
                "lock `{key}` is held by another owner (retry in {} ms)",
                retry_after.as_millis()
            ),
            Error::WaitTimeout {
                key,
                waited,
                retry_after,
            } => write!(
                f,
                "lock `{key}` stayed held for the whole wait of {} ms (retry in {} ms)",
                waited.as_millis(),
                retry_after.as_millis()
            ),
            Error::LockLost { key } => write!(f, "lock `{key}` was lost"),
            Error::Unavailable { op, key, .. } => match key {
                Some(key) => write!(f, "lock store unavailable during {op} of `{key}`"),
                None => write!(f, "lock store unavailable during {op}"),
            },
            Error::Auth { op, key, .. } => match key {
                Some(key) => write!(f, "lock store refused {op} of `{key}` (auth or ACL)"),
                None => write!(f, "lock store refused {op} (auth or ACL)"),
            },
            Error::Record { key, reason } => {
                write!(f, "the completed record of `{key}` is unusable: {reason}")
            }
            Error::InvalidKey { reason } => write!(f, "invalid lock key: {reason}"),
            Error::Config(e) => fmt::Display::fmt(e, f),
        }
    }
}

impl StdError for Error {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            Error::Unavailable { source, .. } | Error::Auth { source, .. } => Some(&**source),
            Error::Config(e) => Some(e),
            _ => None,
        }
    }
}

/// An error with every cause after it (`error: cause: cause…`), for logs:
/// what failed under a store error (a refused certificate, a reset
/// connection) is in its sources, and a log line without them says only
/// "unavailable".
pub(crate) struct Chain<'a>(pub(crate) &'a (dyn StdError + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Each cause once: a client error whose text already tells its
        // source (redis' "… - IoError: Connection refused" over the
        // io::Error itself) does not have it told again.
        let mut told = self.0.to_string();
        f.write_str(&told)?;
        let mut next = self.0.source();
        while let Some(cause) = next {
            let text = cause.to_string();
            if !text.is_empty() && !told.contains(&text) {
                write!(f, ": {text}")?;
                told.push_str(&text);
            }
            next = cause.source();
        }
        Ok(())
    }
}

impl From<KeyError> for Error {
    fn from(e: KeyError) -> Self {
        Error::InvalidKey { reason: e.reason() }
    }
}

impl From<ConfigError> for Error {
    fn from(e: ConfigError) -> Self {
        Error::Config(e)
    }
}

/// A setting that is out of range or contradicts another one: one of ours,
/// or the Redis server's (a `maxmemory-policy` that can evict locks,
/// scripting the server or its ACL user does not allow), which the store
/// refuses when it connects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    setting: &'static str,
    reason: String,
    /// The setting is the server's, not one of ours.
    server: bool,
}

impl ConfigError {
    pub(crate) fn new(setting: &'static str, reason: impl Into<String>) -> Self {
        ConfigError {
            setting,
            reason: reason.into(),
            server: false,
        }
    }

    /// A server the store refuses to use because of its own `setting`
    /// (`maxmemory-policy`, `scripting`); `reason` names the fix.
    pub(crate) fn server(setting: &'static str, reason: impl Into<String>) -> Self {
        ConfigError {
            server: true,
            ..ConfigError::new(setting, reason)
        }
    }

    /// The setting at fault: a builder setting, or the server's
    /// (`maxmemory-policy`, `scripting`).
    pub fn setting(&self) -> &'static str {
        self.setting
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.server {
            write!(
                f,
                "the lock store refuses this Redis server: {}",
                self.reason
            )
        } else {
            write!(f, "invalid setting `{}`: {}", self.setting, self.reason)
        }
    }
}

impl StdError for ConfigError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_errors_are_classified() {
        let key = LockKey::new("ns", "k").unwrap();
        let io = redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "refused",
        ));
        let e = Error::from_redis(Operation::Acquire, Some(&key), io);
        assert!(matches!(
            e,
            Error::Unavailable {
                op: Operation::Acquire,
                ..
            }
        ));
        assert!(e.is_store_failure());
        assert_eq!(
            e.to_string(),
            "lock store unavailable during acquire of `ns:k`"
        );
        assert!(e.source().is_some());

        let auth = redis::RedisError::from((redis::ErrorKind::AuthenticationFailed, "bad"));
        assert!(matches!(
            Error::from_redis(Operation::Connect, None, auth),
            Error::Auth { .. }
        ));
    }

    #[test]
    fn contention_carries_retry_after() {
        let key = LockKey::new("ns", "k").unwrap();
        let e = Error::Contended {
            key: key.clone(),
            retry_after: Duration::from_millis(1500),
        };
        assert!(e.is_contended());
        assert_eq!(e.retry_after(), Some(Duration::from_millis(1500)));
        assert_eq!(e.key(), Some(&key));
        assert!(e.to_string().contains("1500 ms"));
    }
}
