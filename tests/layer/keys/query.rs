//! `KeyFrom::query::<T>` against axum's `Query<Params>`.

use axum::extract::Query;
use serde::Deserialize;

use super::*;

/// A query value's characters and their spellings: `+` and `%20` are one
/// space, `%2B` a plus; escapes of either case; bytes that are not UTF-8
/// (`%FF`, `%FE`, a lone `%80`) are all one U+FFFD to `Query`; `é` in NFC
/// and NFD; `&` and `=` escaped; a literal `%`, and a stray one.
const VALUE: &[&[&str]] = &[
    &["0", "%30"],
    &["7", "%37"],
    &["7", "%37"],
    &["a", "%61", "%61"],
    &["A", "%41"],
    &["+", "%20"],
    &["%2B", "%2b"],
    &["-"],
    &["%FF", "%ff", "%FE", "%80"],
    &["%C3%A9", "%c3%a9"],
    &["e%CC%81"],
    &["%26"],
    &["=", "%3D"],
    &["%25"],
    &["%"],
];

/// Ways to write the parameter's name `id`.
const NAME: &[&str] = &["id", "i%64", "%69d", "%69%64"];

/// Other parameters: another name, another case, an empty name.
const NOISE: &[&str] = &["x=1", "idx=2", "ID=3", "=4", "id2", ""];

#[derive(Debug, Deserialize)]
struct Params<T> {
    id: T,
}

/// A query: noise, the parameter (or not), noise, and maybe the parameter
/// again.
#[derive(Debug, Clone)]
struct Shape {
    before: usize,
    name: usize,
    present: bool,
    after: usize,
    again: Option<(usize, Spelled)>,
}

fn shape() -> impl Strategy<Value = Shape> {
    (
        0..8usize,
        0..8usize,
        prop::bool::weighted(0.9),
        0..8usize,
        prop::option::weighted(0.15, (0..8usize, text(2))),
    )
        .prop_map(|(before, name, present, after, again)| Shape {
            before,
            name,
            present,
            after,
            again,
        })
}

fn uri(atoms: &[&[&str]], shape: &Shape, value: &Spelled) -> String {
    let mut pairs = vec![NOISE[shape.before % NOISE.len()].to_owned()];
    if shape.present {
        pairs.push(format!(
            "{}={}",
            NAME[shape.name % NAME.len()],
            write(atoms, value)
        ));
    }
    pairs.push(NOISE[shape.after % NOISE.len()].to_owned());
    if let Some((name, value)) = &shape.again {
        pairs.push(format!(
            "{}={}",
            NAME[name % NAME.len()],
            write(atoms, value)
        ));
    }
    format!("/q?{}", pairs.join("&"))
}

fn check(
    served: &Served,
    atoms: &[&[&str]],
    (a, b): (Spelled, Spelled),
    (shape_a, shape_b): (Shape, Shape),
) -> Result<(), TestCaseError> {
    let send = |shape: &Shape, value: &Spelled| {
        let uri = uri(atoms, shape, value);
        served.outcome(move || Request::post(uri.as_str()).body(Body::empty()).unwrap())
    };
    let a = send(&shape_a, &a);
    let b = send(&shape_b, &b);
    refuses_as_the_extractor(&a)?;
    refuses_as_the_extractor(&b)?;
    one_key_per_value(&a, &b)
}

#[test]
fn a_string_parameter_keys_as_query_reads_it() {
    let served = Served::new(
        "/q",
        KeyFrom::query::<String>("id"),
        |Query(p): Query<Params<String>>| async move { format!("{:?}", p.id) },
    );
    check_all((pair(4), (shape(), shape())), true, |(spelled, shapes)| {
        check(&served, VALUE, spelled, shapes)
    });
}

#[test]
fn a_u64_parameter_keys_as_query_reads_it() {
    let served = Served::new(
        "/q",
        KeyFrom::query::<u64>("id"),
        |Query(p): Query<Params<u64>>| async move { format!("{:?}", p.id) },
    );
    check_all((pair(3), (shape(), shape())), true, |(spelled, shapes)| {
        check(&served, DIGITS, spelled, shapes)
    });
}
