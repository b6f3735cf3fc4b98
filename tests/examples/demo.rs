//! The contract of `examples/demo.rs`, over real TCP.
//!
//! The example is compiled into this test (`#[path]` below) and served by
//! its own `serve` (hyper with the example's time limits) on 127.0.0.1:0,
//! with the memory store and with
//! a real `redis-server` from the test support. The requests go through a
//! real HTTP/1.1 client (hyper), so status lines, headers and bodies are
//! what a user of `cargo run --example demo` sees.
//!
//! No test waits a fixed time: the second request of a pair is sent once
//! the locker reports the first request's lease (so the first is inside its
//! handler), and the rare run where the first job ended before the second
//! arrived is retried with a longer job.
//!
//! Slow clients (a head sent in part or a byte at a time, an idle
//! connection, a job past the request timeout) run against a server whose
//! one limit under test is short and whose others are longer than any wait
//! here: the connection must close (or be answered) at all, within a
//! generous bound, and no test measures how soon.

use crate::support;

#[allow(dead_code)]
#[path = "../../examples/demo.rs"]
mod demo;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Empty, Full};
use hyper_util::rt::TokioIo;
use support::{RedisServer, slow};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tower_redis_lock::{LockStore, Locker, MemoryStore, RedisStore};

/// Upper bound on waiting for a condition (a hang guard, not a timing check).
const PATIENCE: Duration = Duration::from_secs(20);
/// `work_ms` of the first job of a pair, per attempt: a longer job on a
/// machine too busy to send the second request in time.
const WORK_MS: [u64; 3] = [300, 2_000, 10_000];

/// One answer, read whole.
#[derive(Debug)]
struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {:?}", self.body))
    }
}

/// Sends one request on a fresh connection.
async fn send(addr: SocketAddr, method: Method, path: &str) -> Reply {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header(header::HOST, addr.to_string())
        .body(Empty::<Bytes>::new())
        .expect("request");
    exchange(addr, req).await
}

/// POSTs a JSON body to `path` on a fresh connection.
async fn post_json(addr: SocketAddr, path: &str, json: &str) -> Reply {
    let req = Request::post(path)
        .header(header::HOST, addr.to_string())
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(json.to_owned())))
        .expect("request");
    exchange(addr, req).await
}

/// Sends `req` on a fresh connection and reads the whole answer.
async fn exchange<B>(addr: SocketAddr, req: Request<B>) -> Reply
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("HTTP/1.1 handshake");
    let conn = tokio::spawn(conn);
    let res = sender.send_request(req).await.expect("response");
    let (parts, body) = res.into_parts();
    let body = body.collect().await.expect("response body").to_bytes();
    drop(sender);
    let _ = conn.await;
    Reply {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}

/// The demo's app, served on a free port until dropped.
struct Server {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Server {
    async fn start<St: LockStore>(locker: Locker<St>) -> Server {
        Server::start_with(locker, demo::DEFAULT_TIMEOUTS).await
    }

    async fn start_with<St: LockStore>(locker: Locker<St>, timeouts: demo::Timeouts) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let task = tokio::spawn(demo::serve(
            listener,
            locker,
            timeouts,
            std::future::pending(),
        ));
        Server { addr, task }
    }

    async fn post(&self, path: &str) -> Reply {
        send(self.addr, Method::POST, path).await
    }

    async fn get(&self, path: &str) -> Reply {
        send(self.addr, Method::GET, path).await
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Polls `cond` until it holds; panics after [`PATIENCE`].
async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    assert!(
        support::eventually(PATIENCE, async || cond()).await,
        "gave up waiting until {what}"
    );
}

/// A 200 job answer: JSON `{"id", "fencing_token"}` whose token equals the
/// `fencing-token` header. Returns the token.
fn job_ok(reply: &Reply, id: &str) -> u64 {
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    assert_eq!(reply.header("content-type"), Some("application/json"));
    let json = reply.json();
    assert_eq!(json["id"], id, "{json}");
    let token = json["fencing_token"]
        .as_u64()
        .unwrap_or_else(|| panic!("fencing_token is not a JSON number: {json}"));
    let header: u64 = reply
        .header("fencing-token")
        .expect("fencing-token header")
        .parse()
        .expect("fencing-token header is a number");
    assert_eq!(header, token, "header and body disagree");
    token
}

/// The layer's contention answer: 409 problem+json with `Retry-After`.
fn contended(reply: &Reply, id: &str) {
    assert_eq!(reply.status, StatusCode::CONFLICT, "{reply:?}");
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json")
    );
    let retry: u64 = reply
        .header("retry-after")
        .expect("Retry-After header")
        .parse()
        .expect("Retry-After in whole seconds");
    assert!(retry >= 1);
    assert!(reply.header("fencing-token").is_none());
    let json = reply.json();
    assert_eq!(json["status"], 409, "{json}");
    // The default body tells the client what to do, not how the server
    // names its locks.
    assert_eq!(json.get("lock_key"), None, "{json}");
    let detail = json["detail"].as_str().unwrap();
    assert!(
        !detail.contains(demo::NAMESPACE) && !detail.contains(&format!(":{id}")),
        "{json}"
    );
}

/// The whole contract against one store.
async fn contract<St: LockStore>(locker: Locker<St>) {
    let server = Server::start(locker.clone()).await;

    let health = server.get("/healthz").await;
    assert_eq!(health.status, StatusCode::OK);
    assert!(health.header("fencing-token").is_none());

    // Two requests for job `a`: the second arrives while the first runs.
    let mut first_token = None;
    for work_ms in WORK_MS {
        until("no lease is held", || locker.renewing() == 0).await;
        let path = format!("/jobs/a?work_ms={work_ms}");
        let first = {
            let addr = server.addr;
            let path = path.clone();
            tokio::spawn(async move { send(addr, Method::POST, &path).await })
        };
        until("the first job holds its lock", || {
            locker.renewing() == 1 || first.is_finished()
        })
        .await;

        // /healthz is outside the layer: still 200 while `a` is locked.
        let health = server.get("/healthz").await;
        assert_eq!(health.status, StatusCode::OK);
        assert!(health.header("fencing-token").is_none());

        let second = server.post(&path).await;
        let first = first.await.expect("first request task");
        match second.status {
            StatusCode::CONFLICT => {
                contended(&second, "a");
                first_token = Some(job_ok(&first, "a"));
                break;
            }
            // The first job ended before the second arrived (a busy
            // machine): both ran, one after the other. Try a longer job.
            StatusCode::OK if first.status == StatusCode::OK => {
                assert_ne!(job_ok(&first, "a"), job_ok(&second, "a"));
            }
            _ => panic!("unexpected answers: first {first:?}, second {second:?}"),
        }
    }
    let first_token = first_token.expect("the second request of a pair never got 409");

    // Later, the lock is free again and the next job gets a larger token.
    let later = server.post("/jobs/a?work_ms=0").await;
    assert!(job_ok(&later, "a") > first_token);

    // Other ids do not contend, and the default work time is used.
    let b = server.post("/jobs/b").await;
    job_ok(&b, "b");

    // A bad work_ms is the handler's 400 (the lock is taken and released).
    let bad = server.post("/jobs/a?work_ms=soon").await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);

    // Only `POST /jobs/{id}` is locked: a wrong method is axum's 405 and an
    // unknown path axum's 404, neither with a lock (no fencing token).
    let wrong_method = server.get("/jobs/a").await;
    assert_eq!(wrong_method.status, StatusCode::METHOD_NOT_ALLOWED);
    assert!(wrong_method.header("fencing-token").is_none());
    let unknown = server.post("/jobs").await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    let after = server.post("/jobs/a?work_ms=0").await;
    assert!(job_ok(&after, "a") > job_ok(&later, "a"));

    until("every lease is released", || locker.renewing() == 0).await;
}

fn demo_locker<St: LockStore>(store: St) -> Locker<St> {
    demo::Settings::from_lookup(|_| None)
        .expect("defaults")
        .locker(store)
        .expect("default locker")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_with_memory_store() {
    let store = MemoryStore::new();
    contract(demo_locker(store.clone())).await;
    assert_eq!(store.held_count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_with_redis() {
    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .expect("redis-server");
    let store = RedisStore::from_url(&server.url()).expect("store");
    contract(demo_locker(store)).await;
    let keys = tokio::task::spawn_blocking(move || {
        let keys = server.keys();
        drop(server);
        keys
    })
    .await
    .expect("keys");
    assert!(
        keys.iter().all(|k| !k.ends_with(":lock")),
        "a lock key was left behind: {keys:?}"
    );
}

/// The export route: two exports of a tenant run at once, a third gets
/// 429 problem+json with `Retry-After`; another tenant is not limited; the
/// permits are given back.
async fn export_limit<St: LockStore>(locker: Locker<St>) {
    let server = Server::start(locker.clone()).await;
    let long = "/tenants/acme/export?work_ms=4000";
    let spawn = |path: &'static str| {
        let addr = server.addr;
        tokio::spawn(async move { send(addr, Method::POST, path).await })
    };
    let (a, b) = (spawn(long), spawn(long));
    until("two exports hold their permits", || locker.renewing() == 2).await;
    let third = server.post("/tenants/acme/export?work_ms=0").await;
    assert_eq!(third.status, StatusCode::TOO_MANY_REQUESTS, "{third:?}");
    assert_eq!(
        third.header("content-type"),
        Some("application/problem+json")
    );
    let retry: u64 = third
        .header("retry-after")
        .expect("Retry-After")
        .parse()
        .unwrap();
    assert!(retry >= 1);
    assert!(third.header("fencing-token").is_none());
    assert_eq!(third.json()["status"], 429);
    let other = server.post("/tenants/globex/export?work_ms=0").await;
    job_ok(&other, "globex");
    let (a, b) = (a.await.unwrap(), b.await.unwrap());
    assert_ne!(job_ok(&a, "acme"), job_ok(&b, "acme"));
    until("every permit is released", || locker.renewing() == 0).await;
    let after = server.post("/tenants/acme/export?work_ms=0").await;
    job_ok(&after, "acme");
}

/// The transfer route: both accounts locked as one for the transfer's
/// time; a transfer the other way meanwhile gets 409 problem+json with
/// `Retry-After`; one fencing-token value per account; both released.
async fn transfers<St: LockStore>(locker: Locker<St>) {
    let server = Server::start(locker.clone()).await;
    let addr = server.addr;
    let long = tokio::spawn(async move {
        post_json(
            addr,
            "/transfers?work_ms=4000",
            r#"{"from":"A-1","to":"B-7","cents":500}"#,
        )
        .await
    });
    until("the transfer holds both accounts", || {
        locker.renewing() == 2
    })
    .await;
    let back = post_json(
        addr,
        "/transfers",
        r#"{"from":"B-7","to":"A-1","cents":100}"#,
    )
    .await;
    assert_eq!(back.status, StatusCode::CONFLICT, "{back:?}");
    assert_eq!(
        back.header("content-type"),
        Some("application/problem+json")
    );
    assert!(back.header("retry-after").is_some(), "{back:?}");
    let other = post_json(addr, "/transfers", r#"{"from":"C-3","to":"D-4","cents":1}"#).await;
    assert_eq!(other.status, StatusCode::OK, "{other:?}");
    let long = long.await.unwrap();
    assert_eq!(long.status, StatusCode::OK, "{long:?}");
    let tokens: Vec<u64> = long
        .headers
        .get_all("fencing-token")
        .iter()
        .map(|v| v.to_str().unwrap().parse().unwrap())
        .collect();
    assert_eq!(tokens.len(), 2, "{long:?}");
    assert_eq!(long.json()["fencing_tokens"], serde_json::json!(tokens));
    until("both accounts are released", || locker.renewing() == 0).await;
    let after = post_json(
        addr,
        "/transfers",
        r#"{"from":"B-7","to":"A-1","cents":100}"#,
    )
    .await;
    assert_eq!(after.status, StatusCode::OK, "{after:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfers_with_memory_store() {
    transfers(demo_locker(MemoryStore::new())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfers_with_redis() {
    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .expect("redis-server");
    transfers(demo_locker(RedisStore::from_url(&server.url()).unwrap())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_limit_with_memory_store() {
    let store = MemoryStore::new();
    export_limit(demo_locker(store.clone())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_limit_with_redis() {
    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .expect("redis-server");
    let store = RedisStore::from_url(&server.url()).expect("store");
    export_limit(demo_locker(store)).await;
    let keys = tokio::task::spawn_blocking(move || {
        let keys = server.keys();
        drop(server);
        keys
    })
    .await
    .expect("keys");
    assert!(
        keys.iter().all(|k| k.ends_with(":fence")),
        "left behind: {keys:?}"
    );
}

/// The documents' route: two reads run side by side, a write while they
/// run is refused with 409 and Retry-After, then runs alone with a token
/// above the reads'; a read after it carries its token at least.
async fn doc_read_write<St: LockStore>(locker: Locker<St>) {
    let server = Server::start(locker.clone()).await;
    let long = "/docs/readme?work_ms=4000";
    let spawn = |method: Method, path: &'static str| {
        let addr = server.addr;
        tokio::spawn(async move { send(addr, method, path).await })
    };
    let (a, b) = (spawn(Method::GET, long), spawn(Method::GET, long));
    until("two reads hold the document", || locker.renewing() == 2).await;
    let write = send(server.addr, Method::PUT, "/docs/readme?work_ms=0").await;
    assert_eq!(write.status, StatusCode::CONFLICT, "{write:?}");
    assert_eq!(
        write.header("content-type"),
        Some("application/problem+json")
    );
    assert!(write.header("retry-after").is_some(), "{write:?}");
    let other = send(server.addr, Method::PUT, "/docs/other?work_ms=0").await;
    job_ok(&other, "other");
    let (a, b) = (a.await.unwrap(), b.await.unwrap());
    let read = job_ok(&a, "readme").max(job_ok(&b, "readme"));
    until("both reads are released", || locker.renewing() == 0).await;
    let write = send(server.addr, Method::PUT, "/docs/readme?work_ms=0").await;
    let written = job_ok(&write, "readme");
    assert!(written > read, "write {written} after reads up to {read}");
    let after = server.get("/docs/readme?work_ms=0").await;
    assert!(job_ok(&after, "readme") >= written);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doc_read_write_with_memory_store() {
    doc_read_write(demo_locker(MemoryStore::new())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doc_read_write_with_redis() {
    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .expect("redis-server");
    let store = RedisStore::from_url(&server.url()).expect("store");
    doc_read_write(demo_locker(store)).await;
    let keys = tokio::task::spawn_blocking(move || {
        let keys = server.keys_besides_counters();
        drop(server);
        keys
    })
    .await
    .expect("keys");
    assert!(keys.is_empty(), "left behind: {keys:?}");
}

// ---------------------------------------------------------------------------
// Slow and silent clients
// ---------------------------------------------------------------------------

/// Longer than any test waits: a limit that must not be the one that acts.
const NEVER: Duration = Duration::from_secs(600);
/// The one limit under test.
const SHORT: Duration = Duration::from_millis(300);

/// Timeouts read from the environment as the demo's `main` does, so the
/// variables themselves are under test.
fn timeouts(header: Duration, body: Duration, request: Duration) -> demo::Timeouts {
    let ms = |d: Duration| d.as_millis().to_string();
    let s = demo::Settings::from_lookup(|name| match name {
        "HEADER_TIMEOUT_MS" => Some(ms(header)),
        "BODY_TIMEOUT_MS" => Some(ms(body)),
        "REQUEST_TIMEOUT_MS" => Some(ms(request)),
        _ => None,
    })
    .expect("timeout settings");
    assert_eq!(s.timeouts.header, header);
    s.timeouts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_sent_in_part_or_a_byte_at_a_time_is_cut_off() {
    let locker = demo_locker(MemoryStore::new());
    let server = Server::start_with(locker.clone(), timeouts(SHORT, NEVER, NEVER)).await;
    let head = format!(
        "POST /jobs/slow HTTP/1.1\r\nHost: {}\r\nX-Padding: {}\r\n\r\n",
        server.addr,
        "x".repeat(2_000)
    );

    let request = format!(
        "POST /jobs/idle?work_ms=0 HTTP/1.1\r\nHost: {}\r\nContent-Length: 0\r\n\r\n",
        server.addr
    );

    // Four clients at once, each waited on until the server closes it.
    let mut part = slow::open(server.addr, &head.as_bytes()[..30]).await;
    let (mut trickled, write) = TcpStream::connect(server.addr)
        .await
        .expect("connect")
        .into_split();
    // The whole head, a byte every 20 ms, would take 40 s.
    let writer = slow::trickle(write, head.clone().into_bytes(), Duration::from_millis(20));
    let mut silent = slow::open(server.addr, b"").await;
    // An idle kept-alive connection, after one whole request.
    let mut idle = slow::open(server.addr, request.as_bytes()).await;
    let (part, trickled, silent, idle) = tokio::join!(
        slow::until_closed(&mut part, PATIENCE),
        slow::until_closed(&mut trickled, PATIENCE),
        slow::until_closed(&mut silent, PATIENCE),
        slow::until_closed(&mut idle, PATIENCE),
    );
    let kept: Vec<&str> = [
        ("a half-sent head", part.is_none()),
        ("a trickled head", trickled.is_none()),
        ("a silent connection", silent.is_none()),
        ("an idle kept-alive connection", idle.is_none()),
    ]
    .into_iter()
    .filter_map(|(what, kept)| kept.then_some(what))
    .collect();
    assert!(kept.is_empty(), "connections kept open: {kept:?}");
    let part = part.unwrap();
    assert!(part.status().is_none_or(|s| s == 408), "{}", part.text());
    let (written, _write) = writer.await.expect("trickle task");
    assert!(written < head.len(), "the whole trickled head got through");
    let idle = idle.unwrap();
    assert_eq!(idle.status(), Some(200), "{}", idle.text());

    // None of them took a lock; the server still serves.
    job_ok(&server.post("/jobs/slow?work_ms=0").await, "slow");
    until("no lease is held", || locker.renewing() == 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_shorter_than_declared_is_answered_and_closed() {
    let locker = demo_locker(MemoryStore::new());
    let server = Server::start_with(locker.clone(), timeouts(NEVER, SHORT, NEVER)).await;
    // The job does not read its body: it is answered, and the connection,
    // whose body never ends, is closed rather than kept for the rest. (hyper
    // closes a connection whose request body was left unread, so this holds
    // even without the body deadline; the webhook, which reads its bodies,
    // is where the deadline acts: tests/webhook.rs.)
    let head = format!(
        "POST /jobs/short?work_ms=0 HTTP/1.1\r\nHost: {}\r\nContent-Length: 100\r\n\r\nonly ten b",
        server.addr
    );
    let mut stream = slow::open(server.addr, head.as_bytes()).await;
    let closed = slow::until_closed(&mut stream, PATIENCE)
        .await
        .expect("a body shorter than declared kept its connection");
    assert_eq!(closed.status(), Some(200), "{}", closed.text());
    until("no lease is held", || locker.renewing() == 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_past_the_request_timeout_gets_408_and_its_lock_is_released() {
    let store = MemoryStore::new();
    let locker = demo_locker(store.clone());
    let server = Server::start_with(locker, timeouts(NEVER, NEVER, SHORT)).await;
    // A job asked to work for longer than any wait here.
    let reply = tokio::time::timeout(PATIENCE, server.post("/jobs/long?work_ms=60000"))
        .await
        .expect("the request timeout did not answer");
    assert_eq!(reply.status, StatusCode::REQUEST_TIMEOUT, "{reply:?}");
    assert!(reply.header("fencing-token").is_none());
    // The dropped job released its lock (in the background, at once).
    let key = tower_redis_lock::LockKey::new("jobs", "long").unwrap();
    until("the job's lock is released", || !store.is_locked(&key)).await;
    job_ok(&server.post("/jobs/long?work_ms=0").await, "long");
}

#[test]
fn settings_defaults() {
    let s = demo::Settings::from_lookup(|_| None).unwrap();
    assert_eq!(s.port, 3000);
    assert_eq!(s.redis_url, None);
    assert_eq!(s.lease, Duration::from_secs(30));
    assert_eq!(s.wait, Duration::ZERO);
    assert_eq!(s.timeouts, demo::DEFAULT_TIMEOUTS);
    assert!(s.timeouts.request > demo::MAX_WORK);
    let blank = demo::Settings::from_lookup(|_| Some(" ".into())).unwrap();
    assert_eq!(blank, s);
}

#[test]
fn settings_from_environment() {
    let s = demo::Settings::from_lookup(|name| {
        Some(
            match name {
                "PORT" => "0",
                "REDIS_URL" => "redis://127.0.0.1:1/",
                "LOCK_LEASE_MS" => "1500",
                "LOCK_WAIT_MS" => "250",
                _ => return None,
            }
            .to_owned(),
        )
    })
    .unwrap();
    assert_eq!(s.port, 0);
    assert_eq!(s.redis_url.as_deref(), Some("redis://127.0.0.1:1/"));
    assert_eq!(s.lease, Duration::from_millis(1500));
    assert_eq!(s.wait, Duration::from_millis(250));
}

#[test]
fn bad_settings_name_the_variable() {
    for (var, value) in [
        ("PORT", "http"),
        ("PORT", "65536"),
        ("LOCK_LEASE_MS", "30s"),
        ("LOCK_WAIT_MS", "-1"),
        ("HEADER_TIMEOUT_MS", "0"),
        ("BODY_TIMEOUT_MS", "10s"),
        ("REQUEST_TIMEOUT_MS", "-5"),
    ] {
        let err = demo::Settings::from_lookup(|name| (name == var).then(|| value.to_owned()))
            .expect_err(value);
        assert!(err.starts_with(&format!("{var}=")), "{err}");
    }
    // In range for the parser, out of range for the locker.
    let s =
        demo::Settings::from_lookup(|name| (name == "LOCK_LEASE_MS").then(|| "5".into())).unwrap();
    let err = s.locker(MemoryStore::new()).unwrap_err();
    assert!(err.starts_with("LOCK_LEASE_MS=5"), "{err}");
}
