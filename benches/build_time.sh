#!/usr/bin/env bash
# Clean `cargo build --release` of a tiny one-primary, engine-only user of
# this crate (BENCHMARKS.md, "Build time and features").
#   benches/build_time.sh NAME CRATE_PATH [EXTRA_DEP_KEYS]
# e.g. benches/build_time.sh nodefault "$PWD" ', default-features = false'
set -euo pipefail
name=$1; path=$(cd "$2" && pwd); extra=${3:-}
lock=$(cd "$(dirname "$0")/.." && pwd)/Cargo.lock
d=${TMPDIR:-/tmp}/trl-build-time/$name
rm -rf "$d" && mkdir -p "$d/src"
cat > "$d/Cargo.toml" <<TOML
[package]
name = "engine-user"
version = "0.1.0"
edition = "2024"

[dependencies]
tower-redis-lock = { path = "$path" $extra }
tokio = { version = "1", features = ["rt-multi-thread", "macros"] }
TOML
cat > "$d/src/main.rs" <<'RS'
use tower_redis_lock::{LockKey, Locker, RedisStore};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = RedisStore::from_url("redis://127.0.0.1:6379/")?;
    let locker = Locker::new(store);
    let guard = locker.acquire(&LockKey::new("jobs", "nightly")?).await?;
    println!("fencing token {}", guard.fencing_token().unwrap());
    guard.release().await?;
    Ok(())
}
RS
cp "$lock" "$d/Cargo.lock"
cd "$d"
export CARGO_TARGET_DIR=$d/target
cargo fetch -q
/usr/bin/time -f "%e s wall, %U s user, %S s sys" -o "$d/time" cargo build --release -q
echo "$name: $(cat "$d/time"), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "rlibs: $(ls "$CARGO_TARGET_DIR"/release/deps/*.rlib | wc -l)"
echo "crates: $(cargo tree -e normal --prefix none | sort -u | wc -l)"
