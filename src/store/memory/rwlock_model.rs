//! The memory store's reader-writer lock against a reference model: random
//! sequences of read and write grants (writers waiting or only trying),
//! renewals, releases, withdrawals and time passing, on a paused clock.
//! After every operation the store's answer is the model's (a writer never
//! beside anyone, no new reader while a writer's mark lasts), what it holds
//! is the model's, write tokens rise, a read's token is at least the last
//! write's, and nothing is kept of a key with nothing held or marked.

use crate::store::{LeaseKind, LockStoreExt};
use std::collections::HashMap;
use std::time::Duration;

use proptest::prelude::*;
use tokio::time::Instant;

use super::MemoryStore;
use crate::key::LockKey;
use crate::store::{AcquireOutcome, LockStore, RwMode};
use crate::token::OwnerToken;

const OWNERS: usize = 6;
const KEYS: usize = 2;

#[derive(Debug, Clone)]
enum Op {
    Read {
        owner: usize,
        key: usize,
        lease_ms: u64,
    },
    /// `waits`: the owner's waiter mark goes with it.
    Write {
        owner: usize,
        key: usize,
        waits: bool,
        lease_ms: u64,
    },
    Extend {
        owner: usize,
        key: usize,
        write: bool,
        lease_ms: u64,
    },
    Release {
        owner: usize,
        key: usize,
        write: bool,
    },
    Withdraw {
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
        4 => (owner.clone(), key.clone(), lease.clone())
            .prop_map(|(owner, key, lease_ms)| Op::Read { owner, key, lease_ms }),
        3 => (owner.clone(), key.clone(), any::<bool>(), lease.clone())
            .prop_map(|(owner, key, waits, lease_ms)| Op::Write { owner, key, waits, lease_ms }),
        2 => (owner.clone(), key.clone(), any::<bool>(), lease)
            .prop_map(|(owner, key, write, lease_ms)| Op::Extend { owner, key, write, lease_ms }),
        2 => (owner.clone(), key.clone(), any::<bool>())
            .prop_map(|(owner, key, write)| Op::Release { owner, key, write }),
        1 => (owner, key).prop_map(|(owner, key)| Op::Withdraw { owner, key }),
        3 => (1u64..400).prop_map(Op::Advance),
    ]
}

/// The model of one key: readers, writer, writers' marks (owner -> end).
#[derive(Default)]
struct Key {
    readers: HashMap<usize, Instant>,
    writer: Option<(usize, Instant)>,
    marks: HashMap<usize, Instant>,
}

impl Key {
    fn at(&mut self, now: Instant) -> &mut Self {
        self.readers.retain(|_, end| *end > now);
        self.marks.retain(|_, end| *end > now);
        if self.writer.is_some_and(|(_, end)| end <= now) {
            self.writer = None;
        }
        self
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
        // Each owner's waiter mark, apart from its owner token.
        let waiters: Vec<OwnerToken> = (0..OWNERS).map(|_| OwnerToken::generate()).collect();
        let keys: Vec<LockKey> = (0..KEYS)
            .map(|k| LockKey::new("model", format!("k{k}")).unwrap())
            .collect();
        let mut model: Vec<Key> = (0..KEYS).map(|_| Key::default()).collect();
        let (mut last_write, mut last_token) = (0u64, 0u64);
        for (step, op) in ops.into_iter().enumerate() {
            let now = Instant::now();
            match op {
                Op::Read {
                    owner,
                    key,
                    lease_ms,
                } => {
                    let lease = Duration::from_millis(lease_ms);
                    let got = store
                        .acquire_read(&keys[key], &owners[owner], lease)
                        .await
                        .unwrap();
                    let m = model[key].at(now);
                    let expected = m.readers.contains_key(&owner)
                        || (m.writer.is_none() && m.marks.is_empty());
                    match got {
                        AcquireOutcome::Granted(t) => {
                            assert!(expected, "step {step}: a reader got in past a writer");
                            assert!(
                                t.get() >= last_write,
                                "step {step}: read below the last write"
                            );
                            last_token = last_token.max(t.get());
                            m.readers.insert(owner, now + lease);
                        }
                        AcquireOutcome::Held { remaining } => {
                            assert!(
                                !expected,
                                "step {step}: a reader refused with nobody in the way"
                            );
                            assert!(remaining.is_some_and(|r| !r.is_zero()), "step {step}");
                        }
                        other => panic!("step {step}: {other:?}"),
                    }
                }
                Op::Write {
                    owner,
                    key,
                    waits,
                    lease_ms,
                } => {
                    let lease = Duration::from_millis(lease_ms);
                    let waiter = waits.then(|| &waiters[owner]);
                    let got = store
                        .acquire_write(&keys[key], &owners[owner], waiter, lease)
                        .await
                        .unwrap();
                    let m = model[key].at(now);
                    let expected = match m.writer {
                        Some((w, _)) => w == owner,
                        None => m.readers.is_empty(),
                    };
                    match got {
                        AcquireOutcome::Granted(t) => {
                            assert!(expected, "step {step}: a writer got in beside a holder");
                            assert!(t.get() > last_token, "step {step}: a write token went back");
                            (last_write, last_token) = (t.get(), t.get());
                            m.writer = Some((owner, now + lease));
                            if waits {
                                m.marks.remove(&owner);
                            }
                        }
                        AcquireOutcome::Held { .. } => {
                            assert!(!expected, "step {step}: a writer refused with nobody in");
                            if waits {
                                m.marks.insert(owner, now + lease);
                            }
                        }
                        other => panic!("step {step}: {other:?}"),
                    }
                }
                Op::Extend {
                    owner,
                    key,
                    write,
                    lease_ms,
                } => {
                    let lease = Duration::from_millis(lease_ms);
                    let mode = if write { RwMode::Write } else { RwMode::Read };
                    let got = store
                        .renew(mode.kind(), &keys[key], &owners[owner], lease)
                        .await
                        .unwrap();
                    let m = model[key].at(now);
                    let end = if write {
                        m.writer
                            .as_mut()
                            .filter(|(w, _)| *w == owner)
                            .map(|(_, end)| end)
                    } else {
                        m.readers.get_mut(&owner)
                    };
                    assert_eq!(got, end.is_some(), "step {step}: extend");
                    if let Some(end) = end {
                        *end = now + lease;
                    }
                }
                Op::Release { owner, key, write } => {
                    let mode = if write { RwMode::Write } else { RwMode::Read };
                    let got = store
                        .release(mode.kind(), &keys[key], &owners[owner])
                        .await
                        .unwrap();
                    let m = model[key].at(now);
                    let expected = if write {
                        m.writer.take_if(|(w, _)| *w == owner).is_some()
                    } else {
                        m.readers.remove(&owner).is_some()
                    };
                    assert_eq!(got, expected, "step {step}: release");
                }
                Op::Withdraw { owner, key } => {
                    let got = store
                        .release(LeaseKind::WriterMark, &keys[key], &waiters[owner])
                        .await
                        .unwrap();
                    let expected = model[key].at(now).marks.remove(&owner).is_some();
                    assert_eq!(got, expected, "step {step}: withdraw");
                }
                Op::Advance(ms) => tokio::time::advance(Duration::from_millis(ms)).await,
            }
            let now = Instant::now();
            assert!(
                store.lock().rwlocks.values().all(|rw| !rw.is_empty()),
                "step {step}: an empty reader-writer lock was kept"
            );
            for (k, key) in keys.iter().enumerate() {
                let m = model[k].at(now);
                let expected = (m.readers.len(), m.writer.is_some(), m.marks.len());
                assert_eq!(store.rw_held(key), expected, "step {step}: k{k}");
            }
        }
        // Every lease and mark over: nothing is left of any key.
        tokio::time::advance(Duration::from_secs(2)).await;
        for key in &keys {
            assert_eq!(store.rw_held(key), (0, false, 0));
        }
        assert!(store.lock().rwlocks.is_empty(), "ended locks kept");
    });
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn the_memory_rwlock_follows_the_model(ops in prop::collection::vec(op(), 1..80)) {
        run(ops);
    }
}
