//! Redis memory under a flood of distinct ids: what is left in Redis after
//! N distinct ids were locked and released, N = 10^3 … 10^6.
//!
//! `cargo bench --bench flood` starts its own `redis-server` (test support),
//! then, for each N, on a fresh server:
//!
//! * `ours`: N distinct ids of one namespace locked (`Locker::try_acquire`)
//!   and released, 64 at a time, on `RedisStore::from_url`;
//! * `per-id` (baseline, the layout before 0.2): what a grant left per id
//!   before fencing counters were bucketed, one `SET trl:{ns:id}:fence
//!   <token> PX 3600000` per id, pipelined.
//!
//! Printed per N: keys (`DBSIZE`) and `used_memory` above the empty
//! server's. Set `FLOOD_MAX` (e.g. `100000`) to stop earlier.

#[path = "../tests/support/mod.rs"]
mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use support::RedisServer;
use tower_redis_lock::{LockKey, Locker, RedisStore};

const TASKS: usize = 64;

async fn ours(server: &RedisServer, n: usize) {
    let store = RedisStore::from_url(&server.url()).expect("store");
    let locker = Locker::builder(store)
        .lease(Duration::from_secs(30))
        .wait_timeout(Duration::ZERO)
        .build()
        .expect("locker");
    let next = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (locker, next) = (locker.clone(), next.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        break;
                    }
                    let key = LockKey::new("flood", format!("evt_{i}")).expect("key");
                    let guard = locker.try_acquire(&key).await.expect("grant");
                    assert!(guard.release().await.expect("release"));
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("task");
    }
}

async fn per_id(server: &RedisServer, n: usize) {
    let client = redis::Client::open(server.url()).expect("client");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connection");
    for chunk in (0..n).collect::<Vec<_>>().chunks(10_000) {
        let mut pipe = redis::pipe();
        for i in chunk {
            pipe.cmd("SET")
                .arg(format!("trl:{{flood:evt_{i}}}:fence"))
                .arg(1_795_238_770_119_893u64 + *i as u64)
                .arg("PX")
                .arg(3_600_000)
                .ignore();
        }
        pipe.query_async::<()>(&mut conn).await.expect("pipeline");
    }
}

fn main() {
    let max: usize = std::env::var("FLOOD_MAX")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    println!("| N | case | keys left | used_memory above empty | seconds |");
    println!("|---|---|---|---|---|");
    let mut n = 1_000;
    while n <= max {
        for case in ["ours", "per-id"] {
            let server = RedisServer::start();
            let empty = server.used_memory();
            let start = Instant::now();
            rt.block_on(async {
                match case {
                    "ours" => ours(&server, n).await,
                    _ => per_id(&server, n).await,
                }
            });
            let secs = start.elapsed().as_secs_f64();
            let keys = server.dbsize();
            let grown = server.used_memory().saturating_sub(empty);
            println!(
                "| {n} | {case} | {keys} | {:.1} KiB | {secs:.1} |",
                grown as f64 / 1024.0
            );
        }
        n *= 10;
    }
}
