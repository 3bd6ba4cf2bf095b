//! Integration tests of `ledger-relay-certs`: the CLI end to end, the certificates' contents
//! against the index, and acceptance by rustls' own verifiers.

mod cli;
mod contents;
mod util;
mod verify;
