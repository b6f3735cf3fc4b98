//! Redlock over independent `redis-server` processes: quorums, frozen
//! and slow minorities, and fencing tokens across majorities.

#[path = "../support/mod.rs"]
mod support;

mod redlock;
mod redlock_quorum;
mod redlock_safety;
