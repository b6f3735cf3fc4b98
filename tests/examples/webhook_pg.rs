//! The contract of `examples/webhook_pg/`: an event's effect counts once
//! although the handler's process is SIGKILLed between the effect and the
//! answer, and a former holder paused past its lease is refused by the
//! fencing token when it writes late.
//!
//! The example is compiled into this test (`#[path]` below) and run as
//! child processes: this test binary re-executed with [`CHILD_ENV`] set
//! runs the example's `main` (so a process of the example can be killed
//! and the test go on). Each test starts its own PostgreSQL
//! ([`support::postgres::PgServer`]) and `redis-server`; the assertions
//! read the database: ledger entries per event, marks, fence rows.
//!
//! A delivery is stopped at a chosen point by the example's
//! `WEBHOOK_PG_STOP_AT` hook (the process SIGSTOPs itself there); the test
//! waits until the kernel reports the process stopped, then kills it or
//! lets it go on. The points of the crash test are a seeded random choice;
//! the seed is printed, and `WEBHOOK_PG_SEED=<seed>` replays a run.

use crate::support;

#[allow(dead_code)]
#[path = "../../examples/webhook_pg/main.rs"]
mod webhook_pg;

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::Duration;

use support::postgres::PgServer;
use support::{
    RedisServer, kill_and_reap, process_state, send_signal, spawn_dying_with_test, wait_until,
    wait_until_every,
};
use tempfile::TempDir;

/// Set in a re-executed test binary: run the example instead of the test.
const CHILD_ENV: &str = "WEBHOOK_PG_TEST_CHILD";
/// Upper bound on every wait for a condition; reached only when a test fails.
const LIMIT: Duration = Duration::from_secs(30);
/// Poll interval of redeliveries while a dead holder's lease runs out.
const RETRY_PAUSE: Duration = Duration::from_millis(20);
/// The children's lock lease: a killed or frozen holder's lock expires
/// after this, so redeliveries get through.
const LEASE_MS: &str = "1000";
const SECRET: &str = "whsec_test";

/// In a child: runs the example until it is killed; never returns.
fn run_child_if_asked() {
    if std::env::var_os(CHILD_ENV).is_some() {
        // The example only returns on a failure or Ctrl-C; its exit code
        // goes on (ExitCode has no accessor, but compares).
        let code = webhook_pg::main();
        let code = [0, 1, 2]
            .into_iter()
            .find(|&c| code == std::process::ExitCode::from(c))
            .unwrap_or(3);
        std::process::exit(code.into());
    }
}

// ---------------------------------------------------------------------------
// One process of the example
// ---------------------------------------------------------------------------

/// A running process of the example, SIGKILLed and reaped on drop.
struct Example {
    child: Child,
    addr: SocketAddr,
    out: PathBuf,
}

impl Example {
    /// Re-executes this test binary as the example (test `test`, which must
    /// call [`run_child_if_asked`] first), and waits until it listens.
    fn start(
        test: &str,
        dir: &Path,
        name: &str,
        pg: &PgServer,
        redis: &RedisServer,
        stop_at: Option<&str>,
    ) -> Example {
        let out = dir.join(format!("{name}.out"));
        let file = File::create(&out).unwrap();
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        let test = support::harness_name(module_path!(), test);
        cmd.args(["--exact", &test, "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, "1")
            .env("DATABASE_URL", pg.conn_string())
            .env("REDIS_URL", redis.url())
            .env("PORT", "0")
            .env("WEBHOOK_SECRET", SECRET)
            .env("LEASE_MS", LEASE_MS)
            .env("RUST_LOG", "info,tokio_postgres=warn")
            .env("WEBHOOK_PG_STOP_AT", stop_at.unwrap_or(""))
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file);
        let mut child = spawn_dying_with_test(cmd).expect("cannot re-execute the test binary");
        let mut addr = None;
        let listening = wait_until(LIMIT, || {
            let text = fs::read_to_string(&out).unwrap_or_default();
            addr = text
                .lines()
                .find_map(|l| l.split("listening on http://").nth(1))
                .and_then(|a| a.trim().parse().ok());
            addr.is_some() || !matches!(child.try_wait(), Ok(None))
        });
        let Some(addr) = addr.filter(|_| listening) else {
            kill_and_reap(&mut child);
            panic!(
                "example {name} did not start listening:\n{}",
                fs::read_to_string(&out).unwrap_or_default()
            );
        };
        Example { child, addr, out }
    }

    /// Waits until the process has stopped itself at its stop point.
    fn wait_stopped(&self) {
        let pid = self.child.id();
        assert!(
            wait_until(LIMIT, || process_state(pid) == Some('T')),
            "example {pid} did not reach its stop point:\n{}",
            self.output()
        );
    }

    /// SIGKILL, straight into the stopped process (no SIGCONT first, which
    /// would let it run past its stop point), and reap.
    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGCONT: a stopped process goes on.
    fn resume(&self) {
        send_signal(self.child.id(), libc::SIGCONT);
    }

    fn output(&self) -> String {
        fs::read_to_string(&self.out).unwrap_or_default()
    }
}

impl Drop for Example {
    fn drop(&mut self) {
        kill_and_reap(&mut self.child);
    }
}

// ---------------------------------------------------------------------------
// HTTP over a plain TCP connection
// ---------------------------------------------------------------------------

/// An answer: status, headers (lower-case names), body.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {self:?}"))
    }

    fn token(&self) -> i64 {
        self.header("fencing-token")
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("no Fencing-Token: {self:?}"))
    }
}

/// A signed charge event.
fn event(id: &str, customer: &str, amount: i64) -> String {
    serde_json::json!({
        "id": id,
        "type": "charge.succeeded",
        "data": { "object": { "customer": customer, "amount": amount } }
    })
    .to_string()
}

/// POSTs `body` to the Stripe route, signed; `Err` if the connection ends
/// without a whole answer (the process died).
fn deliver(addr: SocketAddr, body: &str) -> Result<Answer, String> {
    let sig = webhook_pg::sign(SECRET, webhook_pg::unix_now(), body.as_bytes());
    let mut stream = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    stream.set_read_timeout(Some(LIMIT)).unwrap();
    let request = format!(
        "POST /webhooks/stripe HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nStripe-Signature: {sig}\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream
        .write_all(request.as_bytes())
        .map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no whole answer: {text:?}"))?;
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status line: {text:?}"))?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Ok(Answer {
        status,
        headers,
        body: body.to_owned(),
    })
}

/// Delivers `body` again and again (a sender retrying) while it gets `409`
/// (the lock of a dead or frozen holder has not expired yet), until
/// another answer comes; panics on a `409` past [`LIMIT`].
fn redeliver(example: &Example, body: &str) -> Answer {
    let mut last = None;
    let done = wait_until_every(LIMIT, RETRY_PAUSE, || {
        let answer =
            deliver(example.addr, body).unwrap_or_else(|e| panic!("{e}\n{}", example.output()));
        let conflict = answer.status == 409;
        last = Some(answer);
        !conflict
    });
    let last = last.unwrap();
    assert!(done, "still 409 after {LIMIT:?}: {last:?}");
    last
}

// ---------------------------------------------------------------------------
// The database as the test reads it
// ---------------------------------------------------------------------------

/// What the database holds: ledger entries per event, marked events, fence
/// tokens per event, balances per customer.
#[derive(Debug, Default)]
struct Rows {
    entries: BTreeMap<String, i64>,
    marks: BTreeMap<String, i64>,
    fences: BTreeMap<String, i64>,
    balances: BTreeMap<String, i64>,
}

fn rows(pg: &PgServer) -> Rows {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (client, conn) = tokio_postgres::connect(&pg.conn_string(), tokio_postgres::NoTls)
            .await
            .unwrap_or_else(|e| panic!("cannot connect: {e}\n{}", pg.log_tail()));
        tokio::spawn(conn);
        let pairs = async |sql: &str| -> BTreeMap<String, i64> {
            let rows = client.query(sql, &[]).await.unwrap();
            rows.iter().map(|r| (r.get(0), r.get(1))).collect()
        };
        Rows {
            entries: pairs("SELECT event_id, count(*) FROM ledger_entries GROUP BY event_id").await,
            marks: pairs("SELECT event_id, fencing_token FROM processed_events").await,
            fences: pairs("SELECT event_id, fencing_token FROM webhook_fences").await,
            balances: pairs("SELECT customer, balance FROM balances").await,
        }
    })
}

/// A seed from `WEBHOOK_PG_SEED`, else from the clock; printed.
fn seed() -> u64 {
    let seed = std::env::var("WEBHOOK_PG_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!("seed {seed} (replay with WEBHOOK_PG_SEED={seed})");
    seed
}

// ---------------------------------------------------------------------------
// The tests
// ---------------------------------------------------------------------------

/// Every stop point once, in a seeded random order, then three more picked
/// at random: at each, the handler's process is SIGKILLed with its delivery
/// there, and the event is redelivered to another process until it is
/// answered. Each event is applied exactly once; a kill after the commit
/// is answered "already processed" from the mark.
#[test]
fn a_delivery_killed_anywhere_between_effect_and_answer_counts_once() {
    const TEST: &str = "a_delivery_killed_anywhere_between_effect_and_answer_counts_once";
    run_child_if_asked();
    let mut rng = fastrand::Rng::with_seed(seed());
    let mut points = webhook_pg::STOP_POINTS.to_vec();
    rng.shuffle(&mut points);
    for _ in 0..3 {
        points.push(webhook_pg::STOP_POINTS[rng.usize(..webhook_pg::STOP_POINTS.len())]);
    }
    let dir = TempDir::new().unwrap();
    let pg = PgServer::start();
    let redis = RedisServer::start();
    let steady = Example::start(TEST, dir.path(), "steady", &pg, &redis, None);
    let mut expected_balance = 0;
    for (round, point) in points.iter().enumerate() {
        let id = format!("evt_{round}_{point}");
        let amount = 100 + round as i64;
        expected_balance += amount;
        let body = event(&id, "cus_1", amount);
        let victim = Example::start(TEST, dir.path(), &id, &pg, &redis, Some(point));
        let addr = victim.addr;
        let sent = {
            let body = body.clone();
            thread::spawn(move || deliver(addr, &body))
        };
        victim.wait_stopped();
        victim.kill();
        let first = sent.join().unwrap();
        assert!(
            first.is_err(),
            "{point}: the killed delivery answered: {first:?}"
        );

        let answer = redeliver(&steady, &body);
        assert_eq!(answer.status, 200, "{point}: {answer:?}");
        let applied_before = *point == "committed";
        assert_eq!(
            answer.json()["applied"],
            !applied_before,
            "{point}: redelivery {answer:?}"
        );
        // The answer is now stored: the next duplicate is replayed.
        let again = deliver(steady.addr, &body).unwrap();
        assert_eq!(again.status, 200, "{point}: {again:?}");
        assert_eq!(again.header("idempotent-replayed"), Some("true"));

        let rows = rows(&pg);
        assert_eq!(
            rows.entries.get(&id),
            Some(&1),
            "{point}: event {id} applied {:?} times",
            rows.entries.get(&id)
        );
        assert!(rows.marks.contains_key(&id), "{point}: no mark for {id}");
    }
    let rows = rows(&pg);
    assert_eq!(rows.entries.len(), points.len(), "{rows:?}");
    assert!(rows.entries.values().all(|&n| n == 1), "{rows:?}");
    assert_eq!(rows.balances.get("cus_1"), Some(&expected_balance));
}

/// A holder frozen (SIGSTOP) after it took the lock, past its lease; the
/// event is delivered to another process, which applies it under a newer
/// token. Thawed, the former holder writes late: the fence refuses it
/// (409), and it writes nothing.
#[test]
fn a_paused_former_holder_writing_late_is_refused_by_the_token() {
    const TEST: &str = "a_paused_former_holder_writing_late_is_refused_by_the_token";
    run_child_if_asked();
    let dir = TempDir::new().unwrap();
    let pg = PgServer::start();
    let redis = RedisServer::start();
    let paused = Example::start(TEST, dir.path(), "paused", &pg, &redis, Some("locked"));
    let other = Example::start(TEST, dir.path(), "other", &pg, &redis, None);
    let body = event("evt_late", "cus_late", 700);
    let addr = paused.addr;
    let late = {
        let body = body.clone();
        thread::spawn(move || deliver(addr, &body))
    };
    paused.wait_stopped();

    let answer = redeliver(&other, &body);
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.json()["applied"], true, "{answer:?}");
    let newer = answer.token();

    paused.resume();
    let late = late
        .join()
        .unwrap()
        .unwrap_or_else(|e| panic!("the late holder did not answer: {e}\n{}", paused.output()));
    assert_eq!(late.status, 409, "{late:?}\n{}", paused.output());
    let older = late.token();
    assert!(older < newer, "late token {older}, newer {newer}");
    assert!(
        paused
            .output()
            .contains("stale delivery refused by the fencing token"),
        "{}",
        paused.output()
    );

    let rows = rows(&pg);
    assert_eq!(rows.entries.get("evt_late"), Some(&1), "{rows:?}");
    assert_eq!(rows.balances.get("cus_late"), Some(&700), "{rows:?}");
    assert_eq!(rows.fences.get("evt_late"), Some(&newer), "{rows:?}");
    assert_eq!(rows.marks.get("evt_late"), Some(&newer), "{rows:?}");
}

/// A missing `DATABASE_URL` and bad values are refused before anything
/// starts: the variable is named, the exit code is 2.
#[test]
fn bad_settings_name_their_variable_and_exit_with_2() {
    const TEST: &str = "bad_settings_name_their_variable_and_exit_with_2";
    run_child_if_asked();
    let dir = TempDir::new().unwrap();
    let cases: [(&str, &[(&str, &str)]); 4] = [
        ("DATABASE_URL", &[]),
        ("WEBHOOK_PG_STOP_AT", &[("WEBHOOK_PG_STOP_AT", "nowhere")]),
        ("LEASE_MS", &[("LEASE_MS", "soon")]),
        ("PORT", &[("PORT", "99999")]),
    ];
    for (i, (variable, env)) in cases.into_iter().enumerate() {
        let out = dir.path().join(format!("{i}.out"));
        let file = File::create(&out).unwrap();
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        let test = support::harness_name(module_path!(), TEST);
        cmd.args(["--exact", &test, "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, "1")
            .env_remove("DATABASE_URL")
            .env_remove("REDIS_URL")
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file);
        if variable != "DATABASE_URL" {
            cmd.env("DATABASE_URL", "host=/nonexistent");
        }
        cmd.envs(env.iter().copied());
        let mut child = spawn_dying_with_test(cmd).unwrap();
        let mut status = None;
        let exited = wait_until(LIMIT, || {
            status = child.try_wait().unwrap();
            status.is_some()
        });
        if !exited {
            kill_and_reap(&mut child);
        }
        let text = fs::read_to_string(&out).unwrap_or_default();
        assert_eq!(status.and_then(|s| s.code()), Some(2), "{variable}: {text}");
        assert!(
            text.contains(&format!("webhook_pg: {variable}")),
            "{variable}: {text}"
        );
    }
}
