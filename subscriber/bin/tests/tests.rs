//! Tests of the `ledger-subscribe` and `ledger-captive-core` binaries and their command-line
//! code, against a tiny in-test relay on loopback; they share the subscriber library's test
//! support.

/// A file of the repository's `testdata/`, from this crate's directory (`subscriber/bin`).
macro_rules! testdata {
    ($file:literal) => {
        concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/", $file)
    };
}

#[allow(dead_code)] // shared with the library's tests, which use more of it
#[path = "../../tests/support/mod.rs"]
mod support;

mod captive;
mod captive_http;
mod cli;
mod consume_delay;
mod content;
mod hoard;
mod sessions;
