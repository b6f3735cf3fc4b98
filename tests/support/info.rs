//! What a [`RedisServer`] reports about itself: `INFO commandstats`,
//! clients, memory, its keys; and the parsers of INFO texts.

use std::collections::BTreeMap;

use super::RedisServer;
use super::resp::Reply;

impl RedisServer {
    /// Total calls of one command according to `INFO commandstats` (case-insensitive,
    /// e.g. `"evalsha"`, `"set"`, `"publish"`); 0 if absent. A name without `|` also counts
    /// its subcommands (`"config"` includes `config|resetstat`, ...).
    pub fn command_calls(&self, command: &str) -> u64 {
        let command = command.to_ascii_lowercase();
        self.command_stats()
            .iter()
            .filter(|(name, _)| {
                **name == command
                    || (!command.contains('|')
                        && name
                            .strip_prefix(command.as_str())
                            .is_some_and(|rest| rest.starts_with('|')))
            })
            .map(|(_, calls)| calls)
            .sum()
    }

    /// All of `INFO commandstats` as command name -> calls
    /// (Redis 7 subcommands appear as e.g. `config|resetstat`).
    pub fn command_stats(&self) -> BTreeMap<String, u64> {
        self.command_times()
            .into_iter()
            .map(|(name, (calls, _))| (name, calls))
            .collect()
    }

    /// All of `INFO commandstats` as command name -> (calls, µs spent in
    /// the command inside Redis).
    pub fn command_times(&self) -> BTreeMap<String, (u64, u64)> {
        parse_command_stats(&self.info("commandstats"))
    }

    /// The error answers the server gave with the code `code` (`INFO
    /// errorstats`, `errorstat_<code>:count=N`; e.g. `"NOSCRIPT"`); 0 if
    /// none.
    pub fn error_count(&self, code: &str) -> u64 {
        let info = self.info("errorstats");
        info_field(&info, &format!("errorstat_{code}"))
            .and_then(|fields| fields.strip_prefix("count="))
            .and_then(|n| n.split(',').next()?.parse().ok())
            .unwrap_or(0)
    }

    /// `CONFIG RESETSTAT` (clears commandstats, among others).
    pub fn reset_stats(&self) {
        self.expect_ok(&["CONFIG", "RESETSTAT"]);
    }

    /// All keys (`KEYS *`; test servers are small), sorted.
    pub fn keys(&self) -> Vec<String> {
        let reply = self.cmd(&["KEYS", "*"]);
        let Reply::Array(Some(items)) = &reply else {
            panic!(
                "redis-server on port {}: KEYS * answered {reply:?}",
                self.port()
            );
        };
        let mut keys: Vec<String> = items
            .iter()
            .map(|item| match item {
                Reply::Bulk(Some(bytes)) => String::from_utf8_lossy(bytes).into_owned(),
                other => panic!(
                    "redis-server on port {}: KEYS * item {other:?}",
                    self.port()
                ),
            })
            .collect();
        keys.sort();
        keys
    }

    /// The keys other than fencing counters (`…:fence`, which outlive the
    /// locks by design): what a flood of released locks must not leave.
    pub fn keys_besides_counters(&self) -> Vec<String> {
        let mut keys = self.keys();
        keys.retain(|k| !k.ends_with(":fence"));
        keys
    }

    /// Number of keys (`DBSIZE`).
    pub fn dbsize(&self) -> u64 {
        let reply = self.cmd(&["DBSIZE"]);
        reply
            .as_int()
            .and_then(|n| u64::try_from(n).ok())
            .unwrap_or_else(|| {
                panic!(
                    "redis-server on port {}: DBSIZE answered {reply:?}",
                    self.port()
                )
            })
    }

    /// Connected clients (`INFO clients` / `connected_clients`), not counting the
    /// connection used to ask.
    pub fn connected_clients(&self) -> u64 {
        let info = self.info("clients");
        let clients = info_field(&info, "connected_clients")
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or_else(|| {
                panic!(
                    "redis-server on port {}: no connected_clients in INFO clients",
                    self.port()
                )
            });
        clients.saturating_sub(1)
    }

    /// Whether [`connected_clients`](RedisServer::connected_clients) comes to
    /// `n` within 5 s. Waited on, not read once: the connection of a
    /// previous call, just closed by the test, may still be counted while
    /// the server closes it.
    pub async fn clients_come_to(&self, n: u64) -> bool {
        super::eventually(std::time::Duration::from_secs(5), async || {
            self.connected_clients() == n
        })
        .await
    }

    /// `used_memory` of `INFO memory`, in bytes.
    pub fn used_memory(&self) -> u64 {
        let info = self.info("memory");
        info_field(&info, "used_memory")
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no used_memory in INFO memory: {info}"))
    }

    /// `INFO <section>` as text; panics on anything else.
    fn info(&self, section: &str) -> String {
        let reply = self.cmd(&["INFO", section]);
        reply.as_string().unwrap_or_else(|| {
            panic!(
                "redis-server on port {}: INFO {section} answered {reply:?}",
                self.port()
            )
        })
    }

    /// Run a command that must answer `+OK`.
    fn expect_ok(&self, args: &[&str]) {
        let reply = self.cmd(args);
        if reply != Reply::Simple("OK".into()) {
            panic!(
                "redis-server on port {}: {args:?} answered {reply:?}",
                self.port()
            );
        }
    }
}

/// An `INFO commandstats` text as command name -> (calls, µs spent in the
/// command inside Redis); a missing field counts as 0.
pub fn parse_command_stats(info: &str) -> BTreeMap<String, (u64, u64)> {
    info.lines()
        .filter_map(|line| {
            let (name, fields) = line.trim().strip_prefix("cmdstat_")?.split_once(':')?;
            let field = |f: &str| {
                fields
                    .split(',')
                    .find_map(|kv| kv.strip_prefix(f)?.strip_prefix('='))
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            Some((name.to_owned(), (field("calls"), field("usec"))))
        })
        .collect()
}

/// The value of `field` in an INFO text (`field:value` lines).
pub(super) fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        (name == field).then(|| value.trim())
    })
}
