//! The whole request path in one spelling per path (see
//! [`KeyFrom::path`](crate::KeyFrom::path)).

use super::Refused;

/// One spelling per path: decoded to bytes, then split on `/`, empty
/// segments dropped, trailing slash kept; dot segments and stray `%`s
/// refused.
pub(super) fn canonical(path: &str) -> Result<Vec<u8>, Refused> {
    let decoded = percent_decode(path.as_bytes()).ok_or(Refused::BadEscape)?;
    let mut out = Vec::with_capacity(decoded.len() + 1);
    for seg in decoded.split(|&b| b == b'/').filter(|s| !s.is_empty()) {
        if seg == b"." || seg == b".." {
            return Err(Refused::DotSegment);
        }
        out.push(b'/');
        out.extend_from_slice(seg);
    }
    if out.is_empty() || decoded.ends_with(b"/") {
        out.push(b'/');
    }
    Ok(out)
}

/// `s` with each `%XX` decoded to its byte; `None` if a `%` is not followed
/// by two hex digits.
fn percent_decode(s: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i] == b'%' {
            let high = hex(*s.get(i + 1)?)?;
            let low = hex(*s.get(i + 2)?)?;
            out.push(high << 4 | low);
            i += 3;
        } else {
            out.push(s[i]);
            i += 1;
        }
    }
    Some(out)
}

fn hex(c: u8) -> Option<u8> {
    (c as char).to_digit(16).map(|d| d as u8)
}
