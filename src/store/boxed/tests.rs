use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;
use crate::store::LockStoreExt;
use crate::store::memory::MemoryStore;

/// A memory store that overrides every default method and counts the
/// calls to its overrides.
#[derive(Clone, Default)]
struct Overrides {
    store: MemoryStore,
    calls: Arc<AtomicUsize>,
}

impl Overrides {
    fn called(&self) -> usize {
        self.calls.fetch_add(1, Ordering::SeqCst)
    }
}

impl LockStore for Overrides {
    fn supports(&self, kind: LeaseKind) -> bool {
        self.called();
        self.store.supports(kind)
    }
    fn grant(
        &self,
        grant: Grant<'_>,
    ) -> impl Future<Output = Result<AcquireOutcome, Error>> + Send {
        self.store.grant(grant)
    }
    fn renew(
        &self,
        kind: LeaseKind,
        key: &LockKey,
        owner: &OwnerToken,
        lease: Duration,
    ) -> impl Future<Output = Result<bool, Error>> + Send {
        self.store.renew(kind, key, owner, lease)
    }
    async fn renew_many(&self, renewals: &[Renewal]) -> Vec<Result<bool, Error>> {
        self.called();
        self.store.renew_many(renewals).await
    }
    fn release(
        &self,
        kind: LeaseKind,
        key: &LockKey,
        owner: &OwnerToken,
    ) -> impl Future<Output = Result<bool, Error>> + Send {
        self.store.release(kind, key, owner)
    }
    fn finish(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        record: Bytes,
        retention: Duration,
    ) -> impl Future<Output = Result<bool, Error>> + Send {
        self.store.finish(key, owner, record, retention)
    }
    fn read_record(
        &self,
        key: &LockKey,
    ) -> impl Future<Output = Result<Option<Bytes>, Error>> + Send {
        self.store.read_record(key)
    }
    fn subscribe(&self, key: &LockKey) -> impl Future<Output = Result<ReleaseWatch, Error>> + Send {
        self.store.subscribe(key)
    }
    fn instance_id(&self) -> usize {
        self.called();
        self.store.instance_id()
    }
    async fn grant_all(
        &self,
        keys: &[LockKey],
        owner: &OwnerToken,
        lease: Duration,
        label: Option<&HolderLabel>,
    ) -> Result<AcquireAllOutcome, Error> {
        self.called();
        self.store.grant_all(keys, owner, lease, label).await
    }
    async fn release_all(&self, keys: &[LockKey], owner: &OwnerToken) -> Result<Vec<bool>, Error> {
        self.called();
        self.store.release_all(keys, owner).await
    }
}

/// The operator's view, counted.
impl OperatorStore for Overrides {
    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, Error> {
        self.called();
        self.store.inspect(key).await
    }
}

#[tokio::test]
async fn default_methods_reach_the_inner_stores_own_implementation() {
    let inner = Overrides::default();
    let boxed = BoxStore::new(inner.clone());
    let (key, owner) = (LockKey::new("boxed", "k").unwrap(), OwnerToken::generate());
    let lease = Duration::from_secs(5);

    assert!(boxed.supports(LeaseKind::Write));
    assert_eq!(inner.calls.load(Ordering::SeqCst), 1);
    let outcome = boxed.acquire(&key, &owner, lease).await.unwrap();
    assert!(matches!(outcome, AcquireOutcome::Granted(_)), "{outcome:?}");

    let renewal = Renewal {
        key: key.clone(),
        owner: owner.clone(),
        lease,
        kind: crate::store::LeaseKind::Lock,
    };
    let extended = boxed.renew_many(&[renewal]).await;
    assert!(matches!(extended.as_slice(), [Ok(true)]), "{extended:?}");
    assert_eq!(inner.calls.load(Ordering::SeqCst), 2);

    assert_eq!(boxed.instance_id(), inner.store.instance_id());
    assert_eq!(inner.calls.load(Ordering::SeqCst), 3);

    let keys = [
        LockKey::new("boxed", "a").unwrap(),
        LockKey::new("boxed", "b").unwrap(),
    ];
    let all = boxed.grant_all(&keys, &owner, lease, None).await.unwrap();
    assert!(
        matches!(&all, AcquireAllOutcome::Granted(t) if t.len() == 2),
        "{all:?}"
    );
    assert_eq!(inner.calls.load(Ordering::SeqCst), 4);
    assert_eq!(
        boxed.release_all(&keys, &owner).await.unwrap(),
        [true, true]
    );
    assert_eq!(inner.calls.load(Ordering::SeqCst), 5);

    // The operator's view, through the box.
    assert!(boxed.inspect(&key).await.unwrap().is_some());
    assert_eq!(inner.calls.load(Ordering::SeqCst), 6);
    // Boxed by the engine (no operator view): an error, not a guess.
    let erased = BoxStore::from_arc(Arc::new(inner.clone()));
    assert!(erased.inspect(&key).await.is_err());
}

#[tokio::test]
async fn every_call_reaches_the_one_inner_store() {
    let inner = MemoryStore::new();
    let boxed = BoxStore::new(inner.clone());
    let clone = boxed.clone();
    let (key, a, b) = (
        LockKey::new("boxed", "k").unwrap(),
        OwnerToken::generate(),
        OwnerToken::generate(),
    );
    let lease = Duration::from_secs(5);
    let mut watch = clone.subscribe(&key).await.unwrap();
    assert!(matches!(
        boxed.acquire(&key, &a, lease).await.unwrap(),
        AcquireOutcome::Granted(_)
    ));
    assert!(matches!(
        inner.acquire(&key, &b, lease).await.unwrap(),
        AcquireOutcome::Held { .. }
    ));
    assert!(clone.renew(LeaseKind::Lock, &key, &a, lease).await.unwrap());
    assert!(!boxed.renew(LeaseKind::Lock, &key, &b, lease).await.unwrap());
    let record = Bytes::from_static(b"done");
    assert!(boxed.finish(&key, &a, record.clone(), lease).await.unwrap());
    watch.released().await;
    assert_eq!(clone.read_record(&key).await.unwrap(), Some(record));
    assert!(!boxed.release(LeaseKind::Lock, &key, &a).await.unwrap());
}

#[test]
fn clones_and_reboxing_keep_the_inner_stores_identity() {
    let inner = MemoryStore::new();
    let boxed = BoxStore::new(inner.clone());
    assert_eq!(boxed.instance_id(), inner.instance_id());
    assert_eq!(boxed.clone().instance_id(), inner.instance_id());
    let again = BoxStore::new(boxed.clone());
    assert!(Arc::ptr_eq(&again.inner, &boxed.inner), "boxed twice");
    assert_ne!(
        BoxStore::new(MemoryStore::new()).instance_id(),
        inner.instance_id()
    );
    let debug = format!("{boxed:?}");
    assert!(
        debug.starts_with("BoxStore(") && debug.contains("MemoryStore"),
        "{debug}"
    );
}

#[test]
fn from_arc_shares_the_store_and_does_not_box_a_boxed_one_again() {
    let memory = Arc::new(MemoryStore::new());
    let erased = BoxStore::from_arc(memory.clone());
    assert_eq!(erased.instance_id(), memory.instance_id());
    assert!(format!("{erased:?}").contains("MemoryStore"));
    let boxed = Arc::new(BoxStore::new(MemoryStore::new()));
    let again = BoxStore::from_arc(boxed.clone());
    assert_eq!(again.instance_id(), boxed.instance_id());
    assert!(Arc::ptr_eq(&again.inner, &boxed.inner));
}
