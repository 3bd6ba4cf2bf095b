//! Backfill through a session: the release `ledger-relay run` with a ring smaller than the
//! history asked for and `--backfill` on the loopback S3 lake, and one `ledger-subscribe`
//! (4 lanes, verifying everything it gets) from the first ledger the lake holds, against the
//! same relay with a ring that holds it all (catch-up from the ring). The relay's source is the
//! lake's own ledgers and twenty more, read before the subscriber starts, so the subscription
//! crosses from the lake into the ring (which the relay and the subscriber both check).
//!
//! Timed: the lake's ledgers (or the same ones from the ring), from the first to the last
//! received (the subscriber's `received_unix_ms`). Memory: the relay's resident set sampled
//! every 20 ms during the subscription, against the stated bound of one backfilling session
//! (the cursor's `(depth + 1) x` largest decoded batch), and the relay's own count of what the
//! prefetch held (`lake_prefetch_peak_bytes{lake="backfill"}`).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use ledger_relay_lake::testing::S3Server;
use ledger_relay_lake::LakeUrl;

use super::{read_run, ReadRun};
use crate::cluster::{RelaySettings, SubSpec};
use crate::harness::{http_get, mib, RssSampler};

/// Ledgers the relay reads beyond the lake, and the ring of a backfill run.
pub const TAIL: u32 = 20;

/// One subscription through the relay.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SessionRun {
    /// The rate, first to last of the lake's ledgers received, with what the relay's backfill
    /// prefetch held at its peak (`lake_prefetch_peak_bytes{lake="backfill"}`) and the stated
    /// bound of one backfilling session.
    #[serde(flatten)]
    pub read: ReadRun,
    /// Bytes on the lanes per second (compressed chunks), MB/s.
    pub wire_mb_s: f64,
    /// Ledgers the relay read from the lake for the session.
    pub from_lake: u64,
    /// Relay resident set when the subscriber started, MiB.
    pub rss_before_mib: f64,
    /// Its largest sample during the subscription, MiB.
    pub rss_peak_mib: f64,
}

/// A ledger set in the lake, and how the relay's source makes the same ledgers.
pub struct SessionSet<'a> {
    /// Its name in the report.
    pub name: &'a str,
    /// The lake holding its first `n` ledgers.
    pub url: &'a LakeUrl,
    /// Ledgers in the lake.
    pub n: u32,
    /// First sequence.
    pub first: u32,
    /// The relay's source: the lake's ledgers and [`TAIL`] more.
    pub source: String,
    /// Largest decoded batch, bytes (one ledger per object).
    pub largest: u64,
    /// The source's cadence, ms: as fast as the relay's pipeline keeps up with.
    pub cadence_ms: f64,
}

fn labelled(text: &str, name: &str, labels: &str) -> Option<u64> {
    let key = format!("ledger_relay_{name}{{{labels}}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&key))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
}

/// One relay and one subscriber: `depth` `None` is catch-up from a ring holding everything.
pub fn run(
    work: &Path,
    server: &S3Server,
    set: &SessionSet<'_>,
    depth: Option<usize>,
) -> anyhow::Result<SessionRun> {
    let tag = depth.map_or("ring".to_string(), |d| format!("lake-{d}"));
    let dir = work.join(format!("session-{}-{tag}", set.first));
    let certs = work.join("certs");
    if !certs.exists() {
        crate::harness::make_certs(&certs, 1)?;
    }
    let total = set.n + TAIL;
    let settings = RelaySettings {
        size: 0,
        ratio: 1.0,
        count: Some(total),
        start: set.first,
        // The subscription starts once all of it is in the relay.
        cadence_ms: set.cadence_ms,
        emit_ms: 1.0,
        codec: "zstd".into(),
        chunk: 256 << 10,
        retention: if depth.is_some() { TAIL } else { total + 10 },
    };
    let mut extra: Vec<String> = vec!["--network".into(), "testnet".into()];
    if let Some(d) = depth {
        extra.extend([
            "--backfill".into(),
            set.url.to_string(),
            "--backfill-prefetch".into(),
            d.to_string(),
        ]);
    }
    let mut cluster = crate::cluster::Cluster::local(&certs, Default::default())?;
    cluster.relay_env = server.env();
    let mut relay = cluster.relay_in(None, &dir, &settings, &set.source, &extra)?;
    let last = set.first + total - 1;
    let t = Instant::now();
    loop {
        relay.check_alive()?;
        let m = relay.scrape()?;
        if m.get("ring_newest") as u32 >= last {
            break;
        }
        if t.elapsed() > Duration::from_secs(600) {
            bail!("the relay did not read its source within 600 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let rss = RssSampler::start(
        relay.pid,
        Duration::from_millis(20),
        Instant::now(),
        100_000,
    );
    let spec = SubSpec::new("sub-0", set.first, Some(total), 4, &dir, "sub");
    let addr = relay.addr.to_string();
    let ran = cluster.run_subscriber(None, &addr, &spec, Duration::from_secs(600));
    let samples = rss.finish();
    let (records, _) = ran?;
    let text = http_get(relay.metrics, "/metrics")?;
    let from_lake = crate::harness::parse_metrics(&text).get("lake_backfill_ledgers_total") as u64;
    let peak = labelled(&text, "lake_prefetch_peak_bytes", "lake=\"backfill\"");
    let _ = relay.stop();
    let seqs: Vec<u32> = records.iter().map(|r| r.seq).collect();
    if seqs != (set.first..=last).collect::<Vec<_>>() {
        bail!(
            "the subscriber got {} ledgers, not {total} in order",
            seqs.len()
        );
    }
    let timed = &records[..set.n as usize];
    let at = |i: usize| {
        timed[i]
            .received_unix_ms
            .context("a stats file without received_unix_ms")
    };
    let secs = (at(timed.len() - 1)? - at(0)?) / 1e3;
    // The first ledger's own bytes arrive before its receipt time: count the others.
    let rest = &timed[1..];
    let raw: u64 = rest.iter().map(|r| r.raw_bytes).sum();
    let wire: u64 = rest.iter().map(|r| r.wire_bytes).sum();
    let before = samples.first().map_or(0, |s| s.rss_kib);
    let peak_rss = samples.iter().map(|s| s.rss_kib).max().unwrap_or(0);
    let what = depth.map_or("ring catch-up".into(), |d| format!("lake, prefetch {d}"));
    let mut read = read_run(&what, set.name, rest.len() as u32, raw, secs);
    read.peak_held_bytes = depth.and(peak);
    read.bound_bytes = depth.map(|d| (d as u64 + 1) * set.largest);
    Ok(SessionRun {
        read,
        wire_mb_s: wire as f64 / 1e6 / secs,
        from_lake,
        rss_before_mib: mib(before),
        rss_peak_mib: mib(peak_rss),
    })
}
