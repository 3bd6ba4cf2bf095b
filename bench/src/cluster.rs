//! The spine of the subcommands: the argument groups they share ([`Transport`], [`Output`]),
//! the one place relay and subscriber command lines are built ([`Cluster`]), and the one way
//! a report is printed and written ([`Report`], [`emit`]).
//!
//! A subcommand is its arguments, the rows it plans, a [`Cluster`] per row, the rows it
//! measured and [`emit`].

use std::fs::File;
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::value_parser;

use crate::harness::{http_get, log_tail, parse_metrics, Scrape};

/// QUIC packet sizes of every relay and subscriber of a run (`--max-mtu`, `--min-mtu`).
#[derive(Debug, Clone, Copy, Default, clap::Args, serde::Serialize)]
pub struct Transport {
    /// Largest UDP payload of the QUIC lanes: every subscriber's `--max-mtu`, and
    /// `[transport] max_mtu` of every relay the bench starts [default: the transport's].
    #[arg(long)]
    pub max_mtu: Option<u16>,
    /// UDP payload the lanes take the path to carry (`--min-mtu`, `min_mtu`), same ends.
    #[arg(long)]
    pub min_mtu: Option<u16>,
}

/// `--json`: the whole report, what the table leaves out included, as JSON.
#[derive(Debug, Clone, Default, clap::Args, serde::Serialize)]
pub struct Json {
    /// Write the results (with every delivery or sample) as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

impl Json {
    /// Writes `value` to the `--json` file, if one was given.
    pub fn write(&self, value: &impl serde::Serialize) -> anyhow::Result<()> {
        match &self.json {
            Some(p) => crate::report::write(p, &serde_json::to_string_pretty(value)?),
            None => Ok(()),
        }
    }
}

/// The files a report is written to besides the table on stdout.
#[derive(Debug, Clone, Default, clap::Args, serde::Serialize)]
pub struct Files {
    /// Write the rows as CSV.
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    /// `--json`.
    #[command(flatten)]
    #[serde(flatten)]
    pub json: Json,
}

/// [`Files`] and plots.
#[derive(Debug, Clone, Default, clap::Args, serde::Serialize)]
pub struct Output {
    /// `--csv` and `--json`.
    #[command(flatten)]
    #[serde(flatten)]
    pub files: Files,
    /// Write the plots (SVG) in this directory.
    #[arg(long, value_name = "DIR")]
    pub plots: Option<PathBuf>,
}

/// Declares groups of one flag each (the flag's help their doc, `: Copy` when they can be); a
/// subcommand flattens one and changes its default or help with `mut_arg("FIELD", ...)`, and
/// a `--quick` preset its default with `default_value_if("quick", "true", ...)`.
macro_rules! one_flag_groups {
    ($($(#[doc = $doc:literal])* $group:ident $(: $copy:ident)? {
        $(#[$arg:meta])* $field:ident: $ty:ty
    })*) => {$(
        $(#[doc = $doc])*
        #[derive(Debug, Clone, clap::Args, serde::Serialize $(, $copy)?)]
        pub struct $group {
            $(#[doc = $doc])*
            $(#[$arg])*
            pub $field: $ty,
        }
    )*};
}

one_flag_groups! {
    /// Time between ledgers (`600ms`, `1s`; a bare number is milliseconds, as the old
    /// `--cadence-ms` took).
    Cadence: Copy {
        #[arg(long = "cadence", alias = "cadence-ms", value_name = "DURATION",
            value_parser = cadence_ms, default_value = "600ms")]
        cadence_ms: f64
    }
    /// Raw size of each ledger (`14.5MiB`, `594KiB`; a bare number is bytes, as the old
    /// `--ledger-bytes` took).
    Size: Copy {
        #[arg(long = "size", alias = "ledger-bytes", value_name = "SIZE",
            value_parser = size_bytes, default_value = "14.5MiB")]
        ledger_bytes: u64
    }
    /// Relay chunk size (`256KiB`; a bare number is bytes; `--chunk-size` and `--chunk`, the
    /// spellings of `cpu` and `lanes`, are kept).
    Chunk: Copy {
        #[arg(long, aliases = ["chunk-size", "chunk"], value_name = "SIZE",
            value_parser = size_bytes, default_value = "262144")]
        chunk_bytes: u64
    }
    /// Ledgers measured per row (after the warm-up).
    Ledgers: Copy {
        #[arg(long, default_value_t = 20, value_parser = value_parser!(u32).range(1..))]
        ledgers: u32
    }
    /// Lanes per subscriber.
    Lanes: Copy {
        #[arg(long, default_value_t = 4, value_parser = value_parser!(u8).range(1..))]
        lanes: u8
    }
    /// Lane counts to run, one row each (also `--lanes 1,2,4,8`, the spelling operators use).
    LaneCounts {
        #[arg(long = "lane-counts", visible_alias = "lanes", value_delimiter = ',',
            default_value = "1,2,4,8")]
        #[serde(rename = "lanes")]
        counts: Vec<u8>
    }
    /// Ledgers the relay's ring keeps.
    Retention: Copy {
        #[arg(long, default_value_t = 1000, value_parser = value_parser!(u32).range(1..))]
        retention: u32
    }
    /// A shorter preset.
    Quick: Copy { #[arg(long)] quick: bool }
    /// Subscribers.
    Subscribers: Copy {
        #[arg(long, default_value_t = 8, value_parser = value_parser!(u16).range(1..))]
        subscribers: u16
    }
    /// Per-flow cap, Mbit/s.
    FlowCap: Copy { #[arg(long, default_value_t = 100.0)] flow_mbit: f64 }
    /// Directory holding testnet/testnet-1410048-1410367.lcm-v0.framed.xdr.
    Testdata {
        #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata"))]
        testdata: PathBuf
    }
    /// Run only those with these names (repeatable) [default: all].
    Only { #[arg(long, value_name = "NAME")] only: Vec<String> }
    /// Runs of each row; the table shows every run.
    Repeat: Copy {
        #[arg(long, default_value_t = 1, value_parser = value_parser!(u32).range(1..))]
        repeat: u32
    }
    /// Relay VmRSS sampling interval, ms.
    RssInterval: Copy {
        #[arg(long, default_value_t = 1000, value_parser = value_parser!(u64).range(10..))]
        rss_interval_ms: u64
    }
    /// Seconds of the idle phase.
    Idle: Copy { #[arg(long, default_value_t = 3.0)] idle_s: f64 }
    /// Ledgers of a baseline, to send or to receive.
    Count: Copy { #[arg(long)] count: u32 }
    /// Emit window of the source, ms.
    Emit: Copy { #[arg(long, default_value_t = 8.0)] emit_ms: f64 }
    /// zstd-1 ratio of the synthetic ledgers at the relay's chunk size (1: incompressible).
    Ratio: Copy { #[arg(long, default_value_t = 7.6)] ratio: f64 }
    /// Payloads of the series.
    Payloads {
        #[arg(long, value_enum, value_delimiter = ',', default_value = "compressed,raw")]
        payload: Vec<crate::fanout::Payload>
    }
    /// Relay codec.
    Codec {
        #[arg(long, default_value = "zstd", value_parser = ["zstd", "lz4", "none"])]
        codec: String
    }
}

/// [`Ledgers`] and `--warmup`, the ledgers at the start of each subscriber or row left out of
/// the figures (3).
#[derive(Debug, Clone, Copy, clap::Args, serde::Serialize)]
pub struct Series {
    /// `--ledgers`.
    #[command(flatten)]
    #[serde(flatten)]
    pub count: Ledgers,
    /// Ledgers left out at the start of each subscriber or row (handshakes, window growth,
    /// allocations).
    #[arg(long, default_value_t = 3)]
    pub warmup: u32,
}

/// [`Lanes`], [`Size`] and [`Ratio`]: the synthetic ledgers a fan-out or tier row streams, and
/// the lanes each subscriber opens.
#[derive(Debug, Clone, Copy, clap::Args, serde::Serialize)]
pub struct Stream {
    /// `--lanes`.
    #[command(flatten)]
    #[serde(flatten)]
    pub lanes: Lanes,
    /// `--size`.
    #[command(flatten)]
    #[serde(flatten)]
    pub size: Size,
    /// `--ratio`.
    #[command(flatten)]
    #[serde(flatten)]
    pub ratio: Ratio,
}

impl Series {
    /// Fails unless `--ledgers` exceeds `--warmup`.
    pub fn check(&self) -> anyhow::Result<()> {
        if self.count.ledgers <= self.warmup {
            anyhow::bail!("--ledgers must exceed --warmup ({})", self.warmup);
        }
        Ok(())
    }
}

/// The synthetic ledgers a relay serves and how it cuts and compresses them: `--size`,
/// `--chunk-bytes`, `--ratio`, `--codec`, for the subcommands that take all four.
#[derive(Debug, Clone, clap::Args, serde::Serialize)]
pub struct Workload {
    /// `--size`.
    #[command(flatten)]
    #[serde(flatten)]
    pub size: Size,
    /// `--chunk-bytes`.
    #[command(flatten)]
    #[serde(flatten)]
    pub chunk: Chunk,
    /// `--ratio`.
    #[command(flatten)]
    #[serde(flatten)]
    pub ratio: Ratio,
    /// `--codec`.
    #[command(flatten)]
    #[serde(flatten)]
    pub codec: Codec,
}

/// What `slow-subscriber` and `load` share: one relay on loopback serving synthetic ledgers to
/// `--subscribers` subscribers of `--lanes` lanes, its memory sampled every
/// `--rss-interval-ms`, the report written as `--json`. Each changes the defaults it needs.
#[derive(Debug, Clone, clap::Args, serde::Serialize)]
pub struct LoopbackRun {
    /// `--subscribers`.
    #[command(flatten)]
    #[serde(flatten)]
    pub subscribers: Subscribers,
    /// `--size`, `--chunk-bytes`, `--ratio`, `--codec`.
    #[command(flatten)]
    #[serde(flatten)]
    pub workload: Workload,
    /// `--cadence`.
    #[command(flatten)]
    #[serde(flatten)]
    pub cadence: Cadence,
    /// `--emit-ms`.
    #[command(flatten)]
    #[serde(flatten)]
    pub emit: Emit,
    /// `--lanes`.
    #[command(flatten)]
    #[serde(flatten)]
    pub lanes: Lanes,
    /// `--retention`.
    #[command(flatten)]
    #[serde(flatten)]
    pub retention: Retention,
    /// `--rss-interval-ms`.
    #[command(flatten)]
    #[serde(flatten)]
    pub rss: RssInterval,
    /// `--json`.
    #[command(flatten)]
    #[serde(flatten)]
    pub json: Json,
}

impl LoopbackRun {
    /// The relay settings of these ledgers (an endless source), `retention` ledgers kept.
    pub fn relay(&self, retention: u32) -> RelaySettings {
        (self.workload).relay(self.cadence.cadence_ms, self.emit.emit_ms, retention)
    }

    /// [`Workload::pace`] at `--cadence`.
    pub fn pace(&self) -> String {
        self.workload.pace(self.cadence.cadence_ms)
    }

    /// [`check_source`] of these flags.
    pub fn check(&self) -> anyhow::Result<()> {
        check_source(&self.cadence, &self.emit, &self.workload.chunk)
    }
}

/// A subcommand's arguments `A` parsed from `argv`, for tests.
#[cfg(test)]
pub(crate) fn parse<A: clap::Args + clap::FromArgMatches>(argv: &[&str]) -> A {
    let cmd = A::augment_args(clap::Command::new("test"));
    let m = cmd.get_matches_from(std::iter::once("test").chain(argv.iter().copied()));
    A::from_arg_matches(&m).unwrap()
}

/// Fails unless the source's emit window fits in its cadence and the relay takes the chunks.
pub fn check_source(cadence: &Cadence, emit: &Emit, chunk: &Chunk) -> anyhow::Result<()> {
    if !(emit.emit_ms >= 0.0 && emit.emit_ms <= cadence.cadence_ms) {
        anyhow::bail!("--cadence must be at least --emit-ms");
    }
    if chunk.chunk_bytes < 4096 {
        anyhow::bail!("--chunk-bytes must be at least 4096 (the relay's minimum)");
    }
    Ok(())
}

/// Parses `--size` to bytes (positive).
pub fn size_bytes(s: &str) -> Result<u64, String> {
    match ledger_relay_transport::parse_size(s) {
        Ok(0) => Err("the size must be positive".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// Parses `--cadence` to milliseconds: a duration in the transport's grammar (`600ms`, `2s`),
/// or a bare number of milliseconds (how the old `--cadence-ms`, kept as a hidden alias, was
/// spelled, so recorded commands still run).
pub fn cadence_ms(s: &str) -> Result<f64, String> {
    let ms = match s.trim().parse::<f64>() {
        Ok(ms) => ms,
        Err(_) => {
            ledger_relay_transport::parse_duration(s)
                .map_err(|e| e.to_string())?
                .as_secs_f64()
                * 1e3
        }
    };
    if !ms.is_finite() || ms <= 0.0 {
        return Err(format!("the cadence must be positive, not {s}"));
    }
    Ok(ms)
}

/// What a subcommand measured, as printed on stdout.
pub trait Table: serde::Serialize {
    /// The table printed on stdout.
    fn table(&self) -> String;
    /// The targets computed from the rows (printed after the table).
    fn targets(&self) -> String {
        String::new()
    }
}

/// What a subcommand that takes [`Files`] measured, in every form it is given.
pub trait Report: Table {
    /// The rows as CSV.
    fn csv(&self) -> String;
    /// Draws the plots in `dir`; returns what it wrote. Only subcommands that take `--plots`
    /// ([`Output`]) are asked.
    fn plots(&self, dir: &Path) -> anyhow::Result<String> {
        anyhow::bail!("no plots for {}", dir.display())
    }
}

/// Everything a series measured: its arguments, the machine's load around it, what is
/// particular to the subcommand (`X`, flattened into the JSON) and the rows.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Measured<A, R, X = ()> {
    /// The arguments.
    pub args: A,
    /// The machine's load averages before.
    pub load_before: Option<[f64; 3]>,
    /// After.
    pub load_after: Option<[f64; 3]>,
    /// What is particular to the subcommand.
    #[serde(flatten)]
    pub extra: X,
    /// The rows.
    pub rows: Vec<R>,
}

/// A fresh temporary working directory `PREFIX...` for a run's certificates, data and logs.
pub fn work_dir(prefix: &str) -> anyhow::Result<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .context("creating a temporary directory")
}

/// Keeps `tmp` (logs and all) when `LEDGER_BENCH_KEEP` is set; otherwise it goes when dropped,
/// after the caller's last read of it.
pub fn keep_if_asked(tmp: &mut tempfile::TempDir) {
    if std::env::var_os("LEDGER_BENCH_KEEP").is_some() {
        tmp.disable_cleanup(true);
        eprintln!("ledger-bench: logs kept in {}", tmp.path().display());
    }
}

/// Prints `report`'s table and targets and writes what `out` asks for. A plot that cannot be
/// drawn is reported on stderr and does not fail the run (the rows are already measured).
pub fn emit<R: Report>(report: &R, out: &Output) -> anyhow::Result<()> {
    emit_files(report, &out.files)?;
    if let Some(d) = &out.plots {
        match report.plots(d) {
            Ok(f) => eprintln!("ledger-bench: plot: {f}"),
            Err(e) => eprintln!("ledger-bench: no plot: {e:#}"),
        }
    }
    Ok(())
}

/// [`emit`] for a subcommand without plots.
pub fn emit_files<R: Report>(report: &R, files: &Files) -> anyhow::Result<()> {
    print(report);
    if let Some(p) = &files.csv {
        crate::report::write(p, &report.csv())?;
    }
    files.json.write(report)
}

/// [`emit`] for a subcommand that writes only `--json`.
pub fn emit_json<R: Table>(report: &R, json: &Json) -> anyhow::Result<()> {
    print(report);
    json.write(report)
}

fn print<R: Table>(report: &R) {
    print!("{}", report.table());
    print!("{}", report.targets());
}

/// The processes of one row: the binaries, the CA, the transport settings and the flags every
/// relay and every subscriber of the row takes. Every relay and subscriber command line is
/// built here ([`Cluster::relay`], [`Cluster::subscriber`]); a per-subscriber flag goes in
/// [`SubSpec::extra`].
#[derive(Debug, Clone)]
pub struct Cluster {
    /// The ephemeral CA with the relay's and the subscribers' certificates.
    pub certs: PathBuf,
    /// Packet sizes of both ends.
    pub transport: Transport,
    /// More flags for every relay.
    pub relay_extra: Vec<String>,
    /// Environment of every relay (a data lake's credentials).
    pub relay_env: Vec<(&'static str, String)>,
}

impl Cluster {
    /// On this host, with the binaries built next to this executable (looked up when a
    /// process starts: a host that only subscribes needs no `ledger-relay`).
    pub fn local(certs: &Path, transport: Transport) -> anyhow::Result<Cluster> {
        Ok(Cluster {
            certs: certs.to_owned(),
            transport,
            relay_extra: Vec::new(),
            relay_env: Vec::new(),
        })
    }

    /// `ledger-relay demo` (relay and subscribers in one process, no CA) with `transport`'s
    /// flags; the caller adds the workload's and runs it.
    pub fn demo(transport: Transport) -> anyhow::Result<Command> {
        let mut cmd = Command::new(crate::proc::sibling_binary("ledger-relay")?);
        cmd.arg("demo")
            .args(crate::proc::mtu_flags(transport.max_mtu, transport.min_mtu));
        Ok(cmd)
    }

    /// Starts `ledger-relay run` with data under `dir`, the synthetic source of `s`, the
    /// transport settings, [`Cluster::relay_extra`] and then `extra`.
    pub fn relay(
        &self,
        dir: &Path,
        s: &RelaySettings,
        extra: &[String],
    ) -> anyhow::Result<RelayProc> {
        self.relay_in(None, dir, s, &s.synthetic_source(), extra)
    }

    /// [`Cluster::relay`] on `source` (`relay:ADDR` for an edge), in network namespace `ns`
    /// listening on its address (from [`crate::netem`]) when given.
    pub fn relay_in(
        &self,
        ns: Option<(&str, &str)>,
        dir: &Path,
        s: &RelaySettings,
        source: &str,
        extra: &[String],
    ) -> anyhow::Result<RelayProc> {
        std::fs::create_dir_all(dir)?;
        let t = self.transport;
        let mut all = crate::proc::mtu_config(dir, t.max_mtu, t.min_mtu)?;
        all.extend(self.relay_extra.iter().cloned());
        all.extend(extra.iter().cloned());
        let ip = ns.map_or("127.0.0.1", |n| n.1);
        let addr: SocketAddr = format!("{ip}:{}", free_udp_port()?).parse()?;
        let metrics: SocketAddr = format!("127.0.0.1:{}", free_tcp_port()?).parse()?;
        let log = dir.join("relay.log");
        let child = self
            .command(ns.map(|n| n.0), "ledger-relay")?
            .arg("run")
            .args(["--listen", &addr.to_string(), "--certs"])
            .arg(&self.certs)
            .args(["--name", "relay", "--data-dir"])
            .arg(dir.join("data"))
            .args(["--source", source])
            .args(["--cadence", &format!("{}ms", s.cadence_ms)])
            .args(["--emit", &format!("{}ms", s.emit_ms)])
            .args(["--codec", &s.codec, "--chunk-size", &s.chunk.to_string()])
            .args(["--retention", &s.retention.to_string()])
            .args(["--metrics", &metrics.to_string()])
            .args(&all)
            .envs(self.relay_env.iter().map(|(k, v)| (*k, v.as_str())))
            .env("RUST_LOG", "info")
            .stderr(File::create(&log)?)
            .spawn()
            .context("starting ledger-relay")?;
        crate::proc::track(&child);
        let mut relay = RelayProc {
            pid: child.id(),
            child,
            addr,
            metrics,
            log,
        };
        if let Err(e) = relay.wait_log("relay listening", Duration::from_secs(30)) {
            crate::proc::kill_all(std::slice::from_mut(&mut relay.child));
            return Err(e);
        }
        Ok(relay)
    }

    /// Runs `spec` ([`Cluster::subscriber_to`]) to its end, for at most `within`; returns the
    /// records of its stats file and its CPU seconds. Fails with the end of its log when it
    /// exits non-zero or takes longer (then it is killed).
    pub fn run_subscriber(
        &self,
        ns: Option<&str>,
        relays: &str,
        spec: &SubSpec,
        within: Duration,
    ) -> anyhow::Result<(Vec<crate::stats::Record>, f64)> {
        let mut child = self.subscriber_to(ns, relays, spec)?;
        let done = crate::proc::wait_with_cpu(&mut child, Instant::now() + within)?;
        let tail = || log_tail(&spec.log, 3);
        match done {
            Some((st, cpu)) if st.success() => Ok((crate::stats::read_csv(&spec.stats)?, cpu)),
            Some((st, _)) => bail!("ledger-subscribe {} failed ({st}): {}", spec.name, tail()),
            None => {
                crate::proc::kill_all(std::slice::from_mut(&mut child));
                bail!(
                    "ledger-subscribe {} took longer than {within:?}: {}",
                    spec.name,
                    tail()
                )
            }
        }
    }

    /// The workspace's binary `name` on this host, or in network namespace `ns` when given,
    /// with no stdin or stdout.
    fn command(&self, ns: Option<&str>, name: &str) -> anyhow::Result<Command> {
        let program = crate::proc::sibling_binary(name)?;
        let mut cmd = crate::netem::Netem::exec_in(ns, &program);
        cmd.stdin(Stdio::null()).stdout(Stdio::null());
        Ok(cmd)
    }

    /// Starts `ledger-subscribe` for `spec` against `relay` with the transport settings
    /// (its [`SubSpec::extra`] flags come last).
    pub fn subscriber(&self, relay: SocketAddr, spec: &SubSpec) -> anyhow::Result<Child> {
        self.subscriber_to(None, &relay.to_string(), spec)
    }

    /// [`Cluster::subscriber`] in network namespace `ns` when given, to `relays` as `--relay`
    /// takes them (`HOST:PORT`, or `A,B` for `--hedge`). It writes ledgers to /dev/null
    /// (verified all the same: order, checksums and the hash chain) unless it holds several
    /// sessions.
    pub fn subscriber_to(
        &self,
        ns: Option<&str>,
        relays: &str,
        spec: &SubSpec,
    ) -> anyhow::Result<Child> {
        let mut cmd = self.command(ns, "ledger-subscribe")?;
        cmd.args(["--relay", relays, "--certs"])
            .arg(&self.certs)
            .args(["--name", &spec.name, "--from", &spec.from])
            .args(["--lanes", &spec.lanes.to_string()])
            .arg("--stats")
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
        if let Some(d) = spec.consume_delay_ms {
            cmd.args(["--consume-delay", &format!("{d}ms")]);
        }
        let child = cmd
            .args(crate::proc::mtu_flags(
                self.transport.max_mtu,
                self.transport.min_mtu,
            ))
            .args(&spec.extra)
            .env("RUST_LOG", "warn")
            .stderr(File::create(&spec.log)?)
            .spawn()
            .context("starting ledger-subscribe")?;
        crate::proc::track(&child);
        Ok(child)
    }
}

/// The synthetic source and the relay settings of a run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RelaySettings {
    /// Ledger size, bytes.
    pub size: u64,
    /// zstd-1 ratio of the synthetic filler at the relay's chunk size (1 = incompressible).
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
    /// Ledgers kept in the ring (`--retention`).
    pub retention: u32,
}

impl RelaySettings {
    /// The `synthetic:` source of these settings.
    pub fn synthetic_source(&self) -> String {
        let mut source = format!("synthetic:size={},ratio={}", self.size, self.ratio);
        if let Some(n) = self.count {
            source.push_str(&format!(",count={n}"));
        }
        // chunk=: the ratio is calibrated for the relay's chunk size, as in the main bench.
        source.push_str(&format!(",start={},chunk={}", self.start, self.chunk));
        source
    }

    /// An endless synthetic source from ledger 2 of `size`-byte ledgers at `ratio`, one per
    /// `cadence_ms`, with the relay's defaults for the rest: emitted over 8 ms, zstd, 256 KiB
    /// chunks, 200 ledgers kept. Callers change what their run sets.
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
}

impl Workload {
    /// The relay settings of an endless synthetic source of these ledgers from ledger 2, one
    /// per `cadence_ms` emitted over `emit_ms`, `retention` ledgers kept.
    pub fn relay(&self, cadence_ms: f64, emit_ms: f64, retention: u32) -> RelaySettings {
        RelaySettings {
            emit_ms,
            codec: self.codec.codec.clone(),
            chunk: self.chunk.chunk_bytes,
            retention,
            ..RelaySettings::endless(self.size.ledger_bytes, self.ratio.ratio, cadence_ms)
        }
    }

    /// `every C ms, CODEC ratio R, chunk B B` (for the summaries).
    pub fn pace(&self, cadence_ms: f64) -> String {
        format!(
            "every {cadence_ms} ms, {} ratio {}, chunk {} B",
            self.codec.codec, self.ratio.ratio, self.chunk.chunk_bytes
        )
    }

    /// The ledger size, KiB.
    pub fn kib(&self) -> f64 {
        self.size.ledger_bytes as f64 / 1024.0
    }
}

/// A running `ledger-relay run` on loopback with `--metrics`.
#[derive(Debug)]
pub struct RelayProc {
    pub(crate) child: Child,
    /// Its process id.
    pub pid: u32,
    /// The QUIC address subscribers connect to.
    pub addr: SocketAddr,
    /// The metrics address.
    pub metrics: SocketAddr,
    /// Its log (stderr, `RUST_LOG=info`).
    pub log: PathBuf,
}

impl RelayProc {
    /// Waits until the relay's log holds `what`; fails if it exits or `within` passes first.
    pub fn wait_log(&mut self, what: &str, within: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + within;
        loop {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            if text.contains(what) {
                return Ok(());
            }
            self.check_alive()?;
            if Instant::now() > deadline {
                bail!("the relay's log did not show {what:?} within {within:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Fails if the relay has exited.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        if let Some(st) = self.child.try_wait()? {
            bail!("the relay exited ({st}): {}", log_tail(&self.log, 5));
        }
        Ok(())
    }

    /// Scrapes `/metrics`.
    pub fn scrape(&self) -> anyhow::Result<Scrape> {
        Ok(parse_metrics(&http_get(self.metrics, "/metrics")?))
    }

    /// Stops the relay (SIGINT, then SIGKILL after 10 s); returns its exit status if it stopped
    /// by itself.
    pub fn stop(mut self) -> Option<ExitStatus> {
        crate::proc::stop(&mut self.child, Duration::from_secs(10)).map(|(st, _)| st)
    }
}

/// How a `ledger-subscribe` process is started.
#[derive(Debug, Clone)]
pub struct SubSpec {
    /// Certificate name (`sub-N`).
    pub name: String,
    /// `--from`: a sequence or `tip`.
    pub from: String,
    /// `--count`.
    pub count: Option<u32>,
    /// `--lanes`.
    pub lanes: u8,
    /// `--stats` file.
    pub stats: PathBuf,
    /// Its stderr.
    pub log: PathBuf,
    /// `--consume-delay`, ms.
    pub consume_delay_ms: Option<f64>,
    /// `--sessions`: subscriptions this process holds, each verified and written nowhere, its
    /// stats in `STATS.k` (see [`SubSpec::stats_files`]); 1 is one subscription written to
    /// /dev/null with its stats in `stats`.
    pub sessions: u16,
    /// More flags for this subscriber, after the others.
    pub extra: Vec<String>,
}

impl SubSpec {
    /// Subscriber `name` (its client certificate) from `from` (a sequence or `tip`) for
    /// `count` ledgers (`None`: endless) on `lanes` lanes, its stats in `dir/TAG.csv` and its
    /// stderr in `dir/TAG.log`: one session written to /dev/null, no consume delay, no more
    /// flags (set those with `SubSpec { .., ..SubSpec::new(..) }`).
    pub fn new(
        name: impl Into<String>,
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
            consume_delay_ms: None,
            sessions: 1,
            extra: Vec::new(),
        }
    }

    /// The stats file of each subscription of this process, in session order.
    pub fn stats_files(&self) -> Vec<PathBuf> {
        if self.sessions <= 1 {
            return vec![self.stats.clone()];
        }
        (0..self.sessions)
            .map(|k| {
                let mut name = self.stats.as_os_str().to_owned();
                name.push(format!(".{k}"));
                PathBuf::from(name)
            })
            .collect()
    }
}

/// Waits for `child` (a subscriber) to exit, killing it and failing after `limit`.
pub fn wait_child(child: &mut Child, limit: Duration) -> anyhow::Result<ExitStatus> {
    let start = Instant::now();
    loop {
        if let Some(st) = child.try_wait()? {
            return Ok(st);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            bail!("the subscriber did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A free UDP port on loopback (bound, read and released: another process could take it in
/// between, which on a bench machine does not happen in practice).
fn free_udp_port() -> anyhow::Result<u16> {
    Ok(UdpSocket::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A free TCP port on loopback (see [`free_udp_port`]).
fn free_tcp_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Probe {
        #[command(flatten)]
        transport: Transport,
        #[command(flatten)]
        out: Output,
    }

    #[test]
    fn the_groups_parse_their_flags_and_default_to_nothing() {
        let p = Probe::try_parse_from(["x"]).unwrap();
        assert_eq!((p.transport.max_mtu, p.transport.min_mtu), (None, None));
        assert!(
            p.out.files.csv.is_none() && p.out.files.json.json.is_none() && p.out.plots.is_none()
        );
        let p = Probe::try_parse_from(["x", "--max-mtu", "8952", "--csv", "a.csv"]).unwrap();
        assert_eq!(p.transport.max_mtu, Some(8952));
        assert_eq!(p.out.files.csv.as_deref(), Some(Path::new("a.csv")));
        assert!(Probe::try_parse_from(["x", "--max-mtu", "70000"]).is_err());
    }

    #[test]
    fn the_cadence_takes_units_or_bare_milliseconds() {
        assert_eq!(cadence_ms("600ms"), Ok(600.0));
        assert_eq!(cadence_ms("2s"), Ok(2000.0));
        assert_eq!(cadence_ms("12.5"), Ok(12.5));
        assert!(cadence_ms("0").is_err());
        assert!(cadence_ms("-3").is_err());
        assert!(cadence_ms("fast").is_err());
    }

    #[test]
    fn a_measured_series_keeps_its_json_keys_with_or_without_extras() {
        #[derive(serde::Serialize)]
        struct Extra {
            hedge_skipped: Option<String>,
        }
        let plain = Measured {
            args: 1u8,
            load_before: None,
            load_after: Some([1.0, 2.0, 3.0]),
            extra: (),
            rows: vec![7u8],
        };
        let v = serde_json::to_value(&plain).unwrap();
        let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["args", "load_before", "load_after", "rows"]);
        assert_eq!(v["rows"][0], 7);
        let with = Measured {
            args: 1u8,
            load_before: None,
            load_after: None,
            extra: Extra {
                hedge_skipped: Some("not root".into()),
            },
            rows: Vec::<u8>::new(),
        };
        let v = serde_json::to_value(&with).unwrap();
        assert_eq!(v["hedge_skipped"], "not root");
        assert_eq!(v.as_object().unwrap().len(), 5);
    }
}
