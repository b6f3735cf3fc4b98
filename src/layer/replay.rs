//! Idempotent outcomes: storing a completed request's response with the
//! release, and replaying it to duplicates.

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use http_body_util::BodyExt;

use super::body::{ResponseBody, fields, store_and_release};
use super::idempotency::{
    ANSWER_HEADERS, IDEMPOTENT_REPLAYED, Idempotency, REPRESENTATION_HEADERS, describes_bytes,
    never_stored,
};
use super::problem::{Problem, ProblemKind};
use crate::engine::LockGuard;
use crate::key::LockKey;
use crate::layer::idempotency::Record;

/// The stored answer of a completed request, or 422 when the key comes back
/// with a different request.
pub(super) fn replay<B>(
    record: Record,
    fingerprint: Option<[u8; 32]>,
    key: &LockKey,
) -> Result<Response<ResponseBody<B>>, Problem> {
    if let (Some(stored), Some(now)) = (record.fingerprint, fingerprint)
        && stored != now
    {
        return Err(Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "this idempotency key was already used with a different request",
        )
        .key(Some(key))
        .of_kind(ProblemKind::PayloadMismatch));
    }
    tracing::debug!(key = %key, status = record.status.as_u16(), "replaying a completed request");
    crate::observe::replayed(record.status.as_u16());
    let trailers = (!record.trailers.is_empty()).then(|| {
        let mut map = HeaderMap::new();
        for (name, value) in record.trailers {
            map.append(name, value);
        }
        map
    });
    let mut res = Response::new(ResponseBody::full_with_trailers(record.body, trailers));
    *res.status_mut() = record.status;
    let h = res.headers_mut();
    for (name, value) in record.headers {
        // A record without its body: no coding, range or digest of bytes
        // that are not there.
        if record.body_omitted && describes_bytes(&name) {
            continue;
        }
        h.append(name, value);
    }
    h.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    Ok(res)
}

/// Buffers the response body (up to the stored-body limit), stores the
/// record and releases in one step, and hands the same response on, trailers
/// included. A body over the limit is handed on under the lock instead: its
/// record (body omitted) is stored with the release once it has ended
/// cleanly (see [`Idempotency::max_stored_body`]).
pub(super) async fn finish<B>(
    idem: &Idempotency,
    fencing_header: &HeaderName,
    guard: LockGuard,
    res: Response<B>,
    fingerprint: Option<[u8; 32]>,
) -> Result<Response<ResponseBody<B>>, Problem>
where
    B: http_body::Body<Data = Bytes>,
{
    let (parts, body) = res.into_parts();
    let mut body = Box::pin(body);
    let mut buf = BytesMut::new();
    let mut trailers = None;
    let mut over = false;
    loop {
        // (The error itself is not kept across the release below.)
        let frame = match body.frame().await {
            None => break,
            Some(frame) => frame.ok(),
        };
        let Some(frame) = frame else {
            // The response failed mid-body: store nothing, free the key.
            let key = guard.key().clone();
            let _ = guard.release().await;
            return Err(Problem::new(
                StatusCode::BAD_GATEWAY,
                "the handler's response body failed",
            )
            .key(Some(&key))
            .of_kind(ProblemKind::ResponseFailed));
        };
        match frame.into_data() {
            Ok(data) => {
                buf.extend_from_slice(&data);
                if buf.len() > idem.max_body {
                    over = true;
                    break;
                }
            }
            Err(frame) => {
                if let Ok(t) = frame.into_trailers() {
                    trailers = Some(t);
                }
            }
        }
    }
    let buf = buf.freeze();
    let mut record = Record::new(parts.status);
    record.fingerprint = fingerprint;
    record.headers = stored_headers(&parts.headers, &idem.headers, fencing_header);
    if over {
        record.body_omitted = true;
        tracing::debug!(
            key = %guard.key(),
            limit = idem.max_body,
            "response body over the stored-body limit: streaming it under the lock; \
             status, headers and trailers are stored once it ends"
        );
        let body = ResponseBody::finish_at_end(buf, body, guard, record, idem.retention);
        return Ok(Response::from_parts(parts, body));
    }
    record.body = buf.clone();
    if let Some(t) = &trailers {
        record.trailers = fields(t);
    }
    store_and_release(guard, record, idem.retention).await;
    Ok(Response::from_parts(
        parts,
        ResponseBody::full_with_trailers(buf, trailers),
    ))
}

/// The headers of an answer a record keeps. Each name once: the
/// representation headers, which give the stored bytes their meaning, the
/// answer's own (where, validators, caching), the run's fencing token,
/// then the chosen ones; never those of one transfer or moment.
pub(super) fn stored_headers(
    headers: &HeaderMap,
    chosen: &[HeaderName],
    fencing_header: &HeaderName,
) -> Vec<(HeaderName, HeaderValue)> {
    let mut names: Vec<&HeaderName> = Vec::new();
    for name in REPRESENTATION_HEADERS
        .iter()
        .chain(&ANSWER_HEADERS)
        .chain(std::iter::once(fencing_header))
        .chain(chosen)
    {
        if !never_stored(name) && !names.contains(&name) {
            names.push(name);
        }
    }
    names
        .into_iter()
        .flat_map(|name| {
            headers
                .get_all(name)
                .iter()
                .map(move |v| (name.clone(), v.clone()))
        })
        .collect()
}
