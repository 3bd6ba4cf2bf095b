//! `synthetic[:KEY=VALUE,...]`: generated ledgers with valid headers, a valid hash chain and a
//! chosen size and compressibility.
//!
//! # What a ledger is
//!
//! A `LedgerCloseMeta` v2 (protocol 23) that decodes with `stellar-xdr`:
//!
//! - header: `ledgerSeq` from `start` up, `previousLedgerHash` the previous ledger's hash
//!   (zeros for the first), `closeTime` advancing 5 s per ledger, `bucketListHash` a digest of
//!   the size and ratio (so two specs never make the same chain), and the entry's hash
//!   `sha256(XDR(LedgerHeader))`;
//! - an empty generalized transaction set (two empty phases), no transactions, no upgrades,
//!   with the header's `txSetHash` (the sha256 of that set's XDR) and `txSetResultHash` (the
//!   sha256 of an empty `TransactionResultSet`) right, so subscribers' content checks pass;
//! - one `SCPHistoryEntry` with one EXTERNALIZE envelope whose ballot `Value` (an `opaque<>`
//!   with no bound) is the filler that brings the ledger to `size` bytes (exactly, but for up to
//!   3 bytes of XDR alignment; a size below the empty ledger, about 600 bytes, gives the empty
//!   ledger).
//!
//! Ledgers are a deterministic function of the spec: the same spec always makes the same chain,
//! so a relay restarted on it regenerates ledgers its ring already holds, with the same hashes.
//!
//! # Filler and its compressibility
//!
//! The filler is a sequence of 64-byte records, each either fresh random bytes (with
//! probability `p`) or one of 256 XDR-like templates (discriminants, one of 16 account ids,
//! amounts with zero high bytes, asset codes), picked at random. zstd level 1 stores a random
//! record as 64 literal bytes and a template as one short match, so the compressed size is
//! nearly linear in `p`: `1 / ratio(p) ≈ p * a + (1 - p) * c`. Calibration measures the ratio
//! (zstd level 1 over chunks of `chunk=` bytes, 256 KiB by default, as the relay compresses)
//! of a sample of 1 MiB (at least four chunks) and
//! interpolates `p` on `1 / ratio`, keeping a bracket, until it is within 0.5% of the target
//! (about 3 to 5 samples; results are cached per ratio and chunk for the process). `ratio=1`
//! is pure random bytes; a ratio above what all-template filler reaches (about 14) is clamped
//! to it, with a warning. A compressor sees one chunk at a time and must spell out each
//! template once per chunk, so chunks smaller than 256 KiB draw on fewer templates (about 16
//! occurrences of each per chunk, as at 256 KiB), which keeps the calibrated ratio reachable.
//!
//! # Generating ahead of emission
//!
//! Generation cost must never show in the timings. [`synthetic_ledgers`] calibrates and builds
//! a pool of up to [`generate::POOL`] distinct filler bodies before the first ledger; ledger k carries
//! filler `k % POOL` under its own header, so each ledger then costs one serialization (two
//! copies of the filler). The source then either builds every ledger before `t0`, when `count`
//! ledgers fit in [`UPFRONT_BYTES`], or runs the iterator on a generator thread that stays
//! [`AHEAD`] ledgers ahead through a bounded channel (endless and long runs: about 15 ms per
//! 14.5 MiB ledger in a release build, against a 600 ms cadence). Emission is paced exactly like
//! the file source.

use std::fmt;
use std::sync::mpsc;
use std::time::Duration;

use bytes::Bytes;

use super::{Out, Pacer, ParseSourceError, SourceOptions, Stop};

mod generate;
#[cfg(test)]
mod tests;

pub use generate::{synthetic_ledgers, SyntheticLedgers, AHEAD, POOL, UPFRONT_BYTES};

use generate::{DEFAULT_CHUNK, MAX_CHUNK, MIN_CHUNK};

/// Settings of the synthetic source: `synthetic:size=14.5MiB,ratio=7.6,count=100,start=2,emit=8ms`.
#[derive(Debug, Clone, PartialEq)]
pub struct SyntheticSpec {
    /// Bytes per ledger (`size=`, with an optional unit B, KiB, MiB, GiB, KB, MB or GB).
    /// Default 14.5 MiB, the Phase 3 stress profile.
    pub size: u64,
    /// Target zstd level-1 compression ratio over chunks of `chunk` bytes (`ratio=`, at least 1;
    /// 1 is incompressible). Default 7.6, about what real meta gives.
    pub ratio: f64,
    /// Ledgers to emit before `Finished` (`count=`); `None` (the default) is endless.
    pub count: Option<u64>,
    /// Sequence number of the first ledger (`start=`). Default 2, the first ledger after
    /// genesis.
    pub start: u32,
    /// Emit window, overriding [`SourceOptions::emit`] (`emit=`, such as `8ms` or `250us`).
    pub emit: Option<Duration>,
    /// Chunk size the ratio is calibrated for (`chunk=`, with an optional unit; 1 KiB to
    /// 16 MiB). Default 256 KiB, the relay's default chunk size. Set it to the relay's
    /// `--chunk-size` when that differs: a compressor sees one chunk at a time, so the same
    /// bytes compress worse in small chunks, and the filler's vocabulary is scaled so that a
    /// chunk of this size compresses at `ratio`.
    pub chunk: u64,
}

impl Default for SyntheticSpec {
    fn default() -> Self {
        Self {
            size: 15_204_352,
            ratio: 7.6,
            count: None,
            start: 2,
            emit: None,
            chunk: DEFAULT_CHUNK as u64,
        }
    }
}

/// Smallest `size=` accepted: an empty ledger is about 600 bytes.
pub const MIN_SIZE: u64 = 1 << 10;

/// Largest `size=` accepted: the longest body a record mark can carry.
pub const MAX_SIZE: u64 = 0x7FFF_FFFF;

impl SyntheticSpec {
    /// Parses the comma-separated `KEY=VALUE` settings after `synthetic:`.
    pub(super) fn parse_settings(settings: &str) -> Result<Self, ParseSourceError> {
        let mut spec = Self::default();
        let mut seen: Vec<&str> = Vec::new();
        for item in settings.split(',').filter(|item| !item.trim().is_empty()) {
            let (key, value) =
                item.split_once('=')
                    .ok_or_else(|| ParseSourceError::NotKeyValue {
                        item: item.to_owned(),
                    })?;
            let (key, value) = (key.trim(), value.trim());
            if seen.contains(&key) {
                return Err(ParseSourceError::DuplicateKey {
                    key: key.to_owned(),
                });
            }
            seen.push(key);
            match key {
                "size" => spec.size = parse_size(value).map_err(|r| bad("size", value, r))?,
                "ratio" => spec.ratio = parse_ratio(value).map_err(|r| bad("ratio", value, r))?,
                "count" => {
                    spec.count = Some(
                        value
                            .parse::<u64>()
                            .ok()
                            .filter(|&c| c >= 1)
                            .ok_or_else(|| bad("count", value, "expected an integer >= 1"))?,
                    )
                }
                "start" => {
                    spec.start = value
                        .parse::<u32>()
                        .ok()
                        .filter(|&s| s >= 1)
                        .ok_or_else(|| bad("start", value, "expected a ledger sequence >= 1"))?
                }
                "emit" => {
                    spec.emit = Some(parse_duration(value).map_err(|r| bad("emit", value, r))?)
                }
                "chunk" => {
                    spec.chunk = parse_size(value)
                        .ok()
                        .filter(|c| (MIN_CHUNK..=MAX_CHUNK).contains(c))
                        .ok_or_else(|| {
                            bad(
                                "chunk",
                                value,
                                "expected a size from 1KiB to 16MiB, e.g. 10KiB",
                            )
                        })?
                }
                _ => {
                    return Err(ParseSourceError::UnknownKey {
                        key: key.to_owned(),
                    })
                }
            }
        }
        if let Some(count) = spec.count {
            let last = u64::from(spec.start) + count - 1;
            if last > u64::from(u32::MAX) {
                let count = count.to_string();
                return Err(bad(
                    "count",
                    &count,
                    format!("ledger {last} would be past the last sequence {}", u32::MAX),
                ));
            }
        }
        Ok(spec)
    }
}

impl fmt::Display for SyntheticSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "size={},ratio={}", self.size, self.ratio)?;
        if let Some(count) = self.count {
            write!(f, ",count={count}")?;
        }
        write!(f, ",start={}", self.start)?;
        if let Some(emit) = self.emit {
            write!(f, ",emit={}ns", emit.as_nanos())?;
        }
        if self.chunk != DEFAULT_CHUNK as u64 {
            write!(f, ",chunk={}", self.chunk)?;
        }
        Ok(())
    }
}

fn bad(key: &'static str, value: &str, reason: impl Into<String>) -> ParseSourceError {
    ParseSourceError::BadValue {
        key,
        value: value.to_owned(),
        reason: reason.into(),
    }
}

/// A size in the grammar of every command ([`ledger_relay_transport::units`]), within the
/// bounds of a synthetic ledger.
fn parse_size(s: &str) -> Result<u64, String> {
    let bytes = ledger_relay_transport::parse_size(s).map_err(|e| e.reason)?;
    if bytes < MIN_SIZE {
        return Err(format!("at least {MIN_SIZE} bytes"));
    }
    if bytes > MAX_SIZE {
        return Err(format!("at most {MAX_SIZE} bytes (a record mark's limit)"));
    }
    Ok(bytes)
}

fn parse_ratio(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(r) if r.is_finite() && r >= 1.0 => Ok(r),
        _ => Err("expected a number >= 1 (1 is incompressible)".to_owned()),
    }
}

/// An emission window in the grammar of every command, at most a minute.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = ledger_relay_transport::parse_duration(s).map_err(|e| e.reason)?;
    if d > Duration::from_secs(60) {
        return Err("at most 60s".to_owned());
    }
    Ok(d)
}

pub(super) fn run(spec: &SyntheticSpec, opts: &SourceOptions, out: &Out) -> Result<(), Stop> {
    if spec.size > u64::from(opts.max_record_len) {
        return Err(Stop::Failed(format!(
            "synthetic ledgers of {} bytes exceed the record limit of {} bytes",
            spec.size, opts.max_record_len
        )));
    }
    let ledgers = synthetic_ledgers(spec);
    tracing::info!(
        len = ledgers.ledger_len(),
        target_ratio = spec.ratio,
        random_fraction = ledgers.random_fraction(),
        measured_ratio = ledgers.measured_ratio(),
        "synthetic source calibrated"
    );
    let mut pacer = Pacer::new(opts.cadence, spec.emit.unwrap_or(opts.emit));
    let total = spec
        .count
        .map(|count| count.saturating_mul(ledgers.ledger_len() as u64));
    if total.is_some_and(|total| total <= UPFRONT_BYTES) {
        let all: Vec<Vec<u8>> = ledgers.collect();
        for ledger in all {
            pacer.emit(out, Bytes::from(ledger))?;
        }
        return Ok(());
    }

    let (tx, rx) = mpsc::sync_channel(AHEAD);
    let generator = std::thread::Builder::new()
        .name("source-synthetic-gen".to_owned())
        .spawn(move || {
            for ledger in ledgers {
                // The source thread is gone (shutdown): stop generating.
                if tx.send(ledger).is_err() {
                    break;
                }
            }
        })
        .map_err(|e| Stop::Failed(format!("cannot start the generator thread: {e}")))?;
    let result = (|| {
        while let Some(ledger) = out.recv(&rx)? {
            pacer.emit(out, Bytes::from(ledger))?;
        }
        Ok(())
    })();
    drop(rx);
    let _ = generator.join();
    result
}
