//! The metrics the crate reports (feature `metrics`), through the
//! [`metrics`](https://docs.rs/metrics) facade: their names, and
//! [`describe`] for their help texts and units.
//!
//! ```
//! // After installing the application's recorder (Prometheus, StatsD, …):
//! tower_redis_lock::metrics::describe();
//! assert!(tower_redis_lock::metrics::ALL.contains(&tower_redis_lock::metrics::ACQUIRES));
//! ```

use metrics::Unit;

/// Counter: every acquire, by `namespace` and `outcome`.
pub const ACQUIRES: &str = "trl_acquires_total";
/// Histogram (seconds): an acquire's start to its outcome, waits included,
/// by `namespace` and `outcome`.
pub const ACQUIRE_DURATION: &str = "trl_acquire_duration_seconds";
/// Histogram (seconds): the same, for acquires that found the lock held,
/// by `namespace`.
pub const WAIT: &str = "trl_acquire_wait_seconds";
/// Counter: acquires that found the lock held at least once, by
/// `namespace`.
pub const CONTENDED: &str = "trl_contended_total";
/// Histogram (seconds): a renewal's answer after the moment it was due.
pub const RENEWAL_LAG: &str = "trl_renewal_lag_seconds";
/// Counter: renewals that failed with a store error, by `kind`.
pub const RENEWAL_FAILURES: &str = "trl_renewal_failures_total";
/// Counter: held locks found lost, by `namespace` and `reason`.
pub const LOST: &str = "trl_locks_lost_total";
/// Counter: failed store calls, by `op` and `kind`.
pub const STORE_ERRORS: &str = "trl_store_errors_total";
/// Counter: completed requests answered from their stored record, by
/// `status`.
pub const REPLAYS: &str = "trl_replays_total";
/// Counter: requests the layer answered itself, by `status`.
pub const REFUSED: &str = "trl_requests_refused_total";
/// Gauge: 0 from an acquire that found the store unavailable, 1 from one
/// that found it answering again.
pub const STORE_UP: &str = "trl_store_up";

/// Every metric name above.
pub const ALL: &[&str] = &[
    ACQUIRES,
    ACQUIRE_DURATION,
    WAIT,
    CONTENDED,
    RENEWAL_LAG,
    RENEWAL_FAILURES,
    LOST,
    STORE_ERRORS,
    REPLAYS,
    REFUSED,
    STORE_UP,
];

/// Gives the installed recorder each metric's help text and unit (the
/// `# HELP` and unit of a Prometheus scrape). Call it once, after the
/// recorder is installed; a recorder installed later learns nothing.
pub fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};

    describe_counter!(ACQUIRES, Unit::Count, "Lock acquires, by how they ended.");
    describe_histogram!(
        ACQUIRE_DURATION,
        Unit::Seconds,
        "Time from an acquire's start to its outcome, waits included."
    );
    describe_histogram!(
        WAIT,
        Unit::Seconds,
        "Time from the start of an acquire that found the lock held to its outcome."
    );
    describe_counter!(
        CONTENDED,
        Unit::Count,
        "Acquires that found the lock held at least once."
    );
    describe_histogram!(
        RENEWAL_LAG,
        Unit::Seconds,
        "How late a successful lease renewal was answered, after it was due."
    );
    describe_counter!(
        RENEWAL_FAILURES,
        Unit::Count,
        "Lease renewals that failed with a store error (retried until the deadline)."
    );
    describe_counter!(LOST, Unit::Count, "Held locks found lost.");
    describe_counter!(STORE_ERRORS, Unit::Count, "Failed lock store calls.");
    describe_counter!(
        REPLAYS,
        Unit::Count,
        "Completed requests answered from their stored record."
    );
    describe_counter!(
        REFUSED,
        Unit::Count,
        "Requests the lock layer answered itself instead of running the handler."
    );
    describe_gauge!(
        STORE_UP,
        "Whether the lock store answered the last acquire that decided it (1) or not (0)."
    );
}
