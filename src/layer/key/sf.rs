//! The `Idempotency-Key` header: a Structured Field string (RFC 8941,
//! `"8e03978e-40d5-43e8-bc93-6894a57f9324"`), as the IETF draft has it, or
//! the bare value Stripe's clients send. Both spellings of one key are one
//! key.

use super::Refused;

/// Longest key accepted, in bytes once unquoted (Stripe's limit): a longer
/// one is refused before any store call.
pub(crate) const MAX_IDEMPOTENCY_KEY: usize = 255;

/// The key a header value names: a quoted value unquoted (`\"` and `\\`
/// unescaped), a bare value as it is. Empty is no key; a malformed quoted
/// value or one over the limit is refused.
pub(crate) fn idempotency_key(value: &[u8]) -> Result<Option<Vec<u8>>, Refused> {
    let value = value.trim_ascii();
    let key = match value.first() {
        Some(b'"') => unquote(&value[1..])?,
        _ => {
            if let Some(bad) = value.iter().find(|b| !(0x21..=0x7e).contains(*b)) {
                return Err(malformed(format!(
                    "a bare key of printable ASCII without spaces, not byte {bad:#04x}"
                )));
            }
            value.to_vec()
        }
    };
    if key.len() > MAX_IDEMPOTENCY_KEY {
        return Err(malformed(format!(
            "at most {MAX_IDEMPOTENCY_KEY} bytes, not {}",
            key.len()
        )));
    }
    Ok((!key.is_empty()).then_some(key))
}

/// The rest of an sf-string after its opening quote: every character
/// printable ASCII, `\` only before `"` or `\`, the closing quote last.
fn unquote(rest: &[u8]) -> Result<Vec<u8>, Refused> {
    let mut out = Vec::with_capacity(rest.len());
    let mut bytes = rest.iter();
    while let Some(&b) = bytes.next() {
        match b {
            b'\\' => match bytes.next() {
                Some(&e @ (b'"' | b'\\')) => out.push(e),
                _ => return Err(malformed("`\\` only before `\"` or `\\`".to_owned())),
            },
            b'"' => {
                return if bytes.as_slice().is_empty() {
                    Ok(out)
                } else {
                    Err(malformed("nothing after the closing quote".to_owned()))
                };
            }
            0x20..=0x7e => out.push(b),
            _ => return Err(malformed(format!("printable ASCII, not byte {b:#04x}"))),
        }
    }
    Err(malformed("a closing quote".to_owned()))
}

fn malformed(what: String) -> Refused {
    Refused::Rejected {
        status: http::StatusCode::BAD_REQUEST,
        detail: format!("the Idempotency-Key header is malformed: expected {what}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoted_and_bare_spellings_of_one_key_are_one_key() {
        let bare = idempotency_key(b"8e03978e-40d5").unwrap();
        assert_eq!(bare.as_deref(), Some(&b"8e03978e-40d5"[..]));
        assert_eq!(idempotency_key(b"\"8e03978e-40d5\"").unwrap(), bare);
        assert_eq!(idempotency_key(b" \"8e03978e-40d5\" ").unwrap(), bare);
        assert_eq!(
            idempotency_key(br#""a \"b\" \\ c""#).unwrap().as_deref(),
            Some(&br#"a "b" \ c"#[..])
        );
        assert_eq!(idempotency_key(b"\"\"").unwrap(), None);
        assert_eq!(idempotency_key(b"").unwrap(), None);
    }

    #[test]
    fn malformed_or_long_keys_are_refused() {
        for bad in [
            &b"\"open"[..],
            b"\"a\"b",
            b"\"a\\nb\"",
            b"\"a\x01\"",
            b"two words",
            b"caf\xc3\xa9",
        ] {
            let refused = idempotency_key(bad).unwrap_err();
            assert_eq!(refused.status(), http::StatusCode::BAD_REQUEST, "{bad:?}");
        }
        let longest = "k".repeat(MAX_IDEMPOTENCY_KEY);
        assert!(idempotency_key(longest.as_bytes()).unwrap().is_some());
        assert!(idempotency_key(format!("\"{longest}\"").as_bytes()).is_ok());
        assert!(idempotency_key(format!("{longest}k").as_bytes()).is_err());
        assert!(idempotency_key(format!("\"{longest}k\"").as_bytes()).is_err());
    }
}
