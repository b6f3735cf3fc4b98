//! The examples' contracts, over real TCP, Redis and PostgreSQL.

// Each contract compiles its example as `cargo run --example` builds it:
// `mod demo;` inside `demo.rs`, with its own copy of the files the examples
// share (`examples/common/`, the webhook's signature check).
#![allow(clippy::duplicate_mod, clippy::module_inception)]

#[path = "../support/mod.rs"]
mod support;

mod admin;
mod demo;
mod webhook;
mod webhook_pg;
