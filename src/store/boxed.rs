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

use super::holder::{ForcedRelease, HolderInfo, HolderLabel, HolderPage, ListCursor};
use super::{AcquireAllOutcome, AcquireOutcome, LockStore, ReleaseWatch, Renewal, RwMode};
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
    /// another allocation of the store. A `BoxStore` is handed back as it is.
    pub(crate) fn from_arc<S: LockStore>(store: Arc<S>) -> Self {
        if let Some(boxed) = (&store as &dyn Any).downcast_ref::<Arc<BoxStore>>() {
            return BoxStore::clone(boxed);
        }
        BoxStore {
            inner: store,
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

    async fn transfer(
        &self,
        key: &LockKey,
        from: &OwnerToken,
        to: &OwnerToken,
        lease: Duration,
    ) -> Result<bool, Error> {
        self.inner.transfer_boxed(key, from, to, lease).await
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

    async fn acquire_permit(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        permits: u32,
        lease: Duration,
    ) -> Result<AcquireOutcome, Error> {
        self.inner
            .acquire_permit_boxed(key, owner, permits, lease)
            .await
    }

    async fn extend_permit(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        lease: Duration,
    ) -> Result<bool, Error> {
        self.inner.extend_permit_boxed(key, owner, lease).await
    }

    async fn release_permit(&self, key: &LockKey, owner: &OwnerToken) -> Result<bool, Error> {
        self.inner.release_permit_boxed(key, owner).await
    }

    async fn acquire_read(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        lease: Duration,
    ) -> Result<AcquireOutcome, Error> {
        self.inner.acquire_read_boxed(key, owner, lease).await
    }

    async fn acquire_write(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        waiter: Option<&OwnerToken>,
        lease: Duration,
    ) -> Result<AcquireOutcome, Error> {
        self.inner
            .acquire_write_boxed(key, owner, waiter, lease)
            .await
    }

    async fn extend_rw(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        mode: RwMode,
        lease: Duration,
    ) -> Result<bool, Error> {
        self.inner.extend_rw_boxed(key, owner, mode, lease).await
    }

    async fn release_rw(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        mode: RwMode,
    ) -> Result<bool, Error> {
        self.inner.release_rw_boxed(key, owner, mode).await
    }

    async fn withdraw_writer(&self, key: &LockKey, waiter: &OwnerToken) -> Result<bool, Error> {
        self.inner.withdraw_writer_boxed(key, waiter).await
    }

    async fn check(&self) -> Result<(), Error> {
        self.inner.check_boxed().await
    }

    fn supports(&self, kind: super::LeaseKind) -> bool {
        self.inner.supports_boxed(kind)
    }

    async fn acquire_labelled(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        lease: Duration,
        label: Option<&HolderLabel>,
        replay: bool,
    ) -> Result<AcquireOutcome, Error> {
        self.inner
            .acquire_labelled_boxed(key, owner, lease, label, replay)
            .await
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, Error> {
        self.inner.inspect_boxed(key).await
    }

    async fn list(
        &self,
        namespace: &str,
        cursor: &ListCursor,
        count: usize,
    ) -> Result<HolderPage, Error> {
        self.inner.list_boxed(namespace, cursor, count).await
    }

    async fn force_release(&self, key: &LockKey) -> Result<ForcedRelease, Error> {
        self.inner.force_release_boxed(key).await
    }

    async fn acquire_all(
        &self,
        keys: &[LockKey],
        owner: &OwnerToken,
        lease: Duration,
    ) -> Result<AcquireAllOutcome, Error> {
        self.inner.acquire_all_boxed(keys, owner, lease).await
    }

    async fn release_all(&self, keys: &[LockKey], owner: &OwnerToken) -> Result<Vec<bool>, Error> {
        self.inner.release_all_boxed(keys, owner).await
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

    fn transfer_boxed<'a>(
        &'a self,
        key: &'a LockKey,
        from: &'a OwnerToken,
        to: &'a OwnerToken,
        lease: Duration,
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

    fn acquire_permit_boxed<'a>(
        &'a self,
        key: &'a LockKey,
        owner: &'a OwnerToken,
        permits: u32,
        lease: Duration,
    ) -> BoxFuture<'a, Result<AcquireOutcome, Error>>;

    fn extend_permit_boxed<'a>(
        &'a self,
        key: &'a LockKey,
        owner: &'a OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>>;

    fn release_permit_boxed<'a>(
        &'a self,
        key: &'a LockKey,
        owner: &'a OwnerToken,
    ) -> BoxFuture<'a, Result<bool, Error>>;

    fn acquire_read_boxed<'a>(
        &'a self,
        key: &'a LockKey,
        owner: &'a OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<AcquireOutcome, Error>>;

    fn acquire_write_boxed<'a>(
        &'a self,
        key: &'a LockKey,
        owner: &'a OwnerToken,
        waiter: Option<&'a OwnerToken>,
        lease: Duration,
    ) -> BoxFuture<'a, Result<AcquireOutcome, Error>>;

    fn extend_rw_boxed<'a>(
        &'a self,
        key: &'a LockKey,
        owner: &'a OwnerToken,
        mode: RwMode,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>>;

    fn release_rw_boxed<'a>(
        &'a self,
        key: &'a LockKey,
        owner: &'a OwnerToken,
        mode: RwMode,
    ) -> BoxFuture<'a, Result<bool, Error>>;

    fn withdraw_writer_boxed<'a>(
        &'a self,
        key: &'a LockKey,
        waiter: &'a OwnerToken,
    ) -> BoxFuture<'a, Result<bool, Error>>;

    fn check_boxed(&self) -> BoxFuture<'_, Result<(), Error>>;

    fn supports_boxed(&self, kind: super::LeaseKind) -> bool;

    fn acquire_labelled_boxed<'a>(
        &'a self,
        key: &'a LockKey,
        owner: &'a OwnerToken,
        lease: Duration,
        label: Option<&'a HolderLabel>,
        replay: bool,
    ) -> BoxFuture<'a, Result<AcquireOutcome, Error>>;

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

    fn acquire_all_boxed<'a>(
        &'a self,
        keys: &'a [LockKey],
        owner: &'a OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<AcquireAllOutcome, Error>>;

    fn release_all_boxed<'a>(
        &'a self,
        keys: &'a [LockKey],
        owner: &'a OwnerToken,
    ) -> BoxFuture<'a, Result<Vec<bool>, Error>>;

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

    fn transfer_boxed<'a>(
        &'a self,
        key: &'a LockKey,
        from: &'a OwnerToken,
        to: &'a OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(LockStore::transfer(self, key, from, to, lease))
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

    fn acquire_permit_boxed<'a>(
        &'a self,
        key: &'a LockKey,
        owner: &'a OwnerToken,
        permits: u32,
        lease: Duration,
    ) -> BoxFuture<'a, Result<AcquireOutcome, Error>> {
        Box::pin(LockStore::acquire_permit(self, key, owner, permits, lease))
    }

    fn extend_permit_boxed<'a>(
        &'a self,
        key: &'a LockKey,
        owner: &'a OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(LockStore::extend_permit(self, key, owner, lease))
    }

    fn release_permit_boxed<'a>(
        &'a self,
        key: &'a LockKey,
        owner: &'a OwnerToken,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(LockStore::release_permit(self, key, owner))
    }

    fn acquire_read_boxed<'a>(
        &'a self,
        key: &'a LockKey,
        owner: &'a OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<AcquireOutcome, Error>> {
        Box::pin(LockStore::acquire_read(self, key, owner, lease))
    }

    fn acquire_write_boxed<'a>(
        &'a self,
        key: &'a LockKey,
        owner: &'a OwnerToken,
        waiter: Option<&'a OwnerToken>,
        lease: Duration,
    ) -> BoxFuture<'a, Result<AcquireOutcome, Error>> {
        Box::pin(LockStore::acquire_write(self, key, owner, waiter, lease))
    }

    fn extend_rw_boxed<'a>(
        &'a self,
        key: &'a LockKey,
        owner: &'a OwnerToken,
        mode: RwMode,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(LockStore::extend_rw(self, key, owner, mode, lease))
    }

    fn release_rw_boxed<'a>(
        &'a self,
        key: &'a LockKey,
        owner: &'a OwnerToken,
        mode: RwMode,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(LockStore::release_rw(self, key, owner, mode))
    }

    fn withdraw_writer_boxed<'a>(
        &'a self,
        key: &'a LockKey,
        waiter: &'a OwnerToken,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(LockStore::withdraw_writer(self, key, waiter))
    }

    fn check_boxed(&self) -> BoxFuture<'_, Result<(), Error>> {
        Box::pin(LockStore::check(self))
    }

    fn supports_boxed(&self, kind: super::LeaseKind) -> bool {
        LockStore::supports(self, kind)
    }

    fn acquire_labelled_boxed<'a>(
        &'a self,
        key: &'a LockKey,
        owner: &'a OwnerToken,
        lease: Duration,
        label: Option<&'a HolderLabel>,
        replay: bool,
    ) -> BoxFuture<'a, Result<AcquireOutcome, Error>> {
        Box::pin(LockStore::acquire_labelled(
            self, key, owner, lease, label, replay,
        ))
    }

    fn inspect_boxed<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> BoxFuture<'a, Result<Option<HolderInfo>, Error>> {
        Box::pin(LockStore::inspect(self, key))
    }

    fn list_boxed<'a>(
        &'a self,
        namespace: &'a str,
        cursor: &'a ListCursor,
        count: usize,
    ) -> BoxFuture<'a, Result<HolderPage, Error>> {
        Box::pin(LockStore::list(self, namespace, cursor, count))
    }

    fn force_release_boxed<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> BoxFuture<'a, Result<ForcedRelease, Error>> {
        Box::pin(LockStore::force_release(self, key))
    }

    fn acquire_all_boxed<'a>(
        &'a self,
        keys: &'a [LockKey],
        owner: &'a OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<AcquireAllOutcome, Error>> {
        Box::pin(LockStore::acquire_all(self, keys, owner, lease))
    }

    fn release_all_boxed<'a>(
        &'a self,
        keys: &'a [LockKey],
        owner: &'a OwnerToken,
    ) -> BoxFuture<'a, Result<Vec<bool>, Error>> {
        Box::pin(LockStore::release_all(self, keys, owner))
    }

    fn instance_id_boxed(&self) -> usize {
        LockStore::instance_id(self)
    }
}

#[cfg(test)]
mod tests;
