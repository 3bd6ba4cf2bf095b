//! `ledger-relay demo`: the product's main job on built-in defaults, on one machine.
//!
//! An ephemeral CA in a temporary directory issues a relay and a client certificate; a relay on
//! loopback is fed synthetic Phase 3 ledgers (14.5 MiB every 600 ms, compressible about 7.6x
//! like real meta); an in-process subscriber with 4 lanes receives, reassembles and verifies
//! them. One line per ledger (sequence, size, wire bytes, delivery latency) and a summary.
//!
//! Delivery latency is the subscriber's wall clock when it holds the complete, verified ledger
//! minus the relay's wall clock when it read the ledger's last byte from its source; on one
//! machine both read the same clock.

use std::time::Duration;

use anyhow::Context;
use futures::StreamExt;
use hdrhistogram::Histogram;
use ledger_relay_certs::CertDir;
use ledger_relay_cli::cputime;
use ledger_relay_subscriber::{connect, Credentials, Ledger, RelayAddr, SubscribeConfig};
use ledger_relay_wire::frame::Start;
use tokio_util::sync::CancellationToken;

use ledger_relay::config::{parse_duration, parse_size, RelayConfig, RunArgs};
use ledger_relay::source::{SourceSpec, SyntheticSpec};

/// Flags of `ledger-relay demo`.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Stop after this many ledgers.
    #[arg(long, default_value_t = 30)]
    pub ledgers: u32,
    /// Lanes the subscriber opens.
    #[arg(long, default_value_t = 4)]
    pub lanes: u8,
    /// Ledger size.
    #[arg(long, default_value = "14.5MiB")]
    pub size: String,
    /// Target zstd-1 compression ratio of the synthetic ledgers (1 = incompressible).
    #[arg(long, default_value_t = 7.6)]
    pub ratio: f64,
    /// Time between ledgers.
    #[arg(long, default_value = "600ms")]
    pub cadence: String,
    /// Chunk codec: zstd, lz4 or none.
    #[arg(long, default_value = "zstd")]
    pub codec: String,
    /// Ledgers at the start left out of the summary (connection set-up, first allocations).
    #[arg(long, default_value_t = 2)]
    pub warmup: u32,
    /// Largest UDP payload both ends' path MTU discovery may reach (the `max_mtu` transport
    /// setting; default the transport's own, 1452): 8952 for EC2's 9001-byte jumbo frames.
    #[arg(long)]
    pub max_mtu: Option<u16>,
    /// UDP payload both ends take the path to carry (the `min_mtu` transport setting; default
    /// 1200): where a lane falls back after a burst of lost large packets. With `--max-mtu`,
    /// the same value keeps a jumbo-frame path's packets large.
    #[arg(long)]
    pub min_mtu: Option<u16>,
    /// Raw bytes per chunk the relay cuts [default: the relay's 256KiB].
    #[arg(long, value_name = "BYTES")]
    pub chunk_size: Option<String>,
    /// Ledgers the ring keeps. Below `--ledgers`, the ring reaches its steady state, where
    /// each ledger appended prunes the oldest, as a relay's ring does once full.
    #[arg(long, default_value_t = 1000)]
    pub retention: u32,
}

/// What a thread of this process does, from its name: `source` (the synthetic source standing
/// in for stellar-core), `pipeline` (cutting and compressing), `ring` (the ring writer and
/// sled's threads), `relay` (the relay's runtime: sessions, QUIC, the hub) and `subscriber`
/// (the subscriber's own runtime: QUIC, reassembly, verification).
fn thread_group(comm: &str) -> &'static str {
    if comm.starts_with("source") {
        "source"
    } else if comm.starts_with("cutter")
        || comm.starts_with("publisher")
        || comm.starts_with("compress")
    {
        "pipeline"
    } else if comm.starts_with("ring") || comm.starts_with("sled") || comm == "log flusher" {
        "ring"
    } else if comm.starts_with(SUBSCRIBER_THREADS) {
        "subscriber"
    } else {
        "relay"
    }
}

/// Thread name of the subscriber's runtime (its own, so its CPU is counted apart).
const SUBSCRIBER_THREADS: &str = "subscriber";

/// Runs the demo until `--ledgers` ledgers arrived or `shutdown`.
pub async fn run(args: DemoArgs, shutdown: CancellationToken) -> anyhow::Result<()> {
    let size = parse_size(&args.size).context("--size")?;
    parse_duration(&args.cadence).context("--cadence")?;
    if args.ledgers == 0 {
        anyhow::bail!("--ledgers must be at least 1");
    }
    let tmp = tempfile::Builder::new()
        .prefix("ledger-relay-demo")
        .tempdir()
        .context("creating a temporary directory")?;
    // 60 days for the leaves, past the subscriber's 30-day expiry warning; a day more for the
    // CA, which a leaf issued a second after it must not outlive.
    let certs = CertDir::init(&tmp.path().join("certs"), 61)?;
    certs.issue_server("relay", &["localhost".into(), "127.0.0.1".into()], 60)?;
    certs.issue_client("demo", 60)?;

    let start = 2u32;
    let config = relay_config(&args, size, start, &certs, tmp.path())?;
    eprintln!(
        "generating {} synthetic ledgers of {:.1} MiB (zstd ratio {}) ...",
        args.ledgers,
        size as f64 / (1 << 20) as f64,
        args.ratio
    );
    let transport = config.transport.clone();
    let relay_stop = shutdown.child_token();
    let relay = ledger_relay::Relay::start(config, relay_stop.clone()).await?;
    let mut sub_config = SubscribeConfig::new(
        vec![RelayAddr::new("127.0.0.1", relay.addr.port())],
        Credentials::from_cert_dir(certs.path(), "demo")?,
    );
    sub_config.lanes = args.lanes;
    sub_config.transport = transport;
    sub_config.start = Start::Seq(start);
    // The subscriber runs on a runtime of its own, so that its CPU is counted apart from the
    // relay's (the Stream is still read here).
    let sub_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(SUBSCRIBER_THREADS)
        .enable_all()
        .build()
        .context("starting the subscriber's runtime")?;
    let mut sub = {
        let _in = sub_runtime.enter();
        connect(sub_config)?
    };

    let mut tally = Tally::new()?;
    let outcome = receive(&mut sub, &mut tally, &args, &shutdown).await;
    let cpu = tally.cpu_since_warmup();
    sub.close().await;
    // A runtime cannot be dropped (which blocks) from inside another one.
    sub_runtime.shutdown_background();
    relay_stop.cancel();
    relay.wait().await;
    tally.print_summary(&args, cpu);
    outcome
}

/// The relay's configuration: the synthetic source from ledger `start`, on loopback.
fn relay_config(
    args: &DemoArgs,
    size: u64,
    start: u32,
    certs: &CertDir,
    dir: &std::path::Path,
) -> anyhow::Result<RelayConfig> {
    let spec = SyntheticSpec {
        size,
        ratio: args.ratio,
        // Two more than are measured: the source and the pipeline are still running (and
        // their threads listed) when the last measured ledger arrives.
        count: Some(u64::from(args.ledgers) + 2),
        start,
        emit: None,
        ..SyntheticSpec::default()
    };
    let mut config = RelayConfig::from_args(RunArgs {
        listen: Some("127.0.0.1:0".parse()?),
        certs: Some(certs.path().to_path_buf()),
        data_dir: Some(dir.join("data")),
        source: Some("synthetic".into()),
        cadence: Some(args.cadence.clone()),
        codec: Some(args.codec.clone()),
        retention: Some(args.retention),
        chunk_size: args.chunk_size.clone(),
        ..RunArgs::default()
    })?;
    config.source = SourceSpec::Synthetic(spec);
    config.transport.set_mtu(args.max_mtu, args.min_mtu);
    Ok(config)
}

/// Prints a line per ledger until `--ledgers` arrived, the subscription failed or `shutdown`.
async fn receive(
    sub: &mut ledger_relay_subscriber::Subscription,
    tally: &mut Tally,
    args: &DemoArgs,
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    println!(
        "{:>10} {:>10} {:>10} {:>7} {:>12}",
        "sequence", "size MiB", "wire MiB", "ratio", "delivery ms"
    );
    loop {
        let item = tokio::select! {
            i = sub.next() => i,
            _ = shutdown.cancelled() => return Ok(()),
            _ = tokio::time::sleep(Duration::from_secs(60)) => {
                anyhow::bail!("no ledger for 60 s");
            }
        };
        let ledger = match item {
            Some(Ok(l)) => l,
            Some(Err(e)) => return Err(e.into()),
            None => anyhow::bail!("subscription ended"),
        };
        let delivery_us = ledger.received_ns.saturating_sub(ledger.relay_last_byte_ns) / 1000;
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        println!(
            "{:>10} {:>10.2} {:>10.2} {:>7.2} {:>12.3}",
            ledger.seq,
            mib(ledger.data.len() as u64),
            mib(ledger.wire_bytes),
            ledger.data.len() as f64 / ledger.wire_bytes.max(1) as f64,
            delivery_us as f64 / 1000.0
        );
        if tally.record(&ledger, delivery_us, args.warmup) >= args.ledgers {
            return Ok(());
        }
    }
}

/// What the summary reports: delivery and inter-arrival after the warm-up, bytes, and the
/// process's CPU from the end of the warm-up.
struct Tally {
    delivery: Histogram<u64>,
    inter: Histogram<u64>,
    raw_total: u64,
    wire_total: u64,
    n: u32,
    last_arrival: Option<u64>,
    cpu_at_warmup: Option<Duration>,
    threads_at_warmup: std::collections::BTreeMap<&'static str, Duration>,
}

/// The CPU the process spent after the warm-up: in all, and by thread group.
struct Cpu {
    total: Option<Duration>,
    threads: Vec<(&'static str, Duration)>,
}

impl Tally {
    fn new() -> anyhow::Result<Tally> {
        Ok(Tally {
            delivery: Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?,
            inter: Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?,
            raw_total: 0,
            wire_total: 0,
            n: 0,
            last_arrival: None,
            cpu_at_warmup: None,
            threads_at_warmup: Default::default(),
        })
    }

    /// Counts a ledger; returns how many arrived.
    fn record(&mut self, ledger: &Ledger, delivery_us: u64, warmup: u32) -> u32 {
        self.n += 1;
        if self.n > warmup {
            self.delivery.saturating_record(delivery_us.max(1));
            if let Some(prev) = self.last_arrival {
                let gap_us = ledger.received_ns.saturating_sub(prev) / 1000;
                self.inter.saturating_record(gap_us.max(1));
            }
            self.raw_total += ledger.data.len() as u64;
            self.wire_total += ledger.wire_bytes;
        }
        self.last_arrival = Some(ledger.received_ns);
        if self.n == warmup.max(1) {
            self.cpu_at_warmup = cputime::process_cpu();
            self.threads_at_warmup = cputime::thread_cpu(thread_group);
        }
        self.n
    }

    fn cpu_since_warmup(&self) -> Cpu {
        Cpu {
            total: match (self.cpu_at_warmup, cputime::process_cpu()) {
                (Some(a), Some(b)) => Some(b.saturating_sub(a)),
                _ => None,
            },
            threads: cputime::since(&self.threads_at_warmup, cputime::thread_cpu(thread_group))
                .into_iter()
                .collect(),
        }
    }

    fn print_summary(&self, args: &DemoArgs, cpu: Cpu) {
        let counted = self.delivery.len();
        if counted == 0 {
            return;
        }
        let ms = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
        let hist = &self.delivery;
        println!(
            "\n{counted} ledgers after {} warm-up, {} lanes, codec {}: delivery p50 {:.3} ms, p90 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
            args.warmup,
            args.lanes,
            args.codec,
            ms(hist, 0.5),
            ms(hist, 0.9),
            ms(hist, 0.99),
            hist.max() as f64 / 1000.0
        );
        if let Some(total) = cpu.total {
            let per = |d: Duration| d.as_secs_f64() * 1000.0 / counted.max(1) as f64;
            println!(
                "cpu (relay and subscriber together, this process): {:.1} ms per ledger",
                per(total)
            );
            let listed: Duration = cpu.threads.iter().map(|(_, d)| *d).sum();
            let parts: Vec<String> = cpu
                .threads
                .iter()
                .map(|(g, d)| format!("{g} {:.1}", per(*d)))
                .chain(std::iter::once(format!(
                    "exited threads {:.1}",
                    per(total.saturating_sub(listed))
                )))
                .collect();
            println!("  of which, ms per ledger: {}", parts.join(", "));
        }
        if !self.inter.is_empty() {
            println!(
                "inter-arrival p50 {:.1} ms, max {:.1} ms; wire/raw {:.3} ({:.2}x)",
                ms(&self.inter, 0.5),
                self.inter.max() as f64 / 1000.0,
                self.wire_total as f64 / self.raw_total.max(1) as f64,
                self.raw_total as f64 / self.wire_total.max(1) as f64
            );
        }
    }
}
