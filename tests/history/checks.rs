//! The history read back from the logs, and the checks on it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;

use crate::faults::{FaultCounts, Plan};
use crate::monitor::Accepted;
use crate::{KEYS, LEASE, LOST_SLACK, WORKER_TEST};

/// One parsed log line.
#[derive(Debug, Clone)]
pub struct Event {
    pub t: u64,
    pub kind: String,
    pub fields: BTreeMap<String, String>,
    /// `path:line: text`, for messages.
    pub origin: String,
}

impl Event {
    fn get(&self, name: &str) -> &str {
        self.fields.get(name).map(String::as_str).unwrap_or("")
    }

    fn num(&self, name: &str) -> u64 {
        self.get(name)
            .parse()
            .unwrap_or_else(|_| panic!("bad {name} in {}", self.origin))
    }
}

pub fn parse_log(path: &Path) -> Vec<Event> {
    let text = fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .enumerate()
        .filter_map(|(i, line)| {
            let mut parts = line.split(' ');
            let t = parts.next()?.parse().ok()?;
            let kind = parts.next()?.to_owned();
            let fields = parts
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect();
            Some(Event {
                t,
                kind,
                fields,
                origin: format!("{}:{}: {line}", path.display(), i + 1),
            })
        })
        .collect()
}

/// One grant as its holder saw it.
#[derive(Debug, Clone)]
pub struct GrantView {
    pub id: String,
    pub key: String,
    pub token: u64,
    /// Start of the winning attempt: the grant happened after this.
    pub attempt: u64,
    /// When the holder had the answer: the grant happened before this.
    pub granted: u64,
    /// Time of the last look at the guard that said "held".
    pub last_held: Option<u64>,
    /// The latest end of validity the guard claimed (`valid_for` added to
    /// the time of a look that said "held").
    pub claim_end: Option<u64>,
    /// When the holder gave the lock back (release or drop started).
    pub given_back: Option<u64>,
    /// When the guard's `lost()` resolved, if it did before the lock was
    /// given back.
    pub lost_at: Option<u64>,
    /// The worker that held it.
    pub worker: u32,
    /// How it was used (`Short`, `Long`, `Expire`).
    pub style: String,
    /// A read of a reader-writer lock (the others are exclusive).
    pub shared: bool,
    /// The events that matter for messages.
    pub grant_line: String,
    pub last_held_line: Option<String>,
}

impl GrantView {
    /// When this holder relied on the lock: from the moment it knew it had
    /// it to its last look that said held.
    fn reliance(&self) -> Option<(u64, u64)> {
        self.last_held.map(|end| (self.granted, end))
    }

    fn describe(&self) -> String {
        let mut s = format!("    {}\n", self.grant_line);
        if let Some(held) = &self.last_held_line {
            let _ = writeln!(s, "    {held}");
        }
        s
    }
}

#[derive(Debug, Default)]
pub struct History {
    pub grants: Vec<GrantView>,
    pub applied_by_workers: Vec<Event>,
    pub stale_by_workers: Vec<Event>,
    pub write_errors: usize,
    pub lost_observed: usize,
    pub acquire_failures: BTreeMap<String, usize>,
    pub worker_problems: Vec<String>,
    /// Per worker: killed, and the time of its last event.
    pub workers: HashMap<u32, (bool, u64)>,
    /// Times a worker's runtime did not run (worker, from, to).
    pub stalls: Vec<(u32, u64, u64)>,
}

pub fn build_history(finished: &[(u32, PathBuf, Option<ExitStatus>)]) -> History {
    let mut h = History::default();
    for (id, path, status) in finished {
        let events = parse_log(path);
        let started = events.iter().any(|e| e.kind == "START");
        let ended = events.iter().any(|e| e.kind == "END");
        match status {
            _ if !started => h.worker_problems.push(format!(
                "worker {id} never logged START (did `--exact {WORKER_TEST}` run?): {}",
                path.display()
            )),
            Some(status) if !status.success() || !ended => h.worker_problems.push(format!(
                "worker {id} exited with {status}, END logged: {ended}: {}",
                path.display()
            )),
            _ => {}
        }
        let last = events.last().map_or(0, |e| e.t);
        h.workers.insert(*id, (status.is_none(), last));
        let mut by_id: HashMap<String, GrantView> = HashMap::new();
        let mut order = Vec::new();
        for e in events {
            match e.kind.as_str() {
                "GRANT" => {
                    let g = GrantView {
                        id: e.get("grant").to_owned(),
                        key: e.get("key").to_owned(),
                        token: e.num("token"),
                        attempt: e.num("attempt"),
                        granted: e.t,
                        last_held: None,
                        claim_end: None,
                        given_back: None,
                        lost_at: None,
                        worker: *id,
                        style: e.get("style").to_owned(),
                        shared: e.get("shared") == "1",
                        grant_line: e.origin.clone(),
                        last_held_line: None,
                    };
                    order.push(g.id.clone());
                    by_id.insert(g.id.clone(), g);
                }
                "HELD" => {
                    let g = by_id
                        .get_mut(e.get("grant"))
                        .unwrap_or_else(|| panic!("HELD before GRANT: {}", e.origin));
                    g.last_held = Some(e.t);
                    g.last_held_line = Some(e.origin.clone());
                    let claim = e.t + e.num("valid_us") * 1_000;
                    g.claim_end = g.claim_end.max(Some(claim));
                }
                "NOTHELD" if e.get("lost") == "true" => h.lost_observed += 1,
                "STALL" => h.stalls.push((*id, e.num("from"), e.t)),
                "LOST" => {
                    let g = by_id
                        .get_mut(e.get("grant"))
                        .unwrap_or_else(|| panic!("LOST before GRANT: {}", e.origin));
                    g.lost_at.get_or_insert(e.t);
                }
                "RELEASING" | "DROP" => {
                    let g = by_id
                        .get_mut(e.get("grant"))
                        .unwrap_or_else(|| panic!("{} before GRANT: {}", e.kind, e.origin));
                    g.given_back.get_or_insert(e.t);
                }
                "WRITE" => {
                    let result = e.get("result");
                    if result == "applied" {
                        h.applied_by_workers.push(e);
                    } else if result.starts_with("stale:") {
                        h.stale_by_workers.push(e);
                    } else {
                        h.write_errors += 1;
                    }
                }
                "ACQFAIL" => {
                    *h.acquire_failures
                        .entry(e.get("why").to_owned())
                        .or_default() += 1
                }
                _ => {}
            }
        }
        h.grants
            .extend(order.into_iter().filter_map(|id| by_id.remove(&id)));
    }
    h
}

/// Check 1: no two holders relied on one key at the same time.
pub fn check_exclusion(h: &History, violations: &mut Vec<String>) {
    for key in keys() {
        let mut spans: Vec<(&GrantView, u64, u64)> = h
            .grants
            .iter()
            .filter(|g| g.key == key)
            .filter_map(|g| g.reliance().map(|(a, b)| (g, a, b)))
            .collect();
        spans.sort_by_key(|&(_, start, _)| start);
        let mut widest: Option<(&GrantView, u64)> = None;
        for &(g, start, end) in &spans {
            if let Some((prev, prev_end)) = widest
                && start < prev_end
            {
                violations.push(format!(
                    "exclusion: {key}: {} was granted {:.1} ms before {} last saw itself holding it\n{}{}",
                    g.id,
                    (prev_end - start) as f64 / 1e6,
                    prev.id,
                    prev.describe(),
                    g.describe()
                ));
            }
            if widest.is_none_or(|(_, e)| end > e) {
                widest = Some((g, end));
            }
        }
    }
}

/// Check 1 for a semaphore: never more than `permits` holders relied on
/// one key at the same time (from the moment each knew it had its permit
/// to its last look that said held).
pub fn check_at_most(h: &History, permits: usize, violations: &mut Vec<String>) {
    for key in keys() {
        // (time, +1 at a start / -1 at an end); an end sorts before a start
        // at the same instant.
        let mut edges: Vec<(u64, i32, &GrantView)> = Vec::new();
        for g in h.grants.iter().filter(|g| g.key == key) {
            if let Some((start, end)) = g.reliance() {
                edges.push((start, 1, g));
                edges.push((end, -1, g));
            }
        }
        edges.sort_by_key(|&(t, d, _)| (t, d));
        let mut holding: Vec<&GrantView> = Vec::new();
        for (t, d, g) in edges {
            if d < 0 {
                holding.retain(|h| h.id != g.id);
                continue;
            }
            holding.push(g);
            if holding.len() > permits {
                let who: String = holding.iter().map(|g| g.describe()).collect();
                violations.push(format!(
                    "at_most: {key}: {} holders of {permits} permits at {t} ns\n{who}",
                    holding.len()
                ));
            }
        }
    }
}

/// Check 1 for a reader-writer lock: no writer relied on a key while any
/// other holder, reader or writer, relied on it (each from the moment it
/// knew it held to its last look that said held).
pub fn check_writer_alone(h: &History, violations: &mut Vec<String>) {
    for key in keys() {
        let grants: Vec<(&GrantView, (u64, u64))> = h
            .grants
            .iter()
            .filter(|g| g.key == key)
            .filter_map(|g| g.reliance().map(|r| (g, r)))
            .collect();
        for (w, (ws, we)) in grants.iter().filter(|(g, _)| !g.shared) {
            for (o, (os, oe)) in &grants {
                if o.id != w.id && os < we && ws < oe {
                    violations.push(format!(
                        "writer_alone: {key}: writer {} and {} {} relied on it at once\n{}{}",
                        w.id,
                        if o.shared { "reader" } else { "writer" },
                        o.id,
                        w.describe(),
                        o.describe()
                    ));
                }
            }
        }
    }
}

/// The reads' tokens of a reader-writer lock: each at least the token of
/// every write granted before the read was asked for, and below the token
/// of every write asked for after the read was granted.
pub fn check_read_epochs(h: &History, violations: &mut Vec<String>) {
    for key in keys() {
        let of_key = || h.grants.iter().filter(|g| g.key == key);
        for r in of_key().filter(|g| g.shared) {
            for w in of_key().filter(|g| !g.shared) {
                let behind = w.granted < r.attempt && r.token < w.token;
                let ahead = r.granted < w.attempt && r.token >= w.token;
                if behind || ahead {
                    violations.push(format!(
                        "read_epochs: {key}: read {} (token {}) {} write {} (token {})\n{}{}",
                        r.id,
                        r.token,
                        if behind { "after" } else { "before" },
                        w.id,
                        w.token,
                        r.describe(),
                        w.describe()
                    ));
                }
            }
        }
    }
}

/// Check 1b: nobody got the lock while an earlier holder's guard still
/// promised it (`valid_for`) and that holder had not given it back. Only
/// grants known to come later count: asked for after the earlier holder had
/// its answer.
pub fn check_claims(h: &History, violations: &mut Vec<String>) {
    for a in &h.grants {
        let Some(claim) = a.claim_end else { continue };
        let until = a.given_back.map_or(claim, |g| g.min(claim));
        for b in &h.grants {
            if b.key == a.key && a.granted < b.attempt && b.granted < until {
                violations.push(format!(
                    "validity: {}: {} was granted {:.1} ms before the end of the validity {}'s guard \
                     had promised (and {} had not given it back)\n{}{}",
                    a.key,
                    b.id,
                    (until - b.granted) as f64 / 1e6,
                    a.id,
                    a.id,
                    a.describe(),
                    b.describe()
                ));
            }
        }
    }
}

/// What a holder of a key shuts out, for the `lost` check: the kind of
/// lock the history's workers took.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Excludes {
    /// The lock (one key's, or each key of a multi-key grant): every
    /// other holder.
    Lock,
    /// One of `n` permits: `n - 1` other holders may stay beside it.
    Permits(usize),
    /// A reader-writer lock: a write shuts out reads and writes, a read
    /// only writes.
    ReadWrite,
}

impl Excludes {
    /// Whether `b`'s grant of `a`'s key, answered after `a`'s, shows that
    /// `a` was no longer in the store when `b` was granted (unless `a` had
    /// been given back). The order of the two grants in the store comes
    /// from the tokens: the key's counter only rises, a lock's, a permit's
    /// and a write's grant mint a token above it, and a read answers it
    /// as it stands (raised to the server's TIME where behind). So a
    /// write's larger token means it came after whatever had the smaller
    /// one; a read's token at least a write's means it came after that
    /// write.
    fn one_shuts_out(self, a: &GrantView, b: &GrantView) -> bool {
        match self {
            Excludes::Lock => b.token > a.token,
            // (Permits: one grant says nothing of one other holder; see
            // `check_lost_permits`.)
            Excludes::Permits(_) => false,
            Excludes::ReadWrite => match (a.shared, b.shared) {
                (_, false) => b.token > a.token,
                (false, true) => b.token >= a.token,
                (true, true) => false,
            },
        }
    }
}

/// Whether `check_lost` judges a guard of worker `worker` at `at`: not if
/// the worker had been killed before then, or was stopped (SIGSTOP) or its
/// runtime did not run (`STALL`) at that moment: had the runtime run at
/// `at`, the deadline's timer (due earlier) would have fired by then.
fn judged(h: &History, pauses: &[(u32, u64, u64)], worker: u32, at: u64) -> bool {
    let (killed, last_event) = h.workers.get(&worker).copied().unwrap_or((false, 0));
    if killed && last_event < at {
        return false;
    }
    // (50 ms: the heartbeat's threshold.)
    let grace = 50_000_000;
    !pauses
        .iter()
        .chain(&h.stalls)
        .any(|&(w, p0, p1)| w == worker && p0 <= at && p1 + grace >= at)
}

/// Check 1c: every guard whose lock lapsed saw `lost()` by its deadline.
///
/// A lock lapsed when another grant of the key that it shuts out (see
/// [`Excludes::one_shuts_out`]: the lock's, or a reader-writer lock's
/// write after a read or either after a write) came after it in the store
/// and was answered after it, before this one gave it back: its lease in
/// the store had ended, and the guard's deadline comes before that (it is
/// counted from when the grant or renewal was sent, less a margin), so
/// `lost()` must have resolved by the other's grant (plus `LOST_SLACK`
/// for the worker's timer and log). A grant made in the store before this
/// one, whose answer was held up past its lease, arrives lost and says
/// nothing of this one. A guard taken with a hold cap of one lease
/// (`Expire`) lapses by `attempt + LEASE` (or when its answer came, if
/// later) whoever comes next. Permits: see [`check_lost_permits`].
/// Not judged: a worker stopped (SIGSTOP) or not running at that moment
/// plus the slack, or killed before it.
/// Returns how many bounds were judged, and the smallest margin seen (ms
/// by which `lost()` came before the bound; negative: after).
pub fn check_lost(
    h: &History,
    pauses: &[(u32, u64, u64)],
    excludes: Excludes,
    violations: &mut Vec<String>,
) -> (usize, Option<f64>) {
    let mut closest: Option<f64> = None;
    let mut judged_bounds = 0;
    let slack = LOST_SLACK.as_nanos() as u64;
    for a in &h.grants {
        // The earliest moment the lock had certainly lapsed, and why.
        let next = h
            .grants
            .iter()
            .filter(|b| b.key == a.key && b.granted > a.granted && excludes.one_shuts_out(a, b))
            .filter(|b| a.given_back.is_none_or(|g| g > b.granted))
            .min_by_key(|b| b.granted);
        // (A reader-writer lock's messages name the sides.)
        let side = |g: &GrantView| match (excludes, g.shared) {
            (Excludes::ReadWrite, true) => " (a read)",
            (Excludes::ReadWrite, false) => " (a write)",
            _ => "",
        };
        let mut bound = next.map(|b| {
            (
                b.granted,
                format!("{}{} was granted the key", b.id, side(b)),
            )
        });
        if a.style == "Expire" {
            // (Not before the holder had its answer: a grant answered
            // after its cap arrives lost.)
            let cap = (a.attempt + LEASE.as_nanos() as u64).max(a.granted);
            if a.given_back.is_none_or(|g| g > cap + slack)
                && bound.as_ref().is_none_or(|(t, _)| cap < *t)
            {
                bound = Some((cap, "its hold cap ended".to_owned()));
            }
        }
        let Some((by, why)) = bound else { continue };
        if !judged(h, pauses, a.worker, by + slack) {
            continue;
        }
        judged_bounds += 1;
        match a.lost_at {
            Some(l) => {
                let margin = (by as f64 - l as f64) / 1e6;
                closest = Some(closest.map_or(margin, |c: f64| c.min(margin)));
                if l > by + slack {
                    violations.push(format!(
                        "lost: {}: {}{}'s lost() resolved {:.1} ms after {why}\n{}",
                        a.key,
                        a.id,
                        side(a),
                        (l - by) as f64 / 1e6,
                        a.describe()
                    ));
                }
            }
            None => violations.push(format!(
                "lost: {}: {}{}'s lost() never resolved, yet {why} before it gave the lock back\n{}",
                a.key,
                a.id,
                side(a),
                a.describe()
            )),
        }
    }
    if let Excludes::Permits(n) = excludes {
        let (judged, permits) = check_lost_permits(h, pauses, n, violations);
        judged_bounds += judged;
        closest = match (closest, permits) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    (judged_bounds, closest)
}

/// Check 1c for permits. One more grant of a key says nothing of any one
/// holder of its `n` permits, but it says something of them together: a
/// grant `b` finds fewer than `n` permits in the store (expired ones
/// removed first), so of the holders whose grants came before it in the
/// store (a smaller token; answered before `b` was) and who had not given
/// their permit back when `b` was answered, all but `n - 1` at most had
/// lapsed, and each of those guards' deadline had passed. So at least
/// that many of them must have seen `lost()` by `b`'s answer (plus
/// `LOST_SLACK`). A holder not judged then (stopped, not running, killed)
/// is counted as one that may have lapsed unseen. It bounds how many
/// guards saw their loss, not which: a guard that called its permit lost
/// while the store still had it (a renewal whose answer never came) counts
/// for one that lapsed. The hold cap of `Expire` guards is judged by
/// [`check_lost`] per guard. Returns how many grants bounded others'
/// losses, and the smallest margin (ms) by which the last `lost()` needed
/// came before its bound.
fn check_lost_permits(
    h: &History,
    pauses: &[(u32, u64, u64)],
    n: usize,
    violations: &mut Vec<String>,
) -> (usize, Option<f64>) {
    let mut closest: Option<f64> = None;
    let mut bounds = 0;
    let slack = LOST_SLACK.as_nanos() as u64;
    for b in &h.grants {
        let before: Vec<&GrantView> = h
            .grants
            .iter()
            .filter(|a| a.key == b.key && a.id != b.id)
            .filter(|a| a.token < b.token && a.granted < b.granted)
            .filter(|a| a.given_back.is_none_or(|g| g > b.granted))
            .collect();
        if before.len() < n {
            continue;
        }
        let lapsed = before.len() + 1 - n;
        let at = b.granted + slack;
        bounds += 1;
        let unjudged = before
            .iter()
            .filter(|a| !judged(h, pauses, a.worker, at))
            .count();
        let mut seen: Vec<u64> = before
            .iter()
            .filter(|a| judged(h, pauses, a.worker, at))
            .filter_map(|a| a.lost_at.filter(|&l| l <= at))
            .collect();
        seen.sort_unstable();
        if seen.len() + unjudged < lapsed {
            let held: String = before.iter().map(|a| a.describe()).collect();
            violations.push(format!(
                "lost: {}: {} was granted while {} holders of {n} permits had not given theirs \
                 back, so at least {lapsed} had lapsed, yet only {} of them saw lost() by then \
                 ({unjudged} not judged)\n{}{held}",
                b.key,
                b.id,
                before.len(),
                seen.len(),
                b.describe()
            ));
        } else if unjudged == 0 {
            let margin = (b.granted as f64 - seen[lapsed - 1] as f64) / 1e6;
            closest = Some(closest.map_or(margin, |c: f64| c.min(margin)));
        }
    }
    (bounds, closest)
}

/// Check 2: fencing tokens strictly increase in grant order. Two grants are
/// ordered when one's answer arrived before the other's attempt started;
/// tokens of one key are never equal.
pub fn check_tokens(h: &History, violations: &mut Vec<String>) {
    for key in keys() {
        let grants: Vec<&GrantView> = h.grants.iter().filter(|g| g.key == key).collect();
        let mut seen: HashMap<u64, &GrantView> = HashMap::new();
        for g in &grants {
            if let Some(other) = seen.insert(g.token, g) {
                violations.push(format!(
                    "tokens: {key}: grants {} and {} share token {}\n{}{}",
                    other.id,
                    g.id,
                    g.token,
                    other.describe(),
                    g.describe()
                ));
            }
        }
        for a in &grants {
            for b in &grants {
                if a.granted < b.attempt && a.token >= b.token {
                    violations.push(format!(
                        "tokens: {key}: {} (token {}) was granted before {} was asked for, \
                         yet {} got token {}\n{}{}",
                        a.id,
                        a.token,
                        b.id,
                        b.id,
                        b.token,
                        a.describe(),
                        b.describe()
                    ));
                }
            }
        }
    }
}

/// Check 3: the resource never applied a token lower than one it had
/// applied before (equal only from the same grant); every applied write
/// carries the token of the grant that sent it; the workers' view agrees
/// with the resource's; the final state is the last applied write.
pub fn check_resource(
    h: &History,
    accepted: &[Accepted],
    finals: &BTreeMap<String, Option<(String, u64)>>,
    violations: &mut Vec<String>,
) {
    let grants: HashMap<&str, &GrantView> = h.grants.iter().map(|g| (g.id.as_str(), g)).collect();
    for key in keys() {
        let mut last: Option<&Accepted> = None;
        for a in accepted.iter().filter(|a| a.key == key) {
            let grant_id = a.value.split('/').next().unwrap_or("");
            match grants.get(grant_id) {
                Some(g) if g.key == key && g.token == a.token => {}
                Some(g) => violations.push(format!(
                    "resource: {key}: applied write #{} ({}) carries token {} but grant {} of {} has token {}\n{}",
                    a.seq,
                    a.value,
                    a.token,
                    g.id,
                    g.key,
                    g.token,
                    g.describe()
                )),
                None => violations.push(format!(
                    "resource: {key}: applied write #{} ({}) with token {} comes from no logged grant\n    {}",
                    a.seq, a.value, a.token, a.line
                )),
            }
            if let Some(prev) = last {
                let same_grant = prev.value.split('/').next() == Some(grant_id);
                if a.token < prev.token || (a.token == prev.token && !same_grant) {
                    violations.push(format!(
                        "resource: {key}: applied token {} ({}) after token {} ({})\n    {}\n    {}",
                        a.token, a.value, prev.token, prev.value, prev.line, a.line
                    ));
                }
            }
            last = Some(a);
        }
        let expected = last.map(|a| (a.value.clone(), a.token));
        let actual = finals.get(&key).cloned().flatten();
        if actual != expected {
            violations.push(format!(
                "resource: {key}: final state {actual:?}, but the last applied write was {expected:?}"
            ));
        }
    }
    let applied: HashSet<&str> = accepted.iter().map(|a| a.value.as_str()).collect();
    for e in &h.applied_by_workers {
        if !applied.contains(e.get("value")) {
            violations.push(format!(
                "resource: a worker was told its write was applied, the resource never applied it\n    {}",
                e.origin
            ));
        }
    }
    for e in &h.stale_by_workers {
        if applied.contains(e.get("value")) {
            violations.push(format!(
                "resource: a worker was told its write was stale, the resource applied it\n    {}",
                e.origin
            ));
        }
    }
}

/// Check 4: the run did something, and the faults happened.
pub fn check_progress(
    h: &History,
    accepted: &[Accepted],
    (min_grants, min_writes): (usize, usize),
    plan: &Plan,
    faults: &FaultCounts,
    violations: &mut Vec<String>,
) {
    for key in keys() {
        let grants = h.grants.iter().filter(|g| g.key == key).count();
        let writes = accepted.iter().filter(|a| a.key == key).count();
        if grants < min_grants || writes < min_writes {
            violations.push(format!(
                "progress: {key}: {grants} grants (need {min_grants}), \
                 {writes} applied writes (need {min_writes})"
            ));
        }
    }
    if plan.first.iter().any(|f| faults.of(*f) == 0) {
        violations.push(format!(
            "faults: a kind of fault never happened: {faults:?}"
        ));
    }
    violations.extend(h.worker_problems.iter().cloned());
}

/// Information only: pairs the brief's stricter reading would flag (the
/// next grant's *attempt start* before the previous holder's last "held"),
/// which a request queued at a frozen Redis produces without any real
/// overlap.
pub fn attempt_overlaps(h: &History) -> Vec<String> {
    let mut found = Vec::new();
    for a in &h.grants {
        for b in &h.grants {
            if let (Some((_, a_end)), true) = (a.reliance(), a.key == b.key && a.id != b.id)
                && b.attempt < a_end
                && b.granted > a.granted
            {
                found.push(format!(
                    "{} asked {:.1} ms before {} last saw itself holding, and was answered {:.1} ms after\n{}{}",
                    b.id,
                    (a_end - b.attempt) as f64 / 1e6,
                    a.id,
                    (b.granted as f64 - a_end as f64) / 1e6,
                    a.describe(),
                    b.describe()
                ));
            }
        }
    }
    found
}

pub fn keys() -> impl Iterator<Item = String> {
    (0..KEYS).map(|k| format!("k{k}"))
}

/// Check 1 for multi-key grants (`Locker::acquire_all`): a multi-key
/// holder never overlaps any holder of any of its keys, single or
/// multi-key. A multi-key grant is logged as one view per key, with ids
/// `<grant>.<key>`; each view must not overlap (from the moment its holder
/// knew it had every key to its last look that said held) any other
/// grant's view of the same key. Also: every multi-key grant was granted
/// at least two keys, each once, all at the same moment.
pub fn check_multi(h: &History, violations: &mut Vec<String>) {
    let mut groups: BTreeMap<&str, Vec<&GrantView>> = BTreeMap::new();
    for g in &h.grants {
        if let Some((grant, _)) = g.id.split_once('.') {
            groups.entry(grant).or_default().push(g);
        }
    }
    for (grant, views) in &groups {
        let keys: HashSet<&str> = views.iter().map(|v| v.key.as_str()).collect();
        if views.len() < 2
            || keys.len() != views.len()
            || views.iter().any(|v| v.granted != views[0].granted)
        {
            let all: String = views.iter().map(|v| v.describe()).collect();
            violations.push(format!(
                "multi: {grant} was not granted its keys at once, each once\n{all}"
            ));
        }
        for v in views {
            let Some((start, end)) = v.reliance() else {
                continue;
            };
            for other in h
                .grants
                .iter()
                .filter(|o| o.key == v.key && !o.id.starts_with(&format!("{grant}.")))
            {
                let Some((o_start, o_end)) = other.reliance() else {
                    continue;
                };
                if start < o_end && o_start < end {
                    violations.push(format!(
                        "multi: {}: multi-key holder {grant} and {} relied on it at once\n{}{}",
                        v.key,
                        other.id,
                        v.describe(),
                        other.describe()
                    ));
                }
            }
        }
    }
}
