//! What TLS this build can speak, checked when a store is built: a URL
//! asking for TLS that the build cannot give is a [`ConfigError`] naming
//! the feature to turn on, never an error at the first call.

use crate::error::ConfigError;

/// Whether this build speaks TLS at all.
const TLS: bool = cfg!(any(feature = "tls-rustls", feature = "tls-native-tls"));

/// Whether this build can skip certificate checks: over rustls only with
/// `tls-rustls-insecure`; over native-tls always (redis-rs uses rustls
/// whenever `tls-rustls` is on).
const INSECURE: bool = cfg!(any(
    feature = "tls-rustls-insecure",
    all(feature = "tls-native-tls", not(feature = "tls-rustls"))
));

/// Why TLS without certificate checks is refused.
const NO_INSECURE: &str = "TLS without certificate checks (`#insecure`, \
     `NodeTls::Insecure`) needs feature `tls-rustls-insecure` of tower-redis-lock \
     with rustls; only tests should use it";

/// Why a TLS URL is refused by a build without TLS.
pub(super) const NO_TLS: &str = "TLS (`rediss://`) needs feature `tls-rustls` or \
     `tls-native-tls` of tower-redis-lock, and this build has neither";

/// Checks that this build can connect to `url` (a Redis URL given for
/// `setting`) as the URL asks. A URL that does not parse is left to
/// redis-rs, which says what is wrong with it.
pub(super) fn check_url(setting: &'static str, url: &str) -> Result<(), ConfigError> {
    let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
    let tls = ["rediss", "valkeys"]
        .iter()
        .any(|s| scheme.eq_ignore_ascii_case(s));
    if tls && !TLS {
        return Err(ConfigError::new(setting, NO_TLS));
    }
    let insecure = url.rsplit_once('#').is_some_and(|(_, f)| f == "insecure");
    if tls && insecure {
        return check_insecure(setting);
    }
    Ok(())
}

/// Checks that a client handed in for `setting` asks for no TLS this
/// build cannot give (its URL was parsed by redis-rs already).
pub(super) fn check_client(
    setting: &'static str,
    client: &redis::Client,
) -> Result<(), ConfigError> {
    match client.get_connection_info().addr() {
        redis::ConnectionAddr::TcpTls { insecure: true, .. } => check_insecure(setting),
        _ => Ok(()),
    }
}

/// Checks that this build can skip certificate checks, as `setting` asks.
pub(super) fn check_insecure(setting: &'static str) -> Result<(), ConfigError> {
    if INSECURE {
        Ok(())
    } else {
        Err(ConfigError::new(setting, NO_INSECURE))
    }
}

#[cfg(test)]
mod tests {
    #![allow(dead_code, unused_imports)] // each feature set runs some of them

    use crate::error::ConfigError;
    use crate::store::redis::RedisStore;
    use crate::store::redlock::RedlockStore;

    /// `r` is refused for `setting`, for the reason `because` says.
    #[track_caller]
    fn refused<T>(r: Result<T, ConfigError>, setting: &str, because: &str) {
        let Err(e) = r else {
            panic!("`{setting}`: accepted, expected a ConfigError");
        };
        assert_eq!(e.setting(), setting, "{e}");
        assert!(e.to_string().contains(because), "{e}");
    }

    /// Every way a store takes a URL: a TLS URL in a build without TLS is
    /// a `ConfigError` naming the features, not a panic or an error at the
    /// first call.
    #[cfg(not(any(feature = "tls-rustls", feature = "tls-native-tls")))]
    #[test]
    fn a_tls_url_without_a_tls_feature_is_a_config_error_naming_the_features() {
        let because = "`tls-rustls` or `tls-native-tls`";
        refused(
            RedisStore::from_url("rediss://127.0.0.1:6379/"),
            "url",
            because,
        );
        refused(
            RedisStore::builder("REDISS://:secret@127.0.0.1/#insecure").build(),
            "url",
            because,
        );
        refused(RedisStore::from_url("valkeys://127.0.0.1/"), "url", because);
        // Redlock: each node is a store made from its URL.
        let nodes = [
            "redis://127.0.0.1:1/",
            "rediss://127.0.0.1:2/",
            "redis://127.0.0.1:3/",
        ]
        .iter()
        .map(|u| RedisStore::from_url(u))
        .collect::<Result<Vec<_>, _>>();
        refused(nodes.and_then(RedlockStore::new), "url", because);
        #[cfg(feature = "sentinel")]
        {
            let sentinels = ["rediss://127.0.0.1:26379", "rediss://127.0.0.1:26380"];
            refused(
                RedisStore::sentinel(&sentinels, "locks"),
                "sentinel_urls",
                because,
            );
            let data_nodes = crate::store::redis::DataNodes::new()
                .with_tls(crate::store::redis::NodeTls::Verified);
            let store = RedisStore::sentinel_builder(&["redis://127.0.0.1:26379"], "locks")
                .data_nodes(data_nodes)
                .build();
            refused(store, "data_nodes", because);
        }
        #[cfg(feature = "cluster")]
        refused(
            RedisStore::cluster(&["redis://127.0.0.1:7000/", "rediss://127.0.0.1:7001/"]),
            "cluster_urls",
            because,
        );
    }

    /// With `tls-rustls-insecure`, `#insecure` URLs are taken (they are
    /// what `tests/tls.rs` connects with).
    #[cfg(feature = "tls-rustls-insecure")]
    #[test]
    fn tls_without_certificate_checks_is_taken_with_its_feature() {
        let store = RedisStore::from_url("rediss://127.0.0.1:6379/#insecure");
        assert!(store.is_ok(), "{store:?}");
    }

    /// With rustls, `tls-rustls` checks certificates and nothing more:
    /// skipping the checks is its own feature, and asking for it without
    /// that feature is a `ConfigError`, wherever it is asked.
    #[cfg(all(feature = "tls-rustls", not(feature = "tls-rustls-insecure")))]
    #[test]
    fn tls_without_certificate_checks_needs_its_own_feature() {
        let because = "`tls-rustls-insecure`";
        let checked = RedisStore::from_url("rediss://127.0.0.1:6379/");
        assert!(checked.is_ok(), "{checked:?}");
        refused(
            RedisStore::from_url("rediss://127.0.0.1:6379/#insecure"),
            "url",
            because,
        );
        let nodes = ["rediss://127.0.0.1:1/", "rediss://127.0.0.1:2/#insecure"]
            .iter()
            .map(|u| RedisStore::from_url(u))
            .collect::<Result<Vec<_>, _>>();
        refused(nodes.and_then(RedlockStore::new), "url", because);
        let insecure_client = redis::Client::open("rediss://127.0.0.1:6379/#insecure").unwrap();
        let store = RedisStore::builder("rediss://127.0.0.1:6379/")
            .notifications(insecure_client)
            .build();
        refused(store, "notifications", because);
        #[cfg(feature = "sentinel")]
        {
            let sentinels = ["rediss://127.0.0.1:26379#insecure"];
            refused(
                RedisStore::sentinel(&sentinels, "locks"),
                "sentinel_urls",
                because,
            );
            let data_nodes = crate::store::redis::DataNodes::new()
                .with_tls(crate::store::redis::NodeTls::Insecure);
            let store = RedisStore::sentinel_builder(&["rediss://127.0.0.1:26379"], "locks")
                .data_nodes(data_nodes)
                .build();
            refused(store, "data_nodes", because);
        }
        #[cfg(feature = "cluster")]
        refused(
            RedisStore::cluster(&["rediss://127.0.0.1:7000/#insecure"]),
            "cluster_urls",
            because,
        );
    }
}

/// A client certificate and its private key, in PEM.
#[cfg(feature = "tls-rustls")]
#[derive(Clone)]
pub(super) struct ClientCertificate {
    pub(super) certificate: Vec<u8>,
    pub(super) key: Vec<u8>,
}

/// The certificates given for one kind of connection (a URL store's, or
/// the data nodes' behind Sentinel) as redis-rs takes them: extra roots
/// to trust, and a client certificate to present.
#[cfg(feature = "tls-rustls")]
pub(super) fn certificates(
    root: Option<&[u8]>,
    client: Option<&ClientCertificate>,
) -> redis::TlsCertificates {
    redis::TlsCertificates {
        client_tls: client.map(|c| redis::ClientTlsConfig {
            client_cert: c.certificate.clone(),
            client_key: c.key.clone(),
        }),
        root_cert: root.map(<[u8]>::to_vec),
    }
}
