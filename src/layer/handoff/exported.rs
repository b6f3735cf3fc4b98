//! A [`HandOff`] carried to a worker in another process (feature `serde`):
//! the exported lease and the record settings, serialized and checked.

use super::{HandOff, RecordSpec};
use crate::engine::ExportedLease;
use crate::error::Error;

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
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
#[derive(Debug, Clone)]
#[must_use = "an exported hand-off that is never resumed is a lock left to lapse at its lease"]
pub struct ExportedHandOff {
    lease: ExportedLease,
    record: Option<RecordSpec>,
}

impl ExportedHandOff {
    pub(super) fn new(lease: ExportedLease, record: Option<RecordSpec>) -> Self {
        ExportedHandOff { lease, record }
    }

    /// The exported lease inside.
    pub fn lease(&self) -> &ExportedLease {
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
        Ok(HandOff::resumed(guard, self.record))
    }
}

mod wire {
    use std::time::Duration;

    use http::HeaderName;

    use super::{ExportedHandOff, RecordSpec};
    use crate::engine::ExportedLease;
    use crate::layer::idempotency::{check_fencing_header, check_record};

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
                Some(r) => {
                    // The bounds a layer's settings are held to.
                    let retention = Duration::from_millis(r.retention_ms);
                    check_record(retention, r.max_body).map_err(|e| e.to_string())?;
                    let fencing_header = header(&r.fencing_header)?;
                    check_fencing_header(&fencing_header).map_err(|e| e.to_string())?;
                    Some(RecordSpec {
                        fingerprint: r.fingerprint.as_deref().map(fingerprint).transpose()?,
                        retention,
                        max_body: r.max_body,
                        headers: r
                            .headers
                            .iter()
                            .map(|h| header(h))
                            .collect::<Result<_, _>>()?,
                        fencing_header,
                    })
                }
            };
            Ok(ExportedHandOff {
                lease: w.lease,
                record,
            })
        }
    }
}

/// The lease and the record settings as plain values.
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
impl serde::Serialize for ExportedHandOff {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serde::Serialize::serialize(&wire::Wire::from(self), serializer)
    }
}

/// Every field checked, the lease as
/// [`ExportedLease`](crate::ExportedLease) checks it.
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
impl<'de> serde::Deserialize<'de> for ExportedHandOff {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let wire = <wire::Wire as serde::Deserialize>::deserialize(deserializer)?;
        ExportedHandOff::try_from(wire).map_err(serde::de::Error::custom)
    }
}
