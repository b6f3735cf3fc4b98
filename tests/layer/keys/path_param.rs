//! `KeyFrom::path_param::<T>` against axum's `Path`: a single `Path<T>`,
//! and a field of `Path<Params>` (the one deserializer axum reads a named
//! parameter with).

use axum::extract::Path;
use serde::Deserialize;

use super::*;

/// A path segment's characters and their spellings: digits (leading zeros
/// and `+` read as one `u64`), letters of both cases, `é` in NFC and in
/// NFD (two strings to the handler), a decoded `/`, bytes that are not
/// UTF-8 once decoded (axum refuses them), a literal `%`.
pub(crate) const SEGMENT: &[&[&str]] = &[
    &["0", "%30"],
    &["0", "%30"],
    &["7", "%37"],
    &["1", "%31"],
    &["a", "%61"],
    &["A", "%41"],
    &["+", "%2B", "%2b"],
    &["-", "%2D"],
    &["%20"],
    &["%C3%A9", "%c3%a9"],
    &["e%CC%81", "%65%cc%81"],
    &["%2F", "%2f"],
    &["%FF", "%ff"],
    &["%FE"],
    &[".", "%2E"],
    &["%25"],
];

#[derive(Debug, Deserialize)]
#[allow(dead_code)]
struct Params<T> {
    tenant: String,
    id: T,
}

fn post_to(uri: String) -> impl Fn() -> Request<Body> {
    move || Request::post(uri.as_str()).body(Body::empty()).unwrap()
}

fn check(
    served: &Served,
    prefix: &str,
    atoms: &[&[&str]],
    (a, b): (Spelled, Spelled),
) -> Result<(), TestCaseError> {
    let a = served.outcome(post_to(format!("{prefix}{}", write(atoms, &a))));
    let b = served.outcome(post_to(format!("{prefix}{}", write(atoms, &b))));
    refuses_as_the_extractor(&a)?;
    refuses_as_the_extractor(&b)?;
    one_key_per_value(&a, &b)
}

#[test]
fn a_u64_parameter_keys_as_path_u64_reads_it() {
    let served = Served::new(
        "/o/{id}",
        KeyFrom::path_param::<u64>("id"),
        |Path(id): Path<u64>| async move { format!("{id:?}") },
    );
    check_all(pair(3), true, |spelled| {
        check(&served, "/o/", DIGITS, spelled)
    });
}

#[test]
fn a_string_parameter_keys_as_path_string_reads_it() {
    let served = Served::new(
        "/o/{id}",
        KeyFrom::path_param::<String>("id"),
        |Path(id): Path<String>| async move { format!("{id:?}") },
    );
    check_all(pair(4), true, |spelled| {
        check(&served, "/o/", SEGMENT, spelled)
    });
}

#[test]
fn a_named_parameter_keys_as_a_field_of_path_params_reads_it() {
    let int = Served::new(
        "/t/{tenant}/o/{id}",
        KeyFrom::path_param::<i32>("id"),
        |Path(p): Path<Params<i32>>| async move { format!("{:?}", p.id) },
    );
    let string = Served::new(
        "/t/{tenant}/o/{id}",
        KeyFrom::path_param::<String>("id"),
        |Path(p): Path<Params<String>>| async move { format!("{:?}", p.id) },
    );
    check_all((pair(3), text(3)), true, |(spelled, tenant)| {
        let prefix = format!("/t/{}/o/", write(SEGMENT, &tenant));
        check(&int, &prefix, DIGITS, spelled.clone())?;
        check(&string, &prefix, SEGMENT, spelled)
    });
}
