//! Object-safe view of a [`LockStore`], so that guards are not generic.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;

use crate::store::LockStore;
use crate::{Error, LockKey, OwnerToken};

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The store operations a guard needs after the grant.
pub(crate) trait DynStore: Send + Sync + 'static {
    fn release_dyn<'a>(
        &'a self,
        key: &'a LockKey,
        owner: &'a OwnerToken,
    ) -> BoxFuture<'a, Result<bool, Error>>;

    fn extend_dyn<'a>(
        &'a self,
        key: &'a LockKey,
        owner: &'a OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>>;

    fn finish_dyn<'a>(
        &'a self,
        key: &'a LockKey,
        owner: &'a OwnerToken,
        record: Bytes,
        retention: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>>;

    fn instance_id_dyn(&self) -> usize;
}

impl<S: LockStore> DynStore for S {
    fn release_dyn<'a>(
        &'a self,
        key: &'a LockKey,
        owner: &'a OwnerToken,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.release(key, owner))
    }

    fn extend_dyn<'a>(
        &'a self,
        key: &'a LockKey,
        owner: &'a OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.extend(key, owner, lease))
    }

    fn finish_dyn<'a>(
        &'a self,
        key: &'a LockKey,
        owner: &'a OwnerToken,
        record: Bytes,
        retention: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.finish(key, owner, record, retention))
    }

    fn instance_id_dyn(&self) -> usize {
        self.instance_id()
    }
}
