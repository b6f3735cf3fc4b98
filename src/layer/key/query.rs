//! A query parameter read as axum's `Query` reads it.
//!
//! axum's `Query<T>` hands the query string to `serde_urlencoded`'s
//! deserializer over `form_urlencoded::parse` (`+` is a space, escapes of
//! either case are decoded, invalid UTF-8 becomes U+FFFD). The key runs the
//! same deserializer, with a visitor that takes the named parameter's value
//! as a `T` (what a field of a derived `Query<Params>` is read with) and
//! skips the rest.

use std::marker::PhantomData;

use http::StatusCode;
use serde::Deserializer as _;
use serde::de::DeserializeOwned;

use super::Refused;
use super::member::{Found, Named};

/// Parameter `name` of `query` as `T`; `None` when it is not there. Given
/// twice, refused: a derived `Query<Params>` refuses it too, a map reads
/// the last one.
pub(super) fn parse<T: DeserializeOwned>(query: &str, name: &str) -> Result<Option<T>, Refused> {
    let de = serde_urlencoded::Deserializer::new(form_urlencoded::parse(query.as_bytes()));
    match de.deserialize_map(Named::<T>(name, PhantomData)) {
        Ok(Found::Absent) => Ok(None),
        Ok(Found::Once(value)) => Ok(Some(value)),
        Ok(Found::Repeated) => Err(Refused::Repeated),
        Err(e) => Err(Refused::Rejected {
            status: StatusCode::BAD_REQUEST,
            detail: format!("Failed to deserialize query string: {name}: {e}"),
        }),
    }
}
