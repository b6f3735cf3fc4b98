//! Whether the store answers, as a locker's acquires see it: an outage is
//! logged once when it starts (ERROR, with the whole cause) and once when
//! it ends (WARN, with how many calls failed), not once per call.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::error::{Chain, Error};

/// Outages that start within this long of the last one logged are logged
/// only if they last to a failure past it: a store that is down for some
/// keys and up for others (one Cluster primary down) flips at every
/// request, and would otherwise log an ERROR and a WARN per request.
const LOG_INTERVAL: Duration = Duration::from_secs(10);

/// The store's state as the last acquires saw it.
#[derive(Debug, Default)]
pub(crate) struct Health {
    /// Whether the store is down, as `state` says: read without the lock,
    /// so that the usual acquire (a grant while up) takes none.
    is_down: AtomicBool,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// `Some` while the store is down.
    down: Option<Outage>,
    /// When an outage's start was last logged.
    logged_at: Option<Instant>,
}

#[derive(Debug)]
struct Outage {
    failed: u64,
    /// Whether its start was logged (then its end is too).
    logged: bool,
}

impl Health {
    /// Notes what an acquire answered; logs a change of state.
    pub(crate) fn saw<T>(&self, answer: &Result<T, Error>) {
        let failure = match answer {
            Err(e) if e.is_store_failure() => Some(e),
            // The store answered (granted, held, a record): it is up. A wait
            // that timed out or a refused setting says nothing either way.
            Ok(_) | Err(Error::Contended { .. } | Error::Record { .. }) => None,
            Err(_) => return,
        };
        if failure.is_none() && !self.is_down.load(Ordering::Acquire) {
            return;
        }
        // Logged and counted under the lock, so that two acquires that
        // see two states never log or count them in the wrong order.
        let mut state = crate::sync::lock(&self.state);
        let state = &mut *state;
        match failure {
            Some(e) => {
                let outage = match &mut state.down {
                    Some(outage) => {
                        outage.failed += 1;
                        outage
                    }
                    None => {
                        self.is_down.store(true, Ordering::Release);
                        crate::observe::store_up(false);
                        state.down.insert(Outage {
                            failed: 1,
                            logged: false,
                        })
                    }
                };
                if !outage.logged && state.logged_at.is_none_or(|t| t.elapsed() >= LOG_INTERVAL) {
                    outage.logged = true;
                    state.logged_at = Some(Instant::now());
                    tracing::error!(
                        error = %Chain(e),
                        "lock store unavailable: acquires fail until it answers again \
                         (each refusal is logged at DEBUG)"
                    );
                }
            }
            None => {
                if let Some(outage) = state.down.take() {
                    self.is_down.store(false, Ordering::Release);
                    if outage.logged {
                        tracing::warn!(failed_calls = outage.failed, "lock store answers again");
                    } else {
                        tracing::debug!(
                            failed_calls = outage.failed,
                            "lock store answers again (a brief outage, soon after one logged)"
                        );
                    }
                    crate::observe::store_up(true);
                }
            }
        }
    }

    /// Whether the last acquire found the store down.
    pub(crate) fn is_down(&self) -> bool {
        self.is_down.load(Ordering::Acquire)
    }
}
