//! Start-up plumbing shared by the example servers: exit codes, logging,
//! and hiding passwords in the banner.

use std::io::IsTerminal;
use std::process::ExitCode;

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
