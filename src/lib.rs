#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]
#![deny(unreachable_pub)]
#![warn(missing_docs, missing_debug_implementations, rust_2018_idioms)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod error;
mod fence;
mod guard;
mod key;
#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub mod layer;
mod locker;
mod record;
pub mod store;
mod token;
mod watchdog;

pub use error::{BoxError, ConfigError, Error, Operation};
pub use fence::{FenceOutcome, FencedResource};
pub use guard::LockGuard;
pub use key::{LockKey, MAX_NAMESPACE, MAX_VERBATIM_ID};
#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub use layer::{
    Fingerprint, Idempotency, KeyFrom, Lock, LockLayer, LockLayerBuilder, MissingLockGuard,
    OnLockLost, OnMissingKey, OnStoreError,
};
pub use locker::{
    Acquired, DEFAULT_LEASE, DEFAULT_POLL, DEFAULT_RENEW_BATCH, DEFAULT_WAIT, Locker, LockerBuilder,
};
pub use record::Record;
pub use store::BoxStore;
pub use store::{
    AcquireOutcome, LockStore, ReleaseWatch, Renewal,
    memory::MemoryStore,
    redis::RedisStore,
    redis::{EvictionCheck, ReplicaShortfall},
    redlock::RedlockStore,
};
pub use token::{FencingToken, OwnerToken};

pub use deadpool_redis;
pub use redis;
