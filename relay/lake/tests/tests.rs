//! The lake crate against real stores: a local directory and a real S3-protocol server on
//! loopback (`moto_server`, started by the tests). One binary, as ripgrep does.

mod errors;
mod roundtrip;
mod support;
