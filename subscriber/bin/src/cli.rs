//! The `ledger-subscribe` command: arguments, and [`run`], which writes verified ledgers in
//! stellar-core's record-marked framing so any consumer of core's metadata pipe reads the
//! output unchanged.

use std::fs::File;
use std::future::Future;
use std::io::{BufWriter, IsTerminal as _, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures::StreamExt;
use ledger_relay_wire::frame::Start;
use tokio::sync::mpsc;

use ledger_relay_cli::{LogFormat, Shell};
use ledger_relay_subscriber::config::{
    parse_start, Anchor, Credentials, RelayAddr, SubscribeConfig,
};
use ledger_relay_subscriber::connect;
use ledger_relay_subscriber::error::SubscribeError;
use ledger_relay_subscriber::{FirstLook, Ledger, Status};
use ledger_relay_transport::{default_tag, format_duration, parse_duration};

mod lane_stats;
mod progress;
mod sessions;
use lane_stats::LaneStatsWriter;
pub use lane_stats::DEFAULT_LANE_STATS_INTERVAL;
use progress::{Meter, ProgressOut};

/// Command-line arguments of `ledger-subscribe` (see `docs/operations.md`, "The command
/// contract").
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "ledger-subscribe",
    version,
    about = "Subscribe to a Ledger Relay and write verified ledgers in stellar-core's metadata framing",
    long_about = "Subscribe to one or more Ledger Relays over multi-lane QUIC with mutual TLS, and \
write every ledger, verified and in order, in stellar-core's record-marked framing (the format of \
--metadata-output-stream) to stdout, a file or a FIFO.\n\nEach ledger is checked before it is \
written: its chunks' checksum, its header's hash, the hash chain from the previous ledger (or \
from --anchor), and its transaction set and results against the header's txSetHash and \
txSetResultHash. A ledger that fails any check stops the run (exit 2).\n\nExit codes: 0 after --count ledgers \
(or on SIGINT/SIGTERM), 2 on bad arguments or any other error, 3 when the relay refuses our \
certificate (or we refuse its), 4 when the start is below the retention of every relay of \
--relay (one relay saying so makes the subscriber try the next).",
    mut_args = shown_in_help()
)]
pub struct Args {
    /// Relay addresses in order of preference, HOST:PORT, comma-separated; on a failure the
    /// next one is used, with the hash chain checked across the switch.
    #[arg(
        long,
        value_name = "ADDR[,ADDR...]",
        value_delimiter = ',',
        required_unless_present_any = ["completions", "man"]
    )]
    pub relay: Vec<RelayAddr>,
    /// Subscribe to every relay of --relay at once and write each ledger from whichever relay
    /// first delivers a verified copy; the others' copies are dropped, and a relay that dies
    /// or falls behind is resumed in the background. Still exactly once, in order, with the
    /// hash chain checked across relays. Costs each relay's bandwidth.
    #[arg(long)]
    pub hedge: bool,
    /// Certificate directory: DIR/ca.pem, DIR/NAME.pem and DIR/NAME.key are used.
    #[arg(
        long,
        value_name = "DIR",
        required_unless_present_any = ["completions", "man"]
    )]
    pub certs: Option<PathBuf>,
    /// Our certificate's name in the certificate directory.
    #[arg(
        long,
        value_name = "NAME",
        required_unless_present_any = ["completions", "man"]
    )]
    pub name: Option<String>,
    /// First ledger: a sequence, or `tip` for the newest the relay holds [default: tip, or
    /// the anchor's SEQ with --anchor].
    #[arg(long, value_name = "SEQ|tip", value_parser = parse_start)]
    pub from: Option<Start>,
    /// A trusted ledger to start from: SEQ and its 64-hex header hash (from a history archive
    /// or a previous run). The first ledger written is then verified too: with --from SEQ (the
    /// default) it must be ledger SEQ with that hash; with --from SEQ+1 it must link to it.
    /// Other starts are refused. With or without it, every ledger's transaction set and
    /// results are checked against its header, unless --no-content-check.
    #[arg(long, value_name = "SEQ:HASH")]
    pub anchor: Option<Anchor>,
    /// Do not check each ledger's transaction set and results against its header's
    /// txSetHash and txSetResultHash (saves about 3 to 5 ms of CPU per 14.5 MiB ledger). A
    /// relay could then alter transactions and results unseen; the header chain is still
    /// checked.
    #[arg(long)]
    pub no_content_check: bool,
    /// Exit after this many ledgers (default: run until stopped).
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,
    /// Lanes (parallel QUIC connections, each its own UDP flow), 1 to 64.
    #[arg(long, value_name = "N", default_value_t = 4)]
    pub lanes: u8,
    /// Where to write the ledgers: a file, a FIFO, or `-` for stdout.
    #[arg(long, value_name = "PATH|-", default_value = "-")]
    pub out: String,
    /// TLS name the relay's certificate must be valid for (default: the host part of each
    /// relay address).
    #[arg(long, value_name = "NAME")]
    pub server_name: Option<String>,
    /// Write a CSV row per ledger: seq, raw_bytes, wire_bytes, delivery_ms, inter_arrival_ms,
    /// received_unix_ms (when the verified ledger was complete here, by this host's clock).
    /// With --hedge, also FILE.first-look at the end: per relay, the ledgers it delivered first
    /// and later, its share, and the mean and p99 of how much sooner the hedge had them (ms).
    #[arg(long, value_name = "FILE")]
    pub stats: Option<PathBuf>,
    /// Write per-lane CSV rows: every --lane-stats-interval, one row per lane with unix_ms,
    /// relay, lane, up, connections, rx_bytes, rx_packets, tx_bytes, tx_packets, lost_packets,
    /// congestion_events, black_holes, rtt_ms, min_rtt_ms, cwnd_bytes, mtu_bytes (counters
    /// cumulative over the run, from each lane's QUIC connection; lost_packets, cwnd and mtu
    /// are this end's sending side, the acknowledgement path), and a last set at the end.
    #[arg(long, value_name = "FILE")]
    pub lane_stats: Option<PathBuf>,
    /// How often --lane-stats writes its rows, e.g. `1s` or `200ms`.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, requires = "lane_stats")]
    pub lane_stats_interval: Option<Duration>,
    /// Bind lane k to local UDP port BASE+k (default: ephemeral ports).
    #[arg(long, value_name = "BASE")]
    pub lane_ports: Option<u16>,
    /// Largest UDP payload this end's path MTU discovery may reach and accept; 8952 finds
    /// jumbo frames inside an EC2 VPC (the relay's `[transport] max_mtu` is the data
    /// direction's ceiling: set both).
    #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u16).range(1200..))]
    pub max_mtu: Option<u16>,
    /// UDP payload the path is known to carry: where a lane falls back after a burst of lost
    /// large packets. Equal to --max-mtu, packets stay large whatever is lost; set it only
    /// where the path's MTU is known.
    #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u16).range(1200..))]
    pub min_mtu: Option<u16>,
    /// Wait this long after writing each ledger before taking the next, e.g. `2.5s` or
    /// `250ms`: stands for a consumer that ingests slowly (tests and benchmarks of a slow
    /// subscriber). The subscription then reads no faster than this, and the relay holds it
    /// back by its window. Cut short when the run stops (--count reached, SIGINT or SIGTERM).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub consume_delay: Option<Duration>,
    /// Give up with exit 2 when no relay can be reached for this long at the start, e.g. a
    /// mistyped address. A relay reached once is retried forever.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub connect_timeout: Option<Duration>,
    /// Give a relay up (and reconnect or fail over) after this long without hearing from it,
    /// neither a heartbeat nor data [default: three of the relay's heartbeat intervals, 750 ms
    /// at its default]. Raise it on a host so loaded that the subscriber's own tasks can fall
    /// that far behind.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub heartbeat_timeout: Option<Duration>,
    /// Give a relay up after it has announced ledgers newer than the last one delivered and
    /// none has completed for this long.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub progress_timeout: Option<Duration>,
    /// Retry unreachable relays forever at the start too (no --connect-timeout).
    #[arg(long, conflicts_with = "connect_timeout")]
    pub retry_forever: bool,
    /// How often progress is shown on stderr: the live status line when stderr is a terminal,
    /// else a summary line in the log.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub status_interval: Option<Duration>,
    /// No status line and no summaries (warnings and errors are still logged).
    #[arg(long)]
    pub quiet: bool,
    /// Bench mode: hold N independent subscriptions in this one process, each its own session
    /// and lanes, every ledger verified as without it and then counted, not written (so no
    /// --out; --stats FILE writes FILE.0 to FILE.N-1, one per session; --count applies to each;
    /// no status line). For measuring what each subscriber costs a relay with few processes; a
    /// relay admits at most its --max-sessions-per-identity of one name
    #[arg(long, value_name = "N", default_value_t = 1,
        value_parser = clap::value_parser!(u16).range(1..=1024),
        conflicts_with_all = ["out", "hedge", "lane_stats", "lane_ports"])]
    pub sessions: u16,
    /// BENCH MODE, DOES NOT VERIFY CONTENT: receive every chunk and check only what needs no
    /// decompression (framing, bounds and declared lengths, each ledger's chunk count, the
    /// order), then count the ledger; no decompression, no checksum, no hash chain, no content
    /// hashes, nothing written (so no --out, --hedge or --anchor). For measuring a relay's cost
    /// per subscriber with subscribers that cost the shared cores little; with --sessions too.
    #[arg(long, conflicts_with_all = ["out", "hedge", "anchor"])]
    pub receive_only: bool,
    /// Log format on stderr: text (human-readable) or json (one object per line).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Print the shell completion script for SHELL on stdout and exit.
    #[arg(long, value_enum, value_name = "SHELL", exclusive = true)]
    pub completions: Option<Shell>,
    /// Write the man page ledger-subscribe.1 into DIR and exit.
    #[arg(long, value_name = "DIR", exclusive = true)]
    pub man: Option<PathBuf>,
}

/// The defaults of `ledger-subscribe`'s flags that are one value, read from where the code
/// takes them, as `--help` shows them and docs/operations.md states them (a test compares):
/// (flag without dashes, value, what qualifies it).
pub fn shown_defaults() -> Vec<(&'static str, String, Option<String>)> {
    let transport = ledger_relay_transport::TransportSettings::default();
    vec![
        (
            "lane-stats-interval",
            format_duration(DEFAULT_LANE_STATS_INTERVAL),
            None,
        ),
        ("max-mtu", transport.max_mtu.to_string(), None),
        (
            "progress-timeout",
            format_duration(default_progress_timeout()),
            None,
        ),
        ("min-mtu", transport.min_mtu.to_string(), None),
        (
            "connect-timeout",
            format_duration(DEFAULT_CONNECT_TIMEOUT),
            None,
        ),
        (
            "status-interval",
            format_duration(LIVE_INTERVAL),
            Some(format!(
                "not a terminal: {}",
                format_duration(SUMMARY_INTERVAL)
            )),
        ),
    ]
}

/// The no-progress timeout the subscriber library takes without `--progress-timeout` (it
/// follows from its stall timeout; no certificate is needed to work it out).
fn default_progress_timeout() -> Duration {
    use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
    let none = Credentials {
        ca: Vec::new(),
        crls: Vec::new(),
        cert_chain: Vec::new(),
        key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(Vec::new())),
    };
    SubscribeConfig::new(Vec::new(), none).effective_progress_timeout()
}

/// What appends [`default_tag`] of [`shown_defaults`] to the help of each flag that has one;
/// the defaults are worked out once, not once per flag.
fn shown_in_help() -> impl FnMut(clap::Arg) -> clap::Arg {
    let shown = shown_defaults();
    move |arg| {
        let Some(long) = arg.get_long() else {
            return arg;
        };
        let Some((_, value, note)) = shown.iter().find(|(f, ..)| *f == long) else {
            return arg;
        };
        let tag = default_tag(value, note.as_deref());
        let help = match arg.get_help() {
            Some(help) => format!("{help} {tag}"),
            None => tag,
        };
        arg.help(help)
    }
}

/// Default of `--connect-timeout`.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(60);
/// Default of `--status-interval` when stderr is a terminal.
pub const LIVE_INTERVAL: Duration = Duration::from_secs(2);
/// Default of `--status-interval` otherwise.
pub const SUMMARY_INTERVAL: Duration = Duration::from_secs(60);
/// The log target of summary lines (`RUST_LOG=ledger_subscribe::summary=off` hides them).
pub const SUMMARY_TARGET: &str = "ledger_subscribe::summary";
/// The default log filter: warnings, and the summary lines.
pub const DEFAULT_LOG_FILTER: &str = "warn,ledger_subscribe::summary=info";

/// How progress is shown on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Progress {
    /// One status line, redrawn in place (stderr is a terminal).
    Live,
    /// A summary line in the log every interval and one at the end (stderr is a file, a pipe
    /// or a journal).
    Summary,
    /// Nothing (`--quiet`).
    Quiet,
}

/// Where ledgers are written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// Standard output.
    Stdout,
    /// A file (created or truncated) or a FIFO (opened for writing, which waits for a reader).
    Path(PathBuf),
}

/// A validated `ledger-subscribe` configuration.
#[derive(Debug, Clone)]
pub struct CliConfig {
    /// The subscription.
    pub subscribe: SubscribeConfig,
    /// Stop after this many ledgers.
    pub count: Option<u64>,
    /// Where ledgers go.
    pub out: Output,
    /// Per-ledger CSV.
    pub stats: Option<PathBuf>,
    /// Per-lane CSV (`--lane-stats`), and how often its rows are written.
    pub lane_stats: Option<(PathBuf, Duration)>,
    /// How progress is shown.
    pub progress: Progress,
    /// How often progress is shown.
    pub status_interval: Duration,
    /// How log lines, summaries included, are written.
    pub log_format: LogFormat,
    /// Pause after writing each ledger (`--consume-delay`; zero: none).
    pub consume_delay: Duration,
    /// Subscriptions held at once (`--sessions`, a bench mode; 1: the normal run).
    pub sessions: u16,
}

impl Args {
    /// Loads the credentials and checks the arguments.
    pub fn into_config(self) -> Result<CliConfig, SubscribeError> {
        // clap requires both unless --completions or --man, which never get here.
        let missing = |field| SubscribeError::InvalidConfig {
            field,
            reason: "required".into(),
        };
        let certs = self.certs.ok_or_else(|| missing("certs"))?;
        let name = self.name.ok_or_else(|| missing("name"))?;
        let credentials = Credentials::from_cert_dir(&certs, &name)?;
        let mut subscribe = SubscribeConfig::new(self.relay, credentials);
        subscribe.server_name = self.server_name;
        subscribe.hedge = self.hedge;
        subscribe.anchor = self.anchor;
        subscribe.content_check = !self.no_content_check;
        subscribe.receive_only = self.receive_only;
        subscribe.start = match (self.from, self.anchor) {
            (Some(start), _) => start,
            (None, Some(anchor)) => Start::Seq(anchor.seq),
            (None, None) => Start::Tip,
        };
        subscribe.lanes = self.lanes;
        subscribe.transport.set_mtu(self.max_mtu, self.min_mtu);
        subscribe.heartbeat_timeout = self.heartbeat_timeout;
        subscribe.progress_timeout = self.progress_timeout;
        subscribe.first_connect_timeout = if self.retry_forever {
            None
        } else {
            Some(self.connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT))
        };
        if let Some(base) = self.lane_ports {
            let last = u16::try_from(u32::from(base) + u32::from(self.lanes.max(1)) - 1).map_err(
                |_| SubscribeError::InvalidConfig {
                    field: "lane_ports",
                    reason: format!("{base} + {} lanes runs past port 65535", self.lanes),
                },
            )?;
            subscribe.lane_ports = Some((base, last));
        }
        subscribe.validate()?;
        let out = match self.out.as_str() {
            "-" => Output::Stdout,
            path => Output::Path(path.into()),
        };
        let progress = if self.quiet {
            Progress::Quiet
        } else if std::io::stderr().is_terminal() {
            Progress::Live
        } else {
            Progress::Summary
        };
        let lane_interval = self
            .lane_stats_interval
            .unwrap_or(DEFAULT_LANE_STATS_INTERVAL);
        if lane_interval.is_zero() {
            return Err(SubscribeError::InvalidConfig {
                field: "lane_stats_interval",
                reason: "must be positive".into(),
            });
        }
        let status_interval = match (self.status_interval, progress) {
            (Some(d), _) if d.is_zero() => {
                return Err(SubscribeError::InvalidConfig {
                    field: "status_interval",
                    reason: "must be positive".into(),
                })
            }
            (Some(d), _) => d,
            (None, Progress::Live) => LIVE_INTERVAL,
            (None, _) => SUMMARY_INTERVAL,
        };
        Ok(CliConfig {
            subscribe,
            count: self.count,
            out,
            stats: self.stats,
            lane_stats: self.lane_stats.map(|p| (p, lane_interval)),
            progress,
            status_interval,
            log_format: self.log_format,
            consume_delay: self.consume_delay.unwrap_or(Duration::ZERO),
            sessions: self.sessions,
        })
    }
}

/// Why `ledger-subscribe` failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The subscription failed.
    #[error(transparent)]
    Subscribe(#[from] SubscribeError),
    /// Writing the ledgers failed (for example the reader of a FIFO or pipe went away).
    #[error("cannot write ledgers to {target}")]
    Output {
        /// The output (`stdout` or a path).
        target: String,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },
    /// Writing the stats file failed.
    #[error("cannot write stats to {path}")]
    Stats {
        /// The stats file.
        path: PathBuf,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },
    /// The subscription ended without an error (it does not, short of a bug).
    #[error("the subscription ended unexpectedly")]
    Ended,
}

impl RunError {
    /// The process exit code (`docs/operations.md`, "The command contract"): 3 for an
    /// authorization failure, 4 for a start below retention, 2 for everything else.
    pub fn exit_code(&self) -> u8 {
        match self {
            RunError::Subscribe(e) => e.exit_code(),
            _ => 2,
        }
    }
}

/// Writes why a command failed, as `ledger-subscribe` and `ledger-captive-core` both do: the
/// error and its causes on one line ([`ledger_relay_cli::logging::fatal`], escaped, since it
/// may quote a relay), then, when `subscribe` is a start below retention, the line for
/// programs ([`SubscribeError::below_retention_line`]).
///
/// This is the one writer of that line, and it writes it last: no text from a peer can start
/// a line of stderr (every log line and this error line are escaped), so a line that starts
/// `below-retention requested=` is this one (the Go client takes the last such line).
pub fn report_failure(
    format: LogFormat,
    program: &str,
    error: &(dyn std::error::Error + 'static),
    subscribe: Option<&SubscribeError>,
) {
    let text = format!(
        "{program}: {}",
        ledger_relay_subscriber::error::ErrorChain(error)
    );
    ledger_relay_cli::logging::fatal(format, program, &text);
    if let Some(line) = subscribe.and_then(SubscribeError::below_retention_line) {
        let _ = writeln!(std::io::stderr(), "{line}");
    }
}

/// What a run did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunSummary {
    /// Ledgers written.
    pub ledgers: u64,
    /// The last ledger written (0: none).
    pub last_seq: u32,
    /// Whether the run stopped on `shutdown` before `count` ledgers.
    pub interrupted: bool,
}

/// Subscribes and writes ledgers until `count` ledgers are written, `shutdown` completes, or
/// a terminal error. Prints a status line on stderr every `status_interval`. With
/// `sessions` above 1, runs that many subscriptions at once (`--sessions`, a bench mode); so
/// does receive-only (`--receive-only`, a bench mode), which writes nothing.
pub async fn run(
    config: CliConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<RunSummary, RunError> {
    if config.sessions > 1 || config.subscribe.receive_only {
        return sessions::run(config, shutdown).await;
    }
    run_one(config, shutdown).await
}

/// [`run`] of one subscription.
async fn run_one(
    config: CliConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<RunSummary, RunError> {
    let mut sub = connect(config.subscribe.clone())?;
    let lane_writer = match &config.lane_stats {
        Some((path, every)) => Some(LaneStatsWriter::start(
            path.clone(),
            *every,
            sub.lane_monitor(),
        )?),
        None => None,
    };
    // Blocking writes (a FIFO waits for its reader) happen on their own thread; the channel is
    // small so a slow reader slows the subscription (and so the relay's sending), not memory.
    let (write_tx, write_rx) = mpsc::channel::<Ledger>(2);
    // Receive-only ledgers have no bytes to write.
    let out = (!config.subscribe.receive_only).then(|| config.out.clone());
    let stats = config.stats.clone();
    let delay = config.consume_delay;
    let writer = std::thread::Builder::new()
        .name("ledger-writer".into())
        .spawn(move || write_ledgers(out, stats, delay, write_rx))
        .map_err(|source| RunError::Output {
            target: "writer thread".into(),
            source,
        })?;

    let mut summary = RunSummary {
        ledgers: 0,
        last_seq: 0,
        interrupted: false,
    };
    let mut meter = Meter::new();
    let mut ticker = tokio::time::interval(config.status_interval);
    ticker.tick().await;
    let mut progress = ProgressOut::new(config.progress, config.log_format);
    tokio::pin!(shutdown);
    let mut failure: Option<RunError> = None;
    if config.count != Some(0) {
        loop {
            tokio::select! {
                item = sub.next() => match item {
                    Some(Ok(ledger)) => {
                        meter.add(&ledger);
                        let seq = ledger.seq;
                        // A slow writer (a FIFO's reader, --consume-delay) holds the send up:
                        // a stop request must not wait for it, and progress goes on showing.
                        let send = write_tx.send(ledger);
                        tokio::pin!(send);
                        let sent = loop {
                            tokio::select! {
                                sent = &mut send => break Some(sent),
                                _ = ticker.tick() => progress.tick(&mut meter, &sub.status()),
                                _ = &mut shutdown => break None,
                            }
                        };
                        match sent {
                            None => {
                                summary.interrupted = true;
                                break;
                            }
                            // The writer stopped: its error is collected below.
                            Some(Err(_)) => break,
                            Some(Ok(())) => {}
                        }
                        summary.ledgers += 1;
                        summary.last_seq = seq;
                        if config.count.is_some_and(|n| summary.ledgers >= n) {
                            break;
                        }
                    }
                    Some(Err(e)) => {
                        failure = Some(e.into());
                        break;
                    }
                    None => {
                        failure = Some(RunError::Ended);
                        break;
                    }
                },
                _ = ticker.tick() => progress.tick(&mut meter, &sub.status()),
                _ = &mut shutdown => {
                    summary.interrupted = true;
                    break;
                }
            }
        }
    }
    drop(write_tx);
    let status = sub.status();
    let first_look = sub.first_look();
    // The last lane rows while the lanes are still up.
    let lanes_written = match lane_writer {
        Some(w) => w.finish().await,
        None => Ok(()),
    };
    let closing = sub.close();
    let written = tokio::task::spawn_blocking(move || writer.join());
    let (_, written) = tokio::join!(closing, written);
    let written = match written {
        Ok(Ok(result)) => result.and(lanes_written),
        // The writer thread panicked, or the blocking task was cancelled at runtime shutdown.
        _ => Err(RunError::Output {
            target: "writer thread".into(),
            source: std::io::Error::other("the writer thread failed"),
        }),
    };
    // After the writer is done: the last summary counts ledgers written.
    let written = written.and_then(|()| report_first_look(&first_look, config.stats.as_deref()));
    let failed = failure.is_some() || written.is_err();
    progress.finish(&mut meter, &status, &summary, failed);
    match (failure, written) {
        (Some(e), _) => Err(e),
        (None, Err(e)) => Err(e),
        (None, Ok(())) => Ok(summary),
    }
}

/// A hedged run's first look: logged, one line per relay, and with `--stats FILE` written to
/// `FILE.first-look` (CSV: relay, first, later, first_share, gain_mean_ms, gain_p99_ms).
fn report_first_look(first_look: &[FirstLook], stats: Option<&Path>) -> Result<(), RunError> {
    let ms = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.3}"));
    let mut csv = String::from("relay,first,later,first_share,gain_mean_ms,gain_p99_ms\n");
    for f in first_look {
        let (mean, p99) = (ms(f.gain_mean_ms), ms(f.gain_p99_ms));
        tracing::info!(relay = %f.relay, first = f.first, later = f.later, share = format!("{:.3}", f.first_share), gain_mean_ms = %mean, gain_p99_ms = %p99, "first look");
        let (relay, first, later, share) = (&f.relay, f.first, f.later, f.first_share);
        csv += &format!("{relay},{first},{later},{share:.4},{mean},{p99}\n");
    }
    let (Some(stats), false) = (stats, first_look.is_empty()) else {
        return Ok(());
    };
    let mut path = stats.as_os_str().to_owned();
    path.push(".first-look");
    std::fs::write(&path, csv).map_err(|source| RunError::Stats {
        path: path.into(),
        source,
    })
}

/// The writer thread: record-marked ledgers to `out` (none: nowhere), flushed after each, and
/// the stats CSV; waits `delay` after each ledger (see [`consume_pause`]).
fn write_ledgers(
    out: Option<Output>,
    stats: Option<PathBuf>,
    delay: Duration,
    mut rx: mpsc::Receiver<Ledger>,
) -> Result<(), RunError> {
    let target = match &out {
        Some(Output::Stdout) => "stdout".to_owned(),
        Some(Output::Path(p)) => p.display().to_string(),
        None => "nowhere".to_owned(),
    };
    let out_err = |source| RunError::Output {
        target: target.clone(),
        source,
    };
    let mut sink: Option<Box<dyn Write>> = match &out {
        Some(Output::Stdout) => Some(Box::new(BufWriter::with_capacity(
            1 << 20,
            std::io::stdout().lock(),
        ))),
        Some(Output::Path(path)) => Some(Box::new(BufWriter::with_capacity(
            1 << 20,
            File::create(path).map_err(out_err)?,
        ))),
        None => None,
    };
    let mut csv = match &stats {
        Some(path) => {
            let stats_err = |source| RunError::Stats {
                path: path.clone(),
                source,
            };
            let mut w = BufWriter::new(File::create(path).map_err(stats_err)?);
            writeln!(
                w,
                "seq,raw_bytes,wire_bytes,delivery_ms,inter_arrival_ms,received_unix_ms"
            )
            .and_then(|()| w.flush())
            .map_err(stats_err)?;
            Some((w, path.clone()))
        }
        None => None,
    };
    let mut previous_ns: Option<u64> = None;
    while let Some(ledger) = rx.blocking_recv() {
        if let Some(sink) = &mut sink {
            ledger_relay_wire::record::write_record_to(sink, &ledger.data)
                .and_then(|()| sink.flush())
                .map_err(out_err)?;
        }
        if let Some((w, path)) = &mut csv {
            let row = stats_row(&ledger, previous_ns);
            w.write_all(row.as_bytes())
                .and_then(|()| w.flush())
                .map_err(|source| RunError::Stats {
                    path: path.clone(),
                    source,
                })?;
        }
        previous_ns = Some(ledger.received_ns);
        consume_pause(delay, &rx);
    }
    Ok(())
}

/// The `--consume-delay` pause: sleeps `delay` in steps of at most 50 ms, and stops early
/// once the sending side is gone (the run is ending), so the ledgers still queued are written
/// at once and the process exits promptly.
fn consume_pause<T>(delay: Duration, rx: &mpsc::Receiver<T>) {
    const STEP: Duration = Duration::from_millis(50);
    let until = Instant::now() + delay;
    while !rx.is_closed() {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        std::thread::sleep(left.min(STEP));
    }
}

/// Completes on SIGINT or SIGTERM: the shutdown of `ledger-subscribe` and
/// `ledger-captive-core` (the Go SDK stops core with SIGINT).
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

/// One CSV row: `seq,raw_bytes,wire_bytes,delivery_ms,inter_arrival_ms,received_unix_ms`
/// (inter-arrival empty for the first ledger). Delivery may be negative when the two clocks
/// disagree. The arrival time lets a bench on the same host time a whole transfer from its own
/// start, which neither the delivery (relay clock) nor the inter-arrivals can.
pub fn stats_row(ledger: &Ledger, previous_received_ns: Option<u64>) -> String {
    let delivery_ms =
        (i128::from(ledger.received_ns) - i128::from(ledger.relay_last_byte_ns)) as f64 / 1e6;
    let inter = previous_received_ns
        .map(|p| {
            format!(
                "{:.3}",
                (i128::from(ledger.received_ns) - i128::from(p)) as f64 / 1e6
            )
        })
        .unwrap_or_default();
    format!(
        "{},{},{},{:.3},{},{:.3}\n",
        ledger.seq,
        ledger.raw_len,
        ledger.wire_bytes,
        delivery_ms,
        inter,
        ledger.received_ns as f64 / 1e6
    )
}

#[cfg(test)]
mod tests;
