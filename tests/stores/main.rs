//! The stores on real servers: the behaviour suite run against every
//! store, and what each topology (one primary, Sentinel, Cluster) adds.

#[path = "../support/mod.rs"]
mod support;

mod cluster;
mod cluster_review;
mod conformance;
mod credentials;
mod eviction;
mod handoff;
mod handoff_review;
mod kinds;
mod lock_value;
mod multi;
mod network_faults;
mod noscript;
mod operator;
mod outage;
mod pubsub_leak;
mod release_notice;
mod renewal_paths;
mod replicas;
mod rwlock;
mod semaphore;
mod sentinel;
mod store_config;
mod unfenced;
