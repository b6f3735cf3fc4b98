//! A JSON pointer walked on the body's text rather than on a parsed
//! `Value`: a number keeps its exact value (a `Value` keeps an `f64`), and a
//! member named twice is seen (a `Value` keeps the last one silently).

use std::fmt;

use serde::Deserializer as _;
use serde::de::{IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use super::Refused;

/// Decimal exponents up to this size are written out in full (`2500`,
/// `0.0015`); beyond it the canonical text is scientific (`1.5e100`).
const PLAIN: i128 = 64;

/// Exponents with more significant digits than this are refused: the
/// canonical exponent must be computed exactly, and no id needs one.
const MAX_EXPONENT_DIGITS: usize = 18;

/// The id at `pointer` (RFC 6901) in the JSON `body`: a string's text, a
/// number's canonical text, `None` for anything else or nothing there.
/// The whole body must be JSON, not only the way to the id.
pub(super) fn find(body: &[u8], pointer: &str) -> Result<Option<Vec<u8>>, Refused> {
    let mut value: &RawValue = serde_json::from_slice(body).map_err(not_json)?;
    if !pointer.is_empty() {
        let Some(tokens) = pointer.strip_prefix('/') else {
            return Ok(None);
        };
        for token in tokens.split('/') {
            let token = token.replace("~1", "/").replace("~0", "~");
            value = match step(value, &token).map_err(not_json)? {
                Step::Found(v) => v,
                Step::Absent => return Ok(None),
                Step::Repeated => return Err(Refused::Repeated),
            };
        }
    }
    leaf(value.get())
}

fn not_json(e: serde_json::Error) -> Refused {
    Refused::NotJson(e.to_string())
}

/// One level down the pointer.
enum Step<'a> {
    Found(&'a RawValue),
    Absent,
    /// An object names the member twice.
    Repeated,
}

fn step<'a>(value: &'a RawValue, token: &str) -> serde_json::Result<Step<'a>> {
    let text = value.get();
    let mut de = serde_json::Deserializer::from_str(text);
    let step = match text.as_bytes().first() {
        Some(b'{') => de.deserialize_map(Member(token))?,
        Some(b'[') => match index(token) {
            Some(i) => de.deserialize_seq(Element(i))?,
            None => return Ok(Step::Absent),
        },
        _ => return Ok(Step::Absent),
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

/// The member of an object named by the token; every member is read.
struct Member<'t>(&'t str);

impl<'de> Visitor<'de> for Member<'_> {
    type Value = Step<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Step<'de>, A::Error> {
        let mut step = Step::Absent;
        while let Some(name) = map.next_key::<String>()? {
            if name != self.0 {
                map.next_value::<IgnoredAny>()?;
                continue;
            }
            step = match step {
                Step::Absent => Step::Found(map.next_value()?),
                _ => {
                    map.next_value::<IgnoredAny>()?;
                    Step::Repeated
                }
            };
        }
        Ok(step)
    }
}

/// The element of an array at an index; every element is read.
struct Element(usize);

impl<'de> Visitor<'de> for Element {
    type Value = Step<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON array")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Step<'de>, A::Error> {
        let mut step = Step::Absent;
        let mut i = 0;
        loop {
            if i == self.0 {
                match seq.next_element()? {
                    Some(v) => step = Step::Found(v),
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

/// The id a JSON value gives: a string's text, a number's canonical text.
fn leaf(text: &str) -> Result<Option<Vec<u8>>, Refused> {
    match text.as_bytes().first() {
        Some(b'"') => serde_json::from_str::<String>(text)
            .map(|s| Some(s.into_bytes()))
            .map_err(not_json),
        Some(b'-' | b'0'..=b'9') => number(text).map(Some),
        _ => Ok(None),
    }
}

/// The canonical text of the exact value of a JSON number (`text` is one):
/// the significant digits without leading or trailing zeros and a decimal
/// exponent, computed on the text, never through an `f64`. Written out in
/// full while the exponent is within ±[`PLAIN`] (`1.0`, `10e-1` → `1`;
/// `25e2` → `2500`; `-0.0` → `0`), scientific beyond (`1.5e100`). Two values
/// never share a text: each value has one (digits, exponent) pair, and the
/// plain and scientific forms cannot meet (only one has an `e`).
fn number(text: &str) -> Result<Vec<u8>, Refused> {
    let (negative, text) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (mantissa, exponent) = text.split_once(['e', 'E']).unwrap_or((text, ""));
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let all: Vec<u8> = int.bytes().chain(frac.bytes()).collect();
    let Some(first) = all.iter().position(|&d| d != b'0') else {
        return Ok(b"0".to_vec());
    };
    let Some(last) = all.iter().rposition(|&d| d != b'0') else {
        return Ok(b"0".to_vec());
    };
    let digits = &all[first..=last];
    // value = digits × 10^e; lengths are at most the body's, so no overflow.
    let trailing = (all.len() - 1 - last) as i128;
    let e = parse_exponent(exponent)? - frac.len() as i128 + trailing;
    let n = digits.len() as i128;
    let mut out = Vec::with_capacity(digits.len() + 24);
    if negative {
        out.push(b'-');
    }
    if (0..=PLAIN).contains(&e) {
        out.extend_from_slice(digits);
        out.resize(out.len() + e as usize, b'0');
    } else if (-PLAIN..0).contains(&e) {
        // Digits before the point; none (zeros after it) when not positive.
        let point = n + e;
        if point > 0 {
            let (whole, part) = digits.split_at(point as usize);
            out.extend_from_slice(whole);
            out.push(b'.');
            out.extend_from_slice(part);
        } else {
            out.extend_from_slice(b"0.");
            out.resize(out.len() + (-point) as usize, b'0');
            out.extend_from_slice(digits);
        }
    } else {
        out.push(digits[0]);
        if n > 1 {
            out.push(b'.');
            out.extend_from_slice(&digits[1..]);
        }
        out.push(b'e');
        out.extend_from_slice((e + n - 1).to_string().as_bytes());
    }
    Ok(out)
}

/// The exponent part of a JSON number (after the `e`; empty for none).
fn parse_exponent(text: &str) -> Result<i128, Refused> {
    let (negative, digits) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let digits = digits.trim_start_matches('0');
    if digits.len() > MAX_EXPONENT_DIGITS {
        return Err(Refused::HugeExponent);
    }
    let value = digits
        .bytes()
        .fold(0i128, |v, d| v * 10 + i128::from(d - b'0'));
    Ok(if negative { -value } else { value })
}
