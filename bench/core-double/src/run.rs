//! `ledger-core-double` as a process: the relay's `pipe:` source (ledgers written to fd 3 at a
//! cadence, the LCL advanced as each is written) with core's two ports open beside it.

use std::future::Future;
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;

use ledger_relay_wire::record::write_record_to;

use crate::double::{CoreDouble, Settings, TESTNET};
use crate::http::Servers;

/// `ledger-core-double` arguments.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "ledger-core-double",
    version,
    about = "A test double of stellar-core for Ledger Relay's tests and benches: replays a ledger file to its meta pipe and answers core's command and query ports from the state those ledgers built",
    long_about = "A test double of stellar-core (not stellar-core): writes the ledgers of a record-marked LedgerCloseMeta file to --output (fd 3, as `stellar-core run --metadata-output-stream fd:3` does) one per --cadence, and closes each as it writes it. Meanwhile it answers core's command port (/tx, /info) and query port (/getledgerentry, /getledgerentryraw) in core's formats from the entries those ledgers changed. Run it as a relay's source: ledger-relay run --source 'pipe:ledger-core-double --ledgers FILE --http-port P --query-port Q'. It keeps serving after the last ledger until SIGINT or SIGTERM."
)]
pub struct Args {
    /// Record-marked LedgerCloseMeta stream to replay (core's meta-pipe framing; zstd accepted).
    #[arg(long, value_name = "FILE")]
    pub ledgers: PathBuf,
    /// Time between ledgers (`100ms`, `5s`).
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub cadence: Duration,
    /// Command port (core's HTTP_PORT; 0: none).
    #[arg(long, default_value_t = 11626)]
    pub http_port: u16,
    /// Query port (core's HTTP_QUERY_PORT; 0: none, core's default).
    #[arg(long, default_value_t = 0)]
    pub query_port: u16,
    /// Address both ports listen on (core: 127.0.0.1 unless PUBLIC_HTTP_PORT).
    #[arg(long, default_value = "127.0.0.1")]
    pub bind: IpAddr,
    /// QUERY_SNAPSHOT_LEDGERS: the query port answers for [LCL - this, LCL].
    #[arg(long, default_value_t = 4)]
    pub snapshot_ledgers: u32,
    /// Network passphrase reported by /info.
    #[arg(long, default_value = TESTNET)]
    pub network_passphrase: String,
    /// Every answer waits this long first (a slow core).
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    pub delay: Duration,
    /// Where the ledgers are written (an inherited fd 3 by default).
    #[arg(long, default_value = "/dev/fd/3", value_name = "PATH")]
    pub output: PathBuf,
}

impl Args {
    fn settings(&self) -> Settings {
        Settings {
            snapshot_ledgers: self.snapshot_ledgers,
            network_passphrase: self.network_passphrase.clone(),
            delay: self.delay,
        }
    }

    fn addr(&self, port: u16) -> Option<SocketAddr> {
        (port != 0).then(|| SocketAddr::new(self.bind, port))
    }
}

/// Loads the ledgers, opens the ports and writes the ledgers at the cadence; then serves until
/// `shutdown` resolves. Fails if the output cannot be written (the relay went away).
pub async fn run(args: Args, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    let double = CoreDouble::load(&args.ledgers, args.settings())?;
    let servers = Servers::start(
        double.clone(),
        args.addr(args.http_port),
        args.addr(args.query_port),
    )
    .await?;
    tracing::info!(
        http = ?servers.addr(ledger_relay_wire::core_http::CorePort::Command),
        query = ?servers.addr(ledger_relay_wire::core_http::CorePort::Query),
        ledgers = double.ledgers().len(),
        "core double serving"
    );
    let out = open_output(&args.output)?;
    let cadence = args.cadence;
    let writer = tokio::task::spawn_blocking(move || write_ledgers(&double, out, cadence));
    tokio::pin!(shutdown);
    tokio::select! {
        written = writer => {
            let n = written.context("the ledger writer panicked")??;
            tracing::info!(ledgers = n, "core double: every ledger written; serving until stopped");
            shutdown.await;
        }
        () = &mut shutdown => {}
    }
    drop(servers);
    Ok(())
}

fn open_output(path: &Path) -> anyhow::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .with_context(|| format!("opening the meta output {}", path.display()))
}

/// Closes each remaining ledger of `double` at `cadence` (the first at once) and writes it,
/// record-marked, to `out`; returns how many it wrote.
pub fn write_ledgers(
    double: &CoreDouble,
    mut out: impl Write,
    cadence: Duration,
) -> anyhow::Result<u32> {
    let start = Instant::now();
    let mut written = 0u32;
    loop {
        let due = start + cadence * written;
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let Some(closed) = double.close_next() else {
            return Ok(written);
        };
        write_record_to(&mut out, &closed.raw)
            .and_then(|()| out.flush())
            .with_context(|| format!("writing ledger {} to the meta output", closed.seq))?;
        tracing::debug!(seq = closed.seq, "core double: ledger closed and written");
        written += 1;
    }
}

/// Resolves on SIGINT or SIGTERM.
pub async fn stop_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
