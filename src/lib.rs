#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]
#![deny(unreachable_pub)]
#![warn(missing_docs, missing_debug_implementations, rust_2018_idioms)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod engine;
mod error;
mod fence;
mod key;
#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub mod layer;
mod observe;
mod store;
mod time;
mod token;

pub use engine::LockGuard;
pub use engine::{Acquired, Locker, LockerBuilder};
pub use error::{BoxError, ConfigError, Error, Operation};
pub use fence::{FenceOutcome, FencedResource};
pub use key::LockKey;
#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub use layer::idempotency::Record;
#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub use layer::{
    Fingerprint, Idempotency, KeyFrom, Lock, LockLayer, LockLayerBuilder, MissingFencingToken,
    MissingLockGuard, OnLockLost, OnMissingKey, OnStoreError, Problem,
};
pub use store::BoxStore;
#[cfg(feature = "sentinel")]
#[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
pub use store::redis::{DataNodes, NodeTls};
pub use store::{
    AcquireOutcome, LockStore, ReleaseWatch, Renewal,
    memory::MemoryStore,
    redis::RedisStore,
    redis::{EvictionCheck, RedisStoreBuilder, ReplicaShortfall},
    redlock::RedlockStore,
};
pub use token::{FencingToken, OwnerToken, TokenRangeError, Unfenced};

pub use deadpool_redis;
pub use redis;
