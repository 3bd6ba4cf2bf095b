//! Integration tests of the relay.

mod auth;
mod e2e;
mod ring;
mod source;
