//! `ledger-relay`: runs the relay (`run`) or a self-contained demonstration (`demo`).
//!
//! The relay itself is the `ledger-relay` library; this binary only parses arguments and calls
//! it. It lives in a package of its own because the demo runs a subscriber in the same process,
//! and the relay library does not depend on the subscriber library.

mod demo;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use demo::DemoArgs;
use ledger_relay::config::{RelayConfig, RunArgs};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Parser)]
#[command(
    name = "ledger-relay",
    version,
    about = "Relays stellar-core's ledgers to subscribers over multi-lane QUIC"
)]
struct Cli {
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
    // The demo prints its own table; its logs show only problems unless RUST_LOG asks.
    let default_filter = match cli.command {
        Command::Demo(_) => "warn",
        Command::Run(_) => "info",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter)),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: starting the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let shutdown = CancellationToken::new();
    runtime.spawn(shutdown_on_signal(shutdown.clone()));
    let result = runtime.block_on(async {
        match cli.command {
            Command::Run(args) => {
                let config = RelayConfig::from_args(*args)?;
                let relay = ledger_relay::Relay::start(config, shutdown).await?;
                relay.wait().await;
                Ok(())
            }
            Command::Demo(args) => demo::run(args, shutdown).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// SIGINT or SIGTERM: graceful shutdown (stop accepting, finish the ledger in flight, flush the
/// ring). A second signal exits at once.
async fn shutdown_on_signal(shutdown: CancellationToken) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        return;
    };
    tokio::select! {
        _ = int.recv() => {}
        _ = term.recv() => {}
    }
    tracing::info!("signal received: shutting down (again to exit at once)");
    shutdown.cancel();
    tokio::select! {
        _ = int.recv() => {}
        _ = term.recv() => {}
    }
    std::process::exit(130);
}
