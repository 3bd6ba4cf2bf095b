//! `ledger-subscribe`: writes a relay's verified ledgers in stellar-core's metadata framing.
//! Thin: parses arguments, then calls [`ledger_relay_subscriber::cli::run`].

use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser as _;
use ledger_relay_subscriber::cli::{self, Args, RunError};

fn main() -> ExitCode {
    // clap prints usage errors and exits 2 itself (0 for --help and --version).
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let config = match args.into_config() {
        Ok(config) => config,
        Err(e) => return fail(&anyhow::Error::new(e).context("bad arguments"), 2),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
    {
        Ok(rt) => rt,
        Err(e) => return fail(&e, 2),
    };
    match runtime.block_on(cli::run(config, shutdown_signal())) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            let code = e.exit_code();
            fail(&anyhow::Error::new::<RunError>(e), code)
        }
    }
}

/// One line on stderr, the error and its causes.
fn fail(e: &anyhow::Error, code: u8) -> ExitCode {
    eprintln!("ledger-subscribe: {e:#}");
    ExitCode::from(code)
}

/// Completes on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
