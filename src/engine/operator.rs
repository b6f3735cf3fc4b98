//! The operator's view of a [`Locker`]'s store: who holds a lock, the held
//! locks of a namespace, and an operator's release.

use super::locker::Locker;
use crate::error::Error;
use crate::key::LockKey;
use crate::store::OperatorStore;
use crate::store::holder::{ForcedRelease, HolderInfo, HolderPage, ListCursor};

/// The most locks [`Locker::list`] asks for per page.
const MAX_PAGE: usize = 1000;

impl<S: OperatorStore> Locker<S> {
    /// Who holds `key` right now, as the store knows it (`None`: nobody).
    ///
    /// For operators: an opaque [`HolderId`](crate::HolderId) (never the
    /// owner token, which would let the reader release or extend the lock),
    /// the holder's [label](crate::LockerBuilder::label), the fencing
    /// token, the grant's server time, the lease left and whether a waiter
    /// marked it. Never shown to HTTP clients by the layer unless it opts
    /// in. No re-entry count: re-entry happens inside the holder's process
    /// and is not sent to the store (see [`HolderInfo`]). On Redlock, the
    /// majority view (see [`RedlockStore`](crate::RedlockStore)).
    ///
    /// ```
    /// use tower_redis_lock::{LockKey, Locker, MemoryStore};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let locker = Locker::builder(MemoryStore::new()).label("worker-3").build()?;
    /// let key = LockKey::new("invoices", "inv_7")?;
    /// assert!(locker.inspect(&key).await?.is_none());
    ///
    /// let guard = locker.acquire(&key).await?;
    /// let holder = locker.inspect(&key).await?.expect("held");
    /// assert_eq!(holder.fencing_token, Some(guard.fencing_token()?));
    /// assert_eq!(holder.label.expect("labelled").as_str(), "worker-3");
    /// assert!(holder.remaining.expect("a lease") <= locker.lease());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, Error> {
        self.store().inspect(key).await
    }

    /// One page of the held locks of `namespace`: start with
    /// [`ListCursor::start`], go on with the page's
    /// [`next`](HolderPage::next) until it is `None`. Each page is one
    /// bounded step of a cursor scan (`SCAN … COUNT`, never `KEYS`; on a
    /// Cluster, each primary in turn) of about `count` keys (at most
    /// 1,000), so a page may hold fewer locks than asked, even none,
    /// while the listing goes on. Locks granted or released meanwhile may
    /// or may not appear.
    ///
    /// ```
    /// use tower_redis_lock::{ListCursor, LockKey, Locker, MemoryStore};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let locker = Locker::new(MemoryStore::new());
    /// let _a = locker.acquire(&LockKey::new("jobs", "a")?).await?;
    /// let _b = locker.acquire(&LockKey::new("jobs", "b")?).await?;
    ///
    /// let (mut held, mut cursor) = (Vec::new(), Some(ListCursor::start()));
    /// while let Some(at) = cursor {
    ///     let page = locker.list("jobs", &at, 100).await?;
    ///     held.extend(page.locks.into_iter().map(|h| h.key.id().to_owned()));
    ///     cursor = page.next;
    /// }
    /// held.sort();
    /// assert_eq!(held, ["a", "b"]);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn list(
        &self,
        namespace: &str,
        cursor: &ListCursor,
        count: usize,
    ) -> Result<HolderPage, Error> {
        crate::key::validate_name(namespace, false)?;
        self.store()
            .list(namespace, cursor, count.clamp(1, MAX_PAGE))
            .await
    }

    /// Removes `key`'s lock whoever holds it, wakes its waiters and raises
    /// its fence; logged at WARN with `by` (who asked, and why: an
    /// operator's name, a ticket).
    ///
    /// The old holder is not stopped: it learns at its next renewal (its
    /// guard flips to lost, [`LockGuard::lost`](crate::LockGuard::lost)
    /// resolves) or when it releases. Until then only fencing keeps it
    /// out: every later grant's token is above the answered
    /// [`fence`](ForcedRelease::fence), itself above every token issued
    /// for the lock before. Write the fence to your fenced resources
    /// ([`FencedResource::raise`](crate::FencedResource::raise)) to refuse
    /// the old holder's writes at once.
    ///
    /// ```
    /// use tower_redis_lock::{LockKey, Locker, MemoryStore};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let locker = Locker::new(MemoryStore::new());
    /// let key = LockKey::new("jobs", "stuck")?;
    /// let guard = locker.acquire(&key).await?;
    ///
    /// let forced = locker.force_release(&key, "alice: INC-42").await?;
    /// assert!(forced.released);
    /// assert!(forced.fence.expect("fenced") > guard.fencing_token()?);
    /// assert!(guard.extend().await.is_err(), "the old holder lost it");
    /// let next = locker.acquire(&key).await?;
    /// assert!(next.fencing_token()? > forced.fence.expect("fenced"));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn force_release(&self, key: &LockKey, by: &str) -> Result<ForcedRelease, Error> {
        match self.store().force_release(key).await {
            Ok(forced) => {
                tracing::warn!(
                    key = %key,
                    by = by,
                    released = forced.released,
                    fence = forced.fence.map(|t| t.get()),
                    "lock released by force"
                );
                Ok(forced)
            }
            Err(e) => {
                tracing::warn!(
                    key = %key,
                    by = by,
                    error = %crate::error::Chain(&e),
                    "forced release failed"
                );
                Err(e)
            }
        }
    }
}
