//! Nothing: this package is its benches (see `Cargo.toml`).
