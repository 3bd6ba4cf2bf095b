//! `ledger-bench`: what lanes buy and what they cost, on one machine.
//!
//! Runs the real `ledger-relay run` and `ledger-subscribe` binaries (found next to this
//! executable) with an ephemeral CA, over loopback or an emulated cloud network (two network
//! namespaces, a veth pair in 198.18.0.0/15 and an HTB per-flow cap keyed by each lane's pinned
//! UDP port, see [`netem`]), reads each subscriber's `--stats` CSV and prints delivery
//! p50/p90/p99/max (warm-up excluded), inter-arrival, goodput, wire bytes and ratio, relay and
//! subscriber CPU per ledger, and the model bound of every row with the ratio to it. Baselines
//! in the same run: one TCP connection and a local pipe ([`baseline`]).
//!
//! Rows also compare the relay's delivery modes (`--store-and-forward`, `--streams-per-lane`)
//! and measure sustained goodput with subscribers catching up from the ring (`bulk-*` rows);
//! after the table, the targets are computed from the rows of the run.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod baseline;
pub mod cluster;
pub mod cpu;
pub mod delay;
pub mod fanout;
pub mod harness;
pub mod lake;
pub mod lanes;
pub mod load;
pub mod netem;
pub mod perlane;
pub mod proc;
pub mod projection;
pub mod query;
pub mod remote;
pub mod report;
pub mod ring_disk;
pub mod scenario;
pub mod slow;
pub mod stats;
pub mod tiers;

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};

use crate::netem::{Netem, Shape};
use crate::scenario::{Env, Kind, Mode, Payload, Row, Scenario, Settings};

/// `ledger-bench` arguments.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "ledger-bench",
    version,
    about = "Single-flow vs multi-flow delivery of Ledger Relay on loopback or an emulated cloud network",
    long_about = "Runs ledger-relay and ledger-subscribe (built in the same workspace: cargo build \
--release --workspace) per scenario and prints delivery p50/p90/p99/max, inter-arrival, goodput, \
compression, CPU per ledger and the model bound. The emulated network (network namespaces, HTB \
per-flow caps) needs root; without it those rows are skipped with the reason."
)]
pub struct Cli {
    /// The reliability modes (`slow-subscriber`, `load`), and hidden helper subcommands (the
    /// TCP baseline's two ends); without one, the scenario table runs.
    #[command(subcommand)]
    pub helper: Option<Helper>,
    /// Benchmark settings.
    #[command(flatten)]
    pub args: Args,
}

/// Subcommands: the reliability modes, and helpers the bench runs itself inside the
/// namespaces.
#[derive(Debug, Clone, Subcommand)]
pub enum Helper {
    /// One subscriber consuming at a tenth of the rate next to normal ones: their delivery
    /// p99 with and without it, its outcome (ring reading, catch-up or below retention) and
    /// the relay's memory against a bound (issue 7).
    SlowSubscriber(slow::SlowArgs),
    /// Many subscribers with mixed starts, some reconnecting in a loop, for minutes: no
    /// failure, contiguous delivery across restarts, and the relay's memory over time
    /// (issue 7).
    Load(load::LoadArgs),
    /// SEP-54 data lakes: delivery p99 with and without `--export` (to a directory and to a
    /// loopback S3 server), and backfill from the lake against catch-up from the ring
    /// (ledgers/s, MB/s, prefetch memory).
    Lake(lake::LakeArgs),
    /// Whole-transfer goodput against lanes under a per-flow cap (emulated network, root):
    /// 1, 2, 4 and 8 lanes live and catching up from the ring, and 4 lanes with one at half
    /// the cap, with each lane's bytes, busy fraction and losses (issue 12).
    Lanes(lanes::LanesArgs),
    /// CPU per raw ledger at its real size: bare quinn (one connection, one stream) and one
    /// TLS-over-TCP flow against `ledger-relay demo`, in MB per CPU-second, measured in the same
    /// run (issue 12).
    Cpu(cpu::CpuArgs),
    /// Against a relay on another host: a row per lane count, and with --tcp one over the
    /// relay's TCP baseline (one TLS-over-TCP flow), in the same table, CSV, JSON and plots.
    ///
    /// Run the relay elsewhere with `ledger-relay run ... --tcp-baseline ADDR` (and, to compare
    /// transports rather than codecs, `--codec none`); give this host a client certificate of
    /// its CA. Delivery is put on one clock NTP-style over the TCP baseline: probes before and
    /// after the rows, the one with the shortest round trip of each, offset ((t1 - t0) + (t2 -
    /// t3)) / 2, accurate to half that round trip; the header line says what was added. Without
    /// --tcp, delivery is left as the two clocks say. Inter-arrival, throughput (tput) and
    /// whole-transfer goodput (xfer) use this host's clock only.
    Remote(remote::RemoteArgs),
    /// Disk use of the data directory against the ring's live bytes over time, paced and in a
    /// burst, and the ring's CPU per ledger (issue 21).
    RingDisk(ring_disk::RingDiskArgs),
    /// What each extra subscriber costs one relay on loopback: relay CPU per ledger per
    /// subscriber and its slope, memory per session, and the delivery of the first and last
    /// subscriber to finish each ledger, at 1, 4, 16 and 64 subscribers (one process each, or
    /// `--sessions-per-process K`), compressed and raw (issue 18).
    Fanout(fanout::FanoutArgs),
    /// Relay tiers and hedging (issue 15): what an edge relay adds to delivery (root -> edge ->
    /// subscriber against root -> subscriber, compressed and raw), the root's CPU with N
    /// subscribers behind E edges against N direct ones, and hedged against single-relay p99
    /// with one relay's path capped at a tenth (emulated network, root only).
    Tiers(tiers::TiersArgs),
    /// stellar-core's query port carried through relays: getLedgerEntries of 1, 10 and 100
    /// keys through stand-in -> relay -> core double against the double called directly, on
    /// loopback and over an emulated round trip (root), and ledger delivery with and without
    /// queries running.
    Query(query::QueryArgs),
    /// Posts form bodies and writes each request's latency (the query bench's client).
    #[command(hide = true)]
    QueryClient(query::client::ClientArgs),
    /// Forwards UDP, holding each datagram in each direction (the query bench's round trip).
    #[command(hide = true)]
    UdpDelay(delay::DelayArgs),
    /// Prints the body of an HTTP GET (the bench scrapes a relay inside its namespace).
    #[command(hide = true)]
    HttpGet {
        /// Server address.
        #[arg(long)]
        addr: std::net::SocketAddr,
        /// Path.
        #[arg(long)]
        path: String,
    },
    /// TCP baseline sender.
    #[command(hide = true)]
    TcpSend {
        /// Receiver address.
        #[arg(long)]
        connect: std::net::SocketAddr,
        /// Pacing.
        #[command(flatten)]
        pacing: baseline::Pacing,
    },
    /// TCP baseline receiver.
    #[command(hide = true)]
    TcpRecv {
        /// Address to listen on.
        #[arg(long)]
        listen: std::net::SocketAddr,
        /// `--count`.
        #[command(flatten)]
        count: cluster::Count,
        /// Stats CSV.
        #[arg(long)]
        stats: PathBuf,
    },
}

/// Which network the rows use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Network {
    /// Loopback rows only.
    Loopback,
    /// Emulated rows only.
    Emulated,
    /// Both.
    All,
}

/// Benchmark settings.
#[derive(Debug, Clone, clap::Args)]
#[command(mut_arg("ledger_bytes", |a| a.help("Unscaled raw size of each ledger (Phase 3 stress profile: 14.5 MiB; a bare number is bytes, as the old `--ledger-bytes` took)")))]
#[command(mut_arg("chunk_bytes", |a| a.help("Unscaled relay chunk size (`256KiB`; a bare number is bytes)")))]
#[command(mut_arg("ledgers", |a| a.default_value("60").default_value_if("quick", "true", "15").help("Ledgers per subscriber, warm-up included (quick: 15)")))]
#[command(mut_arg("quick", |a| a.help("A preset that finishes in about a minute: fewer ledgers, a shorter cadence, the core rows only")))]
#[command(mut_arg("cadence_ms", |a| a.default_value_if("quick", "true", "250ms").help("Time between ledgers (`600ms`, `1s`; a bare number is milliseconds, as the old `--cadence-ms` took) (quick: 250ms)")))]
#[command(mut_arg("flow_mbit", |a| a.default_value("200").help("Per-flow cap of the emulated network, Mbit/s")))]
#[command(mut_arg("only", |a| a.help("Run only the scenarios with these names (repeatable; see the table for names)")))]
pub struct Args {
    /// `--quick`.
    #[command(flatten)]
    pub quick: cluster::Quick,
    /// Which rows to run.
    #[arg(long, value_enum, default_value = "all")]
    pub network: Network,
    /// `--only`: scenarios.
    #[command(flatten)]
    pub only: crate::cluster::Only,
    /// `--ledgers` [default: 60, quick 15] and `--warmup`.
    #[command(flatten)]
    pub series: crate::cluster::Series,
    /// `--cadence` [default: 600ms, quick 250ms].
    #[command(flatten)]
    pub cadence: cluster::Cadence,
    /// `--emit-ms`.
    #[command(flatten)]
    pub emit: crate::cluster::Emit,
    /// `--flow-mbit` [default: 200].
    #[command(flatten)]
    pub flow: crate::cluster::FlowCap,
    /// Aggregate cap of the emulated network, Mbit/s [default: 8x the per-flow cap].
    #[arg(long)]
    pub aggregate_mbit: Option<f64>,
    /// The per-flow cap being emulated, Mbit/s (EC2 outside a placement group: 5000); ledger
    /// and chunk sizes are divided by this over --flow-mbit so wire times keep its proportions.
    #[arg(long, default_value_t = 5000.0)]
    pub emulated_flow_mbit: f64,
    /// `--size`.
    #[command(flatten)]
    pub size: crate::cluster::Size,
    /// `--chunk-bytes`.
    #[command(flatten)]
    pub chunk: crate::cluster::Chunk,
    /// `--testdata`.
    #[command(flatten)]
    pub testdata: crate::cluster::Testdata,
    /// `--csv`, `--json` (with every delivery sample) and `--plots` (delivery-cdf,
    /// throughput-vs-lanes and fanout-cost, SVG and PNG).
    #[command(flatten)]
    pub output: cluster::Output,
    /// No progress bar.
    #[arg(long)]
    pub no_progress: bool,
    /// `--max-mtu`/`--min-mtu` of the relay rows (8952 for jumbo frames).
    #[command(flatten)]
    pub transport: cluster::Transport,
}

impl Args {
    /// The settings these arguments give.
    pub fn settings(&self) -> anyhow::Result<Settings> {
        if self.flow.flow_mbit <= 0.0 || self.emulated_flow_mbit <= 0.0 {
            bail!("--flow-mbit and --emulated-flow-mbit must be positive");
        }
        let scale = (self.emulated_flow_mbit / self.flow.flow_mbit).max(1.0);
        self.series.check()?;
        let flow_bps = (self.flow.flow_mbit * 1e6) as u64;
        Ok(Settings {
            ledgers: self.series.count.ledgers,
            warmup: self.series.warmup,
            size: ((self.size.ledger_bytes as f64 / scale) as u64).max(4096),
            cadence_ms: self.cadence.cadence_ms,
            emit_ms: self.emit.emit_ms,
            // The relay refuses chunks under 4 KiB.
            chunk: ((self.chunk.chunk_bytes as f64 / scale) as u64).max(4096),
            shape: Shape {
                flow_bps,
                aggregate_bps: self
                    .aggregate_mbit
                    .map(|a| (a * 1e6) as u64)
                    .unwrap_or(flow_bps * 8),
            },
            scale,
            max_mtu: self.transport.max_mtu,
            min_mtu: self.transport.min_mtu,
        })
    }
}

fn relay(
    name: &str,
    emulated: bool,
    lanes: u8,
    codec: &str,
    payload: Payload,
    subs: u8,
) -> Scenario {
    Scenario {
        name: name.into(),
        kind: Kind::Relay {
            lanes,
            codec: codec.into(),
            payload,
            subscribers: subs,
            mode: Mode::default(),
        },
        emulated,
    }
}

/// `sc` with the relay delivering in `mode`.
fn with_mode(mut sc: Scenario, new: Mode) -> Scenario {
    if let Kind::Relay { mode, .. } = &mut sc.kind {
        *mode = new;
    }
    sc
}

/// The rows of a run, before filtering by network and `--only`.
pub fn scenarios(args: &Args) -> Vec<Scenario> {
    let raw = || Payload::Synthetic(1.0);
    let cal = || Payload::Synthetic(7.6);
    let file = || {
        Payload::File(
            args.testdata
                .testdata
                .join("testnet/testnet-1410048-1410367.lcm-v0.framed.xdr"),
        )
    };
    let mut v = vec![
        Scenario {
            name: "tcp-1flow".into(),
            kind: Kind::Tcp,
            emulated: true,
        },
        relay("raw-l1", true, 1, "none", raw(), 1),
        relay("raw-l2", true, 2, "none", raw(), 1),
        relay("raw-l4", true, 4, "none", raw(), 1),
    ];
    if !args.quick.quick {
        v.push(relay("raw-l8", true, 8, "none", raw(), 1));
        // Streams alone do not beat a flow cap: one lane, one stream at a time vs four.
        let streams = |n| Mode {
            streams_per_lane: Some(n),
            ..Mode::default()
        };
        v.push(with_mode(
            relay("raw-l1-s1", true, 1, "none", raw(), 1),
            streams(1),
        ));
        v.push(with_mode(
            relay("raw-l1-s4", true, 1, "none", raw(), 1),
            streams(4),
        ));
        // The prototype's first design: a ledger is sent only once it is complete.
        let saf = Mode {
            store_and_forward: true,
            ..Mode::default()
        };
        v.push(with_mode(
            relay("saf-raw-l1", true, 1, "none", raw(), 1),
            saf,
        ));
        v.push(with_mode(
            relay("saf-raw-l4", true, 4, "none", raw(), 1),
            saf,
        ));
        v.push(with_mode(
            relay("saf-x7.6-zstd-l4", true, 4, "zstd", cal(), 1),
            saf,
        ));
    }
    // Sustained goodput: ledgers back to back from the ring, not bounded by the source.
    let bulk = Mode {
        catch_up: true,
        ..Mode::default()
    };
    for (name, lanes) in [("bulk-raw-l1", 1), ("bulk-raw-l2", 2), ("bulk-raw-l4", 4)] {
        v.push(with_mode(relay(name, true, lanes, "none", raw(), 1), bulk));
    }
    v.push(relay("x7.6-zstd-l1", true, 1, "zstd", cal(), 1));
    if !args.quick.quick {
        v.extend([
            relay("x7.6-zstd-l4", true, 4, "zstd", cal(), 1),
            relay("x7.6-lz4-l1", true, 1, "lz4", cal(), 1),
            relay("raw-zstd-l1", true, 1, "zstd", raw(), 1),
            relay("file-zstd-l1", true, 1, "zstd", file(), 1),
            relay("file-none-l4", true, 4, "none", file(), 1),
        ]);
    }
    v.push(relay("fanout-1", true, 4, "zstd", cal(), 1));
    v.push(relay("fanout-4", true, 4, "zstd", cal(), 4));
    if !args.quick.quick {
        v.push(relay("fanout-16", true, 4, "zstd", cal(), 16));
    }
    v.push(Scenario {
        name: "pipe".into(),
        kind: Kind::Pipe,
        emulated: false,
    });
    v.push(relay("lo-x7.6-zstd-l4", false, 4, "zstd", cal(), 1));
    if !args.quick.quick {
        v.push(relay("lo-raw-none-l1", false, 1, "none", raw(), 1));
        v.push(relay("lo-raw-none-l4", false, 4, "none", raw(), 1));
    }
    v
}

/// Removes the namespaces and stops the children on SIGINT or SIGTERM, then exits 130.
fn install_signal_handler() {
    std::thread::spawn(|| {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        rt.block_on(async {
            let Ok(mut signals) = ledger_relay_cli::StopSignals::new() else {
                return;
            };
            signals.recv().await;
            eprintln!("\nledger-bench: interrupted: stopping children and removing namespaces");
            proc::kill_tracked();
            netem::cleanup_registered();
            std::process::exit(130);
        });
    });
}

/// Runs the selected rows and returns them (the caller prints and writes them).
pub fn run(args: &Args) -> anyhow::Result<Vec<Row>> {
    let settings = args.settings()?;
    let mut list: Vec<Scenario> = scenarios(args)
        .into_iter()
        .filter(|s| match args.network {
            Network::All => true,
            Network::Loopback => !s.emulated,
            Network::Emulated => s.emulated,
        })
        .filter(|s| args.only.only.is_empty() || args.only.only.contains(&s.name))
        .collect();
    if list.is_empty() {
        bail!("no scenario selected");
    }
    if list.iter().any(|s| s.emulated) {
        if let Some(reason) = netem::unavailable_reason() {
            eprintln!("ledger-bench: skipping the emulated-network rows: {reason}");
            list.retain(|s| !s.emulated);
        }
    }
    install_signal_handler();
    let mut tmp = crate::cluster::work_dir("ledger-bench")?;
    let certs = tmp.path().join("certs");
    harness::make_certs(&certs, 0)?;
    let netem = if list.iter().any(|s| s.emulated) {
        Some(Netem::create("b", settings.shape)?)
    } else {
        None
    };
    // Before any row: the relay rows need them.
    proc::sibling_binary("ledger-relay")?;
    proc::sibling_binary("ledger-subscribe")?;
    let transport = cluster::Transport {
        max_mtu: settings.max_mtu,
        min_mtu: settings.min_mtu,
    };
    let mut env = Env {
        cluster: cluster::Cluster::local(&certs, transport)?,
        bench_bin: proc::sibling_binary("ledger-bench")
            .or_else(|_| std::env::current_exe().context("locating ledger-bench"))?,
        tmp: tmp.path().to_path_buf(),
        netem,
        index: 0,
    };
    let bar = if args.no_progress {
        indicatif::ProgressBar::hidden()
    } else {
        let b = indicatif::ProgressBar::new(list.len() as u64);
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "{elapsed_precise} [{bar:30}] {pos}/{len} {msg}",
        ) {
            b.set_style(style.progress_chars("=> "));
        }
        b
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut rows = Vec::new();
    for sc in &list {
        bar.set_message(sc.name.clone());
        let mut row = scenario::run(&mut env, &settings, sc);
        row.projection = projection::project(&row, &settings, args.size.ledger_bytes as f64, cores);
        rows.push(row);
        bar.inc(1);
    }
    bar.finish_and_clear();
    crate::cluster::keep_if_asked(&mut tmp);
    Ok(rows)
}

/// The whole command: runs, prints the table and writes `--csv`, `--json` and `--plots`.
pub fn main_with(cli: Cli) -> anyhow::Result<()> {
    // The long-running subcommands stop their children on Ctrl-C; the helpers run as children.
    if !matches!(
        cli.helper,
        None | Some(
            Helper::TcpSend { .. }
                | Helper::TcpRecv { .. }
                | Helper::Cpu(_)
                | Helper::HttpGet { .. }
                | Helper::QueryClient(_)
                | Helper::UdpDelay(_)
        )
    ) {
        install_signal_handler();
    }
    match cli.helper {
        Some(Helper::TcpSend { connect, pacing }) => return baseline::tcp_send(connect, pacing),
        Some(Helper::TcpRecv {
            listen,
            count,
            stats,
        }) => return baseline::tcp_recv(listen, count.count, stats),
        Some(Helper::SlowSubscriber(a)) => return slow::main(&a),
        Some(Helper::Load(a)) => return load::main(&a),
        Some(Helper::Lake(a)) => return lake::main(&a),
        Some(Helper::Lanes(a)) => return lanes::main(&a),
        Some(Helper::Cpu(a)) => return cpu::main(&a),
        Some(Helper::Remote(a)) => return remote::main(&a),
        Some(Helper::RingDisk(a)) => return ring_disk::main(&a),
        Some(Helper::Fanout(a)) => return fanout::main(&a),
        Some(Helper::Tiers(a)) => return tiers::main(&a),
        Some(Helper::Query(a)) => return query::main(&a),
        Some(Helper::QueryClient(a)) => return query::client::main(&a),
        Some(Helper::UdpDelay(a)) => return delay::run(a.listen, a.to, a.delay),
        Some(Helper::HttpGet { addr, path }) => {
            print!("{}", harness::http_get(addr, &path)?);
            return Ok(());
        }
        None => {}
    }
    let args = cli.args;
    let s = args.settings()?;
    eprintln!(
        "ledger-bench: {} ledgers/subscriber ({} warm-up) of {:.0} KiB every {} ms, emit {} ms, chunk {} B; emulated: {} Mbit/s per flow, {} Mbit/s aggregate, scale {:.1}",
        s.ledgers,
        s.warmup,
        s.size as f64 / 1024.0,
        s.cadence_ms,
        s.emit_ms,
        s.chunk,
        s.shape.flow_bps as f64 / 1e6,
        s.shape.aggregate_bps as f64 / 1e6,
        s.scale
    );
    let rows = run(&args)?;
    let table = ScenarioReport {
        settings: s,
        rows,
        ledger_bytes: args.size.ledger_bytes,
    };
    cluster::emit(&table, &args.output)
}

/// What the scenario table measured, with its settings (its `--json`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct ScenarioReport {
    /// The settings of the run.
    pub settings: Settings,
    /// The rows.
    pub rows: Vec<Row>,
    /// Unscaled ledger size of the projection.
    #[serde(skip)]
    pub ledger_bytes: u64,
}

impl cluster::Table for ScenarioReport {
    fn table(&self) -> String {
        let rows = &self.rows;
        let mut out = report::table(rows);
        let lanes = perlane::table(rows);
        if !lanes.is_empty() {
            out.push_str(&format!("\n{lanes}(* lost: packets the subscriber sent, the acknowledgement path; the data direction's losses are the relay's)\n"));
        }
        let projected = projection::table(rows);
        if !projected.is_empty() {
            out.push_str(&format!(
                "\nprojection at {} bytes per ledger on {} cores (formula: bench/RESULTS.md):\n{projected}",
                self.ledger_bytes,
                std::thread::available_parallelism().map_or(1, |n| n.get())
            ));
        }
        out
    }
    fn targets(&self) -> String {
        let targets = report::targets(&self.rows);
        if targets.is_empty() {
            targets
        } else {
            format!("\ntargets (issue 6), from this run's rows:\n{targets}")
        }
    }
}

impl cluster::Report for ScenarioReport {
    fn csv(&self) -> String {
        report::csv(&self.rows)
    }
    fn plots(&self, dir: &std::path::Path) -> anyhow::Result<String> {
        Ok(report::plots(&self.rows, dir, self.settings.shape.flow_bps)?.join(", "))
    }
}
