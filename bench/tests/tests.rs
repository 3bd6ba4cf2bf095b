//! Integration tests of `ledger-bench` (one binary, as ripgrep does).

mod emulation;
mod reliability;
mod remote;
