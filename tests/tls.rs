//! `rediss://` against a real TLS `redis-server` (feature `tls-rustls`):
//! a store over TLS grants, excludes and releases; a server whose
//! certificate the client does not trust is refused promptly, with an
//! error, never a hang.
//!
//! Behind Sentinel: Sentinels and data nodes serving TLS, the
//! store reaches the primary over TLS too (commands, `WAIT`,
//! notifications), trusting extra root certificates where given, and a
//! data node whose certificate it does not trust is a TLS error.
//!
//! The certificates are made with the `openssl` CLI in a temporary
//! directory; the single server is started here, the Sentinel set by the
//! shared test support (each process keeps a plain port for the support's
//! own probes; the Sentinels name the data nodes by their TLS ports).

mod support;

use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::topology::{SentinelOptions, SentinelSet};
use tower_redis_lock::{
    DataNodes, Error, LeaseKind, LockKey, LockStore, LockStoreExt, Locker, NodeTls, OwnerToken,
    RedisStore, RedisStoreBuilder, ReplicaShortfall,
};

/// A TLS-only `redis-server` with a certificate for `127.0.0.1` signed by
/// its own CA; killed on drop.
struct TlsServer {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl TlsServer {
    fn start() -> TlsServer {
        TlsServer::start_with("no")
    }

    /// With `tls-auth-clients` as given (`yes`: every client must present
    /// a certificate the server's CA signed).
    fn start_with(auth_clients: &str) -> TlsServer {
        let dir = make_certs();
        let d = dir.path();
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        let path = |f: &str| d.join(f).to_str().unwrap().to_owned();
        let child = Command::new("redis-server")
            .args(["--port", "0", "--tls-port", &port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--tls-cert-file", &path("server.crt")])
            .args(["--tls-key-file", &path("server.key")])
            .args(["--tls-ca-cert-file", &path("ca.crt")])
            .args(["--tls-auth-clients", auth_clients])
            .args(["--save", "", "--appendonly", "no", "--dir", &path("")])
            .args(["--maxmemory-policy", "noeviction"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server (built with TLS) on PATH");
        let server = TlsServer { child, port, dir };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_err() {
            assert!(Instant::now() < deadline, "TLS redis-server did not start");
            std::thread::sleep(Duration::from_millis(10));
        }
        server
    }

    fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}/", self.port)
    }

    fn pem(&self, name: &str) -> Vec<u8> {
        std::fs::read(self.dir.path().join(name)).unwrap()
    }

    /// A store that trusts `ca` (a PEM file of the temporary directory)
    /// and nothing else, with a short command timeout.
    fn store_trusting(&self, ca: &str) -> RedisStore {
        let certs = redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(self.pem(ca)),
        };
        let client = redis::Client::build_with_tls(self.url(), certs).unwrap();
        let manager = deadpool_redis::Manager::new(client.get_connection_info().clone()).unwrap();
        let pool = deadpool_redis::Pool::builder(manager)
            .runtime(deadpool_redis::Runtime::Tokio1)
            .build()
            .unwrap();
        RedisStore::pool_builder(pool)
            .notifications(client)
            .command_timeout(Duration::from_secs(1))
            .build()
            .unwrap()
    }
}

/// A temporary directory with two CAs (`ca`, `other-ca`) and a server
/// certificate for `127.0.0.1` signed by `ca` (`server.key`, `server.crt`).
fn make_certs() -> tempfile::TempDir {
    // rustls leaves the choice of crypto to the application (see
    // README, "Cargo features"); the tests pick ring.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    make_ca(d, "ca");
    make_ca(d, "other-ca");
    openssl(d, &["genrsa", "-out", "server.key", "2048"]);
    openssl(
        d,
        &[
            "req",
            "-new",
            "-key",
            "server.key",
            "-subj",
            "/CN=127.0.0.1",
            "-out",
            "server.csr",
        ],
    );
    std::fs::write(d.join("san.ext"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    openssl(
        d,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-sha256",
            "-extfile",
            "san.ext",
            "-out",
            "server.crt",
        ],
    );
    dir
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("the openssl CLI on PATH");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A self-signed CA: `<name>.key`, `<name>.crt`.
fn make_ca(dir: &Path, name: &str) {
    let (key, crt): (PathBuf, PathBuf) =
        (format!("{name}.key").into(), format!("{name}.crt").into());
    openssl(dir, &["genrsa", "-out", key.to_str().unwrap(), "2048"]);
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-new",
            "-key",
            key.to_str().unwrap(),
            "-sha256",
            "-days",
            "2",
            "-subj",
            &format!("/CN={name}"),
            "-out",
            crt.to_str().unwrap(),
        ],
    );
}

/// Grants, shuts out a second owner, releases, and wakes a waiter: the
/// whole engine path over TLS, notifications included.
async fn grants_and_releases(store: RedisStore) {
    let key = LockKey::new("tls", "job-1").unwrap();
    let (a, b) = (OwnerToken::generate(), OwnerToken::generate());
    let lease = Duration::from_secs(10);
    assert!(matches!(
        store.acquire(&key, &a, lease).await.unwrap(),
        tower_redis_lock::AcquireOutcome::Granted(_)
    ));
    assert!(matches!(
        store.acquire(&key, &b, lease).await.unwrap(),
        tower_redis_lock::AcquireOutcome::Held { .. }
    ));
    assert!(store.renew(LeaseKind::Lock, &key, &a, lease).await.unwrap());
    assert!(store.release(LeaseKind::Lock, &key, &a).await.unwrap());

    // Through the locker: a waiter is handed the lock on release.
    let locker = Locker::builder(store)
        .wait_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let held = locker.acquire(&key).await.unwrap();
    let waiter = {
        let locker = locker.clone();
        let key = key.clone();
        tokio::spawn(async move {
            locker
                .acquire(&key)
                .await
                .map(|g| g.fencing_token().unwrap())
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let first = held.fencing_token().unwrap();
    assert!(held.release().await.unwrap());
    let second = waiter.await.unwrap().unwrap();
    assert!(second > first, "{second} after {first}");
}

#[tokio::test]
async fn rediss_with_insecure_grants_and_releases() {
    let server = TlsServer::start();
    let store = RedisStore::from_url(&format!("{}#insecure", server.url())).unwrap();
    grants_and_releases(store).await;
}

#[tokio::test]
async fn rediss_trusting_the_servers_ca_grants_and_releases() {
    let server = TlsServer::start();
    grants_and_releases(server.store_trusting("ca.crt")).await;
}

/// A store that does not trust the server's certificate answers an error
/// within its command timeout.
async fn refused_promptly(store: RedisStore) {
    let key = LockKey::new("tls", "job-2").unwrap();
    // A hang fails here instead of hanging the suite; promptness itself is
    // the check below that the handshake refused, not the command timeout.
    let err = tokio::time::timeout(
        Duration::from_secs(30),
        store.acquire(&key, &OwnerToken::generate(), Duration::from_secs(10)),
    )
    .await
    .expect("the acquire hung on a TLS refusal")
    .unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    // Refused by the handshake, not left to the timeout.
    let text = format!("{err} {:?}", std::error::Error::source(&err));
    assert!(!text.contains("no answer from Redis"), "{text}");
    assert!(text.to_lowercase().contains("certificate"), "{text}");
}

#[tokio::test]
async fn a_certificate_from_another_ca_is_refused_promptly() {
    let server = TlsServer::start();
    refused_promptly(server.store_trusting("other-ca.crt")).await;
}

#[tokio::test]
async fn rediss_without_insecure_refuses_an_unknown_ca_promptly() {
    let server = TlsServer::start();
    let store = RedisStore::builder(&server.url())
        .command_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    refused_promptly(store).await;
}

/// Through the HTTP layer: a server whose certificate comes from another CA
/// is a store that cannot be reached, so the request is answered `503`
/// with `Retry-After` (fail closed) and the handler never runs.
#[tokio::test]
async fn the_layer_answers_503_when_the_servers_ca_is_not_trusted() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use axum::Router;
    use axum::body::Body;
    use axum::routing::post;
    use http::{Request, StatusCode, header};
    use tower::ServiceExt;
    use tower_redis_lock::{KeyFrom, LockLayer};

    let server = TlsServer::start();
    let locker = Locker::builder(server.store_trusting("other-ca.crt"))
        .build()
        .unwrap();
    let layer = LockLayer::builder(locker, KeyFrom::path_param::<String>("id"))
        .namespace("tls")
        .build()
        .unwrap();
    let ran = Arc::new(AtomicBool::new(false));
    let handler = {
        let ran = ran.clone();
        move || async move { ran.store(true, Ordering::SeqCst) }
    };
    let app = Router::new()
        .route("/jobs/{id}", post(handler))
        .route_layer(layer);
    let request = Request::post("/jobs/1").body(Body::empty()).unwrap();
    let res = tokio::time::timeout(Duration::from_secs(30), app.oneshot(request))
        .await
        .expect("the layer hung on a TLS refusal")
        .unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(res.headers().contains_key(header::RETRY_AFTER), "{res:?}");
    assert!(
        !ran.load(Ordering::SeqCst),
        "the handler ran without its lock"
    );
}

/// A Sentinel set whose every process serves TLS with the certificates of
/// `certs` (`make_certs`), replicating and monitoring over TLS.
fn tls_sentinel_set(certs: &Path) -> SentinelSet {
    tls_sentinel_set_with(certs, &[])
}

/// [`tls_sentinel_set`] with `data_args` for the primary and replica.
fn tls_sentinel_set_with(certs: &Path, data_args: &[&str]) -> SentinelSet {
    let path = |f: &str| certs.join(f).to_str().unwrap().to_owned();
    let tls_args = [
        "--tls-cert-file".to_string(),
        path("server.crt"),
        "--tls-key-file".into(),
        path("server.key"),
        "--tls-ca-cert-file".into(),
        path("ca.crt"),
        "--tls-auth-clients".into(),
        "no".into(),
    ];
    SentinelSet::start_with(&SentinelOptions {
        tls_args: tls_args.to_vec(),
        data_args: data_args.iter().map(|a| a.to_string()).collect(),
        ..SentinelOptions::default()
    })
}

/// A store on `set`'s Sentinels over `rediss://` (their certificates
/// unchecked: their CA is not the platform's), waiting for the replica.
fn tls_sentinel_builder(set: &SentinelSet) -> RedisStoreBuilder {
    let urls: Vec<String> = set
        .sentinel_tls_urls()
        .into_iter()
        .map(|u| format!("{u}#insecure"))
        .collect();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    RedisStore::sentinel_builder(&urls, &set.master_name)
        .command_timeout(Duration::from_secs(2))
        .wait_replicas(1, Duration::from_millis(500), ReplicaShortfall::Fail)
}

/// The data nodes take the Sentinel URLs' TLS mode (before, the store
/// dialled the primary's TLS port in plain TCP, and every acquire failed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_data_nodes_take_the_tls_of_the_sentinel_urls() {
    let certs = make_certs();
    let set = tls_sentinel_set(certs.path());
    grants_and_releases(tls_sentinel_builder(&set).build().unwrap()).await;
}

/// Checked TLS to the data nodes, trusting their private CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_data_nodes_trust_the_root_certificates_given() {
    let certs = make_certs();
    let set = tls_sentinel_set(certs.path());
    let ca = std::fs::read(certs.path().join("ca.crt")).unwrap();
    let store = tls_sentinel_builder(&set)
        .data_nodes(
            DataNodes::new()
                .with_tls(NodeTls::Verified)
                .with_root_certificates(ca),
        )
        .build()
        .unwrap();
    grants_and_releases(store).await;

    // Trusting another CA: a certificate error, at once.
    let other = std::fs::read(certs.path().join("other-ca.crt")).unwrap();
    let store = tls_sentinel_builder(&set)
        .data_nodes(DataNodes::new().with_root_certificates(other))
        .build()
        .unwrap();
    refused_promptly(store).await;
}

/// Data nodes that ask every client for a certificate (mutual TLS): the
/// store presents the one `DataNodes` gives (here the servers' own, signed
/// by their CA) on every connection to them; without it the handshake is
/// refused, and said so at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_data_nodes_get_the_client_certificate_given() {
    let certs = make_certs();
    let set = tls_sentinel_set_with(certs.path(), &["--tls-auth-clients", "yes"]);
    let pem = |f: &str| std::fs::read(certs.path().join(f)).unwrap();
    let store = tls_sentinel_builder(&set)
        .data_nodes(
            DataNodes::new()
                .with_root_certificates(pem("ca.crt"))
                .with_client_certificate(pem("server.crt"), pem("server.key")),
        )
        .build()
        .unwrap();
    grants_and_releases(store).await;

    let without = DataNodes::new().with_root_certificates(pem("ca.crt"));
    refused_promptly(
        tls_sentinel_builder(&set)
            .data_nodes(without)
            .build()
            .unwrap(),
    )
    .await;
}

/// A URL store trusts the private CA given to its builder (commands and
/// notifications), with no client code of the application's own.
#[tokio::test]
async fn a_url_store_trusts_the_private_ca_given_to_its_builder() {
    let server = TlsServer::start();
    let store = RedisStore::builder(&server.url())
        .root_certificates(server.pem("ca.crt"))
        .command_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    grants_and_releases(store).await;
}

/// Given the wrong CA, the store is refused at the handshake, and the
/// locker's log line for the outage says why (the TLS cause, not only
/// "unavailable").
#[tokio::test]
async fn a_url_store_given_another_ca_is_refused_and_the_log_says_why() {
    let server = TlsServer::start();
    let store = || {
        RedisStore::builder(&server.url())
            .root_certificates(server.pem("other-ca.crt"))
            .command_timeout(Duration::from_secs(1))
            .build()
            .unwrap()
    };
    refused_promptly(store()).await;
    let (logs, _guard) = support::logs::Logs::capture();
    let locker = Locker::new(store());
    let err = locker
        .try_acquire(&LockKey::new("tls", "logged").unwrap())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    let text = logs.text();
    let line = text
        .lines()
        .find(|l| l.contains("ERROR"))
        .unwrap_or_else(|| panic!("no ERROR line: {text}"));
    assert!(
        line.to_lowercase().contains("certificate") || line.contains("UnknownIssuer"),
        "the cause is not in the log line: {line}"
    );
}

/// A server that asks every client for a certificate: the one given to
/// the builder is presented; without it the store is refused.
#[tokio::test]
async fn a_url_store_presents_the_client_certificate_given_to_its_builder() {
    let server = TlsServer::start_with("yes");
    let with = RedisStore::builder(&server.url())
        .root_certificates(server.pem("ca.crt"))
        .client_certificate(server.pem("server.crt"), server.pem("server.key"))
        .command_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    grants_and_releases(with).await;
    let without = RedisStore::builder(&server.url())
        .root_certificates(server.pem("ca.crt"))
        .command_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let key = LockKey::new("tls", "no-client-cert").unwrap();
    let err = tokio::time::timeout(
        Duration::from_secs(30),
        without.acquire(&key, &OwnerToken::generate(), Duration::from_secs(10)),
    )
    .await
    .expect("the acquire hung")
    .unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
}

/// Certificates are for a `rediss://` URL store: on a plain URL, or a
/// store of another kind, `build` says so.
#[test]
fn certificates_on_a_store_that_cannot_use_them_are_a_config_error() {
    let plain = RedisStore::builder("redis://127.0.0.1:6379/")
        .root_certificates(b"-----BEGIN CERTIFICATE-----".to_vec())
        .build()
        .unwrap_err();
    assert_eq!(plain.setting(), "root_certificates");
    assert!(plain.to_string().contains("rediss://"), "{plain}");
    let cluster = RedisStore::cluster_builder(&["rediss://127.0.0.1:7000/"])
        .client_certificate(b"cert".to_vec(), b"key".to_vec())
        .build()
        .unwrap_err();
    assert_eq!(cluster.setting(), "client_certificate");
}

/// The route without code: `SSL_CERT_FILE` names a PEM bundle holding
/// the private CA, and a store made from the URL alone trusts it (the
/// roots are read at each connection). The variable is process-wide and
/// setting it while other threads read the environment is unsound, so the
/// store runs in a child process of this test binary (the test below,
/// which does the work only when the parent gives it a URL), with the
/// variable set for that process alone; without it, the same child is
/// refused.
#[test]
fn ssl_cert_file_makes_a_url_store_trust_the_private_ca() {
    let server = TlsServer::start();
    let child = |bundle: Option<&Path>| {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args([
            "--exact",
            "ssl_cert_file_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("TRL_TLS_CHILD_URL", server.url())
        .env_remove("SSL_CERT_FILE");
        if let Some(b) = bundle {
            cmd.env("SSL_CERT_FILE", b);
        }
        let out = cmd.output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (ok, out) = child(Some(&server.dir.path().join("ca.crt")));
    assert!(ok && out.contains("granted over TLS"), "{out}");
    let (ok, out) = child(None);
    assert!(!ok, "trusted without the bundle: {out}");
}

/// The child of the test above: with `TRL_TLS_CHILD_URL`, takes a lock on
/// that URL (and fails if it cannot); run by the suite, does nothing.
#[tokio::test]
async fn ssl_cert_file_child() {
    let Ok(url) = std::env::var("TRL_TLS_CHILD_URL") else {
        return;
    };
    let _ = rustls::crypto::ring::default_provider().install_default();
    let store = RedisStore::builder(&url)
        .command_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let granted = store
        .acquire(
            &LockKey::new("tls", "ssl-cert-file").unwrap(),
            &OwnerToken::generate(),
            Duration::from_secs(10),
        )
        .await;
    assert!(
        matches!(granted, Ok(tower_redis_lock::AcquireOutcome::Granted(_))),
        "{granted:?}"
    );
    println!("granted over TLS");
}
