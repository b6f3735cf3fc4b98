//! Waiting on conditions instead of sleeping: blocking ([`wait_until`]) for
//! sync code, on the tokio clock ([`eventually`]) for async tests.

use std::thread;
use std::time::{Duration, Instant};

/// Wait until `cond()` is true, polling every 2 ms, up to `timeout`; returns whether it
/// became true. Blocking: for sync contexts.
pub fn wait_until(timeout: Duration, cond: impl FnMut() -> bool) -> bool {
    wait_until_every(timeout, Duration::from_millis(2), cond)
}

/// Like [`wait_until`], polling every `poll` (for conditions that are costly to check,
/// e.g. several commands on several servers).
pub fn wait_until_every(timeout: Duration, poll: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        thread::sleep((deadline - now).min(poll));
    }
}

/// Polls `cond` every 5 ms on the tokio clock until it holds or `limit`
/// passes; returns whether it held. The async tests' one way of waiting for
/// a condition instead of sleeping.
pub async fn eventually(limit: Duration, mut cond: impl AsyncFnMut() -> bool) -> bool {
    // (Not written over `eventually_some`: wrapping `cond` in another async
    // closure makes the future not `Send` for every lifetime, which the
    // generic, spawned scenarios of tests/layer_stores.rs need.)
    let end = tokio::time::Instant::now() + limit;
    loop {
        if cond().await {
            return true;
        }
        if tokio::time::Instant::now() >= end {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Like [`eventually`], for a condition that yields a value: polls `f`
/// every 5 ms until it answers `Some` or `limit` passes.
pub async fn eventually_some<T>(
    limit: Duration,
    mut f: impl AsyncFnMut() -> Option<T>,
) -> Option<T> {
    let end = tokio::time::Instant::now() + limit;
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        if tokio::time::Instant::now() >= end {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
