//! SEP-54 data lakes for Ledger Relay: the history Galexie writes to object storage, which
//! stellar-rpc and the ingest SDK read.
//!
//! What it does:
//! - [`LakeUrl`]: `file:///PATH`, `s3://BUCKET/PREFIX`, `gs://BUCKET/PREFIX`,
//!   `az://CONTAINER/PREFIX`, opened through `object_store` with credentials and endpoints from
//!   the environment.
//! - [`Lake`]: one lake: its `.config.json` manifest (checked against the network; published
//!   once, put-if-absent, by a writer), reading and checking the batch that holds a ledger,
//!   finding the range it holds, and putting a batch exactly once.
//! - [`LakeCursor`]: ledgers in order with bounded, parallel prefetch and the hash chain
//!   checked across batches; "the lake lacks it" ([`LakeError::Lacks`]) is told apart from a
//!   gap in the lake ([`LakeError::Missing`]).
//! - [`BatchAssembler`] and [`Backoff`]: the rules for writing a stream of ledgers as
//!   Galexie does (whole batches, in order, resuming after the newest held).
//! - [`LakeError`]: one typed error per failure, with the object key and the reason, and
//!   [`LakeStats`] counting them by kind.
//!
//! - `testing` (feature `testing`): a real S3-protocol server (`moto_server`) on loopback for tests
//!   and benches.
//!
//! What it does not do: decode bytes itself (object names, the batch codec and the manifest
//! are pure functions in `ledger_relay_wire::lake`, where they are bounded and fuzzed), know
//! about the relay's pipeline, ring or sessions, or run threads of its own: callers drive it on
//! a tokio runtime.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod cursor;
pub mod error;
pub mod export;
pub mod store;
#[cfg(feature = "testing")]
pub mod testing;
pub mod url;

pub use cursor::{LakeCursor, PrefetchOptions};
pub use error::{ErrorKind, LakeError, LakeStats};
pub use export::{Backoff, BatchAssembler, Offer};
pub use ledger_relay_wire::lake::{Batch, BatchLedger, BatchLimits, Manifest, Schema};
pub use store::{Lake, LakeOptions, Layout, PutOutcome};
pub use url::{ClientSettings, LakeUrl};

/// Passphrase of Stellar's public network.
pub const PUBNET_PASSPHRASE: &str = "Public Global Stellar Network ; September 2015";
/// Passphrase of Stellar's test network.
pub const TESTNET_PASSPHRASE: &str = "Test SDF Network ; September 2015";
/// Passphrase of Stellar's future network.
pub const FUTURENET_PASSPHRASE: &str = "Test SDF Future Network ; October 2022";

/// The passphrase of a well-known network name (`pubnet`, `public`, `testnet`, `futurenet`).
pub fn passphrase_of(network: &str) -> Option<&'static str> {
    match network.to_ascii_lowercase().as_str() {
        "pubnet" | "public" | "mainnet" => Some(PUBNET_PASSPHRASE),
        "testnet" => Some(TESTNET_PASSPHRASE),
        "futurenet" => Some(FUTURENET_PASSPHRASE),
        _ => None,
    }
}
