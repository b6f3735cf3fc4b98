//! The response body: the service's body, or a problem answer, optionally
//! holding the lock until the body ends.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::LockGuard;

pin_project! {
    /// Body of every response of [`Lock`](super::Lock).
    ///
    /// With [`hold_until_body_end`](super::LockLayerBuilder::hold_until_body_end)
    /// it owns the lock and releases it when the body ends, fails or is
    /// dropped (client gone), so a streaming response stays under the lock.
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
        hold: Option<HeldUntilEnd>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner { #[pin] body: B },
        Full { data: Option<Bytes> },
        // What was read while trying to store it, then the rest.
        Chained { prefix: Option<Bytes>, body: Pin<Box<B>> },
    }
}

/// Releases its guard when dropped, whatever other clones exist.
pub(crate) struct HeldUntilEnd(pub(crate) LockGuard);

impl Drop for HeldUntilEnd {
    fn drop(&mut self) {
        self.0.release_in_background();
    }
}

impl<B> ResponseBody<B> {
    pub(crate) fn inner(body: B, hold: Option<LockGuard>) -> Self {
        ResponseBody {
            kind: Kind::Inner { body },
            hold: hold.map(HeldUntilEnd),
        }
    }

    pub(crate) fn chained(prefix: Bytes, body: Pin<Box<B>>) -> Self {
        ResponseBody {
            kind: Kind::Chained {
                prefix: Some(prefix),
                body,
            },
            hold: None,
        }
    }

    pub(crate) fn full(data: Bytes) -> Self {
        ResponseBody {
            kind: Kind::Full { data: Some(data) },
            hold: None,
        }
    }
}

impl<B> std::fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseBody")
            .field("holds_lock", &self.hold.is_some())
            .finish_non_exhaustive()
    }
}

impl<B: Body<Data = Bytes>> Body for ResponseBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        let polled = match this.kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx),
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            KindProj::Chained { prefix, body } => match prefix.take() {
                Some(d) => Poll::Ready(Some(Ok(Frame::data(d)))),
                None => body.as_mut().poll_frame(cx),
            },
        };
        if matches!(polled, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            this.hold.take();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Full { data } => data.is_none(),
            Kind::Chained { prefix, body } => prefix.is_none() && body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Kind::Chained { prefix, body } => {
                let extra = prefix.as_ref().map_or(0, |d| d.len() as u64);
                let inner = body.size_hint();
                let mut hint = SizeHint::new();
                hint.set_lower(inner.lower() + extra);
                if let Some(upper) = inner.upper() {
                    hint.set_upper(upper + extra);
                }
                hint
            }
        }
    }
}
