//! The response body: the service's body, or a problem answer, optionally
//! holding the lock until the body ends.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::engine::LockGuard;
use crate::error::Chain;
use crate::layer::config::HoldTimes;
use crate::layer::idempotency::Record;

pin_project! {
    /// Body of every response of [`Lock`](super::Lock).
    ///
    /// With [`hold_until_body_end`](crate::LockLayerBuilder::hold_until_body_end)
    /// it owns the lock and releases it when the body ends, fails or is
    /// dropped (client gone), so a streaming response stays under the lock.
    /// An idempotent layer's response whose body is over the stored-body
    /// limit is streamed under the lock the same way, and its record is
    /// stored with the release before the end of the body is handed on.
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
        hold: Option<HeldUntilEnd>,
        finish: Option<Box<FinishAtEnd>>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner { #[pin] body: B },
        Full { data: Option<Bytes>, trailers: Option<HeaderMap> },
        // What was read while trying to store it, then the rest.
        Chained { prefix: Option<Bytes>, body: Pin<Box<B>> },
    }
}

/// Releases its guard when dropped, whatever other clones exist, unless the
/// guard was taken out to finish with a record; and notes how long the
/// lock was held, when asked to.
pub(crate) struct HeldUntilEnd(Option<LockGuard>, Option<(HoldTimes, Instant)>);

impl HeldUntilEnd {
    fn into_guard(mut self) -> Option<LockGuard> {
        self.0.take()
    }
}

impl Drop for HeldUntilEnd {
    fn drop(&mut self) {
        if let Some(guard) = &self.0 {
            guard.release_in_background();
        }
        if let Some((holds, from)) = self.1.take() {
            holds.saw(from.elapsed());
        }
    }
}

/// A record to store with the release once the body has ended cleanly.
pub(crate) struct FinishAtEnd {
    record: Record,
    retention: Duration,
    /// The store-and-release, running in a task of its own (so that a body
    /// dropped meanwhile does not cut it short).
    task: Option<JoinHandle<()>>,
    /// The trailers frame, handed on once the record is stored.
    held_back: Option<HeaderMap>,
    ended: bool,
}

impl FinishAtEnd {
    /// Starts storing the record and releasing the lock.
    fn start(&mut self, hold: Option<HeldUntilEnd>) {
        let guard = hold.and_then(HeldUntilEnd::into_guard);
        match (guard, tokio::runtime::Handle::try_current()) {
            (Some(guard), Ok(rt)) => {
                let status = self.record.status;
                let record = std::mem::replace(&mut self.record, Record::new(status));
                self.task = Some(rt.spawn(store_and_release(guard, record, self.retention)));
            }
            (Some(guard), Err(_)) => {
                tracing::warn!(
                    key = %guard.key(),
                    "response body polled outside a Tokio runtime: its outcome is not stored"
                );
                guard.release_in_background();
                self.ended = true;
            }
            (None, _) => self.ended = true,
        }
    }
}

/// Stores `record` with the release in one step, and logs when it could not.
pub(crate) async fn store_and_release(guard: LockGuard, record: Record, retention: Duration) {
    let key = guard.key().clone();
    let status = record.status.as_u16();
    match guard.finish(record.encode(), retention).await {
        Ok(true) => tracing::debug!(key = %key, status, "outcome stored for replay"),
        Ok(false) => {
            tracing::warn!(key = %key, "lock lost before the outcome could be stored; a duplicate will run again")
        }
        Err(e) => {
            tracing::warn!(key = %key, error = %Chain(&e), "storing the outcome failed; a duplicate will run again")
        }
    }
}

/// The fields of a header map, in order, for a [`Record`].
pub(crate) fn fields(map: &HeaderMap) -> Vec<(HeaderName, HeaderValue)> {
    map.iter().map(|(n, v)| (n.clone(), v.clone())).collect()
}

impl<B> ResponseBody<B> {
    pub(crate) fn inner(body: B, hold: Option<LockGuard>) -> Self {
        ResponseBody {
            kind: Kind::Inner { body },
            hold: hold.map(|g| HeldUntilEnd(Some(g), None)),
            finish: None,
        }
    }

    /// Notes in `holds` how long the lock was held, from `from` to the
    /// body's end, when it ends.
    pub(crate) fn held_from(mut self, holds: &HoldTimes, from: Instant) -> Self {
        if let Some(hold) = &mut self.hold {
            hold.1 = Some((holds.clone(), from));
        }
        self
    }

    /// `prefix`, then the rest of `body`, under `guard`; once the body has
    /// ended cleanly, `record` (with the body's trailers) is stored with the
    /// release, before the end is handed on. A failed or dropped body
    /// stores nothing and releases.
    pub(crate) fn finish_at_end(
        prefix: Bytes,
        body: Pin<Box<B>>,
        guard: LockGuard,
        record: Record,
        retention: Duration,
    ) -> Self {
        ResponseBody {
            kind: Kind::Chained {
                prefix: Some(prefix),
                body,
            },
            hold: Some(HeldUntilEnd(Some(guard), None)),
            finish: Some(Box::new(FinishAtEnd {
                record,
                retention,
                task: None,
                held_back: None,
                ended: false,
            })),
        }
    }

    pub(crate) fn full(data: Bytes) -> Self {
        Self::full_with_trailers(data, None)
    }

    pub(crate) fn full_with_trailers(data: Bytes, trailers: Option<HeaderMap>) -> Self {
        ResponseBody {
            kind: Kind::Full {
                data: Some(data),
                trailers,
            },
            hold: None,
            finish: None,
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
        let mut this = self.project();
        loop {
            if let Some(f) = this.finish.as_deref_mut() {
                if let Some(task) = f.task.as_mut() {
                    // (A failed task logged its failure; the lock is released
                    // or expires either way.)
                    let _ = ready!(Pin::new(task).poll(cx));
                    f.task = None;
                    f.ended = true;
                    return Poll::Ready(f.held_back.take().map(|t| Ok(Frame::trailers(t))));
                }
                if f.ended {
                    return Poll::Ready(None);
                }
            }
            let polled = ready!(match this.kind.as_mut().project() {
                KindProj::Inner { body } => body.poll_frame(cx),
                KindProj::Full { data, trailers } => Poll::Ready(match data.take() {
                    Some(d) => Some(Ok(Frame::data(d))),
                    None => trailers.take().map(|t| Ok(Frame::trailers(t))),
                }),
                KindProj::Chained { prefix, body } => match prefix.take() {
                    Some(d) => Poll::Ready(Some(Ok(Frame::data(d)))),
                    None => body.as_mut().poll_frame(cx),
                },
            });
            match (this.finish.as_deref_mut(), polled) {
                // The end: store, then hand the end on.
                (Some(f), None) => f.start(this.hold.take()),
                (Some(f), Some(Ok(frame))) if frame.is_trailers() => {
                    if let Ok(trailers) = frame.into_trailers() {
                        f.record.trailers = fields(&trailers);
                        f.held_back = Some(trailers);
                    }
                    f.start(this.hold.take());
                }
                (Some(_), Some(Err(e))) => {
                    // Failed: nothing stored, the lock released.
                    *this.finish = None;
                    this.hold.take();
                    return Poll::Ready(Some(Err(e)));
                }
                (_, polled) => {
                    if matches!(polled, None | Some(Err(_))) {
                        this.hold.take();
                    }
                    return Poll::Ready(polled);
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        if let Some(f) = &self.finish {
            return f.ended && f.held_back.is_none() && f.task.is_none();
        }
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Full { data, trailers } => data.is_none() && trailers.is_none(),
            Kind::Chained { prefix, body } => prefix.is_none() && body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Full { data, .. } => {
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
