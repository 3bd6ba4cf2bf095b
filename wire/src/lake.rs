//! SEP-54 data lakes, as pure functions: object names, the `LedgerCloseMetaBatch` codec and the
//! `.config.json` manifest.
//!
//! A SEP-54 lake (what Galexie writes and stellar-rpc and the ingest SDK read) is a key-value
//! store of zstd-compressed `LedgerCloseMetaBatch` objects:
//!
//! ```text
//! <root>/.config.json                                        the manifest (written once)
//! <root>/<partition>/<batch>.xdr.zst                         every batch
//!   partition = %08X--%d-%d   (0xFFFFFFFF - first, first, last of the partition)
//!   batch     = %08X--%d      (one ledger per batch)    or  %08X--%d-%d  (several)
//! ```
//!
//! The partition directory is left out when a partition holds one batch. Inverting the first
//! sequence in the hex prefix makes a lexicographic listing return the newest batch first.
//!
//! An object is one zstd frame of XDR
//! `LedgerCloseMetaBatch { uint32 startSequence; uint32 endSequence; LedgerCloseMeta ledgerCloseMetas<>; }`:
//! a 12-byte header (`start`, `end`, the array's count) followed by the ledgers' XDR back to
//! back, with no length between them (an XDR array of a union). So writing a batch is a
//! concatenation of ledgers exactly as stellar-core emits them, and reading one must decode
//! each `LedgerCloseMeta` to find where the next begins.
//!
//! What this module does not do: talk to a store (the `ledger-relay-lake` crate does, through
//! `object_store`), or decide what to write or when.
//!
//! Bytes read from a lake are hostile: [`read_object`] bounds the object, its decompressed size
//! and every ledger by [`BatchLimits`] before allocating, decodes each ledger with
//! `stellar-xdr` under a byte and depth budget (so a claimed length can never allocate more than
//! the bytes that are there), checks each ledger's header hash ([`crate::header`]), its
//! transaction set and results against the hashes its header commits to ([`crate::content`]:
//! a lake is not trusted to hold what the network closed), that the sequences run
//! `start..=end` and that the ledgers chain, and returns the ledgers as slices of the
//! decompressed buffer, byte-identical to what the writer stored.

use std::io::Read;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::content::{check_content, ContentError};
use crate::header::{peek_header, ChainVerifier, HeaderError, LedgerHeaderInfo};

/// Key of the manifest, relative to the lake's root.
pub const MANIFEST_KEY: &str = ".config.json";

/// The manifest `version` this code writes and reads (Galexie's `datastore.Version`).
pub const MANIFEST_VERSION: &str = "1.0";

/// The only compression SEP-54 defines.
pub const COMPRESSION_ZSTD: &str = "zstd";

/// Longest manifest accepted: real ones are about 150 bytes.
pub const MAX_MANIFEST_LEN: usize = 64 << 10;

/// Recursion budget of the XDR decoder, counted per nested `read_xdr` call (an `SCVal` vector
/// inside another costs four). 1000 leaves room for the deepest `SCVal` Soroban accepts (100
/// levels) inside a ledger's meta, and fits a 2 MiB thread stack with room to spare (tested);
/// deeper input is refused, never a stack overflow.
pub const XDR_DEPTH: u32 = 1000;

/// The file extension after `.xdr.` in an object's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Extension {
    /// `zst`, as SEP-54 and Galexie 23+ write.
    Zst,
    /// `zstd`, as Galexie wrote before version 23; read, never written.
    Zstd,
}

impl Extension {
    /// The extension as it appears in a name.
    pub fn as_str(self) -> &'static str {
        match self {
            Extension::Zst => "zst",
            Extension::Zstd => "zstd",
        }
    }
}

/// Why a lake layout was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SchemaError {
    /// `ledgersPerBatch` is 0.
    #[error("ledgers per batch must be at least 1")]
    ZeroLedgersPerBatch,
    /// `batchesPerPartition` is 0.
    #[error("batches per partition must be at least 1")]
    ZeroBatchesPerPartition,
    /// A partition would hold more than 2^32 - 1 ledgers.
    #[error(
        "a partition of {batches_per_partition} batches of {ledgers_per_batch} ledgers exceeds \
         the 32-bit ledger sequence"
    )]
    PartitionTooLarge {
        /// Ledgers per batch.
        ledgers_per_batch: u32,
        /// Batches per partition.
        batches_per_partition: u32,
    },
}

/// How a lake groups ledgers into objects and objects into partitions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Schema {
    ledgers_per_batch: u32,
    batches_per_partition: u32,
    extension: Extension,
}

impl Schema {
    /// A layout of `ledgers_per_batch` ledgers per object and `batches_per_partition` objects
    /// per partition (Galexie's defaults: 1 and 64000), writing `.xdr.zst`.
    pub fn new(ledgers_per_batch: u32, batches_per_partition: u32) -> Result<Schema, SchemaError> {
        if ledgers_per_batch == 0 {
            return Err(SchemaError::ZeroLedgersPerBatch);
        }
        if batches_per_partition == 0 {
            return Err(SchemaError::ZeroBatchesPerPartition);
        }
        if ledgers_per_batch
            .checked_mul(batches_per_partition)
            .is_none()
        {
            return Err(SchemaError::PartitionTooLarge {
                ledgers_per_batch,
                batches_per_partition,
            });
        }
        Ok(Schema {
            ledgers_per_batch,
            batches_per_partition,
            extension: Extension::Zst,
        })
    }

    /// The same layout with objects named `.xdr.EXT`.
    pub fn with_extension(self, extension: Extension) -> Schema {
        Schema { extension, ..self }
    }

    /// Ledgers per object.
    pub fn ledgers_per_batch(&self) -> u32 {
        self.ledgers_per_batch
    }

    /// Objects per partition.
    pub fn batches_per_partition(&self) -> u32 {
        self.batches_per_partition
    }

    /// The extension of object names.
    pub fn extension(&self) -> Extension {
        self.extension
    }

    /// First and last sequence of the batch that holds `seq`.
    ///
    /// The last is clamped to `u32::MAX` for the final batch of the sequence space, which the
    /// Go implementation would wrap; no real network comes near it.
    pub fn batch_range(&self, seq: u32) -> (u32, u32) {
        span(seq, self.ledgers_per_batch)
    }

    /// First and last sequence of the partition that holds `seq`.
    pub fn partition_range(&self, seq: u32) -> (u32, u32) {
        // Checked in `new`.
        span(seq, self.ledgers_per_batch * self.batches_per_partition)
    }

    /// The partition directory of `seq` (`FFF159FF--960000-1023999`), or `None` when the
    /// layout has one batch per partition and so no directories.
    pub fn partition_dir(&self, seq: u32) -> Option<String> {
        if self.batches_per_partition <= 1 {
            return None;
        }
        let (first, last) = self.partition_range(seq);
        Some(format!("{:08X}--{first}-{last}", u32::MAX - first))
    }

    /// The object name of the batch holding `seq`, without its directory:
    /// `FFF0BDBF--1000000.xdr.zst` or `FFFFFF05--250-299.xdr.zst`.
    pub fn batch_name(&self, seq: u32) -> String {
        let (first, last) = self.batch_range(seq);
        batch_name(first, last, self.extension)
    }

    /// The key of the object holding `seq`, relative to the lake's root:
    /// `FFF159FF--960000-1023999/FFF0BDBF--1000000.xdr.zst`.
    pub fn object_key(&self, seq: u32) -> String {
        match self.partition_dir(seq) {
            Some(dir) => format!("{dir}/{}", self.batch_name(seq)),
            None => self.batch_name(seq),
        }
    }
}

fn span(seq: u32, size: u32) -> (u32, u32) {
    let first = seq / size * size;
    let last = (u64::from(first) + u64::from(size) - 1).min(u64::from(u32::MAX));
    // `last <= u32::MAX` after the clamp.
    (first, last as u32)
}

/// The name of a batch of `first..=last` (one ledger: `%08X--%d`; more: `%08X--%d-%d`).
pub fn batch_name(first: u32, last: u32, extension: Extension) -> String {
    let mut name = format!("{:08X}--{first}", u32::MAX - first);
    if last != first {
        name.push_str(&format!("-{last}"));
    }
    name.push_str(".xdr.");
    name.push_str(extension.as_str());
    name
}

/// What an object's name says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectName {
    /// First ledger of the batch's range.
    pub first: u32,
    /// Last ledger of the batch's range (`first` for a one-ledger name).
    pub last: u32,
    /// The extension.
    pub extension: Extension,
}

/// Parses a batch name (the last path segment of a key), strictly: eight uppercase hex
/// digits that are `0xFFFFFFFF - first`, `--`, decimal numbers without leading zeros, and
/// `.xdr.zst` or `.xdr.zstd`. Anything else (the manifest, stray files, a name whose hex and
/// decimal disagree) is `None`. [`batch_name`] of the result gives the input back.
pub fn parse_batch_name(name: &str) -> Option<ObjectName> {
    let (stem, extension) = if let Some(stem) = name.strip_suffix(".xdr.zst") {
        (stem, Extension::Zst)
    } else if let Some(stem) = name.strip_suffix(".xdr.zstd") {
        (stem, Extension::Zstd)
    } else {
        return None;
    };
    let (first, last) = parse_range_name(stem, true)?;
    Some(ObjectName {
        first,
        last,
        extension,
    })
}

/// Parses a partition directory name (`FFF159FF--960000-1023999`) into its first and last
/// sequence, with the same strictness as [`parse_batch_name`].
pub fn parse_partition_name(name: &str) -> Option<(u32, u32)> {
    parse_range_name(name, false)
}

fn parse_range_name(stem: &str, single_allowed: bool) -> Option<(u32, u32)> {
    let (hex, range) = stem.split_once("--")?;
    if hex.len() != 8
        || !hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'A'..=b'F').contains(&b))
    {
        return None;
    }
    let inverted = u32::from_str_radix(hex, 16).ok()?;
    let (first, last) = match range.split_once('-') {
        Some((a, b)) => {
            let (first, last) = (decimal(a)?, decimal(b)?);
            // A batch of one ledger is written `N`, never `N-N`; a partition always as a
            // range, which the clamp at u32::MAX can make `N-N`.
            if last < first || (single_allowed && last == first) {
                return None;
            }
            (first, last)
        }
        None if single_allowed => {
            let first = decimal(range)?;
            (first, first)
        }
        None => return None,
    };
    (u32::MAX - first == inverted).then_some((first, last))
}

fn decimal(s: &str) -> Option<u32> {
    if s.is_empty() || s.len() > 10 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if s.len() > 1 && s.starts_with('0') {
        return None;
    }
    s.parse().ok()
}

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
            ledgers_per_batch: schema.ledgers_per_batch,
            batches_per_partition: schema.batches_per_partition,
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

/// Bounds on what [`read_object`] accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchLimits {
    /// Largest object (compressed) accepted.
    pub max_object: u64,
    /// Largest decompressed batch accepted.
    pub max_raw: u64,
    /// Largest single ledger accepted.
    pub max_ledger: u64,
    /// Most ledgers in one batch.
    pub max_ledgers: u32,
}

impl Default for BatchLimits {
    fn default() -> Self {
        BatchLimits {
            // A 256 MiB ledger (the longest record the relay accepts) that does not compress.
            max_object: 256 << 20,
            max_raw: 256 << 20,
            max_ledger: 256 << 20,
            // Galexie's largest common setting is 64 ledgers per file; a day of pubnet is
            // about 17,000 ledgers.
            max_ledgers: 1 << 16,
        }
    }
}

/// Why an object was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BatchError {
    /// The object is larger than [`BatchLimits::max_object`].
    #[error("object of {len} bytes exceeds the limit of {max}")]
    ObjectTooLarge {
        /// Its length.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// Decompressed, the object exceeds [`BatchLimits::max_raw`].
    #[error("object decompresses to more than {max} bytes")]
    RawTooLarge {
        /// The limit.
        max: u64,
    },
    /// The object ends before its zstd frame or its XDR does.
    #[error("truncated: {reason}")]
    Truncated {
        /// Where it ended.
        reason: String,
    },
    /// The object is not valid zstd.
    #[error("not a valid zstd frame: {reason}")]
    Zstd {
        /// The decoder's message.
        reason: String,
    },
    /// `endSequence` is below `startSequence`.
    #[error("batch range {start}-{end} is reversed")]
    BadRange {
        /// `startSequence`.
        start: u32,
        /// `endSequence`.
        end: u32,
    },
    /// The array does not hold one ledger per sequence of the range (a partial batch).
    #[error("batch {start}-{end} holds {count} ledgers, expected {expected}")]
    CountMismatch {
        /// `startSequence`.
        start: u32,
        /// `endSequence`.
        end: u32,
        /// The array's count.
        count: u32,
        /// `end - start + 1`.
        expected: u64,
    },
    /// More ledgers than [`BatchLimits::max_ledgers`].
    #[error("batch holds {count} ledgers, more than {max}")]
    TooManyLedgers {
        /// The array's count.
        count: u32,
        /// The limit.
        max: u32,
    },
    /// A ledger is not a valid `LedgerCloseMeta`.
    #[error("ledger {index} of the batch is not a valid LedgerCloseMeta: {reason}")]
    Xdr {
        /// Its index in the batch.
        index: u32,
        /// The decoder's message.
        reason: String,
    },
    /// A ledger is longer than [`BatchLimits::max_ledger`].
    #[error("ledger {index} of the batch is longer than {max} bytes")]
    LedgerTooLarge {
        /// Its index in the batch.
        index: u32,
        /// The limit.
        max: u64,
    },
    /// A ledger's header does not check out (its hash is not the sha256 of its header).
    #[error("ledger {index} of the batch: {error}")]
    Header {
        /// Its index in the batch.
        index: u32,
        /// What is wrong.
        error: HeaderError,
    },
    /// A ledger's transaction set or results do not hash to what its header commits to (a
    /// changed, added, removed or reordered transaction or result), or its body cannot be
    /// walked to compute them.
    #[error("ledger {seq} (ledger {index} of the batch): {error}")]
    Content {
        /// Its index in the batch.
        index: u32,
        /// Its sequence.
        seq: u32,
        /// What is wrong.
        error: ContentError,
    },
    /// A ledger is not the one its position says.
    #[error("ledger {index} of the batch is sequence {got}, expected {expected}")]
    Sequence {
        /// Its index in the batch.
        index: u32,
        /// `start + index`.
        expected: u32,
        /// Its header's `ledgerSeq`.
        got: u32,
    },
    /// A ledger's `previousLedgerHash` is not the hash of the ledger before it in the batch.
    #[error("ledger {seq} does not link to ledger {prev} in the same batch")]
    BrokenChain {
        /// The ledger.
        seq: u32,
        /// The one before it.
        prev: u32,
    },
    /// Bytes follow the last ledger.
    #[error("{len} bytes follow the last ledger of the batch")]
    TrailingBytes {
        /// How many.
        len: usize,
    },
    /// The batch is not the one its key names.
    #[error("batch {start}-{end} does not belong at a key for {key_first}-{key_last}")]
    WrongKey {
        /// `startSequence`.
        start: u32,
        /// `endSequence`.
        end: u32,
        /// First sequence the key names.
        key_first: u32,
        /// Last sequence the key names.
        key_last: u32,
    },
}

impl BatchError {
    /// Whether the object looks cut short (an interrupted upload or a partial copy) rather
    /// than damaged or foreign.
    pub fn is_truncated(&self) -> bool {
        matches!(self, BatchError::Truncated { .. })
    }
}

/// One ledger of a decoded batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchLedger {
    /// Its header, checked.
    pub info: LedgerHeaderInfo,
    /// Its `LedgerCloseMeta` XDR, exactly as stored (a slice of the decompressed batch).
    pub raw: Bytes,
}

/// A decoded and checked `LedgerCloseMetaBatch`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// `startSequence`.
    pub start: u32,
    /// `endSequence`.
    pub end: u32,
    /// The ledgers, `start..=end` in order.
    pub ledgers: Vec<BatchLedger>,
}

/// The XDR of a `LedgerCloseMetaBatch` of `ledgers` (each a `LedgerCloseMeta`'s XDR, as core
/// emits it), claimed to run `start..=end`.
pub fn encode_batch<L: AsRef<[u8]>>(start: u32, end: u32, ledgers: &[L]) -> Vec<u8> {
    let len: usize = ledgers.iter().map(|l| l.as_ref().len()).sum();
    let mut out = Vec::with_capacity(12 + len);
    out.extend_from_slice(&start.to_be_bytes());
    out.extend_from_slice(&end.to_be_bytes());
    // A batch is built from ledgers the relay holds in memory: far fewer than 2^32.
    out.extend_from_slice(&(ledgers.len() as u32).to_be_bytes());
    for l in ledgers {
        out.extend_from_slice(l.as_ref());
    }
    out
}

/// Compresses a batch's XDR into an object: one zstd frame at `level`, with the content size
/// and a checksum in the frame (so a reader detects truncation and corruption).
pub fn compress_object(xdr: &[u8], level: i32) -> std::io::Result<Vec<u8>> {
    let mut enc = zstd::stream::write::Encoder::new(Vec::with_capacity(xdr.len() / 4), level)?;
    enc.include_checksum(true)?;
    enc.set_pledged_src_size(Some(xdr.len() as u64))?;
    std::io::Write::write_all(&mut enc, xdr)?;
    enc.finish()
}

/// Decompresses an object, refusing more than `limits.max_raw` bytes of output. Several
/// concatenated frames are accepted (RFC 8878 allows them; some writers split large batches).
pub fn decompress_object(object: &[u8], limits: &BatchLimits) -> Result<Vec<u8>, BatchError> {
    if object.len() as u64 > limits.max_object {
        return Err(BatchError::ObjectTooLarge {
            len: object.len() as u64,
            max: limits.max_object,
        });
    }
    // The frame's declared size, if any, only sizes the first allocation, and only up to the
    // limit: a lie costs nothing.
    let hint = zstd::zstd_safe::get_frame_content_size(object)
        .ok()
        .flatten()
        .unwrap_or(0)
        .min(limits.max_raw) as usize;
    let mut out = Vec::with_capacity(hint);
    let dec = zstd::stream::read::Decoder::with_buffer(object).map_err(|e| BatchError::Zstd {
        reason: e.to_string(),
    })?;
    match dec.take(limits.max_raw + 1).read_to_end(&mut out) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            return Err(BatchError::Truncated {
                reason: format!("zstd frame ends early: {e}"),
            })
        }
        Err(e) => {
            let reason = e.to_string();
            // zstd reports a frame cut short as "incomplete frame" / "premature end".
            if reason.contains("ncomplete") || reason.contains("premature") {
                return Err(BatchError::Truncated {
                    reason: format!("zstd frame ends early: {reason}"),
                });
            }
            return Err(BatchError::Zstd { reason });
        }
    }
    if out.len() as u64 > limits.max_raw {
        return Err(BatchError::RawTooLarge {
            max: limits.max_raw,
        });
    }
    if out.is_empty() && !object.is_empty() {
        // A frame header and nothing else: an upload cut short right after it began.
        return Err(BatchError::Truncated {
            reason: "the object decompresses to nothing".into(),
        });
    }
    Ok(out)
}

/// The `startSequence`, `endSequence` and count of an object, from the first 12 bytes of its
/// decompressed batch (decompressing only those): enough to learn where a lake starts without
/// holding the whole batch.
pub fn peek_object_range(object: &[u8]) -> Result<(u32, u32, u32), BatchError> {
    let mut head = [0u8; 12];
    let mut dec =
        zstd::stream::read::Decoder::with_buffer(object).map_err(|e| BatchError::Zstd {
            reason: e.to_string(),
        })?;
    dec.read_exact(&mut head).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            BatchError::Truncated {
                reason: "the object ends before its batch header".into(),
            }
        } else {
            BatchError::Zstd {
                reason: e.to_string(),
            }
        }
    })?;
    let word = |i: usize| u32::from_be_bytes([head[i], head[i + 1], head[i + 2], head[i + 3]]);
    Ok((word(0), word(4), word(8)))
}

/// Decodes and checks a batch's XDR (see the [module docs](self)). The ledgers are slices of
/// `xdr`.
pub fn decode_batch(xdr: Bytes, limits: &BatchLimits) -> Result<Batch, BatchError> {
    use stellar_xdr::{LedgerCloseMeta, Limited, Limits, ReadXdr};

    let word = |at: usize| -> Result<u32, BatchError> {
        xdr.get(at..at + 4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
            .ok_or_else(|| BatchError::Truncated {
                reason: format!("{} bytes: shorter than the batch header", xdr.len()),
            })
    };
    let (start, end, count) = (word(0)?, word(4)?, word(8)?);
    if end < start {
        return Err(BatchError::BadRange { start, end });
    }
    let expected = u64::from(end) - u64::from(start) + 1;
    if u64::from(count) != expected {
        return Err(BatchError::CountMismatch {
            start,
            end,
            count,
            expected,
        });
    }
    if count > limits.max_ledgers {
        return Err(BatchError::TooManyLedgers {
            count,
            max: limits.max_ledgers,
        });
    }
    // No allocation from `count`: the vector grows with the ledgers actually decoded.
    let mut ledgers: Vec<BatchLedger> = Vec::new();
    let mut pos = 12;
    for index in 0..count {
        let rest = &xdr[pos..];
        if rest.is_empty() {
            return Err(BatchError::Truncated {
                reason: format!("the batch ends after {index} of its {count} ledgers"),
            });
        }
        let budget = rest
            .len()
            .min(usize::try_from(limits.max_ledger).unwrap_or(usize::MAX));
        let mut r = Limited::new(
            std::io::Cursor::new(rest),
            Limits {
                depth: XDR_DEPTH,
                len: budget,
            },
        );
        if let Err(e) = LedgerCloseMeta::read_xdr(&mut r) {
            return Err(match e {
                // Every read is charged to the byte budget, so running out of it (or of the
                // cursor) means the ledger claims bytes that are not there.
                stellar_xdr::Error::LengthLimitExceeded if budget < rest.len() => {
                    BatchError::LedgerTooLarge {
                        index,
                        max: limits.max_ledger,
                    }
                }
                stellar_xdr::Error::LengthLimitExceeded => BatchError::Truncated {
                    reason: format!("ledger {index} of {count} ends early"),
                },
                stellar_xdr::Error::Io(io) if io.kind() == std::io::ErrorKind::UnexpectedEof => {
                    BatchError::Truncated {
                        reason: format!("ledger {index} of {count} ends early"),
                    }
                }
                e => BatchError::Xdr {
                    index,
                    reason: e.to_string(),
                },
            });
        }
        let used = r.inner.position() as usize;
        let raw = xdr.slice(pos..pos + used);
        let info = match peek_header(&raw) {
            Ok(Some(info)) => info,
            Ok(None) => {
                // A whole LedgerCloseMeta always holds its header; defensive.
                return Err(BatchError::Xdr {
                    index,
                    reason: "no ledger header".into(),
                });
            }
            Err(error) => return Err(BatchError::Header { index, error }),
        };
        // `index < count <= end - start + 1`, so no overflow.
        let want = start + index;
        if info.ledger_seq != want {
            return Err(BatchError::Sequence {
                index,
                expected: want,
                got: info.ledger_seq,
            });
        }
        if let Err(error) = check_content(&raw, &info) {
            return Err(BatchError::Content {
                index,
                seq: want,
                error,
            });
        }
        if let Some(prev) = ledgers.last() {
            // The sequences follow (checked above); the link is the chain rule's.
            if ChainVerifier::after(prev.info.ledger_seq, prev.info.hash)
                .check(&info)
                .is_err()
            {
                return Err(BatchError::BrokenChain {
                    seq: want,
                    prev: prev.info.ledger_seq,
                });
            }
        }
        ledgers.push(BatchLedger { info, raw });
        pos += used;
    }
    if pos != xdr.len() {
        return Err(BatchError::TrailingBytes {
            len: xdr.len() - pos,
        });
    }
    Ok(Batch {
        start,
        end,
        ledgers,
    })
}

/// Decompresses, decodes and checks an object read at the key for `key_first..=key_last`
/// (see [`Schema::batch_range`]).
///
/// The batch must end where its key's range ends and start inside it: Galexie's first batch
/// of a network starts at ledger 2 in the range 0-63, and a writer that began mid-range (the
/// relay exporting from the first ledger it received) starts at that ledger.
pub fn read_object(
    object: &[u8],
    key_first: u32,
    key_last: u32,
    limits: &BatchLimits,
) -> Result<Batch, BatchError> {
    let raw = decompress_object(object, limits)?;
    let batch = decode_batch(Bytes::from(raw), limits)?;
    if batch.end != key_last || batch.start < key_first || batch.start > key_last {
        return Err(BatchError::WrongKey {
            start: batch.start,
            end: batch.end,
            key_first,
            key_last,
        });
    }
    Ok(batch)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_the_worked_examples() {
        // Galexie's defaults, one ledger per batch, 64000 per partition.
        let s = Schema::new(1, 64000).unwrap();
        assert_eq!(
            s.object_key(1_000_000),
            "FFF159FF--960000-1023999/FFF0BDBF--1000000.xdr.zst"
        );
        assert_eq!(
            s.object_key(63_000_123),
            "FC3F0FFF--62976000-63039999/FC3EB1C4--63000123.xdr.zst"
        );
        // SEP-54's own examples: 2 per batch, 8 per partition.
        let s = Schema::new(2, 8).unwrap();
        assert_eq!(s.object_key(18), "FFFFFFEF--16-31/FFFFFFED--18-19.xdr.zst");
        assert_eq!(s.object_key(19), "FFFFFFEF--16-31/FFFFFFED--18-19.xdr.zst");
        assert_eq!(s.object_key(2), "FFFFFFFF--0-15/FFFFFFFD--2-3.xdr.zst");
        assert_eq!(s.object_key(15), "FFFFFFFF--0-15/FFFFFFF1--14-15.xdr.zst");
        assert_eq!(
            Schema::new(1, 2).unwrap().batch_name(2),
            "FFFFFFFD--2.xdr.zst"
        );
        // 50 per batch, 4 per partition.
        let s = Schema::new(50, 4).unwrap();
        assert_eq!(
            s.object_key(250),
            "FFFFFF37--200-399/FFFFFF05--250-299.xdr.zst"
        );
        // One batch per partition: no directory.
        let s = Schema::new(200, 1).unwrap();
        assert_eq!(s.object_key(300), "FFFFFF37--200-399.xdr.zst");
        assert_eq!(s.partition_dir(300), None);
        // The pubnet sample in testdata/, named by an older Galexie.
        let s = Schema::new(1, 1).unwrap().with_extension(Extension::Zstd);
        assert_eq!(s.object_key(53_312_000), "FCD285FF--53312000.xdr.zstd");
        assert_eq!(s.object_key(997), "FFFFFC1A--997.xdr.zstd");
        // The first batch of a network (ledger 2) with 64 per file.
        let s = Schema::new(64, 1000).unwrap();
        assert_eq!(s.batch_range(2), (0, 63));
        assert_eq!(s.object_key(2), "FFFFFFFF--0-63999/FFFFFFFF--0-63.xdr.zst");
        // The last batch of the sequence space is clamped rather than wrapped.
        assert_eq!(
            Schema::new(64, 1).unwrap().batch_range(u32::MAX),
            (u32::MAX - 63, u32::MAX)
        );
        assert_eq!(
            Schema::new(1, 1).unwrap().object_key(u32::MAX),
            "00000000--4294967295.xdr.zst"
        );
    }

    #[test]
    fn bad_layouts_are_refused() {
        assert_eq!(Schema::new(0, 1), Err(SchemaError::ZeroLedgersPerBatch));
        assert_eq!(Schema::new(1, 0), Err(SchemaError::ZeroBatchesPerPartition));
        assert!(matches!(
            Schema::new(1 << 16, 1 << 16),
            Err(SchemaError::PartitionTooLarge { .. })
        ));
    }

    #[test]
    fn names_parse_strictly_and_round_trip() {
        for (name, first, last, ext) in [
            (
                "FFF0BDBF--1000000.xdr.zst",
                1_000_000,
                1_000_000,
                Extension::Zst,
            ),
            ("FFFFFF05--250-299.xdr.zst", 250, 299, Extension::Zst),
            (
                "FCD285FF--53312000.xdr.zstd",
                53_312_000,
                53_312_000,
                Extension::Zstd,
            ),
            ("FFFFFFFF--0.xdr.zst", 0, 0, Extension::Zst),
        ] {
            let got = parse_batch_name(name).unwrap();
            assert_eq!(
                (got.first, got.last, got.extension),
                (first, last, ext),
                "{name}"
            );
            assert_eq!(batch_name(got.first, got.last, got.extension), name);
        }
        for bad in [
            ".config.json",
            "FFF0BDBF--1000000.xdr.gz",
            "fff0bdbf--1000000.xdr.zst",  // lowercase hex
            "FFF0BDBE--1000000.xdr.zst",  // hex disagrees with the decimal
            "FFF0BDBF--01000000.xdr.zst", // leading zero
            "FFF0BDBF-1000000.xdr.zst",
            "FFF0BDB--1000000.xdr.zst",
            "FFFFFF05--250-250.xdr.zst", // a one-ledger range is written without `-N`
            "FFFFFF05--250-249.xdr.zst",
            "FFFFFF05--250-.xdr.zst",
            "FFFFFF05--250-299-300.xdr.zst",
            "FFFFFFFF--99999999999.xdr.zst",
            "FFFFFFFF--+0.xdr.zst",
            "",
        ] {
            assert_eq!(parse_batch_name(bad), None, "{bad:?}");
        }
        assert_eq!(
            parse_partition_name("FFF159FF--960000-1023999"),
            Some((960_000, 1_023_999))
        );
        assert_eq!(parse_partition_name("FFF159FF--960000"), None);
        assert_eq!(parse_partition_name("FFF159FE--960000-1023999"), None);
        // The last partition of the sequence space, clamped to one ledger.
        let s = Schema::new(1, 65535).unwrap();
        let dir = s.partition_dir(u32::MAX).unwrap();
        assert_eq!(dir, "00000000--4294967295-4294967295");
        assert_eq!(parse_partition_name(&dir), Some((u32::MAX, u32::MAX)));
    }

    #[test]
    fn manifest_matches_galexie_and_is_checked() {
        let s = Schema::new(1, 64000).unwrap();
        let m = Manifest::new("Test SDF Network ; September 2015", &s);
        assert_eq!(
            String::from_utf8(m.to_json()).unwrap(),
            r#"{"networkPassphrase":"Test SDF Network ; September 2015","version":"1.0","compression":"zstd","ledgersPerBatch":1,"batchesPerPartition":64000}"#
        );
        assert_eq!(Manifest::parse(&m.to_json()).unwrap(), m);
        assert_eq!(m.schema().unwrap(), s);
        // Unknown fields are ignored, as Go does.
        let extra = br#"{"networkPassphrase":"x","ledgersPerBatch":8,"batchesPerPartition":4,"ledgersPath":"/l"}"#;
        assert_eq!(
            Manifest::parse(extra).unwrap().schema().unwrap(),
            Schema::new(8, 4).unwrap()
        );
        for (bad, want) in [
            (&br#"{"ledgersPerBatch":1"#[..], "not valid json"),
            (br#"[]"#, "not valid json"),
            (
                br#"{"ledgersPerBatch":0,"batchesPerPartition":1}"#,
                "at least 1",
            ),
            (br#"{"ledgersPerBatch":1}"#, "batches per partition"),
            (
                br#"{"compression":"gzip","ledgersPerBatch":1,"batchesPerPartition":1}"#,
                "gzip",
            ),
            (
                br#"{"version":"2.0","ledgersPerBatch":1,"batchesPerPartition":1}"#,
                "2.0",
            ),
            (
                br#"{"ledgersPerBatch":-1,"batchesPerPartition":1}"#,
                "not valid json",
            ),
        ] {
            let e = Manifest::parse(bad).unwrap_err().to_string();
            assert!(e.contains(want), "{}: {e}", String::from_utf8_lossy(bad));
        }
        let long = vec![b' '; MAX_MANIFEST_LEN + 1];
        assert_eq!(
            Manifest::parse(&long),
            Err(ManifestError::TooLong {
                len: MAX_MANIFEST_LEN + 1
            })
        );
    }
}
