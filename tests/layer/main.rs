//! The HTTP layer: keys, refusals, idempotency and nesting, on the memory
//! store and against every store.

#[path = "../support/mod.rs"]
mod support;

mod concurrency_limit;
mod handoff;
mod handoff_review;
mod holder_info;
mod idempotency;
mod keys;
mod layer;
mod layer_nested;
mod layer_safety;
mod layer_stores;
mod multi;
mod rwlock;
