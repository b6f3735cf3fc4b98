//! The id of a typed value: one text per value, whatever spelling the
//! request used for it.

use http::StatusCode;
use serde::Serialize;

use super::Refused;

/// The id of `value`: serde_json's text of it, except that a value written
/// as a JSON string keys as the string itself (`"ord_1"` keys as `ord_1`,
/// so string ids stay readable in Redis and in logs). `None`, for a value
/// written as `null` (`Option::None`, `()`) or as an empty string: no key.
///
/// serde_json, rather than a format of our own, because it is what the
/// handler's own `Serialize` already defines and it writes one text per
/// value: integers in full (never through an `f64`; `07` was parsed to
/// `7` before it gets here), strings with one escape per character, struct
/// fields in declaration order, floats in their shortest round-trip form.
/// Two values of one type share a text only where serde_json writes them
/// alike: `NaN` and the infinities are written `null` (so they have no
/// key), and a type that writes some values as strings and others not
/// (`serde_json::Value`, an untagged enum) keys `"7"` and `7` alike — more
/// exclusion, never less. A type whose `Serialize` does not write one text
/// per value (a `HashMap`, in its random order) must not be a key type.
pub(super) fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Option<Vec<u8>>, Refused> {
    let text = serde_json::to_vec(value).map_err(|e| Refused::Rejected {
        status: StatusCode::INTERNAL_SERVER_ERROR,
        detail: format!("the lock key's value cannot be written as JSON: {e}"),
    })?;
    if text == b"null" {
        return Ok(None);
    }
    if text.first() != Some(&b'"') {
        return Ok(Some(text));
    }
    // serde_json reads back what it wrote.
    let string: String = serde_json::from_slice(&text).map_err(|e| Refused::Rejected {
        status: StatusCode::INTERNAL_SERVER_ERROR,
        detail: format!("the lock key's value cannot be read back: {e}"),
    })?;
    Ok(Some(string.into_bytes()).filter(|id| !id.is_empty()))
}
