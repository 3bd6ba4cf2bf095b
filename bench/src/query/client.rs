//! The query client the bench runs as a child (`ledger-bench query-client`, hidden), inside the
//! namespace it measures from: `POST`s form bodies to one address, each on a fresh connection
//! as stellar-core's servers require, back to back or paced at a rate, and writes one CSV line
//! per request: index, status, latency and a hash of status and body (to compare the answers
//! of two paths request by request).

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// Longest answer read (core's own limit for an answer through a relay is 32 MiB).
const MAX_ANSWER: u64 = 64 << 20;

/// `ledger-bench query-client` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct ClientArgs {
    /// Server address.
    #[arg(long)]
    pub addr: SocketAddr,
    /// Path to post to.
    #[arg(long, default_value = "/getledgerentry")]
    pub path: String,
    /// File of form bodies, one per line, used in turn.
    #[arg(long)]
    pub bodies: PathBuf,
    /// Requests to send.
    #[arg(long)]
    pub count: u32,
    /// Requests per second over all threads (0: each thread back to back).
    #[arg(long, default_value_t = 0.0)]
    pub rate: f64,
    /// Threads sending.
    #[arg(long, default_value_t = 1)]
    pub threads: u32,
    /// Where the samples go (CSV).
    #[arg(long)]
    pub out: PathBuf,
}

/// One request's outcome.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// Its index.
    pub index: u32,
    /// HTTP status (0: no answer).
    pub status: u16,
    /// From connect to the end of the answer, µs.
    pub latency_us: f64,
    /// Hash of status and body.
    pub hash: u64,
}

/// Runs the client and writes its samples.
pub fn main(a: &ClientArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&a.bodies).context("reading the bodies")?;
    let bodies: Vec<String> = text.lines().map(str::to_owned).collect();
    if bodies.is_empty() || a.threads == 0 {
        bail!("no bodies, or no threads");
    }
    let start = Instant::now() + Duration::from_millis(5);
    let threads: Vec<_> = (0..a.threads)
        .map(|t| {
            let (a, bodies) = (a.clone(), bodies.clone());
            std::thread::spawn(move || send_share(&a, &bodies, t, start))
        })
        .collect();
    let mut samples: Vec<Sample> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap_or_default())
        .collect();
    samples.sort_by_key(|s| s.index);
    let mut csv = String::from("index,status,latency_us,hash\n");
    for s in &samples {
        csv.push_str(&format!(
            "{},{},{:.1},{}\n",
            s.index, s.status, s.latency_us, s.hash
        ));
    }
    std::fs::write(&a.out, csv).context("writing the samples")
}

/// Thread `t`'s requests: every `threads`-th index from `t`, each at its time on the schedule.
fn send_share(a: &ClientArgs, bodies: &[String], t: u32, start: Instant) -> Vec<Sample> {
    (t..a.count)
        .step_by(a.threads as usize)
        .map(|i| {
            if a.rate > 0.0 {
                let due = start + Duration::from_secs_f64(f64::from(i) / a.rate);
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
            }
            let body = &bodies[i as usize % bodies.len()];
            let t0 = Instant::now();
            let (status, hash) = match post(a.addr, &a.path, body) {
                Ok((status, answer)) => (status, hash_of(status, &answer)),
                Err(_) => (0, 0),
            };
            Sample {
                index: i,
                status,
                latency_us: t0.elapsed().as_secs_f64() * 1e6,
                hash,
            }
        })
        .collect()
}

fn hash_of(status: u16, body: &[u8]) -> u64 {
    // DefaultHasher::new() has fixed keys: the same answer hashes the same in every process.
    let mut h = DefaultHasher::new();
    (status, body).hash(&mut h);
    h.finish()
}

/// One `POST` on a fresh connection: the status and the body.
pub fn post(addr: SocketAddr, path: &str, body: &str) -> anyhow::Result<(u16, Vec<u8>)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.set_nodelay(true)?;
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut raw = Vec::new();
    s.take(MAX_ANSWER).read_to_end(&mut raw)?;
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("no end of headers")?;
    let head = String::from_utf8_lossy(&raw[..end]);
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("no status")?;
    Ok((status, raw[end + 4..].to_vec()))
}

/// Reads the samples a client wrote.
pub fn read(path: &Path) -> anyhow::Result<Vec<Sample>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            let field = |i: usize| f.get(i).copied().context("short sample line");
            Ok(Sample {
                index: field(0)?.parse()?,
                status: field(1)?.parse()?,
                latency_us: field(2)?.parse()?,
                hash: field(3)?.parse()?,
            })
        })
        .collect()
}
