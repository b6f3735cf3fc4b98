//! A node that answers late: a TCP proxy in front of a real server that
//! passes requests on at once and holds each piece of the server's answer
//! back by a delay, settable while it runs. For Redlock's timing (a slow
//! minority, a straggler that answers after the quorum) on real servers.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;

/// A proxy to one server; its tasks (and connections) end when it is
/// dropped.
pub struct DelayProxy {
    addr: SocketAddr,
    delay_ms: Arc<AtomicU64>,
    _tasks: JoinSet<()>,
}

impl DelayProxy {
    /// A proxy to `target` on a free local port, holding answers back by
    /// `delay`.
    pub async fn start(target: SocketAddr, delay: Duration) -> DelayProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local address");
        let delay_ms = Arc::new(AtomicU64::new(delay.as_millis() as u64));
        let mut tasks = JoinSet::new();
        let delay = delay_ms.clone();
        tasks.spawn(async move {
            // The connections' tasks live as long as the accepting one.
            let mut connections = JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(target).await else {
                    continue;
                };
                connections.spawn(relay(client, server, delay.clone()));
            }
        });
        DelayProxy {
            addr,
            delay_ms,
            _tasks: tasks,
        }
    }

    /// `redis://<proxy address>/`.
    pub fn url(&self) -> String {
        format!("redis://{}/", self.addr)
    }

    /// The delay for answers read from now on.
    pub fn set_delay(&self, delay: Duration) {
        self.delay_ms
            .store(delay.as_millis() as u64, Ordering::SeqCst);
    }
}

/// Requests go through at once; each piece of an answer is written to the
/// client `delay` after it was read from the server, in order.
async fn relay(client: TcpStream, server: TcpStream, delay: Arc<AtomicU64>) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let mut parts = JoinSet::new();
    parts.spawn(async move {
        let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
    });
    parts.spawn(async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match server_read.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    let due = Instant::now() + Duration::from_millis(delay.load(Ordering::SeqCst));
                    if tx.send((due, buf[..n].to_vec())).is_err() {
                        return;
                    }
                }
            }
        }
    });
    parts.spawn(async move {
        while let Some((due, bytes)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if client_write.write_all(&bytes).await.is_err() {
                return;
            }
        }
    });
    // Either side closing ends the connection.
    parts.join_next().await;
}
