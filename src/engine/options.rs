//! A locker's settings and their defaults.

use std::time::Duration;

use crate::store::holder::HolderLabel;

/// Default lease: 30 s, renewed every 10 s while held.
pub(crate) const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// Default wait timeout: 0, i.e. try-lock.
pub(crate) const DEFAULT_WAIT: Duration = Duration::ZERO;
/// Default cap on each poll while waiting (the release notification usually
/// wakes a waiter long before).
pub(crate) const DEFAULT_POLL: Duration = Duration::from_millis(250);
/// Default number of renewals per pipelined batch.
pub(crate) const DEFAULT_RENEW_BATCH: usize = 512;

/// A locker's settings.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    pub(crate) lease: Duration,
    pub(crate) wait: Duration,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) poll: Duration,
    pub(crate) batch: usize,
    /// Stored with each grant for operators (`LockerBuilder::label`).
    pub(crate) label: Option<HolderLabel>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            lease: DEFAULT_LEASE,
            wait: DEFAULT_WAIT,
            max_hold: None,
            poll: DEFAULT_POLL,
            batch: DEFAULT_RENEW_BATCH,
            label: None,
        }
    }
}

impl Options {
    /// What each try asks the store for: the lease, or the hold cap where
    /// it is shorter (the first lease ends by the cap, like every
    /// renewal). A waiting writer's mark lasts this long from each try.
    pub(crate) fn first_lease(&self) -> Duration {
        self.max_hold.map_or(self.lease, |cap| self.lease.min(cap))
    }
}

/// The shortest lease a locker takes (and an exported lease may carry).
pub(crate) const MIN_LEASE: Duration = Duration::from_millis(10);
/// The longest.
pub(crate) const MAX_LEASE: Duration = Duration::from_secs(86_400);
