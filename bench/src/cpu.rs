//! `ledger-bench cpu`: CPU per raw ledger at its real size, in one process over loopback, for
//! bare quinn (one stream, the lanes' transport settings, mutual TLS 1.3), one TLS-over-TCP
//! flow (the TCP yardstick's TLS) and `ledger-relay demo --ratio 1 --codec none` (the product
//! end to end, its CPU split by thread group). The baselines' receivers discard the bytes; the
//! relay's subscriber reassembles.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::Bytes;
use ledger_relay_certs::CertDir;
use ledger_relay_certs::{load_certs, load_key};
use ledger_relay_cli::cputime;
use ledger_relay_transport::{tls, TransportSettings};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::report::Col;

/// `ledger-bench cpu` settings.
#[derive(Debug, Clone, clap::Args, serde::Serialize)]
pub struct CpuArgs {
    /// Ledgers counted per row, after the warm-up.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    pub ledgers: u32,
    /// Ledgers left out at the start of each row.
    #[arg(long, default_value_t = 2)]
    pub warmup: u32,
    /// Raw size of each ledger.
    #[arg(long, value_name = "SIZE", default_value = "14.5MiB", value_parser = ledger_relay_transport::parse_size)]
    pub size: u64,
    /// Time between ledgers.
    #[arg(long, value_name = "DURATION", default_value = "600ms", value_parser = ledger_relay_transport::parse_duration)]
    #[serde(skip)]
    pub cadence: Duration,
    /// Lanes of the relay row.
    #[arg(long, default_value_t = 4)]
    pub lanes: u8,
    /// Ledgers the relay row's ring keeps (`ledger-relay demo --retention`); fewer than the
    /// row's ledgers puts the ring at its steady state, where every append prunes the oldest.
    #[arg(long, default_value_t = 1000)]
    pub retention: u32,
    /// Raw bytes per chunk of the relay row (`ledger-relay demo --chunk-size`).
    #[arg(long, value_name = "SIZE", default_value = "256KiB", value_parser = ledger_relay_transport::parse_size)]
    pub chunk: u64,
    /// Largest UDP payload of the quinn and relay rows.
    #[arg(long)]
    pub max_mtu: Option<u16>,
    /// UDP payload the quinn and relay rows take the path to carry.
    #[arg(long)]
    pub min_mtu: Option<u16>,
    /// Generic segmentation offload in the quinn row (the `gso` transport setting; default on).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub gso: bool,
    /// ACK frequency in the quinn row: ack-eliciting packets the receiver may take before it
    /// must acknowledge (the `ack_eliciting_threshold` transport setting; 0: the standard).
    #[arg(long, default_value_t = 0)]
    pub ack_threshold: u32,
    /// Rows to run.
    #[arg(long, value_delimiter = ',', default_value = "quinn,tls-tcp,relay")]
    pub rows: Vec<CpuRow>,
    /// `--csv`, `--json` (no plots).
    #[command(flatten)]
    #[serde(skip)]
    pub output: crate::report::Output,
}

/// A row of `ledger-bench cpu`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CpuRow {
    /// Bare quinn: one connection, one stream.
    Quinn,
    /// One TLS-over-TCP flow.
    TlsTcp,
    /// `ledger-relay demo`, raw.
    Relay,
}

impl CpuRow {
    fn name(self) -> String {
        use clap::ValueEnum;
        self.to_possible_value()
            .map_or_else(String::new, |v| v.get_name().to_owned())
    }
}

/// What one row measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Measured {
    /// The row.
    pub row: CpuRow,
    /// Ledgers counted.
    pub ledgers: u32,
    /// Raw bytes per ledger.
    pub size: u64,
    /// CPU per ledger, both ends, ms.
    pub cpu_ms_per_ledger: f64,
    /// CPU per ledger by thread group, ms.
    pub split_ms: BTreeMap<String, f64>,
}

impl Measured {
    /// MB (10^6 bytes) moved per CPU-second.
    pub fn mb_per_cpu_s(&self) -> f64 {
        self.size as f64 / 1e6 / (self.cpu_ms_per_ledger / 1e3)
    }
}

/// Runs the rows and prints the table.
pub fn main(a: &CpuArgs) -> anyhow::Result<()> {
    let size = usize::try_from(a.size).context("--size")?;
    let mut transport = TransportSettings::default();
    transport.set_mtu(a.max_mtu, a.min_mtu);
    transport.gso = a.gso;
    transport.ack_eliciting_threshold = a.ack_threshold;
    let dir = tempfile::tempdir().context("temporary directory")?;
    let certs = CertDir::init(&dir.path().join("certs"), 2)?;
    certs.issue_server("relay", &["localhost".into(), "127.0.0.1".into()], 1)?;
    certs.issue_client("bench", 1)?;
    let run = Run {
        size,
        cadence: a.cadence,
        warmup: a.warmup,
        ledgers: a.ledgers,
        transport,
        certs: certs.path().to_path_buf(),
    };
    let mut rows = Vec::new();
    for row in &a.rows {
        eprintln!("ledger-bench cpu: {} ...", row.name());
        rows.push(match row {
            CpuRow::Quinn => run.quinn()?,
            CpuRow::TlsTcp => run.tls_tcp()?,
            CpuRow::Relay => run.relay(a)?,
        });
    }
    let csv = || crate::report::csv(&rows, &[]);
    a.output.emit(&table(&rows), csv, &rows)
}

/// The rows' table.
pub fn table(rows: &[Measured]) -> String {
    let cols: [Col<Measured>; 6] = [
        Col::l("row", 8, |m| m.row.name()),
        Col::r("ledgers", 8, |m| m.ledgers.to_string()),
        Col::r("MiB", 10, |m| format!("{:.1}", m.size as f64 / 1048576.0)),
        Col::r("CPU ms/ledger", 14, |m| {
            format!("{:.1}", m.cpu_ms_per_ledger)
        }),
        Col::r("MB/CPU-s", 12, |m| format!("{:.0}", m.mb_per_cpu_s())),
        Col::l(" split, ms per ledger", 0, |m| {
            let split = m.split_ms.iter().map(|(g, ms)| format!("{g} {ms:.1}"));
            format!(" {}", split.collect::<Vec<_>>().join(", "))
        }),
    ];
    crate::report::table_of(&cols, rows, 0, |_| None)
}

/// One row's settings.
struct Run {
    size: usize,
    cadence: Duration,
    warmup: u32,
    ledgers: u32,
    transport: TransportSettings,
    certs: PathBuf,
}

/// Thread names of the baselines' two ends.
const SENDER: &str = "bench-send";
const RECEIVER: &str = "bench-recv";

fn baseline_group(comm: &str) -> &'static str {
    match comm {
        c if c.starts_with(SENDER) => "sender",
        c if c.starts_with(RECEIVER) => "receiver",
        _ => "other",
    }
}

/// The receiver's count of whole ledgers, for the CPU readings at the warm-up's end and the last.
type Progress = Sender<u32>;

/// Tells `progress` of each whole ledger of `size` bytes in the `got` bytes received so far.
fn count(got: usize, size: usize, done: &mut u32, progress: &Progress) {
    while got >= size * (*done as usize + 1) {
        *done += 1;
        let _ = progress.send(*done);
    }
}

impl Run {
    fn total(&self) -> u32 {
        self.warmup + self.ledgers
    }

    /// Incompressible bytes (xorshift), one ledger's worth, shared by every send.
    fn payload(&self) -> Bytes {
        Bytes::from(crate::pipe::filler(self.size, 0x9e37_79b9_7f4a_7c15))
    }

    /// Runs the two ends on named threads (a single-threaded runtime each) and takes CPU readings
    /// when the receiver reports the last warm-up ledger and the last ledger.
    fn measure<S, R>(&self, row: CpuRow, sender: S, receiver: R) -> anyhow::Result<Measured>
    where
        S: FnOnce(Sender<SocketAddr>) -> anyhow::Result<()> + Send + 'static,
        R: FnOnce(Receiver<SocketAddr>, Progress) -> anyhow::Result<()> + Send + 'static,
    {
        let (addr_tx, addr_rx) = channel();
        let (progress_tx, progress_rx) = channel();
        // Each end holds its thread until the gate opens: its CPU shows even if it finished first.
        let gate = Arc::new(std::sync::RwLock::new(()));
        let held = gate.write().unwrap_or_else(|e| e.into_inner());
        let recv = spawn_gated(RECEIVER, &gate, move || receiver(addr_rx, progress_tx))?;
        let send = spawn_gated(SENDER, &gate, move || sender(addr_tx))?;
        let limit = self.cadence * (self.total() + 10) + Duration::from_secs(60);
        let deadline = Instant::now() + limit;
        let (mut start, mut end) = (None, None);
        while end.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            let Ok(n) = progress_rx.recv_timeout(left) else {
                break;
            };
            let reading = (cputime::process_cpu(), cputime::thread_cpu(baseline_group));
            if n == self.warmup {
                start = Some(reading);
            } else if n == self.total() {
                end = Some(reading);
            }
        }
        drop(held);
        // Either end may be stuck (a failed handshake leaves the other waiting): join only
        // what finished within a grace period, so a broken row fails with its cause.
        let grace = Instant::now() + Duration::from_secs(30);
        while !(send.is_finished() && recv.is_finished()) && Instant::now() < grace {
            std::thread::sleep(Duration::from_millis(50));
        }
        let (name, mut stuck) = (row.name(), Vec::new());
        for (side, handle) in [("sender", send), ("receiver", recv)] {
            if !handle.is_finished() {
                stuck.push(side);
                continue;
            }
            let joined = handle
                .join()
                .map_err(|_| anyhow::anyhow!("{name} {side} panicked"));
            joined?.with_context(|| format!("{name} {side}"))?;
        }
        let (true, Some((Some(c0), t0)), Some((Some(c1), t1))) = (stuck.is_empty(), start, end)
        else {
            bail!(
                "{name}: the receiver did not report {} ledgers within {limit:?} (stuck: {stuck:?})",
                self.total()
            );
        };
        let per = |d: Duration| d.as_secs_f64() * 1e3 / f64::from(self.ledgers);
        let split = cputime::since(&t0, t1)
            .into_iter()
            .map(|(g, d)| (g.to_string(), per(d)));
        Ok(Measured {
            row,
            ledgers: self.ledgers,
            size: self.size as u64,
            cpu_ms_per_ledger: per(c1.saturating_sub(c0)),
            split_ms: split.collect(),
        })
    }

    /// Bare quinn: one connection, one unidirectional stream carrying every ledger.
    fn quinn(&self) -> anyhow::Result<Measured> {
        let c = |f: &str| self.certs.join(f);
        let verifier = crate::yardstick::serve::verifier(&self.certs)?;
        let (chain, key) = (load_certs(&c("relay.pem"))?, load_key(&c("relay.key"))?);
        let server = tls::server_config(chain, key, verifier, &self.transport)?;
        let (chain, key) = (load_certs(&c("bench.pem"))?, load_key(&c("bench.key"))?);
        let client =
            tls::client_config(&load_certs(&c("ca.pem"))?, &[], chain, key, &self.transport)?;
        let transport = self.transport.clone();
        let payload = self.payload();
        let (total, cadence, size) = (self.total(), self.cadence, self.size);
        // The sender is the server, as the relay is: a lane's server lets its peer open no
        // unidirectional stream, and sends on streams of its own.
        let sender = move |addr_tx: Sender<SocketAddr>| {
            runtime()?.block_on(async move {
                let endpoint = endpoint(&transport, Some(server))?;
                addr_tx.send(endpoint.local_addr()?)?;
                let incoming = endpoint.accept().await.context("no connection")?;
                let conn = incoming.await?;
                let mut stream = conn.open_uni().await?;
                let mut tick = tokio::time::interval(cadence);
                for _ in 0..total {
                    tick.tick().await;
                    stream.write_chunk(payload.clone()).await?;
                }
                stream.finish()?;
                // Until the receiver has read everything (it closes the connection).
                let _ = conn.closed().await;
                eprintln!("quinn sender: {}", path_line(&conn.stats()));
                endpoint.wait_idle().await;
                Ok(())
            })
        };
        let transport = self.transport.clone();
        let receiver = move |addr_rx: Receiver<SocketAddr>, progress: Progress| {
            runtime()?.block_on(async move {
                let peer = addr_rx.recv_timeout(Duration::from_secs(30))?;
                let mut endpoint = endpoint(&transport, None)?;
                endpoint.set_default_client_config(client);
                let conn = endpoint.connect(peer, "localhost")?.await?;
                let mut stream = conn.accept_uni().await?;
                let (mut got, mut done) = (0, 0);
                while let Some(chunk) = stream.read_chunk(usize::MAX, true).await? {
                    got += chunk.bytes.len();
                    count(got, size, &mut done, &progress);
                }
                anyhow::ensure!(done == total, "received {done} of {total} ledgers");
                conn.close(0u32.into(), b"done");
                endpoint.wait_idle().await;
                Ok(())
            })
        };
        self.measure(CpuRow::Quinn, sender, receiver)
    }

    /// One TLS 1.3-over-TCP flow, mutual, the same provider and certificates.
    fn tls_tcp(&self) -> anyhow::Result<Measured> {
        // The TCP yardstick's TLS set-up, so this row is that flow.
        let server = crate::yardstick::serve::server_config(&self.certs, "relay")?;
        let client = crate::yardstick::client::client_config(&self.certs, "bench")?;
        let payload = self.payload();
        let (total, cadence, size) = (self.total(), self.cadence, self.size);
        // The sender is the TLS server, as the relay is.
        let sender = move |addr_tx: Sender<SocketAddr>| {
            runtime()?.block_on(async move {
                let local = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
                let listener = tokio::net::TcpListener::bind(local).await?;
                addr_tx.send(listener.local_addr()?)?;
                let (tcp, _) = listener.accept().await?;
                tcp.set_nodelay(true)?;
                let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
                let mut tls = acceptor.accept(tcp).await?;
                let mut tick = tokio::time::interval(cadence);
                for _ in 0..total {
                    tick.tick().await;
                    tls.write_all(&payload).await?;
                    tls.flush().await?;
                }
                tls.shutdown().await?;
                Ok(())
            })
        };
        let receiver = move |addr_rx: Receiver<SocketAddr>, progress: Progress| {
            runtime()?.block_on(async move {
                let peer = addr_rx.recv_timeout(Duration::from_secs(30))?;
                let tcp = tokio::net::TcpStream::connect(peer).await?;
                tcp.set_nodelay(true)?;
                let name = rustls::pki_types::ServerName::try_from("localhost")?;
                let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
                let mut tls = connector.connect(name, tcp).await?;
                let mut buf = vec![0u8; 256 << 10];
                let (mut got, mut done) = (0, 0);
                while let n @ 1.. = tls.read(&mut buf).await? {
                    got += n;
                    count(got, size, &mut done, &progress);
                }
                anyhow::ensure!(done == total, "received {done} of {total} ledgers");
                Ok(())
            })
        };
        self.measure(CpuRow::TlsTcp, sender, receiver)
    }

    /// `ledger-relay demo --ratio 1 --codec none`, its CPU lines parsed.
    fn relay(&self, a: &CpuArgs) -> anyhow::Result<Measured> {
        let mut cmd = std::process::Command::new(crate::procs::sibling_binary("ledger-relay")?);
        let words = format!(
            "demo --ratio 1 --codec none --ledgers {} --warmup {} --lanes {} --size {} \
             --cadence {}ms --retention {} --chunk-size {}",
            self.total(),
            self.warmup,
            a.lanes,
            a.size,
            a.cadence.as_secs_f64() * 1e3,
            a.retention,
            a.chunk
        );
        cmd.args(words.split_whitespace());
        for (flag, mtu) in [("--max-mtu", a.max_mtu), ("--min-mtu", a.min_mtu)] {
            if let Some(m) = mtu {
                cmd.args([flag, &m.to_string()]);
            }
        }
        let out = (cmd.stderr(std::process::Stdio::inherit()).output())
            .context("running ledger-relay demo")?;
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            bail!("ledger-relay demo failed ({}):\n{text}", out.status);
        }
        parse_demo(&text, self.ledgers, self.size as u64)
    }
}

/// The figures of `ledger-relay demo`'s CPU lines.
pub fn parse_demo(text: &str, ledgers: u32, size: u64) -> anyhow::Result<Measured> {
    let total = text
        .lines()
        .find_map(|l| {
            let rest = l.strip_prefix("cpu (")?;
            let at = rest.find("): ")?;
            rest[at + 3..].strip_suffix(" ms per ledger")?.parse().ok()
        })
        .with_context(|| format!("no CPU line in the demo's output:\n{text}"))?;
    let mut split = BTreeMap::new();
    let mut lines = text.lines();
    if let Some(line) = lines.find_map(|l| l.trim().strip_prefix("of which, ms per ledger: ")) {
        for part in line.split(", ") {
            if let Some((group, ms)) = part.rsplit_once(' ') {
                if let Ok(ms) = ms.parse::<f64>() {
                    split.insert(group.to_string(), ms);
                }
            }
        }
    }
    Ok(Measured {
        row: CpuRow::Relay,
        ledgers,
        size,
        cpu_ms_per_ledger: total,
        split_ms: split,
    })
}

/// What a QUIC sender did: path MTU, packets per send (GSO), losses, MTU probes, black holes.
fn path_line(s: &quinn::ConnectionStats) -> String {
    format!(
        "path MTU {} B, {} packets in {} sends ({:.1} per send), {} lost, {} MTU probes ({} lost), {} black holes, {} congestion events",
        s.path.current_mtu,
        s.udp_tx.datagrams,
        s.udp_tx.ios,
        s.udp_tx.datagrams as f64 / s.udp_tx.ios.max(1) as f64,
        s.path.lost_packets,
        s.path.sent_plpmtud_probes,
        s.path.lost_plpmtud_probes,
        s.path.black_holes_detected,
        s.path.congestion_events,
    )
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

/// `f` on a thread named `name` that ends only once `gate` opens.
fn spawn_gated<T: Send + 'static>(
    name: &str,
    gate: &Arc<std::sync::RwLock<()>>,
    f: impl FnOnce() -> T + Send + 'static,
) -> anyhow::Result<std::thread::JoinHandle<T>> {
    let gate = gate.clone();
    let gated = move || (f(), drop(gate.read())).0;
    Ok(std::thread::Builder::new().name(name.into()).spawn(gated)?)
}

/// A quinn endpoint on a loopback port, a server with `server`.
fn endpoint(
    t: &TransportSettings,
    server: Option<quinn::ServerConfig>,
) -> anyhow::Result<quinn::Endpoint> {
    let socket = ledger_relay_transport::udp_socket(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), t)?;
    Ok(ledger_relay_transport::endpoint(socket, server, t)?)
}
