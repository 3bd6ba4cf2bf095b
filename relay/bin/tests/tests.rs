//! Tests of the `ledger-relay` binary: its command-line contract, and the relay run as a
//! process of its own (SIGKILL and restart, a slow consumer measured apart, the crash rounds),
//! and the Go client's suite against it.
//! They share the relay's test support module.

/// A file of the repository's `testdata/`, from this crate's directory (`relay/bin`).
macro_rules! testdata {
    ($file:literal) => {
        concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/", $file)
    };
}

mod architecture;
mod backfill;
mod cli;
mod core_ports;
#[allow(dead_code)] // shared with the relay's tests, which use more of it
#[path = "../../tests/core_stand_in.rs"]
mod core_stand_in;

/// The subscriber's fake relay: real QUIC on loopback, and knobs to misbehave (an upstream
/// that lies, for a tier).
#[allow(dead_code)] // shared with the subscriber's tests, which use more of it
#[path = "../../../subscriber/tests/support/fake_relay.rs"]
mod fake_relay;
mod flood;
mod go_client;
mod handshakes;
mod health;
mod lake;
mod process;
#[allow(dead_code)] // shared with the relay's tests, which use more of it
#[path = "../../tests/support.rs"]
mod support;
mod tiers;
