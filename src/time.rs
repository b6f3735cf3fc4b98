//! Time arithmetic shared by the engine and the stores (a leaf module: it
//! imports nothing from the crate, so both may depend on it).

use std::time::Duration;

use tokio::time::Instant;

/// Safety margin subtracted from a lease for clock drift and the time a
/// reply takes: 1 % of the lease plus 2 ms (as in Redlock).
pub(crate) fn drift(lease: Duration) -> Duration {
    lease / 100 + Duration::from_millis(2)
}

/// `at + d`, saturating at a far-future instant instead of panicking.
pub(crate) fn far_add(at: Instant, d: Duration) -> Instant {
    // About 30 years: far enough to mean "never", small enough to add.
    const FAR: Duration = Duration::from_secs(86_400 * 365 * 30);
    at.checked_add(d.min(FAR))
        .or_else(|| at.checked_add(Duration::from_secs(86_400)))
        .unwrap_or(at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drift_is_one_percent_plus_two_ms() {
        assert_eq!(drift(Duration::from_secs(30)), Duration::from_millis(302));
        assert_eq!(
            drift(Duration::from_millis(10)),
            Duration::from_micros(2100)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn far_add_saturates() {
        let now = Instant::now();
        assert_eq!(
            far_add(now, Duration::from_secs(5)),
            now + Duration::from_secs(5)
        );
        assert!(far_add(now, Duration::MAX) > now + Duration::from_secs(86_400 * 365));
    }
}
