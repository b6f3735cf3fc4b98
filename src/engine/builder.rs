//! [`LockerBuilder`]: the settings of a [`Locker`], checked once.

use std::time::Duration;

use super::locker::Locker;
use super::options::{MAX_LEASE, MIN_LEASE, Options};
use crate::error::ConfigError;
use crate::store::LockStore;
use crate::store::holder::HolderLabel;

/// Builds a [`Locker`]; settings are checked in [`build`](LockerBuilder::build).
#[derive(Debug)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct LockerBuilder<S> {
    store: S,
    opts: Options,
    /// The label as given, checked by `build`.
    label: Option<String>,
}

impl<S: LockStore> Locker<S> {
    /// Starts a builder for non-default settings.
    pub fn builder(store: S) -> LockerBuilder<S> {
        LockerBuilder {
            store,
            opts: Options::default(),
            label: None,
        }
    }
}

impl<S: LockStore> LockerBuilder<S> {
    /// Lease length (default 30 s, at least 10 ms). The watchdog renews every
    /// lease/3; validity is `lease − (lease/100 + 2 ms)` after each renewal
    /// started.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.opts.lease = lease;
        self
    }

    /// How long [`Locker::acquire`] waits for a held lock (default 0:
    /// try-lock).
    pub fn wait_timeout(mut self, wait: Duration) -> Self {
        self.opts.wait = wait;
        self
    }

    /// Total hold cap (default off): renewals stop so that the lock ends at
    /// most this long after it was granted, and the guard reports it lost
    /// then. Bounds a holder that never finishes.
    pub fn max_hold(mut self, cap: Duration) -> Self {
        self.opts.max_hold = Some(cap);
        self
    }

    /// Longest sleep between attempts while waiting (default 250 ms,
    /// jittered, and never past the holder's remaining lease). Release
    /// notifications wake waiters sooner; this is the fallback for missed
    /// notifications and stores without them.
    pub fn poll_interval(mut self, poll: Duration) -> Self {
        self.opts.poll = poll;
        self
    }

    /// Renewals per pipelined batch (default 512).
    pub fn renew_batch(mut self, batch: usize) -> Self {
        self.opts.batch = batch;
        self
    }

    /// A label stored with every grant of this locker, for operators (the
    /// hostname, pod or process; default none): [`Locker::inspect`] shows
    /// it, next to the holder's opaque id. 1 to 128 bytes of printable
    /// ASCII (checked by `build`, see [`HolderLabel`]). Operators see it;
    /// HTTP clients do not, unless a layer opts in.
    ///
    /// Where the store keeps holder records: the memory store, and the
    /// Redis stores with fencing (an unfenced grant is one plain `SET`).
    ///
    /// ```
    /// use tower_redis_lock::{LockKey, Locker, MemoryStore};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let locker = Locker::builder(MemoryStore::new()).label("web-7").build()?;
    /// let key = LockKey::new("jobs", "42")?;
    /// let _guard = locker.acquire(&key).await?;
    /// let holder = locker.inspect(&key).await?.expect("held");
    /// assert_eq!(holder.label.map(|l| l.to_string()).as_deref(), Some("web-7"));
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// [`HolderLabel`]: crate::HolderLabel
    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    /// Checks the settings.
    pub fn build(mut self) -> Result<Locker<S>, ConfigError> {
        if let Some(label) = self.label.take() {
            self.opts.label = Some(HolderLabel::new(label)?);
        }
        let o = &self.opts;
        if o.lease < MIN_LEASE {
            return Err(ConfigError::new("lease", "must be at least 10 ms"));
        }
        if o.lease > MAX_LEASE {
            return Err(ConfigError::new("lease", "must be at most 24 h"));
        }
        if let Some(cap) = o.max_hold
            && cap < Duration::from_millis(10)
        {
            return Err(ConfigError::new("max_hold", "must be at least 10 ms"));
        }
        if o.poll < Duration::from_millis(1) {
            return Err(ConfigError::new("poll_interval", "must be at least 1 ms"));
        }
        if o.batch == 0 {
            return Err(ConfigError::new("renew_batch", "must be at least 1"));
        }
        Ok(Locker::with_options(self.store, self.opts))
    }
}
