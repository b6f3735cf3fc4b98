//! The response future of [`Lock`](super::Lock).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Response;

use super::body::ResponseBody;

type BoxFuture<B, E> = Pin<Box<dyn Future<Output = Result<Response<ResponseBody<B>>, E>> + Send>>;

/// Response future of [`Lock`](super::Lock). It owns the request's lock
/// while the inner service runs: dropping it (client gone, timeout layer)
/// releases the lock in the background.
pub struct ResponseFuture<B, E> {
    inner: BoxFuture<B, E>,
}

impl<B, E> ResponseFuture<B, E> {
    pub(crate) fn new(
        fut: impl Future<Output = Result<Response<ResponseBody<B>>, E>> + Send + 'static,
    ) -> Self {
        ResponseFuture {
            inner: Box::pin(fut),
        }
    }
}

impl<B, E> Future for ResponseFuture<B, E> {
    type Output = Result<Response<ResponseBody<B>>, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl<B, E> std::fmt::Debug for ResponseFuture<B, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
