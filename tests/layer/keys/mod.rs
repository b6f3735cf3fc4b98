//! Property tests of the key sources against axum's own extractors: for
//! generated requests, the lock key agrees with what the handler reads.
//!
//! Every test serves one route twice: under a lock layer whose handler
//! answers its lock key's id, and bare, with a handler that runs the real
//! extractor (`Path`, `Query`, `Json`, `HeaderMap`) and answers what it
//! read (its `Debug` text) or axum's rejection. Each request goes to both,
//! and each source's test checks:
//!
//! - the layer refuses what the extractor refuses, with its status, and
//!   keys what it reads;
//! - two requests the extractor reads as one value share one key, and two
//!   it reads as different values never do.
//!
//! Each test also counts what its cases covered and fails if the pairs
//! were never one value, never two, or (where it expects some) never
//! refused: a property that held only because nothing was tried is no
//! test.
//!
//! Requests are spelled from atoms: a character (or byte) with the ways a
//! request may write it (`a`, `%61`; `é` as `%C3%A9` or `%c3%a9`, and its
//! NFD form `e%CC%81` as another atom). A pair is either two independent
//! texts or one text spelled twice, so that both "one value" and "two
//! values" come up often.

mod extract;
mod header;
mod json;
mod path;
mod path_param;
mod query;

use std::cell::{Cell, RefCell};
use std::fmt::Debug;
use std::future::Future;

use axum::Router;
use axum::body::Body;
use axum::handler::Handler;
use axum::routing::post;
use http::Request;
use proptest::prelude::*;
use proptest::test_runner::{TestCaseError, TestRunner};
use tower::ServiceExt;
use tower_redis_lock::{KeyFrom, LockGuard, LockLayer, Locker, MemoryStore};

/// 256 cases a test (a few seconds at most); failures are not written to
/// the source tree.
fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

thread_local! {
    static RUNTIME: RefCell<Option<tokio::runtime::Runtime>> = const { RefCell::new(None) };
    static TALLY: Cell<Tally> = const { Cell::new(Tally { one: 0, two: 0, refused: 0 }) };
}

/// What a test's cases covered: pairs the handler read as one value, as
/// two, and requests the layer refused.
#[derive(Debug, Clone, Copy)]
struct Tally {
    one: u32,
    two: u32,
    refused: u32,
}

fn tally(f: impl FnOnce(&mut Tally)) {
    TALLY.with(|t| {
        let mut tally = t.get();
        f(&mut tally);
        t.set(tally);
    });
}

/// Runs `test` on the cases `strategy` makes; then checks that some pairs
/// were one value and some two, and (with `refusals`) that something was
/// refused. (Each comes up a dozen times or more in 256 cases; none at
/// all means the generator went wrong.)
fn check_all<S>(strategy: S, refusals: bool, test: impl Fn(S::Value) -> Result<(), TestCaseError>)
where
    S: Strategy,
    S::Value: Debug,
{
    TALLY.with(|t| {
        t.set(Tally {
            one: 0,
            two: 0,
            refused: 0,
        })
    });
    let mut runner = TestRunner::new(config());
    if let Err(e) = runner.run(&strategy, test) {
        panic!("{e}");
    }
    let t = TALLY.with(Cell::get);
    assert!(
        t.one > 0 && t.two > 0 && (t.refused > 0 || !refusals),
        "the cases did not cover both sides: {t:?}"
    );
}

/// Runs `f` on this test thread's runtime.
fn block_on<F: Future>(f: F) -> F::Output {
    RUNTIME.with(|rt| {
        let mut rt = rt.borrow_mut();
        let rt = rt.get_or_insert_with(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
        });
        rt.block_on(f)
    })
}

/// What one router answered: status and body.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    status: u16,
    body: String,
}

/// What the handler read and what the layer keyed, for one request.
#[derive(Debug, Clone)]
struct Outcome {
    read: Seen,
    key: Seen,
}

impl Outcome {
    fn both_ok(&self) -> bool {
        self.read.status == 200 && self.key.status == 200
    }
}

/// One route, served under the layer and bare.
struct Served {
    locked: Router,
    plain: Router,
}

impl Served {
    /// `route` under a layer keyed by `key` (its handler answers the lock
    /// key's id) and bare with `read` (the handler's extractor, answering
    /// what it read).
    fn new<H, T>(route: &str, key: KeyFrom, read: H) -> Self
    where
        H: Handler<T, ()>,
        T: 'static,
    {
        let layer = LockLayer::builder(Locker::new(MemoryStore::new()), key)
            .namespace("k")
            .build()
            .unwrap();
        let answer_key = |guard: LockGuard| async move { guard.key().id().to_owned() };
        Served {
            locked: Router::new().route(route, post(answer_key).route_layer(layer)),
            plain: Router::new().route(route, post(read)),
        }
    }

    /// The request `make` builds, sent to both.
    fn outcome(&self, make: impl Fn() -> Request<Body>) -> Outcome {
        block_on(async {
            Outcome {
                read: seen(&self.plain, make()).await,
                key: seen(&self.locked, make()).await,
            }
        })
    }
}

async fn seen(app: &Router, req: Request<Body>) -> Seen {
    let res = app.clone().oneshot(req).await.unwrap();
    let status = res.status().as_u16();
    let body = axum::body::to_bytes(res.into_body(), 1 << 16)
        .await
        .unwrap();
    Seen {
        status,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

/// The layer refuses what the extractor refuses, with its status, and
/// keys what it reads.
fn refuses_as_the_extractor(o: &Outcome) -> Result<(), TestCaseError> {
    prop_assert_eq!(o.key.status, o.read.status, "{:?}", o);
    if o.key.status != 200 {
        tally(|t| t.refused += 1);
    }
    Ok(())
}

/// One key exactly when the handler reads one value.
fn one_key_per_value(a: &Outcome, b: &Outcome) -> Result<(), TestCaseError> {
    if a.both_ok() && b.both_ok() {
        one_or_two(a.read.body == b.read.body);
        prop_assert_eq!(
            a.read.body == b.read.body,
            a.key.body == b.key.body,
            "read {:?} and {:?}, keyed {:?} and {:?}",
            a.read.body,
            b.read.body,
            a.key.body,
            b.key.body
        );
    }
    Ok(())
}

/// A number's characters in a path or query: digits (leading zeros and a
/// leading `+` read as one number), escaped or not; a `+` (a plus in a
/// path, a space in a query), and a letter, which no number reads.
const DIGITS: &[&[&str]] = &[
    &["0", "%30"],
    &["0"],
    &["7", "%37"],
    &["7"],
    &["1", "%31"],
    &["+", "%2B", "%2b"],
    &["x"],
];

/// Counts a pair the handler read as one value, or as two.
fn one_or_two(one: bool) {
    tally(|t| if one { t.one += 1 } else { t.two += 1 });
}

/// A text as a list of atoms, each with the index of its spelling.
type Spelled = Vec<(usize, usize)>;

/// Writes `spelled` with `atoms` (a spelling index wraps around).
fn write(atoms: &[&[&str]], spelled: &Spelled) -> String {
    spelled
        .iter()
        .map(|&(atom, spelling)| {
            let spellings = atoms[atom % atoms.len()];
            spellings[spelling % spellings.len()]
        })
        .collect()
}

/// One text of 1 to `max` atoms.
fn text(max: usize) -> impl Strategy<Value = Spelled> {
    proptest::collection::vec((0..64usize, 0..8usize), 1..=max)
}

/// Two texts: independent, or (half the time) one text spelled twice.
fn pair(max: usize) -> impl Strategy<Value = (Spelled, Spelled)> {
    (text(max), text(max), any::<bool>()).prop_map(|(a, b, respell)| {
        if !respell {
            return (a, b);
        }
        let b = a
            .iter()
            .enumerate()
            .map(|(i, &(atom, _))| (atom, b.get(i).map_or(i, |&(_, s)| s)))
            .collect();
        (a, b)
    })
}
