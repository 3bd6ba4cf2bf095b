//! Integration tests of the relay. Tests of the `ledger-relay` binary itself (its CLI, the relay
//! as a process of its own) are in `relay/bin/tests`.

/// A file of the repository's `testdata/`, from this crate's directory.
macro_rules! testdata {
    ($file:literal) => {
        concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/", $file)
    };
}

mod admission;
mod auth;
mod core_http;
mod core_stand_in;
mod dashboard;
mod e2e;
mod faults;
mod hostile;
mod idle;
mod lane_metrics;
mod lanes;
mod modes;
mod reload;
mod resume;
mod ring;
mod source;
mod support;
