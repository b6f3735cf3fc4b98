//! The crate's metrics in Prometheus' text format: the recorder a service
//! installs (`metrics-exporter-prometheus`), the crate's help texts and
//! units, one granted lock and one contended acquire, and the scrape text
//! printed. A real service serves `handle.render()` on its `/metrics`
//! route (or lets the exporter's own HTTP listener do it).
//!
//! ```text
//! cargo run --example prometheus --features metrics
//! ```

use std::time::Duration;

use metrics_exporter_prometheus::PrometheusBuilder;
use tower_redis_lock::{LockKey, Locker, MemoryStore};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let handle = PrometheusBuilder::new().install_recorder()?;
    // After the recorder is installed: it learns each metric's help text
    // and unit.
    tower_redis_lock::metrics::describe();

    let locker = Locker::builder(MemoryStore::new())
        .lease(Duration::from_secs(30))
        .build()?;
    let key = LockKey::new("jobs", "nightly")?;
    let held = locker.acquire(&key).await?;
    let refused = locker.try_acquire(&key).await;
    assert!(refused.is_err_and(|e| e.is_contended()));
    held.release().await?;

    print!("{}", handle.render());
    Ok(())
}
