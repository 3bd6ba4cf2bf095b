//! Integration tests of the relay.

mod auth;
mod cli;
mod e2e;
mod ring;
mod source;
