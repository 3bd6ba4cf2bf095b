//! The subscriber side of Ledger Relay: an async Stream of verified Stellar ledgers received
//! from one or more relays over multi-lane QUIC with mutual TLS, and the `ledger-subscribe`
//! command built on it.
//!
//! What it does:
//! - [`connect`] opens a session on lane 0 and joins lanes 1..N, each a QUIC connection from
//!   its own UDP socket (its own flow through the network), and returns a [`Subscription`]:
//!   a `futures::Stream` of [`Ledger`]s, strictly in sequence order, each exactly once.
//! - Every ledger is reassembled from chunks arriving on any lane and checked, fail-closed:
//!   bounds, codecs and checksum ([`ledger_relay_wire::Reassembler`]), then its header against
//!   its end record and Stellar's hash chain ([`verify::Verifier`]), across reconnects and relay
//!   switches, and its transaction set and results against the header's `txSetHash` and
//!   `txSetResultHash`. A trusted [`Anchor`] (`SubscribeConfig::anchor`) makes the first
//!   ledger verified too. The first failure is a terminal [`SubscribeError`]; nothing after it
//!   is delivered.
//! - Transient failures (a lost lane or session, a silent relay, a relay shutting down) are
//!   retried with jittered exponential backoff, resuming from the last ledger *delivered* + 1,
//!   and failing over round-robin between relays. Authorization failures are terminal, typed
//!   errors; so is a start below retention, once every configured relay said so (one relay
//!   saying it makes the subscriber try the next).
//! - With `SubscribeConfig::hedge` ([`hedge`]), every relay is subscribed to at once and
//!   each ledger is taken from whichever relay first delivers a verified copy: a relay that
//!   dies or whose path degrades costs nothing, no failover timeout is waited out.
//! - The Stream is bounded: a consumer that ingests slowly stops the lanes being read, QUIC
//!   flow control stops the relay, and memory stays flat.
//! - Each lane's QUIC figures (bytes and packets received, round trip, congestion window,
//!   path MTU) are kept per relay and lane: [`Subscription::lane_stats`], [`LaneMonitor`].
//! - Lanes, TLS and frame IO come from `ledger-relay-transport`, which the relay shares.
//! - [`core_http::CoreClient`] carries HTTP requests meant for stellar-core (its query and
//!   command ports) to relays on a connection of its own, failing over along the same relay
//!   list: what the stand-in `ledger-captive-core` answers stellar-rpc's state and submission
//!   calls with.
//! - [`cli`] is `ledger-subscribe`: ledgers written in stellar-core's record-marked framing
//!   to stdout, a file or a FIFO, so any consumer of core's metadata pipe reads it unchanged.
//!
//! What it does not do: decode ledgers beyond their header (the consumer gets the raw
//! `LedgerCloseMeta` XDR), backfill from history archives when the start is below every
//! relay's retention, or persist its position (the consumer knows what it ingested and passes
//! it as the start).
//!
//! The protocol is specified in `docs/protocol.md`; `ledger-relay-wire` implements its sans-IO
//! parts.
//!
//! # An ingest loop
//!
//! ```no_run
//! use std::path::Path;
//!
//! use futures::StreamExt;
//! use ledger_relay_subscriber::frame::Start;
//! use ledger_relay_subscriber::{connect, Credentials, SubscribeConfig, SubscribeError};
//!
//! # fn ingest(_seq: u32, _xdr: &[u8]) -> anyhow::Result<()> { Ok(()) }
//! # fn last_ingested() -> Option<u32> { None }
//! #[tokio::main]
//! async fn main() -> anyhow::Result<()> {
//!     // DIR/ca.pem, DIR/rpc-1.pem, DIR/rpc-1.key, as `ledger-certs issue-client` writes them.
//!     let credentials = Credentials::from_cert_dir(Path::new("/etc/ledger-relay"), "rpc-1")?;
//!     // One relay per availability zone, in order of preference.
//!     let relays = vec!["relay-a.internal:7000".parse()?, "relay-b.internal:7000".parse()?];
//!     let mut config = SubscribeConfig::new(relays, credentials);
//!     config.lanes = 4;
//!     // Resume after what was ingested before a restart, or start at the relay's tip.
//!     config.start = match last_ingested() {
//!         Some(seq) => Start::Seq(seq + 1),
//!         None => Start::Tip,
//!     };
//!
//!     let mut ledgers = connect(config)?;
//!     while let Some(item) = ledgers.next().await {
//!         match item {
//!             // Verified, in order, exactly once, across reconnects and relay switches.
//!             Ok(ledger) => ingest(ledger.seq, &ledger.data)?,
//!             // Not retried: fix the certificate or the relay's allow list.
//!             Err(e @ SubscribeError::Unauthorized { .. }) => return Err(e.into()),
//!             // The relays no longer hold the start: backfill from a history archive first.
//!             Err(SubscribeError::BelowRetention { oldest, .. }) => {
//!                 anyhow::bail!("backfill up to ledger {oldest} first")
//!             }
//!             // A relay served data that does not verify: stop, and alert.
//!             Err(e) => return Err(e.into()),
//!         }
//!     }
//!     Ok(())
//! }
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod backoff;
mod client;
pub mod config;
pub mod core_http;
pub mod error;
pub mod first_look;
pub mod hedge;
pub mod lanestats;
mod ledger;
mod resume;
mod session;
mod subscription;
pub mod verify;

pub use client::{connect, connect_cut_through, PREFIX_QUEUE};
pub use config::{Anchor, Credentials, ParseError, RelayAddr, SubscribeConfig};
pub use error::{AuthReason, SubscribeError, Transient, VerifyError};
pub use first_look::FirstLook;
pub use lanestats::{LaneMonitor, LaneStats};
pub use ledger::{Item, Ledger, Status};
/// The frame types (for [`frame::Start`]), re-exported from `ledger-relay-wire`.
pub use ledger_relay_wire::frame;
pub use ledger_relay_wire::Limits;
pub use subscription::Subscription;
