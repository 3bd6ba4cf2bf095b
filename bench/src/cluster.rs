//! The spine of the subcommands: the argument groups they share ([`Transport`], [`Output`]),
//! the one place relay and subscriber command lines are built ([`Cluster`]), and the one way
//! a report is printed and written ([`Report`], [`emit`]).
//!
//! A subcommand is its arguments, the rows it plans, a [`Cluster`] per row, the rows it
//! measured and [`emit`].

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Child;

use crate::harness::{spawn_subscriber, RelayProc, RelaySettings, SubSpec};

/// QUIC packet sizes of every relay and subscriber of a run (`--max-mtu`, `--min-mtu`).
#[derive(Debug, Clone, Copy, Default, clap::Args, serde::Serialize)]
pub struct Transport {
    /// Largest UDP payload of the QUIC lanes: every subscriber's `--max-mtu`, and
    /// `[transport] max_mtu` of every relay the bench starts [default: the transport's].
    #[arg(long)]
    pub max_mtu: Option<u16>,
    /// UDP payload the lanes take the path to carry (`--min-mtu`, `min_mtu`), same ends.
    #[arg(long)]
    pub min_mtu: Option<u16>,
}

/// Where a report goes besides the table on stdout.
#[derive(Debug, Clone, Default, clap::Args, serde::Serialize)]
pub struct Output {
    /// Write the rows as CSV.
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    /// Write the rows (with every delivery) as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write the plots (SVG) in this directory.
    #[arg(long, value_name = "DIR")]
    pub plots: Option<PathBuf>,
}

/// What a subcommand measured, in every form it is given.
pub trait Report: serde::Serialize {
    /// The table printed on stdout.
    fn table(&self) -> String;
    /// The targets computed from the rows (printed after the table).
    fn targets(&self) -> String {
        String::new()
    }
    /// The rows as CSV.
    fn csv(&self) -> String;
    /// Draws the plots in `dir`; returns what it wrote.
    fn plots(&self, dir: &Path) -> anyhow::Result<String>;
}

/// Prints `report`'s table and targets and writes what `out` asks for. A plot that cannot be
/// drawn is reported on stderr and does not fail the run (the rows are already measured).
pub fn emit<R: Report>(report: &R, out: &Output) -> anyhow::Result<()> {
    print!("{}", report.table());
    print!("{}", report.targets());
    if let Some(p) = &out.csv {
        crate::report::write(p, &report.csv())?;
    }
    if let Some(p) = &out.json {
        crate::report::write(p, &serde_json::to_string_pretty(report)?)?;
    }
    if let Some(d) = &out.plots {
        match report.plots(d) {
            Ok(f) => eprintln!("ledger-bench: plot: {f}"),
            Err(e) => eprintln!("ledger-bench: no plot: {e:#}"),
        }
    }
    Ok(())
}

/// The processes of one row: the binaries, the CA, the transport settings and the flags every
/// relay and every subscriber of the row takes. Every relay and subscriber command line is
/// built here ([`Cluster::relay`], [`Cluster::subscriber`]); a per-subscriber flag goes in
/// [`SubSpec::extra`].
#[derive(Debug, Clone)]
pub struct Cluster {
    /// `ledger-relay`.
    pub relay_bin: PathBuf,
    /// `ledger-subscribe`.
    pub sub_bin: PathBuf,
    /// The ephemeral CA with the relay's and the subscribers' certificates.
    pub certs: PathBuf,
    /// Packet sizes of both ends.
    pub transport: Transport,
    /// More flags for every relay.
    pub relay_extra: Vec<String>,
}

impl Cluster {
    /// On this host, with the binaries built next to this executable.
    pub fn local(certs: &Path, transport: Transport) -> anyhow::Result<Cluster> {
        Ok(Cluster {
            relay_bin: crate::proc::sibling_binary("ledger-relay")?,
            sub_bin: crate::proc::sibling_binary("ledger-subscribe")?,
            certs: certs.to_owned(),
            transport,
            relay_extra: Vec::new(),
        })
    }

    /// Starts `ledger-relay run` with data under `dir`, the synthetic source of `s`, the
    /// transport settings, [`Cluster::relay_extra`] and then `extra`.
    pub fn relay(
        &self,
        dir: &Path,
        s: &RelaySettings,
        extra: &[String],
    ) -> anyhow::Result<RelayProc> {
        std::fs::create_dir_all(dir)?;
        let t = self.transport;
        let (mtu, _) = crate::proc::mtu_args(dir, t.max_mtu, t.min_mtu)?;
        let mut all: Vec<String> = mtu
            .into_iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        all.extend(self.relay_extra.iter().cloned());
        all.extend(extra.iter().cloned());
        RelayProc::start_with(&self.relay_bin, &self.certs, dir, s, &all, &[])
    }

    /// Starts `ledger-subscribe` for `spec` against `relay` with the transport settings
    /// (its [`SubSpec::extra`] flags come last).
    pub fn subscriber(&self, relay: SocketAddr, spec: &SubSpec) -> anyhow::Result<Child> {
        let mut spec = spec.clone();
        let mut extra = crate::proc::mtu_flags(self.transport.max_mtu, self.transport.min_mtu);
        extra.append(&mut spec.extra);
        spec.extra = extra;
        spawn_subscriber(&self.sub_bin, relay, &self.certs, &spec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Probe {
        #[command(flatten)]
        transport: Transport,
        #[command(flatten)]
        out: Output,
    }

    #[test]
    fn the_groups_parse_their_flags_and_default_to_nothing() {
        let p = Probe::try_parse_from(["x"]).unwrap();
        assert_eq!((p.transport.max_mtu, p.transport.min_mtu), (None, None));
        assert!(p.out.csv.is_none() && p.out.json.is_none() && p.out.plots.is_none());
        let p = Probe::try_parse_from(["x", "--max-mtu", "8952", "--csv", "a.csv"]).unwrap();
        assert_eq!(p.transport.max_mtu, Some(8952));
        assert_eq!(p.out.csv.as_deref(), Some(Path::new("a.csv")));
        assert!(Probe::try_parse_from(["x", "--max-mtu", "70000"]).is_err());
    }
}
