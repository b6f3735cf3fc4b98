//! [`DataNodes`]: how a Sentinel store connects to the primary and
//! replicas the Sentinels name, apart from how it connects to the
//! Sentinels themselves.

use std::fmt;

use crate::error::ConfigError;

/// How a store behind Sentinel connects to the data nodes (the primary and
/// its replicas): credentials, TLS and database. Every connection to a
/// data node uses them: commands, `WAIT`, release notifications, and the
/// Sentinel client's own `ROLE` check of the primary it was named.
///
/// Each setting left unset is the first Sentinel URL's: its username and
/// password, and TLS when it is `rediss://` (without certificate checks
/// when it ends in `#insecure`, which with rustls needs feature
/// `tls-rustls-insecure`). The database is 0 unless set (a Sentinel
/// URL names no database). Sentinels and data nodes often differ (a
/// Sentinel `requirepass` beside an ACL user on the primary); then say so:
///
/// ```
/// use tower_redis_lock::{DataNodes, RedisStore};
///
/// # fn main() -> Result<(), tower_redis_lock::ConfigError> {
/// let store = RedisStore::sentinel_builder(
///     &["redis://:sentinel-secret@10.0.0.1:26379", "redis://:sentinel-secret@10.0.0.2:26379"],
///     "locks",
/// )
/// .data_nodes(DataNodes::new().with_auth(Some("locker"), "node-secret").with_database(2))
/// .build()?;
/// # let _ = store;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Default)]
#[must_use = "settings do nothing until given to `RedisStoreBuilder::data_nodes`"]
pub struct DataNodes {
    /// `None`: the first Sentinel URL's.
    auth: Option<Auth>,
    /// `None`: as the first Sentinel URL.
    tls: Option<NodeTls>,
    database: i64,
    #[cfg(feature = "tls-rustls")]
    root_certificates: Option<Vec<u8>>,
    #[cfg(feature = "tls-rustls")]
    client_certificate: Option<ClientCertificate>,
    /// Addresses the store reaches instead of those the Sentinels name
    /// (test support: `with_address_map`).
    #[cfg(any(test, feature = "test-util"))]
    address_map: AddressMap,
}

/// Each data node address the Sentinels name (host, port) and the address
/// the store reaches it at instead.
#[cfg(any(test, feature = "test-util"))]
pub(super) type AddressMap = Vec<((String, u16), (String, u16))>;

#[cfg(feature = "tls-rustls")]
use super::tls::ClientCertificate;

#[derive(Clone)]
struct Auth {
    username: Option<String>,
    password: Option<String>,
}

/// TLS on the connections to the data nodes behind Sentinel (see
/// [`DataNodes::with_tls`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeTls {
    /// Plain TCP.
    Off,
    /// TLS, with the server's certificate checked against the platform's
    /// roots (and, with feature `tls-rustls`, the ones given to
    /// `DataNodes::with_root_certificates`).
    Verified,
    /// TLS without any certificate check (tests only: anyone on the path
    /// can read the owner tokens). With rustls it needs feature
    /// `tls-rustls-insecure`; `build` refuses it otherwise.
    Insecure,
}

/// The data nodes' settings, resolved against the first Sentinel URL.
pub(super) struct Resolved {
    pub(super) username: Option<String>,
    pub(super) password: Option<String>,
    pub(super) tls: NodeTls,
    pub(super) database: i64,
    #[cfg(feature = "tls-rustls")]
    pub(super) root_certificates: Option<Vec<u8>>,
    #[cfg(feature = "tls-rustls")]
    pub(super) client_certificate: Option<ClientCertificate>,
    #[cfg(any(test, feature = "test-util"))]
    pub(super) address_map: AddressMap,
}

impl DataNodes {
    /// Every setting as the first Sentinel URL (see the type's docs).
    pub fn new() -> Self {
        Self::default()
    }

    /// Authenticate as `username` (an ACL user; `None`: the `default` user,
    /// as with `requirepass`) with `password`.
    pub fn with_auth(mut self, username: Option<&str>, password: &str) -> Self {
        self.auth = Some(Auth {
            username: username.map(str::to_owned),
            password: Some(password.to_owned()),
        });
        self
    }

    /// Send no credentials to the data nodes, whatever the Sentinel URL has.
    pub fn without_auth(mut self) -> Self {
        self.auth = Some(Auth {
            username: None,
            password: None,
        });
        self
    }

    /// TLS or not (default: as the first Sentinel URL). TLS needs feature
    /// `tls-rustls` or `tls-native-tls`; `build` refuses it otherwise.
    pub fn with_tls(mut self, tls: NodeTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// The database the locks live in (default 0).
    pub fn with_database(mut self, database: i64) -> Self {
        self.database = database;
        self
    }

    /// Trust the certificates of `pem` (one or more PEM certificates, such
    /// as a private CA's) besides the platform's roots, on the data nodes'
    /// TLS connections. Implies [`NodeTls::Verified`] unless TLS is set
    /// otherwise. (The Sentinels' own `rediss://` connections check against
    /// the platform's roots.)
    #[cfg(feature = "tls-rustls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls-rustls")))]
    pub fn with_root_certificates(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.root_certificates = Some(pem.into());
        self
    }

    /// Present `certificate` (PEM, with its chain if any) and prove it
    /// with `key` (its PEM private key) on the data nodes' TLS
    /// connections, for servers that ask every client for one (mutual
    /// TLS: `tls-auth-clients yes`). Implies [`NodeTls::Verified`] unless
    /// TLS is set otherwise.
    #[cfg(feature = "tls-rustls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls-rustls")))]
    pub fn with_client_certificate(
        mut self,
        certificate: impl Into<Vec<u8>>,
        key: impl Into<Vec<u8>>,
    ) -> Self {
        self.client_certificate = Some(ClientCertificate {
            certificate: certificate.into(),
            key: key.into(),
        });
        self
    }

    /// Test support (feature `test-util`): reach the data node the
    /// Sentinels name as `named` (host, port) at `reach` instead, over plain
    /// TCP, so that a test can put a fault proxy between the store and the
    /// primary while the Sentinels watch the servers directly (a broken
    /// link is then the store's alone, not a failover). Only the store's
    /// connections are mapped: the Sentinel client checks the primary it
    /// is named (`ROLE`) at the address named, so this is no NAT mapping.
    #[cfg(any(test, feature = "test-util"))]
    #[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
    pub fn with_address_map(mut self, named: (&str, u16), reach: (&str, u16)) -> Self {
        self.address_map
            .push(((named.0.to_owned(), named.1), (reach.0.to_owned(), reach.1)));
        self
    }

    /// The settings, each unset one taken from `sentinel` (the first
    /// Sentinel URL); checked.
    pub(super) fn resolve(self, sentinel: &redis::ConnectionInfo) -> Result<Resolved, ConfigError> {
        let bad = |reason: &str| ConfigError::new("data_nodes", reason);
        let (username, password) = match self.auth {
            Some(a) => (a.username, a.password),
            None => {
                let s = sentinel.redis_settings();
                (
                    s.username().map(str::to_owned),
                    s.password().map(str::to_owned),
                )
            }
        };
        #[cfg(feature = "tls-rustls")]
        let certificates_given =
            self.root_certificates.is_some() || self.client_certificate.is_some();
        #[cfg(not(feature = "tls-rustls"))]
        let certificates_given = false;
        let tls = match (self.tls, sentinel.addr()) {
            (Some(tls), _) => tls,
            (None, _) if certificates_given => NodeTls::Verified,
            (None, redis::ConnectionAddr::TcpTls { insecure: true, .. }) => NodeTls::Insecure,
            (None, redis::ConnectionAddr::TcpTls { .. }) => NodeTls::Verified,
            (None, _) => NodeTls::Off,
        };
        if tls != NodeTls::Off && cfg!(not(any(feature = "tls-rustls", feature = "tls-native-tls")))
        {
            return Err(bad(super::tls::NO_TLS));
        }
        if tls == NodeTls::Insecure {
            super::tls::check_insecure("data_nodes")?;
        }
        if tls == NodeTls::Off && certificates_given {
            return Err(bad("certificates are for TLS, which is off"));
        }
        if self.database < 0 {
            return Err(bad("the database must be 0 or more"));
        }
        Ok(Resolved {
            username,
            password,
            tls,
            database: self.database,
            #[cfg(feature = "tls-rustls")]
            root_certificates: self.root_certificates,
            #[cfg(feature = "tls-rustls")]
            client_certificate: self.client_certificate,
            #[cfg(any(test, feature = "test-util"))]
            address_map: self.address_map,
        })
    }
}

impl fmt::Debug for DataNodes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("DataNodes");
        match &self.auth {
            None => d.field("auth", &"as the Sentinel URL"),
            Some(a) => d
                .field("username", &a.username)
                .field("password", &a.password.as_ref().map(|_| "<redacted>")),
        };
        d.field("tls", &self.tls).field("database", &self.database);
        #[cfg(any(test, feature = "test-util"))]
        d.field("address_map", &self.address_map);
        #[cfg(feature = "tls-rustls")]
        d.field("root_certificates", &self.root_certificates.is_some())
            .field("client_certificate", &self.client_certificate.is_some());
        d.finish()
    }
}
