//! Handing a request's lock to background work: the [`HandOff`] extractor
//! and the slot the layer leaves for it in the request; `exported.rs`
//! (feature `serde`) carries it to a worker in another process.

#[cfg(feature = "serde")]
mod exported;
#[cfg(feature = "serde")]
pub use exported::ExportedHandOff;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::response::IntoResponse;
use http::{HeaderName, HeaderValue};
use http_body_util::{BodyExt, LengthLimitError, Limited};

use super::idempotency::Record;
use super::replay::stored_headers;
use crate::engine::LockGuard;
use crate::error::{Chain, Error};
use crate::key::LockKey;

/// What a worker needs to store an idempotent layer's final record the way
/// the layer would have: the request's fingerprint and the layer's
/// settings.
#[derive(Clone, Debug)]
pub(crate) struct RecordSpec {
    pub(crate) fingerprint: Option<[u8; 32]>,
    pub(crate) retention: Duration,
    pub(crate) max_body: usize,
    pub(crate) headers: Vec<HeaderName>,
    pub(crate) fencing_header: HeaderName,
}

/// The request's lock, until a handler takes it ([`HandOff`]) or the
/// layer takes it back when the handler has answered. Taken once: the
/// layer's reclaim tells it whether the handler took it.
#[derive(Clone)]
pub(crate) struct Slot(Arc<Mutex<Option<Waiting>>>);

/// A lock in its slot, and how its record would be stored.
type Waiting = (LockGuard, Option<RecordSpec>);

impl Slot {
    pub(crate) fn new(guard: &LockGuard, record: Option<RecordSpec>) -> Slot {
        Slot(Arc::new(Mutex::new(Some((guard.clone(), record)))))
    }

    /// The lock, for a handler that takes it over.
    pub(crate) fn take(&self) -> Option<HandOff> {
        let (guard, record) = crate::sync::lock(&self.0).take()?;
        Some(HandOff {
            guard,
            record,
            done: false,
        })
    }

    /// Closes the slot once the handler has answered: `true` if the
    /// handler took the lock over (the layer then neither stores nor
    /// releases anything), `false` if the lock is still the layer's.
    pub(crate) fn handed_off(&self) -> bool {
        crate::sync::lock(&self.0).take().is_none()
    }
}

/// The request's lock, taken over by the handler for work that outlasts
/// the response (an axum extractor; the route needs a
/// [`LockLayer`](crate::LockLayer)).
///
/// A webhook sender wants its answer within seconds (GitHub gives up
/// after 10 s); some work takes minutes. A handler that extracts
/// `HandOff` answers at once (`202 Accepted`) and moves it into the
/// background work, which keeps the lock renewed and then ends it:
///
/// * [`finish`](HandOff::finish) with the final answer: on an idempotent
///   layer it is stored with the release, in one step, as the record every
///   later delivery of the key gets replayed (with the request's
///   fingerprint, so a different payload still gets 422);
/// * [`release`](HandOff::release): nothing stored, the next delivery
///   runs the handler again;
/// * `export` (feature `serde`): to a worker in another process, which
///   resumes it with `ExportedHandOff::resume`.
///
/// Extracting it is what hands the lock off: from then on the layer
/// neither releases the lock when the response ends nor stores the
/// response (the `202`) as the key's record. Meanwhile a duplicate finds
/// the key locked: 409 with `Retry-After`, or, with a locker wait timeout,
/// it waits and is answered the final record as soon as the work
/// finishes. A request whose handler does not extract it is unchanged.
///
/// Dropped without `finish`, `release` or `export` (the task panicked or
/// was aborted), it releases the lock in the background, and the next
/// delivery runs; work in a process that dies leaves the lock to lapse at
/// its lease. The work should watch [`guard().lost()`](LockGuard::lost):
/// a lock lost on the way is not the work's any more, and `finish` then
/// stores nothing (`Ok(false)`).
///
/// ```
/// use std::time::Duration;
/// use axum::{Router, http::StatusCode, routing::post};
/// use tower_redis_lock::{HandOff, Idempotency, KeyFrom, LockLayer, Locker, MemoryStore};
///
/// async fn hook(handoff: HandOff) -> StatusCode {
///     tokio::spawn(async move {
///         // ... minutes of work, under the renewed lock ...
///         let _ = handoff.finish((StatusCode::OK, "processed")).await;
///     });
///     StatusCode::ACCEPTED
/// }
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let locker = Locker::builder(MemoryStore::new()).lease(Duration::from_secs(30)).build()?;
/// let layer = LockLayer::builder(locker, KeyFrom::header(http::HeaderName::from_static("x-github-delivery")))
///     .namespace("github")
///     .idempotent(Idempotency::new())
///     .build()?;
/// let app: Router = Router::new().route("/github", post(hook).route_layer(layer));
/// # Ok(())
/// # }
/// ```
///
/// A request is handed off once; with lock layers nested on one route,
/// the innermost layer's lock is the one handed off.
#[must_use = "a dropped HandOff releases the lock: finish, release or export it"]
pub struct HandOff {
    guard: LockGuard,
    record: Option<RecordSpec>,
    /// Ended by `finish`, `release` or `export`: nothing left for `Drop`.
    done: bool,
}

impl HandOff {
    /// A hand-off of `guard` (resumed in a worker process).
    #[cfg(feature = "serde")]
    fn resumed(guard: LockGuard, record: Option<RecordSpec>) -> HandOff {
        HandOff {
            guard,
            record,
            done: false,
        }
    }

    /// The lock: its key, fencing token, [`lost`](LockGuard::lost)
    /// future. Ending it through this guard (a clone of it released) ends
    /// the hand-off too, with nothing stored.
    pub fn guard(&self) -> &LockGuard {
        &self.guard
    }

    /// The lock's key.
    pub fn key(&self) -> &LockKey {
        self.guard.key()
    }

    /// Ends the work with its final answer. On an idempotent layer the
    /// answer (status, the headers a replay keeps, the body up to the
    /// layer's stored-body limit, trailers) is stored with the release, in
    /// one owner-checked step, as the record later deliveries get: whatever
    /// its status (the layer's `store_when` judged the handler's answer;
    /// here the worker decides: to let the sender retry, call
    /// [`release`](HandOff::release) instead). On a layer without
    /// idempotency the lock is released.
    ///
    /// `Ok(false)`: the lock was no longer ours (lost, lapsed), nothing
    /// stored. A body that fails is not stored either: the lock is released
    /// and the answer is [`Error::Record`].
    pub async fn finish(mut self, answer: impl IntoResponse) -> Result<bool, Error> {
        self.done = true;
        let guard = self.guard.clone();
        let Some(spec) = self.record.take() else {
            return guard.release().await;
        };
        let (parts, body) = answer.into_response().into_parts();
        let mut record = Record::new(parts.status);
        record.fingerprint = spec.fingerprint;
        record.headers = stored_headers(&parts.headers, &spec.headers, &spec.fencing_header);
        if let Ok(token) = guard.fencing_token()
            && !parts.headers.contains_key(&spec.fencing_header)
        {
            // The token of the run that answered, as the layer's own
            // answers carry it.
            record
                .headers
                .push((spec.fencing_header.clone(), HeaderValue::from(token.get())));
        }
        match Limited::new(body, spec.max_body).collect().await {
            Ok(collected) => {
                if let Some(t) = collected.trailers() {
                    record.trailers = super::body::fields(t);
                }
                record.body = collected.to_bytes();
            }
            Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => {
                record.body_omitted = true;
            }
            Err(e) => {
                let key = guard.key().clone();
                tracing::warn!(key = %key, error = %e, "the handed-off work's answer body failed: nothing stored, lock released");
                let _ = guard.release().await;
                return Err(Error::Record {
                    key,
                    reason: "the handed-off work's answer body failed",
                });
            }
        }
        let key = guard.key().clone();
        let status = record.status.as_u16();
        let res = guard.finish(record.encode(), spec.retention).await;
        match &res {
            Ok(true) => {
                tracing::debug!(key = %key, status, "handed-off work finished: its answer stored for replay")
            }
            Ok(false) => {
                tracing::warn!(key = %key, "handed-off work finished after its lock was lost: nothing stored, a duplicate will run again")
            }
            Err(e) => {
                tracing::warn!(key = %key, error = %Chain(e), "storing the handed-off work's answer failed; a duplicate will run again")
            }
        }
        res
    }

    /// Ends the work without a record: the lock is released and the next
    /// delivery runs the handler again. As [`LockGuard::release`].
    pub async fn release(mut self) -> Result<bool, Error> {
        self.done = true;
        self.guard.clone().release().await
    }

    /// Gives the lock up here, unreleased, for a worker in another process
    /// (`ExportedHandOff::resume`): the lease as
    /// [`LockGuard::export`] gives it, and what the worker needs to store
    /// the final record as this layer would. Until the worker resumes it,
    /// nobody renews the lock: it lapses at its lease if the worker never
    /// does. Fails with [`Error::LockLost`] if the lock is no longer held.
    ///
    /// The value carries the lock's owner token: see
    /// [`ExportedLease`](crate::ExportedLease#a-capability).
    #[cfg(feature = "serde")]
    #[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
    pub fn export(mut self) -> Result<ExportedHandOff, Error> {
        self.done = true;
        let lease = self.guard.clone().export()?;
        Ok(ExportedHandOff::new(lease, self.record.take()))
    }
}

impl Drop for HandOff {
    fn drop(&mut self) {
        if !self.done && !self.guard.is_given_back() {
            tracing::warn!(
                key = %self.guard.key(),
                "handed-off work dropped without finishing: lock released, a duplicate will run again"
            );
            self.guard.release_in_background();
        }
    }
}

impl std::fmt::Debug for HandOff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandOff")
            .field("guard", &self.guard)
            .field("stores_record", &self.record.is_some())
            .finish_non_exhaustive()
    }
}
