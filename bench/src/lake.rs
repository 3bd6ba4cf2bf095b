//! `ledger-bench lake`: what SEP-54 data lakes cost the relay and what they give it.
//!
//! 1. **Delivery with and without `--export`**: the real relay fed synthetic Phase 3 ledgers
//!    (14.5 MiB, zstd ratio 7.6, every 600 ms) and one 4-lane `ledger-subscribe` from the tip,
//!    in rounds of three runs each: no export, export to a local directory (`file://`), export
//!    to a real S3-protocol server on loopback (`moto_server`). Delivery p50/p99/max of each,
//!    and the ratio of the p99s to the run without export of the same round.
//! 2. **Backfill against catch-up from the ring**: the same ledgers written to a lake on the
//!    loopback S3 server and to a ring; then, in this process, the rate at which a session's
//!    source side gets them: `Ring::get` into the relay's chunked form (what catch-up from the
//!    ring does), and the backfill API (`Backfill::cursor` / `fetch`: fetch, decompress, decode
//!    and check the batch, then chunk and compress as the pipeline does) at several prefetch
//!    depths, with the bytes the prefetch held at its peak against its stated bound. The lake
//!    is also read without chunking, to show where the time goes, and the 320 real testnet
//!    ledgers (small objects, where per-request latency dominates) are run too.
//!
//! 3. **Backfill through a session** ([`session`]): the release relay with `--backfill` on
//!    that lake and a ring smaller than the history, and a real `ledger-subscribe` from the
//!    lake's first ledger, against the same relay with a ring holding it all: ledgers/s and
//!    MB/s at the subscriber, and the relay's memory against the prefetch bound.
//!
//! The S3 server is Python (moto) on the same two cores: its CPU is part of what is measured.

mod session;

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::Bytes;
use ledger_relay::hub::{stored_chunks, stored_ledger};
use ledger_relay::lake::backfill::{Backfill, BackfillConfig};
use ledger_relay::ring::{Ring, RingConfig};
use ledger_relay::source::{synthetic_ledgers, SyntheticSpec};
use ledger_relay::{complete_ledger, PipelineConfig};
use ledger_relay_lake::testing::{unique_bucket, S3Server};
use ledger_relay_lake::{
    BatchAssembler, BatchLedger, Lake, LakeCursor, LakeOptions, LakeStats, LakeUrl, Layout,
    PrefetchOptions, TESTNET_PASSPHRASE,
};
use ledger_relay_wire::compress::Compressor;
use ledger_relay_wire::header::peek_header;

use crate::cluster::{RelaySettings, SubSpec};
use crate::harness::make_certs;
use crate::report::{table_of, Col};
use crate::stats::{summarize, Summary};

/// `ledger-bench lake` arguments.
#[derive(Debug, Clone, clap::Args)]
#[command(mut_arg("ledgers", |a| a.default_value("60").default_value_if("quick", "true", "20").help("Ledgers per delivery run, warm-up included (quick: 20)")))]
#[command(mut_arg("quick", |a| a.help("About two minutes: 20 ledgers per delivery run, one round, 16 ledgers to backfill")))]
pub struct LakeArgs {
    /// `--quick`.
    #[command(flatten)]
    pub quick: crate::cluster::Quick,
    /// `--ledgers` [default: 60, quick 20] and `--warmup`.
    #[command(flatten)]
    pub series: crate::cluster::Series,
    /// Rounds of the three delivery runs (quick: 1).
    #[arg(long, default_value_t = 2, default_value_if("quick", "true", "1"))]
    pub rounds: u32,
    /// `--cadence`.
    #[command(flatten)]
    pub cadence: crate::cluster::Cadence,
    /// `--size`.
    #[command(flatten)]
    pub size: crate::cluster::Size,
    /// `--ratio`.
    #[command(flatten)]
    pub ratio: crate::cluster::Ratio,
    /// zstd level of the exported objects (`--export-zstd-level`).
    #[arg(long, default_value_t = 1)]
    pub export_level: i32,
    /// Ledgers in the backfill lake and ring (quick: 16).
    #[arg(long, default_value_t = 40, default_value_if("quick", "true", "16"))]
    pub backfill_ledgers: u32,
    /// Prefetch depths to compare (objects fetched ahead).
    #[arg(long, value_delimiter = ',', default_value = "1,4,8,16")]
    pub depths: Vec<usize>,
    /// Only the delivery runs.
    #[arg(long)]
    pub delivery_only: bool,
    /// Only the backfill runs (the backfill API and through sessions).
    #[arg(long)]
    pub backfill_only: bool,
    /// Of the backfill runs, only those through a relay and a subscriber.
    #[arg(long)]
    pub sessions_only: bool,
    /// `--testdata`.
    #[command(flatten)]
    pub testdata: crate::cluster::Testdata,
    /// `--json`.
    #[command(flatten)]
    pub json: crate::cluster::Json,
}

/// One delivery run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DeliveryRun {
    /// Round.
    pub round: u32,
    /// `off`, `file` or `s3`.
    pub export: String,
    /// Delivery summary after warm-up.
    pub summary: Summary,
    /// Newest ledger in the export lake when the run ended (0 without export).
    pub exported_newest: u64,
    /// Newest ledger the subscriber got.
    pub delivered_newest: u32,
    /// Whether the export was degraded at the end.
    pub export_degraded: bool,
}

/// One backfill or ring read.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ReadRun {
    /// What was read.
    pub what: String,
    /// Which ledgers.
    pub set: String,
    /// Ledgers.
    pub ledgers: u32,
    /// Seconds.
    pub secs: f64,
    /// Ledgers per second.
    pub ledgers_per_s: f64,
    /// Raw ledger bytes per second, MB/s (10^6).
    pub raw_mb_s: f64,
    /// Object (compressed) bytes per second, MB/s, for lake reads.
    pub object_mb_s: Option<f64>,
    /// Peak bytes the prefetch held.
    pub peak_held_bytes: Option<u64>,
    /// The stated bound for that depth: depth x the largest batch, MiB.
    pub bound_bytes: Option<u64>,
}

/// Everything `ledger-bench lake` measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LakeReport {
    /// Delivery runs.
    pub delivery: Vec<DeliveryRun>,
    /// Reads.
    pub reads: Vec<ReadRun>,
    /// Writing the backfill lake (objects put by the lake crate, as the exporter does).
    pub writes: Vec<ReadRun>,
    /// Backfill through a relay and a subscriber, against catch-up from the ring.
    pub sessions: Vec<session::SessionRun>,
}

fn delivery(a: &LakeArgs, work: &Path, server: &S3Server) -> anyhow::Result<Vec<DeliveryRun>> {
    let certs = work.join("certs");
    make_certs(&certs, 1)?;
    let mut cluster = crate::cluster::Cluster::local(&certs, Default::default())?;
    cluster.relay_env = server.env();
    a.series.check()?;
    let ledgers = a.series.count.ledgers;
    let settings = RelaySettings::endless(a.size.ledger_bytes, a.ratio.ratio, a.cadence.cadence_ms);
    let mut out = Vec::new();
    for round in 0..a.rounds {
        for export in ["off", "file", "s3"] {
            let dir = work.join(format!("delivery-{round}-{export}"));
            let mut extra: Vec<String> = Vec::new();
            match export {
                "file" => extra.extend([
                    "--network".into(),
                    "testnet".into(),
                    "--export".into(),
                    format!("file://{}/lake", dir.display()),
                    "--export-zstd-level".into(),
                    a.export_level.to_string(),
                ]),
                "s3" => {
                    let bucket = unique_bucket(&format!("delivery-{round}"));
                    server.create_bucket(&bucket)?;
                    extra.extend([
                        "--network".into(),
                        "testnet".into(),
                        "--export".into(),
                        format!("s3://{bucket}/testnet"),
                        "--export-zstd-level".into(),
                        a.export_level.to_string(),
                    ]);
                }
                _ => {}
            }
            let relay = cluster.relay(&dir, &settings, &extra)?;
            let spec = SubSpec::new("sub-0", "tip", Some(ledgers), 4, &dir, "sub");
            let limit = Duration::from_secs_f64(
                30.0 + f64::from(ledgers) * a.cadence.cadence_ms / 1e3 * 3.0,
            );
            let addr = relay.addr.to_string();
            let (records, _) = cluster.run_subscriber(None, &addr, &spec, limit)?;
            // Let the export finish the last ledger before reading its metrics.
            std::thread::sleep(Duration::from_millis(if export == "off" {
                0
            } else {
                1500
            }));
            let scrape = relay.scrape()?;
            let _ = relay.stop();
            let run = DeliveryRun {
                round,
                export: export.into(),
                summary: summarize(
                    std::slice::from_ref(&records),
                    a.series.warmup as usize,
                    8.0,
                ),
                exported_newest: scrape.get("lake_export_newest") as u64,
                delivered_newest: records.last().map_or(0, |r| r.seq),
                export_degraded: scrape.get("lake_export_degraded") > 0.0,
            };
            eprintln!(
                "delivery round {round} export {export}: p50 {:.2} ms p99 {:.2} ms max {:.2} ms, exported to {} of {}",
                run.summary.p50_ms,
                run.summary.p99_ms,
                run.summary.max_ms,
                run.exported_newest,
                run.delivered_newest
            );
            out.push(run);
        }
    }
    Ok(out)
}

fn ledger_set(spec: &SyntheticSpec) -> Vec<BatchLedger> {
    synthetic_ledgers(spec)
        .map(|raw| {
            let raw = Bytes::from(raw);
            let info = peek_header(&raw)
                .ok()
                .flatten()
                .expect("synthetic ledgers have valid headers");
            BatchLedger { info, raw }
        })
        .collect()
}

fn testnet_set(testdata: &Path) -> anyhow::Result<Vec<BatchLedger>> {
    let path = testdata.join("testnet/testnet-1410048-1410367.lcm-v0.framed.xdr");
    let file = std::fs::File::open(&path).with_context(|| format!("{}", path.display()))?;
    ledger_relay_wire::record::Records::new(file, ledger_relay_wire::record::DEFAULT_MAX_RECORD_LEN)
        .map(|r| {
            let raw = Bytes::from(r?);
            let info = peek_header(&raw)?.context("no header")?;
            Ok(BatchLedger { info, raw })
        })
        .collect()
}

fn mb(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / 1e6 / secs
}

pub(crate) fn read_run(what: &str, set: &str, n: u32, raw: u64, secs: f64) -> ReadRun {
    ReadRun {
        what: what.into(),
        set: set.into(),
        ledgers: n,
        secs,
        ledgers_per_s: f64::from(n) / secs,
        raw_mb_s: mb(raw, secs),
        object_mb_s: None,
        peak_held_bytes: None,
        bound_bytes: None,
    }
}

/// One read of a whole set from the lake through prefetch.
struct Read<'a> {
    set: &'a str,
    /// Ledgers asked for.
    n: u32,
    raw_total: u64,
    /// The stated bound of what prefetch holds.
    bound: u64,
}

impl Read<'_> {
    /// The row of a read that gave `got` ledgers in `took`, with what `stats` counted.
    fn run(
        &self,
        what: &str,
        got: u32,
        took: Duration,
        stats: &LakeStats,
    ) -> anyhow::Result<ReadRun> {
        let (n, secs) = (self.n, took.as_secs_f64());
        if got != n {
            bail!("{what}: {got} of {n} ledgers");
        }
        let mut r = read_run(what, self.set, n, self.raw_total, secs);
        r.object_mb_s = Some(mb(stats.bytes_read.load(Ordering::Relaxed), secs));
        r.peak_held_bytes = Some(stats.prefetch_peak_bytes.load(Ordering::Relaxed));
        r.bound_bytes = Some(self.bound);
        Ok(r)
    }
}

async fn backfill_set(
    a: &LakeArgs,
    work: &Path,
    server: &S3Server,
    set: &str,
    ledgers: &[BatchLedger],
    report: &mut LakeReport,
) -> anyhow::Result<LakeUrl> {
    let n = ledgers.len() as u32;
    let raw_total: u64 = ledgers.iter().map(|l| l.raw.len() as u64).sum();
    let first = ledgers[0].info.ledger_seq;
    let last = first + n - 1;
    let bucket = unique_bucket(&format!("backfill-{set}"));
    server.create_bucket(&bucket)?;
    let url: LakeUrl = format!("s3://{bucket}/lake").parse()?;
    let opts = LakeOptions {
        store_config: server.store_config(),
        ..LakeOptions::default()
    };
    // The lake, written as the exporter writes (one ledger per object, zstd 3).
    let lake = Lake::open_for_writing(
        &url,
        &opts,
        TESTNET_PASSPHRASE,
        Layout::default(),
        Arc::new(LakeStats::default()),
    )
    .await?;
    let t = Instant::now();
    let mut asm = BatchAssembler::new(lake.schema(), None);
    for l in ledgers {
        asm.offer(l.clone())?;
        if let Some(batch) = asm.take_ready() {
            lake.put_batch(&batch, 3).await?;
        }
    }
    let secs = t.elapsed().as_secs_f64();
    let mut w = read_run(
        "lake write (zstd 3, put-if-absent)",
        set,
        n,
        raw_total,
        secs,
    );
    let written = lake.stats().bytes_written.load(Ordering::Relaxed);
    w.object_mb_s = Some(mb(written, secs));
    report.writes.push(w);
    if a.sessions_only {
        return Ok(url);
    }

    // The ring, holding the same ledgers as the pipeline stores them.
    let pipeline = PipelineConfig::default();
    let ring_dir = work.join(format!("ring-{set}"));
    let mut rc = RingConfig::new(&ring_dir);
    rc.max_ledgers = n + 10;
    let ring = Ring::open(&rc)?;
    let mut comp = Compressor::new(pipeline.codec, pipeline.zstd_level);
    for l in ledgers {
        let c = complete_ledger(&l.raw, &l.info, &pipeline, &mut comp, 0, 0);
        let chunks = stored_chunks(&c);
        ring.append(&c.end, &chunks)?;
    }
    ring.flush()?;
    drop(ring);
    // Reopened, as a relay after a restart: its page cache is warm, as on a live relay.
    let ring = Arc::new(Ring::open(&rc)?);
    let t = Instant::now();
    for seq in first..=last {
        let r = ring.clone();
        let (end, chunks) = tokio::task::spawn_blocking(move || r.get(seq))
            .await??
            .context("the ring lacks a ledger it was given")?;
        // What the session's catch-up builds from a ring read.
        let l = stored_ledger(end, chunks);
        std::hint::black_box(&l);
    }
    report.reads.push(read_run(
        "ring catch-up (Ring::get, verified)",
        set,
        n,
        raw_total,
        t.elapsed().as_secs_f64(),
    ));

    let largest = ledgers
        .iter()
        .map(|l| 12 + l.raw.len() as u64)
        .max()
        .unwrap_or(0);
    // A prefetch of `depth` holds at most that many of the largest objects.
    let read = |depth: usize| Read {
        set,
        n,
        raw_total,
        bound: depth as u64 * largest,
    };
    for &depth in &a.depths {
        let stats = Arc::new(LakeStats::default());
        let mut cfg = BackfillConfig::new(url.clone(), Some(TESTNET_PASSPHRASE.into()));
        cfg.options = opts.clone();
        cfg.prefetch = PrefetchOptions {
            depth,
            ..PrefetchOptions::default()
        };
        let backfill = Backfill::new(cfg, &pipeline, stats.clone());
        backfill.lake().await?;
        let t = Instant::now();
        let mut cursor = backfill.cursor(first, last).await?;
        let mut got = 0u32;
        while let Some(l) = cursor.fetch(cursor.position()).await? {
            std::hint::black_box(&l);
            got += 1;
        }
        let what = format!("backfill from S3, prefetch {depth}, chunked (zstd 1)");
        let row = read(depth).run(&what, got, t.elapsed(), &stats)?;
        report.reads.push(row);
    }
    // The lake alone: fetch, decompress, decode and check, no chunking.
    let depth = 8;
    let stats = Arc::new(LakeStats::default());
    let lake = Arc::new(Lake::open(&url, &opts, Some(TESTNET_PASSPHRASE), stats.clone()).await?);
    let t = Instant::now();
    let mut c = LakeCursor::new(
        lake,
        first,
        last,
        PrefetchOptions {
            depth,
            ..PrefetchOptions::default()
        },
    );
    let mut got = 0;
    while let Some(l) = c.next().await? {
        std::hint::black_box(&l);
        got += 1;
    }
    let what = format!("lake read from S3, prefetch {depth}, raw (verified, not chunked)");
    let row = read(depth).run(&what, got, t.elapsed(), &stats)?;
    report.reads.push(row);
    Ok(url)
}

fn backfill(
    a: &LakeArgs,
    work: &Path,
    server: &S3Server,
    report: &mut LakeReport,
) -> anyhow::Result<()> {
    let n = a.backfill_ledgers;
    let spec = SyntheticSpec {
        size: a.size.ledger_bytes,
        ratio: a.ratio.ratio,
        count: Some(u64::from(n)),
        start: 2,
        ..SyntheticSpec::default()
    };
    let synthetic = ledger_set(&spec);
    let testnet = testnet_set(&a.testdata.testdata)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let name = format!(
        "synthetic {:.1} MiB x{n}",
        a.size.ledger_bytes as f64 / f64::from(1 << 20)
    );
    let (synthetic_url, testnet_url) = rt.block_on(async {
        let s = backfill_set(a, work, server, &name, &synthetic, report).await?;
        let t = backfill_set(a, work, server, "testnet x320", &testnet, report).await?;
        anyhow::Ok((s, t))
    })?;
    drop(rt);
    let largest = |set: &[BatchLedger]| {
        set.iter()
            .map(|l| 12 + l.raw.len() as u64)
            .max()
            .unwrap_or(0)
    };
    // The relay's source makes the lake's ledgers (the same spec makes the same chain) and
    // twenty more, which its ring keeps.
    let source = RelaySettings {
        size: a.size.ledger_bytes,
        ratio: a.ratio.ratio,
        count: Some(n + session::TAIL),
        start: 2,
        cadence_ms: 0.0,
        emit_ms: 0.0,
        codec: "zstd".into(),
        chunk: 256 << 10,
        retention: 0,
    }
    .synthetic_source();
    let testnet_first = testnet[0].info.ledger_seq;
    let sets = [
        session::SessionSet {
            name: &name,
            url: &synthetic_url,
            n,
            first: 2,
            source,
            largest: largest(&synthetic),
            cadence_ms: 50.0,
        },
        session::SessionSet {
            name: "testnet x320",
            url: &testnet_url,
            n: testnet.len() as u32 - session::TAIL,
            first: testnet_first,
            source: format!(
                "file:{}",
                a.testdata
                    .testdata
                    .join("testnet/testnet-1410048-1410367.lcm-v0.framed.xdr")
                    .display()
            ),
            largest: largest(&testnet),
            cadence_ms: 5.0,
        },
    ];
    for set in &sets {
        for depth in std::iter::once(None).chain(a.depths.iter().map(|d| Some(*d))) {
            let r = session::run(work, server, set, depth)?;
            eprintln!(
                "session {} {}: {:.1} ledgers/s, {:.1} MB/s raw, {} from the lake, relay RSS {:.1} -> {:.1} MiB",
                r.read.set, r.read.what, r.read.ledgers_per_s, r.read.raw_mb_s, r.from_lake, r.rss_before_mib, r.rss_peak_mib
            );
            report.sessions.push(r);
        }
    }
    Ok(())
}

/// Runs the benchmark.
pub fn run(a: &LakeArgs) -> anyhow::Result<LakeReport> {
    let work = tempfile::tempdir()?;
    let server =
        S3Server::start().context("the loopback S3 server (pip install 'moto[server]')")?;
    let mut report = LakeReport {
        delivery: Vec::new(),
        reads: Vec::new(),
        writes: Vec::new(),
        sessions: Vec::new(),
    };
    if !a.backfill_only {
        report.delivery = delivery(a, work.path(), &server)?;
    }
    if !a.delivery_only {
        backfill(a, work.path(), &server, &mut report)?;
    }
    Ok(report)
}

/// Bytes as MiB with one decimal, `-` for none.
fn mib(b: Option<u64>) -> String {
    b.map_or("-".into(), |b| {
        format!("{:.1}", b as f64 / f64::from(1 << 20))
    })
}

/// The report as text.
pub fn summary(r: &LakeReport) -> String {
    let mut out = String::new();
    if !r.delivery.is_empty() {
        out.push_str("delivery, 1 subscriber x 4 lanes, from the tip:\n");
        let cols: [Col<(&DeliveryRun, Option<&Summary>)>; 10] = [
            Col::r("round", 5, |(d, _)| d.round.to_string()),
            Col::l("export", 6, |(d, _)| d.export.clone()),
            Col::r("ledgers", 9, |(d, _)| d.summary.ledgers.to_string()),
            Col::r("p50 ms", 8, |(d, _)| format!("{:.2}", d.summary.p50_ms)),
            Col::r("p90 ms", 8, |(d, _)| format!("{:.2}", d.summary.p90_ms)),
            Col::r("p99 ms", 8, |(d, _)| format!("{:.2}", d.summary.p99_ms)),
            Col::r("max ms", 8, |(d, _)| format!("{:.2}", d.summary.max_ms)),
            Col::r("p50/off", 8, |(d, o)| {
                format!("{:.2}", o.map_or(f64::NAN, |o| d.summary.p50_ms / o.p50_ms))
            }),
            Col::r("p99/off", 8, |(d, o)| {
                format!("{:.2}", o.map_or(f64::NAN, |o| d.summary.p99_ms / o.p99_ms))
            }),
            Col::l(" exported", 0, |(d, _)| match d.export.as_str() {
                "off" => " -".into(),
                _ => format!(
                    " to {} of {}{}",
                    d.exported_newest,
                    d.delivered_newest,
                    if d.export_degraded { " (degraded)" } else { "" }
                ),
            }),
        ];
        let off = |d: &DeliveryRun| {
            r.delivery
                .iter()
                .find(|x| x.round == d.round && x.export == "off")
                .map(|x| &x.summary)
        };
        let rows: Vec<_> = r.delivery.iter().map(|d| (d, off(d))).collect();
        out.push_str(&table_of(&cols, &rows, (0, ""), |_| None));
    }
    for (title, rows) in [("lake writes", &r.writes), ("reads", &r.reads)] {
        if !rows.is_empty() {
            let cols: [Col<ReadRun>; 7] = [
                Col::l("set", 26, |x| x.set.clone()),
                Col::l("what", 57, |x| x.what.clone()),
                Col::r("ledgers/s", 9, |x| format!("{:.1}", x.ledgers_per_s)),
                Col::r("raw MB/s", 10, |x| format!("{:.1}", x.raw_mb_s)),
                Col::r("object MB/s", 12, |x| {
                    x.object_mb_s.map_or("-".into(), |v| format!("{v:.1}"))
                }),
                Col::r("peak held MiB", 14, |x| mib(x.peak_held_bytes)),
                Col::r("bound MiB", 10, |x| mib(x.bound_bytes)),
            ];
            out.push_str(&format!("{title}:\n"));
            out.push_str(&table_of(&cols, rows, (0, ""), |_| None));
        }
    }
    if !r.sessions.is_empty() {
        out.push_str("through a relay and a subscriber (4 lanes):\n");
        let cols: [Col<session::SessionRun>; 10] = [
            Col::l("set", 26, |x| x.read.set.clone()),
            Col::l("what", 18, |x| x.read.what.clone()),
            Col::r("ledgers/s", 11, |x| format!("{:.1}", x.read.ledgers_per_s)),
            Col::r("raw MB/s", 10, |x| format!("{:.1}", x.read.raw_mb_s)),
            Col::r("wire MB/s", 10, |x| format!("{:.1}", x.wire_mb_s)),
            Col::r("from lake", 10, |x| x.from_lake.to_string()),
            Col::r("RSS before", 11, |x| format!("{:.1}", x.rss_before_mib)),
            Col::r("RSS peak", 9, |x| format!("{:.1}", x.rss_peak_mib)),
            Col::r("prefetch peak MiB", 18, |x| mib(x.read.peak_held_bytes)),
            Col::r("bound MiB", 10, |x| mib(x.read.bound_bytes)),
        ];
        out.push_str(&table_of(&cols, &r.sessions, (0, ""), |_| None));
    }
    out
}

/// The whole command: runs, prints the summary, writes `--json`.
pub fn main(a: &LakeArgs) -> anyhow::Result<()> {
    crate::cluster::emit_json(&run(a)?, &a.json)
}

impl crate::cluster::Table for LakeReport {
    fn table(&self) -> String {
        summary(self)
    }
}
