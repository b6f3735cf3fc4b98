//! Completed-request records for idempotent replay: the layer's codec for
//! the opaque bytes the engine stores with
//! [`LockGuard::finish`](crate::LockGuard::finish).

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderName, HeaderValue, StatusCode};

/// Format 2: format 1 plus the response trailers after the body.
const MAGIC: &[u8; 4] = b"TRL2";
/// Format 1 (no trailers): still read, as a record without trailers.
const MAGIC_V1: &[u8; 4] = b"TRL1";
const BODY_OMITTED: u8 = 1;
const HAS_FINGERPRINT: u8 = 2;

/// The stored outcome of a completed request: what a duplicate gets instead
/// of running the handler again.
///
/// The lock layer writes and reads it; it is public so that code that
/// shares keys with an idempotent layer (a job that completes an event the
/// layer also receives, a test that inspects what was stored) can read and
/// make one. Stores keep it as an opaque blob ([`encode`](Record::encode));
/// the format is versioned and checked on [`decode`](Record::decode), and
/// is this crate's own: decode what this crate encoded, do not parse it.
///
/// ```
/// use bytes::Bytes;
/// use http::StatusCode;
/// use tower_redis_lock::Record;
///
/// let record = Record::new(StatusCode::CREATED).with_body(Bytes::from_static(b"done"));
/// let again = Record::decode(record.encode()).expect("a record this version reads");
/// assert_eq!(again.status(), StatusCode::CREATED);
/// assert_eq!(again.body(), &b"done"[..]);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub(crate) status: StatusCode,
    /// The response headers chosen for replay.
    pub(crate) headers: Vec<(HeaderName, HeaderValue)>,
    pub(crate) body: Bytes,
    pub(crate) body_omitted: bool,
    pub(crate) fingerprint: Option<[u8; 32]>,
    pub(crate) created_at_ms: u64,
    pub(crate) trailers: Vec<(HeaderName, HeaderValue)>,
}

impl Record {
    /// A record of `status` with no headers and an empty body, stamped with
    /// the current time.
    pub fn new(status: StatusCode) -> Self {
        Record {
            status,
            headers: Vec::new(),
            body: Bytes::new(),
            body_omitted: false,
            fingerprint: None,
            created_at_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
            trailers: Vec::new(),
        }
    }

    /// The record with `body` as its response body.
    pub fn with_body(mut self, body: Bytes) -> Self {
        self.body = body;
        self.body_omitted = false;
        self
    }

    /// The record with one more response header replayed.
    pub fn with_header(mut self, name: HeaderName, value: HeaderValue) -> Self {
        self.headers.push((name, value));
        self
    }

    /// Response status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The response headers chosen for replay.
    pub fn headers(&self) -> &[(HeaderName, HeaderValue)] {
        &self.headers
    }

    /// The response body (empty when [`body_omitted`](Record::body_omitted)).
    pub fn body(&self) -> &Bytes {
        &self.body
    }

    /// True when the body was over the stored-body limit and only the status
    /// and headers were stored; a replay then has an empty body.
    pub fn body_omitted(&self) -> bool {
        self.body_omitted
    }

    /// Fingerprint of the request that produced it (SHA-256 of the body by
    /// default): a duplicate with another fingerprint is refused with 422.
    pub fn fingerprint(&self) -> Option<&[u8; 32]> {
        self.fingerprint.as_ref()
    }

    /// When it was stored.
    pub fn created_at(&self) -> SystemTime {
        UNIX_EPOCH + std::time::Duration::from_millis(self.created_at_ms)
    }

    /// The response trailers (a body's final `HEADERS` frame), replayed as
    /// they came; empty when the response had none.
    pub fn trailers(&self) -> &[(HeaderName, HeaderValue)] {
        &self.trailers
    }

    /// The stored form.
    pub fn encode(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(64 + self.body.len());
        b.put_slice(MAGIC);
        b.put_u16(self.status.as_u16());
        let mut flags = 0;
        if self.body_omitted {
            flags |= BODY_OMITTED;
        }
        if self.fingerprint.is_some() {
            flags |= HAS_FINGERPRINT;
        }
        b.put_u8(flags);
        b.put_u64(self.created_at_ms);
        if let Some(fp) = &self.fingerprint {
            b.put_slice(fp);
        }
        put_fields(&mut b, &self.headers);
        b.put_u32(self.body.len() as u32);
        b.put_slice(&self.body);
        put_fields(&mut b, &self.trailers);
        b.freeze()
    }

    /// Parses the stored form; `None` if it is not a record of this format
    /// or of the previous one (format 1, read as a record without
    /// trailers). Never panics, whatever the bytes.
    pub fn decode(mut raw: Bytes) -> Option<Self> {
        let magic = take(&mut raw, 4)?;
        let v1 = match magic.as_ref() {
            m if m == MAGIC => false,
            m if m == MAGIC_V1 => true,
            _ => return None,
        };
        if raw.remaining() < 11 {
            return None;
        }
        let status = StatusCode::from_u16(raw.get_u16()).ok()?;
        let flags = raw.get_u8();
        let created_at_ms = raw.get_u64();
        let fingerprint = if flags & HAS_FINGERPRINT != 0 {
            Some(<[u8; 32]>::try_from(take(&mut raw, 32)?.as_ref()).ok()?)
        } else {
            None
        };
        let headers = get_fields(&mut raw)?;
        if raw.remaining() < 4 {
            return None;
        }
        let len = raw.get_u32() as usize;
        let body = take(&mut raw, len)?;
        let trailers = if v1 {
            Vec::new()
        } else {
            get_fields(&mut raw)?
        };
        raw.is_empty().then_some(Record {
            status,
            headers,
            body,
            body_omitted: flags & BODY_OMITTED != 0,
            fingerprint,
            created_at_ms,
            trailers,
        })
    }
}

fn take(raw: &mut Bytes, n: usize) -> Option<Bytes> {
    (raw.remaining() >= n).then(|| raw.split_to(n))
}

/// A count, then each name and value with its length.
fn put_fields(b: &mut BytesMut, fields: &[(HeaderName, HeaderValue)]) {
    b.put_u16(fields.len().min(u16::MAX as usize) as u16);
    for (name, value) in fields.iter().take(u16::MAX as usize) {
        b.put_u16(name.as_str().len() as u16);
        b.put_slice(name.as_str().as_bytes());
        b.put_u32(value.len() as u32);
        b.put_slice(value.as_bytes());
    }
}

fn get_fields(raw: &mut Bytes) -> Option<Vec<(HeaderName, HeaderValue)>> {
    if raw.remaining() < 2 {
        return None;
    }
    let n = raw.get_u16() as usize;
    // Each field takes at least 6 bytes: no allocation past what is there.
    let mut fields = Vec::with_capacity(n.min(raw.remaining() / 6));
    for _ in 0..n {
        if raw.remaining() < 2 {
            return None;
        }
        let len = raw.get_u16() as usize;
        let name = HeaderName::from_bytes(&take(raw, len)?).ok()?;
        if raw.remaining() < 4 {
            return None;
        }
        let len = raw.get_u32() as usize;
        let value = HeaderValue::from_maybe_shared(take(raw, len)?).ok()?;
        fields.push((name, value));
    }
    Some(fields)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let mut r = Record::new(StatusCode::CREATED);
        r.headers.push((
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        ));
        r.headers
            .push((HeaderName::from_static("x-a"), HeaderValue::from_static("")));
        r.body = Bytes::from_static(b"{\"ok\":true}\0\xff");
        r.fingerprint = Some([7; 32]);
        r.trailers.push((
            HeaderName::from_static("grpc-status"),
            HeaderValue::from_static("0"),
        ));
        let raw = r.encode();
        assert_eq!(Record::decode(raw.clone()), Some(r.clone()));
        // Truncated or extended blobs are refused.
        for n in 0..raw.len() {
            assert_eq!(Record::decode(raw.slice(..n)), None, "prefix {n}");
        }
        let mut longer = raw.to_vec();
        longer.push(0);
        assert_eq!(Record::decode(Bytes::from(longer)), None);
        let mut plain = Record::new(StatusCode::OK);
        plain.body_omitted = true;
        assert_eq!(Record::decode(plain.encode()), Some(plain));
    }
}
