//! The lock engine in a plain tokio program (no HTTP).
//!
//! ```text
//! cargo run --example engine                                # in-memory store
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --example engine
//! ```
//!
//! Takes a lock with a 3 s lease, holds it for 5 s while the watchdog renews
//! it every second, shows a second acquirer being turned away, then releases
//! it and shows the next holder getting a larger fencing token.

use std::time::Duration;

use tower_redis_lock::{Error, LockKey, LockStore, Locker, MemoryStore, RedisStore};

#[tokio::main]
async fn main() -> Result<(), Error> {
    match std::env::var("REDIS_URL") {
        Ok(url) => {
            println!("store: Redis at {url}");
            run(RedisStore::from_url(&url)?).await
        }
        Err(_) => {
            println!("store: in-memory (set REDIS_URL to use Redis)");
            run(MemoryStore::new()).await
        }
    }
}

async fn run<S: LockStore>(store: S) -> Result<(), Error> {
    let locker = Locker::builder(store)
        .lease(Duration::from_secs(3))
        .build()?;
    let key = LockKey::new("examples", "nightly-report")?;

    let guard = locker.acquire(&key).await?;
    println!(
        "acquired `{}` with fencing token {}",
        guard.key(),
        guard.fencing_token().expect("RedisStore fences by default")
    );

    // Someone else tries while we hold it.
    match locker.try_acquire(&key).await {
        Err(e @ Error::Contended { .. }) => println!("second acquirer turned away: {e}"),
        other => println!("unexpected: {other:?}"),
    }

    // Work for longer than the lease: the watchdog renews every lease/3.
    for second in 1..=5 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        println!(
            "t={second}s held={} valid for another {} ms",
            guard.is_held(),
            guard.valid_for().as_millis()
        );
    }

    let token = guard.fencing_token().unwrap();
    println!("released (still ours: {})", guard.release().await?);

    let next = locker.try_acquire(&key).await?;
    println!(
        "next holder's fencing token {} > {}: {}",
        next.fencing_token().unwrap(),
        token,
        next.fencing_token().unwrap() > token
    );
    next.release().await?;
    Ok(())
}
