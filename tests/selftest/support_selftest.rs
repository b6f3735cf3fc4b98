//! Self-test of the test support module (`tests/support/mod.rs`).

use crate::support;

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use support::{RedisServer, Reply, free_port, wait_until};

fn bulk(s: &str) -> Reply {
    Reply::Bulk(Some(s.as_bytes().to_vec()))
}

fn ok() -> Reply {
    Reply::Simple("OK".into())
}

/// Whether process `pid` is gone (or only a zombie left for init to reap).
fn process_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
    }
}

#[test]
fn set_get_round_trip_and_reply_types() {
    let srv = RedisServer::start();
    assert_eq!(srv.url(), format!("redis://127.0.0.1:{}/", srv.port()));
    assert_eq!(srv.addr().port(), srv.port());
    assert!(srv.addr().ip().is_loopback());

    assert_eq!(srv.cmd(&["PING"]), Reply::Simple("PONG".into()));
    assert_eq!(srv.cmd(&["SET", "greeting", "hello world"]), ok());
    let got = srv.cmd(&["GET", "greeting"]);
    assert_eq!(got, bulk("hello world"));
    assert_eq!(got.as_string().as_deref(), Some("hello world"));
    assert!(!got.is_nil());

    let missing = srv.cmd(&["GET", "missing"]);
    assert!(missing.is_nil());
    assert_eq!(missing.as_string(), None);

    assert_eq!(srv.cmd(&["INCR", "counter"]), Reply::Int(1));
    assert_eq!(srv.cmd(&["INCRBY", "counter", "41"]).as_int(), Some(42));
    assert_eq!(srv.cmd(&["GET", "counter"]).as_int(), Some(42));

    assert_eq!(
        srv.cmd(&["MGET", "greeting", "missing"]),
        Reply::Array(Some(vec![bulk("hello world"), Reply::Bulk(None)]))
    );
    assert_eq!(
        srv.cmd(&["BLPOP", "no-such-list", "0.01"]),
        Reply::Array(None)
    );

    let err = srv.cmd(&["NO-SUCH-COMMAND"]);
    assert!(
        matches!(&err, Reply::Error(msg) if msg.starts_with("ERR")),
        "{err:?}"
    );

    // Empty and large values (the reply spans many socket reads).
    assert_eq!(srv.cmd(&["SET", "empty", ""]), ok());
    assert_eq!(srv.cmd(&["GET", "empty"]), bulk(""));
    let big: String = (0..200_000)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    assert_eq!(srv.cmd(&["SET", "big", &big]), ok());
    assert_eq!(srv.cmd(&["GET", "big"]), bulk(&big));
}

#[test]
fn command_calls_count_exactly_after_reset() {
    let srv = RedisServer::start();
    for i in 0..3 {
        srv.cmd(&["SET", &format!("before{i}"), "x"]);
    }
    assert_eq!(srv.command_calls("set"), 3);

    srv.reset_stats();
    assert_eq!(srv.command_calls("set"), 0);
    assert_eq!(srv.command_calls("get"), 0);

    for i in 0..7 {
        srv.cmd(&["SET", &format!("k{i}"), "v"]);
    }
    srv.cmd(&["GET", "k0"]);
    srv.cmd(&["GET", "k1"]);
    assert_eq!(srv.command_calls("set"), 7);
    assert_eq!(srv.command_calls("SET"), 7);
    assert_eq!(srv.command_calls("get"), 2);
    assert_eq!(srv.command_calls("evalsha"), 0);

    let stats = srv.command_stats();
    assert_eq!(stats.get("set"), Some(&7));
    assert_eq!(stats.get("get"), Some(&2));
    // Subcommands are reported as `command|subcommand` and summed by the base name.
    assert_eq!(stats.get("config|resetstat"), Some(&1));
    assert_eq!(srv.command_calls("config"), 1);
}

#[test]
fn keys_and_dbsize_reflect_writes() {
    let srv = RedisServer::start();
    assert_eq!(srv.dbsize(), 0);
    assert!(srv.keys().is_empty());

    for key in ["b", "a", "c"] {
        srv.cmd(&["SET", key, "1"]);
    }
    assert_eq!(srv.keys(), vec!["a", "b", "c"]);
    assert_eq!(srv.dbsize(), 3);

    assert_eq!(srv.cmd(&["DEL", "b"]), Reply::Int(1));
    assert_eq!(srv.keys(), vec!["a", "c"]);
    assert_eq!(srv.dbsize(), 2);
}

#[test]
fn freeze_makes_try_cmd_fail_and_thaw_recovers() {
    let srv = RedisServer::start();
    srv.cmd(&["SET", "k", "v"]);
    assert_eq!(srv.try_cmd(&["PING"]), Ok(Reply::Simple("PONG".into())));

    srv.freeze();
    let started = Instant::now();
    let frozen = srv.try_cmd(&["GET", "k"]);
    let took = started.elapsed();
    assert!(frozen.is_err(), "frozen server answered {frozen:?}");
    // It waited for its timeout (about 1 s) rather than failing at once.
    assert!(
        took >= Duration::from_millis(900),
        "try_cmd against a frozen server took {took:?}"
    );

    srv.thaw();
    assert_eq!(srv.try_cmd(&["GET", "k"]), Ok(bulk("v")));
    assert_eq!(srv.cmd(&["PING"]), Reply::Simple("PONG".into()));
}

#[test]
fn stop_makes_try_cmd_fail_and_restart_comes_back_empty() {
    let mut srv = RedisServer::start();
    let port = srv.port();
    let old_pid = srv.pid().expect("running server has a pid");
    srv.cmd(&["SET", "k", "v"]);
    assert_eq!(srv.dbsize(), 1);

    srv.stop();
    assert!(srv.pid().is_none());
    assert!(srv.try_cmd(&["PING"]).is_err());
    assert!(TcpStream::connect(srv.addr()).is_err());
    srv.stop(); // idempotent

    srv.restart();
    assert_eq!(srv.port(), port);
    assert_ne!(srv.pid(), Some(old_pid));
    assert_eq!(srv.try_cmd(&["PING"]), Ok(Reply::Simple("PONG".into())));
    assert_eq!(srv.dbsize(), 0);
    assert!(srv.cmd(&["GET", "k"]).is_nil());

    // Restarting a running server works too.
    srv.cmd(&["SET", "k2", "v"]);
    srv.restart();
    assert_eq!(srv.port(), port);
    assert_eq!(srv.dbsize(), 0);
}

#[test]
fn servers_started_in_parallel_threads_get_distinct_ports() {
    const N: usize = 4;
    let barrier = Arc::new(Barrier::new(N));
    let handles: Vec<_> = (0..N)
        .map(|_| {
            let barrier = Arc::clone(&barrier);
            thread::spawn(move || {
                barrier.wait();
                RedisServer::start()
            })
        })
        .collect();
    let servers: Vec<RedisServer> = handles
        .into_iter()
        .map(|h| h.join().expect("start thread panicked"))
        .collect();

    let ports: HashSet<u16> = servers.iter().map(RedisServer::port).collect();
    assert_eq!(ports.len(), N, "ports: {ports:?}");

    // The threads that started them have exited; the servers must still be alive and
    // each one must be its own process.
    thread::sleep(Duration::from_millis(50));
    let pids: HashSet<u32> = servers.iter().filter_map(RedisServer::pid).collect();
    assert_eq!(pids.len(), N);
    for (i, srv) in servers.iter().enumerate() {
        srv.cmd(&["SET", "id", &i.to_string()]);
    }
    for (i, srv) in servers.iter().enumerate() {
        assert_eq!(srv.cmd(&["GET", "id"]).as_int(), Some(i as i64));
        assert_eq!(srv.dbsize(), 1);
    }
}

#[test]
fn dropping_a_server_closes_its_port() {
    let srv = RedisServer::start();
    let addr = srv.addr();
    let pid = srv.pid().unwrap();
    assert!(TcpStream::connect(addr).is_ok());

    drop(srv);
    let refused = TcpStream::connect_timeout(&addr, Duration::from_secs(1));
    assert!(
        refused.is_err(),
        "port {} still accepts connections",
        addr.port()
    );
    assert!(process_gone(pid), "redis-server {pid} still running");
}

#[test]
fn dropping_a_frozen_server_kills_it() {
    let srv = RedisServer::start();
    let addr = srv.addr();
    let pid = srv.pid().unwrap();
    srv.freeze();
    drop(srv);
    assert!(process_gone(pid), "redis-server {pid} still running");
    assert!(TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err());
}

#[test]
fn connected_clients_excludes_the_probe() {
    let srv = RedisServer::start();
    assert!(wait_until(Duration::from_secs(5), || srv
        .connected_clients()
        == 0));

    let mut first = TcpStream::connect(srv.addr()).unwrap();
    let second = TcpStream::connect(srv.addr()).unwrap();
    // Make sure the server has accepted both before counting.
    first.write_all(b"PING\r\n").unwrap();
    let mut line = String::new();
    BufReader::new(&first).read_line(&mut line).unwrap();
    assert_eq!(line, "+PONG\r\n");
    assert!(
        wait_until(Duration::from_secs(5), || srv.connected_clients() == 2),
        "connected_clients = {}",
        srv.connected_clients()
    );

    drop(first);
    drop(second);
    assert!(
        wait_until(Duration::from_secs(5), || srv.connected_clients() == 0),
        "connected_clients = {}",
        srv.connected_clients()
    );
}

#[test]
fn extra_args_are_passed_and_requirepass_is_used_by_helpers() {
    let srv =
        RedisServer::start_with(&["--requirepass", "s3cret", "--enable-debug-command", "yes"]);
    // Helpers authenticate by themselves.
    assert_eq!(srv.cmd(&["SET", "k", "v"]), ok());
    assert_eq!(srv.keys(), vec!["k"]);
    assert_eq!(srv.command_calls("set"), 1);
    assert_eq!(srv.cmd(&["DEBUG", "SLEEP", "0"]), ok());
    assert_eq!(
        srv.cmd(&["CONFIG", "GET", "requirepass"]),
        Reply::Array(Some(vec![bulk("requirepass"), bulk("s3cret")]))
    );

    // A raw connection without AUTH is refused.
    let mut raw = TcpStream::connect(srv.addr()).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    raw.write_all(b"*1\r\n$4\r\nPING\r\n").unwrap();
    let mut line = String::new();
    BufReader::new(&raw).read_line(&mut line).unwrap();
    assert!(line.starts_with("-NOAUTH"), "{line:?}");

    let mut srv = srv;
    srv.restart();
    assert_eq!(srv.cmd(&["PING"]), Reply::Simple("PONG".into()));
}

#[test]
#[should_panic(expected = "no-such-option-for-the-selftest")]
fn startup_failure_panics_with_the_server_log() {
    let _srv = RedisServer::start_with(&["--no-such-option-for-the-selftest", "1"]);
}

#[test]
fn free_port_is_bindable() {
    let port = free_port();
    assert_ne!(port, 0);
    let listener = std::net::TcpListener::bind(("127.0.0.1", port));
    assert!(listener.is_ok(), "{listener:?}");
}

#[test]
fn wait_until_reports_success_and_timeout() {
    let mut calls = 0;
    assert!(wait_until(Duration::from_secs(5), || {
        calls += 1;
        calls == 3
    }));
    assert_eq!(calls, 3);

    let started = Instant::now();
    assert!(!wait_until(Duration::from_millis(50), || false));
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(50), "{took:?}");
}

/// Set in the child process that `server_dies_with_a_killed_test_process`
/// starts from its own test binary: the child starts a server, reports it and
/// waits to be killed.
const HELPER_ENV: &str = "SUPPORT_SELFTEST_PDEATHSIG_CHILD";

fn run_as_killed_child() {
    let srv = thread::spawn(RedisServer::start).join().unwrap();
    println!("REDIS_SERVER {} {}", srv.pid().unwrap(), srv.port());
    std::io::stdout().flush().unwrap();
    // Bounded: the parent kills us long before this.
    thread::sleep(Duration::from_secs(30));
}

/// Kills and reaps the helper process however the test ends.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn server_dies_with_a_killed_test_process() {
    if std::env::var_os(HELPER_ENV).is_some() {
        return run_as_killed_child();
    }
    let test = support::harness_name(module_path!(), "server_dies_with_a_killed_test_process");
    let helper = Command::new(std::env::current_exe().unwrap())
        .args([test.as_str(), "--exact", "--nocapture", "--test-threads=1"])
        .env(HELPER_ENV, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut helper = KillOnDrop(helper);
    // Read the report on another thread so that a silent helper cannot hang the test.
    let stdout = BufReader::new(helper.0.stdout.take().unwrap());
    let (report_tx, report_rx) = std::sync::mpsc::channel();
    thread::spawn(move || {
        for line in stdout.lines().map_while(Result::ok) {
            // libtest prints "test server_dies_with_... ... " on the same line first.
            if let Some((_, rest)) = line.split_once("REDIS_SERVER ") {
                let _ = report_tx.send(rest.to_string());
                return;
            }
        }
    });
    let found = report_rx
        .recv_timeout(Duration::from_secs(20))
        .ok()
        .and_then(|rest| {
            let (pid, port) = rest.trim().split_once(' ')?;
            Some((pid.parse::<u32>().ok()?, port.parse::<u16>().ok()?))
        });
    let Some((pid, port)) = found else {
        panic!("helper process did not report a server");
    };
    assert!(!process_gone(pid));
    assert!(TcpStream::connect(("127.0.0.1", port)).is_ok());

    helper.0.kill().unwrap(); // SIGKILL: no Drop runs in the helper
    helper.0.wait().unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || process_gone(pid)),
        "redis-server {pid} survived its killed parent"
    );
    // Not reaped by us: its group leader can look like a zombie while its other threads
    // still hold the listening socket for a moment.
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    assert!(
        wait_until(Duration::from_secs(5), || TcpStream::connect_timeout(
            &addr,
            Duration::from_secs(1)
        )
        .is_err()),
        "port {port} still accepts connections after its server was killed"
    );
}

/// `PgServer`: a PostgreSQL of its own on a unix socket in its temporary
/// directory, not run as root (PostgreSQL refuses root), gone with its
/// socket and directory once dropped.
#[test]
fn pg_server_serves_on_its_own_socket_and_stops_on_drop() {
    use std::os::unix::net::UnixStream;

    let pg = support::postgres::PgServer::start();
    let pid = pg.pid().unwrap();
    let socket = pg.socket();
    assert!(socket.starts_with(pg.socket_dir()), "{}", socket.display());
    assert!(UnixStream::connect(&socket).is_ok(), "{}", pg.log_tail());
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().next())
        .unwrap();
    assert_ne!(uid, "0", "postgres runs as root");
    let dir = pg.socket_dir().to_path_buf();
    // Dropping waits until the postmaster has exited (a postmaster left
    // running would also die soon after its directory is removed: hence no
    // waiting here).
    drop(pg);
    assert!(process_gone(pid), "postgres {pid} still running after drop");
    assert!(UnixStream::connect(&socket).is_err());
    assert!(!dir.exists(), "{} left behind", dir.display());
}

// ---------------------------------------------------------------------------
// The fault proxy (`support::fault::FaultProxy`) against a real server
// ---------------------------------------------------------------------------

mod fault_proxy {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;
    use tokio::time::{Instant, timeout};

    use crate::support::RedisServer;
    use crate::support::fault::FaultProxy;

    const PING: &[u8] = b"*1\r\n$4\r\nPING\r\n";
    const PONG: &[u8] = b"+PONG\r\n";
    /// Far longer than any answer on loopback takes.
    const PATIENCE: Duration = Duration::from_secs(5);

    async fn connect(proxy: &FaultProxy) -> TcpStream {
        let s = TcpStream::connect(proxy.addr()).await.unwrap();
        s.set_nodelay(true).unwrap();
        s
    }

    /// Sends PING and reads PONG; how long it took.
    async fn ping(s: &mut TcpStream) -> std::io::Result<Duration> {
        let start = Instant::now();
        s.write_all(PING).await?;
        let mut buf = [0u8; PONG.len()];
        s.read_exact(&mut buf).await?;
        assert_eq!(&buf, PONG);
        Ok(start.elapsed())
    }

    /// Reads until the connection ends; the bytes read and how it ended.
    async fn read_to_end(s: &mut TcpStream) -> (usize, std::io::Result<()>) {
        let mut buf = vec![0u8; 64 * 1024];
        let mut total = 0;
        loop {
            match s.read(&mut buf).await {
                Ok(0) => return (total, Ok(())),
                Ok(n) => total += n,
                Err(e) => return (total, Err(e)),
            }
        }
    }

    fn get(key: &str) -> Vec<u8> {
        format!("*2\r\n$3\r\nGET\r\n${}\r\n{key}\r\n", key.len()).into_bytes()
    }

    /// A server holding `big` = 200,000 bytes.
    fn server_with_a_big_value() -> RedisServer {
        let srv = RedisServer::start();
        let big = "x".repeat(200_000);
        srv.cmd(&["SET", "big", &big]);
        srv
    }

    /// The answer to `GET big`: `$200000\r\n` + value + `\r\n`.
    const BIG_ANSWER: usize = 9 + 200_000 + 2;

    #[tokio::test]
    async fn latency_is_added_each_way_and_healed() {
        // Latencies of several hundred ms, so that a ping on a loaded
        // machine (up to 300 ms here) is told apart from an added latency.
        let ms = Duration::from_millis;
        let srv = RedisServer::start();
        let proxy = FaultProxy::start(srv.addr()).await;
        let mut s = connect(&proxy).await;
        let fast = ping(&mut s).await.unwrap();
        assert!(fast < ms(300), "{fast:?} without a fault");
        proxy.set_latency(ms(600), Duration::ZERO);
        let up = ping(&mut s).await.unwrap();
        assert!(up >= ms(600), "up latency: {up:?}");
        proxy.set_latency(Duration::ZERO, ms(400));
        let down = ping(&mut s).await.unwrap();
        assert!(down >= ms(400), "down latency: {down:?}");
        assert!(down < ms(600 + 400), "up latency stayed: {down:?}");
        proxy.set_latency(ms(300), ms(300));
        let both = ping(&mut s).await.unwrap();
        assert!(both >= ms(600), "both ways: {both:?}");
        proxy.heal();
        let healed = ping(&mut s).await.unwrap();
        assert!(healed < ms(300), "{healed:?} after heal");
    }

    #[tokio::test]
    async fn the_bandwidth_limit_paces_an_answer() {
        let srv = server_with_a_big_value();
        let proxy = FaultProxy::start(srv.addr()).await;
        let mut s = connect(&proxy).await;
        // 200 KB at 1 MB/s: at least 200 ms.
        proxy.set_bandwidth(Some(1_000_000));
        let start = Instant::now();
        s.write_all(&get("big")).await.unwrap();
        let mut answer = vec![0u8; BIG_ANSWER];
        s.read_exact(&mut answer).await.unwrap();
        let slow = start.elapsed();
        assert!(
            slow >= Duration::from_millis(190),
            "200 KB at 1 MB/s in {slow:?}"
        );
        assert!(answer.starts_with(b"$200000\r\nxxx") && answer.ends_with(b"x\r\n"));
        proxy.heal();
        let start = Instant::now();
        s.write_all(&get("big")).await.unwrap();
        s.read_exact(&mut answer).await.unwrap();
        let fast = start.elapsed();
        assert!(fast < slow / 2, "healed: {fast:?}, limited: {slow:?}");
    }

    /// A blackhole keeps the connection open and answers nothing, while
    /// the server answers others; healed, the held PING gets its PONG.
    /// Its limit ends it without a heal.
    #[tokio::test]
    async fn a_blackhole_stalls_old_and_new_connections_until_healed() {
        let srv = RedisServer::start();
        let proxy = FaultProxy::start(srv.addr()).await;
        let mut s = connect(&proxy).await;
        ping(&mut s).await.unwrap();
        proxy.blackhole(PATIENCE * 4);
        let stalled = timeout(Duration::from_millis(300), ping(&mut s)).await;
        assert!(stalled.is_err(), "a PING passed the blackhole: {stalled:?}");
        let mut fresh = connect(&proxy).await;
        fresh.write_all(PING).await.unwrap();
        let mut buf = [0u8; 1];
        let nothing = timeout(Duration::from_millis(300), fresh.read(&mut buf)).await;
        assert!(nothing.is_err(), "a new connection got {nothing:?}");
        assert!(srv.try_cmd(&["PING"]).is_ok(), "the server itself is fine");
        proxy.heal();
        // The PINGs sent into the blackhole are answered now.
        let mut pong = [0u8; PONG.len()];
        timeout(PATIENCE, s.read_exact(&mut pong))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&pong, PONG);
        timeout(PATIENCE, fresh.read_exact(&mut pong))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&pong, PONG);
        // A limit ends the fault by itself.
        proxy.blackhole(Duration::from_millis(200));
        let start = Instant::now();
        let waited = timeout(PATIENCE, ping(&mut s)).await.unwrap().unwrap();
        assert!(waited >= Duration::from_millis(150), "{waited:?}");
        assert!(start.elapsed() < PATIENCE);
    }

    /// A partition stalls the connections it finds and resets new ones at
    /// once; healed, both work.
    #[tokio::test]
    async fn a_partition_stalls_open_connections_and_resets_new_ones() {
        let srv = RedisServer::start();
        let proxy = FaultProxy::start(srv.addr()).await;
        let mut s = connect(&proxy).await;
        ping(&mut s).await.unwrap();
        proxy.partition(PATIENCE * 4);
        let stalled = timeout(Duration::from_millis(300), ping(&mut s)).await;
        assert!(
            stalled.is_err(),
            "a PING crossed the partition: {stalled:?}"
        );
        let mut fresh = connect(&proxy).await;
        let refused = timeout(PATIENCE, read_to_end(&mut fresh)).await.unwrap();
        assert!(
            matches!(&refused, (0, Err(e)) if e.kind() == std::io::ErrorKind::ConnectionReset),
            "a new connection across the partition: {refused:?}"
        );
        assert_eq!(proxy.refused(), 1);
        proxy.heal();
        let mut pong = [0u8; PONG.len()];
        timeout(PATIENCE, s.read_exact(&mut pong))
            .await
            .unwrap()
            .unwrap();
        let mut fresh = connect(&proxy).await;
        ping(&mut fresh).await.unwrap();
    }

    /// A reset is a reset (RST) to the client, on an idle connection too;
    /// new connections work.
    #[tokio::test]
    async fn a_reset_is_seen_by_the_client_as_a_reset() {
        let srv = RedisServer::start();
        let proxy = FaultProxy::start(srv.addr()).await;
        let mut s = connect(&proxy).await;
        ping(&mut s).await.unwrap();
        proxy.reset();
        let (n, end) = timeout(PATIENCE, read_to_end(&mut s)).await.unwrap();
        assert_eq!(n, 0);
        let kind = end.expect_err("closed without a reset").kind();
        assert_eq!(kind, std::io::ErrorKind::ConnectionReset);
        assert_eq!(proxy.resets_done(), 1);
        let mut fresh = connect(&proxy).await;
        ping(&mut fresh).await.unwrap();
    }

    /// Reset in the middle of an answer: `n` more bytes reach the client
    /// (a 7-byte PONG, then 993 of a 200 KB answer), then the reset; a
    /// connection made after it is not cut.
    #[tokio::test]
    async fn a_reset_mid_reply_cuts_the_answer_after_n_bytes() {
        let srv = server_with_a_big_value();
        let proxy = FaultProxy::start(srv.addr()).await;
        let mut s = connect(&proxy).await;
        ping(&mut s).await.unwrap();
        proxy.reset_mid_reply(1_000);
        let mut later = connect(&proxy).await;
        ping(&mut s).await.unwrap();
        s.write_all(&get("big")).await.unwrap();
        let (n, end) = timeout(PATIENCE, read_to_end(&mut s)).await.unwrap();
        assert_eq!(
            n,
            1_000 - PONG.len(),
            "bytes of the answer before the reset"
        );
        assert_eq!(end.unwrap_err().kind(), std::io::ErrorKind::ConnectionReset);
        later.write_all(&get("big")).await.unwrap();
        let mut answer = vec![0u8; BIG_ANSWER];
        timeout(PATIENCE, later.read_exact(&mut answer))
            .await
            .unwrap()
            .expect("a connection made after the reset was cut");
        assert_eq!(proxy.resets_done(), 1);
    }

    /// A severed connection never carries anything again, heal or not;
    /// a new one works.
    #[tokio::test]
    async fn a_severed_connection_stays_silent_and_new_ones_work() {
        let srv = RedisServer::start();
        let proxy = FaultProxy::start(srv.addr()).await;
        let mut s = connect(&proxy).await;
        ping(&mut s).await.unwrap();
        proxy.sever();
        proxy.heal();
        let silent = timeout(Duration::from_millis(300), ping(&mut s)).await;
        assert!(silent.is_err(), "{silent:?}");
        let mut fresh = connect(&proxy).await;
        ping(&mut fresh).await.unwrap();
        assert_eq!(proxy.open(), 2);
    }

    /// Dropping the proxy ends its connections and its listener.
    #[tokio::test]
    async fn dropping_the_proxy_ends_its_connections_and_port() {
        let srv = RedisServer::start();
        let proxy = FaultProxy::start(srv.addr()).await;
        let addr = proxy.addr();
        let mut s = connect(&proxy).await;
        ping(&mut s).await.unwrap();
        proxy.blackhole(PATIENCE * 100);
        drop(proxy);
        let (_, _) = timeout(PATIENCE, read_to_end(&mut s))
            .await
            .expect("still open");
        let ended =
            crate::support::eventually(PATIENCE, async || TcpStream::connect(addr).await.is_err())
                .await;
        assert!(ended, "the proxy's port still accepts");
    }
}
