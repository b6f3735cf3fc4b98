//! [`BoxStore`]: any [`LockStore`] behind one type (the way axum's
//! `BoxCloneService` erases a service).
//!
//! Over 400 lines only with its unit tests: the object-safe mirror of
//! [`LockStore`] spells every method out twice (declared, forwarded), and
//! the tests need a store that overrides every defaulted method.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::{AcquireOutcome, LockStore, ReleaseWatch, Renewal};
use crate::{Error, LockKey, OwnerToken};

/// A boxed future borrowing the store and the arguments.
type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Any [`LockStore`], type-erased: a `Clone` handle to a shared store whose
/// calls return boxed futures.
///
/// [`LockStore`] returns `impl Future`, so it cannot be a trait object, and
/// a [`Locker<MemoryStore>`](crate::Locker) in tests and a
/// `Locker<RedisStore>` in production are two types: every function and
/// state struct that holds one would have to be generic over the store.
/// `Locker<BoxStore>` is one type, whatever store is inside, at the price of
/// one boxed future per store call. `Locker::new(BoxStore::new(store))` (or
/// `Locker::builder(..)`) is the whole recipe; the lock layer takes such a
/// locker like any other.
///
/// ```
/// use std::time::Duration;
/// use tower_redis_lock::BoxStore;
/// use tower_redis_lock::{LockKey, Locker, MemoryStore, RedisStore};
///
/// /// The app's state: one type, whichever store is behind it.
/// #[derive(Clone)]
/// struct AppState {
///     locker: Locker<BoxStore>,
/// }
///
/// impl AppState {
///     fn new(store: BoxStore) -> Result<Self, tower_redis_lock::ConfigError> {
///         let locker = Locker::builder(store)
///             .wait_timeout(Duration::from_secs(2))
///             .build()?;
///         Ok(AppState { locker })
///     }
/// }
///
/// /// Not generic over the store.
/// async fn charge(state: &AppState, invoice: &str) -> Result<u64, tower_redis_lock::Error> {
///     let guard = state.locker.acquire(&LockKey::new("invoices", invoice)?).await?;
///     let token = guard.fencing_token().get();
///     guard.release().await?;
///     Ok(token)
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // In tests and local development:
/// let state = AppState::new(BoxStore::new(MemoryStore::new()))?;
/// assert!(charge(&state, "inv_1").await? > 0);
///
/// // In production (`from_url` connects lazily, on the first lock):
/// let state = AppState::new(BoxStore::new(RedisStore::from_url("redis://127.0.0.1:6379/")?))?;
/// # let _ = state;
/// # Ok(())
/// # }
/// ```
///
/// Every call, including the ones [`LockStore`] gives a default for
/// ([`extend_many`](LockStore::extend_many),
/// [`acquire_or_replay`](LockStore::acquire_or_replay),
/// [`instance_id`](LockStore::instance_id)), goes to the inner store's own
/// implementation: a store that pipelines a batch or replays in one round
/// trip still does so when boxed. Clones share the inner store, and a
/// `BoxStore` has the inner store's `instance_id`, so a guard granted
/// through the bare store is re-entered through the boxed one.
#[derive(Clone)]
pub struct BoxStore {
    inner: Arc<dyn DynLockStore>,
    /// The inner store's type, for `Debug`.
    type_name: &'static str,
}

impl BoxStore {
    /// Boxes `store`. A `BoxStore` given to it is returned as it is, not
    /// boxed twice.
    pub fn new<S: LockStore>(store: S) -> Self {
        let mut slot = Some(store);
        if let Some(boxed) = (&mut slot as &mut dyn Any)
            .downcast_mut::<Option<BoxStore>>()
            .and_then(Option::take)
        {
            return boxed;
        }
        let Some(store) = slot else {
            unreachable!("only a BoxStore is taken out of the slot")
        };
        BoxStore {
            inner: Arc::new(store),
            type_name: std::any::type_name::<S>(),
        }
    }
}

impl fmt::Debug for BoxStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("BoxStore").field(&self.type_name).finish()
    }
}

impl LockStore for BoxStore {
    async fn acquire(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        lease: Duration,
    ) -> Result<AcquireOutcome, Error> {
        self.inner.acquire_boxed(key, owner, lease).await
    }

    async fn extend(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        lease: Duration,
    ) -> Result<bool, Error> {
        self.inner.extend_boxed(key, owner, lease).await
    }

    async fn extend_many(&self, renewals: &[Renewal]) -> Vec<Result<bool, Error>> {
        self.inner.extend_many_boxed(renewals).await
    }

    async fn release(&self, key: &LockKey, owner: &OwnerToken) -> Result<bool, Error> {
        self.inner.release_boxed(key, owner).await
    }

    async fn acquire_or_replay(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        lease: Duration,
    ) -> Result<AcquireOutcome, Error> {
        self.inner.acquire_or_replay_boxed(key, owner, lease).await
    }

    async fn finish(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        record: Bytes,
        retention: Duration,
    ) -> Result<bool, Error> {
        self.inner.finish_boxed(key, owner, record, retention).await
    }

    async fn read_record(&self, key: &LockKey) -> Result<Option<Bytes>, Error> {
        self.inner.read_record_boxed(key).await
    }

    async fn subscribe(&self, key: &LockKey) -> Result<ReleaseWatch, Error> {
        self.inner.subscribe_boxed(key).await
    }

    fn instance_id(&self) -> usize {
        self.inner.instance_id_boxed()
    }
}

/// [`LockStore`] made object-safe: the same methods, one for one, each
/// answering a boxed future. Implemented for every store by forwarding to
/// its own methods (default ones included).
trait DynLockStore: Send + Sync + 'static {
    fn acquire_boxed<'a>(
        &'a self,
        key: &'a LockKey,
        owner: &'a OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<AcquireOutcome, Error>>;

    fn extend_boxed<'a>(
        &'a self,
        key: &'a LockKey,
        owner: &'a OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>>;

    fn extend_many_boxed<'a>(
        &'a self,
        renewals: &'a [Renewal],
    ) -> BoxFuture<'a, Vec<Result<bool, Error>>>;

    fn release_boxed<'a>(
        &'a self,
        key: &'a LockKey,
        owner: &'a OwnerToken,
    ) -> BoxFuture<'a, Result<bool, Error>>;

    fn acquire_or_replay_boxed<'a>(
        &'a self,
        key: &'a LockKey,
        owner: &'a OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<AcquireOutcome, Error>>;

    fn finish_boxed<'a>(
        &'a self,
        key: &'a LockKey,
        owner: &'a OwnerToken,
        record: Bytes,
        retention: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>>;

    fn read_record_boxed<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> BoxFuture<'a, Result<Option<Bytes>, Error>>;

    fn subscribe_boxed<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> BoxFuture<'a, Result<ReleaseWatch, Error>>;

    fn instance_id_boxed(&self) -> usize;
}

impl<S: LockStore> DynLockStore for S {
    fn acquire_boxed<'a>(
        &'a self,
        key: &'a LockKey,
        owner: &'a OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<AcquireOutcome, Error>> {
        Box::pin(LockStore::acquire(self, key, owner, lease))
    }

    fn extend_boxed<'a>(
        &'a self,
        key: &'a LockKey,
        owner: &'a OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(LockStore::extend(self, key, owner, lease))
    }

    fn extend_many_boxed<'a>(
        &'a self,
        renewals: &'a [Renewal],
    ) -> BoxFuture<'a, Vec<Result<bool, Error>>> {
        Box::pin(LockStore::extend_many(self, renewals))
    }

    fn release_boxed<'a>(
        &'a self,
        key: &'a LockKey,
        owner: &'a OwnerToken,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(LockStore::release(self, key, owner))
    }

    fn acquire_or_replay_boxed<'a>(
        &'a self,
        key: &'a LockKey,
        owner: &'a OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<AcquireOutcome, Error>> {
        Box::pin(LockStore::acquire_or_replay(self, key, owner, lease))
    }

    fn finish_boxed<'a>(
        &'a self,
        key: &'a LockKey,
        owner: &'a OwnerToken,
        record: Bytes,
        retention: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(LockStore::finish(self, key, owner, record, retention))
    }

    fn read_record_boxed<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> BoxFuture<'a, Result<Option<Bytes>, Error>> {
        Box::pin(LockStore::read_record(self, key))
    }

    fn subscribe_boxed<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> BoxFuture<'a, Result<ReleaseWatch, Error>> {
        Box::pin(LockStore::subscribe(self, key))
    }

    fn instance_id_boxed(&self) -> usize {
        LockStore::instance_id(self)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::MemoryStore;

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
        fn acquire(
            &self,
            key: &LockKey,
            owner: &OwnerToken,
            lease: Duration,
        ) -> impl Future<Output = Result<AcquireOutcome, Error>> + Send {
            self.store.acquire(key, owner, lease)
        }
        fn extend(
            &self,
            key: &LockKey,
            owner: &OwnerToken,
            lease: Duration,
        ) -> impl Future<Output = Result<bool, Error>> + Send {
            self.store.extend(key, owner, lease)
        }
        async fn extend_many(&self, renewals: &[Renewal]) -> Vec<Result<bool, Error>> {
            self.called();
            self.store.extend_many(renewals).await
        }
        fn release(
            &self,
            key: &LockKey,
            owner: &OwnerToken,
        ) -> impl Future<Output = Result<bool, Error>> + Send {
            self.store.release(key, owner)
        }
        async fn acquire_or_replay(
            &self,
            key: &LockKey,
            owner: &OwnerToken,
            lease: Duration,
        ) -> Result<AcquireOutcome, Error> {
            self.called();
            self.store.acquire_or_replay(key, owner, lease).await
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
        fn subscribe(
            &self,
            key: &LockKey,
        ) -> impl Future<Output = Result<ReleaseWatch, Error>> + Send {
            self.store.subscribe(key)
        }
        fn instance_id(&self) -> usize {
            self.called();
            self.store.instance_id()
        }
    }

    #[tokio::test]
    async fn default_methods_reach_the_inner_stores_own_implementation() {
        let inner = Overrides::default();
        let boxed = BoxStore::new(inner.clone());
        let (key, owner) = (LockKey::new("boxed", "k").unwrap(), OwnerToken::generate());
        let lease = Duration::from_secs(5);

        let outcome = boxed.acquire_or_replay(&key, &owner, lease).await.unwrap();
        assert!(matches!(outcome, AcquireOutcome::Granted(_)), "{outcome:?}");
        assert_eq!(inner.calls.load(Ordering::SeqCst), 1);

        let renewal = Renewal {
            key: key.clone(),
            owner: owner.clone(),
            lease,
        };
        let extended = boxed.extend_many(&[renewal]).await;
        assert!(matches!(extended.as_slice(), [Ok(true)]), "{extended:?}");
        assert_eq!(inner.calls.load(Ordering::SeqCst), 2);

        assert_eq!(boxed.instance_id(), inner.store.instance_id());
        assert_eq!(inner.calls.load(Ordering::SeqCst), 3);
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
        assert!(clone.extend(&key, &a, lease).await.unwrap());
        assert!(!boxed.extend(&key, &b, lease).await.unwrap());
        let record = Bytes::from_static(b"done");
        assert!(boxed.finish(&key, &a, record.clone(), lease).await.unwrap());
        watch.released().await;
        assert_eq!(clone.read_record(&key).await.unwrap(), Some(record));
        assert!(!boxed.release(&key, &a).await.unwrap());
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
}
