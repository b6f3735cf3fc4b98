//! The test support itself: servers, topologies and their faults do what
//! they say.

#[path = "../support/mod.rs"]
mod support;

mod support_selftest;
mod topology_selftest;
