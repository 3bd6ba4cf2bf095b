//! `ledger-bench query`: what carrying stellar-core's query port through relays adds.
//!
//! Per network (loopback; the emulated one, root only: [`crate::netem`]'s namespaces, uncapped,
//! a [`delay`] of half `--rtt` each way in front of the relay): a relay whose `pipe:` source is
//! `ledger-core-double` with its ports forwarded, and on the RPC side the stand-in
//! (`ledger-captive-core`) serving core's query port through that relay. **delivery**: a
//! subscriber's p99 over ledgers without queries, then with `--rate` queries/s. **latency**
//! (after the last ledger, so every answer is for the same state): `getLedgerEntries` as
//! stellar-rpc sends them, one at a time, alternating the double called directly and the
//! stand-in; every relayed answer is compared with the direct one.

pub mod delay;

use std::hash::{DefaultHasher, Hash, Hasher};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::cluster::{http, make_certs, Cluster, RelayProc, RelaySettings, SubSpec};
use crate::netem::{in_ns, Netem, Shape, RELAY_ADDR};
use crate::procs::{kill_all, load_average, log_tail, sibling_binary, track};
use crate::report::{table_of, Col};
use crate::stats::p50_p99_max;
use crate::storage::lake::TESTNET;

/// The first and the last of the testnet ledgers the double replays.
const FIRST: u32 = 1_410_048;
const LAST: u32 = 1_410_367;
/// The ledgers a delivery row counts without queries, and with them.
const WITHOUT: (u32, u32) = (FIRST + 40, FIRST + 160);
const WITH: (u32, u32) = (FIRST + 180, FIRST + 300);
/// HTTP and query ports of the double, of the stand-in (each side has its own), and the delay.
const DOUBLE: [u16; 2] = [21626, 21628];
const STAND_IN: [u16; 2] = [11626, 11628];
const DELAY_PORT: u16 = 27400;
/// Rounds each latency row alternates between the two paths.
const ROUNDS: u32 = 4;

/// `ledger-bench query` arguments.
#[derive(Debug, Clone, clap::Args, serde::Serialize)]
pub struct QueryArgs {
    /// `all`, `loopback` or `emulated` (root).
    #[arg(long, default_value = "all", value_parser = ["all", "loopback", "emulated"])]
    pub network: String,
    /// Keys per request, one latency row each.
    #[arg(long, value_delimiter = ',', default_value = "1,10,100", value_parser = clap::value_parser!(u32).range(1..=100))]
    pub keys: Vec<u32>,
    /// Requests per path in each latency row.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(8..))]
    pub requests: u32,
    /// Round trip of the emulated network.
    #[arg(long, value_name = "DURATION", default_value = "1ms", value_parser = crate::scenario::ms)]
    pub rtt: f64,
    /// Queries per second through the stand-in while delivery is measured.
    #[arg(long, default_value_t = 200.0)]
    pub rate: f64,
    /// Time between the double's ledgers.
    #[arg(long, value_name = "DURATION", default_value = "100ms", value_parser = crate::scenario::ms)]
    pub cadence: f64,
    /// Directory holding testnet/testnet-1410048-1410367.lcm-v0.framed.xdr.
    #[arg(long, value_name = "DIR", default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata"))]
    pub testdata: PathBuf,
    /// Write everything measured as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

/// One latency row; each quantile triple is p50, p99 and the largest, ms.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct LatencyRow {
    /// `loopback` or `emulated`.
    pub network: &'static str,
    /// Keys per request.
    pub keys: u32,
    /// To the double directly.
    pub direct_ms: [f64; 3],
    /// Stand-in -> relay -> double.
    pub relayed_ms: [f64; 3],
    /// Requests not answered 200 on either path.
    pub errors: usize,
    /// Whether every answer through the relay was the direct answer, byte for byte.
    pub identical: bool,
    /// Why the row failed.
    pub error: Option<String>,
}

/// One delivery row; each quantile triple is p50, p99 and the largest, ms.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct DeliveryRow {
    /// `loopback` or `emulated`.
    pub network: &'static str,
    /// Delivery without queries.
    pub without_ms: [f64; 3],
    /// Delivery with `--rate` queries/s.
    pub with_ms: [f64; 3],
    /// Latency of those queries.
    pub queries_ms: [f64; 3],
    /// Queries per second achieved.
    pub achieved_qps: f64,
    /// Share of the queries answered 200.
    pub answered: f64,
    /// The smallest round trip the subscriber's lanes measured (the link as QUIC sees it).
    pub min_rtt_ms: Option<f64>,
    /// Why the row failed.
    pub error: Option<String>,
}

impl LatencyRow {
    fn failed(network: &'static str, keys: u32, e: &anyhow::Error) -> LatencyRow {
        LatencyRow {
            network,
            keys,
            error: Some(format!("{e:#}")),
            ..Default::default()
        }
    }
}

impl DeliveryRow {
    fn failed(network: &'static str, e: &anyhow::Error) -> DeliveryRow {
        DeliveryRow {
            network,
            error: Some(format!("{e:#}")),
            ..Default::default()
        }
    }
}

/// Everything `ledger-bench query` measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct QueryReport {
    /// The arguments.
    pub args: QueryArgs,
    /// The machine's load averages (1, 5, 15 min) before and after.
    pub load: [Option<[f64; 3]>; 2],
    /// The latency rows.
    pub latency: Vec<LatencyRow>,
    /// The delivery rows.
    pub delivery: Vec<DeliveryRow>,
    /// Why the emulated network did not run, if it did not.
    pub emulated_skipped: Option<String>,
}

/// One request: status (0: no answer), ms from connect to the answer's end, hash of the answer.
#[derive(Debug, Clone, Copy)]
struct Sample {
    status: u16,
    ms: f64,
    hash: u64,
}

/// `count` `POST /getledgerentry` to `port` in namespace `ns`, the `bodies` in turn, back to back
/// or, with `rate` > 0, on a schedule of `rate` per second over 4 threads; in request order.
fn requests(
    (ns, port): (Option<&str>, u16),
    bodies: &[String],
    count: u32,
    rate: f64,
) -> anyhow::Result<Vec<Sample>> {
    let (bodies, addr) = (bodies.to_vec(), SocketAddr::from(([127, 0, 0, 1], port)));
    let threads = if rate > 0.0 { 4 } else { 1 };
    in_ns(ns, move || {
        let start = Instant::now();
        let one = |i: u32| {
            if rate > 0.0 {
                let due = start + Duration::from_secs_f64(f64::from(i) / rate);
                std::thread::sleep(due.saturating_duration_since(Instant::now()));
            }
            let t0 = Instant::now();
            let answer = http(
                addr,
                "POST /getledgerentry",
                &bodies[i as usize % bodies.len()],
            );
            let ms = t0.elapsed().as_secs_f64() * 1e3;
            let mut h = DefaultHasher::new();
            answer.as_ref().ok().hash(&mut h);
            let (status, hash) = (answer.map_or(0, |a| a.0), h.finish());
            (i, Sample { status, ms, hash })
        };
        let mut all: Vec<(u32, Sample)> = std::thread::scope(|s| {
            let share = |t| s.spawn(move || (t..count).step_by(threads).map(one).collect());
            let shares: Vec<_> = (0..threads as u32).map(share).collect();
            (shares.into_iter())
                .flat_map(|h| h.join().unwrap_or_else(|_| Vec::new()))
                .collect()
        });
        all.sort_by_key(|s| s.0);
        Ok(all.into_iter().map(|s| s.1).collect())
    })
}

/// p50, p99 and the largest latency of the requests answered 200, ms.
fn answered(samples: &[Sample]) -> [f64; 3] {
    let ok = samples.iter().filter(|s| s.status == 200);
    p50_p99_max(ok.map(|s| s.ms).collect())
}

/// 100 account keys live at the last ledger, in key order, as form values.
fn live_keys(testnet: &Path) -> anyhow::Result<Vec<String>> {
    use ledger_relay_core_double::form::encode_xdr;
    let double = ledger_relay_core_double::CoreDouble::load(testnet, Default::default())?;
    double.close_through(LAST);
    let book = double.read_book();
    let mut keys: Vec<_> = book.state.live_accounts(LAST).collect();
    keys.sort();
    let n = keys.len();
    anyhow::ensure!(n >= 100, "only {n} live accounts at the last ledger");
    let encoded = keys[..100].iter().map(|k| encode_xdr(*k));
    Ok(encoded.collect::<Result<_, _>>()?)
}

/// `count` form bodies of `n` keys each (in turn from `keys`), with `ledgerSeq` if given.
pub fn bodies(keys: &[String], n: usize, count: usize, seq: Option<u32>) -> Vec<String> {
    let body = |b: usize| {
        let key = |j| format!("key={}", keys[(b * n + j) % keys.len()]);
        let mut parts: Vec<String> = (0..n).map(key).collect();
        parts.extend(seq.map(|s| format!("ledgerSeq={s}")));
        parts.join("&")
    };
    (0..count).map(body).collect()
}

/// The smallest positive `min_rtt_ms` of a `ledger-subscribe --lane-stats` file.
pub fn min_rtt(path: &Path) -> Option<f64> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut lines = text.lines();
    let col = lines.next()?.split(',').position(|h| h == "min_rtt_ms")?;
    let rtts = lines.filter_map(|l| l.split(',').nth(col)?.parse::<f64>().ok());
    rtts.filter(|v| *v > 0.0).min_by(f64::total_cmp)
}

/// Where core's side and the RPC box's run (namespaces of the emulated network, or this host).
struct Net {
    name: &'static str,
    core: Option<String>,
    rpc: Option<String>,
}

impl Net {
    fn on(name: &'static str, n: Option<&Netem>) -> Net {
        let (core, rpc) = (n.map(|n| n.relay_ns.clone()), n.map(|n| n.sub_ns.clone()));
        Net { name, core, rpc }
    }

    /// The double's query port from core's side.
    fn direct(&self) -> (Option<&str>, u16) {
        (self.core.as_deref(), DOUBLE[1])
    }

    /// The stand-in's query port from the RPC side.
    fn relayed(&self) -> (Option<&str>, u16) {
        (self.rpc.as_deref(), STAND_IN[1])
    }
}

/// A network's relay (the double its source) and stand-in, stopped when dropped.
struct Stack {
    relay: RelayProc,
    stand_in: Option<Child>,
    /// The relay's address as the RPC side reaches it.
    rpc_relay: String,
}

impl Drop for Stack {
    fn drop(&mut self) {
        kill_all(self.stand_in.as_mut_slice());
        // Stopped, not killed: the relay stops the double, which would otherwise keep core's ports.
        self.relay.halt();
    }
}

/// Starts the stack and waits until the stand-in answers a query (any status).
fn start(a: &QueryArgs, c: &Cluster, net: &Net, dir: &Path) -> anyhow::Result<Stack> {
    let double = sibling_binary("ledger-core-double")?;
    let (file, us) = (a.testdata.join(TESTNET), (a.cadence * 1e3).round());
    let (d, f, [h, q]) = (double.display(), file.display(), DOUBLE);
    let source =
        format!("pipe:{d} --ledgers {f} --cadence {us}us --http-port {h} --query-port {q}");
    let extra = [("--core-http", DOUBLE[0]), ("--core-query", DOUBLE[1])]
        .map(|(flag, port)| [flag.to_owned(), format!("http://127.0.0.1:{port}")]);
    let mut s = RelaySettings::endless(4096, 1.0, a.cadence);
    s.retention = 1000;
    let ns = net.core.as_deref().map(|n| (n, RELAY_ADDR));
    let relay = c.relay_in(ns, &dir.join("relay"), &s, &source, extra.as_flattened())?;
    let rpc_relay = relay.addr.to_string();
    let mut stack = Stack {
        relay,
        stand_in: None,
        rpc_relay,
    };
    if let Some(ns) = net.core.as_deref() {
        let listen = SocketAddr::new(RELAY_ADDR.parse()?, DELAY_PORT);
        let one_way = Duration::from_secs_f64(a.rtt / 2e3);
        let to = stack.relay.addr;
        stack.rpc_relay = delay::start(Some(ns), listen, to, one_way)?.to_string();
    }
    let child = stand_in(c, net.rpc.as_deref(), &stack.rpc_relay, dir)?;
    let stand_in = stack.stand_in.insert(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    let probe = ["key=AAAA".to_owned()];
    while (requests(net.relayed(), &probe, 1, 0.0)?.iter()).all(|s| s.status == 0) {
        if let Some(st) = stand_in.try_wait()? {
            let log = log_tail(&dir.join("stand-in.log"), 5);
            bail!("the stand-in exited ({st}): {log}");
        }
        stack.relay.check_alive()?;
        if Instant::now() > deadline {
            bail!("the stand-in did not answer on its query port within 30 s");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(stack)
}

/// `ledger-captive-core` as stellar-rpc's SDK runs it for an unbounded range: `new-db`,
/// `catchup` to the ledger before the first, then `run` with its meta to /dev/null, its ports
/// from the config file, its relay from the environment.
fn stand_in(c: &Cluster, ns: Option<&str>, relay: &str, dir: &Path) -> anyhow::Result<Child> {
    let home = dir.join("stand-in");
    std::fs::create_dir_all(&home)?;
    let conf = home.join("stellar-core.conf");
    let [http, query] = STAND_IN;
    let text = format!("HTTP_PORT = {http}\nHTTP_QUERY_PORT = {query}\n");
    crate::report::write(&conf, &text)?;
    let (b, conf) = (sibling_binary("ledger-captive-core")?, conf.display());
    let (b, before) = (b.display(), FIRST - 1);
    let script = format!(
        "{b} --conf {conf} new-db && {b} --conf {conf} catchup {before}/0 && \
         exec {b} --conf {conf} run --metadata-output-stream fd:3 3>/dev/null"
    );
    let child = Netem::exec_in(ns, Path::new("sh"))
        .args(["-c", &script])
        .current_dir(&home)
        .env("LEDGER_CAPTIVE_CORE_CONFIG", "")
        .env("LEDGER_CAPTIVE_CORE_RELAY", relay)
        .env("LEDGER_CAPTIVE_CORE_CERTS", &c.certs)
        .env("LEDGER_CAPTIVE_CORE_NAME", "sub-0")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("stand-in.log"))?)
        .spawn()
        .context("starting ledger-captive-core")?;
    track(&child);
    Ok(child)
}

/// Delivery beside the stand-in over [`WITHOUT`], then over [`WITH`] with `--rate` queries/s.
fn delivery(
    a: &QueryArgs,
    c: &Cluster,
    net: &Net,
    stack: &Stack,
    dir: &Path,
    keys: &[String],
) -> anyhow::Result<DeliveryRow> {
    let (first, last) = (FIRST + 30, FIRST + 309);
    let mut spec = SubSpec::new("sub-1", first, Some(last - first + 1), 4, dir, "delivery");
    let lanes = dir.join("delivery-lanes.csv");
    spec.extra = vec!["--lane-stats".into(), lanes.display().to_string()];
    let within = Duration::from_secs_f64(a.cadence / 1e3 * f64::from(last - FIRST) + 60.0);
    let count = (a.rate * a.cadence / 1e3 * f64::from(WITH.1 - WITHOUT.1)) as u32;
    let load = bodies(keys, 10, 64, None);
    let (records, samples, secs) = std::thread::scope(|s| {
        let (rpc, spec) = (net.rpc.as_deref(), &spec);
        let sub = s.spawn(move || c.run_subscriber(rpc, &stack.rpc_relay, spec, within));
        let stats = std::slice::from_ref(&spec.stats);
        let reached = crate::runner::wait_all(stats, &[], WITHOUT.1 + 5, within);
        // The load ends on its own, bounded by its count, its rate and each request's timeouts.
        let t0 = Instant::now();
        let samples = reached.and_then(|()| requests(net.relayed(), &load, count, a.rate));
        let secs = t0.elapsed().as_secs_f64();
        let records = sub
            .join()
            .map_err(|_| anyhow::anyhow!("the subscriber panicked"));
        anyhow::Ok((records??.0, samples?, secs))
    })?;
    let achieved_qps = samples.len() as f64 / secs.max(1e-9);
    if achieved_qps < 0.9 * a.rate {
        let rate = a.rate;
        bail!("the query load ran at {achieved_qps:.0}/s, not the {rate}/s asked");
    }
    let span = |(from, to): (u32, u32)| {
        let within = records.iter().filter(|r| (from..to).contains(&r.seq));
        p50_p99_max(within.map(|r| r.delivery_ms).collect())
    };
    let ok = samples.iter().filter(|s| s.status == 200).count();
    Ok(DeliveryRow {
        network: net.name,
        without_ms: span(WITHOUT),
        with_ms: span(WITH),
        queries_ms: answered(&samples),
        achieved_qps,
        answered: ok as f64 / samples.len().max(1) as f64,
        min_rtt_ms: min_rtt(&lanes),
        error: None,
    })
}

/// One latency row: `--requests` to each path in alternating rounds.
fn latency(a: &QueryArgs, net: &Net, keys: &[String], n: u32) -> anyhow::Result<LatencyRow> {
    let bodies = bodies(keys, n as usize, 16, Some(LAST));
    let (mut direct, mut relayed) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let per_round = a.requests.div_ceil(ROUNDS);
        direct.extend(requests(net.direct(), &bodies, per_round, 0.0)?);
        relayed.extend(requests(net.relayed(), &bodies, per_round, 0.0)?);
    }
    let same = |(d, r): (&Sample, &Sample)| d.hash == r.hash;
    let failed = direct.iter().chain(&relayed).filter(|s| s.status != 200);
    Ok(LatencyRow {
        network: net.name,
        keys: n,
        direct_ms: answered(&direct),
        relayed_ms: answered(&relayed),
        errors: failed.count(),
        identical: direct.len() == relayed.len() && direct.iter().zip(&relayed).all(same),
        error: None,
    })
}

/// One network: its stack under `work/NAME`, the delivery row, then the latency rows.
fn network(
    a: &QueryArgs,
    c: &Cluster,
    net: &Net,
    work: &Path,
    keys: &[String],
    out: &mut QueryReport,
) {
    let dir = &work.join(net.name);
    let started = std::fs::create_dir_all(dir).map_err(Into::into);
    let mut stack = match started.and_then(|()| start(a, c, net, dir)) {
        Ok(s) => s,
        Err(e) => {
            out.delivery.push(DeliveryRow::failed(net.name, &e));
            let rows = a.keys.iter().map(|&n| LatencyRow::failed(net.name, n, &e));
            return out.latency.extend(rows);
        }
    };
    let row = delivery(a, c, net, &stack, dir, keys);
    out.delivery
        .push(row.unwrap_or_else(|e| DeliveryRow::failed(net.name, &e)));
    // Every answer of the latency rows is for the last ledger: wait until the relay has it.
    let last = stack.relay.wait_newest(LAST, Duration::from_secs(60));
    let last = last.map_err(|e| format!("{e:#}"));
    for &n in &a.keys {
        eprintln!("query: {} latency, {n} keys", net.name);
        let row = last.clone().map_err(anyhow::Error::msg);
        let row = row.and_then(|_| latency(a, net, keys, n));
        out.latency
            .push(row.unwrap_or_else(|e| LatencyRow::failed(net.name, n, &e)));
    }
}

/// Runs the networks asked for.
pub fn run(a: &QueryArgs) -> anyhow::Result<QueryReport> {
    anyhow::ensure!(a.rate > 0.0, "--rate must be positive");
    let tmp = tempfile::Builder::new()
        .prefix("ledger-bench-query")
        .tempdir()?;
    let certs = tmp.path().join("certs");
    make_certs(&certs, 2)?;
    let c = Cluster {
        certs,
        ..Cluster::default()
    };
    let keys = live_keys(&a.testdata.join(TESTNET))?;
    let mut out = QueryReport {
        args: a.clone(),
        load: [load_average(), None],
        latency: Vec::new(),
        delivery: Vec::new(),
        emulated_skipped: None,
    };
    if a.network != "emulated" {
        eprintln!("query: loopback");
        let lo = Net::on("loopback", None);
        network(a, &c, &lo, tmp.path(), &keys, &mut out);
    }
    match crate::netem::unavailable_reason() {
        _ if a.network == "loopback" => {}
        Some(why) => {
            eprintln!("query: skipping the emulated network: {why}");
            out.emulated_skipped = Some(why);
        }
        None => {
            eprintln!("query: emulated network, {} ms round trip", a.rtt);
            // Uncapped: the link is only delayed.
            let (flow_bps, aggregate_bps) = (10_000_000_000, 10_000_000_000);
            let netem = Netem::create(
                "q",
                Shape {
                    flow_bps,
                    aggregate_bps,
                    link_mtu: None,
                },
            )?;
            let net = Net::on("emulated", Some(&netem));
            network(a, &c, &net, tmp.path(), &keys, &mut out);
        }
    }
    out.load[1] = load_average();
    Ok(out)
}

fn f(v: f64) -> String {
    format!("{v:.3}")
}

/// The latency and delivery tables, and why the emulated network was skipped.
pub fn table(r: &QueryReport) -> String {
    let latency: [Col<LatencyRow>; 10] = [
        Col::l("network", 9, |r| r.network.into()),
        Col::r("keys", 4, |r| r.keys.to_string()),
        Col::r("direct p50", 10, |r| f(r.direct_ms[0])),
        Col::r("p99", 7, |r| f(r.direct_ms[1])),
        Col::r("relayed p50", 11, |r| f(r.relayed_ms[0])),
        Col::r("p99", 7, |r| f(r.relayed_ms[1])),
        Col::r("added p50", 9, |r| f(r.relayed_ms[0] - r.direct_ms[0])),
        Col::r("p99", 7, |r| f(r.relayed_ms[1] - r.direct_ms[1])),
        Col::r("errors", 6, |r| r.errors.to_string()),
        Col::r("identical", 9, |r| {
            ["NO", "yes"][usize::from(r.identical)].into()
        }),
    ];
    let delivery: [Col<DeliveryRow>; 9] = [
        Col::l("network", 9, |r| r.network.into()),
        Col::r("ledger p50", 10, |r| f(r.without_ms[0])),
        Col::r("p99", 7, |r| f(r.without_ms[1])),
        Col::r("+queries p50", 12, |r| f(r.with_ms[0])),
        Col::r("p99", 7, |r| f(r.with_ms[1])),
        Col::r("q/s", 6, |r| format!("{:.0}", r.achieved_qps)),
        Col::r("200s %", 6, |r| format!("{:.1}", r.answered * 100.0)),
        Col::r("query p99", 9, |r| f(r.queries_ms[1])),
        Col::r("link rtt", 8, |r| crate::report::opt(r.min_rtt_ms, 3)),
    ];
    let skipped = r.emulated_skipped.as_ref();
    format!(
        "getLedgerEntries, ms (direct: the double from its own host; relayed: stand-in -> relay -> double)\n{}\nledger delivery to a subscriber beside the stand-in, ms, without and with {} queries/s\n{}{}",
        table_of(&latency, &r.latency, 2, |r| r.error.as_deref()),
        r.args.rate,
        table_of(&delivery, &r.delivery, 1, |r| r.error.as_deref()),
        skipped.map_or(String::new(), |why| format!("emulated network skipped: {why}\n"))
    )
}

/// The whole command: runs, prints the tables, writes `--json`.
pub fn main(a: &QueryArgs) -> anyhow::Result<()> {
    let report = run(a)?;
    let json = crate::report::Output {
        json: a.json.clone(),
        ..Default::default()
    };
    json.emit(&table(&report), String::new, &report)
}
