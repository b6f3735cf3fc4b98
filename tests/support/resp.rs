//! A tiny blocking RESP client: [`Reply`] and the one-shot connection
//! behind [`RedisServer::cmd`](super::RedisServer::cmd).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// One RESP reply. RESP3-only types, should a command produce them, are mapped onto
/// these (null -> `Bulk(None)`, boolean -> `Int`, double/big number -> `Simple`,
/// map -> flat `Array`, set/push -> `Array`).
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// `+...`
    Simple(String),
    /// `-...` (the whole message, e.g. `"ERR unknown command ..."`).
    Error(String),
    /// `:...`
    Int(i64),
    /// `$...`; `None` is the nil bulk string.
    Bulk(Option<Vec<u8>>),
    /// `*...`; `None` is the nil array.
    Array(Option<Vec<Reply>>),
}

impl Reply {
    /// The integer of an `Int`, or of a `Simple`/`Bulk` whose text parses as `i64`
    /// (e.g. `GET` of a counter).
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Reply::Int(n) => Some(*n),
            Reply::Simple(s) => s.parse().ok(),
            Reply::Bulk(Some(bytes)) => std::str::from_utf8(bytes).ok()?.parse().ok(),
            _ => None,
        }
    }

    /// The text of a `Simple` or a (valid UTF-8) `Bulk`.
    pub fn as_string(&self) -> Option<String> {
        match self {
            Reply::Simple(s) => Some(s.clone()),
            Reply::Bulk(Some(bytes)) => String::from_utf8(bytes.clone()).ok(),
            _ => None,
        }
    }

    /// The elements of a non-nil `Array`.
    pub fn as_array(&self) -> Option<&[Reply]> {
        match self {
            Reply::Array(Some(items)) => Some(items),
            _ => None,
        }
    }

    /// Nil bulk string or nil array.
    pub fn is_nil(&self) -> bool {
        matches!(self, Reply::Bulk(None) | Reply::Array(None))
    }

    /// An error reply.
    pub fn is_error(&self) -> bool {
        matches!(self, Reply::Error(_))
    }
}

/// A blocking RESP2 connection whose whole exchange must finish before a deadline.
pub(super) struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
    pos: usize,
    deadline: Instant,
    timeout: Duration,
}

impl Conn {
    /// Connect to `addr` and, with a password, `AUTH`; all within `timeout`.
    pub(super) fn open(
        addr: SocketAddr,
        timeout: Duration,
        password: Option<&str>,
    ) -> Result<Conn, String> {
        let stream = TcpStream::connect_timeout(&addr, timeout)
            .map_err(|e| format!("connect to {addr}: {e}"))?;
        let _ = stream.set_nodelay(true);
        let mut conn = Conn {
            stream,
            buf: Vec::new(),
            pos: 0,
            deadline: Instant::now() + timeout,
            timeout,
        };
        if let Some(password) = password {
            match conn.request(&["AUTH", password]) {
                Ok(Reply::Simple(ok)) if ok == "OK" => {}
                Ok(other) => return Err(format!("AUTH on {addr} answered {other:?}")),
                Err(e) => return Err(format!("AUTH on {addr}: {e}")),
            }
        }
        Ok(conn)
    }

    /// Send one command and read one reply.
    pub(super) fn request(&mut self, args: &[&str]) -> io::Result<Reply> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for arg in args {
            out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
            out.extend_from_slice(arg.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        let left = self.time_left()?;
        self.stream.set_write_timeout(Some(left))?;
        self.stream
            .write_all(&out)
            .map_err(|e| self.explain_timeout(e))?;
        self.read_reply()
    }

    /// Time until the deadline, or a `TimedOut` error.
    fn time_left(&self) -> io::Result<Duration> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            Err(self.timed_out())
        } else {
            Ok(left)
        }
    }

    fn timed_out(&self) -> io::Error {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!("no complete reply within {:?}", self.timeout),
        )
    }

    /// Socket timeouts surface as `WouldBlock` on Unix; report them as timeouts.
    fn explain_timeout(&self, e: io::Error) -> io::Error {
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => self.timed_out(),
            _ => e,
        }
    }

    /// Read more bytes into the buffer.
    fn fill(&mut self) -> io::Result<()> {
        let left = self.time_left()?;
        self.stream.set_read_timeout(Some(left))?;
        let mut chunk = [0u8; 8192];
        let n = self
            .stream
            .read(&mut chunk)
            .map_err(|e| self.explain_timeout(e))?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed by the server",
            ));
        }
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(())
    }

    /// One `\r\n`-terminated line, without the terminator.
    fn read_line(&mut self) -> io::Result<Vec<u8>> {
        let mut searched = self.pos;
        loop {
            if let Some(i) = self.buf[searched..].windows(2).position(|w| w == b"\r\n") {
                let end = searched + i;
                let line = self.buf[self.pos..end].to_vec();
                self.pos = end + 2;
                return Ok(line);
            }
            searched = self.buf.len().saturating_sub(1).max(self.pos);
            self.fill()?;
        }
    }

    /// Exactly `len` bytes followed by `\r\n`.
    fn read_payload(&mut self, len: usize) -> io::Result<Vec<u8>> {
        while self.buf.len() - self.pos < len + 2 {
            self.fill()?;
        }
        let payload = self.buf[self.pos..self.pos + len].to_vec();
        if &self.buf[self.pos + len..self.pos + len + 2] != b"\r\n" {
            return Err(protocol_error("bulk string not terminated by CRLF"));
        }
        self.pos += len + 2;
        Ok(payload)
    }

    /// `n` replies.
    fn read_replies(&mut self, n: usize) -> io::Result<Vec<Reply>> {
        (0..n).map(|_| self.read_reply()).collect()
    }

    /// One complete reply.
    fn read_reply(&mut self) -> io::Result<Reply> {
        let line = self.read_line()?;
        let Some((&kind, rest)) = line.split_first() else {
            return Err(protocol_error("empty reply line"));
        };
        let text = String::from_utf8_lossy(rest).into_owned();
        let length = |text: &str| -> io::Result<Option<usize>> {
            let n: i64 = text
                .parse()
                .map_err(|_| protocol_error(&format!("bad length {text:?}")))?;
            Ok(usize::try_from(n).ok())
        };
        Ok(match kind {
            b'+' => Reply::Simple(text),
            b'-' => Reply::Error(text),
            b':' => Reply::Int(
                text.parse()
                    .map_err(|_| protocol_error(&format!("bad integer {text:?}")))?,
            ),
            b'$' => match length(&text)? {
                Some(len) => Reply::Bulk(Some(self.read_payload(len)?)),
                None => Reply::Bulk(None),
            },
            b'*' => match length(&text)? {
                Some(n) => Reply::Array(Some(self.read_replies(n)?)),
                None => Reply::Array(None),
            },
            // RESP3 types, mapped onto the RESP2 ones.
            b'_' => Reply::Bulk(None),
            b'#' => Reply::Int(i64::from(text == "t")),
            b',' | b'(' => Reply::Simple(text),
            b'=' => Reply::Bulk(Some(self.read_payload(length(&text)?.unwrap_or(0))?)),
            b'!' => {
                let payload = self.read_payload(length(&text)?.unwrap_or(0))?;
                Reply::Error(String::from_utf8_lossy(&payload).into_owned())
            }
            b'%' => Reply::Array(Some(self.read_replies(length(&text)?.unwrap_or(0) * 2)?)),
            b'~' | b'>' => Reply::Array(Some(self.read_replies(length(&text)?.unwrap_or(0))?)),
            b'|' => {
                // Attributes precede the real reply: skip them.
                self.read_replies(length(&text)?.unwrap_or(0) * 2)?;
                self.read_reply()?
            }
            other => {
                return Err(protocol_error(&format!(
                    "unknown reply type {:?}",
                    char::from(other)
                )));
            }
        })
    }
}

fn protocol_error(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("RESP protocol error: {what}"),
    )
}
