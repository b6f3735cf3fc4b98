//! The two signature schemes: Stripe's (`t=<unix secs>,v1=<hex HMAC of
//! "<t>.<body>">`) and GitHub's (`sha256=<hex HMAC of the body>`), signing
//! and checking in constant time.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// The `Stripe-Signature` header value for `body` signed at `t` (unix
/// seconds) with `secret`: `t=<t>,v1=<hex HMAC-SHA256 of "<t>.<body>">`.
pub fn sign(secret: &str, t: u64, body: &[u8]) -> String {
    let mut mac = mac(secret);
    mac.update(format!("{t}.").as_bytes());
    mac.update(body);
    format!("t={t},v1={}", hex::encode(mac.finalize().into_bytes()))
}

/// The `X-Hub-Signature-256` header value for `body`: `sha256=<hex HMAC>`.
pub fn sign_github(secret: &str, body: &[u8]) -> String {
    let mut mac = mac(secret);
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

fn mac(secret: &str) -> HmacSha256 {
    // HMAC takes keys of any length; this never fails.
    <HmacSha256 as KeyInit>::new_from_slice(secret.as_bytes())
        .unwrap_or_else(|_| unreachable!("HMAC accepts keys of any length"))
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Checks a `Stripe-Signature` header against `body`: the timestamp within
/// `tolerance` of `now`, and one of the `v1` signatures (there are several
/// while a secret is rolled) the HMAC of `"<t>.<body>"`, compared in
/// constant time.
pub fn verify_stripe(
    secret: &str,
    header: &str,
    body: &[u8],
    now: u64,
    tolerance: Duration,
) -> Result<(), &'static str> {
    let mut t = None;
    let mut candidates = Vec::new();
    for part in header.split(',') {
        match part.trim().split_once('=') {
            Some(("t", v)) if t.is_none() => t = Some(v),
            Some(("t", _)) => return Err("the signature header has more than one timestamp"),
            Some(("v1", v)) => candidates.push(v),
            _ => {}
        }
    }
    let t = t.ok_or("the signature header has no timestamp `t=`")?;
    let ts: u64 = t
        .parse()
        .map_err(|_| "the signature timestamp is not a whole number of seconds")?;
    if candidates.is_empty() {
        return Err("the signature header has no `v1=` signature");
    }
    let mut expected = mac(secret);
    expected.update(t.as_bytes());
    expected.update(b".");
    expected.update(body);
    let matches = candidates
        .iter()
        .any(|c| hex::decode(c).is_ok_and(|sig| expected.clone().verify_slice(&sig).is_ok()));
    if !matches {
        return Err("no `v1` signature matches the body");
    }
    if now.abs_diff(ts) > tolerance.as_secs() {
        return Err("the signature timestamp is outside the tolerance");
    }
    Ok(())
}

/// Checks an `X-Hub-Signature-256` header against `body`, in constant time.
pub fn verify_github(secret: &str, header: &str, body: &[u8]) -> Result<(), &'static str> {
    let hex_sig = header
        .trim()
        .strip_prefix("sha256=")
        .ok_or("the signature is not of the form `sha256=<hex>`")?;
    let sig = hex::decode(hex_sig).map_err(|_| "the signature is not hex")?;
    let mut expected = mac(secret);
    expected.update(body);
    expected
        .verify_slice(&sig)
        .map_err(|_| "the signature does not match the body")
}
