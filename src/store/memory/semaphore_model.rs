//! The memory store's semaphore against a reference model: random
//! sequences of permit grants (each caller with its own N), renewals,
//! releases and time passing, on a paused clock. After every operation the
//! store's answer is the model's, the permits it holds are the model's, and
//! every grant's token is above every token before it, and no empty set
//! of permits is kept.

use crate::store::{LeaseKind, LockStoreExt};
use std::collections::HashMap;
use std::time::Duration;

use proptest::prelude::*;
use tokio::time::Instant;

use super::MemoryStore;
use crate::key::LockKey;
use crate::store::{AcquireOutcome, LockStore};
use crate::token::OwnerToken;

const OWNERS: usize = 6;
const KEYS: usize = 2;

#[derive(Debug, Clone)]
enum Op {
    Acquire {
        owner: usize,
        key: usize,
        permits: u32,
        lease_ms: u64,
    },
    Extend {
        owner: usize,
        key: usize,
        lease_ms: u64,
    },
    Release {
        owner: usize,
        key: usize,
    },
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    let owner = 0..OWNERS;
    let key = 0..KEYS;
    let lease = prop::sample::select(vec![50u64, 200, 1_000]);
    prop_oneof![
        4 => (owner.clone(), key.clone(), 1u32..4, lease.clone()).prop_map(
            |(owner, key, permits, lease_ms)| Op::Acquire { owner, key, permits, lease_ms }
        ),
        2 => (owner.clone(), key.clone(), lease).prop_map(|(owner, key, lease_ms)| Op::Extend {
            owner,
            key,
            lease_ms
        }),
        2 => (owner, key).prop_map(|(owner, key)| Op::Release { owner, key }),
        3 => (1u64..400).prop_map(Op::Advance),
    ]
}

/// The model: per key, the permits held (owner -> end of lease).
#[derive(Default)]
struct Model {
    held: HashMap<usize, HashMap<usize, Instant>>,
}

impl Model {
    fn live(&mut self, key: usize, now: Instant) -> &mut HashMap<usize, Instant> {
        let held = self.held.entry(key).or_default();
        held.retain(|_, end| *end > now);
        held
    }
}

fn run(ops: Vec<Op>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        let store = MemoryStore::new();
        let owners: Vec<OwnerToken> = (0..OWNERS).map(|_| OwnerToken::generate()).collect();
        let keys: Vec<LockKey> = (0..KEYS)
            .map(|k| LockKey::new("model", format!("k{k}")).unwrap())
            .collect();
        let mut model = Model::default();
        let mut last_token = 0u64;
        for (step, op) in ops.into_iter().enumerate() {
            let now = Instant::now();
            match op {
                Op::Acquire {
                    owner,
                    key,
                    permits,
                    lease_ms,
                } => {
                    let lease = Duration::from_millis(lease_ms);
                    let got = store
                        .acquire_permit(&keys[key], &owners[owner], permits, lease)
                        .await
                        .unwrap();
                    let held = model.live(key, now);
                    let expected_grant = held.contains_key(&owner) || held.len() < permits as usize;
                    match got {
                        AcquireOutcome::Granted(t) => {
                            assert!(expected_grant, "step {step}: granted beyond {permits}");
                            assert!(t.get() > last_token, "step {step}: token went back");
                            last_token = t.get();
                            held.insert(owner, now + lease);
                        }
                        AcquireOutcome::Held { remaining } => {
                            assert!(!expected_grant, "step {step}: refused with a permit free");
                            let soonest = held.values().min().copied().unwrap();
                            assert_eq!(remaining, Some(soonest - now), "step {step}");
                        }
                        other => panic!("step {step}: {other:?}"),
                    }
                }
                Op::Extend {
                    owner,
                    key,
                    lease_ms,
                } => {
                    let lease = Duration::from_millis(lease_ms);
                    let got = store
                        .renew(LeaseKind::Permit, &keys[key], &owners[owner], lease)
                        .await
                        .unwrap();
                    let held = model.live(key, now);
                    let expected = held.contains_key(&owner);
                    assert_eq!(got, expected, "step {step}: extend");
                    if expected {
                        held.insert(owner, now + lease);
                    }
                }
                Op::Release { owner, key } => {
                    let got = store
                        .release(LeaseKind::Permit, &keys[key], &owners[owner])
                        .await
                        .unwrap();
                    let expected = model.live(key, now).remove(&owner).is_some();
                    assert_eq!(got, expected, "step {step}: release");
                }
                Op::Advance(ms) => tokio::time::advance(Duration::from_millis(ms)).await,
            }
            assert!(
                store.lock().semaphores.values().all(|s| !s.is_empty()),
                "step {step}: an empty set was kept"
            );
            let now = Instant::now();
            for (k, key) in keys.iter().enumerate() {
                assert_eq!(
                    store.permits_held(key),
                    model.live(k, now).len(),
                    "step {step}: permits of k{k}"
                );
            }
        }
        // Every lease over: nothing is left of any key.
        tokio::time::advance(Duration::from_secs(2)).await;
        for key in &keys {
            assert_eq!(store.permits_held(key), 0);
        }
    });
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn the_memory_semaphore_follows_the_model(ops in prop::collection::vec(op(), 1..80)) {
        run(ops);
    }
}
