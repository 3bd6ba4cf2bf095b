//! A stand-in for one of stellar-core's HTTP ports, for tests of the relay's forwarding: it
//! answers every request with a reply the test chooses, written the way core's servers write
//! (HTTP/1.0, `Content-Length` then `Content-Type`, then the connection closed), and keeps
//! every request as it arrived on the wire (head and body), so a test can check what the relay
//! sent. It finds the body by `Content-Length` spelled exactly so, as core's query server does.
//! It holds no ledger state: it is not a double of core, only of its HTTP framing.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// One request as the stand-in read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// The request line and headers, up to and without the blank line.
    pub head: String,
    /// The body (`Content-Length` bytes).
    pub body: Vec<u8>,
}

impl Received {
    /// The request line, e.g. `GET /tx?blob=... HTTP/1.1`.
    pub fn request_line(&self) -> &str {
        self.head.lines().next().unwrap_or("")
    }

    /// The header lines, exactly as sent.
    pub fn header_lines(&self) -> Vec<&str> {
        self.head.split("\r\n").skip(1).collect()
    }
}

/// What the stand-in answers.
#[derive(Debug, Clone)]
pub struct Reply {
    /// Status line after `HTTP/1.0 `, e.g. `200 OK`.
    pub status: &'static str,
    /// `Content-Type`.
    pub content_type: &'static str,
    /// The body.
    pub body: Vec<u8>,
    /// How long to wait before answering.
    pub delay: Duration,
}

impl Reply {
    /// `200 OK` with a JSON body.
    pub fn json(body: &str) -> Reply {
        Reply {
            status: "200 OK",
            content_type: "application/json",
            body: body.as_bytes().to_vec(),
            delay: Duration::ZERO,
        }
    }

    /// `404 Not Found`, `text/html`, as core's query server answers its errors.
    pub fn not_found(body: &str) -> Reply {
        Reply {
            status: "404 Not Found",
            content_type: "text/html",
            body: body.as_bytes().to_vec(),
            delay: Duration::ZERO,
        }
    }

    /// This reply after `delay`.
    pub fn after(mut self, delay: Duration) -> Reply {
        self.delay = delay;
        self
    }
}

type Answer = dyn Fn(&Received) -> Reply + Send + Sync;

/// A stand-in for one of core's ports, on 127.0.0.1, until dropped.
pub struct CorePortStandIn {
    pub addr: SocketAddr,
    received: Arc<Mutex<Vec<Received>>>,
    stop: CancellationToken,
}

impl Drop for CorePortStandIn {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl CorePortStandIn {
    /// Serves `answer`'s replies.
    pub async fn start(answer: impl Fn(&Received) -> Reply + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let received = Arc::new(Mutex::new(Vec::new()));
        let stop = CancellationToken::new();
        let answer: Arc<Answer> = Arc::new(answer);
        let (rx, token) = (received.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                let sock = tokio::select! {
                    a = listener.accept() => match a { Ok((s, _)) => s, Err(_) => continue },
                    _ = token.cancelled() => return,
                };
                tokio::spawn(serve(sock, answer.clone(), rx.clone()));
            }
        });
        CorePortStandIn {
            addr,
            received,
            stop,
        }
    }

    /// Always answers `reply`.
    pub async fn answering(reply: Reply) -> Self {
        Self::start(move |_| reply.clone()).await
    }

    /// The URL to give the relay (`--core-http`, `--core-query`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The requests read so far.
    pub fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }
}

/// Reads one request (head, then `Content-Length` bytes), records it, answers and closes.
async fn serve(mut sock: TcpStream, answer: Arc<Answer>, received: Arc<Mutex<Vec<Received>>>) {
    let mut buf = Vec::new();
    let mut piece = [0u8; 4096];
    let head_end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at;
        }
        match sock.read(&mut piece).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&piece[..n]),
        }
        assert!(buf.len() < 1 << 20, "a request head under 1 MiB");
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let len = head
        .split("\r\n")
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(0);
    let mut body = buf[head_end + 4..].to_vec();
    while body.len() < len {
        match sock.read(&mut piece).await {
            Ok(0) | Err(_) => return,
            Ok(n) => body.extend_from_slice(&piece[..n]),
        }
    }
    let request = Received { head, body };
    received.lock().unwrap().push(request.clone());
    let reply = answer(&request);
    tokio::time::sleep(reply.delay).await;
    let mut out = format!(
        "HTTP/1.0 {}\r\nContent-Length: {}\r\nContent-Type: {}\r\n\r\n",
        reply.status,
        reply.body.len(),
        reply.content_type
    )
    .into_bytes();
    out.extend_from_slice(&reply.body);
    let _ = sock.write_all(&out).await;
    let _ = sock.shutdown().await;
}
