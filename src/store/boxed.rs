//! [`BoxStore`]: any [`LockStore`] behind one type (the way axum's
//! `BoxCloneService` erases a service).
//!
//! The object-safe mirror of [`LockStore`] and [`OperatorStore`] spells
//! every method out twice (declared, forwarded).

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::holder::{ForcedRelease, HolderInfo, HolderLabel, HolderPage, ListCursor};
use super::{
    AcquireAllOutcome, AcquireOutcome, Grant, LeaseKind, LockStore, OperatorStore, ReleaseWatch,
    Renewal,
};
use crate::error::Error;
use crate::key::LockKey;
use crate::token::OwnerToken;

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
///     let token = guard.fencing_token().expect("a fenced store").get();
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
/// ([`renew_many`](LockStore::renew_many),
/// [`grant_all`](LockStore::grant_all),
/// [`instance_id`](LockStore::instance_id)), goes to the inner store's own
/// implementation: a store that pipelines a batch still does so when
/// boxed. Clones share the inner store, and a `BoxStore` has the inner
/// store's `instance_id`, so a guard granted through the bare store is
/// re-entered through the boxed one.
#[derive(Clone)]
pub struct BoxStore {
    inner: Arc<dyn DynLockStore>,
    /// The inner store's operator view (the same store), `None` when it
    /// was boxed by the engine from a store that has none.
    operator: Option<Arc<dyn DynOperatorStore>>,
    /// The inner store's type, for `Debug`.
    type_name: &'static str,
}

impl BoxStore {
    /// Boxes `store`. A `BoxStore` given to it is returned as it is, not
    /// boxed twice.
    pub fn new<S: OperatorStore>(store: S) -> Self {
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
        let store = Arc::new(store);
        BoxStore {
            inner: store.clone(),
            operator: Some(store),
            type_name: std::any::type_name::<S>(),
        }
    }

    /// The boxed store's [`check`](LockStore::check): for a
    /// [`RedisStore`](crate::RedisStore), [`RedisStore::check`](crate::RedisStore::check)
    /// (connections opened, the eviction policy and scripting checked, a
    /// `PING` answered), so that an app keeps one store type for its locks
    /// and its readiness route.
    pub async fn check(&self) -> Result<(), Error> {
        self.inner.check_boxed().await
    }
}

impl BoxStore {
    /// Erases a store the caller already shares (the locker's), without
    /// another allocation of the store. A `BoxStore` is handed back as it
    /// is. The engine's own erasure: it needs no operator view (a store
    /// boxed here answers the operator's calls with an error).
    pub(crate) fn from_arc<S: LockStore>(store: Arc<S>) -> Self {
        if let Some(boxed) = (&store as &dyn Any).downcast_ref::<Arc<BoxStore>>() {
            return BoxStore::clone(boxed);
        }
        BoxStore {
            inner: store,
            operator: None,
            type_name: std::any::type_name::<S>(),
        }
    }
}

impl BoxStore {
    /// Erases a shared store with its operator view (for a layer that
    /// [exposes the holder](crate::LockLayerBuilder::expose_holder)).
    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    pub(crate) fn operator_view<S: OperatorStore>(store: Arc<S>) -> Self {
        if let Some(boxed) = (&store as &dyn Any).downcast_ref::<Arc<BoxStore>>() {
            return BoxStore::clone(boxed);
        }
        BoxStore {
            inner: store.clone(),
            operator: Some(store),
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
    fn supports(&self, kind: LeaseKind) -> bool {
        self.inner.supports_boxed(kind)
    }

    async fn grant(&self, grant: Grant<'_>) -> Result<AcquireOutcome, Error> {
        self.inner.grant_boxed(grant).await
    }

    async fn renew(
        &self,
        kind: LeaseKind,
        key: &LockKey,
        owner: &OwnerToken,
        lease: Duration,
    ) -> Result<bool, Error> {
        self.inner.renew_boxed(kind, key, owner, lease).await
    }

    async fn renew_many(&self, renewals: &[Renewal]) -> Vec<Result<bool, Error>> {
        self.inner.renew_many_boxed(renewals).await
    }

    async fn release(
        &self,
        kind: LeaseKind,
        key: &LockKey,
        owner: &OwnerToken,
    ) -> Result<bool, Error> {
        self.inner.release_boxed(kind, key, owner).await
    }

    async fn transfer(
        &self,
        key: &LockKey,
        from: &OwnerToken,
        to: &OwnerToken,
        lease: Duration,
    ) -> Result<bool, Error> {
        self.inner.transfer_boxed(key, from, to, lease).await
    }

    async fn subscribe(&self, key: &LockKey) -> Result<ReleaseWatch, Error> {
        self.inner.subscribe_boxed(key).await
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

    async fn grant_all(
        &self,
        keys: &[LockKey],
        owner: &OwnerToken,
        lease: Duration,
        label: Option<&HolderLabel>,
    ) -> Result<AcquireAllOutcome, Error> {
        self.inner.grant_all_boxed(keys, owner, lease, label).await
    }

    async fn release_all(&self, keys: &[LockKey], owner: &OwnerToken) -> Result<Vec<bool>, Error> {
        self.inner.release_all_boxed(keys, owner).await
    }

    async fn check(&self) -> Result<(), Error> {
        self.inner.check_boxed().await
    }

    fn instance_id(&self) -> usize {
        self.inner.instance_id_boxed()
    }
}

impl OperatorStore for BoxStore {
    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, Error> {
        match &self.operator {
            Some(op) => op.inspect_boxed(key).await,
            None => Err(super::unsupported(
                crate::error::Operation::Inspect,
                Some(key),
            )),
        }
    }

    async fn list(
        &self,
        namespace: &str,
        cursor: &ListCursor,
        count: usize,
    ) -> Result<HolderPage, Error> {
        match &self.operator {
            Some(op) => op.list_boxed(namespace, cursor, count).await,
            None => Err(super::unsupported(crate::error::Operation::List, None)),
        }
    }

    async fn force_release(&self, key: &LockKey) -> Result<ForcedRelease, Error> {
        match &self.operator {
            Some(op) => op.force_release_boxed(key).await,
            None => Err(super::unsupported(
                crate::error::Operation::ForceRelease,
                Some(key),
            )),
        }
    }
}

/// The object-safe mirror of [`LockStore`]: the same methods, returning
/// boxed futures. Implemented for every store; only `BoxStore` calls it.
trait DynLockStore: Send + Sync + 'static {
    fn supports_boxed(&self, kind: LeaseKind) -> bool;

    fn grant_boxed<'a>(&'a self, grant: Grant<'a>) -> BoxFuture<'a, Result<AcquireOutcome, Error>>;

    fn renew_boxed<'a>(
        &'a self,
        kind: LeaseKind,
        key: &'a LockKey,
        owner: &'a OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>>;

    fn renew_many_boxed<'a>(
        &'a self,
        renewals: &'a [Renewal],
    ) -> BoxFuture<'a, Vec<Result<bool, Error>>>;

    fn release_boxed<'a>(
        &'a self,
        kind: LeaseKind,
        key: &'a LockKey,
        owner: &'a OwnerToken,
    ) -> BoxFuture<'a, Result<bool, Error>>;

    fn transfer_boxed<'a>(
        &'a self,
        key: &'a LockKey,
        from: &'a OwnerToken,
        to: &'a OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>>;

    fn subscribe_boxed<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> BoxFuture<'a, Result<ReleaseWatch, Error>>;

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

    fn grant_all_boxed<'a>(
        &'a self,
        keys: &'a [LockKey],
        owner: &'a OwnerToken,
        lease: Duration,
        label: Option<&'a HolderLabel>,
    ) -> BoxFuture<'a, Result<AcquireAllOutcome, Error>>;

    fn release_all_boxed<'a>(
        &'a self,
        keys: &'a [LockKey],
        owner: &'a OwnerToken,
    ) -> BoxFuture<'a, Result<Vec<bool>, Error>>;

    fn check_boxed(&self) -> BoxFuture<'_, Result<(), Error>>;

    fn instance_id_boxed(&self) -> usize;
}

impl<S: LockStore> DynLockStore for S {
    fn supports_boxed(&self, kind: LeaseKind) -> bool {
        LockStore::supports(self, kind)
    }

    fn grant_boxed<'a>(&'a self, grant: Grant<'a>) -> BoxFuture<'a, Result<AcquireOutcome, Error>> {
        Box::pin(LockStore::grant(self, grant))
    }

    fn renew_boxed<'a>(
        &'a self,
        kind: LeaseKind,
        key: &'a LockKey,
        owner: &'a OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(LockStore::renew(self, kind, key, owner, lease))
    }

    fn renew_many_boxed<'a>(
        &'a self,
        renewals: &'a [Renewal],
    ) -> BoxFuture<'a, Vec<Result<bool, Error>>> {
        Box::pin(LockStore::renew_many(self, renewals))
    }

    fn release_boxed<'a>(
        &'a self,
        kind: LeaseKind,
        key: &'a LockKey,
        owner: &'a OwnerToken,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(LockStore::release(self, kind, key, owner))
    }

    fn transfer_boxed<'a>(
        &'a self,
        key: &'a LockKey,
        from: &'a OwnerToken,
        to: &'a OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(LockStore::transfer(self, key, from, to, lease))
    }

    fn subscribe_boxed<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> BoxFuture<'a, Result<ReleaseWatch, Error>> {
        Box::pin(LockStore::subscribe(self, key))
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

    fn grant_all_boxed<'a>(
        &'a self,
        keys: &'a [LockKey],
        owner: &'a OwnerToken,
        lease: Duration,
        label: Option<&'a HolderLabel>,
    ) -> BoxFuture<'a, Result<AcquireAllOutcome, Error>> {
        Box::pin(LockStore::grant_all(self, keys, owner, lease, label))
    }

    fn release_all_boxed<'a>(
        &'a self,
        keys: &'a [LockKey],
        owner: &'a OwnerToken,
    ) -> BoxFuture<'a, Result<Vec<bool>, Error>> {
        Box::pin(LockStore::release_all(self, keys, owner))
    }

    fn check_boxed(&self) -> BoxFuture<'_, Result<(), Error>> {
        Box::pin(LockStore::check(self))
    }

    fn instance_id_boxed(&self) -> usize {
        LockStore::instance_id(self)
    }
}

/// The object-safe mirror of [`OperatorStore`].
trait DynOperatorStore: Send + Sync + 'static {
    fn inspect_boxed<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> BoxFuture<'a, Result<Option<HolderInfo>, Error>>;

    fn list_boxed<'a>(
        &'a self,
        namespace: &'a str,
        cursor: &'a ListCursor,
        count: usize,
    ) -> BoxFuture<'a, Result<HolderPage, Error>>;

    fn force_release_boxed<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> BoxFuture<'a, Result<ForcedRelease, Error>>;
}

impl<S: OperatorStore> DynOperatorStore for S {
    fn inspect_boxed<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> BoxFuture<'a, Result<Option<HolderInfo>, Error>> {
        Box::pin(OperatorStore::inspect(self, key))
    }

    fn list_boxed<'a>(
        &'a self,
        namespace: &'a str,
        cursor: &'a ListCursor,
        count: usize,
    ) -> BoxFuture<'a, Result<HolderPage, Error>> {
        Box::pin(OperatorStore::list(self, namespace, cursor, count))
    }

    fn force_release_boxed<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> BoxFuture<'a, Result<ForcedRelease, Error>> {
        Box::pin(OperatorStore::force_release(self, key))
    }
}

#[cfg(test)]
mod tests;
