//! Object and partition names, and the schema that maps a ledger to its object.

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
