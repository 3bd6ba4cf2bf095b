//! `ledger-subscribe`: writes a relay's verified ledgers in stellar-core's metadata framing.
//! Thin: parses arguments, then calls [`ledger_relay_subscriber_bin::cli::run`].

use std::process::ExitCode;

use anyhow::Context as _;
use clap::{CommandFactory as _, Parser as _};
use ledger_relay_cli::{logging, LogFormat};
use ledger_relay_subscriber_bin::cli::{self, Args, RunError, DEFAULT_LOG_FILTER};

fn main() -> ExitCode {
    // clap prints usage errors and exits 2 itself (0 for --help and --version).
    let args = Args::parse();
    let format = args.log_format;
    if let Some(shell) = args.completions {
        ledger_relay_cli::write_completions(Args::command(), shell, &mut std::io::stdout());
        return ExitCode::SUCCESS;
    }
    if let Some(dir) = &args.man {
        return match ledger_relay_cli::print_man_pages(Args::command(), dir) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(
                format,
                &anyhow::Error::new(e).context(format!("writing {}", dir.display())),
                2,
            ),
        };
    }
    logging::init(format, DEFAULT_LOG_FILTER);
    let config = match args.into_config() {
        Ok(config) => config,
        Err(e) => return fail(format, &anyhow::Error::new(e).context("bad arguments"), 2),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
    {
        Ok(rt) => rt,
        Err(e) => return fail(format, &e, 2),
    };
    match runtime.block_on(cli::run(config, cli::shutdown_signal())) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            let below = match &e {
                RunError::Subscribe(s) => Some(s),
                _ => None,
            };
            cli::report_failure(format, "ledger-subscribe", &e, below);
            ExitCode::from(e.exit_code())
        }
    }
}

/// One line on stderr, the error and its causes (a JSON object with `--log-format json`).
fn fail(format: LogFormat, e: &anyhow::Error, code: u8) -> ExitCode {
    logging::fatal(
        format,
        "ledger-subscribe",
        &format!("ledger-subscribe: {e:#}"),
    );
    ExitCode::from(code)
}
