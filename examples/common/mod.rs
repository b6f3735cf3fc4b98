//! Plumbing shared by the example servers: exit codes, logging, hiding
//! passwords in the banner, and the HTTP server with its time limits.

use std::future::Future;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tower_http::timeout::{RequestBodyDeadlineLayer, TimeoutLayer};
use tower_layer::Layer;

/// What went wrong on start, and the exit code it maps to.
pub enum Failure {
    /// A bad environment value: exit code 2.
    Usage(String),
    /// The server could not start or failed: exit code 1.
    Runtime(String),
}

/// Prints a failure as `<program>: <message>` and picks the exit code.
pub fn exit_code(program: &str, result: Result<(), Failure>) -> ExitCode {
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
pub fn init_tracing() -> Result<(), Failure> {
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
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}***{}", &url[..s + 3], &url[at..]),
        _ => url.to_owned(),
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
        let ms = |name: &str, default: Duration| -> Result<Duration, String> {
            match var(name).filter(|v| !v.trim().is_empty()) {
                None => Ok(default),
                Some(v) => match v.trim().parse::<u64>() {
                    Ok(n) if n > 0 => Ok(Duration::from_millis(n)),
                    _ => Err(format!(
                        "{name}={v:?} is not valid: expected a whole number of milliseconds, \
                         at least 1"
                    )),
                },
            }
        };
        Ok(Timeouts {
            header: ms("HEADER_TIMEOUT_MS", defaults.header)?,
            body: ms("BODY_TIMEOUT_MS", defaults.body)?,
            request: ms("REQUEST_TIMEOUT_MS", defaults.request)?,
        })
    }
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
