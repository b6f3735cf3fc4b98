//! The resource's own record of applied writes, from `MONITOR`.

use std::io::{BufRead, BufReader, Write as _};
use std::net::TcpStream;
use std::thread;
use std::time::Duration;

use crate::support::RedisServer;

/// Marker command sent to the resource server once every worker is gone.
pub const MONITOR_END: &str = "history-monitor-end";

/// One write the resource applied, in the order the resource applied them:
/// every `HSET` of a resource key `MONITOR` saw (the one the compare-and-set
/// script runs, or any other).
#[derive(Debug, Clone)]
pub struct Accepted {
    pub seq: usize,
    pub key: String,
    pub value: String,
    pub token: u64,
    pub line: String,
}

/// Starts `MONITOR` on `server` and returns the thread collecting the
/// applied fenced writes until the end marker.
pub fn monitor(server: &RedisServer) -> thread::JoinHandle<Result<Vec<Accepted>, String>> {
    let mut stream = TcpStream::connect(server.addr()).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    stream.write_all(b"MONITOR\r\n").unwrap();
    let mut reader = BufReader::new(stream);
    let mut ok = String::new();
    reader.read_line(&mut ok).unwrap();
    assert_eq!(ok.trim_end(), "+OK", "MONITOR answered {ok:?}");
    thread::spawn(move || {
        let mut accepted = Vec::new();
        let mut line = String::new();
        loop {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) => return Err("MONITOR connection closed before the end marker".into()),
                Ok(_) => {}
                Err(e) => return Err(format!("MONITOR read failed: {e}")),
            }
            let args = monitor_args(&line);
            let Some(cmd) = args.first() else { continue };
            if cmd.eq_ignore_ascii_case("echo")
                && args.get(1).map(String::as_str) == Some(MONITOR_END)
            {
                return Ok(accepted);
            }
            // Every change of a resource, whoever sends it (the fenced
            // script's HSET, or anything writing around it).
            if !cmd.eq_ignore_ascii_case("hset")
                || !args.get(1).is_some_and(|k| k.starts_with("res:"))
            {
                continue;
            }
            // HSET <key> value <v> fencing_token <t>
            let field = |name: &str| {
                args.iter()
                    .position(|a| a == name)
                    .and_then(|i| args.get(i + 1))
                    .cloned()
            };
            let (Some(key), Some(value), Some(token)) = (
                args.get(1).cloned(),
                field("value"),
                field("fencing_token").and_then(|t| t.parse().ok()),
            ) else {
                return Err(format!("unexpected HSET in MONITOR: {line}"));
            };
            accepted.push(Accepted {
                seq: accepted.len(),
                key: key.trim_start_matches("res:").to_owned(),
                value,
                token,
                line: line.trim_end().to_owned(),
            });
        }
    })
}

/// The quoted arguments of a MONITOR line
/// (`+1700000000.1 [0 lua] "HSET" "k" ...`).
pub fn monitor_args(line: &str) -> Vec<String> {
    let mut args = Vec::new();
    let Some(start) = line.find("] ") else {
        return args;
    };
    let mut chars = line[start + 2..].chars();
    while let Some(c) = chars.next() {
        if c != '"' {
            continue;
        }
        let mut arg = String::new();
        while let Some(c) = chars.next() {
            match c {
                '"' => break,
                '\\' => {
                    if let Some(next) = chars.next() {
                        arg.push(next);
                    }
                }
                c => arg.push(c),
            }
        }
        args.push(arg);
    }
    args
}
