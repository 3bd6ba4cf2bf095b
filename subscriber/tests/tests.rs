//! Integration tests of the subscriber: the verify step on real testnet ledgers, and sessions over real QUIC on loopback against a tiny in-test relay.

mod support;

mod auth;
mod captive;
mod captive_http;
mod cli;
mod consume_delay;
mod content;
mod core_http;
mod hoard;
mod session;
mod sessions;
mod verify;
