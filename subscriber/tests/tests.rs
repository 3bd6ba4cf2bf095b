//! Integration tests of the subscriber library: the verify step on real testnet ledgers, and
//! sessions over real QUIC on loopback against a tiny in-test relay.

/// A file of the repository's `testdata/`, from this crate's directory (`subscriber`).
macro_rules! testdata {
    ($file:literal) => {
        concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/", $file)
    };
}

#[allow(dead_code)] // shared with the commands' tests, which use more of it
mod support;

mod auth;
mod core_http;
mod session;
mod verify;
