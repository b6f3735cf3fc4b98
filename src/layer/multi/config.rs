//! What a [`MultiLock`](super::service::MultiLock) service needs: the
//! settings its layer checked, below the layer and the service, which both
//! name them.

use http::{HeaderName, StatusCode};

use crate::engine::Locker;
use crate::layer::key::KeyFrom;

/// What a `MultiLock` service needs, shared by its clones.
pub(crate) struct MultiConfig<St> {
    pub(crate) locker: Locker<St>,
    pub(crate) keys: Vec<KeyFrom>,
    pub(crate) namespace: Option<String>,
    pub(crate) header: HeaderName,
    pub(crate) contention: StatusCode,
    pub(crate) body_limit: usize,
}
