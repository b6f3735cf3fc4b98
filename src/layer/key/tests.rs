use super::*;
use http::HeaderValue;

fn parts(uri: &str) -> Parts {
    http::Request::builder()
        .uri(uri)
        .header("x-delivery", "d-1")
        .body(())
        .unwrap()
        .into_parts()
        .0
}

async fn id(k: &KeyFrom, p: &mut Parts) -> Result<Option<Vec<u8>>, Refused> {
    k.id_in_head(p).await
}

fn found(id: &[u8]) -> Result<Option<Vec<u8>>, Refused> {
    Ok(Some(id.to_vec()))
}

#[tokio::test]
async fn head_sources() {
    let mut p = parts("/a/b?event=e%201&x=2");
    assert_eq!(id(&KeyFrom::path(), &mut p).await, found(b"/a/b"));
    assert_eq!(id(&KeyFrom::query("event"), &mut p).await, found(b"e 1"));
    assert_eq!(id(&KeyFrom::query("nope"), &mut p).await, Ok(None));
    let delivery = KeyFrom::header(HeaderName::from_static("x-delivery"));
    assert_eq!(id(&delivery, &mut p).await, found(b"d-1"));
    let custom = KeyFrom::custom(|p| Some(p.method.to_string()));
    assert_eq!(id(&custom, &mut p).await, found(b"GET"));
    // Outside an axum router there are no path params.
    assert_eq!(id(&KeyFrom::path_param("id"), &mut p).await, Ok(None));
}

#[tokio::test]
async fn one_spelling_per_id_and_no_repeats() {
    let path = KeyFrom::path();
    for (a, b) in [
        ("/a/b", "/a//%62"),
        ("/a/b/", "//a/b//"),
        ("/", "//"),
        ("/%7Bx%7D", "/{x}"),
    ] {
        assert_eq!(
            id(&path, &mut parts(a)).await,
            id(&path, &mut parts(b)).await,
            "{a} vs {b}"
        );
    }
    assert_ne!(
        id(&path, &mut parts("/a/b")).await,
        id(&path, &mut parts("/a/b/")).await
    );
    // Raw bytes, never lossily decoded: %FF and %FE stay apart.
    let q = KeyFrom::query("id");
    assert_eq!(id(&q, &mut parts("/?id=%FF")).await, found(b"\xff"));
    assert_eq!(id(&q, &mut parts("/?i%64=a+b%2")).await, found(b"a b%2"));
    assert_eq!(
        id(&q, &mut parts("/?id=a&id=b")).await,
        Err(Refused::Repeated)
    );
    assert_eq!(
        id(&q, &mut parts("/?id=a&id=a")).await,
        Err(Refused::Repeated)
    );
    assert_eq!(id(&q, &mut parts("/?id=&x=1")).await, Ok(None));
    let h = KeyFrom::header(HeaderName::from_static("x-id"));
    let mut twice = http::Request::builder()
        .header("x-id", "a")
        .header("x-id", "b")
        .body(())
        .unwrap()
        .into_parts()
        .0;
    assert_eq!(id(&h, &mut twice).await, Err(Refused::Repeated));
    let mut odd = http::Request::builder()
        .header("x-id", HeaderValue::from_bytes(b"\xff").unwrap())
        .body(())
        .unwrap()
        .into_parts()
        .0;
    assert_eq!(id(&h, &mut odd).await, found(b"\xff"));
}

#[tokio::test]
async fn a_path_has_one_spelling_and_ambiguous_paths_are_refused() {
    let path = |p: &str| canonical_path(p);
    // Decoded first (either hex case), then split: one key per path.
    for (a, b) in [
        ("/raw/a", "/raw/%61"),
        ("/raw/a", "//raw//a"),
        ("/raw/a", "/raw%2Fa"),
        ("/raw/a", "/raw%2f%2Fa"),
        ("/r%C3%A9", "/r%c3%a9"),
        ("/a/", "/a%2F"),
        ("/a/.b", "/a/%2Eb"),
        ("/a/...", "/a/%2e%2e%2e"),
    ] {
        assert_eq!(path(a), path(b), "{a} vs {b}");
        assert!(path(a).is_ok(), "{a}");
    }
    assert_eq!(path("/raw/%61"), Ok(b"/raw/a".to_vec()));
    assert_eq!(path("/a/%FF"), Ok(b"/a/\xff".to_vec()));
    // Different paths stay apart: a trailing slash, an escaped `%`.
    for (a, b) in [
        ("/a", "/a/"),
        ("/a%25zz", "/a%25zy"),
        ("/a%2561", "/aa"),
        ("/a%20b", "/a+b"),
    ] {
        assert_ne!(path(a), path(b), "{a} vs {b}");
    }
    // Dot segments, however spelled, are ambiguous.
    for p in [
        "/.",
        "/..",
        "/raw/./a",
        "/raw/../a",
        "/raw/a/.",
        "/raw/a/../",
        "/raw/%2e/a",
        "/raw/%2E%2e/a",
        "/raw/.%2E/a",
        "/raw%2F..%2Fa",
        "/raw/a%2F.",
    ] {
        assert_eq!(path(p), Err(Refused::DotSegment), "{p}");
    }
    // A `%` without two hex digits is one spelling of its `%25` form.
    for p in ["/a%zz", "/a%", "/a%2", "/a%%41", "/a%g0/b", "/%"] {
        assert_eq!(path(p), Err(Refused::BadEscape), "{p}");
    }
    // Through the key source, as the layer calls it.
    let mut p = parts("/raw/%2e%2e/a");
    assert_eq!(id(&KeyFrom::path(), &mut p).await, Err(Refused::DotSegment));
}

fn json(pointer: &str, body: &str) -> Result<Option<Vec<u8>>, Refused> {
    KeyFrom::json_pointer(pointer).id_in_body(body.as_bytes())
}

fn number(n: &str) -> Vec<u8> {
    json("/id", &format!(r#"{{"id":{n}}}"#))
        .unwrap()
        .unwrap_or_else(|| panic!("{n} gave no key"))
}

#[test]
fn json_sources() {
    let k = KeyFrom::json_pointer("/data/object/id");
    assert_eq!(
        k.id_in_body(br#"{"data":{"object":{"id":"evt_1"}}}"#),
        found(b"evt_1")
    );
    assert_eq!(
        k.id_in_body(br#"{"data":{"object":{"id":42}}}"#),
        found(b"42")
    );
    assert_eq!(k.id_in_body(br#"{"data":{}}"#), Ok(None));
    assert_eq!(k.id_in_body(br#"{"data":{"object":{"id":""}}}"#), Ok(None));
    assert!(matches!(
        k.id_in_body(b"{not json"),
        Err(Refused::NotJson(_))
    ));
    // Strings decoded; arrays, escaped pointer tokens, whitespace.
    assert_eq!(json("/id", r#" { "id" : "a\u0062\n" } "#), found(b"ab\n"));
    assert_eq!(
        json("/a/1/b", r#"{"a":[{"b":"x"},{"b":"y"}]}"#),
        found(b"y")
    );
    assert_eq!(json("/a/2", r#"{"a":["x","y"]}"#), Ok(None));
    assert_eq!(json("/a/01", r#"{"a":["x","y"]}"#), Ok(None));
    assert_eq!(json("/a~1b/c~0d", r#"{"a/b":{"c~d":"z"}}"#), found(b"z"));
    assert_eq!(json("", r#""whole""#), found(b"whole"));
    assert_eq!(json("id", r#"{"id":"a"}"#), Ok(None));
    // Not strings or numbers: no key.
    for v in ["null", "true", "{}", "[1]", r#"{"id":1}"#] {
        assert_eq!(json("/id", &format!(r#"{{"id":{v}}}"#)), Ok(None), "{v}");
    }
    assert_eq!(json("/id/x", r#"{"id":1e999}"#), Ok(None));
}

#[test]
fn a_json_body_is_checked_in_full() {
    for body in [
        r#"{"id":"a"} x"#,
        r#"{"id":"a",}"#,
        r#"{"id":"a","x":[1,]}"#,
        r#"{"id":"a","x":"\q"}"#,
        "{\"id\":\"a\",\"x\":\"\u{1}\"}",
        r#"{"id":"a","x":01}"#,
        r#"{"id":"a","x":}"#,
        "",
    ] {
        assert!(
            matches!(json("/id", body), Err(Refused::NotJson(_))),
            "{body:?}"
        );
    }
    // The grammar is checked, not what serde_json's `Value` can hold: a
    // number out of `f64` range or a lone surrogate elsewhere is JSON
    // (the handler's extractor judges it); as the id, a lone surrogate
    // has no text and is refused.
    assert_eq!(json("/id", r#"{"x":1e400,"id":"a"}"#), found(b"a"));
    assert_eq!(json("/id", r#"{"x":"\ud800","id":"a"}"#), found(b"a"));
    assert!(matches!(
        json("/id", r#"{"id":"\ud800"}"#),
        Err(Refused::NotJson(_))
    ));
    let mut bad_utf8 = br#"{"id":"a","x":""#.to_vec();
    bad_utf8.extend_from_slice(b"\xff\"}");
    assert!(matches!(
        KeyFrom::json_pointer("/id").id_in_body(&bad_utf8),
        Err(Refused::NotJson(_))
    ));
}

#[test]
fn a_json_member_on_the_way_named_twice_is_refused() {
    for (pointer, body) in [
        ("/id", r#"{"id":"a","id":"b"}"#),
        ("/id", r#"{"id":"a","id":"a"}"#),
        ("/id", r#"{"id":"a","x":1,"id":null}"#),
        ("/id", r#"{"\u0069d":"a","id":"b"}"#),
        ("/d/id", r#"{"d":{"id":"a"},"d":{"x":1}}"#),
        ("/d/id", r#"{"d":{"id":"a","id":"b"}}"#),
        ("/d/0/id", r#"{"d":[{"id":"a","id":"b"}]}"#),
    ] {
        assert_eq!(json(pointer, body), Err(Refused::Repeated), "{body}");
    }
    // Repeats off the way are not ours to judge.
    assert_eq!(json("/id", r#"{"x":1,"x":2,"id":"a"}"#), found(b"a"));
    assert_eq!(
        json("/d/id", r#"{"d":{"id":"a"},"e":{"id":"b"}}"#),
        found(b"a")
    );
}

#[test]
fn a_json_number_keys_by_its_exact_value() {
    // One value, one text: the text an integer is written in.
    for spellings in [
        &[
            "1", "1.0", "1e0", "1E0", "10e-1", "0.1e1", "1.000e+0", "100E-2",
        ][..],
        &[
            "0",
            "-0",
            "0.0",
            "-0.0e5",
            "0e-3",
            "0e99999999999999999999999",
        ],
        &["42", "4.2e1", "420e-1", "42.000"],
        &["-7", "-7.0", "-70e-1"],
        &["2500", "25e2", "2.5e3", "2500.0"],
        &["1.5", "15e-1", "1.50", "0.15e1"],
        &["0.0015", "1.5e-3", "15e-4"],
        &["1e65", "10e64", "0.1e66"],
        &["1.5e100", "15e99", "150e98"],
        &["1e-65", "0.1e-64", "10e-66"],
    ] {
        let first = number(spellings[0]);
        assert_eq!(first, spellings[0].as_bytes(), "canonical text");
        for s in spellings {
            assert_eq!(number(s), first, "{s} vs {}", spellings[0]);
        }
    }
    // Beyond f64: different values, different keys.
    for (a, b) in [
        ("1180591620717411303424", "1180591620717411303425"),
        ("18446744073709551616", "18446744073709551617"),
        ("1.5", "1.50000000000000000001"),
        ("0.1", "0.10000000000000000000000001"),
        ("1e400", "1e401"),
        ("1e-400", "0"),
        ("1e64", "1e65"),
        ("1", "-1"),
        ("123", "1.23"),
        ("9007199254740993", "9007199254740992"),
    ] {
        assert_ne!(number(a), number(b), "{a} vs {b}");
    }
    assert_eq!(number("1180591620717411303424"), b"1180591620717411303424");
    assert_eq!(number("1e64"), format!("1{}", "0".repeat(64)).into_bytes());
    assert_eq!(number("-1.5e-100"), b"-1.5e-100");
    assert_eq!(
        number("1e-64"),
        format!("0.{}1", "0".repeat(63)).into_bytes()
    );
    // A number keys as the string of its canonical text.
    assert_eq!(json("/id", r#"{"id":"1"}"#), json("/id", r#"{"id":1.0}"#));
    assert_ne!(json("/id", r#"{"id":"1.0"}"#), json("/id", r#"{"id":1.0}"#));
    // An exponent that cannot be kept exactly is refused, without a
    // huge allocation for one that can.
    assert_eq!(
        json("/id", r#"{"id":1e1000000000000000000}"#),
        Err(Refused::HugeExponent)
    );
    assert_eq!(number("1e1000000000"), b"1e1000000000");
    assert_eq!(
        number("-25e-999999999999999999"),
        b"-2.5e-999999999999999998"
    );
}

#[test]
fn body_digest_source() {
    let k = KeyFrom::body_digest();
    assert!(k.needs_body());
    // `printf abc | sha256sum`
    assert_eq!(
        k.id_in_body(b"abc").unwrap().as_deref(),
        Some(&b"ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"[..])
    );
    // The exact bytes: the same body, the same id; one byte apart (even
    // the same JSON spelled otherwise), another id.
    let a = br#"{"after":"abc123"}"#;
    assert_eq!(k.id_in_body(a).unwrap(), k.id_in_body(a).unwrap());
    for other in [
        &br#"{"after":"abc124"}"#[..],
        br#"{"after": "abc123"}"#,
        b"\xff",
    ] {
        assert_ne!(k.id_in_body(a).unwrap(), k.id_in_body(other).unwrap());
    }
    // Not JSON is fine; empty is no key.
    assert!(k.id_in_body(b"not json").unwrap().is_some());
    assert_eq!(k.id_in_body(b"").unwrap(), None);
    assert_eq!(format!("{k:?}"), "KeyFrom::body_digest()");
}
