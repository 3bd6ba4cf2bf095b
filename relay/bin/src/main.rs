//! `ledger-relay`: runs the relay (`run`) or a self-contained demonstration (`demo`), checks a
//! config file (`check-config`), and writes its shell completions and man pages.
//!
//! The relay itself is the `ledger-relay` library; this binary only parses arguments and calls
//! it. It lives in a package of its own because the demo runs a subscriber in the same process,
//! and the relay library does not depend on the subscriber library.

mod core_upstream;
mod demo;
mod upstream;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};
use demo::DemoArgs;
use ledger_relay::config::{RelayConfig, RunArgs};
use ledger_relay_cli::{logging, AssetCommand, LogFormat, StopSignals};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Parser)]
#[command(
    name = "ledger-relay",
    version,
    about = "Relays stellar-core's ledgers to subscribers over multi-lane QUIC"
)]
struct Cli {
    /// Log format on stderr: text (human-readable) or json (one object per line).
    #[arg(long, value_enum, global = true, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the relay.
    Run(Box<RunArgs>),
    /// Everything on loopback with an ephemeral CA: a relay fed synthetic Phase 3 ledgers and an
    /// in-process 4-lane subscriber; prints each ledger's delivery latency and a summary.
    Demo(DemoArgs),
    /// Check a config file as `run --config FILE` would read it, and the certificates it names:
    /// exit 0 with a summary, or 2 with the reason.
    CheckConfig {
        /// The TOML file.
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
    },
    #[command(flatten)]
    Assets(AssetCommand),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    let format = cli.log_format;
    // The demo prints its own table; its logs show only problems unless RUST_LOG asks.
    let default_filter = match cli.command {
        Command::Run(_) => "info",
        _ => "warn",
    };
    logging::init(format, default_filter);
    let fail = |e: anyhow::Error| {
        logging::fatal(format, "ledger-relay", &format!("error: {e:#}"));
        ExitCode::from(2)
    };
    match cli.command {
        Command::CheckConfig { config } => {
            return match ledger_relay::check_config(&config) {
                Ok(summary) => {
                    println!("{summary}");
                    ExitCode::SUCCESS
                }
                Err(e) => fail(e),
            };
        }
        Command::Assets(assets) => {
            return match assets.run(Cli::command()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(e.into()),
            };
        }
        Command::Run(_) | Command::Demo(_) => {}
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return fail(anyhow::Error::new(e).context("starting the runtime")),
    };
    let shutdown = CancellationToken::new();
    runtime.spawn(shutdown_on_signal(shutdown.clone()));
    let result = runtime.block_on(async {
        match cli.command {
            Command::Run(args) => {
                let mut config = RelayConfig::from_args(*args)?;
                if let Some(up) = config.upstream.clone() {
                    config.external_source =
                        Some(upstream::external(config.certs.clone(), up.clone()));
                    if let ledger_relay::source::SourceSpec::Relay { upstreams } = &config.source {
                        if !config.core.has_own_core() {
                            config.core_upstream =
                                Some(core_upstream::backend(&config.certs, &up, upstreams)?);
                        }
                        config.refetch = Some(upstream::refetch(
                            config.certs.clone(),
                            up,
                            upstreams.clone(),
                        ));
                    }
                }
                let relay = ledger_relay::Relay::start(config, shutdown).await?;
                relay.wait().await;
                Ok(())
            }
            Command::Demo(args) => demo::run(args, shutdown).await,
            // Handled above.
            Command::CheckConfig { .. } | Command::Assets(_) => Ok(()),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
}

/// SIGINT or SIGTERM: graceful shutdown (stop accepting, finish the ledger in flight, flush the
/// ring). A second signal exits at once.
async fn shutdown_on_signal(shutdown: CancellationToken) {
    let Ok(mut signals) = StopSignals::new() else {
        return;
    };
    signals.recv().await;
    tracing::info!("signal received: shutting down (again to exit at once)");
    shutdown.cancel();
    signals.recv().await;
    std::process::exit(130);
}
