//! What the reliability modes (`slow-subscriber`, `load`) share: a `ledger-relay run` process
//! with its Prometheus endpoint, its resident memory sampled from `/proc/PID/status`, and
//! `ledger-subscribe` processes with their stats files. Loopback only.
//!
//! Processes are started and stopped by [`crate::cluster::Cluster`] ([`crate::cluster::RelayProc`],
//! [`crate::cluster::SubSpec`]); what is here is reading the relay's metrics and memory while
//! it runs, and the subscribers' stats files afterwards.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::cluster::RelayProc;
use crate::netem::RELAY_ADDR;
use crate::stats::{parse_csv, Record};

/// Creates the ephemeral CA: a relay certificate for loopback and the emulated address, and
/// client certificates `sub-0` .. `sub-{n-1}`, at least [`crate::scenario::MAX_SUBSCRIBERS`]
/// (one per possible subscriber of a row).
pub fn make_certs(dir: &Path, n: usize) -> anyhow::Result<()> {
    // Two days for the CA: a one-day leaf issued a second after a one-day CA would outlive it.
    let certs = ledger_relay_certs::CertDir::init(dir, 2)?;
    let names = ["localhost".into(), "127.0.0.1".into(), RELAY_ADDR.into()];
    certs.issue_server("relay", &names, 1)?;
    for i in 0..n.max(usize::from(crate::scenario::MAX_SUBSCRIBERS)) {
        certs.issue_client(&format!("sub-{i}"), 1)?;
    }
    Ok(())
}

/// One plain HTTP/1.1 GET on loopback, with 5 s timeouts; returns the body of a 200.
pub fn http_get(addr: SocketAddr, path: &str) -> anyhow::Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .with_context(|| format!("connecting to {addr}"))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.set_write_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut text = String::new();
    s.take(16 << 20).read_to_string(&mut text)?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .with_context(|| format!("GET {path}: no header end"))?;
    if !head.starts_with("HTTP/1.1 200") {
        bail!(
            "GET {path}: {}",
            head.lines().next().unwrap_or_default().trim()
        );
    }
    Ok(body.to_owned())
}

/// One session as `/metrics` shows it.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct SessionMetrics {
    /// Client identity.
    pub identity: String,
    /// Reading from memory or the ring rather than the live stream.
    pub catching_up: bool,
    /// Lanes up.
    pub lanes: u32,
    /// Ledgers between the source's newest and its last acknowledged.
    pub lag: u64,
}

/// A parsed `/metrics` exposition.
#[derive(Debug, Clone, Default)]
pub struct Scrape {
    /// Unlabelled samples by name without the `ledger_relay_` prefix.
    pub values: BTreeMap<String, f64>,
    /// Sessions by session id.
    pub sessions: BTreeMap<u64, SessionMetrics>,
}

impl Scrape {
    /// An unlabelled counter or gauge (0 when absent).
    pub fn get(&self, name: &str) -> f64 {
        self.values.get(name).copied().unwrap_or(0.0)
    }

    /// The sessions of `identity`.
    pub fn sessions_of<'a>(
        &'a self,
        identity: &'a str,
    ) -> impl Iterator<Item = &'a SessionMetrics> {
        self.sessions
            .values()
            .filter(move |s| s.identity == identity)
    }
}

/// The value of label `key` in `{a="x",b="y"}` (quotes unescaped).
fn label(labels: &str, key: &str) -> Option<String> {
    let start = labels.find(&format!("{key}=\""))? + key.len() + 2;
    let mut out = String::new();
    let mut chars = labels[start..].chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next()? {
                'n' => out.push('\n'),
                other => out.push(other),
            },
            '"' => return Some(out),
            c => out.push(c),
        }
    }
    None
}

/// Parses the relay's Prometheus text (see relay/src/metrics.rs); unknown lines are skipped.
pub fn parse_metrics(text: &str) -> Scrape {
    let mut out = Scrape::default();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let Some((key, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        let Some(key) = key.strip_prefix("ledger_relay_") else {
            continue;
        };
        match key.split_once('{') {
            None => {
                out.values.insert(key.to_owned(), value);
            }
            Some((name, labels)) => {
                let Some(id) = label(labels, "session").and_then(|s| s.parse::<u64>().ok()) else {
                    continue;
                };
                let s = out.sessions.entry(id).or_default();
                if let Some(identity) = label(labels, "identity") {
                    s.identity = identity;
                }
                match name {
                    "subscriber_lag_ledgers" => s.lag = value as u64,
                    "subscriber_lanes" => {
                        s.lanes = value as u32;
                        s.catching_up = label(labels, "catching_up").as_deref() == Some("true");
                    }
                    _ => {}
                }
            }
        }
    }
    out
}

/// A `/proc/PID/status` field in KiB (`VmRSS`, `VmHWM`), or `None` when the process is gone.
pub fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// One resident-memory sample.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct RssSample {
    /// Seconds since the run's start.
    pub t_s: f64,
    /// Resident set, KiB.
    pub rss_kib: u64,
}

/// Samples a process's `VmRSS` on its own thread at a fixed interval until finished.
#[derive(Debug)]
pub struct RssSampler {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<Vec<RssSample>>,
}

impl RssSampler {
    /// Starts sampling `pid` every `every`; times are measured from `t0`. Stops by itself when
    /// the process is gone or after `limit` samples.
    pub fn start(pid: u32, every: Duration, t0: Instant, limit: usize) -> RssSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let mut v = Vec::new();
            let mut next = Instant::now();
            while !flag.load(Ordering::Relaxed) && v.len() < limit {
                let Some(kib) = status_kib(pid, "VmRSS") else {
                    break;
                };
                v.push(RssSample {
                    t_s: t0.elapsed().as_secs_f64(),
                    rss_kib: kib,
                });
                next += every;
                let now = Instant::now();
                if next > now {
                    std::thread::sleep(next - now);
                } else {
                    next = now;
                }
            }
            v
        });
        RssSampler { stop, handle }
    }

    /// Stops and returns the samples.
    pub fn finish(self) -> Vec<RssSample> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().unwrap_or_default()
    }
}

/// KiB to MiB.
pub fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// The first, largest and last of `samples`, MiB (0 when there are none).
pub fn rss_span(samples: &[RssSample]) -> [f64; 3] {
    let at = |s: Option<&RssSample>| s.map_or(0.0, |s| mib(s.rss_kib));
    let max = samples.iter().map(|s| mib(s.rss_kib)).fold(0.0, f64::max);
    [at(samples.first()), max, at(samples.last())]
}

/// A relay of a reliability run with its `VmRSS` sampled every `every_ms` from `t0` on, for at
/// most `limit_s` seconds (and some).
#[derive(Debug)]
pub struct Watched {
    /// The relay.
    pub relay: RelayProc,
    sampler: RssSampler,
}

impl Watched {
    /// Starts sampling `relay`.
    pub fn new(relay: RelayProc, every_ms: u64, limit_s: f64, t0: Instant) -> Watched {
        let limit = (limit_s * 1e3 / every_ms as f64) as usize + 100;
        let sampler = RssSampler::start(relay.pid, Duration::from_millis(every_ms), t0, limit);
        Watched { relay, sampler }
    }

    /// `VmHWM` (0 when unreadable), KiB, and a last scrape of `/metrics` if it answers.
    pub fn peak(&self) -> (u64, Option<Scrape>) {
        let hwm = status_kib(self.relay.pid, "VmHWM").unwrap_or(0);
        (hwm, self.relay.scrape().ok())
    }

    /// Kills `subscribers`, stops the relay and returns the samples.
    pub fn finish(self, mut subscribers: Vec<std::process::Child>) -> Vec<RssSample> {
        crate::proc::kill_all(&mut subscribers);
        self.relay.stop();
        self.sampler.finish()
    }
}

/// Least-squares slope of (x, y) points; `None` with fewer than 2 distinct x.
pub fn slope(points: &[(f64, f64)]) -> Option<f64> {
    let n = points.len() as f64;
    if points.len() < 2 {
        return None;
    }
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    (sxx > 0.0).then(|| sxy / sxx)
}

/// The machine's load averages (1, 5, 15 min) from `/proc/loadavg`.
pub fn load_average() -> Option<[f64; 3]> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let v: Vec<f64> = text
        .split_whitespace()
        .take(3)
        .filter_map(|f| f.parse().ok())
        .collect();
    Some([*v.first()?, *v.get(1)?, *v.get(2)?])
}

/// What one subscriber process wrote, from its stats records.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Written {
    /// Ledgers it wrote.
    pub ledgers: usize,
    /// First sequence it wrote.
    pub first_seq: Option<u32>,
    /// Last sequence it wrote.
    pub last_seq: Option<u32>,
}

impl Written {
    /// From the records of its stats file, in the order written.
    pub fn of(records: &[Record]) -> Written {
        Written {
            ledgers: records.len(),
            first_seq: records.first().map(|r| r.seq),
            last_seq: records.last().map(|r| r.seq),
        }
    }
}

/// Reads a stats CSV written by a process that may have been killed: a last line cut short
/// is left out. A missing file (killed before it was created) reads as empty.
pub fn read_stats_lenient(path: &Path) -> anyhow::Result<Vec<Record>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let whole = match text.rfind('\n') {
        Some(i) => &text[..=i],
        None => "",
    };
    parse_csv(whole).with_context(|| format!("parsing {}", path.display()))
}

/// Whether every stats file holds ledger `seq` (or a later one); the fanout and tiers benches
/// wait on it.
pub fn all_have(stats: &[PathBuf], seq: u32) -> bool {
    stats.iter().all(|p| {
        read_stats_lenient(p)
            .map(|r| r.last().is_some_and(|r| r.seq >= seq))
            .unwrap_or(false)
    })
}

/// Reads each stats file (see [`read_stats_lenient`]) and checks it holds exactly the ledgers
/// `want`, in order.
pub fn read_exact(
    stats: &[PathBuf],
    want: RangeInclusive<u32>,
) -> anyhow::Result<Vec<Vec<Record>>> {
    let (first, last) = (*want.start(), *want.end());
    let want: Vec<u32> = want.collect();
    let read = |p: &PathBuf| {
        let r = read_stats_lenient(p)?;
        let seqs: Vec<u32> = r.iter().map(|r| r.seq).collect();
        if seqs != want {
            bail!(
                "{}: wrote ledgers {:?}..{:?} ({}), not {first}..={last}",
                p.display(),
                seqs.first(),
                seqs.last(),
                seqs.len(),
            );
        }
        Ok(r)
    };
    stats.iter().map(read).collect()
}

/// Checks that `segments` (the sequences of one subscriber's successive processes) join into
/// one run with every step +1: no gap, no duplicate, no reordering, across restarts too.
pub fn check_contiguous(segments: &[Vec<u32>]) -> Result<(), String> {
    let mut prev: Option<(u32, usize)> = None;
    for (k, seg) in segments.iter().enumerate() {
        for &seq in seg {
            if let Some((p, pk)) = prev {
                if seq != p.wrapping_add(1) {
                    return Err(if pk == k {
                        format!("process {k}: {seq} after {p}")
                    } else {
                        format!("process {k} started at {seq} after process {pk} ended at {p}")
                    });
                }
            }
            prev = Some((seq, k));
        }
    }
    Ok(())
}

/// The last `n` lines of a log, newest first, joined by ` | ` (for error messages).
pub fn log_tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines().rev().take(n).collect::<Vec<_>>().join(" | ")
}

/// The last line of a log (for error messages).
pub fn last_line(path: &Path) -> String {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| {
            t.lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .map(str::to_owned)
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_relays_metrics() {
        let text = "# HELP ledger_relay_lagged_total Times.\n# TYPE ledger_relay_lagged_total counter\n\
                    ledger_relay_lagged_total 2\nledger_relay_ring_oldest 17\n\
                    ledger_relay_subscriber_lag_ledgers{session=\"3\",identity=\"sub-\\\"8\"} 41\n\
                    ledger_relay_subscriber_lanes{session=\"3\",identity=\"sub-\\\"8\",catching_up=\"true\"} 4\n\
                    ledger_relay_subscriber_lanes{session=\"4\",identity=\"sub-0\",catching_up=\"false\"} 2\n\
                    garbage line\n";
        let m = parse_metrics(text);
        assert_eq!(m.get("lagged_total"), 2.0);
        assert_eq!(m.get("ring_oldest"), 17.0);
        assert_eq!(m.get("absent"), 0.0);
        let slow: Vec<_> = m.sessions_of("sub-\"8").collect();
        assert_eq!(
            slow,
            vec![&SessionMetrics {
                identity: "sub-\"8".into(),
                catching_up: true,
                lanes: 4,
                lag: 41
            }]
        );
        assert!(!m.sessions[&4].catching_up);
    }

    #[test]
    fn contiguity_across_restarts() {
        assert!(check_contiguous(&[vec![5, 6, 7], vec![], vec![8, 9]]).is_ok());
        assert!(check_contiguous(&[vec![], vec![3]]).is_ok());
        let e = check_contiguous(&[vec![5, 6], vec![6, 7]]).unwrap_err();
        assert!(
            e.contains("process 1 started at 6 after process 0 ended at 6"),
            "{e}"
        );
        assert!(check_contiguous(&[vec![5, 7]]).is_err());
        assert!(check_contiguous(&[vec![5, 6], vec![8]]).is_err());
    }

    #[test]
    fn least_squares_slope() {
        let pts: Vec<(f64, f64)> = (0..10)
            .map(|i| (f64::from(i), 3.0 + 2.0 * f64::from(i)))
            .collect();
        assert!((slope(&pts).unwrap() - 2.0).abs() < 1e-9);
        assert_eq!(slope(&[(1.0, 1.0)]), None);
        assert_eq!(slope(&[(1.0, 1.0), (1.0, 2.0)]), None);
    }

    #[test]
    fn stats_of_a_killed_process() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s.csv");
        assert!(read_stats_lenient(&p).unwrap().is_empty());
        std::fs::write(
            &p,
            "seq,raw_bytes,wire_bytes,delivery_ms,inter_arrival_ms\n5,10,5,1.0,\n6,10,5,1.0,2.0\n7,1",
        )
        .unwrap();
        let r = read_stats_lenient(&p).unwrap();
        assert_eq!(r.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![5, 6]);
    }

    #[test]
    fn reads_own_memory() {
        let rss = status_kib(std::process::id(), "VmRSS").unwrap();
        assert!(rss > 0);
        assert!(status_kib(std::process::id(), "VmNope").is_none());
        let s = RssSampler::start(
            std::process::id(),
            Duration::from_millis(10),
            Instant::now(),
            1000,
        );
        std::thread::sleep(Duration::from_millis(60));
        let v = s.finish();
        assert!(v.len() >= 2, "{v:?}");
        assert!(v.windows(2).all(|w| w[0].t_s <= w[1].t_s));
    }
}
