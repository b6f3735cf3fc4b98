//! Which side of a key's reader-writer lock a lease holds.

use super::LeaseKind;

/// Which side of a key's reader-writer lock a request takes (the layer's
/// `read_write_by` chooses it per method): the lease kinds
/// [`LeaseKind::Read`] and [`LeaseKind::Write`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RwMode {
    /// Shared: any number of readers at once, while no writer holds or
    /// waits.
    Read,
    /// Exclusive: one writer, and no reader.
    Write,
}

impl RwMode {
    /// The lease kind of this side.
    pub fn kind(self) -> LeaseKind {
        match self {
            RwMode::Read => LeaseKind::Read,
            RwMode::Write => LeaseKind::Write,
        }
    }
}
