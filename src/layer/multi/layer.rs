//! [`MultiLockLayer`] and its builder.

use std::sync::Arc;

use http::{HeaderName, StatusCode};
use tower_layer::Layer;

use super::config::MultiConfig;
use super::service::MultiLock;
use crate::engine::Locker;
use crate::error::ConfigError;
use crate::key::LockKey;
use crate::layer::config::{DEFAULT_BODY_LIMIT, FENCING_TOKEN};
use crate::layer::key::KeyFrom;
use crate::store::LockStore;

/// The most key sources one layer takes (as many keys as
/// [`Locker::acquire_all`] takes at once).
const MAX_SOURCES: usize = 64;

/// A layer that locks several keys of each request as one, all or nothing
/// ([`Locker::acquire_all`]): say, the `from` and `to` accounts of a
/// transfer, so that two transfers between the same accounts, in either
/// direction, never run at once, and never deadlock.
///
/// Each [`KeyFrom`] gives one key (read as the single-key layer reads it:
/// a value the handler's extractor would refuse is refused with its
/// status, before any store call). Two sources that give the same id are
/// one key. The handler finds the [`MultiGuard`](crate::MultiGuard) in the
/// request extensions (`Extension<MultiGuard>`); the keys are released
/// when the handler has answered (or in the background, if the request is
/// dropped).
///
/// | answer | when |
/// |---|---|
/// | the handler's | every key was taken; the response carries one `Fencing-Token` value per key, in the guard's key order (keys sorted by `namespace:id`), none from a store that mints no tokens |
/// | 409 (or the contention status set), `Retry-After`, problem+json | a key stayed held for the locker's wait (none of the others is held meanwhile) |
/// | 503, `Retry-After: 1`, problem+json | the store did not answer |
/// | 400 problem+json | a source gave no key, or its value is refused (415/422 as the handler's extractor would answer) |
/// | 413 problem+json | a body read for its keys is over the body limit |
#[must_use]
pub struct MultiLockLayer<St> {
    config: Arc<MultiConfig<St>>,
}

impl<St> Clone for MultiLockLayer<St> {
    fn clone(&self) -> Self {
        MultiLockLayer {
            config: self.config.clone(),
        }
    }
}

impl<St> std::fmt::Debug for MultiLockLayer<St> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultiLockLayer")
            .field("keys", &self.config.keys)
            .field("namespace", &self.config.namespace)
            .finish_non_exhaustive()
    }
}

impl<St: LockStore> MultiLockLayer<St> {
    /// A builder: `keys` are the sources of the request's keys (1 to 64).
    pub fn builder(
        locker: Locker<St>,
        keys: impl IntoIterator<Item = KeyFrom>,
    ) -> MultiLockLayerBuilder<St> {
        MultiLockLayerBuilder {
            config: MultiConfig {
                locker,
                keys: keys.into_iter().collect(),
                namespace: None,
                header: FENCING_TOKEN,
                contention: StatusCode::CONFLICT,
                body_limit: DEFAULT_BODY_LIMIT,
            },
        }
    }
}

impl<S, St> Layer<S> for MultiLockLayer<St> {
    type Service = MultiLock<S, St>;

    fn layer(&self, inner: S) -> Self::Service {
        MultiLock::new(inner, self.config.clone())
    }
}

/// Builds a [`MultiLockLayer`]; its settings are checked by
/// [`build`](MultiLockLayerBuilder::build).
#[must_use]
pub struct MultiLockLayerBuilder<St> {
    config: MultiConfig<St>,
}

impl<St> std::fmt::Debug for MultiLockLayerBuilder<St> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultiLockLayerBuilder")
            .field("keys", &self.config.keys)
            .finish_non_exhaustive()
    }
}

impl<St: LockStore> MultiLockLayerBuilder<St> {
    /// The keys' namespace (default: the matched route's template).
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.config.namespace = Some(namespace.into());
        self
    }

    /// Name of the fencing-token response header (default `fencing-token`),
    /// given once per key.
    pub fn fencing_header(mut self, name: HeaderName) -> Self {
        self.config.header = name;
        self
    }

    /// Status on contention: 409 Conflict (default) or 423 Locked.
    pub fn contention_status(mut self, status: StatusCode) -> Self {
        self.config.contention = status;
        self
    }

    /// Largest body read to find keys in it (default 1 MiB).
    pub fn body_limit(mut self, bytes: usize) -> Self {
        self.config.body_limit = bytes;
        self
    }

    /// The layer, or the first setting that is wrong: no key source or
    /// more than 64, a namespace that is not a valid one, a contention
    /// status other than 409 and 423.
    pub fn build(self) -> Result<MultiLockLayer<St>, ConfigError> {
        let c = &self.config;
        if c.keys.is_empty() || c.keys.len() > MAX_SOURCES {
            return Err(ConfigError::new(
                "keys",
                format!(
                    "a multi-key layer takes 1 to {MAX_SOURCES} key sources, got {}",
                    c.keys.len()
                ),
            ));
        }
        if let Some(ns) = &c.namespace {
            LockKey::new(ns, "probe").map_err(|e| ConfigError::new("namespace", e.to_string()))?;
        }
        if ![StatusCode::CONFLICT, StatusCode::LOCKED].contains(&c.contention) {
            return Err(ConfigError::new(
                "contention_status",
                "409 Conflict or 423 Locked",
            ));
        }
        Ok(MultiLockLayer {
            config: Arc::new(self.config),
        })
    }
}
