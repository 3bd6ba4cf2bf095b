//! A SEP-54 data lake on a loopback S3 server (`moto_server`, on the same cores) for synthetic
//! and the 320 testnet ledgers. In this process: catch-up from a ring against backfill at each
//! prefetch depth (its peak against its bound), and the lake read unchunked. Through sessions: a
//! relay with `--backfill` and a small ring serving a subscriber from the lake's first ledger,
//! against a ring holding it all; its memory against `(depth + 1) x` the largest batch.

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
use ledger_relay_wire::record::{Records, DEFAULT_MAX_RECORD_LEN};

use super::{Part, StorageArgs};
use crate::cluster::{Cluster, RelaySettings, SubSpec};
use crate::procs::{mib, RssSampler};
use crate::report::{table_of, Col};

/// Ledgers the relay reads beyond the lake, and the ring of a backfilling relay.
pub const TAIL: u32 = 20;

/// The testnet dump, under the testdata directory.
pub const TESTNET: &str = "testnet/testnet-1410048-1410367.lcm-v0.framed.xdr";

/// One write or read of a whole set.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ReadRun {
    /// What was read.
    pub what: String,
    /// Which ledgers.
    pub set: String,
    /// Ledgers per second.
    pub ledgers_per_s: f64,
    /// Raw ledger bytes per second, MB/s (10^6).
    pub raw_mb_s: f64,
    /// Object (compressed) or lane bytes per second, MB/s.
    pub object_mb_s: Option<f64>,
    /// Peak bytes the prefetch held.
    pub peak_held_bytes: Option<u64>,
    /// The stated bound of what it holds.
    pub bound_bytes: Option<u64>,
    /// Through a session: ledgers the relay read from the lake, and its resident memory when
    /// the subscriber started and at its peak, MiB.
    pub relay: Option<(u64, f64, f64)>,
}

/// Everything the lake parts measured.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct LakeReport {
    /// Writing each set to the lake.
    pub writes: Vec<ReadRun>,
    /// Reads in this process.
    pub reads: Vec<ReadRun>,
    /// Reads through a relay and a subscriber.
    pub sessions: Vec<ReadRun>,
}

/// A ledger set: its name, ledgers, lake, and largest object.
struct Set {
    name: String,
    ledgers: Vec<BatchLedger>,
    url: LakeUrl,
}

impl Set {
    fn raw(&self) -> u64 {
        self.ledgers.iter().map(|l| l.raw.len() as u64).sum()
    }

    fn largest(&self) -> u64 {
        let objects = self.ledgers.iter().map(|l| 12 + l.raw.len() as u64);
        objects.max().unwrap_or(0)
    }

    fn first(&self) -> u32 {
        self.ledgers[0].info.ledger_seq
    }

    fn run(&self, what: &str, n: u32, raw: u64, secs: f64) -> ReadRun {
        let (name, per_s) = (self.name.clone(), f64::from(n) / secs);
        ReadRun {
            what: what.into(),
            set: name,
            ledgers_per_s: per_s,
            raw_mb_s: raw as f64 / 1e6 / secs,
            ..ReadRun::default()
        }
    }
}

fn batch(raw: Vec<u8>) -> anyhow::Result<BatchLedger> {
    let raw = Bytes::from(raw);
    Ok(BatchLedger {
        info: peek_header(&raw)?.context("a ledger without a header")?,
        raw,
    })
}

/// Runs the parts `p` asks for, the lake on a loopback S3 server started here.
pub fn run(p: &StorageArgs, work: &Path) -> anyhow::Result<LakeReport> {
    let server =
        S3Server::start().context("the loopback S3 server (pip install 'moto[server]')")?;
    let spec = SyntheticSpec {
        size: p.size,
        ratio: p.ratio,
        count: Some(u64::from(p.backfill_ledgers)),
        ..SyntheticSpec::default()
    };
    let file = std::fs::File::open(p.testdata.join(TESTNET))
        .with_context(|| format!("{TESTNET} under {}", p.testdata.display()))?;
    let testnet = Records::new(file, DEFAULT_MAX_RECORD_LEN).map(|r| batch(r?));
    let testnet: Vec<_> = testnet.collect::<anyhow::Result<_>>()?;
    let synthetic = synthetic_ledgers(&spec).map(batch);
    let synthetic: Vec<_> = synthetic.collect::<anyhow::Result<_>>()?;
    let (mib, n) = (p.size as f64 / f64::from(1 << 20), p.backfill_ledgers);
    let mut sets = Vec::new();
    for (name, ledgers) in [
        (format!("synthetic {mib:.1} MiB x{n}"), synthetic),
        ("testnet x320".into(), testnet),
    ] {
        let bucket = unique_bucket("backfill");
        server.create_bucket(&bucket)?;
        sets.push(Set {
            name,
            ledgers,
            url: format!("s3://{bucket}/lake").parse()?,
        });
    }
    let opts = LakeOptions {
        store_config: server.store_config(),
        ..LakeOptions::default()
    };
    let mut report = LakeReport::default();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    for set in &sets {
        report.writes.push(rt.block_on(write(set, &opts))?);
        if p.parts.contains(&Part::Backfill) {
            report
                .reads
                .extend(rt.block_on(reads(p, set, &opts, work))?);
        }
    }
    drop(rt);
    if p.parts.contains(&Part::Sessions) {
        let certs = work.join("certs");
        let relay_extra = vec!["--network".into(), "testnet".into()];
        let c = Cluster {
            certs,
            relay_env: server.env(),
            relay_extra,
            ..Cluster::default()
        };
        for (set, source) in sets.iter().zip([None, Some(p.testdata.join(TESTNET))]) {
            for depth in std::iter::once(None).chain(p.depths.iter().map(|d| Some(*d))) {
                let r = session(&c, work, set, source.as_deref(), p, depth)?;
                eprintln!(
                    "ledger-bench storage: {} {}: {:.1} ledgers/s",
                    r.set, r.what, r.ledgers_per_s
                );
                report.sessions.push(r);
            }
        }
    }
    Ok(report)
}

/// Writes `set` to its lake as the exporter does (one ledger per object, zstd 3).
async fn write(set: &Set, opts: &LakeOptions) -> anyhow::Result<ReadRun> {
    let lake = Lake::open_for_writing(
        &set.url,
        opts,
        TESTNET_PASSPHRASE,
        Layout::default(),
        Arc::new(LakeStats::default()),
    )
    .await?;
    let t = Instant::now();
    let mut asm = BatchAssembler::new(lake.schema(), None);
    for l in &set.ledgers {
        asm.offer(l.clone())?;
        if let Some(batch) = asm.take_ready() {
            lake.put_batch(&batch, 3).await?;
        }
    }
    let secs = t.elapsed().as_secs_f64();
    let mut w = set.run(
        "lake write (zstd 3, put-if-absent)",
        set.ledgers.len() as u32,
        set.raw(),
        secs,
    );
    w.object_mb_s = Some(lake.stats().bytes_written.load(Ordering::Relaxed) as f64 / 1e6 / secs);
    Ok(w)
}

/// Catch-up from a ring holding `set`, then backfill at each depth, then the lake alone.
async fn reads(
    p: &StorageArgs,
    set: &Set,
    opts: &LakeOptions,
    work: &Path,
) -> anyhow::Result<Vec<ReadRun>> {
    let (n, first) = (set.ledgers.len() as u32, set.first());
    let last = first + n - 1;
    let pipeline = PipelineConfig::default();
    let mut rc = RingConfig::new(work.join(format!("ring-{first}")));
    rc.max_ledgers = n + 10;
    let ring = Ring::open(&rc)?;
    let mut comp = Compressor::new(pipeline.codec, pipeline.zstd_level);
    for l in &set.ledgers {
        let c = complete_ledger(&l.raw, &l.info, &pipeline, &mut comp, 0, 0);
        ring.append(&c.end, &stored_chunks(&c))?;
    }
    ring.flush()?;
    drop(ring);
    // Reopened, as a relay after a restart; its page cache is warm, as on a live relay.
    let ring = Arc::new(Ring::open(&rc)?);
    let t = Instant::now();
    for seq in first..=last {
        let r = ring.clone();
        let (end, chunks) = tokio::task::spawn_blocking(move || r.get(seq))
            .await??
            .context("the ring lacks a ledger it was given")?;
        std::hint::black_box(stored_ledger(end, chunks));
    }
    let mut out = vec![set.run(
        "ring catch-up (Ring::get, verified)",
        n,
        set.raw(),
        t.elapsed().as_secs_f64(),
    )];
    let measured = |what: String, got: u32, t: Instant, stats: &LakeStats, depth: usize| {
        if got != n {
            bail!("{what}: {got} of {n} ledgers");
        }
        let secs = t.elapsed().as_secs_f64();
        let mut r = set.run(&what, n, set.raw(), secs);
        r.object_mb_s = Some(stats.bytes_read.load(Ordering::Relaxed) as f64 / 1e6 / secs);
        r.peak_held_bytes = Some(stats.prefetch_peak_bytes.load(Ordering::Relaxed));
        r.bound_bytes = Some(depth as u64 * set.largest());
        Ok(r)
    };
    for &depth in &p.depths {
        let stats = Arc::new(LakeStats::default());
        let mut cfg = BackfillConfig::new(set.url.clone(), Some(TESTNET_PASSPHRASE.into()));
        cfg.options = opts.clone();
        cfg.prefetch = PrefetchOptions {
            depth,
            ..PrefetchOptions::default()
        };
        let backfill = Backfill::new(cfg, &pipeline, stats.clone());
        backfill.lake().await?;
        let (t, mut got) = (Instant::now(), 0u32);
        let mut cursor = backfill.cursor(first, last).await?;
        while let Some(l) = cursor.fetch(cursor.position()).await? {
            std::hint::black_box(&l);
            got += 1;
        }
        out.push(measured(
            format!("backfill from S3, prefetch {depth}, chunked (zstd 1)"),
            got,
            t,
            &stats,
            depth,
        )?);
    }
    let stats = Arc::new(LakeStats::default());
    let lake = Arc::new(Lake::open(&set.url, opts, Some(TESTNET_PASSPHRASE), stats.clone()).await?);
    let (t, mut got) = (Instant::now(), 0u32);
    let mut c = LakeCursor::new(
        lake,
        first,
        last,
        PrefetchOptions {
            depth: 8,
            ..PrefetchOptions::default()
        },
    );
    while let Some(l) = c.next().await? {
        std::hint::black_box(&l);
        got += 1;
    }
    out.push(measured(
        "lake read from S3, prefetch 8, raw (verified, not chunked)".into(),
        got,
        t,
        &stats,
        8,
    )?);
    Ok(out)
}

/// One relay and subscriber through `set`: `depth` `None` is catch-up from a ring holding it all.
fn session(
    c: &Cluster,
    work: &Path,
    set: &Set,
    file: Option<&Path>,
    p: &StorageArgs,
    depth: Option<usize>,
) -> anyhow::Result<ReadRun> {
    let (n, first) = (
        set.ledgers.len() as u32 - if file.is_some() { TAIL } else { 0 },
        set.first(),
    );
    let dir = work.join(format!("session-{first}-{depth:?}"));
    let total = n + TAIL;
    // As fast as the relay's pipeline keeps up with: the subscription starts once it is all in.
    let cadence = if file.is_some() { 5.0 } else { 50.0 };
    let s = RelaySettings {
        count: Some(total),
        start: first,
        emit_ms: 1.0,
        retention: if depth.is_some() { TAIL } else { total + 10 },
        ..RelaySettings::endless(p.size, p.ratio, cadence)
    };
    let source = file.map_or_else(|| s.synthetic_source(), |f| format!("file:{}", f.display()));
    let extra: Vec<String> = depth.map_or(vec![], |d| {
        vec![
            "--backfill".into(),
            set.url.to_string(),
            "--backfill-prefetch".into(),
            d.to_string(),
        ]
    });
    let mut relay = c.relay_in(None, &dir, &s, &source, &extra)?;
    let last = first + total - 1;
    relay.wait_newest(last, Duration::from_secs(600))?;
    let rss = RssSampler::start(relay.pid, Duration::from_millis(20), 100_000);
    let spec = SubSpec::new("sub-0", first, Some(total), 4, &dir, "sub");
    let ran = c.run_subscriber(
        None,
        &relay.addr.to_string(),
        &spec,
        Duration::from_secs(600),
    );
    let samples = rss.finish();
    let (records, _) = ran?;
    let m = relay.scrape()?;
    relay.stop();
    if !records.iter().map(|r| r.seq).eq(first..=last) {
        bail!(
            "the subscriber got {} ledgers, not {total} in order",
            records.len()
        );
    }
    let timed = &records[..n as usize];
    let secs = (timed[timed.len() - 1].received_unix_ms - timed[0].received_unix_ms) / 1e3;
    // The first ledger's own bytes arrive before its receipt time: count the others.
    let rest = &timed[1..];
    let what = depth.map_or("ring catch-up".into(), |d| format!("lake, prefetch {d}"));
    let mut r = set.run(
        &what,
        rest.len() as u32,
        rest.iter().map(|r| r.raw_bytes).sum(),
        secs,
    );
    r.object_mb_s = Some(rest.iter().map(|r| r.wire_bytes).sum::<u64>() as f64 / 1e6 / secs);
    let mut peak = m.labelled("lake_prefetch_peak_bytes");
    let peak = peak
        .find(|(l, _)| l.contains("backfill"))
        .map(|(_, v)| v as u64);
    r.peak_held_bytes = depth.and(peak);
    r.bound_bytes = depth.map(|d| (d as u64 + 1) * set.largest());
    let (before, top) = (
        samples.first().map_or(0, |s| s.rss_kib),
        samples.iter().map(|s| s.rss_kib).max().unwrap_or(0),
    );
    r.relay = Some((
        m.get("lake_backfill_ledgers_total") as u64,
        mib(before),
        mib(top),
    ));
    Ok(r)
}

fn m(b: Option<u64>) -> String {
    f(b.map(|b| b as f64 / f64::from(1 << 20)))
}

fn f(v: Option<f64>) -> String {
    crate::report::opt(v, 1)
}

/// The lake tables.
pub fn table(r: &LakeReport) -> String {
    let cols: [Col<ReadRun>; 10] = [
        Col::l("set", 24, |x| x.set.clone()),
        Col::l("what", 57, |x| x.what.clone()),
        Col::r("ledgers/s", 9, |x| format!("{:.1}", x.ledgers_per_s)),
        Col::r("raw MB/s", 9, |x| format!("{:.1}", x.raw_mb_s)),
        Col::r("obj MB/s", 9, |x| f(x.object_mb_s)),
        Col::r("peak MiB", 9, |x| m(x.peak_held_bytes)),
        Col::r("bound MiB", 9, |x| m(x.bound_bytes)),
        Col::r("from lake", 9, |x| {
            x.relay.map_or("-".into(), |r| r.0.to_string())
        }),
        Col::r("RSS0", 7, |x| f(x.relay.map(|r| r.1))),
        Col::r("RSS peak", 8, |x| f(x.relay.map(|r| r.2))),
    ];
    let mut out = String::new();
    for (title, rows) in [
        ("lake writes", &r.writes),
        ("reads in this process", &r.reads),
        (
            "through a relay and a subscriber (4 lanes; obj: lane bytes)",
            &r.sessions,
        ),
    ] {
        if !rows.is_empty() {
            out += &format!("\n{title}:\n{}", table_of(&cols, rows, 0, |_| None));
        }
    }
    out
}
