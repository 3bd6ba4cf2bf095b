//! `ledger-bench remote`: single flow against lanes on a real network, against a relay that runs
//! on another host (`ledger-relay run ... --tcp-baseline ADDR`), with the same table, CSV, JSON
//! and plots as the rows of one machine.
//!
//! One row per lane count of `--lane-counts`: a `ledger-subscribe` (found next to this executable)
//! from the relay's tip for `--ledgers` ledgers, its `--stats` CSV read back. With `--tcp`, a
//! row over the relay's TCP baseline too: the same ledgers over one TLS-over-TCP flow, read by
//! this process ([`tcp`]), sent by the relay once it holds each whole ledger (the lanes stream
//! chunks while the source writes, so the TCP row's delivery includes the relay's emit window).
//!
//! **Clocks.** Delivery is the subscriber's clock when it holds a complete, verified ledger
//! minus the relay's clock when it read the ledger's last byte. On two hosts those clocks
//! differ. With `--tcp` the offset is estimated as NTP does, over the TCP baseline: probes
//! carry this host's send time t0; the relay stamps its receipt t1 and its answer t2; the
//! answer arrives at t3. The relay's clock minus ours is ((t1 - t0) + (t2 - t3)) / 2, exact
//! when both directions take equally long and wrong by at most half the round trip otherwise;
//! of `--clock-probes` probes the one with the shortest round trip is kept. Probes run before
//! the rows and after them; the mean of the two estimates is added to every delivery, and the
//! header line gives both, the round trip (the bound on the error) and their difference (the
//! drift over the run). Without `--tcp` delivery is left as the clocks say and the header says
//! so. Inter-arrival, throughput and transfer goodput (bytes over the time between the first
//! and last arrival) use this host's clock alone and need no correction.

pub mod tcp;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};

use crate::cluster::{Cluster, SubSpec};
use crate::netem::Shape;
use crate::proc::sibling_binary;
use crate::scenario::{finish, Kind, Row, Scenario, Settings};
use crate::stats::Record;
use tcp::{ClockEstimate, TcpBaseline};

/// `ledger-bench remote` settings.
#[derive(Debug, Clone, clap::Args, serde::Serialize)]
#[command(mut_arg("ledgers", |a| a.default_value("60").help("Ledgers per row, warm-up included")))]
#[command(mut_arg("counts", |a| a.value_parser(clap::value_parser!(u8).range(1..=64))))]
#[command(mut_arg("emit_ms", |a| a.help("The relay's `--emit` window, ms: a ledger's goodput counts from its first byte")))]
pub struct RemoteArgs {
    /// The relay's QUIC address, HOST:PORT.
    #[arg(long, value_name = "HOST:PORT")]
    pub relay: String,
    /// Certificate directory: DIR/ca.pem, and DIR/NAME.pem with DIR/NAME.key, a client
    /// certificate of the relay's CA.
    #[arg(long, value_name = "DIR")]
    pub certs: PathBuf,
    /// Our client certificate's name in DIR.
    #[arg(long, value_name = "NAME")]
    pub name: String,
    /// `--lane-counts`.
    #[command(flatten)]
    #[serde(flatten)]
    pub lanes: crate::cluster::LaneCounts,
    /// `--ledgers` and `--warmup` [ledgers default: 60, warm-up included].
    #[command(flatten)]
    #[serde(flatten)]
    pub series: crate::cluster::Series,
    /// The relay's TCP baseline (`ledger-relay run --tcp-baseline ADDR`), HOST:PORT: adds a row
    /// over one TLS-over-TCP flow, and the clock offset between the hosts.
    #[arg(long, value_name = "HOST:PORT")]
    pub tcp: Option<String>,
    /// TLS name the relay's certificate must be valid for [default: the host of --relay].
    #[arg(long, value_name = "NAME")]
    pub server_name: Option<String>,
    /// `--emit-ms` of the relay.
    #[command(flatten)]
    #[serde(flatten)]
    pub emit: crate::cluster::Emit,
    /// Clock probes before the rows and after them (with --tcp).
    #[arg(long, default_value_t = 32)]
    pub clock_probes: u32,
    /// Longest a row may take, seconds.
    #[arg(long, default_value_t = 600)]
    pub row_timeout_s: u64,
    /// `--csv`, `--json` (with every delivery sample and the clock estimate) and `--plots`
    /// (delivery CDF and goodput against lanes, SVG and PNG).
    #[command(flatten)]
    #[serde(flatten)]
    pub output: crate::cluster::Output,
    /// `--max-mtu`/`--min-mtu` of each `ledger-subscribe` (the relay, on the other host, takes
    /// its own `[transport]`; 8952 for jumbo frames in an EC2 VPC).
    #[command(flatten)]
    #[serde(flatten)]
    pub transport: crate::cluster::Transport,
}

/// How delivery was put on one clock.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Clock {
    /// The method, in words.
    pub method: String,
    /// The relay's clock minus this host's, ms, added to every delivery (`None`: unknown,
    /// nothing added).
    pub offset_ms: Option<f64>,
    /// The estimate before the rows.
    pub before: Option<ClockEstimate>,
    /// The estimate after the rows.
    pub after: Option<ClockEstimate>,
}

impl Clock {
    /// Bound on the error of `offset_ms`: half the longer of the two best round trips, ms.
    pub fn uncertainty_ms(&self) -> Option<f64> {
        let rtts = [self.before, self.after]
            .into_iter()
            .flatten()
            .map(|e| e.rtt_ms);
        rtts.fold(None, |m: Option<f64>, r| Some(m.map_or(r, |m| m.max(r))))
            .map(|r| r / 2.0)
    }

    /// The one line the table is headed with.
    pub fn describe(&self) -> String {
        match (self.offset_ms, self.before, self.after) {
            (Some(off), Some(b), Some(a)) => format!(
                "clock: relay minus this host {off:+.3} ms (NTP-style over the TCP baseline, \
                 best of {} probes: {:+.3} ms before, {:+.3} ms after, drift {:+.3} ms), \
                 within ±{:.3} ms; added to every delivery",
                b.probes,
                b.offset_ms,
                a.offset_ms,
                a.offset_ms - b.offset_ms,
                self.uncertainty_ms().unwrap_or(f64::NAN),
            ),
            _ => "clock: not compared (no --tcp): delivery includes the difference of the two \
                  hosts' clocks; inter-arrival, throughput and transfer goodput do not"
                .into(),
        }
    }
}

impl crate::cluster::Table for RemoteReport {
    fn table(&self) -> String {
        format!(
            "{}\n{}",
            self.clock.describe(),
            crate::report::table(&self.rows)
        )
    }
}

impl crate::cluster::Report for RemoteReport {
    fn csv(&self) -> String {
        crate::report::csv(&self.rows)
    }
    fn plots(&self, dir: &Path) -> anyhow::Result<String> {
        Ok(crate::report::plots(&self.rows, dir, 0)?.join(", "))
    }
}

/// What `ledger-bench remote` measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RemoteReport {
    /// The arguments.
    pub settings: RemoteArgs,
    /// How delivery was put on one clock.
    pub clock: Clock,
    /// One row per lane count, and the TCP baseline's.
    pub rows: Vec<Row>,
}

/// The host part of HOST:PORT (`[v6]:port` without its brackets).
pub fn host_of(addr: &str) -> anyhow::Result<String> {
    if let Ok(sa) = addr.parse::<std::net::SocketAddr>() {
        return Ok(sa.ip().to_string());
    }
    match addr.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {
            Ok(host.to_owned())
        }
        _ => bail!("{addr:?}: expected HOST:PORT"),
    }
}

/// Adds `offset_ms` (the relay's clock minus ours) to every delivery: the relay's stamp of a
/// ledger's last byte, on our clock, is that stamp minus the offset.
pub fn correct(records: &mut [Record], offset_ms: f64) {
    for r in records {
        r.delivery_ms += offset_ms;
    }
}

/// Runs the rows; see the module documentation.
pub fn run(args: &RemoteArgs) -> anyhow::Result<RemoteReport> {
    if args.lanes.counts.is_empty() && args.tcp.is_none() {
        bail!("nothing to run: no --lanes and no --tcp");
    }
    args.series.check()?;
    let relay_host = host_of(&args.relay).context("--relay")?;
    let server_name = args.server_name.clone().unwrap_or(relay_host);
    if !args.lanes.counts.is_empty() {
        // Before any row: the lane rows need it.
        sibling_binary("ledger-subscribe")?;
    }
    let baseline = match &args.tcp {
        Some(addr) => {
            host_of(addr).context("--tcp")?;
            Some(TcpBaseline::new(
                addr,
                &args.certs,
                &args.name,
                &server_name,
            )?)
        }
        None => None,
    };
    let within = Duration::from_secs(args.row_timeout_s);
    let tmp = crate::cluster::work_dir("ledger-bench-remote")?;
    // The clock offset, NTP-style over the TCP baseline, before and after the rows.
    let probe = || {
        let clock = |b: &TcpBaseline| b.clock(args.clock_probes).context("clock probes");
        baseline.as_ref().map(clock).transpose()
    };
    let before = probe()?;
    let mut measured: Vec<(Scenario, u8, Measured)> = Vec::new();
    if let (Some(b), Some(addr)) = (&baseline, &args.tcp) {
        eprintln!("ledger-bench remote: remote-tcp (one TLS-over-TCP flow to {addr})");
        let sc = scenario("remote-tcp", addr, None);
        let got = b
            .stream(args.series.count.ledgers, within)
            .map(|r| (r, None))
            .map_err(|e| format!("{e:#}"));
        measured.push((sc, 1, got));
    }
    for &lanes in &args.lanes.counts {
        let name = format!("remote-l{lanes}");
        eprintln!(
            "ledger-bench remote: {name} ({lanes} lanes to {})",
            args.relay
        );
        let sc = scenario(&name, &args.relay, Some(lanes));
        let got = subscribe(args, lanes, &server_name, tmp.path(), within)
            .map(|(r, cpu)| (r, Some(cpu)))
            .map_err(|e| format!("{e:#}"));
        measured.push((sc, lanes, got));
    }
    let after = probe()?;
    let offset_ms = match (before, after) {
        (Some(b), Some(a)) => Some((b.offset_ms + a.offset_ms) / 2.0),
        _ => None,
    };
    let clock = Clock {
        method: match offset_ms {
            Some(_) => {
                "ntp-style over the tcp baseline, shortest round trip, mean of before and after"
                    .into()
            }
            None => "none".into(),
        },
        offset_ms,
        before,
        after,
    };
    let settings = Settings {
        ledgers: args.series.count.ledgers,
        warmup: args.series.warmup,
        size: 0,
        cadence_ms: 0.0,
        emit_ms: args.emit.emit_ms,
        chunk: 0,
        shape: Shape {
            flow_bps: 0,
            aggregate_bps: 0,
        },
        scale: 1.0,
        max_mtu: args.transport.max_mtu,
        min_mtu: args.transport.min_mtu,
    };
    let rows = measured
        .into_iter()
        .map(|(sc, lanes, got)| {
            let mut row = Row::empty(&sc, lanes, 1);
            match got {
                Ok((mut records, cpu)) => {
                    if let Some(off) = offset_ms {
                        correct(&mut records, off);
                    }
                    row.sub_cpu_ms = cpu.map(|c| c * 1e3 / f64::from(args.series.count.ledgers));
                    finish(&settings, &mut row, &[records], 0.0);
                }
                Err(e) => row.error = Some(e),
            }
            row
        })
        .collect();
    Ok(RemoteReport {
        settings: args.clone(),
        clock,
        rows,
    })
}

/// A row's records and its subscriber's CPU seconds (none for the in-process TCP client), or
/// why it has none.
type Measured = Result<(Vec<Record>, Option<f64>), String>;

fn scenario(name: &str, addr: &str, lanes: Option<u8>) -> Scenario {
    Scenario {
        name: name.into(),
        kind: Kind::Remote {
            addr: addr.into(),
            lanes,
        },
        emulated: false,
    }
}

/// One lane row: `ledger-subscribe` from the tip; its records and CPU seconds.
fn subscribe(
    args: &RemoteArgs,
    lanes: u8,
    server_name: &str,
    tmp: &Path,
    within: Duration,
) -> anyhow::Result<(Vec<Record>, f64)> {
    let spec = SubSpec {
        extra: vec!["--server-name".into(), server_name.into(), "--quiet".into()],
        ..SubSpec::new(
            &args.name,
            "tip",
            Some(args.series.count.ledgers),
            lanes,
            tmp,
            &format!("sub-l{lanes}"),
        )
    };
    let cluster = Cluster::local(&args.certs, args.transport)?;
    cluster.run_subscriber(None, &args.relay, &spec, within)
}

/// The whole command: runs, prints the clock line and the table, writes `--csv`, `--json` and
/// `--plots`.
pub fn main(args: &RemoteArgs) -> anyhow::Result<()> {
    let report = run(args)?;
    crate::cluster::emit(&report, &args.output)?;
    if report.rows.iter().all(|r| r.error.is_some()) {
        bail!("every row failed");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_of_addresses() {
        assert_eq!(host_of("198.18.0.1:7400").unwrap(), "198.18.0.1");
        assert_eq!(host_of("[::1]:7400").unwrap(), "::1");
        assert_eq!(host_of("relay-a.example:7400").unwrap(), "relay-a.example");
        assert!(host_of("relay-a.example").is_err());
        assert!(host_of(":7400").is_err());
    }

    #[test]
    fn the_offset_moves_delivery_onto_one_clock() {
        // The relay's clock is 250 ms behind ours: a ledger that took 5 ms reads as 255 ms.
        let mut r = vec![Record {
            seq: 1,
            raw_bytes: 1,
            wire_bytes: 1,
            delivery_ms: 255.0,
            inter_arrival_ms: None,
            received_unix_ms: None,
        }];
        correct(&mut r, -250.0);
        assert_eq!(r[0].delivery_ms, 5.0);
        let est = |offset_ms, rtt_ms| ClockEstimate {
            offset_ms,
            rtt_ms,
            probes: 8,
        };
        let c = Clock {
            method: String::new(),
            offset_ms: Some(-250.0),
            before: Some(est(-250.5, 0.4)),
            after: Some(est(-249.5, 0.6)),
        };
        assert_eq!(c.uncertainty_ms(), Some(0.3));
        assert!(c.describe().contains("drift +1.000 ms"), "{}", c.describe());
        let none = Clock {
            method: "none".into(),
            offset_ms: None,
            before: None,
            after: None,
        };
        assert!(none.describe().contains("not compared"));
        assert_eq!(none.uncertainty_ms(), None);
    }
}
