//! `ledger-bench`: see the library crate.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = match ledger_relay_bench::Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    match ledger_relay_bench::main_with(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
