//! `ledger-bench query`: what carrying stellar-core's query port through relays adds.
//!
//! Per network (loopback, and the emulated one: two namespaces with a userspace delay of half
//! `--rtt` each way in front of the relay, root only), one stack ([`stack`]): a relay whose
//! `pipe:` source is `ledger-core-double` replaying the testnet ledgers at `--cadence`, with
//! the double's ports forwarded (`--core-query`), and on the RPC side the stand-in
//! (`ledger-captive-core`) serving core's query port through that relay.
//!
//! - **latency** (after the last ledger, so every answer is for the same state):
//!   `getLedgerEntries` of 1, 10 and 100 keys as stellar-rpc sends them (`ledgerSeq` set),
//!   each request on a fresh connection (core closes after each answer), one at a time: to the
//!   double directly from its own host (what an RPC box running its own core sees) and to the
//!   stand-in (stand-in -> relay -> double), in alternating rounds. Added latency is the
//!   difference of the quantiles. Every answer through the relay is compared with the direct
//!   one, request by request.
//! - **delivery** (while ledgers flow): a `ledger-subscribe` on the RPC side takes the
//!   ledgers; its delivery p99 over one span of ledgers without queries and over another with
//!   `--rate` queries/s (10 keys each) through the stand-in.

pub mod client;
mod stack;

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::cluster::{Cluster, Json, Measured, SubSpec, Table};
use crate::harness::{make_certs, read_stats_lenient};
use crate::netem::{Netem, Shape};
use crate::report::{met, table_of, Col};
use crate::stats::quantile;
use crate::Network;
use stack::{Sides, Stack};

/// The testnet ledgers the double replays: the first and the last.
pub const FIRST: u32 = 1_410_048;
/// The last.
pub const LAST: u32 = 1_410_367;

/// `ledger-bench query` arguments.
#[derive(Debug, Clone, clap::Args, serde::Serialize)]
pub struct QueryArgs {
    /// Which networks to run.
    #[arg(long, value_enum, default_value = "all")]
    #[serde(serialize_with = "crate::query::ser_network")]
    pub network: Network,
    /// Keys per request, one latency row each.
    #[arg(long, value_delimiter = ',', default_value = "1,10,100")]
    pub keys: Vec<usize>,
    /// Requests per path in each latency row.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(8..))]
    pub requests: u32,
    /// Round trip of the emulated network.
    #[arg(long, default_value = "1ms", value_parser = crate::query::duration)]
    #[serde(serialize_with = "crate::query::ser_duration")]
    pub rtt: Duration,
    /// Queries per second through the stand-in while delivery is measured.
    #[arg(long, default_value_t = 200.0)]
    pub rate: f64,
    /// Time between the double's ledgers.
    #[arg(long, default_value = "100ms", value_parser = crate::query::duration)]
    #[serde(serialize_with = "crate::query::ser_duration")]
    pub cadence: Duration,
    /// `--testdata`.
    #[command(flatten)]
    #[serde(flatten)]
    pub testdata: crate::cluster::Testdata,
    /// `--json`.
    #[command(flatten)]
    #[serde(flatten)]
    pub json: Json,
}

pub(crate) fn duration(s: &str) -> Result<Duration, String> {
    ledger_relay_transport::parse_duration(s).map_err(|e| e.to_string())
}

fn ser_network<S: serde::Serializer>(n: &Network, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format!("{n:?}").to_lowercase())
}

fn ser_duration<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1e3)
}

/// Quantiles of a series, ms.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Quantiles {
    /// Samples.
    pub n: usize,
    /// Median.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Largest.
    pub max_ms: f64,
}

impl Quantiles {
    fn of(mut v: Vec<f64>) -> Quantiles {
        v.sort_by(f64::total_cmp);
        Quantiles {
            n: v.len(),
            p50_ms: quantile(&v, 0.5),
            p99_ms: quantile(&v, 0.99),
            max_ms: v.last().copied().unwrap_or(f64::NAN),
        }
    }
}

/// One latency row.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct LatencyRow {
    /// `loopback` or `emulated`.
    pub network: &'static str,
    /// Keys per request.
    pub keys: usize,
    /// To the double directly.
    pub direct: Quantiles,
    /// Stand-in -> relay -> double.
    pub through: Quantiles,
    /// Requests not answered 200 on either path.
    pub errors: usize,
    /// Whether every answer through the relay was the direct answer, byte for byte.
    pub identical: bool,
    /// Why the row failed.
    pub error: Option<String>,
}

/// One delivery row.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct DeliveryRow {
    /// `loopback` or `emulated`.
    pub network: &'static str,
    /// Delivery without queries.
    pub without: Quantiles,
    /// Delivery with `--rate` queries/s.
    pub with: Quantiles,
    /// Latency of those queries.
    pub queries: Quantiles,
    /// Queries per second achieved, and the share answered 200.
    pub achieved_qps: f64,
    /// Share of the queries answered 200.
    pub answered: f64,
    /// The smallest round trip the subscriber's lanes measured (the emulated link as QUIC sees it).
    pub min_rtt_ms: Option<f64>,
    /// Why the row failed.
    pub error: Option<String>,
}

/// What only `ledger-bench query` reports besides its latency rows.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Extra {
    /// The delivery rows.
    pub delivery: Vec<DeliveryRow>,
    /// Why the emulated network did not run, if it did not.
    pub emulated_skipped: Option<String>,
}

/// Everything `ledger-bench query` measured.
pub type QueryReport = Measured<QueryArgs, LatencyRow, Extra>;

/// Runs the bench's `query-client` helper in `ns` and waits for it (at most a minute past the
/// time its schedule needs).
pub(crate) fn run_client(
    ns: Option<&str>,
    addr: SocketAddr,
    bodies: &Path,
    count: u32,
    rate: f64,
    threads: u32,
    out: &Path,
) -> anyhow::Result<()> {
    let mut child = client_child(ns, addr, bodies, count, rate, threads, out)?;
    let planned = if rate > 0.0 {
        f64::from(count) / rate
    } else {
        0.0
    };
    let deadline = Instant::now() + Duration::from_secs_f64(planned + 60.0);
    match crate::proc::wait_with_cpu(&mut child, deadline)? {
        Some((st, _)) if st.success() => Ok(()),
        Some((st, _)) => bail!("the query client failed ({st})"),
        None => {
            crate::proc::kill_all(std::slice::from_mut(&mut child));
            bail!("the query client took longer than planned")
        }
    }
}

fn client_child(
    ns: Option<&str>,
    addr: SocketAddr,
    bodies: &Path,
    count: u32,
    rate: f64,
    threads: u32,
    out: &Path,
) -> anyhow::Result<std::process::Child> {
    let child = stack::bench_helper(ns)?
        .args(["query-client", "--addr", &addr.to_string(), "--bodies"])
        .arg(bodies)
        .args(["--count", &count.to_string(), "--rate", &rate.to_string()])
        .args(["--threads", &threads.to_string(), "--out"])
        .arg(out)
        .spawn()
        .context("starting the query client")?;
    crate::proc::track(&child);
    Ok(child)
}

/// 100 account keys live at the last ledger, in key order, as base64 escaped for a form.
fn live_keys(testnet: &Path) -> anyhow::Result<Vec<String>> {
    use base64::Engine;
    use ledger_relay_core_double::state::Found;
    use stellar_xdr::{LedgerKey, Limits, WriteXdr};
    let double = ledger_relay_core_double::CoreDouble::load(testnet, Default::default())?;
    double.close_through(LAST);
    let book = double.read_book();
    let mut keys: Vec<&LedgerKey> = book
        .state
        .keys()
        .filter(|k| matches!(k, LedgerKey::Account(_)))
        .filter(|k| matches!(book.state.lookup(k, LAST), Found::Live { .. }))
        .collect();
    keys.sort();
    if keys.len() < 100 {
        bail!("only {} live accounts at the last ledger", keys.len());
    }
    let b64 = |k: &LedgerKey| -> anyhow::Result<String> {
        let raw = k.to_xdr(Limits::none())?;
        let s = base64::engine::general_purpose::STANDARD.encode(raw);
        Ok(s.replace('+', "%2B")
            .replace('/', "%2F")
            .replace('=', "%3D"))
    };
    keys.into_iter().take(100).map(b64).collect()
}

/// `count` form bodies of `n` keys each (in turn from `keys`), with `ledgerSeq` if given.
fn bodies(keys: &[String], n: usize, count: usize, seq: Option<u32>) -> String {
    (0..count)
        .map(|b| {
            let mut parts: Vec<String> = (0..n)
                .map(|j| format!("key={}", keys[(b * n + j) % keys.len()]))
                .collect();
            parts.extend(seq.map(|s| format!("ledgerSeq={s}")));
            parts.join("&") + "\n"
        })
        .collect()
}

/// Rounds each latency row alternates between the two paths.
const ROUNDS: u32 = 4;

/// One latency row: `requests` to each path, in alternating rounds.
fn latency_row(
    a: &QueryArgs,
    sides: &Sides<'_>,
    stack: &Stack,
    dir: &Path,
    keys: &[String],
    n: usize,
) -> anyhow::Result<LatencyRow> {
    let file = dir.join(format!("bodies-{n}.txt"));
    std::fs::write(&file, bodies(keys, n, 16, Some(LAST)))?;
    let per_round = a.requests.div_ceil(ROUNDS);
    let (mut direct, mut through) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let out = |path: &str| dir.join(format!("{path}-{n}-{round}.csv"));
        run_client(
            sides.core_ns(),
            stack.direct,
            &file,
            per_round,
            0.0,
            1,
            &out("direct"),
        )?;
        run_client(
            sides.rpc_ns(),
            stack.through,
            &file,
            per_round,
            0.0,
            1,
            &out("through"),
        )?;
        direct.extend(client::read(&out("direct"))?);
        through.extend(client::read(&out("through"))?);
    }
    let ok = |s: &client::Sample| s.status == 200;
    let errors = direct.iter().chain(&through).filter(|s| !ok(s)).count();
    let identical =
        direct.len() == through.len() && direct.iter().zip(&through).all(|(d, t)| d.hash == t.hash);
    let ms = |v: &[client::Sample]| {
        Quantiles::of(
            v.iter()
                .filter(|s| ok(s))
                .map(|s| s.latency_us / 1e3)
                .collect(),
        )
    };
    Ok(LatencyRow {
        network: network_name(sides),
        keys: n,
        direct: ms(&direct),
        through: ms(&through),
        errors,
        identical,
        error: None,
    })
}

fn network_name(sides: &Sides<'_>) -> &'static str {
    if sides.netem.is_some() {
        "emulated"
    } else {
        "loopback"
    }
}

/// The ledgers a delivery row counts without queries, and with them.
const WITHOUT: (u32, u32) = (FIRST + 40, FIRST + 160);
const WITH: (u32, u32) = (FIRST + 180, FIRST + 300);

/// Delivery to a subscriber on the RPC side over [`WITHOUT`], then over [`WITH`] with `--rate`
/// queries/s through the stand-in.
fn delivery_row(
    a: &QueryArgs,
    c: &Cluster,
    sides: &Sides<'_>,
    stack: &Stack,
    dir: &Path,
    keys: &[String],
) -> anyhow::Result<DeliveryRow> {
    let (first, last) = (FIRST + 30, FIRST + 309);
    let mut spec = SubSpec::new("sub-1", first, Some(last - first + 1), 4, dir, "delivery");
    let lanes = dir.join("delivery-lanes.csv");
    spec.extra = vec!["--lane-stats".into(), lanes.display().to_string()];
    let mut sub = c.subscriber_to(sides.rpc_ns(), &stack.rpc_relay, &spec)?;
    let within = a.cadence * (last - FIRST) + Duration::from_secs(60);
    wait_for(&spec.stats, WITHOUT.1 + 5, within)?;
    let load_file = dir.join("load-bodies.txt");
    std::fs::write(&load_file, bodies(keys, 10, 64, None))?;
    let load_s = (a.cadence * (WITH.1 - WITHOUT.1)).as_secs_f64();
    let count = (a.rate * load_s) as u32;
    let out = dir.join("load.csv");
    let t0 = Instant::now();
    let mut load = client_child(
        sides.rpc_ns(),
        stack.through,
        &load_file,
        count,
        a.rate,
        4,
        &out,
    )?;
    // The load ends on its own (bounded by count and rate); stopping it early would lose its
    // samples, which it writes at the end.
    let finished = wait_load(&mut load, load_s);
    let elapsed = t0.elapsed().as_secs_f64();
    let reached = wait_for(&spec.stats, WITH.1 + 5, within);
    finished?;
    reached?;
    crate::cluster::wait_child(&mut sub, within)?;
    let records = read_stats_lenient(&spec.stats)?;
    let span = |(from, to): (u32, u32)| {
        Quantiles::of(
            records
                .iter()
                .filter(|r| r.seq >= from && r.seq < to)
                .map(|r| r.delivery_ms)
                .collect(),
        )
    };
    let samples = client::read(&out)?;
    let answered = samples.iter().filter(|s| s.status == 200).count();
    let achieved_qps = samples.len() as f64 / elapsed.max(1e-9);
    if achieved_qps < 0.9 * a.rate {
        bail!(
            "the query load ran at {achieved_qps:.0}/s, not the {}/s asked",
            a.rate
        );
    }
    Ok(DeliveryRow {
        network: network_name(sides),
        without: span(WITHOUT),
        with: span(WITH),
        queries: Quantiles::of(
            samples
                .iter()
                .filter(|s| s.status == 200)
                .map(|s| s.latency_us / 1e3)
                .collect(),
        ),
        achieved_qps,
        answered: answered as f64 / samples.len().max(1) as f64,
        min_rtt_ms: min_rtt(&lanes),
        error: None,
    })
}

/// Waits for the query load planned to last `planned_s` (and 30 s more) to end well.
fn wait_load(load: &mut std::process::Child, planned_s: f64) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs_f64(planned_s + 30.0);
    match crate::proc::wait_with_cpu(load, deadline)? {
        Some((st, _)) if st.success() => Ok(()),
        Some((st, _)) => bail!("the query load failed ({st})"),
        None => {
            crate::proc::kill_all(std::slice::from_mut(load));
            bail!("the query load took longer than planned")
        }
    }
}

/// Waits until the stats file holds ledger `seq`.
fn wait_for(stats: &Path, seq: u32, within: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    while !crate::harness::all_have(&[stats.to_path_buf()], seq) {
        if Instant::now() > deadline {
            bail!("the subscriber did not reach ledger {seq} within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// The smallest `min_rtt_ms` in a `--lane-stats` file.
fn min_rtt(path: &Path) -> Option<f64> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut lines = text.lines();
    let col = lines.next()?.split(',').position(|h| h == "min_rtt_ms")?;
    lines
        .filter_map(|l| l.split(',').nth(col)?.parse::<f64>().ok())
        .filter(|v| *v > 0.0)
        .min_by(f64::total_cmp)
}

/// One network: its stack, the delivery row while ledgers flow, then the latency rows.
fn network(
    a: &QueryArgs,
    c: &Cluster,
    sides: &Sides<'_>,
    dir: &Path,
    keys: &[String],
) -> (Vec<LatencyRow>, DeliveryRow) {
    let failed = |e: anyhow::Error| {
        let error = Some(format!("{e:#}"));
        let rows = a
            .keys
            .iter()
            .map(|&n| LatencyRow {
                network: network_name(sides),
                keys: n,
                error: error.clone(),
                ..Default::default()
            })
            .collect();
        (
            rows,
            DeliveryRow {
                network: network_name(sides),
                error,
                ..Default::default()
            },
        )
    };
    let testnet = a
        .testdata
        .testdata
        .join("testnet/testnet-1410048-1410367.lcm-v0.framed.xdr");
    let stack = match Stack::start(c, sides, dir, &testnet, a.cadence) {
        Ok(s) => s,
        Err(e) => return failed(e),
    };
    let delivery = delivery_row(a, c, sides, &stack, dir, keys).unwrap_or_else(|e| DeliveryRow {
        network: network_name(sides),
        error: Some(format!("{e:#}")),
        ..Default::default()
    });
    // Every answer of the latency rows is for the last ledger: wait until it is written.
    std::thread::sleep(a.cadence * (LAST - FIRST).saturating_sub(300) + Duration::from_secs(1));
    let rows = a
        .keys
        .iter()
        .map(|&n| {
            eprintln!("query: {} latency, {n} keys", network_name(sides));
            latency_row(a, sides, &stack, dir, keys, n).unwrap_or_else(|e| LatencyRow {
                network: network_name(sides),
                keys: n,
                error: Some(format!("{e:#}")),
                ..Default::default()
            })
        })
        .collect();
    (rows, delivery)
}

/// Runs the networks asked for.
pub fn run(a: &QueryArgs) -> anyhow::Result<QueryReport> {
    if a.keys.iter().any(|&n| n == 0 || n > 100) || a.rate <= 0.0 {
        bail!("--keys must be 1..=100 and --rate positive");
    }
    let mut tmp = crate::cluster::work_dir("ledger-bench-query")?;
    let certs = tmp.path().join("certs");
    make_certs(&certs, 0)?;
    let c = Cluster::local(&certs, Default::default())?;
    let testnet = a
        .testdata
        .testdata
        .join("testnet/testnet-1410048-1410367.lcm-v0.framed.xdr");
    let keys = live_keys(&testnet)?;
    let load_before = crate::harness::load_average();
    let (mut rows, mut extra) = (Vec::new(), Extra::default());
    let emulated = matches!(a.network, Network::All | Network::Emulated);
    if matches!(a.network, Network::All | Network::Loopback) {
        eprintln!("query: loopback");
        let sides = Sides {
            netem: None,
            one_way: Duration::ZERO,
        };
        let dir = tmp.path().join("loopback");
        std::fs::create_dir_all(&dir)?;
        let (r, d) = network(a, &c, &sides, &dir, &keys);
        rows.extend(r);
        extra.delivery.push(d);
    }
    match crate::netem::unavailable_reason() {
        Some(why) if emulated => {
            eprintln!("query: skipping the emulated network: {why}");
            extra.emulated_skipped = Some(why);
        }
        _ if emulated => {
            eprintln!("query: emulated network, {:?} round trip", a.rtt);
            // No rate cap: the link is only delayed.
            let netem = Netem::create(
                "q",
                Shape {
                    flow_bps: 10_000_000_000,
                    aggregate_bps: 10_000_000_000,
                },
            )?;
            let sides = Sides {
                netem: Some(&netem),
                one_way: a.rtt / 2,
            };
            let dir = tmp.path().join("emulated");
            std::fs::create_dir_all(&dir)?;
            let (r, d) = network(a, &c, &sides, &dir, &keys);
            rows.extend(r);
            extra.delivery.push(d);
        }
        _ => {}
    }
    crate::cluster::keep_if_asked(&mut tmp);
    Ok(QueryReport {
        args: a.clone(),
        load_before,
        load_after: crate::harness::load_average(),
        extra,
        rows,
    })
}

/// The whole command: runs, prints the tables and the targets, writes `--json`.
pub fn main(a: &QueryArgs) -> anyhow::Result<()> {
    crate::cluster::emit_json(&run(a)?, &a.json)
}

fn f(v: f64) -> String {
    format!("{v:.3}")
}

const LATENCY: [Col<LatencyRow>; 10] = [
    Col::l("network", 9, |r| r.network.into()),
    Col::r("keys", 4, |r| r.keys.to_string()),
    Col::r("direct p50", 10, |r| f(r.direct.p50_ms)),
    Col::r("p99", 7, |r| f(r.direct.p99_ms)),
    Col::r("relayed p50", 11, |r| f(r.through.p50_ms)),
    Col::r("p99", 7, |r| f(r.through.p99_ms)),
    Col::r("added p50", 9, |r| f(r.through.p50_ms - r.direct.p50_ms)),
    Col::r("p99", 7, |r| f(r.through.p99_ms - r.direct.p99_ms)),
    Col::r("errors", 6, |r| r.errors.to_string()),
    Col::r("identical", 9, |r| {
        if r.identical { "yes" } else { "NO" }.into()
    }),
];

const DELIVERY: [Col<DeliveryRow>; 8] = [
    Col::l("network", 9, |r| r.network.into()),
    Col::r("ledger p50", 10, |r| f(r.without.p50_ms)),
    Col::r("p99", 7, |r| f(r.without.p99_ms)),
    Col::r("+queries p50", 12, |r| f(r.with.p50_ms)),
    Col::r("p99", 7, |r| f(r.with.p99_ms)),
    Col::r("q/s", 6, |r| format!("{:.0}", r.achieved_qps)),
    Col::r("query p99", 9, |r| f(r.queries.p99_ms)),
    Col::r("link rtt", 8, |r| r.min_rtt_ms.map_or("-".into(), f)),
];

impl Table for QueryReport {
    fn table(&self) -> String {
        let lat = table_of(&LATENCY, &self.rows, (2, "FAILED"), |r| r.error.as_deref());
        let del = table_of(&DELIVERY, &self.extra.delivery, (1, "FAILED"), |r| {
            r.error.as_deref()
        });
        format!("getLedgerEntries, ms (direct: the double from its own host; relayed: stand-in -> relay -> double)\n{lat}\nledger delivery to a subscriber beside the stand-in, ms, without and with {} queries/s\n{del}", self.args.rate)
    }

    fn targets(&self) -> String {
        let mut s = String::from("\ntargets:\n");
        let rtt = self.args.rtt.as_secs_f64() * 1e3;
        for r in self.rows.iter().filter(|r| r.error.is_none()) {
            let bound = if r.network == "emulated" {
                rtt + 0.5
            } else {
                0.5
            };
            let added = r.through.p99_ms - r.direct.p99_ms;
            s.push_str(&format!(
                "  {} {} keys: added p99 {added:.3} ms <= {bound:.1} ms: {}\n",
                r.network,
                r.keys,
                met(added <= bound && r.identical && r.errors == 0)
            ));
        }
        for d in self.extra.delivery.iter().filter(|d| d.error.is_none()) {
            let ratio = d.with.p99_ms / d.without.p99_ms;
            s.push_str(&format!(
                "  {} delivery p99 with {:.0} queries/s ({:.1}% answered 200) {ratio:.2}x without <= 1.1x: {}\n",
                d.network,
                d.achieved_qps,
                d.answered * 100.0,
                met(ratio <= 1.1 && d.answered >= 0.99)
            ));
        }
        if let Some(why) = &self.extra.emulated_skipped {
            s.push_str(&format!("  emulated network skipped: {why}\n"));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_take_keys_in_turn_and_pin_a_ledger_when_asked() {
        let keys: Vec<String> = (0..5).map(|i| format!("K{i}")).collect();
        assert_eq!(
            bodies(&keys, 2, 3, Some(7)),
            "key=K0&key=K1&ledgerSeq=7\nkey=K2&key=K3&ledgerSeq=7\nkey=K4&key=K0&ledgerSeq=7\n"
        );
        assert_eq!(bodies(&keys, 1, 1, None), "key=K0\n");
    }

    #[test]
    fn the_smallest_round_trip_of_a_lane_stats_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("l.csv");
        std::fs::write(
            &p,
            "unix_ms,lane,rtt_ms,min_rtt_ms\n1,0,1.5,1.2\n2,1,1.4,0\n3,1,1.3,1.1\n",
        )
        .unwrap();
        assert_eq!(min_rtt(&p), Some(1.1));
        assert_eq!(min_rtt(&dir.path().join("none")), None);
    }
}
