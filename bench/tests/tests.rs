//! Integration tests of `ledger-bench` (one binary, as ripgrep does).

mod cli;
mod emulation;
mod fanout;
mod reliability;
mod remote;
mod rows;
mod tiers;
