//! `KeyFrom::json_pointer::<T>` against axum's `Json<Event>`.

use axum::Json;
use serde::Deserialize;

use super::*;

/// A JSON string's characters and their spellings: `\u` escapes of either
/// case, `\/`, a surrogate pair, `é` in NFC and in NFD (two strings).
const STRING: &[&[&str]] = &[
    &["a", "\\u0061"],
    &["A", "\\u0041"],
    &["7", "\\u0037"],
    &["é", "\\u00e9", "\\u00E9"],
    &["e\u{301}", "e\\u0301"],
    &["\\\"", "\\u0022"],
    &["/", "\\/"],
    &["😀", "\\ud83d\\ude00", "\\uD83D\\uDE00"],
    &[" ", "\\u0020"],
    &["\\\\", "\\u005c"],
];

/// Values for a `u64` id: spellings of 7 and 0 that `u64` reads and ones
/// it refuses (a float, a string, out of range, not JSON).
const NUMBER: &[&str] = &[
    "7",
    "42",
    "9",
    "10",
    "18446744073709551614",
    "7.0",
    "7e0",
    "0",
    "-0",
    "1",
    "100",
    "1e2",
    "18446744073709551615",
    "18446744073709551616",
    "-7",
    "\"7\"",
    "007",
    "null",
    "true",
];

#[derive(Debug, Deserialize)]
struct Event<T> {
    id: T,
}

/// A body around the id's JSON text: members before and after, spacing,
/// and maybe the id member again (axum's `Json` answers 422 for it, the
/// layer 400; both refuse) or bytes after the object (both 400, or 422
/// from `Json` when the id is of the wrong shape).
#[derive(Debug, Clone)]
struct Shape {
    before: bool,
    after: bool,
    spaced: bool,
    again: bool,
    trailing: bool,
}

fn shape() -> impl Strategy<Value = Shape> {
    (
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        prop::bool::weighted(0.1),
        prop::bool::weighted(0.1),
    )
        .prop_map(|(before, after, spaced, again, trailing)| Shape {
            before,
            after,
            spaced,
            again,
            trailing,
        })
}

impl Shape {
    fn body(&self, id: &str) -> String {
        let sep = if self.spaced { " , " } else { "," };
        let colon = if self.spaced { " : " } else { ":" };
        let mut members = Vec::new();
        if self.before {
            members.push(format!(r#""x"{colon}[1,{{"id":2}}]"#));
        }
        members.push(format!(r#""id"{colon}{id}"#));
        if self.after {
            members.push(format!(r#""y"{colon}"id""#));
        }
        if self.again {
            members.push(format!(r#""\u0069d"{colon}{id}"#));
        }
        let tail = if self.trailing { " x" } else { "" };
        format!("{{{}}}{tail}", members.join(sep))
    }

    /// Whether the two answer with different refusals: both must refuse.
    fn statuses_may_differ(&self) -> bool {
        self.again || self.trailing
    }
}

fn check(
    served: &Served,
    ids: (String, String),
    shapes: (Shape, Shape),
) -> Result<(), TestCaseError> {
    let send = |shape: &Shape, id: &str| {
        let body = shape.body(id);
        served.outcome(move || {
            Request::post("/j")
                .header("content-type", "application/json")
                .body(Body::from(body.clone()))
                .unwrap()
        })
    };
    let a = send(&shapes.0, &ids.0);
    let b = send(&shapes.1, &ids.1);
    for (o, shape) in [(&a, &shapes.0), (&b, &shapes.1)] {
        if shape.statuses_may_differ() {
            prop_assert!(o.read.status != 200 && o.key.status != 200, "{:?}", o);
            tally(|t| t.refused += 1);
        } else {
            refuses_as_the_extractor(o)?;
        }
    }
    one_key_per_value(&a, &b)
}

#[test]
fn a_string_member_keys_as_json_reads_it() {
    let served = Served::new(
        "/j",
        KeyFrom::json_pointer::<String>("/id"),
        |Json(e): Json<Event<String>>| async move { format!("{:?}", e.id) },
    );
    let quote = |s: &Spelled| format!("\"{}\"", write(STRING, s));
    check_all((pair(4), (shape(), shape())), true, |(spelled, shapes)| {
        check(&served, (quote(&spelled.0), quote(&spelled.1)), shapes)
    });
}

#[test]
fn a_u64_member_keys_as_json_reads_it() {
    let served = Served::new(
        "/j",
        KeyFrom::json_pointer::<u64>("/id"),
        |Json(e): Json<Event<u64>>| async move { format!("{:?}", e.id) },
    );
    // Half the pairs are one spelling twice: JSON has one spelling of an
    // integer that a `u64` reads.
    let numbers = (0..NUMBER.len(), 0..NUMBER.len(), any::<bool>());
    check_all(
        (numbers, (shape(), shape())),
        true,
        |((a, b, twice), shapes)| {
            let b = if twice { a } else { b };
            check(
                &served,
                (NUMBER[a].to_owned(), NUMBER[b].to_owned()),
                shapes,
            )
        },
    );
}
