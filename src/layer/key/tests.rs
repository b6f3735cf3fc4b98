use super::*;
use http::HeaderValue;
use http::StatusCode;

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
    let event = KeyFrom::query::<String>("event");
    assert_eq!(id(&event, &mut p).await, found(b"e 1"));
    let nope = KeyFrom::query::<String>("nope");
    assert_eq!(id(&nope, &mut p).await, Ok(None));
    let delivery = KeyFrom::header(HeaderName::from_static("x-delivery"));
    assert_eq!(id(&delivery, &mut p).await, found(b"d-1"));
    let custom = KeyFrom::custom(|p| Some(p.method.to_string()));
    assert_eq!(id(&custom, &mut p).await, found(b"GET"));
    // Outside an axum router there are no path params.
    let param = KeyFrom::path_param::<u64>("id");
    assert_eq!(id(&param, &mut p).await, Ok(None));
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
    // Decoded as `Query` decodes: invalid UTF-8 to U+FFFD, `+` a space, a
    // stray `%` kept.
    let q = KeyFrom::query::<String>("id");
    assert_eq!(
        id(&q, &mut parts("/?id=%FF")).await,
        found("\u{FFFD}".as_bytes())
    );
    assert_eq!(
        id(&q, &mut parts("/?id=%FE")).await,
        found("\u{FFFD}".as_bytes())
    );
    assert_eq!(id(&q, &mut parts("/?i%64=a+b%2")).await, found(b"a b%2"));
    assert_eq!(
        id(&q, &mut parts("/?id=a&id=b")).await,
        Err(Refused::Repeated)
    );
    assert_eq!(
        id(&q, &mut parts("/?id=a&i%64=a")).await,
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
    let path = |p: &str| path::canonical(p);
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
    KeyFrom::json_pointer::<String>(pointer).id_in_body(body.as_bytes())
}

fn rejected(r: Result<Option<Vec<u8>>, Refused>) -> StatusCode {
    match r {
        Err(Refused::Rejected { status, .. }) => status,
        other => panic!("not rejected: {other:?}"),
    }
}

#[test]
fn json_sources() {
    let k = KeyFrom::json_pointer::<String>("/data/object/id");
    assert_eq!(
        k.id_in_body(br#"{"data":{"object":{"id":"evt_1"}}}"#),
        found(b"evt_1")
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
    assert_eq!(json("/id/x", r#"{"id":1e999}"#), Ok(None));
    // `null` is no key where the type reads it as `None`; another shape is
    // what `Json` answers 422 for.
    let optional = KeyFrom::json_pointer::<Option<String>>("/id");
    assert_eq!(optional.id_in_body(br#"{"id":null}"#), Ok(None));
    assert_eq!(optional.id_in_body(br#"{"id":"a"}"#), found(b"a"));
    for v in ["null", "true", "{}", "[1]", "1"] {
        let body = format!(r#"{{"id":{v}}}"#);
        assert_eq!(rejected(json("/id", &body)), 422, "{v}");
    }
}

#[test]
fn a_json_value_keys_as_its_type_reads_it() {
    let key = |k: &KeyFrom, v: &str| k.id_in_body(format!(r#"{{"id":{v}}}"#).as_bytes());
    let int = KeyFrom::json_pointer::<i64>("/id");
    assert_eq!(key(&int, "7"), found(b"7"));
    assert_eq!(key(&int, "-7"), found(b"-7"));
    // What an `i64` cannot read, `Json` answers 422 for: the layer too
    // (serde_json reads `-0` as a float).
    for v in ["7.0", "1e0", "-0", "-0.0", r#""7""#, "9223372036854775808"] {
        assert_eq!(rejected(key(&int, v)), 422, "{v}");
    }
    // Spellings of one `f64` share its key; two `f64`s never do.
    let float = KeyFrom::json_pointer::<f64>("/id");
    for v in ["1.0", "1e0", "10e-1", "0.1e1", "1"] {
        assert_eq!(key(&float, v), found(b"1.0"), "{v}");
    }
    assert_ne!(key(&float, "0.1"), key(&float, "0.10000000000000002"));
    // Out of range is a syntax error to serde_json, so 400 as `Json`.
    assert_eq!(rejected(key(&float, "1e400")), 400);
    // A lone surrogate has no text: 400, as `Json` answers.
    assert_eq!(rejected(json("/id", r#"{"id":"\ud800"}"#)), 400);
    // A self-describing type keys a string as its text.
    let any = KeyFrom::json_pointer::<serde_json::Value>("/id");
    assert_eq!(key(&any, r#""a""#), found(b"a"));
    assert_eq!(
        key(&any, r#"{"b":1,"a":[true]}"#),
        found(br#"{"a":[true],"b":1}"#)
    );
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
    // (the handler's extractor judges it).
    assert_eq!(json("/id", r#"{"x":1e400,"id":"a"}"#), found(b"a"));
    assert_eq!(json("/id", r#"{"x":"\ud800","id":"a"}"#), found(b"a"));
    let mut bad_utf8 = br#"{"id":"a","x":""#.to_vec();
    bad_utf8.extend_from_slice(b"\xff\"}");
    assert!(matches!(
        KeyFrom::json_pointer::<String>("/id").id_in_body(&bad_utf8),
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
fn a_value_is_encoded_once_and_strings_stay_readable() {
    use canonical::encode;
    assert_eq!(encode("ord_1"), found(b"ord_1"));
    assert_eq!(encode("a\"b"), found(b"a\"b"));
    assert_eq!(encode(&7u64), found(b"7"));
    assert_eq!(encode(&("acme", 7)), found(br#"["acme",7]"#));
    assert_eq!(encode(&-0.0f64), found(b"-0.0"));
    // No key: `None`, `()`, an empty string, and floats serde_json writes
    // as `null`.
    assert_eq!(encode(&None::<u64>), Ok(None));
    assert_eq!(encode(&()), Ok(None));
    assert_eq!(encode(""), Ok(None));
    assert_eq!(encode(&f64::NAN), Ok(None));
    // A string "null" is an id, not a missing one.
    assert_eq!(encode("null"), found(b"null"));
    // A value serde_json cannot write is the server's error.
    let mut map = std::collections::BTreeMap::new();
    map.insert((1, 2), 3);
    assert_eq!(rejected(encode(&map)), 500);
}

#[test]
fn a_path_parameter_is_read_as_axum_reads_it() {
    use param::parse;
    assert_eq!(parse::<u64>("id", "07"), Ok(7));
    assert_eq!(parse::<String>("id", "07"), Ok("07".to_owned()));
    assert_eq!(parse::<Option<u64>>("id", "7"), Ok(Some(7)));
    assert_eq!(parse::<char>("id", "é"), Ok('é'));
    #[derive(Debug, PartialEq, serde::Deserialize)]
    enum Kind {
        Card,
    }
    assert_eq!(parse::<Kind>("kind", "Card"), Ok(Kind::Card));
    // axum's words and statuses.
    assert_eq!(
        parse::<u64>("id", "x"),
        Err(Refused::Rejected {
            status: StatusCode::BAD_REQUEST,
            detail: "Invalid URL: Cannot parse `id` with value `x` to a `u64`".to_owned(),
        })
    );
    let variant = parse::<Kind>("kind", "Cash").unwrap_err();
    assert_eq!(variant.status(), 400);
    assert!(
        variant.to_string().contains("unknown variant `Cash`"),
        "{variant}"
    );
    assert_eq!(parse::<(String, u64)>("id", "7").unwrap_err().status(), 400);
    assert_eq!(parse::<Vec<u64>>("id", "7").unwrap_err().status(), 500);
    let map = parse::<std::collections::BTreeMap<String, u64>>("id", "7");
    assert_eq!(map.unwrap_err().status(), 500);
}

#[test]
fn type_names_are_short() {
    assert_eq!(
        short("axum::extract::path::Path<(alloc::string::String, u64)>"),
        "Path<(String, u64)>"
    );
    assert_eq!(short("u64"), "u64");
    assert_eq!(
        format!("{:?}", KeyFrom::query::<String>("id")),
        r#"KeyFrom::query::<String>("id")"#
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

/// An extractor's rejection keeps its status; its body is the refusal's
/// detail, up to 4 KiB, and an empty or longer one gives way to the
/// status's reason.
#[tokio::test]
async fn a_rejections_body_is_its_detail_and_an_empty_or_long_one_its_reason() {
    use axum::response::IntoResponse;
    let rejected = |res: axum::response::Response| extract::rejected(res);
    let expect = |status: StatusCode, detail: &str| Refused::Rejected {
        status,
        detail: detail.to_owned(),
    };
    assert_eq!(
        rejected((StatusCode::UNAUTHORIZED, "token expired").into_response()).await,
        expect(StatusCode::UNAUTHORIZED, "token expired")
    );
    assert_eq!(
        rejected(StatusCode::FORBIDDEN.into_response()).await,
        expect(StatusCode::FORBIDDEN, "Forbidden")
    );
    let longest = "x".repeat(4 << 10);
    assert_eq!(
        rejected((StatusCode::BAD_REQUEST, longest.clone()).into_response()).await,
        expect(StatusCode::BAD_REQUEST, &longest)
    );
    assert_eq!(
        rejected((StatusCode::BAD_REQUEST, "x".repeat((4 << 10) + 1)).into_response()).await,
        expect(StatusCode::BAD_REQUEST, "Bad Request")
    );
}
