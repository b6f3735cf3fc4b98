//! The engine: the lock's life (grant, renewal, loss, release, re-entry),
//! its safety under cancellation and outages, and the test hooks.

#[path = "../support/mod.rs"]
mod support;

mod engine_safety;
mod promises;
mod redis_engine;
mod reentry;
mod renewal_isolation;
mod test_util;
mod watchdog_paused;
mod writer_marks;
