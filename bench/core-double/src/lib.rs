//! A test double of stellar-core, for Ledger Relay's tests and benches: it stands in for the
//! stellar-core *beside a relay*, never on an RPC box, and is no part of the product.
//!
//! It replays a record-marked `LedgerCloseMeta` file (the repository's `testdata/`): each
//! ledger it *closes* becomes its last closed ledger (LCL), and its entry changes update a
//! versioned state ([`state`]), so that what its query port answers depends on `ledgerSeq`.
//! Run as a relay's `pipe:` source ([`run`], the `ledger-core-double` binary) it writes each
//! ledger to fd 3 at a cadence as it closes it, as `stellar-core run --metadata-output-stream
//! fd:3` does; in a Rust test it is driven by calls ([`CoreDouble::close_next`]) and serves
//! its ports in-process ([`Servers`]).
//!
//! # What it answers
//!
//! Core's two HTTP ports, in core's formats (stellar-core `src/main/QueryServer.cpp`,
//! `src/main/CommandHandler.cpp`, `lib/http`, `lib/httpthreaded`):
//!
//! - query port: `POST /getledgerentry` (one element per key in request order, `live` /
//!   `archived` / `not-found`, `liveUntilLedgerSeq` from TTL entries, compact JSON with sorted
//!   keys and a trailing newline; errors as 404 `text/html`: `Ledger not found`,
//!   `Duplicate keys`, `TTL keys are not allowed`, a missing key, a bad `ledgerSeq`) and
//!   `POST /getledgerentryraw`. The snapshot window is `[LCL - QUERY_SNAPSHOT_LEDGERS, LCL]`
//!   ([`Settings::snapshot_ledgers`]); without `ledgerSeq`, the LCL.
//! - command port: `GET /tx?blob=` (`PENDING` for a new envelope, `DUPLICATE` for one accepted
//!   before, `ERROR` with a base64 `TransactionResult` of `txINSUFFICIENT_FEE` when the
//!   inclusion fee is under the LCL's base fee per operation, `{"exception": ...}` for a
//!   missing or undecodable blob) and `GET /info` (core's shape with the LCL, its protocol, the
//!   network passphrase and `"Synced!"`).
//! - modes for tests: a delay before every answer ([`CoreDouble::set_delay`], `--delay`: a
//!   slow core) and no listener at all ([`Servers::stop`]: a core that is down).
//!
//! # Where it is not core
//!
//! - It knows only entries the replayed ledgers touched; any other key is `not-found`. An entry
//!   first seen as a `STATE` change counts as held since before the first ledger.
//! - A Soroban entry whose TTL the ledgers never showed is `live` without
//!   `liveUntilLedgerSeq`.
//! - It applies no transaction: `/tx` only classifies the envelope. `feeCharged` of the
//!   `ERROR` result is the fee the envelope offers.
//! - Exception texts of undecodable XDR are `stellar-xdr`'s, not xdrpp's.
//! - `/info` leaves out `quorum`; its `age` counts from when the double closed the LCL; its
//!   `build` names the double.
//! - It answers in HTTP/1.1 (core: HTTP/1.0); status, `Content-Type` and body are core's, and
//!   the connection is closed after each answer as core does.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod answer;
pub mod command;
pub mod double;
pub mod error;
pub mod form;
pub mod http;
pub mod ledgers;
pub mod query;
pub mod run;
pub mod state;

pub use answer::Answer;
pub use double::{Closed, CoreDouble, Request, Settings};
pub use error::DoubleError;
pub use http::Servers;
pub use ledgers::Ledger;
