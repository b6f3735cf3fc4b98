//! A JSON pointer walked on the body's text rather than on a parsed
//! `Value`: a member named twice on the way is seen (a `Value` keeps the
//! last one silently, a derived struct refuses the body), and the value
//! found is read into the key's type by serde_json, as axum's `Json` reads
//! the body.

use std::fmt;
use std::marker::PhantomData;

use http::StatusCode;
use serde::Deserializer as _;
use serde::de::{DeserializeOwned, IgnoredAny, SeqAccess, Visitor};
use serde_json::error::Category;
use serde_json::value::RawValue;

use super::Refused;
use super::member::{Found, Named};

/// The value at `pointer` (RFC 6901) in the JSON `body`, `None` when
/// nothing is there. The whole body must be JSON, not only the way to the
/// value.
pub(super) fn find<'b>(body: &'b [u8], pointer: &str) -> Result<Option<&'b RawValue>, Refused> {
    let mut value: &RawValue = serde_json::from_slice(body).map_err(not_json)?;
    if !pointer.is_empty() {
        let Some(tokens) = pointer.strip_prefix('/') else {
            return Ok(None);
        };
        for token in tokens.split('/') {
            let token = token.replace("~1", "/").replace("~0", "~");
            value = match step(value, &token).map_err(not_json)? {
                Found::Once(v) => v,
                Found::Absent => return Ok(None),
                Found::Repeated => return Err(Refused::Repeated),
            };
        }
    }
    Ok(Some(value))
}

/// `value` as a `T`, refused as axum's `Json` refuses a body: 422 when it
/// is JSON of another shape (a string for a number, a float for an
/// integer), 400 when serde_json calls it a syntax error (a lone surrogate,
/// a number out of range).
pub(super) fn read<T: DeserializeOwned>(value: &RawValue) -> Result<T, Refused> {
    serde_json::from_str(value.get()).map_err(|e| match e.classify() {
        Category::Data => Refused::Rejected {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            detail: format!("Failed to deserialize the JSON body into the target type: {e}"),
        },
        _ => Refused::Rejected {
            status: StatusCode::BAD_REQUEST,
            detail: format!("Failed to parse the request body as JSON: {e}"),
        },
    })
}

fn not_json(e: serde_json::Error) -> Refused {
    Refused::NotJson(e.to_string())
}

/// One level down the pointer.
fn step<'a>(value: &'a RawValue, token: &str) -> serde_json::Result<Found<&'a RawValue>> {
    let text = value.get();
    let mut de = serde_json::Deserializer::from_str(text);
    let step = match text.as_bytes().first() {
        Some(b'{') => de.deserialize_map(Named(token, PhantomData))?,
        Some(b'[') => match index(token) {
            Some(i) => de.deserialize_seq(Element(i))?,
            None => return Ok(Found::Absent),
        },
        _ => return Ok(Found::Absent),
    };
    de.end()?;
    Ok(step)
}

/// An array index as RFC 6901 (and `serde_json::Value::pointer`) reads it:
/// digits, no leading zero.
fn index(token: &str) -> Option<usize> {
    if token.starts_with('+') || (token.starts_with('0') && token.len() != 1) {
        return None;
    }
    token.parse().ok()
}

/// The element of an array at an index; every element is read.
struct Element(usize);

impl<'de> Visitor<'de> for Element {
    type Value = Found<&'de RawValue>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON array")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut step = Found::Absent;
        let mut i = 0;
        loop {
            if i == self.0 {
                match seq.next_element()? {
                    Some(v) => step = Found::Once(v),
                    None => break,
                }
            } else if seq.next_element::<IgnoredAny>()?.is_none() {
                break;
            }
            i += 1;
        }
        Ok(step)
    }
}
