//! Integration tests of the relay.

mod auth;
mod cli;
mod e2e;
mod hostile;
mod lanes;
mod ring;
mod source;
