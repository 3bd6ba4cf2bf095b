//! The one place relay and subscriber command lines are built ([`Cluster`]), the running
//! relay ([`RelayProc`]: its log, its `/metrics`), and the ephemeral CA they share.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::netem::{Netem, RELAY_ADDR};
use crate::procs::{kill_all, log_tail, sibling_binary, track, wait_with_cpu};
use crate::stats::Record;

/// An ephemeral CA in `dir`: `relay` (loopback and the emulated address), `sub-0` .. `sub-{n-1}`.
pub fn make_certs(dir: &Path, n: usize) -> anyhow::Result<()> {
    // Two days for the CA: a one-day leaf issued a second after a one-day CA would outlive it.
    let certs = ledger_relay_certs::CertDir::init(dir, 2)?;
    let names = ["localhost".into(), "127.0.0.1".into(), RELAY_ADDR.into()];
    certs.issue_server("relay", &names, 1)?;
    for i in 0..n.max(1) {
        certs.issue_client(&format!("sub-{i}"), 1)?;
    }
    Ok(())
}

/// The synthetic (or file) source of a relay and how it cuts, compresses and keeps ledgers.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RelaySettings {
    /// Ledger size, bytes.
    pub size: u64,
    /// zstd-1 ratio of the synthetic filler at the relay's chunk size (1: incompressible).
    pub ratio: f64,
    /// Ledgers the source emits (`None`: endless).
    pub count: Option<u32>,
    /// Sequence of the first ledger.
    pub start: u32,
    /// Time between ledgers, ms.
    pub cadence_ms: f64,
    /// Emit window, ms.
    pub emit_ms: f64,
    /// Chunk codec.
    pub codec: String,
    /// Raw bytes per chunk.
    pub chunk: u64,
    /// Ledgers kept in the ring.
    pub retention: u32,
}

impl RelaySettings {
    /// An endless synthetic source from ledger 2: 8 ms emit, zstd, 256 KiB chunks, 200 kept.
    pub fn endless(size: u64, ratio: f64, cadence_ms: f64) -> RelaySettings {
        RelaySettings {
            size,
            ratio,
            count: None,
            start: 2,
            cadence_ms,
            emit_ms: 8.0,
            codec: "zstd".into(),
            chunk: 256 << 10,
            retention: 200,
        }
    }

    /// The `synthetic:` source of these settings (the ratio calibrated at the chunk size).
    pub fn synthetic_source(&self) -> String {
        let count = self.count.map_or(String::new(), |n| format!(",count={n}"));
        let (size, ratio, start, chunk) = (self.size, self.ratio, self.start, self.chunk);
        format!("synthetic:size={size},ratio={ratio}{count},start={start},chunk={chunk}")
    }
}

/// How relays and subscribers are started: the CA, both ends' packet sizes, the relays' flags.
#[derive(Debug, Clone, Default)]
pub struct Cluster {
    /// The CA directory with the relay's and the subscribers' certificates.
    pub certs: PathBuf,
    /// `--max-mtu` of every subscriber and `[transport] max_mtu` of every relay.
    pub max_mtu: Option<u16>,
    /// `--min-mtu`, `min_mtu` likewise.
    pub min_mtu: Option<u16>,
    /// More flags for every relay.
    pub relay_extra: Vec<String>,
    /// More lines of every relay's `[transport]` table.
    pub transport: Vec<String>,
    /// Environment of every relay (a data lake's credentials).
    pub relay_env: Vec<(&'static str, String)>,
}

/// A running `ledger-relay run` with `--metrics`.
#[derive(Debug)]
pub struct RelayProc {
    child: Child,
    /// Its process id.
    pub pid: u32,
    /// The QUIC address subscribers connect to.
    pub addr: SocketAddr,
    /// The metrics address (loopback of its namespace).
    pub metrics: SocketAddr,
    /// Its namespace, if not this host's.
    pub ns: Option<String>,
    /// Its log (stderr, `RUST_LOG=info`).
    pub log: PathBuf,
}

impl Cluster {
    /// The workspace's binary `name`, in namespace `ns` when given, without stdin or stdout.
    fn command(ns: Option<&str>, name: &str) -> anyhow::Result<Command> {
        let mut cmd = Netem::exec_in(ns, &sibling_binary(name)?);
        cmd.stdin(Stdio::null()).stdout(Stdio::null());
        Ok(cmd)
    }

    /// Starts `ledger-relay run` on `source` under `dir`, in namespace `ns` on its IP (else
    /// loopback), with [`Cluster::relay_extra`] and `extra`; returns once its log says it listens.
    pub fn relay_in(
        &self,
        ns: Option<(&str, &str)>,
        dir: &Path,
        s: &RelaySettings,
        source: &str,
        extra: &[String],
    ) -> anyhow::Result<RelayProc> {
        std::fs::create_dir_all(dir)?;
        let ip = ns.map_or("127.0.0.1", |n| n.1);
        let port = UdpSocket::bind("127.0.0.1:0")?.local_addr()?.port();
        let addr: SocketAddr = format!("{ip}:{port}").parse()?;
        let metrics: SocketAddr = TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let log = dir.join("relay.log");
        let mut cmd = Self::command(ns.map(|n| n.0), "ledger-relay")?;
        // Every word but the paths and the source is ours and holds no space.
        let (c, e, k, r) = (s.cadence_ms, s.emit_ms, s.chunk, s.retention);
        let words = format!(
            "run --listen {addr} --name relay --codec {} --cadence {c}ms --emit {e}ms \
             --chunk-size {k} --retention {r} --metrics {metrics}",
            s.codec
        );
        cmd.args(words.split_whitespace())
            .arg("--certs")
            .arg(&self.certs)
            .arg("--data-dir")
            .arg(dir.join("data"))
            .args(["--source", source]);
        let mtus = [("max_mtu", self.max_mtu), ("min_mtu", self.min_mtu)];
        let mtus = mtus.map(|(key, mtu)| mtu.map(|m| format!("{key} = {m}")));
        let mut lines: Vec<String> = mtus.into_iter().flatten().collect();
        lines.extend(self.transport.iter().cloned());
        if !lines.is_empty() {
            let config = dir.join("relay-transport.toml");
            crate::report::write(&config, &format!("[transport]\n{}\n", lines.join("\n")))?;
            cmd.arg("--config").arg(config);
        }
        let child = cmd
            .args(self.relay_extra.iter().chain(extra))
            .envs(self.relay_env.iter().map(|(k, v)| (*k, v.as_str())))
            .env("RUST_LOG", "info")
            .stderr(File::create(&log)?)
            .spawn()
            .context("starting ledger-relay")?;
        track(&child);
        let ns = ns.map(|n| n.0.to_owned());
        let mut relay = RelayProc {
            pid: child.id(),
            child,
            addr,
            metrics,
            ns,
            log,
        };
        if let Err(e) = relay.wait_log("relay listening", Duration::from_secs(30)) {
            kill_all(std::slice::from_mut(&mut relay.child));
            return Err(e);
        }
        Ok(relay)
    }

    /// Starts `ledger-subscribe` for `spec` (in namespace `ns`) on `relays` as `--relay` takes
    /// them. One session writes to /dev/null (verified all the same); several write nowhere.
    pub fn subscriber(
        &self,
        ns: Option<&str>,
        relays: &str,
        spec: &SubSpec,
    ) -> anyhow::Result<Child> {
        let mut cmd = Self::command(ns, "ledger-subscribe")?;
        cmd.args([
            "--relay", relays, "--name", &spec.name, "--from", &spec.from, "--certs",
        ])
        .arg(&self.certs)
        .args(["--lanes", &spec.lanes.to_string(), "--stats"])
        .arg(&spec.stats);
        if spec.sessions > 1 {
            cmd.args(["--sessions", &spec.sessions.to_string()]);
        } else if !spec.extra.iter().any(|a| a == "--receive-only") {
            // (--receive-only writes nothing and refuses --out.)
            cmd.args(["--out", "/dev/null"]);
        }
        if let Some(n) = spec.count {
            cmd.args(["--count", &n.to_string()]);
        }
        for (flag, mtu) in [("--max-mtu", self.max_mtu), ("--min-mtu", self.min_mtu)] {
            if let Some(m) = mtu {
                cmd.args([flag, &m.to_string()]);
            }
        }
        let child = cmd
            .args(&spec.extra)
            .env("RUST_LOG", "warn")
            .stderr(File::create(&spec.log)?)
            .spawn()
            .context("starting ledger-subscribe")?;
        track(&child);
        Ok(child)
    }

    /// Runs `spec` for at most `within`: its records and CPU seconds, or its log's end (killed).
    pub fn run_subscriber(
        &self,
        ns: Option<&str>,
        relays: &str,
        spec: &SubSpec,
        within: Duration,
    ) -> anyhow::Result<(Vec<Record>, f64)> {
        let mut child = self.subscriber(ns, relays, spec)?;
        let done = wait_with_cpu(&mut child, Instant::now() + within)?;
        let tail = || log_tail(&spec.log, 3);
        match done {
            Some((st, cpu)) if st.success() => Ok((crate::stats::read_lenient(&spec.stats)?, cpu)),
            Some((st, _)) => bail!("ledger-subscribe {} failed ({st}): {}", spec.name, tail()),
            None => {
                kill_all(std::slice::from_mut(&mut child));
                bail!(
                    "ledger-subscribe {} took longer than {within:?}: {}",
                    spec.name,
                    tail()
                )
            }
        }
    }
}

impl RelayProc {
    /// Waits until the relay's log holds `what`; fails if it exits or `within` passes first.
    pub fn wait_log(&mut self, what: &str, within: Duration) -> anyhow::Result<()> {
        crate::procs::wait_log(&mut self.child, &self.log, what, within).context("the relay")
    }

    /// Waits until the relay's ring holds ledger `seq`; returns its newest.
    pub fn wait_newest(&mut self, seq: u32, within: Duration) -> anyhow::Result<u32> {
        let newest = |r: &RelayProc| r.scrape().map_or(0, |m| m.get("ring_newest") as u32);
        self.wait_until(&format!("ledger {seq} in its ring"), within, |r| {
            newest(r) >= seq
        })?;
        Ok(newest(self))
    }

    /// Polls `ready` every 20 ms; fails if the relay exits or `within` passes first.
    pub fn wait_until(
        &mut self,
        what: &str,
        within: Duration,
        mut ready: impl FnMut(&RelayProc) -> bool,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + within;
        while !ready(self) {
            self.check_alive()?;
            if Instant::now() > deadline {
                bail!("the relay did not show {what} within {within:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// Fails if the relay has exited.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        if let Some(st) = self.child.try_wait()? {
            bail!("the relay exited ({st}): {}", log_tail(&self.log, 5));
        }
        Ok(())
    }

    /// Scrapes `/metrics` (from inside its namespace).
    pub fn scrape(&self) -> anyhow::Result<Scrape> {
        let addr = self.metrics;
        let got = crate::netem::in_ns(self.ns.as_deref(), move || http(addr, "GET /metrics", ""));
        match got? {
            (200, body) => Ok(Scrape::parse(&String::from_utf8_lossy(&body))),
            (status, _) => bail!("GET /metrics: status {status}"),
        }
    }

    /// Stops the relay (SIGINT, then SIGKILL after 10 s); its exit status if it stopped by
    /// itself. (Dropped without a stop, as when a test fails, it is killed.)
    pub fn stop(mut self) -> Option<ExitStatus> {
        self.halt()
    }

    /// [`RelayProc::stop`] for an owner that cannot give the relay up (its `Drop`). A relay
    /// stopped so stops its `pipe:` source too; killed, it leaves the source running.
    pub fn halt(&mut self) -> Option<ExitStatus> {
        crate::procs::stop(&mut self.child, Duration::from_secs(10)).map(|(st, _)| st)
    }
}

impl Drop for RelayProc {
    fn drop(&mut self) {
        kill_all(std::slice::from_mut(&mut self.child));
    }
}

/// How a `ledger-subscribe` process is started.
#[derive(Debug, Clone)]
pub struct SubSpec {
    /// Certificate name.
    pub name: String,
    /// `--from`: a sequence or `tip`.
    pub from: String,
    /// `--count` (`None`: endless).
    pub count: Option<u32>,
    /// `--lanes`.
    pub lanes: u8,
    /// `--stats` file (with `--sessions K`, session k's is `STATS.k`).
    pub stats: PathBuf,
    /// Its stderr.
    pub log: PathBuf,
    /// `--sessions`: subscriptions this process holds.
    pub sessions: u16,
    /// More flags, after the others.
    pub extra: Vec<String>,
}

impl SubSpec {
    /// Subscriber `name`, one session, its stats in `dir/TAG.csv` and its stderr in `dir/TAG.log`.
    pub fn new(
        name: &str,
        from: impl ToString,
        count: Option<u32>,
        lanes: u8,
        dir: &Path,
        tag: &str,
    ) -> SubSpec {
        SubSpec {
            name: name.into(),
            from: from.to_string(),
            count,
            lanes,
            stats: dir.join(format!("{tag}.csv")),
            log: dir.join(format!("{tag}.log")),
            sessions: 1,
            extra: Vec::new(),
        }
    }

    /// The stats file of each subscription of this process, in session order.
    pub fn stats_files(&self) -> Vec<PathBuf> {
        if self.sessions <= 1 {
            return vec![self.stats.clone()];
        }
        let at = |k: u16| PathBuf::from(format!("{}.{k}", self.stats.display()));
        (0..self.sessions).map(at).collect()
    }
}

/// One plain HTTP/1.1 request on a fresh connection (5 s to connect, 10 s per read), with
/// `form` as a form body when not empty: the status and the body (at most 64 MiB).
pub fn http(addr: SocketAddr, method_path: &str, form: &str) -> anyhow::Result<(u16, Vec<u8>)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .with_context(|| format!("connecting to {addr}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.set_nodelay(true)?;
    let length = match form.len() {
        0 => String::new(),
        n => format!("Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {n}\r\n"),
    };
    // One write: a server that answers after its first read must not find the rest unread.
    let request = format!(
        "{method_path} HTTP/1.1\r\nHost: {addr}\r\n{length}Connection: close\r\n\r\n{form}"
    );
    s.write_all(request.as_bytes())?;
    let mut raw = Vec::new();
    s.take(64 << 20).read_to_end(&mut raw)?;
    let end =
        (raw.windows(4).position(|w| w == b"\r\n\r\n")).context("no end of the HTTP header")?;
    let head = String::from_utf8_lossy(&raw[..end]);
    let status = (head.split_whitespace().nth(1).and_then(|s| s.parse().ok()))
        .with_context(|| format!("no HTTP status in {:?}", head.escape_debug().to_string()))?;
    Ok((status, raw.split_off(end + 4)))
}

/// A parsed `/metrics` exposition: every sample by name without the `ledger_relay_` prefix,
/// labels included as written (`lane_rtt_seconds{lane="1"}`).
#[derive(Debug, Clone, Default)]
pub struct Scrape {
    /// Samples.
    pub values: BTreeMap<String, f64>,
}

impl Scrape {
    /// Parses the relay's Prometheus text; other lines are skipped.
    pub fn parse(text: &str) -> Scrape {
        let sample = |l: &str| {
            let (key, value) = l.rsplit_once(' ')?;
            let key = key.strip_prefix("ledger_relay_")?;
            Some((key.into(), value.trim().parse().ok()?))
        };
        let lines = text.lines().filter(|l| !l.starts_with('#'));
        let values = lines.filter_map(sample).collect();
        Scrape { values }
    }

    /// An unlabelled sample (0 when absent).
    pub fn get(&self, name: &str) -> f64 {
        self.values.get(name).copied().unwrap_or(0.0)
    }

    /// Every sample of `name` with its labels: `(labels, value)`.
    pub fn labelled<'a>(&'a self, name: &'a str) -> impl Iterator<Item = (&'a str, f64)> + 'a {
        (self.values.iter()).filter_map(move |(k, v)| {
            let labels = k.strip_prefix(name)?.strip_prefix('{')?.strip_suffix('}')?;
            Some((labels, *v))
        })
    }
}
