//! The relay and SEP-54 data lakes (what Galexie writes and stellar-rpc reads): exporting every
//! ledger the relay receives ([`export`]), serving history below the ring from a lake
//! ([`backfill`], which sessions read through `session::backfill`), and the lakes' metrics
//! ([`LakeMetrics`]). Replaying a lake as a source is `source::datalake`.
//!
//! The lake itself (URLs, manifest, reading, writing, errors) is the `ledger-relay-lake` crate;
//! the object names and the batch codec are `ledger_relay_wire::lake`. This module only joins
//! them to the pipeline, the ring and the metrics.

pub mod backfill;
pub mod export;

pub use crate::metrics::lake::LakeMetrics;
