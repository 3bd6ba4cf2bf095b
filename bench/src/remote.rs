//! `ledger-bench remote`: a row per lane count (`ledger-subscribe` from the tip) against a relay
//! on another host and, with `--tcp`, one over the TCP yardstick there.
//!
//! **Clocks.** With `--tcp` the hosts' offset is estimated as NTP does over the yardstick:
//! ((t1 - t0) + (t2 - t3)) / 2, within half the round trip; the best of `--clock-probes` before
//! and after, their mean added to every delivery. Without it delivery is as the clocks say.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};

use crate::row::Row;
use crate::runner::{take, Env};
use crate::scenario::{Carrier, NetKind, Scenario};
use crate::yardstick::client::{host_of, ClockEstimate, Yardstick};

/// `ledger-bench remote` arguments.
#[derive(Debug, Clone, clap::Args, serde::Serialize)]
pub struct RemoteArgs {
    /// The relay's QUIC address.
    #[arg(long, value_name = "HOST:PORT")]
    pub relay: String,
    /// Certificate directory: DIR/ca.pem, and DIR/NAME.pem with DIR/NAME.key, a client
    /// certificate of the relay's CA.
    #[arg(long, value_name = "DIR")]
    pub certs: PathBuf,
    /// Our client certificate's name in DIR.
    #[arg(long, value_name = "NAME")]
    pub name: String,
    /// Lane counts, a row each.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8", value_parser = clap::value_parser!(u8).range(1..=16))]
    pub lanes: Vec<u8>,
    /// Ledgers measured per row, after the warm-up.
    #[arg(long, default_value_t = 57, value_parser = clap::value_parser!(u32).range(1..))]
    pub ledgers: u32,
    /// Ledgers left out at the start of each row.
    #[arg(long, default_value_t = 3)]
    pub warmup: u32,
    /// The TCP yardstick on the relay's host (`ledger-bench yardstick`): a row over one
    /// TLS-over-TCP flow, and the clock offset between the hosts.
    #[arg(long, value_name = "HOST:PORT")]
    pub tcp: Option<String>,
    /// TLS name the relay's certificate must be valid for [default: the host of --relay].
    #[arg(long, value_name = "NAME")]
    pub server_name: Option<String>,
    /// The relay's `--emit` window: a ledger's goodput counts from its first byte.
    #[arg(long, value_name = "DURATION", default_value = "8ms", value_parser = ledger_relay_transport::parse_duration)]
    #[serde(skip)]
    pub emit: Duration,
    /// Clock probes before the rows and after them (with --tcp).
    #[arg(long, default_value_t = 32)]
    pub clock_probes: u32,
    /// Longest a row may take.
    #[arg(long, value_name = "DURATION", default_value = "600s", value_parser = ledger_relay_transport::parse_duration)]
    #[serde(skip)]
    pub row_timeout: Duration,
    /// Largest UDP payload of the lanes (the relay takes its own `[transport] max_mtu`;
    /// 8952 for jumbo frames in an EC2 VPC).
    #[arg(long)]
    pub max_mtu: Option<u16>,
    /// UDP payload the lanes take the path to carry.
    #[arg(long)]
    pub min_mtu: Option<u16>,
    /// `--csv`, `--json`, `--plots`.
    #[command(flatten)]
    #[serde(skip)]
    pub output: crate::report::Output,
}

/// How delivery was put on one clock.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Clock {
    /// The relay's clock minus this host's, ms, added to every delivery (`None`: unknown).
    pub offset_ms: Option<f64>,
    /// The estimate before the rows.
    pub before: Option<ClockEstimate>,
    /// The estimate after the rows.
    pub after: Option<ClockEstimate>,
}

impl Clock {
    /// The line the table is headed with.
    pub fn describe(&self) -> String {
        match (self.offset_ms, self.before, self.after) {
            (Some(off), Some(b), Some(a)) => format!(
                "clock: relay minus this host {off:+.3} ms (NTP-style over the TCP yardstick, best of {} probes: {:+.3} ms before, {:+.3} ms after, drift {:+.3} ms), within ±{:.3} ms; added to every delivery",
                b.probes,
                b.offset_ms,
                a.offset_ms,
                a.offset_ms - b.offset_ms,
                b.rtt_ms.max(a.rtt_ms) / 2.0,
            ),
            _ => "clock: not compared (no --tcp): delivery includes the difference of the two hosts' clocks; inter-arrival, throughput and transfer goodput do not".into(),
        }
    }
}

/// What `ledger-bench remote` measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RemoteReport {
    /// The arguments.
    pub args: RemoteArgs,
    /// How delivery was put on one clock.
    pub clock: Clock,
    /// The yardstick's row, then one per lane count.
    pub rows: Vec<Row>,
}

/// The rows of `a`: the yardstick's, then one per lane count.
pub fn scenarios(a: &RemoteArgs) -> Vec<Scenario> {
    let row = |name: String, carrier, lanes| Scenario {
        name,
        network: NetKind::Remote,
        relay: Some(a.relay.clone()),
        tcp: a.tcp.clone(),
        carrier,
        lanes,
        ledgers: a.ledgers,
        warmup: a.warmup,
        emit: a.emit.as_secs_f64() * 1e3,
        max_mtu: a.max_mtu,
        min_mtu: a.min_mtu,
        ..Scenario::default()
    };
    let tcp = |_| row("remote-tcp".into(), Carrier::Tcp, 1);
    let lanes = a
        .lanes
        .iter()
        .map(|&n| row(format!("remote-l{n}"), Carrier::Relay, n));
    a.tcp.iter().map(tcp).chain(lanes).collect()
}

/// Runs the rows, with clock probes before and after.
pub fn run(a: &RemoteArgs) -> anyhow::Result<RemoteReport> {
    let rows = scenarios(a);
    if rows.is_empty() {
        bail!("nothing to run: no --lanes and no --tcp");
    }
    let host = || host_of(&a.relay).context("--relay");
    let server_name = a.server_name.clone().map_or_else(host, Ok)?;
    let mut env = Env::remote(
        a.certs.clone(),
        Some(a.name.clone()),
        Some(server_name.clone()),
        a.row_timeout,
    )?;
    let yardstick = |t: &String| Yardstick::new(t, &a.certs, &a.name, &server_name);
    let yardstick = a.tcp.as_ref().map(yardstick).transpose()?;
    let probe = |y: &Yardstick| y.clock(a.clock_probes);
    let before = yardstick.as_ref().map(probe).transpose()?;
    let taken: Vec<_> = rows.iter().map(|sc| (sc, take(&mut env, sc))).collect();
    let after = yardstick.as_ref().map(probe).transpose()?;
    let mean = |(b, a): (ClockEstimate, ClockEstimate)| (b.offset_ms + a.offset_ms) / 2.0;
    let offset_ms = before.zip(after).map(mean);
    let off = offset_ms.unwrap_or(0.0);
    let rows = taken.into_iter().map(|(sc, t)| Row::finish(sc, t, off));
    Ok(RemoteReport {
        args: a.clone(),
        clock: Clock {
            offset_ms,
            before,
            after,
        },
        rows: rows.collect(),
    })
}

/// The whole command: runs, prints the clock line and the tables, writes the files.
pub fn main(a: &RemoteArgs) -> anyhow::Result<()> {
    let report = run(a)?;
    let head = report.clock.describe() + "\n";
    crate::row::emit(&a.output, &head, &report.rows, &report)
}
