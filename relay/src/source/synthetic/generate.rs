//! The generator behind the synthetic source: calibrated filler, a pool of bodies, and
//! ledgers built under a valid header and hash chain (see the parent module's documentation for
//! what a ledger is and how its compressibility is calibrated).

use std::fmt;
use std::sync::{Mutex, OnceLock};

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

use super::{SyntheticSpec, MAX_SIZE};

/// Distinct filler bodies: successive ledgers differ in body, not only in header, without the
/// cost of fresh filler per ledger.
pub const POOL: usize = 4;

/// The source builds all ledgers before the first when they fit in this many bytes.
pub const UPFRONT_BYTES: u64 = 256 << 20;

/// Ledgers a generator thread keeps ready ahead of emission.
pub const AHEAD: usize = 2;

/// Filler is built from records of this many bytes.
pub(super) const RECORD: usize = 64;

/// XDR-like templates per generator.
pub(super) const TEMPLATES: usize = 256;

/// zstd level the ratio is calibrated for: the relay's chunk codec.
pub(super) const ZSTD_LEVEL: i32 = 1;

/// Chunk size the ratio is calibrated for by default: the relay's default chunk size.
pub(super) const DEFAULT_CHUNK: usize = ledger_relay_wire::chunker::DEFAULT_CHUNK_SIZE;

/// Smallest `chunk=` accepted.
pub(super) const MIN_CHUNK: u64 = 1 << 10;

/// Largest `chunk=` accepted.
pub(super) const MAX_CHUNK: u64 = 16 << 20;

/// Sample compressed per calibration step: 1 MiB, and at least four chunks.
pub(super) const SAMPLE_MIN: usize = 1 << 20;

/// Each template occurs about this many times per chunk (256 templates in 256 KiB chunks):
/// smaller chunks get fewer templates so that their statistics stay those of a 256 KiB chunk.
pub(super) const OCCURRENCES_PER_CHUNK: usize = 16;

/// Seed of everything random here: ledgers are a function of the spec alone.
pub(super) const SEED: u64 = 0x4C45_4447_4552_5259;

/// Close time of ledger 0 (2025-06-15); each ledger closes 5 s after the previous.
pub(super) const CLOSE_TIME_BASE: u64 = 1_750_000_000;

/// Protocol version in the headers: v2 `LedgerCloseMeta` belongs to protocol 23.
pub(super) const PROTOCOL: u32 = 23;

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
pub(super) fn build(
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

pub(super) fn to_xdr(value: &impl WriteXdr) -> Vec<u8> {
    // Small fixed-shape values: writing fails only on limits, and there are none.
    value
        .to_xdr(Limits::none())
        .expect("a fixed-shape value serializes")
}

/// The filler's building blocks.
pub(super) struct FillerModel {
    pub(super) templates: Vec<[u8; RECORD]>,
    chunk: usize,
}

impl FillerModel {
    /// The model for chunks of `chunk` bytes: 256 templates at 256 KiB, fewer in smaller
    /// chunks (at least 4).
    pub(super) fn new(chunk: usize) -> Self {
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
    pub(super) fn fill(&self, threshold: u64, seed: u64, len: usize) -> Vec<u8> {
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
    pub(super) fn measure(&self, threshold: u64) -> f64 {
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
pub(super) fn threshold(p: f64) -> u64 {
    (p.clamp(0.0, 1.0) * (1u64 << 32) as f64).round() as u64
}

/// Calibration results per (target ratio bits, chunk): `(random fraction, measured)`.
type Calibrations = Vec<((u64, usize), f64, f64)>;

/// Calibrations done in this process.
static CALIBRATIONS: OnceLock<Mutex<Calibrations>> = OnceLock::new();

/// Returns `calibrate(model, target)`, cached for the process.
pub(super) fn calibrated(model: &FillerModel, target: f64) -> (f64, f64) {
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
pub(super) fn calibrate(model: &FillerModel, target: f64) -> (f64, f64) {
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
