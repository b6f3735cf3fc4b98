//! Plumbing shared by the example servers: `main` (logging, exit codes),
//! reading the environment, picking the store, hiding passwords in the
//! banner, and the HTTP server with its time limits.

use std::fmt;
use std::future::Future;
use std::io::IsTerminal;
use std::net::{Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tower_http::timeout::{RequestBodyDeadlineLayer, TimeoutLayer};
use tower_layer::Layer;
use tower_redis_lock::layer::PROBLEM_JSON;
use tower_redis_lock::{BoxStore, MemoryStore, RedisStore};

/// What went wrong on start, and the exit code it maps to.
pub enum Failure {
    /// A bad environment value: exit code 2.
    Usage(String),
    /// The server could not start or failed: exit code 1.
    Runtime(String),
}

/// An example's `main`: starts logging, runs `run`, and turns its failure
/// into a message and an exit code.
pub async fn main<F>(program: &str, run: impl FnOnce() -> F) -> ExitCode
where
    F: Future<Output = Result<(), Failure>>,
{
    let result = match init_tracing() {
        Ok(()) => run().await,
        Err(failure) => Err(failure),
    };
    exit_code(program, result)
}

/// Prints a failure as `<program>: <message>` and picks the exit code.
fn exit_code(program: &str, result: Result<(), Failure>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(msg)) => {
            eprintln!("{program}: {msg}");
            ExitCode::from(2)
        }
        Err(Failure::Runtime(msg)) => {
            eprintln!("{program}: {msg}");
            ExitCode::FAILURE
        }
    }
}

/// Logs to stderr with the `RUST_LOG` filter (default `info`).
fn init_tracing() -> Result<(), Failure> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(v) if !v.trim().is_empty() => tracing_subscriber::EnvFilter::try_new(&v)
            .map_err(|e| Failure::Usage(format!("RUST_LOG={v:?} is not valid: {e}")))?,
        _ => tracing_subscriber::EnvFilter::new("info"),
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    Ok(())
}

/// `redis://user:secret@host/` → `redis://***@host/`, for the start banner.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}***{}", &url[..s + 3], &url[at..]),
        _ => url.to_owned(),
    }
}

/// The environment as an example reads it, through a lookup (the process
/// environment in `main`, a table in tests): an unset or blank variable
/// takes its default.
pub struct Env<F>(pub F);

impl<F: Fn(&str) -> Option<String>> Env<F> {
    /// The value of `name`, unless unset or blank.
    pub fn get(&self, name: &str) -> Option<String> {
        (self.0)(name).filter(|v| !v.trim().is_empty())
    }

    /// `PORT`: a port on 127.0.0.1, 3000 by default (0 picks a free one).
    pub fn port(&self) -> Result<u16, String> {
        match self.get("PORT") {
            None => Ok(3000),
            Some(v) => v
                .trim()
                .parse::<u16>()
                .map_err(|_| format!("PORT={v:?} is not valid: expected a port, 0 to 65535")),
        }
    }

    /// A whole number of milliseconds in `name`, zero included.
    // (The admin example reads no duration of its own.)
    #[allow(dead_code)]
    pub fn millis(&self, name: &str, default: Duration) -> Result<Duration, String> {
        match self.get(name) {
            None => Ok(default),
            Some(v) => v
                .trim()
                .parse::<u64>()
                .map(Duration::from_millis)
                .map_err(|_| {
                    format!("{name}={v:?} is not valid: expected a whole number of milliseconds")
                }),
        }
    }

    /// Like [`Env::millis`], but zero is refused.
    fn positive_millis(&self, name: &str, default: Duration) -> Result<Duration, String> {
        match self.get(name) {
            None => Ok(default),
            Some(v) => match v.trim().parse::<u64>() {
                Ok(n) if n > 0 => Ok(Duration::from_millis(n)),
                _ => Err(format!(
                    "{name}={v:?} is not valid: expected a whole number of milliseconds, \
                     at least 1"
                )),
            },
        }
    }
}

/// The store `REDIS_URL` asks for: Redis at that URL, else in memory;
/// boxed, so that the example's state has one type either way. With the
/// start banner's description of it.
pub fn store(redis_url: Option<&str>) -> Result<(BoxStore, String), Failure> {
    match redis_url {
        Some(url) => {
            let store = RedisStore::from_url(url)
                .map_err(|e| Failure::Usage(format!("REDIS_URL is not valid: {e}")))?;
            Ok((BoxStore::new(store), format!("Redis at {}", redact(url))))
        }
        None => Ok((
            BoxStore::new(MemoryStore::new()),
            "in-memory (set REDIS_URL to use Redis)".to_owned(),
        )),
    }
}

/// How long a client may take, so that a slow or silent one cannot hold a
/// connection (and its memory) for ever.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// From the first byte of a request head (or the end of the previous
    /// request on a kept-alive connection) to its last: a client that has
    /// not sent a whole head by then is disconnected without an answer.
    pub header: Duration,
    /// From the end of the head to the end of the body, however the bytes
    /// trickle in: a body read past it fails (the webhook answers 408).
    pub body: Duration,
    /// From the end of the head to the answer: past it the request is
    /// dropped (its lock released) and the client gets an empty `408`.
    pub request: Duration,
}

impl Timeouts {
    /// Reads `HEADER_TIMEOUT_MS`, `BODY_TIMEOUT_MS` and `REQUEST_TIMEOUT_MS`
    /// through `var`; unset or empty takes the value in `defaults`. Zero is
    /// refused: it would disable nothing and refuse everything.
    pub fn from_lookup(
        var: impl Fn(&str) -> Option<String>,
        defaults: Timeouts,
    ) -> Result<Timeouts, String> {
        let env = Env(var);
        Ok(Timeouts {
            header: env.positive_millis("HEADER_TIMEOUT_MS", defaults.header)?,
            body: env.positive_millis("BODY_TIMEOUT_MS", defaults.body)?,
            request: env.positive_millis("REQUEST_TIMEOUT_MS", defaults.request)?,
        })
    }
}

/// `timeouts: header 10000 ms, body 10000 ms, request 30000 ms`, for the
/// start banner.
impl fmt::Display for Timeouts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "timeouts: header {} ms, body {} ms, request {} ms",
            self.header.as_millis(),
            self.body.as_millis(),
            self.request.as_millis()
        )
    }
}

/// Listens on 127.0.0.1:`port`, prints `banner(local address)`, and
/// [serves](serve) `router` within `timeouts` until Ctrl-C.
pub async fn listen(
    port: u16,
    router: Router,
    timeouts: Timeouts,
    banner: impl FnOnce(SocketAddr),
) -> Result<(), Failure> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| Failure::Runtime(format!("cannot listen on {addr}: {e}")))?;
    banner(listener.local_addr().unwrap_or(addr));
    serve(listener, router, timeouts, async {
        let _ = tokio::signal::ctrl_c().await;
        tracing::info!("shutting down");
    })
    .await;
    Ok(())
}

/// Serves `router` on `listener` over HTTP/1.1 until `shutdown` completes,
/// within `timeouts`: hyper's header-read timeout on each connection,
/// tower-http's [`RequestBodyDeadlineLayer`] on each body and its
/// [`TimeoutLayer`] on each request. (`axum::serve` sets no header-read
/// timeout: a client sending one byte a second kept its connection for
/// ever.)
///
/// On `shutdown`, no new connection is accepted; each open one finishes its
/// request in flight (at most `timeouts.request`) and closes.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    timeouts: Timeouts,
    shutdown: impl Future<Output = ()>,
) {
    let service = TimeoutLayer::with_status_code(StatusCode::REQUEST_TIMEOUT, timeouts.request)
        .layer(RequestBodyDeadlineLayer::new(timeouts.body).layer(router));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(timeouts.header);
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors, most likely: let some close.
                    tracing::warn!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let conn = http.serve_connection(
            TokioIo::new(stream),
            TowerToHyperService::new(service.clone()),
        );
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                // A header timeout, a client gone mid-request, a bad request.
                tracing::debug!(error = %e, "connection ended");
            }
        });
    }
    drop(listener);
    tracing::info!("shutting down: finishing the requests in flight");
    if tokio::time::timeout(timeouts.request + timeouts.header, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("some connections did not finish in time");
    }
}

/// An RFC 9457 answer, like the lock layer's own (the webhook examples'
/// own refusals; the demo has none).
#[allow(dead_code)]
pub fn problem(status: StatusCode, detail: &str) -> Response {
    let body = serde_json::json!({
        "type": "about:blank",
        "title": status.canonical_reason().unwrap_or("Error"),
        "status": status.as_u16(),
        "detail": detail,
    });
    let mut res = (status, body.to_string()).into_response();
    res.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    res
}

/// `503` with `Retry-After: 1`: a resource behind the handler is down, the
/// sender should retry soon.
#[allow(dead_code)]
pub fn unavailable(detail: &str) -> Response {
    let mut res = problem(StatusCode::SERVICE_UNAVAILABLE, detail);
    res.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    res
}
