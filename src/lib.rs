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
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub mod metrics;
mod observe;
mod store;
mod sync;
mod time;
mod token;

pub use engine::LockGuard;
pub use engine::{
    Acquired, ExportedLease, Locker, LockerBuilder, MultiGuard, ReadWriteLock, Semaphore, Status,
};
pub use error::{BoxError, ConfigError, Error, Operation};
pub use fence::{FenceOutcome, FencedResource};
pub use key::{KeyError, LockKey};
#[cfg(all(feature = "axum", feature = "serde"))]
#[cfg_attr(docsrs, doc(cfg(all(feature = "axum", feature = "serde"))))]
pub use layer::handoff::ExportedHandOff;
#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub use layer::{
    config::{OnLockLost, OnMissingKey, OnStoreError, RetryAfter},
    extract::{MissingFencingToken, MissingHandOff, MissingLockGuard},
    handoff::HandOff,
    idempotency::{Fingerprint, Idempotency, Record},
    key::KeyFrom,
    layer::{LockLayer, LockLayerBuilder},
    multi::layer::{MultiLockLayer, MultiLockLayerBuilder},
    problem::{Problem, ProblemKind},
};
pub use store::BoxStore;
pub use store::holder::{ForcedRelease, HolderId, HolderInfo, HolderLabel, HolderPage, ListCursor};
#[cfg(feature = "sentinel")]
#[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
pub use store::redis::{DataNodes, NodeTls};
pub use store::{
    AcquireAllOutcome, AcquireOutcome, Ask, Grant, LeaseKind, LockStore, LockStoreExt,
    OperatorStore, ReleaseWatch, Renewal, RwMode,
    memory::MemoryStore,
    redis::RedisStore,
    redis::{EvictionCheck, RedisStoreBuilder, ReplicaShortfall},
    redlock::RedlockStore,
};
pub use token::{FencingToken, OwnerToken, TokenRangeError, Unfenced};

#[cfg(feature = "deadpool")]
#[cfg_attr(docsrs, doc(cfg(feature = "deadpool")))]
pub use deadpool_redis;
pub use redis;
