//! Handing a request's lock to background work: the [`HandOff`] extractor,
//! the slot the layer leaves for it in the request, and (feature `serde`)
//! [`ExportedHandOff`] for a worker in another process.

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
pub(crate) struct Slot(Arc<Mutex<Option<(LockGuard, Option<RecordSpec>)>>>);

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
/// * [`export`](HandOff::export) (feature `serde`): to a worker in another
///   process, which resumes it with [`ExportedHandOff::resume`].
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
    /// ([`ExportedHandOff::resume`]): the lease as
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
        Ok(ExportedHandOff {
            lease,
            record: self.record.take(),
        })
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

/// A [`HandOff`] on its way to a worker in another process (feature
/// `serde`): the [exported lease](crate::ExportedLease) and what the worker
/// needs to store the final record as the layer would (the request's
/// fingerprint, the retention, the stored-body limit, the replayed and
/// fencing-token header names).
///
/// Serialize it into your job queue; the worker deserializes it and
/// [resumes](ExportedHandOff::resume) it on a [`Locker`](crate::Locker)
/// over the same store. **It is a capability**: it carries the lock's owner
/// token, and whoever holds it can store the answer every later delivery
/// of the key is replayed (see [`ExportedLease`](crate::ExportedLease#a-capability)).
///
/// ```
/// use axum::http::StatusCode;
/// use tower_redis_lock::{ExportedHandOff, Locker, MemoryStore};
///
/// // In the worker process: `job` came from the web process's queue.
/// async fn work(locker: Locker<MemoryStore>, job: &str) -> Result<(), Box<dyn std::error::Error>> {
///     let exported: ExportedHandOff = serde_json::from_str(job)?;
///     let handoff = exported.resume(&locker).await?; // LockLost if it lapsed
///     // ... the work, under the lock this process now renews ...
///     handoff.finish((StatusCode::OK, "processed")).await?;
///     Ok(())
/// }
/// ```
#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
#[derive(Debug, Clone)]
#[must_use = "an exported hand-off that is never resumed is a lock left to lapse at its lease"]
pub struct ExportedHandOff {
    lease: crate::engine::ExportedLease,
    record: Option<RecordSpec>,
}

#[cfg(feature = "serde")]
impl ExportedHandOff {
    /// The exported lease inside.
    pub fn lease(&self) -> &crate::engine::ExportedLease {
        &self.lease
    }

    /// Takes the work over in this process: the lease is
    /// [resumed](crate::Locker::resume) (checked with the store, renewed by
    /// `locker`'s watchdog) and answered as a [`HandOff`] to finish or
    /// release. A lease that lapsed or was taken over meanwhile is
    /// [`Error::LockLost`].
    pub async fn resume<S: crate::store::LockStore>(
        self,
        locker: &crate::engine::Locker<S>,
    ) -> Result<HandOff, Error> {
        let guard = locker.resume(self.lease).await?;
        Ok(HandOff {
            guard,
            record: self.record,
            done: false,
        })
    }
}

#[cfg(feature = "serde")]
mod wire {
    use std::time::Duration;

    use http::HeaderName;

    use super::{ExportedHandOff, RecordSpec};
    use crate::engine::ExportedLease;

    #[derive(serde::Serialize, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    pub(super) struct Wire {
        lease: ExportedLease,
        record: Option<WireRecord>,
    }

    #[derive(serde::Serialize, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct WireRecord {
        /// Hex, 64 digits.
        fingerprint: Option<String>,
        retention_ms: u64,
        max_body: usize,
        headers: Vec<String>,
        fencing_header: String,
    }

    impl From<&ExportedHandOff> for Wire {
        fn from(e: &ExportedHandOff) -> Wire {
            Wire {
                lease: e.lease.clone(),
                record: e.record.as_ref().map(|r| WireRecord {
                    fingerprint: r.fingerprint.map(|f| {
                        let mut out = String::with_capacity(64);
                        crate::key::push_hex(&mut out, &f);
                        out
                    }),
                    retention_ms: u64::try_from(r.retention.as_millis()).unwrap_or(u64::MAX),
                    max_body: r.max_body,
                    headers: r.headers.iter().map(|h| h.as_str().to_owned()).collect(),
                    fencing_header: r.fencing_header.as_str().to_owned(),
                }),
            }
        }
    }

    fn header(name: &str) -> Result<HeaderName, String> {
        HeaderName::from_bytes(name.as_bytes()).map_err(|_| format!("not a header name: {name:?}"))
    }

    fn fingerprint(hex: &str) -> Result<[u8; 32], String> {
        let bad = || "a fingerprint is 64 hex digits".to_owned();
        if hex.len() != 64 {
            return Err(bad());
        }
        let mut out = [0u8; 32];
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2).ok_or_else(bad)?, 16)
                .map_err(|_| bad())?;
        }
        Ok(out)
    }

    impl TryFrom<Wire> for ExportedHandOff {
        type Error = String;

        fn try_from(w: Wire) -> Result<ExportedHandOff, String> {
            let record = match w.record {
                None => None,
                Some(r) => Some(RecordSpec {
                    fingerprint: r.fingerprint.as_deref().map(fingerprint).transpose()?,
                    retention: Duration::from_millis(r.retention_ms),
                    max_body: r.max_body,
                    headers: r
                        .headers
                        .iter()
                        .map(|h| header(h))
                        .collect::<Result<_, _>>()?,
                    fencing_header: header(&r.fencing_header)?,
                }),
            };
            Ok(ExportedHandOff {
                lease: w.lease,
                record,
            })
        }
    }
}

/// The lease and the record settings as plain values.
#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
impl serde::Serialize for ExportedHandOff {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serde::Serialize::serialize(&wire::Wire::from(self), serializer)
    }
}

/// Every field checked, the lease as
/// [`ExportedLease`](crate::ExportedLease) checks it.
#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
impl<'de> serde::Deserialize<'de> for ExportedHandOff {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let wire = <wire::Wire as serde::Deserialize>::deserialize(deserializer)?;
        ExportedHandOff::try_from(wire).map_err(serde::de::Error::custom)
    }
}
