//! The lake's `.config.json` manifest.

use serde::{Deserialize, Serialize};

use super::names::{Schema, SchemaError};

/// Key of the manifest, relative to the lake's root.
pub const MANIFEST_KEY: &str = ".config.json";

/// The manifest `version` this code writes and reads (Galexie's `datastore.Version`).
pub const MANIFEST_VERSION: &str = "1.0";

/// The only compression SEP-54 defines.
pub const COMPRESSION_ZSTD: &str = "zstd";

/// Longest manifest accepted: real ones are about 150 bytes.
pub const MAX_MANIFEST_LEN: usize = 64 << 10;

/// The lake's `.config.json`, as Galexie writes it:
/// `{"networkPassphrase":"...","version":"1.0","compression":"zstd","ledgersPerBatch":1,"batchesPerPartition":64000}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// The network's passphrase, such as `Public Global Stellar Network ; September 2015`.
    #[serde(rename = "networkPassphrase", default)]
    pub network_passphrase: String,
    /// The manifest's version ([`MANIFEST_VERSION`]).
    #[serde(default)]
    pub version: String,
    /// The compression of the objects ([`COMPRESSION_ZSTD`]).
    #[serde(default)]
    pub compression: String,
    /// Ledgers per object.
    #[serde(rename = "ledgersPerBatch", default)]
    pub ledgers_per_batch: u32,
    /// Objects per partition.
    #[serde(rename = "batchesPerPartition", default)]
    pub batches_per_partition: u32,
}

/// Why a manifest was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ManifestError {
    /// Longer than [`MAX_MANIFEST_LEN`].
    #[error("manifest of {len} bytes exceeds {MAX_MANIFEST_LEN}")]
    TooLong {
        /// Its length.
        len: usize,
    },
    /// Not the JSON object SEP-54 describes.
    #[error("manifest is not valid json: {reason}")]
    Json {
        /// The parser's message.
        reason: String,
    },
    /// A compression other than zstd.
    #[error("unsupported compression {got:?}: only zstd is defined")]
    Compression {
        /// What the manifest says.
        got: String,
    },
    /// A version this code does not know.
    #[error("unsupported manifest version {got:?}: expected {MANIFEST_VERSION}")]
    Version {
        /// What the manifest says.
        got: String,
    },
    /// The layout is unusable.
    #[error("manifest layout: {0}")]
    Schema(#[from] SchemaError),
}

impl Manifest {
    /// The manifest a writer of `schema` on the network `network_passphrase` publishes.
    pub fn new(network_passphrase: &str, schema: &Schema) -> Manifest {
        Manifest {
            network_passphrase: network_passphrase.to_owned(),
            version: MANIFEST_VERSION.to_owned(),
            compression: COMPRESSION_ZSTD.to_owned(),
            ledgers_per_batch: schema.ledgers_per_batch(),
            batches_per_partition: schema.batches_per_partition(),
        }
    }

    /// The JSON bytes, in Galexie's field order.
    pub fn to_json(&self) -> Vec<u8> {
        // Serializing a struct of strings and integers cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Parses and checks a manifest read from a lake. Unknown fields are ignored and missing
    /// ones read as empty, as Go's decoder does; an empty version or compression is accepted
    /// (older lakes), but the layout must be complete.
    pub fn parse(bytes: &[u8]) -> Result<Manifest, ManifestError> {
        if bytes.len() > MAX_MANIFEST_LEN {
            return Err(ManifestError::TooLong { len: bytes.len() });
        }
        let json = |e: serde_json::Error| ManifestError::Json {
            reason: e.to_string(),
        };
        let value: serde_json::Value = serde_json::from_slice(bytes).map_err(json)?;
        // serde would also take a struct from a JSON array; Go and SEP-54 want an object.
        if !value.is_object() {
            return Err(ManifestError::Json {
                reason: "expected a json object".into(),
            });
        }
        let m: Manifest = serde_json::from_value(value).map_err(json)?;
        if !m.compression.is_empty() && m.compression != COMPRESSION_ZSTD {
            return Err(ManifestError::Compression {
                got: m.compression.clone(),
            });
        }
        if !m.version.is_empty() && m.version != MANIFEST_VERSION {
            return Err(ManifestError::Version {
                got: m.version.clone(),
            });
        }
        m.schema()?;
        Ok(m)
    }

    /// The layout the manifest describes.
    pub fn schema(&self) -> Result<Schema, SchemaError> {
        Schema::new(self.ledgers_per_batch, self.batches_per_partition)
    }
}
