//! `KeyFrom::path` against a wildcard `Path<String>`: the promise is on the
//! decoded path's non-empty segments (and its trailing slash).

use axum::extract::Path;

use super::*;

/// A path's characters and their spellings: a segment separator, spelled
/// once, twice (an empty segment) or as a `%2F` that axum decodes; dot
/// segments however spelled,
/// case, `é` in NFC and NFD, invalid UTF-8, a literal and a stray `%`.
const PATH: &[&[&str]] = &[
    &["/", "//", "%2F", "%2f", "/%2F"],
    &["/", "//"],
    &["a", "%61"],
    &["A", "%41"],
    &[".", "%2e", "%2E"],
    &["%C3%A9", "%c3%a9"],
    &["e%CC%81"],
    &["%FF"],
    &["%25"],
    &["%"],
];

/// What the promise is about, from what the handler read: the non-empty
/// segments and whether the path ends with `/`.
fn segments(read: &str) -> (Vec<&str>, bool) {
    let segments = read.split('/').filter(|s| !s.is_empty()).collect();
    (segments, read.ends_with('/'))
}

/// A `%` not followed by two hex digits.
fn stray_percent(path: &str) -> bool {
    let b = path.as_bytes();
    (0..b.len()).any(|i| {
        b[i] == b'%'
            && !(b.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
                && b.get(i + 2).is_some_and(u8::is_ascii_hexdigit))
    })
}

#[test]
fn spellings_of_one_path_share_a_key_and_two_paths_never_do() {
    let served = Served::new(
        "/p/{*rest}",
        KeyFrom::path(),
        |Path(rest): Path<String>| async move { rest },
    );
    check_all(pair(8), true, |(a, b)| {
        let mut seen = Vec::new();
        for spelled in [&a, &b] {
            let path = format!("/p/x{}", write(PATH, spelled));
            let uri = path.clone();
            let o =
                served.outcome(move || Request::post(uri.as_str()).body(Body::empty()).unwrap());
            if o.read.status == 200 && o.key.status != 200 {
                // Refused only where the layer says it refuses.
                tally(|t| t.refused += 1);
                let (segs, _) = segments(&o.read.body);
                prop_assert_eq!(o.key.status, 400, "{:?}", o);
                prop_assert!(
                    segs.iter().any(|s| *s == "." || *s == "..") || stray_percent(&path),
                    "{} refused: {:?}",
                    path,
                    o
                );
            }
            seen.push(o);
        }
        let (a, b) = (&seen[0], &seen[1]);
        if a.both_ok() && b.both_ok() {
            let one = segments(&a.read.body) == segments(&b.read.body);
            one_or_two(one);
            prop_assert_eq!(one, a.key.body == b.key.body, "{:?} and {:?}", a, b);
        }
        Ok(())
    });
}
