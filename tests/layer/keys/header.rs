//! `KeyFrom::header` against the bytes a handler reads from `HeaderMap`.

use axum::http::{HeaderMap, HeaderName};

use super::*;

/// Header value bytes: case, a space, a `%` sequence (never decoded), and
/// bytes past ASCII (`obs-text`): `é` in UTF-8, `\xFF`, `\xFE`.
const BYTES: &[&[u8]] = &[
    b"a",
    b"A",
    b"0",
    b"7",
    b" ",
    b"%41",
    "é".as_bytes(),
    b"\xff",
    b"\xfe",
];

fn value(spelled: &Spelled) -> Vec<u8> {
    spelled
        .iter()
        .flat_map(|&(atom, _)| BYTES[atom % BYTES.len()].iter().copied())
        .collect()
}

/// The request with the header once, or twice.
fn request(values: &[Vec<u8>]) -> impl Fn() -> Request<Body> + use<> {
    let values = values.to_vec();
    move || {
        let mut req = Request::post("/h");
        for v in &values {
            req = req.header("x-id", http::HeaderValue::from_bytes(v).unwrap());
        }
        req.body(Body::empty()).unwrap()
    }
}

/// What the handler reads: every value of the header, as bytes.
async fn read(headers: HeaderMap) -> String {
    let all: Vec<&[u8]> = headers
        .get_all("x-id")
        .iter()
        .map(|v| v.as_bytes())
        .collect();
    format!("{all:?}")
}

#[test]
fn a_header_keys_by_the_bytes_the_handler_reads() {
    let served = Served::new("/h", KeyFrom::header(HeaderName::from_static("x-id")), read);
    let again = prop::option::weighted(0.15, text(2));
    check_all((pair(4), again), true, |((a, b), again)| {
        let one = served.outcome(request(&[value(&a)]));
        let mut values = vec![value(&b)];
        values.extend(again.as_ref().map(value));
        let other = served.outcome(request(&values));
        // The handler reads whatever bytes are there; the layer keys one
        // value and refuses two.
        prop_assert_eq!(one.key.status, 200, "{:?}", one);
        let twice = again.is_some();
        prop_assert_eq!(
            other.key.status,
            if twice { 400 } else { 200 },
            "{:?}",
            other
        );
        if twice {
            tally(|t| t.refused += 1);
        }
        one_key_per_value(&one, &other)
    });
}
