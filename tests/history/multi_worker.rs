//! The worker of a multi-key history: half its grants are two keys at once
//! (`Locker::acquire_all`), the others one key's lock, on the same keys.
//! A multi-key grant is logged as one grant per key (`<grant>.<key>`), so
//! that every check of the lock (exclusion, validity, `lost()`, tokens, the
//! fenced resource) judges each of its keys, and `check_multi` judges the
//! multi-key holder against every holder of its keys.

use std::time::{Duration, Instant};

use tower_redis_lock::{
    FenceOutcome, FencedResource, FencingToken, LockGuard, LockKey, LockStore, Locker, MultiGuard,
};

use crate::worker::{EventLog, Style, WorkerSpec, mono_ns};
use crate::{CALL_GUARD, KEYS, LEASE, MAX_ITERATIONS, NAMESPACE, WAIT};

/// What a grant holds: one key's lock, or several keys as one.
enum Hold {
    One(LockGuard),
    All(MultiGuard),
}

impl Hold {
    fn is_held(&self) -> bool {
        match self {
            Hold::One(g) => g.is_held(),
            Hold::All(g) => g.is_held(),
        }
    }

    fn is_lost(&self) -> bool {
        match self {
            Hold::One(g) => g.is_lost(),
            Hold::All(g) => g.is_lost(),
        }
    }

    fn valid_for(&self) -> Duration {
        match self {
            Hold::One(g) => g.valid_for(),
            Hold::All(g) => g.valid_for(),
        }
    }

    async fn lost(&self) {
        match self {
            Hold::One(g) => g.lost().await,
            Hold::All(g) => g.lost().await,
        }
    }

    fn acquired_at(&self) -> tokio::time::Instant {
        match self {
            Hold::One(g) => g.acquired_at(),
            Hold::All(g) => g.acquired_at(),
        }
    }

    fn token(&self, key: &LockKey) -> FencingToken {
        match self {
            Hold::One(g) => g.fencing_token().unwrap(),
            Hold::All(g) => g.fencing_token(key).unwrap().unwrap(),
        }
    }

    async fn release(self) -> Result<bool, tower_redis_lock::Error> {
        match self {
            Hold::One(g) => g.release().await,
            Hold::All(g) => g.release().await,
        }
    }
}

/// One key of a grant, as the log names it.
struct View {
    id: String,
    key: LockKey,
    name: String,
    resource: FencedResource,
}

pub async fn multi_worker_loop<S: LockStore + Clone>(
    spec: &WorkerSpec,
    log: &mut EventLog,
    store: S,
) {
    let normal = Locker::builder(store.clone())
        .lease(LEASE)
        .wait_timeout(WAIT)
        .build()
        .unwrap();
    let capped = Locker::builder(store)
        .lease(LEASE)
        .wait_timeout(WAIT)
        .max_hold(LEASE)
        .build()
        .unwrap();
    let mut rng = fastrand::Rng::with_seed(
        spec.seed ^ u64::from(spec.id).wrapping_mul(0x9E37_79B9_7F4A_7C15),
    );
    let mut conn = redis::Client::open(spec.resource_url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let mut grants = 0u32;
    for _ in 0..MAX_ITERATIONS {
        if mono_ns() >= spec.deadline_ns {
            break;
        }
        // Half the time two keys at once, asked in either order.
        let a = rng.u32(..KEYS);
        let mut ks = vec![a];
        if rng.bool() {
            let b = (a + 1 + rng.u32(..KEYS - 1)) % KEYS;
            ks.push(b);
        }
        let names: Vec<String> = ks.iter().map(|k| format!("k{k}")).collect();
        let keys: Vec<LockKey> = names
            .iter()
            .map(|n| LockKey::new(NAMESPACE, n).unwrap())
            .collect();
        let style = match rng.u32(..100) {
            0..55 => Style::Short,
            55..85 => Style::Long,
            _ => Style::Expire,
        };
        let locker = if style == Style::Expire {
            &capped
        } else {
            &normal
        };
        for n in &names {
            log.event(mono_ns(), "ATTEMPT", format_args!("key={n}"));
        }
        let take = async {
            match keys.as_slice() {
                [one] => locker.acquire(one).await.map(Hold::One),
                all => locker.acquire_all(all).await.map(Hold::All),
            }
        };
        let res = tokio::time::timeout(CALL_GUARD, take).await;
        let t = mono_ns();
        let hold = match res {
            Ok(Ok(hold)) => hold,
            Ok(Err(e)) => {
                let why = if e.is_contended() {
                    "contended"
                } else if e.is_store_failure() {
                    "store"
                } else {
                    "other"
                };
                log.event(t, "ACQFAIL", format_args!("key={} why={why}", names[0]));
                if why != "contended" {
                    tokio::time::sleep(Duration::from_millis(rng.u64(10..50))).await;
                }
                continue;
            }
            Err(_) => {
                log.event(t, "ACQFAIL", format_args!("key={} why=hang", names[0]));
                continue;
            }
        };
        grants += 1;
        let grant = format!("w{}-{grants}", spec.id);
        let views: Vec<View> = keys
            .iter()
            .zip(&names)
            .map(|(key, name)| View {
                id: if keys.len() > 1 {
                    format!("{grant}.{name}")
                } else {
                    grant.clone()
                },
                key: key.clone(),
                name: name.clone(),
                resource: FencedResource::new(format!("res:{name}")),
            })
            .collect();
        let attempt = t.saturating_sub(hold.acquired_at().elapsed().as_nanos() as u64);
        for v in &views {
            log.event(
                t,
                "GRANT",
                format_args!(
                    "key={} grant={} token={} attempt={attempt} style={style:?}",
                    v.name,
                    v.id,
                    hold.token(&v.key).get()
                ),
            );
        }
        let hold = std::sync::Arc::new(hold);
        let (given_back, give_back) = tokio::sync::oneshot::channel::<()>();
        let watcher = {
            let (hold, log) = (hold.clone(), log.clone());
            let ids: Vec<String> = views.iter().map(|v| v.id.clone()).collect();
            tokio::spawn(async move {
                tokio::select! {
                    biased;
                    () = hold.lost() => {
                        let t = mono_ns();
                        for id in &ids {
                            log.event(t, "LOST", format_args!("grant={id}"));
                        }
                    }
                    _ = give_back => {}
                }
            })
        };
        observe(log, &views, &hold);
        let mut writes = 0u32;
        write(log, &views, &hold, &mut conn, &mut writes).await;
        match style {
            Style::Short => {}
            Style::Long => {
                let span = LEASE.mul_f64(rng.f64() * 2.0 + 0.5);
                let start = Instant::now();
                let mut wrote_mid = false;
                while start.elapsed() < span {
                    tokio::time::sleep(LEASE / 5).await;
                    observe(log, &views, &hold);
                    if !wrote_mid && start.elapsed() >= span / 2 {
                        wrote_mid = true;
                        write(log, &views, &hold, &mut conn, &mut writes).await;
                    }
                }
            }
            Style::Expire => {
                let start = Instant::now();
                while start.elapsed() < LEASE * 4 {
                    tokio::time::sleep(LEASE / 5).await;
                    if !observe(log, &views, &hold) {
                        break;
                    }
                }
                write(log, &views, &hold, &mut conn, &mut writes).await;
            }
        }
        observe(log, &views, &hold);
        let _ = given_back.send(());
        let _ = watcher.await;
        let Ok(hold) = std::sync::Arc::try_unwrap(hold) else {
            panic!("the watcher kept the hold");
        };
        if rng.u32(..100) < 70 {
            let t = mono_ns();
            for v in &views {
                log.event(t, "RELEASING", format_args!("grant={}", v.id));
            }
            let res = tokio::time::timeout(CALL_GUARD, hold.release()).await;
            let result = match res {
                Ok(Ok(owned)) => owned.to_string(),
                Ok(Err(e)) if e.is_store_failure() => "store".to_owned(),
                Ok(Err(_)) => "error".to_owned(),
                Err(_) => "hang".to_owned(),
            };
            let t = mono_ns();
            for v in &views {
                log.event(
                    t,
                    "RELEASED",
                    format_args!("grant={} result={result}", v.id),
                );
            }
        } else {
            let t = mono_ns();
            for v in &views {
                log.event(t, "DROP", format_args!("grant={}", v.id));
            }
            drop(hold);
        }
    }
    log.event(mono_ns(), "END", format_args!("grants={grants}"));
}

/// Looks at the hold and logs what it said, once per key (the time taken
/// before the look, as `worker::observe` does).
fn observe(log: &mut EventLog, views: &[View], hold: &Hold) -> bool {
    let t = mono_ns();
    let held = hold.is_held();
    let valid_for = hold.valid_for();
    let lost = !held && hold.is_lost();
    for v in views {
        if held {
            log.event(
                t,
                "HELD",
                format_args!("grant={} valid_us={}", v.id, valid_for.as_micros()),
            );
        } else {
            log.event(t, "NOTHELD", format_args!("grant={} lost={lost}", v.id));
        }
    }
    held
}

/// One fenced write per key, each with that key's token.
async fn write(
    log: &mut EventLog,
    views: &[View],
    hold: &Hold,
    conn: &mut redis::aio::MultiplexedConnection,
    writes: &mut u32,
) {
    *writes += 1;
    for v in views {
        let value = format!("{}/{}", v.id, writes);
        let token = hold.token(&v.key);
        let sent = mono_ns();
        let res = tokio::time::timeout(CALL_GUARD, v.resource.set(conn, token, &value)).await;
        let result = match res {
            Ok(Ok(FenceOutcome::Applied)) => "applied".to_owned(),
            Ok(Ok(FenceOutcome::Stale { seen })) => format!("stale:{}", seen.get()),
            Ok(Err(_)) => "error".to_owned(),
            Err(_) => "hang".to_owned(),
        };
        log.event(
            mono_ns(),
            "WRITE",
            format_args!(
                "key={} grant={} token={} value={value} sent={sent} result={result}",
                v.name,
                v.id,
                token.get()
            ),
        );
    }
}
