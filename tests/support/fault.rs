//! A fault proxy: a TCP proxy on loopback in front of one real server,
//! whose link the test breaks and mends while traffic flows.
//!
//! | fault | what the client sees |
//! |---|---|
//! | [`FaultProxy::set_latency`] | every piece of data held back by a delay, set per direction (up: to the server, down: to the client) |
//! | [`FaultProxy::set_bandwidth`] | at most so many bytes per second each way |
//! | [`FaultProxy::blackhole`] | connections, old and new, stay open and carry nothing (half-open); what was sent waits in the proxy and goes on when the fault ends |
//! | [`FaultProxy::partition`] | existing connections stall as in a blackhole; a new connection is accepted and reset at once (a client sees "connection reset" on its first read or write, not a hang) |
//! | [`FaultProxy::sever`] | the connections open now never carry anything again (their peer is gone); new ones work |
//! | [`FaultProxy::reset`] | every connection open now is reset (RST: `SO_LINGER` 0) |
//! | [`FaultProxy::reset_mid_reply`] | every connection open now passes `n` more bytes to its client, then is reset: in the middle of an answer longer than `n` |
//! | [`FaultProxy::heal`] | latency, bandwidth, blackhole and partition gone; held data flows |
//!
//! Blackhole and partition take a limit and end by themselves when it has
//! passed (or at `heal`); a severed or reset connection is over for good.
//! Every task of the proxy (the listener, each connection, the timers) ends
//! when the [`FaultProxy`] is dropped. The proxy listens on 127.0.0.1 only.
//! Its methods are plain (not async), so a test may drive it from any
//! thread; it runs on the runtime it was started on.

use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Handle;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

/// Whether data may pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Flow {
    #[default]
    Open,
    Blackhole,
    Partition,
}

/// The link's faults now. Generations (`resets`, `severed`) count
/// one-shot faults: a connection compares them with those of its birth.
#[derive(Debug, Clone, Default)]
struct State {
    up_latency: Duration,
    down_latency: Duration,
    /// Bytes per second, each way.
    bandwidth: Option<u64>,
    flow: Flow,
    /// Bumped by every `blackhole`/`partition`/`heal`: a limit's timer
    /// heals only the fault it was set for.
    flow_gen: u64,
    resets: u64,
    /// Bytes the client still gets after the latest reset (`None`: none).
    reset_after: Option<usize>,
    severed: u64,
}

/// What the proxy counts.
#[derive(Debug, Default)]
struct Counters {
    accepted: AtomicU64,
    refused: AtomicU64,
    resets: AtomicU64,
    open: AtomicUsize,
    up_bytes: AtomicU64,
    down_bytes: AtomicU64,
}

/// A proxy to one server. Dropping it ends its listener, its connections
/// and its timers.
pub struct FaultProxy {
    addr: SocketAddr,
    state: Arc<watch::Sender<State>>,
    counters: Arc<Counters>,
    handle: Handle,
    timers: Mutex<JoinSet<()>>,
    _listener: JoinSet<()>,
}

impl std::fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultProxy")
            .field("addr", &self.addr)
            .field("state", &*self.state.borrow())
            .finish()
    }
}

impl FaultProxy {
    /// A healthy proxy to `target` on a free port of 127.0.0.1, on the
    /// current runtime.
    pub async fn start(target: SocketAddr) -> FaultProxy {
        FaultProxy::start_on(&Handle::current(), target)
    }

    /// A healthy proxy to `target`, its tasks on `handle`'s runtime (for a
    /// test that is not async itself).
    pub fn start_on(handle: &Handle, target: SocketAddr) -> FaultProxy {
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        std_listener.set_nonblocking(true).expect("nonblocking");
        let addr = std_listener.local_addr().expect("local address");
        let (state, _) = watch::channel(State::default());
        let state = Arc::new(state);
        let counters = Arc::new(Counters::default());
        let mut listener_task = JoinSet::new();
        let _enter = handle.enter();
        let listener = TcpListener::from_std(std_listener).expect("register the listener");
        listener_task.spawn_on(
            accept_loop(listener, target, state.clone(), counters.clone()),
            handle,
        );
        FaultProxy {
            addr,
            state,
            counters,
            handle: handle.clone(),
            timers: Mutex::new(JoinSet::new()),
            _listener: listener_task,
        }
    }

    /// The proxy's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `redis://<proxy address>/`.
    pub fn url(&self) -> String {
        format!("redis://{}/", self.addr)
    }

    /// Data read from now on is held back by `up` on its way to the server
    /// and by `down` on its way to the client (until changed or healed).
    pub fn set_latency(&self, up: Duration, down: Duration) {
        self.state.send_modify(|s| {
            s.up_latency = up;
            s.down_latency = down;
        });
    }

    /// At most `bytes_per_second` each way (`None`: no limit).
    pub fn set_bandwidth(&self, bytes_per_second: Option<u64>) {
        assert_ne!(bytes_per_second, Some(0), "a bandwidth of 0 is a blackhole");
        self.state.send_modify(|s| s.bandwidth = bytes_per_second);
    }

    /// Nothing passes, on old and new connections, until `limit` has
    /// passed or [`heal`](Self::heal); then what was held goes on.
    pub fn blackhole(&self, limit: Duration) {
        self.set_flow(Flow::Blackhole, limit);
    }

    /// Existing connections stall as in a blackhole; new ones are reset at
    /// once. Ends after `limit` or at [`heal`](Self::heal).
    pub fn partition(&self, limit: Duration) {
        self.set_flow(Flow::Partition, limit);
    }

    /// The connections open now never carry anything again (the proxy
    /// keeps them open: their client must find out by itself); new ones
    /// work.
    pub fn sever(&self) {
        self.state.send_modify(|s| s.severed += 1);
    }

    /// Resets (RST) every connection open now.
    pub fn reset(&self) {
        self.state.send_modify(|s| {
            s.resets += 1;
            s.reset_after = None;
        });
    }

    /// Every connection open now passes `n` more bytes from the server to
    /// its client, then is reset (RST): in the middle of the next answer
    /// longer than `n`.
    pub fn reset_mid_reply(&self, n: usize) {
        self.state.send_modify(|s| {
            s.resets += 1;
            s.reset_after = Some(n);
        });
    }

    /// Ends latency, bandwidth limit, blackhole and partition.
    pub fn heal(&self) {
        self.state.send_modify(|s| {
            s.up_latency = Duration::ZERO;
            s.down_latency = Duration::ZERO;
            s.bandwidth = None;
            s.flow = Flow::Open;
            s.flow_gen += 1;
        });
    }

    /// Whether data flows (no blackhole, no partition).
    pub fn flow(&self) -> Flow {
        self.state.borrow().flow
    }

    /// Connections accepted and passed on to the server, so far.
    pub fn accepted(&self) -> u64 {
        self.counters.accepted.load(Ordering::SeqCst)
    }

    /// Connections reset at once because of a partition, so far.
    pub fn refused(&self) -> u64 {
        self.counters.refused.load(Ordering::SeqCst)
    }

    /// Connections reset by [`reset`](Self::reset) or
    /// [`reset_mid_reply`](Self::reset_mid_reply), so far.
    pub fn resets_done(&self) -> u64 {
        self.counters.resets.load(Ordering::SeqCst)
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.counters.open.load(Ordering::SeqCst)
    }

    /// Bytes passed to the server and to the client, so far.
    pub fn bytes(&self) -> (u64, u64) {
        (
            self.counters.up_bytes.load(Ordering::SeqCst),
            self.counters.down_bytes.load(Ordering::SeqCst),
        )
    }

    fn set_flow(&self, flow: Flow, limit: Duration) {
        let mut gen_now = 0;
        self.state.send_modify(|s| {
            s.flow = flow;
            s.flow_gen += 1;
            gen_now = s.flow_gen;
        });
        let state = self.state.clone();
        let mut timers = self.timers.lock().unwrap();
        // Timers already done are dropped, so the set stays small.
        while timers.try_join_next().is_some() {}
        timers.spawn_on(
            async move {
                tokio::time::sleep(limit).await;
                state.send_if_modified(|s| {
                    let mine = s.flow_gen == gen_now;
                    if mine {
                        s.flow = Flow::Open;
                        s.flow_gen += 1;
                    }
                    mine
                });
            },
            &self.handle,
        );
    }
}

async fn accept_loop(
    listener: TcpListener,
    target: SocketAddr,
    state: Arc<watch::Sender<State>>,
    counters: Arc<Counters>,
) {
    // The connections live as long as this task (dropped with the proxy).
    let mut connections = JoinSet::new();
    while let Ok((client, _)) = listener.accept().await {
        while connections.try_join_next().is_some() {}
        if state.borrow().flow == Flow::Partition {
            counters.refused.fetch_add(1, Ordering::SeqCst);
            if let Ok(ctl) = client.as_fd().try_clone_to_owned() {
                set_zero_linger(&ctl);
            }
            continue;
        }
        let Ok(server) = TcpStream::connect(target).await else {
            continue;
        };
        counters.accepted.fetch_add(1, Ordering::SeqCst);
        connections.spawn(relay(client, server, state.subscribe(), counters.clone()));
    }
}

/// How a part of a connection ended.
enum End {
    Closed,
    Reset,
}

async fn relay(
    client: TcpStream,
    server: TcpStream,
    state: watch::Receiver<State>,
    counters: Arc<Counters>,
) {
    counters.open.fetch_add(1, Ordering::SeqCst);
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    // Handles of our own on both sockets, to make their close a reset.
    let controls = (
        client.as_fd().try_clone_to_owned(),
        server.as_fd().try_clone_to_owned(),
    );
    let born = state.borrow().clone();
    // `io::split`, not `into_split`: a dropped `OwnedWriteHalf` shuts its
    // side down (FIN), which would reach the client before a reset.
    let (client_read, client_write) = tokio::io::split(client);
    let (server_read, server_write) = tokio::io::split(server);
    let mut parts = JoinSet::new();
    let up = Direction::Up;
    let down = Direction::Down;
    spawn_pipe(
        &mut parts,
        up,
        client_read,
        server_write,
        &state,
        &born,
        &counters,
    );
    spawn_pipe(
        &mut parts,
        down,
        server_read,
        client_write,
        &state,
        &born,
        &counters,
    );
    // A reset with no bytes to pass first happens at once, data or not.
    let mut watch_resets = state.clone();
    let resets_born = born.resets;
    parts.spawn(async move {
        loop {
            {
                let s = watch_resets.borrow_and_update();
                if s.resets > resets_born && s.reset_after.is_none() {
                    return End::Reset;
                }
            }
            if watch_resets.changed().await.is_err() {
                return End::Closed;
            }
        }
    });
    // Either side closing, or a reset, ends the connection.
    let end = parts.join_next().await;
    if let Some(Ok(End::Reset)) = end {
        counters.resets.fetch_add(1, Ordering::SeqCst);
        if let (Ok(c), Ok(s)) = &controls {
            set_zero_linger(c);
            set_zero_linger(s);
        }
    }
    parts.abort_all();
    while parts.join_next().await.is_some() {}
    counters.open.fetch_sub(1, Ordering::SeqCst);
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    /// Client to server.
    Up,
    /// Server to client.
    Down,
}

/// One direction: a reader stamps each piece with the time it may leave;
/// a writer holds it until then, and while the link is blocked, and paces
/// it to the bandwidth.
fn spawn_pipe(
    parts: &mut JoinSet<End>,
    dir: Direction,
    mut from: ReadHalf<TcpStream>,
    mut to: WriteHalf<TcpStream>,
    state: &watch::Receiver<State>,
    born: &State,
    counters: &Arc<Counters>,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let reader_state = state.clone();
    parts.spawn(async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => return End::Closed,
                Ok(n) => {
                    let latency = match dir {
                        Direction::Up => reader_state.borrow().up_latency,
                        Direction::Down => reader_state.borrow().down_latency,
                    };
                    if tx
                        .send((Instant::now() + latency, buf[..n].to_vec()))
                        .is_err()
                    {
                        return End::Closed;
                    }
                }
            }
        }
    });
    let mut state = state.clone();
    let born = born.clone();
    let counters = counters.clone();
    parts.spawn(async move {
        // Bytes the client may still get before a reset (`Down` only).
        let mut budget: Option<usize> = None;
        let mut resets_seen = born.resets;
        while let Some((due, bytes)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            let mut rest = &bytes[..];
            while !rest.is_empty() {
                // Held while blocked; a severed connection is held for good.
                let bandwidth = loop {
                    let s = state.borrow_and_update().clone();
                    if dir == Direction::Down && s.resets > resets_seen {
                        resets_seen = s.resets;
                        budget = s.reset_after;
                    }
                    if s.flow == Flow::Open && s.severed == born.severed {
                        break s.bandwidth;
                    }
                    if state.changed().await.is_err() {
                        return End::Closed;
                    }
                };
                let mut n = rest.len();
                if let Some(rate) = bandwidth {
                    // Slices of 20 ms at the rate, at least 64 bytes.
                    n = n.min((rate / 50).max(64) as usize);
                }
                if let Some(b) = budget {
                    n = n.min(b);
                }
                if n > 0 {
                    if to.write_all(&rest[..n]).await.is_err() {
                        return End::Closed;
                    }
                    let counter = match dir {
                        Direction::Up => &counters.up_bytes,
                        Direction::Down => &counters.down_bytes,
                    };
                    counter.fetch_add(n as u64, Ordering::SeqCst);
                    rest = &rest[n..];
                }
                if let Some(b) = budget.as_mut() {
                    *b -= n;
                    if *b == 0 {
                        let _ = to.flush().await;
                        return End::Reset;
                    }
                }
                if let Some(rate) = bandwidth {
                    let pace = Duration::from_secs_f64(n as f64 / rate as f64);
                    tokio::time::sleep(pace).await;
                }
            }
        }
        End::Closed
    });
}

/// `SO_LINGER` with a zero timeout: closing the socket sends RST, not FIN.
fn set_zero_linger(fd: &OwnedFd) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: `fd` is an open socket we own; the option value is a
    // `linger` of the size passed.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}
