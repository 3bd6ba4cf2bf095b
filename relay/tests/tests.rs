//! Integration tests of the relay.

mod auth;
mod cli;
mod e2e;
mod faults;
mod hostile;
mod lake;
mod lanes;
mod modes;
mod resume;
mod ring;
mod source;
mod support;
