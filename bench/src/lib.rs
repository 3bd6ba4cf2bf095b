//! `ledger-bench`: what lanes buy and what they cost. `run`: scenarios as data ([`scenario`])
//! through one runner ([`runner`]) on loopback or an emulated network ([`netem`]), one kind of row
//! ([`row`]); `remote`: such rows against another host, beside the TCP [`yardstick`]; `cpu`,
//! `storage` and `query`: transport cost, the ring and a data lake, and core's query port.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod cluster;
pub mod cpu;
pub mod netem;
pub mod pipe;
pub mod plots;
pub mod procs;
pub mod query;
pub mod remote;
pub mod report;
pub mod row;
pub mod run;
pub mod runner;
pub mod scenario;
pub mod stats;
pub mod storage;
pub mod yardstick;

use clap::{Parser, Subcommand};

/// `ledger-bench` arguments.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "ledger-bench",
    version,
    about = "Measures Ledger Relay: delivery over lanes against one flow, on loopback, an emulated cloud network or a real one",
    long_about = "Measures Ledger Relay. Runs ledger-relay and ledger-subscribe (built in the same workspace: cargo build --release --workspace) and prints what they measured. The emulated network (network namespaces, per-flow caps) needs root; without it those rows say so."
)]
pub struct Cli {
    /// What to measure.
    #[command(subcommand)]
    pub command: Command,
}

/// The measurements.
#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Scenarios from a preset (`--list`), with flags setting any field and sweeps: delivery,
    /// throughput, CPU, memory and each lane, one row per scenario.
    Run(Box<run::RunArgs>),
    /// Against a relay on another host: a row per lane count and, with --tcp, one over the TCP
    /// yardstick there, delivery put on one clock by probes over it.
    Remote(remote::RemoteArgs),
    /// Serves the TCP yardstick on a relay's host: the same synthetic ledgers as its source,
    /// paced alike, over one TLS-over-TCP flow per client, for `remote --tcp`.
    Yardstick(yardstick::serve::ServeArgs),
    /// CPU per raw ledger at its real size in one process: bare quinn, one TLS-over-TCP flow,
    /// and the relay end to end (`ledger-relay demo`).
    Cpu(cpu::CpuArgs),
    /// The ring's disk use against its live bytes and its CPU per ledger; writing a data lake
    /// and backfilling from it against catch-up from the ring.
    Storage(Box<storage::StorageArgs>),
    /// stellar-core's query port carried through relays: getLedgerEntries of 1, 10 and 100
    /// keys through stand-in -> relay -> core double against the double called directly, on
    /// loopback and over an emulated round trip (root), and ledger delivery with and without
    /// queries running.
    Query(query::QueryArgs),
}

/// Stops the children and removes the namespaces on SIGINT or SIGTERM, then exits 130.
fn stop_children_on_signals() {
    std::thread::spawn(|| {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        rt.block_on(async {
            let Ok(mut signals) = ledger_relay_cli::StopSignals::new() else {
                return;
            };
            signals.recv().await;
            eprintln!("\nledger-bench: interrupted: stopping children and removing namespaces");
            procs::kill_tracked();
            netem::cleanup_registered();
            std::process::exit(130);
        });
    });
}

/// Runs the command.
pub fn main_with(cli: Cli) -> anyhow::Result<()> {
    if !matches!(cli.command, Command::Yardstick(_) | Command::Cpu(_)) {
        stop_children_on_signals();
    }
    match &cli.command {
        Command::Run(a) => run::main(a),
        Command::Remote(a) => remote::main(a),
        Command::Yardstick(a) => yardstick::serve::main(a),
        Command::Cpu(a) => cpu::main(a),
        Command::Storage(a) => storage::main(a),
        Command::Query(a) => query::main(a),
    }
}
