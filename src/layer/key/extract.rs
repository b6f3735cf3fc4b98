//! A key taken from any extractor the handler uses.

use std::marker::PhantomData;

use axum::extract::FromRequestParts;
use axum::response::IntoResponse;
use futures_util::future::BoxFuture;
use http::request::Parts;
use serde::Serialize;

use super::{Refused, canonical};

/// Largest part of a rejection's body kept as the refusal's detail.
const MAX_DETAIL: usize = 4 << 10;

/// Runs an extractor on the request head and keys on what a function of
/// it gives.
pub(super) trait ExtractKey: Send + Sync {
    fn key<'a>(&'a self, parts: &'a mut Parts) -> BoxFuture<'a, Result<Option<Vec<u8>>, Refused>>;
}

/// Extractor `E`, then `f`.
pub(super) struct Extractor<E, F> {
    f: F,
    // `fn() -> E`: the key source holds no `E`, so it is `Send + Sync`
    // whatever `E` is.
    extractor: PhantomData<fn() -> E>,
}

impl<E, F> Extractor<E, F> {
    pub(super) fn new(f: F) -> Self {
        Extractor {
            f,
            extractor: PhantomData,
        }
    }
}

impl<E, K, F> ExtractKey for Extractor<E, F>
where
    E: FromRequestParts<()> + 'static,
    E::Rejection: IntoResponse,
    K: Serialize,
    F: Fn(E) -> K + Send + Sync,
{
    fn key<'a>(&'a self, parts: &'a mut Parts) -> BoxFuture<'a, Result<Option<Vec<u8>>, Refused>> {
        Box::pin(async move {
            // Neither `E` nor its rejection is held across the body read
            // (neither need be `Send`).
            let rejection = match E::from_request_parts(parts, &()).await {
                Ok(value) => return canonical::encode(&(self.f)(value)),
                Err(rejection) => rejection.into_response(),
            };
            Err(rejected(rejection).await)
        })
    }
}

/// A rejection as a refusal: its status, and its body as the detail.
pub(super) async fn rejected(res: axum::response::Response) -> Refused {
    let (parts, body) = res.into_parts();
    let detail = match axum::body::to_bytes(body, MAX_DETAIL).await {
        Ok(bytes) if !bytes.is_empty() => String::from_utf8_lossy(&bytes).into_owned(),
        _ => parts
            .status
            .canonical_reason()
            .unwrap_or("rejected")
            .to_owned(),
    };
    Refused::Rejected {
        status: parts.status,
        detail,
    }
}
