//! Memory after bursts (nothing kept per key once its locks and waiters
//! are gone): holds 10,000 locks at once,
//! each with a local waiter, then releases a third, drops a third, drops a
//! third mid-release and cancels half the waiters (the others take their
//! lock and drop it); prints the process's RSS after each burst (three, or
//! `ROUNDS`).
//!
//! ```text
//! cargo run --release --example burst_rss -- memory
//! cargo run --release --example burst_rss -- redis   # starts a redis-server
//! ```
//!
//! glibc may keep freed memory instead of giving it back to the OS; what
//! matters is that a second burst does not grow the process further.

#[allow(unused_imports)]
#[path = "../tests/support/mod.rs"]
mod support;

use std::time::Duration;

use futures_util::FutureExt;
use tower_redis_lock::{LockKey, LockStore, Locker, MemoryStore, RedisStore};

const LOCKS: usize = 10_000;

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

async fn burst<S: LockStore + Clone>(locker: &Locker<S>, round: usize) {
    let keys: Vec<LockKey> = (0..LOCKS)
        .map(|i| LockKey::new("burst", format!("{round}-{i}")).unwrap())
        .collect();
    let mut guards = Vec::with_capacity(LOCKS);
    for k in &keys {
        guards.push(locker.acquire(k).await.unwrap());
    }
    eprintln!("burst {round}: all held");
    let waiters: Vec<_> = keys
        .iter()
        .map(|k| {
            let (l, k) = (locker.clone(), k.clone());
            tokio::spawn(async move {
                if let Err(e) = l.acquire_within(&k, Duration::from_secs(600)).await {
                    eprintln!("waiter: {e}");
                }
            })
        })
        .collect();
    while !keys
        .iter()
        .zip(&waiters)
        .all(|(k, w)| locker.has_waiters(k) || w.is_finished())
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let peak = rss_kib();
    eprintln!("burst {round}: all waiting");
    for (i, w) in waiters.iter().enumerate() {
        if i % 2 == 0 {
            w.abort();
        }
    }
    for (i, g) in guards.into_iter().enumerate() {
        match i % 3 {
            0 => {
                let _ = g.release().await;
            }
            1 => drop(g),
            _ => drop(Box::pin(g.release()).now_or_never()),
        }
    }
    eprintln!("burst {round}: holds given back");
    for w in waiters {
        let _ = w.await;
    }
    eprintln!("burst {round}: waiters done");
    while locker.renewing() > 0 || keys.iter().any(|k| locker.has_waiters(k)) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Let background releases land.
    tokio::time::sleep(Duration::from_secs(1)).await;
    println!(
        "burst {round}: peak {} MiB, after {} MiB, renewing {}",
        peak / 1024,
        rss_kib() / 1024,
        locker.renewing()
    );
}

async fn run<S: LockStore + Clone>(store: S) {
    let locker = Locker::builder(store)
        .lease(Duration::from_secs(30))
        .poll_interval(Duration::from_secs(2))
        .build()
        .unwrap();
    println!("start: {} MiB", rss_kib() / 1024);
    let rounds = std::env::var("ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(3);
    for round in 1..=rounds {
        burst(&locker, round).await;
    }
}

#[tokio::main(worker_threads = 2)]
async fn main() {
    match std::env::args().nth(1).as_deref() {
        Some("redis") => {
            let server = support::RedisServer::start();
            let store = RedisStore::from_url(&server.url()).unwrap();
            run(store).await;
            println!("redis keys left: {}", server.dbsize());
        }
        _ => {
            let store = MemoryStore::new();
            run(store.clone()).await;
            println!("memory store locks left: {}", store.held_count());
        }
    }
}
