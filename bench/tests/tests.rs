//! Integration tests of `ledger-bench` (one binary, as ripgrep does).

mod cli;
mod presets;
mod remote;
mod runner;
mod soak;
mod units;
