//! A real S3-protocol server on loopback for tests and benchmarks: `moto_server` (PyPI
//! `moto[server]`, which `.ci/run` installs), started on a free port of 127.0.0.1 and stopped
//! (by its process id) when the last handle is dropped.
//!
//! Not for production: moto keeps objects in memory and checks no credentials unless started
//! with [`S3Server::start_with_auth`], which refuses every key (to test refused credentials).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// A running `moto_server`.
#[derive(Debug)]
pub struct S3Server {
    child: Child,
    addr: SocketAddr,
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The access key the helpers use (moto accepts any unless started with auth).
pub const ACCESS_KEY: &str = "AKIALEDGERRELAYTEST";
/// The secret key the helpers use.
pub const SECRET_KEY: &str = "ledger-relay-test-secret";

static SHARED: Mutex<Weak<S3Server>> = Mutex::new(Weak::new());

impl S3Server {
    /// Starts a server that accepts any credentials.
    pub fn start() -> std::io::Result<S3Server> {
        Self::spawn(false)
    }

    /// Starts a server that checks credentials, so every key the helpers give is refused
    /// (moto knows no IAM users until some are created).
    pub fn start_with_auth() -> std::io::Result<S3Server> {
        Self::spawn(true)
    }

    /// One server shared by the callers alive at the same time (tests in one binary), started
    /// on first use and stopped when the last handle is dropped.
    pub fn shared() -> std::io::Result<Arc<S3Server>> {
        let mut slot = SHARED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = slot.upgrade() {
            return Ok(s);
        }
        let s = Arc::new(Self::start()?);
        *slot = Arc::downgrade(&s);
        Ok(s)
    }

    /// Starts a server on `port` of 127.0.0.1 (to bring back a store a client already points
    /// at).
    pub fn start_on(port: u16) -> std::io::Result<S3Server> {
        Self::spawn_on(port, false)
    }

    fn spawn(auth: bool) -> std::io::Result<S3Server> {
        // A free port: bound and released (a race with another process is possible, and then
        // the start fails and says so).
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        Self::spawn_on(port, auth)
    }

    fn spawn_on(port: u16, auth: bool) -> std::io::Result<S3Server> {
        let mut cmd = Command::new("moto_server");
        cmd.args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if auth {
            cmd.env("INITIAL_NO_AUTH_ACTION_COUNT", "0");
        }
        let child = cmd.spawn().map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("cannot start moto_server (pip install 'moto[server]'): {e}"),
            )
        })?;
        let mut server = S3Server {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if TcpStream::connect_timeout(&server.addr, Duration::from_millis(200)).is_ok() {
                return Ok(server);
            }
            if let Some(status) = server.child.try_wait()? {
                return Err(std::io::Error::other(format!(
                    "moto_server exited at start ({status}); is port {port} free?"
                )));
            }
            if Instant::now() > deadline {
                return Err(std::io::Error::other(
                    "moto_server did not listen within 30 s",
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The server's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The endpoint URL, `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Creates a bucket (names of 3 to 63 lowercase letters, digits and dashes).
    pub fn create_bucket(&self, name: &str) -> std::io::Result<()> {
        let status = self.request("PUT", &format!("/{name}"))?;
        if status == 200 {
            Ok(())
        } else {
            Err(std::io::Error::other(format!(
                "creating bucket {name}: HTTP {status}"
            )))
        }
    }

    /// A plain unsigned request; the status code.
    fn request(&self, method: &str, path: &str) -> std::io::Result<u16> {
        let mut s = TcpStream::connect_timeout(&self.addr, Duration::from_secs(5))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.addr
        )?;
        let mut head = Vec::new();
        s.read_to_end(&mut head)?;
        let text = String::from_utf8_lossy(&head);
        text.split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("bad answer: {text:.100}")))
    }

    /// `object_store` keys that point an S3 lake at this server (for
    /// [`crate::LakeOptions::store_config`]).
    pub fn store_config(&self) -> Vec<(String, String)> {
        vec![
            ("aws_endpoint".into(), self.endpoint()),
            ("aws_allow_http".into(), "true".into()),
            ("aws_access_key_id".into(), ACCESS_KEY.into()),
            ("aws_secret_access_key".into(), SECRET_KEY.into()),
            ("aws_region".into(), "us-east-1".into()),
        ]
    }

    /// The environment that points a child process's S3 lakes at this server.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", self.endpoint()),
            ("AWS_ALLOW_HTTP", "true".into()),
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY.into()),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.into()),
            ("AWS_REGION", "us-east-1".into()),
        ]
    }
}

/// A bucket name unique in this process, for tests sharing one server.
pub fn unique_bucket(tag: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let tag: String = tag
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .take(40)
        .collect();
    format!(
        "{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}
