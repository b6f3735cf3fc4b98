//! A lock layer as a reader-writer lock: which side a request takes (see
//! [`LockLayerBuilder::read_write`](crate::LockLayerBuilder::read_write)).

use std::sync::Arc;

use http::Method;

use crate::engine::{LockGuard, Locker};
use crate::error::Error;
use crate::key::LockKey;
use crate::store::{LockStore, RwMode};

/// Which side of the key's reader-writer lock a request's method takes.
#[derive(Clone)]
pub(crate) struct ModeOf(Arc<dyn Fn(&Method) -> RwMode + Send + Sync>);

impl ModeOf {
    /// Shared for the safe methods (GET, HEAD, OPTIONS, TRACE: RFC 9110
    /// §9.2.1), exclusive for every other.
    pub(crate) fn safe_methods_read() -> Self {
        ModeOf(Arc::new(|m: &Method| {
            if m.is_safe() {
                RwMode::Read
            } else {
                RwMode::Write
            }
        }))
    }

    /// As `f` says.
    pub(crate) fn by(f: impl Fn(&Method) -> RwMode + Send + Sync + 'static) -> Self {
        ModeOf(Arc::new(f))
    }

    pub(crate) fn of(&self, method: &Method) -> RwMode {
        (self.0)(method)
    }
}

impl std::fmt::Debug for ModeOf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ModeOf(..)")
    }
}

/// Takes `mode` of `key`'s reader-writer lock, waiting up to the locker's
/// wait timeout.
pub(crate) async fn take_rw<St: LockStore>(
    locker: &Locker<St>,
    key: &LockKey,
    mode: RwMode,
) -> Result<LockGuard, Error> {
    let rw = locker.rwlock(key)?;
    match mode {
        RwMode::Read => rw.read().await,
        RwMode::Write => rw.write().await,
    }
}
