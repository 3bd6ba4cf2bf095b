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
//! a pool of up to [`POOL`] distinct filler bodies before the first ledger; ledger k carries
//! filler `k % POOL` under its own header, so each ledger then costs one serialization (two
//! copies of the filler). The source then either builds every ledger before `t0`, when `count`
//! ledgers fit in [`UPFRONT_BYTES`], or runs the iterator on a generator thread that stays
//! [`AHEAD`] ledgers ahead through a bounded channel (endless and long runs: about 15 ms per
//! 14.5 MiB ledger in a release build, against a 600 ms cadence). Emission is paced exactly like
//! the file source.

use std::fmt;
use std::sync::{mpsc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use rand::rngs::SmallRng;
use rand::{RngCore, SeedableRng};
use sha2::{Digest, Sha256};
use stellar_xdr::{
    BytesM, GeneralizedTransactionSet, Hash, LedgerCloseMeta, LedgerCloseMetaExt,
    LedgerCloseMetaV2, LedgerHeader, LedgerHeaderExt, LedgerHeaderHistoryEntry,
    LedgerHeaderHistoryEntryExt, LedgerScpMessages, Limited, Limits, NodeId, PublicKey, ScpBallot,
    ScpEnvelope, ScpHistoryEntry, ScpHistoryEntryV0, ScpStatement, ScpStatementExternalize,
    ScpStatementPledges, Signature, StellarValue, StellarValueExt, TimePoint, TransactionPhase,
    TransactionSetV1, Uint256, Value, VecM, WriteXdr,
};

use super::{Out, Pacer, ParseSourceError, SourceOptions, Stop};

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

/// Splits `12.5MiB` into `(12.5, "MiB")`.
fn split_number(s: &str) -> Result<(f64, &str), String> {
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let number: f64 = s[..end]
        .parse()
        .map_err(|_| "expected a non-negative number with a unit".to_owned())?;
    Ok((number, s[end..].trim()))
}

fn parse_size(s: &str) -> Result<u64, String> {
    let (number, unit) = split_number(s)?;
    let scale: f64 = match unit {
        "" | "B" => 1.0,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        "KB" | "kB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        _ => {
            return Err(format!(
                "unknown unit {unit:?}: use B, KiB, MiB, GiB, KB, MB or GB"
            ))
        }
    };
    let bytes = (number * scale).round();
    if bytes < MIN_SIZE as f64 {
        return Err(format!("at least {MIN_SIZE} bytes"));
    }
    if bytes > MAX_SIZE as f64 {
        return Err(format!("at most {MAX_SIZE} bytes (a record mark's limit)"));
    }
    // Checked against MAX_SIZE just above, so the value fits.
    Ok(bytes as u64)
}

fn parse_ratio(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(r) if r.is_finite() && r >= 1.0 => Ok(r),
        _ => Err("expected a number >= 1 (1 is incompressible)".to_owned()),
    }
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let (number, unit) = split_number(s)?;
    let nanos_per: f64 = match unit {
        "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        "" if number == 0.0 => 1.0,
        _ => return Err("expected a duration with a unit: ns, us, ms or s".to_owned()),
    };
    let nanos = (number * nanos_per).round();
    if nanos > 60e9 {
        return Err("at most 60s".to_owned());
    }
    // At most 60e9, so the value fits.
    Ok(Duration::from_nanos(nanos as u64))
}

/// Distinct filler bodies: successive ledgers differ in body, not only in header, without the
/// cost of fresh filler per ledger.
pub const POOL: usize = 4;

/// The source builds all ledgers before the first when they fit in this many bytes.
pub const UPFRONT_BYTES: u64 = 256 << 20;

/// Ledgers a generator thread keeps ready ahead of emission.
pub const AHEAD: usize = 2;

/// Filler is built from records of this many bytes.
const RECORD: usize = 64;

/// XDR-like templates per generator.
const TEMPLATES: usize = 256;

/// zstd level the ratio is calibrated for: the relay's chunk codec.
const ZSTD_LEVEL: i32 = 1;

/// Chunk size the ratio is calibrated for by default: the relay's default chunk size.
const DEFAULT_CHUNK: usize = 256 << 10;

/// Smallest `chunk=` accepted.
const MIN_CHUNK: u64 = 1 << 10;

/// Largest `chunk=` accepted.
const MAX_CHUNK: u64 = 16 << 20;

/// Sample compressed per calibration step: 1 MiB, and at least four chunks.
const SAMPLE_MIN: usize = 1 << 20;

/// Each template occurs about this many times per chunk (256 templates in 256 KiB chunks):
/// smaller chunks get fewer templates so that their statistics stay those of a 256 KiB chunk.
const OCCURRENCES_PER_CHUNK: usize = 16;

/// Seed of everything random here: ledgers are a function of the spec alone.
const SEED: u64 = 0x4C45_4447_4552_5259;

/// Close time of ledger 0 (2025-06-15); each ledger closes 5 s after the previous.
const CLOSE_TIME_BASE: u64 = 1_750_000_000;

/// Protocol version in the headers: v2 `LedgerCloseMeta` belongs to protocol 23.
const PROTOCOL: u32 = 23;

/// Generated ledgers, in order: see [`synthetic_ledgers`].
pub struct SyntheticLedgers {
    next_seq: Option<u32>,
    remaining: Option<u64>,
    previous_hash: [u8; 32],
    spec_tag: [u8; 32],
    pool: Vec<Vec<u8>>,
    index: usize,
    len: usize,
    random_fraction: f64,
    measured_ratio: f64,
}

impl fmt::Debug for SyntheticLedgers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SyntheticLedgers")
            .field("next_seq", &self.next_seq)
            .field("remaining", &self.remaining)
            .field("len", &self.len)
            .field("random_fraction", &self.random_fraction)
            .field("measured_ratio", &self.measured_ratio)
            .finish_non_exhaustive()
    }
}

/// Returns the ledgers of `spec` (record bodies, without record marks): `count` of them, or
/// endless (until sequence `u32::MAX`).
///
/// Calibrates the filler and builds the filler pool first (about 40 ms for 14.5 MiB in a
/// release build); each ledger then costs one serialization. A `size` above 2^31 - 1 bytes
/// (the record mark's limit) is clamped to it.
pub fn synthetic_ledgers(spec: &SyntheticSpec) -> SyntheticLedgers {
    let chunk = usize::try_from(spec.chunk.clamp(MIN_CHUNK, MAX_CHUNK)).unwrap_or(DEFAULT_CHUNK);
    let model = FillerModel::new(chunk);
    let (random_fraction, measured_ratio) = calibrated(&model, spec.ratio);
    let threshold = threshold(random_fraction);
    // The default chunk keeps the tag (and so the chain) of specs written before `chunk=`.
    let chunk_tag = if chunk == DEFAULT_CHUNK {
        String::new()
    } else {
        format!(" chunk={chunk}")
    };
    let spec_tag: [u8; 32] = Sha256::digest(format!(
        "ledger-relay synthetic v1 size={} ratio={}{chunk_tag}",
        spec.size, spec.ratio
    ))
    .into();
    let empty_len = build(spec.start, [0; 32], spec_tag, &[]).0.len();
    let target = usize::try_from(spec.size.min(MAX_SIZE)).unwrap_or(usize::MAX);
    // The filler's length prefix is part of the empty ledger; a multiple of 4 needs no padding.
    let filler_len = target.saturating_sub(empty_len) / 4 * 4;
    let pool_len = spec.count.map_or(POOL, |count| {
        usize::try_from(count).unwrap_or(POOL).min(POOL)
    });
    let pool = (0..pool_len)
        .map(|i| model.fill(threshold, SEED ^ (i as u64 + 1), filler_len))
        .collect();
    SyntheticLedgers {
        next_seq: Some(spec.start),
        remaining: spec.count,
        previous_hash: [0; 32],
        spec_tag,
        pool,
        index: 0,
        len: empty_len + filler_len,
        random_fraction,
        measured_ratio,
    }
}

impl SyntheticLedgers {
    /// Bytes per ledger.
    pub fn ledger_len(&self) -> usize {
        self.len
    }

    /// Fraction of filler records that are random bytes, as calibrated.
    pub fn random_fraction(&self) -> f64 {
        self.random_fraction
    }

    /// zstd level-1 ratio the calibration measured on its sample at that fraction.
    pub fn measured_ratio(&self) -> f64 {
        self.measured_ratio
    }
}

impl Iterator for SyntheticLedgers {
    type Item = Vec<u8>;

    fn next(&mut self) -> Option<Vec<u8>> {
        if self.remaining == Some(0) {
            return None;
        }
        let seq = self.next_seq?;
        let filler = self.pool.get(self.index % self.pool.len().max(1))?;
        let (ledger, hash) = build(seq, self.previous_hash, self.spec_tag, filler);
        self.previous_hash = hash;
        self.next_seq = seq.checked_add(1);
        self.remaining = self.remaining.map(|r| r - 1);
        self.index += 1;
        Some(ledger)
    }
}

/// Builds ledger `seq` with `filler` as its SCP value; returns its XDR and its hash.
fn build(
    seq: u32,
    previous_hash: [u8; 32],
    spec_tag: [u8; 32],
    filler: &[u8],
) -> (Vec<u8>, [u8; 32]) {
    let tx_set = GeneralizedTransactionSet::V1(TransactionSetV1 {
        previous_ledger_hash: Hash(previous_hash),
        phases: vec![
            TransactionPhase::V0(VecM::default()),
            TransactionPhase::V0(VecM::default()),
        ]
        .try_into()
        // Two elements fit a VecM bounded by u32::MAX.
        .expect("two phases fit"),
    });
    let header = LedgerHeader {
        ledger_version: PROTOCOL,
        previous_ledger_hash: Hash(previous_hash),
        scp_value: StellarValue {
            tx_set_hash: Hash(Sha256::digest(to_xdr(&tx_set)).into()),
            close_time: TimePoint(CLOSE_TIME_BASE + 5 * u64::from(seq)),
            upgrades: VecM::default(),
            ext: StellarValueExt::Basic,
        },
        // The XDR of `TransactionResultSet { results<> }` with no results: its count, 0.
        tx_set_result_hash: Hash(Sha256::digest(0u32.to_be_bytes()).into()),
        bucket_list_hash: Hash(spec_tag),
        ledger_seq: seq,
        total_coins: 1_000_000_000_000_000_000,
        fee_pool: 0,
        inflation_seq: 0,
        id_pool: u64::from(seq) * 100,
        base_fee: 100,
        base_reserve: 5_000_000,
        max_tx_set_size: 1_000,
        skip_list: [Hash([0; 32]), Hash([0; 32]), Hash([0; 32]), Hash([0; 32])],
        ext: LedgerHeaderExt::V0,
    };
    let hash: [u8; 32] = Sha256::digest(to_xdr(&header)).into();
    let node: [u8; 32] = Sha256::digest(spec_tag).into();
    let signature: Vec<u8> = [Sha256::digest(hash), Sha256::digest(node)].concat();
    let envelope = ScpEnvelope {
        statement: ScpStatement {
            node_id: NodeId(PublicKey::PublicKeyTypeEd25519(Uint256(node))),
            slot_index: u64::from(seq),
            pledges: ScpStatementPledges::Externalize(ScpStatementExternalize {
                commit: ScpBallot {
                    counter: 1,
                    // The filler is at most MAX_SIZE bytes, within BytesM's u32::MAX bound.
                    value: Value(BytesM::try_from(filler.to_vec()).expect("filler fits opaque<>")),
                },
                n_h: 1,
                commit_quorum_set_hash: Hash([0; 32]),
            }),
        },
        // 64 bytes, Signature's bound.
        signature: Signature(signature.try_into().expect("a signature is 64 bytes")),
    };
    let lcm = LedgerCloseMeta::V2(LedgerCloseMetaV2 {
        ext: LedgerCloseMetaExt::V0,
        ledger_header: LedgerHeaderHistoryEntry {
            hash: Hash(hash),
            header,
            ext: LedgerHeaderHistoryEntryExt::V0,
        },
        tx_set,
        tx_processing: VecM::default(),
        upgrades_processing: VecM::default(),
        scp_info: vec![ScpHistoryEntry::V0(ScpHistoryEntryV0 {
            quorum_sets: VecM::default(),
            ledger_messages: LedgerScpMessages {
                ledger_seq: seq,
                messages: vec![envelope].try_into().expect("one envelope fits"),
            },
        })]
        .try_into()
        // One element fits a VecM bounded by u32::MAX.
        .expect("one entry fits"),
        total_byte_size_of_live_soroban_state: 0,
        evicted_keys: VecM::default(),
    });
    let mut w = Limited::new(Vec::with_capacity(filler.len() + 1024), Limits::none());
    // Writing XDR fails only on exceeded limits (none here) or lengths over u32::MAX (every
    // length here is bounded by MAX_SIZE).
    lcm.write_xdr(&mut w)
        .expect("a synthetic ledger serializes");
    (w.inner, hash)
}

fn to_xdr(value: &impl WriteXdr) -> Vec<u8> {
    // Small fixed-shape values: writing fails only on limits, and there are none.
    value
        .to_xdr(Limits::none())
        .expect("a fixed-shape value serializes")
}

/// The filler's building blocks.
struct FillerModel {
    templates: Vec<[u8; RECORD]>,
    chunk: usize,
}

impl FillerModel {
    /// The model for chunks of `chunk` bytes: 256 templates at 256 KiB, fewer in smaller
    /// chunks (at least 4).
    fn new(chunk: usize) -> Self {
        let count = (chunk / RECORD / OCCURRENCES_PER_CHUNK).clamp(4, TEMPLATES);
        let mut rng = SmallRng::seed_from_u64(SEED);
        let mut accounts = [[0u8; 32]; 16];
        for account in &mut accounts {
            rng.fill_bytes(account);
        }
        const ASSETS: [&[u8; 4]; 4] = [b"USDC", b"EURC", b"XLM\0", b"BTC\0"];
        let templates = (0..count)
            .map(|_| {
                let r = rng.next_u64();
                let mut t = [0u8; RECORD];
                // An XDR union discriminant, an account id, an int64 amount with zero high
                // bytes, a small counter, an empty extension, a 4-byte asset code with its
                // length, and flags: what ledger entries and operations are made of.
                t[0..4].copy_from_slice(&((r % 7) as u32).to_be_bytes());
                t[4..36].copy_from_slice(&accounts[(r >> 8) as usize % accounts.len()]);
                t[40..44].copy_from_slice(&((r >> 16) as u32).to_be_bytes());
                t[44..48].copy_from_slice(&((r >> 48) as u32 % 1000).to_be_bytes());
                t[52..56].copy_from_slice(&4u32.to_be_bytes());
                t[56..60].copy_from_slice(ASSETS[(r >> 40) as usize % ASSETS.len()]);
                t[60..64].copy_from_slice(&((r >> 44) as u32 % 8).to_be_bytes());
                t
            })
            .collect();
        Self { templates, chunk }
    }

    /// `len` bytes of filler: each record random with probability `threshold / 2^32`, else a
    /// random template.
    fn fill(&self, threshold: u64, seed: u64, len: usize) -> Vec<u8> {
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut out = vec![0u8; len];
        for record in out.chunks_mut(RECORD) {
            if u64::from(rng.next_u32()) < threshold {
                rng.fill_bytes(record);
            } else {
                let template = &self.templates[rng.next_u32() as usize % self.templates.len()];
                record.copy_from_slice(&template[..record.len()]);
            }
        }
        out
    }

    /// zstd level-1 ratio over the model's chunks of a filler sample.
    fn measure(&self, threshold: u64) -> f64 {
        let sample_len = SAMPLE_MIN.max(4 * self.chunk);
        let sample = self.fill(threshold, SEED ^ 0xCA11_B8A7E, sample_len);
        let compressed: usize = sample
            .chunks(self.chunk)
            .map(|chunk| zstd::bulk::compress(chunk, ZSTD_LEVEL).map_or(chunk.len(), |c| c.len()))
            .sum();
        sample.len() as f64 / compressed.max(1) as f64
    }
}

/// The record threshold for a random fraction `p` in [0, 1].
fn threshold(p: f64) -> u64 {
    (p.clamp(0.0, 1.0) * (1u64 << 32) as f64).round() as u64
}

/// Calibration results per (target ratio bits, chunk): `(random fraction, measured)`.
type Calibrations = Vec<((u64, usize), f64, f64)>;

/// Calibrations done in this process.
static CALIBRATIONS: OnceLock<Mutex<Calibrations>> = OnceLock::new();

/// Returns `calibrate(model, target)`, cached for the process.
fn calibrated(model: &FillerModel, target: f64) -> (f64, f64) {
    let cache = CALIBRATIONS.get_or_init(|| Mutex::new(Vec::new()));
    let key = (target.to_bits(), model.chunk);
    if let Ok(cache) = cache.lock() {
        if let Some(&(_, p, measured)) = cache.iter().find(|(k, ..)| *k == key) {
            return (p, measured);
        }
    }
    let (p, measured) = calibrate(model, target);
    if let Ok(mut cache) = cache.lock() {
        cache.push((key, p, measured));
    }
    (p, measured)
}

/// Finds the random fraction whose filler compresses at `target`; returns it and the ratio
/// measured there.
fn calibrate(model: &FillerModel, target: f64) -> (f64, f64) {
    let r1 = model.measure(threshold(1.0));
    if target.is_nan() || target <= r1 {
        return (1.0, r1);
    }
    let r0 = model.measure(threshold(0.0));
    if target >= r0 {
        if target > r0 * 1.01 {
            tracing::warn!(
                target,
                reached = r0,
                "synthetic ratio clamped to the filler's maximum"
            );
        }
        return (0.0, r0);
    }
    // 1/ratio is nearly linear in p: interpolate on it (regula falsi), keeping the bracket.
    let goal = 1.0 / target;
    let (mut lo, mut hi) = ((0.0, 1.0 / r0), (1.0, 1.0 / r1));
    let mut best = if (r0 / target - 1.0).abs() < (r1 / target - 1.0).abs() {
        (0.0, r0)
    } else {
        (1.0, r1)
    };
    for _ in 0..12 {
        let p = lo.0 + (goal - lo.1) * (hi.0 - lo.0) / (hi.1 - lo.1);
        if p.is_nan() || p <= lo.0 || p >= hi.0 {
            break;
        }
        let r = model.measure(threshold(p));
        if (r / target - 1.0).abs() < (best.1 / target - 1.0).abs() {
            best = (p, r);
        }
        if (r / target - 1.0).abs() < 0.005 {
            break;
        }
        if r > target {
            lo = (p, 1.0 / r);
        } else {
            hi = (p, 1.0 / r);
        }
    }
    best
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_durations_parse() {
        assert_eq!(parse_size("14.5MiB"), Ok(15_204_352));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4096B"), Ok(4096));
        assert_eq!(parse_size("2KiB"), Ok(2048));
        assert_eq!(parse_size("1.5 KB"), Ok(1500));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert!(parse_size("1.2.3MiB").is_err());
        assert!(parse_size("").is_err());
        assert_eq!(parse_duration("8ms"), Ok(Duration::from_millis(8)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration("250µs"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("15ns"), Ok(Duration::from_nanos(15)));
        assert!(parse_duration("61s").is_err());
        assert!(parse_duration("3").is_err());
    }

    #[test]
    fn filler_is_deterministic_and_mixed() {
        let model = FillerModel::new(DEFAULT_CHUNK);
        assert_eq!(model.templates.len(), TEMPLATES);
        let a = model.fill(threshold(0.5), 1, 10_000);
        assert_eq!(a, model.fill(threshold(0.5), 1, 10_000));
        assert_ne!(a, model.fill(threshold(0.5), 2, 10_000));
        assert_eq!(a.len(), 10_000);
        let templates = a
            .chunks(RECORD)
            .filter(|r| model.templates.iter().any(|t| t.starts_with(r)))
            .count();
        let records = a.len().div_ceil(RECORD);
        assert!(
            templates > records / 3 && templates < records * 2 / 3,
            "{templates} of {records}"
        );
        assert_eq!(threshold(1.0), 1 << 32);
        assert_eq!(threshold(0.0), 0);
    }

    #[test]
    fn small_size_gives_the_empty_ledger() {
        let spec = SyntheticSpec {
            size: 10,
            ratio: 1.0,
            count: Some(2),
            ..SyntheticSpec::default()
        };
        let ledgers: Vec<Vec<u8>> = synthetic_ledgers(&spec).collect();
        assert_eq!(ledgers.len(), 2);
        assert!(ledgers[0].len() < MIN_SIZE as usize, "{}", ledgers[0].len());
    }

    #[test]
    fn endless_stops_at_the_last_sequence() {
        let spec = SyntheticSpec {
            size: MIN_SIZE,
            ratio: 1.0,
            count: None,
            start: u32::MAX - 1,
            ..SyntheticSpec::default()
        };
        assert_eq!(synthetic_ledgers(&spec).count(), 2);
    }

    #[test]
    fn chunk_setting_parses_and_is_bounded() {
        let spec = SyntheticSpec::parse_settings("size=594KiB,chunk=10KiB").unwrap();
        assert_eq!(spec.chunk, 10 << 10);
        assert_eq!(
            spec.to_string(),
            "size=608256,ratio=7.6,start=2,chunk=10240"
        );
        assert_eq!(SyntheticSpec::parse_settings(&spec.to_string()), Ok(spec));
        assert!(!SyntheticSpec::default().to_string().contains("chunk"));
        for bad in ["chunk=512", "chunk=17MiB", "chunk=ten"] {
            let err = SyntheticSpec::parse_settings(bad).unwrap_err();
            assert!(err.to_string().contains("chunk"), "{bad}: {err}");
        }
        assert_eq!(FillerModel::new(10 << 10).templates.len(), 10);
        assert_eq!(FillerModel::new(1 << 10).templates.len(), 4);
        assert_eq!(FillerModel::new(16 << 20).templates.len(), TEMPLATES);
    }

    /// zstd-1 ratio of `ledger` cut into `chunk`-byte pieces, as the relay compresses it.
    fn chunked_ratio(ledgers: &[Vec<u8>], chunk: usize) -> f64 {
        let raw: usize = ledgers.iter().map(Vec::len).sum();
        let wire: usize = ledgers
            .iter()
            .flat_map(|l| l.chunks(chunk))
            .map(|c| zstd::bulk::compress(c, ZSTD_LEVEL).unwrap().len())
            .sum();
        raw as f64 / wire as f64
    }

    #[test]
    fn small_chunks_reach_the_target_ratio() {
        // The bench's scaled profile: 594 KiB ledgers in 10 KiB chunks.
        for target in [7.6, 3.0] {
            let spec = SyntheticSpec {
                size: 594 << 10,
                ratio: target,
                count: Some(4),
                chunk: 10 << 10,
                ..SyntheticSpec::default()
            };
            let ledgers: Vec<Vec<u8>> = synthetic_ledgers(&spec).collect();
            let measured = chunked_ratio(&ledgers, 10 << 10);
            assert!(
                (measured / target - 1.0).abs() < 0.05,
                "target {target}, measured {measured:.2} over 10 KiB chunks"
            );
        }
        // And the chain differs from the default chunk's, so two specs never share one.
        let a = synthetic_ledgers(&SyntheticSpec {
            size: MIN_SIZE,
            count: Some(1),
            ..SyntheticSpec::default()
        })
        .next();
        let b = synthetic_ledgers(&SyntheticSpec {
            size: MIN_SIZE,
            count: Some(1),
            chunk: 10 << 10,
            ..SyntheticSpec::default()
        })
        .next();
        assert_ne!(a, b);
    }
}
