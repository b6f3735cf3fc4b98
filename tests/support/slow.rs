//! Hostile clients over raw TCP: a head sent in part or a byte at a time, a
//! body shorter than its `Content-Length`. The example servers must close
//! such connections (or answer them) instead of keeping them for ever.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::task::JoinHandle;
use tokio::time::timeout;

/// What the server did with a connection, read until it closed.
#[derive(Debug)]
pub struct Closed {
    /// Everything the server sent before closing (an answer, or nothing).
    pub sent: Vec<u8>,
}

impl Closed {
    /// The status code of the first answer, if the server sent one.
    pub fn status(&self) -> Option<u16> {
        let line = self.sent.split(|&b| b == b'\r').next()?;
        let line = std::str::from_utf8(line).ok()?;
        line.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()
    }

    /// The text the server sent (lossy), for assertion messages.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.sent).into_owned()
    }
}

/// Connects to `addr` and writes `bytes` without ending the request.
pub async fn open(addr: SocketAddr, bytes: &[u8]) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.write_all(bytes).await.expect("write");
    stream
}

/// Reads from `stream` until the server closes it (end of stream, or a
/// reset); `None` if it is still open after `limit`, a bound only a failing
/// run reaches.
pub async fn until_closed(
    stream: &mut (impl AsyncRead + Unpin),
    limit: Duration,
) -> Option<Closed> {
    let mut sent = Vec::new();
    let read = async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => sent.extend_from_slice(&buf[..n]),
            }
        }
    };
    timeout(limit, read).await.ok()?;
    Some(Closed { sent })
}

/// Writes `bytes` one at a time, one every `every`, in a task that stops at
/// the end of `bytes` or at the first failed write (the server closed).
/// The task answers how many bytes were written, and hands the write half
/// back unclosed (dropping it would end the stream, a close of our own).
pub fn trickle(
    mut write: OwnedWriteHalf,
    bytes: Vec<u8>,
    every: Duration,
) -> JoinHandle<(usize, OwnedWriteHalf)> {
    tokio::spawn(async move {
        let mut written = 0;
        for b in bytes {
            if write.write_all(&[b]).await.is_err() {
                break;
            }
            written += 1;
            tokio::time::sleep(every).await;
        }
        (written, write)
    })
}
