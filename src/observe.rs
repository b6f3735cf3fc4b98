//! Spans and metrics at the points of interest, one call per point so the
//! engine and the layer read as before.
//!
//! Spans (`tracing`, INFO level): `lock.acquire` around taking a lock (a
//! child of the caller's current span: the request's inside the layer),
//! `lock.hold` from the grant until the lock's state is gone (a sibling of
//! `lock.acquire`), and `lock.release` (a child of `lock.hold`) around
//! release and finish. `lock.acquire` and `lock.hold` carry `kind`: `lock`,
//! or `permit` for a [`Semaphore`](crate::Semaphore)'s. Metrics (the `metrics` facade, feature `metrics`):
//! the names, units and labels are in README's "Metrics" section; without
//! the feature the metric calls below are empty.

use std::sync::OnceLock;
use std::time::Duration;

use tracing::Span;
use tracing::field::Empty;

use crate::error::Error;
#[cfg(feature = "metrics")]
use crate::error::Operation;
use crate::key::LockKey;
use crate::store::LeaseKind;
use crate::token::FencingToken;

#[cfg(feature = "metrics")]
use crate::metrics as name;

/// The span of one acquire, a child of the caller's current span.
pub(crate) fn acquire_span(key: &LockKey, kind: LeaseKind, wait: Duration) -> Span {
    tracing::info_span!(
        "lock.acquire",
        key = %key,
        kind = kind_label(kind),
        namespace = key.namespace(),
        wait_ms = wait.as_millis() as u64,
        waited_us = Empty,
        contended = Empty,
        attempts = Empty,
        outcome = Empty,
        fencing_token = Empty,
    )
}

/// A lease kind as spans name it: `lock` or `permit`.
fn kind_label(kind: LeaseKind) -> &'static str {
    kind.as_str()
}

/// Records how an acquire ended, on `span` and in the metrics. `contended`:
/// the lock was found held at least once.
pub(crate) fn acquired(
    span: &Span,
    (key, kind): (&LockKey, LeaseKind),
    waited: Duration,
    contended: bool,
    result: &Result<Outcome, &Error>,
) {
    let outcome = match result {
        Ok(o) => o.as_str(),
        Err(Error::Contended { .. }) => "contended",
        Err(Error::WaitTimeout { .. }) => "timeout",
        Err(_) => "error",
    };
    span.record("waited_us", waited.as_micros() as u64);
    span.record("contended", contended);
    span.record("outcome", outcome);
    if let Ok(Outcome::Granted(Some(token))) = result {
        span.record("fencing_token", token);
    }
    if let Err(e) = result
        && e.is_store_failure()
    {
        store_error(e);
    }
    #[cfg(feature = "metrics")]
    {
        let ns = key.namespace().to_owned();
        let kind = kind_label(kind);
        ::metrics::counter!(name::ACQUIRES, "namespace" => ns.clone(), "kind" => kind, "outcome" => outcome)
            .increment(1);
        ::metrics::histogram!(name::ACQUIRE_DURATION, "namespace" => ns.clone(), "kind" => kind, "outcome" => outcome)
            .record(waited.as_secs_f64());
        if contended {
            ::metrics::counter!(name::CONTENDED, "namespace" => ns.clone(), "kind" => kind)
                .increment(1);
            ::metrics::histogram!(name::WAIT, "namespace" => ns, "kind" => kind)
                .record(waited.as_secs_f64());
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (key, kind);
}

/// How an acquire that did not fail ended.
#[derive(Clone, Copy)]
pub(crate) enum Outcome {
    /// With its fencing token (none for an unfenced store).
    Granted(Option<u64>),
    Reentered,
    Completed,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Granted(_) => "granted",
            Outcome::Reentered => "reentered",
            Outcome::Completed => "completed",
        }
    }
}

/// Opens the `lock.hold` span of a fresh grant, a child of the caller's
/// current span; it closes when the lock's state is gone.
pub(crate) fn hold_started(
    hold: &OnceLock<Span>,
    key: &LockKey,
    kind: LeaseKind,
    token: Option<FencingToken>,
) {
    let _ = hold.set(tracing::info_span!(
        "lock.hold",
        key = %key,
        kind = kind_label(kind),
        fencing_token = token.map(FencingToken::get),
        outcome = Empty,
    ));
}

/// The `lock.release` span of a release (`op`: "release", "finish" or
/// "background"), a child of the hold's span.
pub(crate) fn release_span(hold: &OnceLock<Span>, key: &LockKey, op: &'static str) -> Span {
    let parent = hold.get().cloned().unwrap_or_else(Span::current);
    tracing::info_span!(parent: &parent, "lock.release", key = %key, op, owned = Empty)
}

/// A lease flipped to lost (`reason`: "not_owner", "expired" or "stopped").
pub(crate) fn lost(
    hold: &OnceLock<Span>,
    (key, kind): (&LockKey, LeaseKind),
    reason: &'static str,
) {
    if let Some(span) = hold.get() {
        span.record("outcome", "lost");
    }
    #[cfg(feature = "metrics")]
    ::metrics::counter!(name::LOST, "namespace" => key.namespace().to_owned(), "kind" => kind_label(kind), "reason" => reason)
        .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (key, kind, reason);
}

/// A renewal answered "extended", `lag` after it was due.
pub(crate) fn renewed(lag: Duration) {
    #[cfg(feature = "metrics")]
    ::metrics::histogram!(name::RENEWAL_LAG).record(lag.as_secs_f64());
    #[cfg(not(feature = "metrics"))]
    let _ = lag;
}

/// A renewal failed with a store error (it is retried).
pub(crate) fn renewal_failed(err: &Error) {
    store_error(err);
    #[cfg(feature = "metrics")]
    ::metrics::counter!(name::RENEWAL_FAILURES, "kind" => kind(err)).increment(1);
}

/// A store call failed.
pub(crate) fn store_error(err: &Error) {
    #[cfg(feature = "metrics")]
    {
        let op = match err {
            Error::Unavailable { op, .. } | Error::Auth { op, .. } => op_name(*op),
            _ => "other",
        };
        ::metrics::counter!(name::STORE_ERRORS, "op" => op, "kind" => kind(err)).increment(1);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = err;
}

/// A locker found its store down (`false`) or answering again (`true`).
pub(crate) fn store_up(up: bool) {
    #[cfg(feature = "metrics")]
    ::metrics::gauge!(name::STORE_UP).set(if up { 1.0 } else { 0.0 });
    #[cfg(not(feature = "metrics"))]
    let _ = up;
}

/// The HTTP layer answered a completed request's stored response.
#[cfg_attr(not(feature = "axum"), allow(dead_code))]
pub(crate) fn replayed(status: u16) {
    #[cfg(feature = "metrics")]
    by_status(name::REPLAYS, status);
    #[cfg(not(feature = "metrics"))]
    let _ = status;
}

/// The HTTP layer refused a request with `status` (contention, a missing
/// key, a store failure, …).
#[cfg_attr(not(feature = "axum"), allow(dead_code))]
pub(crate) fn refused(status: u16) {
    #[cfg(feature = "metrics")]
    by_status(name::REFUSED, status);
    #[cfg(not(feature = "metrics"))]
    let _ = status;
}

#[cfg(feature = "metrics")]
#[cfg_attr(not(feature = "axum"), allow(dead_code))]
fn by_status(counter: &'static str, status: u16) {
    ::metrics::counter!(counter, "status" => status.to_string()).increment(1);
}

/// The `kind` label of a store error.
#[cfg(feature = "metrics")]
fn kind(err: &Error) -> &'static str {
    match err {
        Error::Unavailable { .. } => "unavailable",
        Error::Auth { .. } => "auth",
        Error::Record { .. } => "record",
        _ => "other",
    }
}

#[cfg(feature = "metrics")]
fn op_name(op: Operation) -> &'static str {
    match op {
        Operation::Connect => "connect",
        Operation::Acquire => "acquire",
        Operation::Extend => "extend",
        Operation::Release => "release",
        Operation::Subscribe => "subscribe",
        Operation::Inspect => "inspect",
        Operation::List => "list",
        Operation::ForceRelease => "force_release",
    }
}
