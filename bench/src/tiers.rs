//! `ledger-bench tiers`: what a tier of relays adds, what a tree saves its root, and what a
//! hedged subscription is worth when one relay's path is degraded (issue 15).
//!
//! Three parts, each with its own relays (`ledger-relay run`) and subscribers
//! (`ledger-subscribe`, 4 lanes, ledgers written to /dev/null, verified all the same):
//!
//! - **tier** (loopback, per payload): a root relay with a synthetic source, two edge relays fed
//!   by it (`--source relay:ROOT`; `edge` store-and-forward, `edge-ct` with `--cut-through`),
//!   one subscriber on the root and one on each edge, all from the same ledger. Delivery is
//!   measured from the root's source in each (an edge passes the root's stamps on), so an edge
//!   subscriber's delivery minus the root subscriber's, ledger by ledger, is what the tier adds.
//!   Each edge's own CPU per ledger is read too.
//! - **tier-zone** (emulated network, per payload, needs root; not in the default parts): the
//!   tier part across a zone link: the root in the relay namespace, its port capped at
//!   3 x lanes x `--flow-mbit` (what crosses the link: the direct subscriber's lanes and both
//!   edges' upstream lanes), the edges and the subscribers in the subscriber namespace.
//! - **tree** (loopback, one payload): the root's CPU per ledger serving N subscribers directly,
//!   against the same N spread over E edge relays (the root then serves only the edges), and the
//!   last subscriber's delivery in each.
//! - **hedge** (emulated network, root only): relays A and B with the same synthetic source in one
//!   network namespace, subscribers in another; A's port is capped at lanes x the flow cap, B's
//!   at a tenth of that (`--degrade`). Rows, one after another: a subscriber on A alone, on B
//!   alone, and hedged on both (`--hedge`). The hedged p99 should be A's, not B's.
//!
//! Every row checks that each subscriber wrote exactly the ledgers it asked for, in order.

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::cluster::{Cluster, RelayProc, RelaySettings};
use crate::fanout::Payload;
use crate::harness::{all_have, make_certs, read_exact};
use crate::netem::{Netem, Shape};
use crate::proc::{cpu_seconds, kill_all};
use crate::stats::{quantile, Record};

mod hedge;
mod report;
mod tier;
pub use report::{csv, table};

/// The parts of the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Part {
    /// Root -> edge -> subscriber against root -> subscriber, on loopback.
    Tier,
    /// The same across an emulated zone link (needs root): the root behind it, the edges and
    /// subscribers beyond it.
    TierZone,
    /// The root's CPU with N direct subscribers against N behind E edges.
    Tree,
    /// Hedged against single-relay delivery with one relay's path degraded (needs root).
    Hedge,
}

/// `ledger-bench tiers` arguments.
#[derive(Debug, Clone, clap::Args, serde::Serialize)]
#[command(mut_arg("cadence_ms", |a| a.help("Time between ledgers in the tier and hedge parts (`600ms`, `1s`; a bare number is milliseconds, as the old `--cadence-ms` took)")))]
#[command(mut_arg("ledgers", |a| a.value_parser(clap::value_parser!(u32).range(2..))))]
#[command(mut_arg("lanes", |a| a.help("Lanes per subscriber (and per edge's upstream subscription)")))]
#[command(mut_arg("flow_mbit", |a| a.help("Per-flow cap of the hedge part's healthy relay, Mbit/s (its port gets lanes x this)")))]
#[command(mut_arg("payload", |a| a.help("Payloads of the tier part (the tree and hedge parts use the first)")))]
pub struct TiersArgs {
    /// Parts to run.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "tier,tree,hedge"
    )]
    pub parts: Vec<Part>,
    /// `--payload` of the tier part.
    #[command(flatten)]
    #[serde(flatten)]
    pub payload: crate::cluster::Payloads,
    /// `--ledgers` and `--warmup`.
    #[command(flatten)]
    #[serde(flatten)]
    pub series: crate::cluster::Series,
    /// `--cadence`.
    #[command(flatten)]
    #[serde(flatten)]
    pub cadence: crate::cluster::Cadence,
    /// Time between ledgers in the tree part, ms (every subscriber and edge runs on this
    /// machine too).
    #[arg(long, default_value_t = 1500.0)]
    pub tree_cadence_ms: f64,
    /// Subscribers in the tree part.
    #[arg(long, default_value_t = 16)]
    pub tree_subscribers: u16,
    /// Edge relays in the tree part.
    #[arg(long, default_value_t = 4)]
    pub edges: u16,
    /// `--flow-mbit` of the hedge part.
    #[command(flatten)]
    #[serde(flatten)]
    pub flow: crate::cluster::FlowCap,
    /// The degraded relay's cap is the healthy one's divided by this.
    #[arg(long, default_value_t = 10.0)]
    pub degrade: f64,
    /// `--lanes`, `--size` and `--ratio`.
    #[command(flatten)]
    #[serde(flatten)]
    pub stream: crate::cluster::Stream,
    /// `--csv` and `--json`.
    #[command(flatten)]
    #[serde(flatten)]
    pub files: crate::cluster::Files,
}

/// Delivery of one subscriber (or, in a tree, of the last subscriber to finish each ledger).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Delivery {
    /// p50 over the measured ledgers, ms.
    pub p50_ms: f64,
    /// p99, ms.
    pub p99_ms: f64,
    /// Largest, ms.
    pub max_ms: f64,
    /// Per measured ledger: (sequence, ms).
    pub per_ledger: Vec<(u32, f64)>,
}

impl Delivery {
    fn of(per_ledger: Vec<(u32, f64)>) -> Delivery {
        let mut v: Vec<f64> = per_ledger.iter().map(|x| x.1).collect();
        v.sort_by(f64::total_cmp);
        Delivery {
            p50_ms: quantile(&v, 0.5),
            p99_ms: quantile(&v, 0.99),
            max_ms: v.last().copied().unwrap_or(f64::NAN),
            per_ledger,
        }
    }
}

/// One row.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TierRow {
    /// The part.
    pub part: Part,
    /// The row's name within its part (`direct`, `edge`, `direct-16`, `tree-4x4`, `A`, `B`,
    /// `hedged`).
    pub row: String,
    /// Payload.
    pub payload: Payload,
    /// Subscribers.
    pub subscribers: u16,
    /// Time between ledgers, ms.
    pub cadence_ms: f64,
    /// Measured ledgers per subscriber.
    pub ledgers: u32,
    /// Wire bytes per ledger, MB.
    pub wire_mb: f64,
    /// Delivery (the last subscriber's, per ledger, when there are several).
    pub delivery: Delivery,
    /// Per ledger, this row's delivery minus the `direct` row's of the same run (tier part).
    pub added: Option<Delivery>,
    /// The root relay's CPU per ledger over the measured ledgers, ms.
    pub root_cpu_ms: Option<f64>,
    /// The edge relays' CPU per ledger (summed over a tree's edges; the row's own edge in the
    /// tier part), ms.
    pub edge_cpu_ms: Option<f64>,
    /// Why the row failed, if it did.
    pub error: Option<String>,
}

/// Everything `ledger-bench tiers` measured.
pub type TiersReport = crate::cluster::Measured<TiersArgs, TierRow, Skipped>;

/// What only `ledger-bench tiers` reports besides its rows.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Skipped {
    /// Why the parts on the emulated network (hedge, tier-zone) did not run, if they did not.
    pub hedge_skipped: Option<String>,
}

impl crate::cluster::Table for TiersReport {
    fn table(&self) -> String {
        table(&self.rows)
    }
    fn targets(&self) -> String {
        let mut out = report::compare(&self.rows);
        if let Some(why) = &self.extra.hedge_skipped {
            out.push_str(&format!(
                "emulated-network parts (hedge, tier-zone) skipped: {why}\n"
            ));
        }
        out
    }
}

impl crate::cluster::Report for TiersReport {
    fn csv(&self) -> String {
        csv(&self.rows)
    }
}

/// Ledgers of a row: the subscribers take `first..=last`, `measured..=last` counted.
#[derive(Debug, Clone, Copy)]
struct Span {
    first: u32,
    measured: u32,
    last: u32,
}

impl Span {
    fn count(&self) -> u32 {
        self.last - self.first + 1
    }
}

/// Relays started by a row (stopped whatever happens).
#[derive(Default)]
struct Procs {
    relays: Vec<RelayProc>,
    subs: Vec<Child>,
}

impl Drop for Procs {
    fn drop(&mut self) {
        kill_all(&mut self.subs);
        for r in self.relays.drain(..) {
            r.stop();
        }
    }
}

fn settings(a: &TiersArgs, payload: Payload, cadence: f64, last: u32) -> RelaySettings {
    // The relay's 8 ms emit window.
    let mut s = payload.relay(
        a.stream.size.ledger_bytes,
        a.stream.ratio.ratio,
        cadence,
        8.0,
    );
    s.count = Some(last - s.start + 1);
    s
}

/// The span of a row whose processes need `connect_s` to start and connect.
fn span(a: &TiersArgs, cadence: f64, connect_s: f64) -> Span {
    let first = 2 + (connect_s * 1e3 / cadence).ceil() as u32 + 1;
    let measured = first + a.series.warmup;
    Span {
        first,
        measured,
        last: measured + a.series.count.ledgers - 1,
    }
}

/// A root relay with the synthetic source of `s`; a subscriber may ask for a ledger up to
/// `start_wait` ahead of its newest.
/// In network namespace `ns` listening on its address, when given.
fn root_in(
    ns: Option<(&str, &str)>,
    c: &Cluster,
    dir: &Path,
    s: &RelaySettings,
    start_wait: &str,
) -> anyhow::Result<RelayProc> {
    let wait = ["--start-wait".to_owned(), start_wait.to_owned()];
    c.relay_in(ns, dir, s, &s.synthetic_source(), &wait)
}

/// An edge relay fed by `upstream` with client certificate `name`, passing ledgers on as their
/// chunks arrive if `cut_through`, in network namespace `ns` listening on its address when
/// given.
#[allow(clippy::too_many_arguments)]
fn edge_with(
    ns: Option<(&str, &str)>,
    c: &Cluster,
    dir: &Path,
    s: &RelaySettings,
    upstream: &RelayProc,
    name: &str,
    lanes: u8,
    cut_through: bool,
) -> anyhow::Result<RelayProc> {
    let lanes = lanes.to_string();
    let mut extra: Vec<String> = [
        "--upstream-name",
        name,
        "--upstream-lanes",
        &lanes,
        "--start-wait",
        "120s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if cut_through {
        extra.push("--cut-through".into());
    }
    let source = format!("relay:{}", upstream.addr);
    c.relay_in(ns, dir, s, &source, &extra)
}

/// Subscriber `name` on `relay` for `span`, stats in `dir/name.csv`; in network namespace
/// `ns` when given.
#[allow(clippy::too_many_arguments)]
fn subscriber(
    ns: Option<&str>,
    c: &Cluster,
    relay: &RelayProc,
    dir: &Path,
    name: &str,
    lanes: u8,
    span: Span,
) -> anyhow::Result<(Child, PathBuf)> {
    let spec = crate::cluster::SubSpec::new(name, span.first, Some(span.count()), lanes, dir, name);
    Ok((
        c.subscriber_to(ns, &relay.addr.to_string(), &spec)?,
        spec.stats,
    ))
}

/// Waits until every stats file holds ledger `seq`; fails after `limit`, or when a subscriber
/// exits with an error first.
fn wait_all(
    stats: &[PathBuf],
    subs: &mut [Child],
    seq: u32,
    limit: Duration,
) -> anyhow::Result<()> {
    let start = Instant::now();
    loop {
        if all_have(stats, seq) {
            return Ok(());
        }
        for (i, c) in subs.iter_mut().enumerate() {
            if let Some(st) = c.try_wait()? {
                if !st.success() {
                    bail!("subscriber {i} exited with {st} before ledger {seq}");
                }
            }
        }
        if start.elapsed() > limit {
            bail!("not every subscriber reached ledger {seq} within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Reads each stats file, checks it holds exactly `span`, and returns the measured records.
fn collect(stats: &[PathBuf], span: Span) -> anyhow::Result<Vec<Vec<Record>>> {
    let all = read_exact(stats, span.first..=span.last)?;
    let measured = |r: Vec<Record>| r.into_iter().filter(|r| r.seq >= span.measured).collect();
    Ok(all.into_iter().map(measured).collect())
}

/// Per ledger, the largest delivery over the subscribers (the last to finish it).
fn last_of(subs: &[Vec<Record>]) -> Vec<(u32, f64)> {
    let Some(first) = subs.first() else {
        return Vec::new();
    };
    first
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let worst = subs
                .iter()
                .filter_map(|s| s.get(i))
                .map(|r| r.delivery_ms)
                .fold(f64::NEG_INFINITY, f64::max);
            (r.seq, worst)
        })
        .collect()
}

fn wire_mb(subs: &[Vec<Record>]) -> f64 {
    let n = subs.iter().map(Vec::len).sum::<usize>().max(1);
    subs.iter()
        .flatten()
        .map(|r| r.wire_bytes as f64)
        .sum::<f64>()
        / n as f64
        / 1e6
}

fn row(part: Part, name: &str, payload: Payload, n: u16, cadence: f64) -> TierRow {
    TierRow {
        part,
        row: name.into(),
        payload,
        subscribers: n,
        cadence_ms: cadence,
        ledgers: 0,
        wire_mb: 0.0,
        delivery: Delivery::default(),
        added: None,
        root_cpu_ms: None,
        edge_cpu_ms: None,
        error: None,
    }
}

/// CPU seconds of every relay of `relays`.
fn cpu_of(relays: &[RelayProc]) -> anyhow::Result<f64> {
    relays
        .iter()
        .map(|r| cpu_seconds(r.pid).context("relay CPU"))
        .sum()
}

/// One tree row: `edges` edge relays (0: every subscriber on the root).
fn tree_row(a: &TiersArgs, work: &Path, payload: Payload, edges: u16) -> anyhow::Result<TierRow> {
    let c = Cluster::local(&work.join("certs"), Default::default())?;
    let n = a.tree_subscribers;
    let name = if edges == 0 {
        format!("direct-{n}")
    } else {
        format!("tree-{edges}x{}", n.div_ceil(edges))
    };
    let dir = work.join(&name);
    let cadence = a.tree_cadence_ms;
    let sp = span(a, cadence, 4.0 + 0.15 * f64::from(n + edges));
    let s = settings(a, payload, cadence, sp.last);
    let mut p = Procs::default();
    p.relays
        .push(root_in(None, &c, &dir.join("root"), &s, "300s")?);
    for e in 0..edges {
        let cert = format!("sub-{}", n + e);
        let r = edge_with(
            None,
            &c,
            &dir.join(format!("edge-{e}")),
            &s,
            &p.relays[0],
            &cert,
            a.stream.lanes.lanes,
            false,
        )?;
        p.relays.push(r);
    }
    let mut stats = Vec::new();
    for i in 0..n {
        let at = if edges == 0 {
            0
        } else {
            1 + usize::from(i % edges)
        };
        let (c, st) = subscriber(
            None,
            &c,
            &p.relays[at],
            &dir,
            &format!("sub-{i}"),
            a.stream.lanes.lanes,
            sp,
        )?;
        p.subs.push(c);
        stats.push(st);
    }
    let limit = Duration::from_secs_f64(cadence / 1e3 * f64::from(sp.last) + 120.0);
    wait_all(&stats, &mut p.subs, sp.measured - 1, limit)?;
    let (r0, e0) = (cpu_of(&p.relays[..1])?, cpu_of(&p.relays[1..])?);
    wait_all(&stats, &mut p.subs, sp.last, limit)?;
    let (r1, e1) = (cpu_of(&p.relays[..1])?, cpu_of(&p.relays[1..])?);
    let recs = collect(&stats, sp)?;
    let per = |c: f64| c * 1e3 / f64::from(a.series.count.ledgers);
    let mut r = row(Part::Tree, &name, payload, n, cadence);
    r.ledgers = a.series.count.ledgers;
    r.wire_mb = wire_mb(&recs);
    r.delivery = Delivery::of(last_of(&recs));
    r.root_cpu_ms = Some(per(r1 - r0));
    r.edge_cpu_ms = (edges > 0).then(|| per(e1 - e0));
    Ok(r)
}

/// Runs the parts and returns the report.
pub fn run(a: &TiersArgs) -> anyhow::Result<TiersReport> {
    if a.payload.payload.is_empty() || a.edges == 0 || a.tree_subscribers == 0 {
        bail!("--payload must not be empty, --edges and --tree-subscribers not 0");
    }
    let mut tmp = crate::cluster::work_dir("ledger-bench-tiers")?;
    // Subscribers sub-0.., then one client certificate per edge; sub-15 and sub-14 are the tier
    // part's edges (store-and-forward and cut-through).
    make_certs(
        &tmp.path().join("certs"),
        usize::from(a.tree_subscribers + a.edges).max(16),
    )?;
    let load_before = crate::harness::load_average();
    let mut rows = Vec::new();
    let mut hedge_skipped = None;
    let first = a.payload.payload[0];
    // The rows of a part, or one failed row standing for them.
    let mut add = |got: anyhow::Result<Vec<TierRow>>, part, name: &str, p, n, cadence| match got {
        Ok(r) => rows.extend(r),
        Err(e) => {
            eprintln!("tiers: {part:?} {name} failed: {e:#}");
            let mut r = row(part, name, p, n, cadence);
            r.error = Some(format!("{e:#}"));
            rows.push(r);
        }
    };
    for part in &a.parts {
        match part {
            Part::Tier => {
                for &p in &a.payload.payload {
                    eprintln!("tiers: tier, {p:?}");
                    let got = tier::tier(a, tmp.path(), p, None);
                    add(got, Part::Tier, "direct+edge", p, 1, a.cadence.cadence_ms);
                }
            }
            Part::TierZone => match crate::netem::unavailable_reason() {
                Some(why) => {
                    eprintln!("tiers: tier-zone part skipped: {why}");
                    hedge_skipped = Some(why);
                }
                None => {
                    for &p in &a.payload.payload {
                        eprintln!("tiers: tier-zone, {p:?}");
                        // What crosses the link from the root: the direct subscriber's lanes
                        // and both edges' upstream lanes, each at the per-flow cap.
                        let flows = 3.0 * f64::from(a.stream.lanes.lanes);
                        let link = (flows * a.flow.flow_mbit * 1e6) as u64;
                        let r = Netem::create(
                            "tierzone",
                            Shape {
                                flow_bps: (a.flow.flow_mbit * 1e6) as u64,
                                aggregate_bps: link,
                            },
                        )
                        .and_then(|mut netem| {
                            tier::tier(a, tmp.path(), p, Some((&mut netem, link)))
                        });
                        add(r, Part::TierZone, "direct+edge", p, 1, a.cadence.cadence_ms);
                    }
                }
            },
            Part::Tree => {
                for edges in [0, a.edges] {
                    eprintln!(
                        "tiers: tree, {edges} edges, {} subscribers",
                        a.tree_subscribers
                    );
                    add(
                        tree_row(a, tmp.path(), first, edges).map(|r| vec![r]),
                        Part::Tree,
                        &format!("edges-{edges}"),
                        first,
                        a.tree_subscribers,
                        a.tree_cadence_ms,
                    );
                }
            }
            Part::Hedge => match crate::netem::unavailable_reason() {
                Some(why) => {
                    eprintln!("tiers: hedge part skipped: {why}");
                    hedge_skipped = Some(why);
                }
                None => {
                    eprintln!("tiers: hedge, {first:?}");
                    let got = hedge::hedge(a, tmp.path(), first);
                    add(got, Part::Hedge, "A+B", first, 1, a.cadence.cadence_ms);
                }
            },
        }
    }
    crate::cluster::keep_if_asked(&mut tmp);
    Ok(TiersReport {
        args: a.clone(),
        load_before,
        load_after: crate::harness::load_average(),
        extra: Skipped { hedge_skipped },
        rows,
    })
}

/// The whole command: runs, prints the table and the comparisons, writes `--csv` and `--json`.
pub fn main(a: &TiersArgs) -> anyhow::Result<()> {
    crate::cluster::emit_files(&run(a)?, &a.files)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(seq: u32, d: f64) -> Record {
        Record {
            seq,
            raw_bytes: 10,
            wire_bytes: 4,
            delivery_ms: d,
            inter_arrival_ms: None,
            received_unix_ms: None,
        }
    }

    #[test]
    fn the_last_subscriber_of_each_ledger() {
        let subs = vec![
            vec![rec(5, 10.0), rec(6, 30.0)],
            vec![rec(5, 20.0), rec(6, 25.0)],
        ];
        assert_eq!(last_of(&subs), vec![(5, 20.0), (6, 30.0)]);
        let d = Delivery::of(last_of(&subs));
        assert_eq!((d.p50_ms, d.p99_ms, d.max_ms), (20.0, 30.0, 30.0));
        assert_eq!(wire_mb(&subs), 4e-6);
    }

    #[test]
    fn a_span_leaves_time_to_connect() {
        let a: TiersArgs = crate::cluster::parse(&[]);
        // 5 s at 600 ms: 9 ledgers after ledger 2, then 3 warm-up, then 20 measured.
        let s = span(&a, 600.0, 5.0);
        assert_eq!((s.first, s.measured, s.last, s.count()), (12, 15, 34, 23));
    }
}
