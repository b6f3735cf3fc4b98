//! The lock engine: takes locks from a [`LockStore`](crate::LockStore),
//! waits for them, keeps them alive and hands out guards. It knows no HTTP:
//! a completed outcome is opaque bytes.
//!
//! Layers point one way (each file uses only those above it):
//!
//! | file | concern |
//! |---|---|
//! | `lease.rs` | one grant's validity deadline and state (held, lost, released) |
//! | `queue.rs` | this process's waiters per key: local FIFO, wake on release |
//! | `watchdog.rs` | one renewal task per locker: renew at lease/3, in batches; grants and releases write its table without waking it |
//! | `pending.rs` | drop guards for unanswered store calls; ending a lock in the background |
//! | `hold.rs` | one hold of a grant; hold counting (the last one ends the lock) |
//! | `exported.rs` | [`ExportedLease`]: a held lease given up by its guard, for another task or process |
//! | `reentry.rs` | the holds the current task runs under |
//! | `guard.rs` | [`LockGuard`], the public face of a hold |
//! | `health.rs` | whether the store answers: an outage logged when it starts and ends |
//! | `recovery.rs` | after an outage: abandoned calls undone once the store answers; the store probed while down |
//! | `locker.rs` | [`Locker`] and [`Acquired`] |
//! | `operator.rs` | the operator's view: `inspect`, `list`, `force_release` |
//! | `options.rs` | a locker's settings and their defaults |
//! | `builder.rs` | [`LockerBuilder`]: settings checked once |
//! | `wait.rs` | the wait loop and one try at the store |
//! | `resume.rs` | [`Locker::resume`]: an exported lease held again, once the store confirms it |
//! | `semaphore.rs` | [`Semaphore`]: a key's permits, taken through the wait loop |
//! | `multi.rs` | [`Locker::acquire_all`]: several keys, all or nothing, and its wait loop |
//! | `multi_guard.rs` | [`MultiGuard`]: the keys held as one (renewed, lost and released together) |
//! | `rwlock.rs` | [`ReadWriteLock`]: a key's shared and exclusive holds, writer-preferring |

mod builder;
mod exported;
mod guard;
mod health;
mod hold;
mod lease;
mod locker;
mod multi;
mod multi_guard;
mod operator;
mod options;
mod pending;
mod queue;
mod recovery;
mod reentry;
mod resume;
mod rwlock;
mod semaphore;
#[cfg(test)]
mod test_support;
mod wait;
mod watchdog;

pub use builder::LockerBuilder;
pub use exported::ExportedLease;
pub use guard::LockGuard;
pub use locker::{Acquired, Locker, Status};
pub use multi_guard::MultiGuard;
pub use rwlock::ReadWriteLock;
pub use semaphore::Semaphore;
#[cfg_attr(not(feature = "axum"), allow(unused_imports))]
pub(crate) use semaphore::check_permits;
