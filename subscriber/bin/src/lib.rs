//! The subscriber's two commands, on top of the `ledger-relay-subscriber` library:
//!
//! - [`cli`]: `ledger-subscribe`, which subscribes to relays and writes every verified ledger in
//!   stellar-core's own framing (for ingest that reads core's metadata pipe), with progress,
//!   lane figures and the machine-readable lines scripts and the Go client read.
//! - [`captive`]: `ledger-captive-core`, a stand-in for the stellar-core binary under the Go
//!   SDK's `CaptiveStellarCore`: core's commands, its metadata pipe, and its HTTP ports answered
//!   through the relays.
//!
//! The library (`ledger_relay_subscriber`) is what a Rust program links; this crate holds what
//! only these commands need (argument parsing, configuration files, HTTP servers).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod captive;
pub mod cli;
