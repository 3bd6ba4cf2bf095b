//! What Ledger Relay's command-line tools (`ledger-relay`, `ledger-subscribe`,
//! `ledger-certs`) share, so each binary stays thin and they behave alike:
//!
//! - [`logging`]: the log format of the long-running commands, human (tracing's default, with
//!   every field escaped so that text a peer chose never ends a line) or one JSON object per
//!   line (`--log-format json`) for a journal or a log shipper, and how a fatal error is
//!   written in either;
//! - [`assets`]: man pages and shell completions generated from each tool's clap definitions,
//!   for packagers, and the `completions` and `man` subcommands that write them;
//! - [`cputime`]: CPU time of the process and of its threads by group, for the CPU lines of
//!   `ledger-relay demo` and `ledger-bench cpu`;
//! - [`signals`]: SIGINT and SIGTERM, the signals that stop a long-running command.
//!
//! It holds no product logic and parses no arguments of its own.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod assets;
pub mod cputime;
pub mod logging;
pub mod signals;

pub use assets::{print_man_pages, write_completions, write_man_pages, AssetCommand, Shell};
pub use logging::LogFormat;
pub use signals::StopSignals;
