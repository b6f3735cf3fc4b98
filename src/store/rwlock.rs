//! The store side of a key's reader-writer lock: which side a lease holds,
//! and the answer of a store that has none.

use crate::error::{ConfigError, Error};

/// Which side of a key's reader-writer lock a lease holds (see
/// [`LockStore::acquire_read`](super::LockStore::acquire_read) and
/// [`LockStore::acquire_write`](super::LockStore::acquire_write)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RwMode {
    /// Shared: any number of readers at once, while no writer holds or
    /// waits.
    Read,
    /// Exclusive: one writer, and no reader.
    Write,
}

/// The error of a store that has no reader-writer locks.
pub(crate) fn rw_unsupported() -> Error {
    Error::Config(ConfigError::new(
        "rwlock",
        "this store does not support reader-writer locks",
    ))
}
