//! Ledger header peek: sequence, hashes and close time of a `LedgerCloseMeta` from its first
//! bytes, without decoding the ledger.
//!
//! A full XDR decode of a ledger runs at about 200 MB/s, too slow for the relay's hot path;
//! the header is what the relay needs (to order, deduplicate and chain-check ledgers) and it
//! sits near the front:
//!
//! ```text
//! LedgerCloseMeta   = u32 v (0, 1 or 2)
//!   v = 0: LedgerCloseMetaV0      { LedgerHeaderHistoryEntry ledgerHeader; ... }
//!   v = 1, 2: LedgerCloseMetaV1/2 { LedgerCloseMetaExt ext; LedgerHeaderHistoryEntry ledgerHeader; ... }
//!     LedgerCloseMetaExt = u32 v; v = 0: void
//!                                 v = 1: { ExtensionPoint ext (u32 0); int64 sorobanFeeWrite1KB }
//! LedgerHeaderHistoryEntry = { Hash hash; LedgerHeader header; ext }
//! ```
//!
//! [`peek_header`] walks the `LedgerHeader` field by field to find where its XDR ends, checks
//! every length and discriminant against the schema (stellar-xdr 30, protocol 23+), and then
//! checks `sha256(header XDR) == hash`. It never reads past [`MAX_HEADER_PEEK`] bytes.
//!
//! [`ChainVerifier`] checks that successive headers form a chain.

use sha2::{Digest, Sha256};

use crate::frame::LedgerEnd;

/// What [`peek_header`] learned about a ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LedgerHeaderInfo {
    /// The `LedgerCloseMeta` union discriminant: 0, 1 or 2.
    pub lcm_version: u32,
    /// `LedgerHeader.ledgerSeq`.
    pub ledger_seq: u32,
    /// The ledger's hash: `LedgerHeaderHistoryEntry.hash`, checked to equal the sha256 of the
    /// header's XDR.
    pub hash: [u8; 32],
    /// `LedgerHeader.previousLedgerHash`.
    pub previous_hash: [u8; 32],
    /// `LedgerHeader.ledgerVersion`: the protocol version the ledger closed under.
    pub protocol_version: u32,
    /// `LedgerHeader.scpValue.closeTime`, seconds since the Unix epoch.
    pub close_time: u64,
    /// `LedgerHeader.scpValue.txSetHash`: what the ledger's transaction set must hash to
    /// (checked by [`crate::content`]).
    pub tx_set_hash: [u8; 32],
    /// `LedgerHeader.txSetResultHash`: what the ledger's transaction results must hash to
    /// (checked by [`crate::content`]).
    pub tx_set_result_hash: [u8; 32],
    /// Offset in the `LedgerCloseMeta` just past the `LedgerHeader` XDR. The header's XDR,
    /// which `hash` is the sha256 of, runs from right after `hash` to here.
    pub header_end: usize,
}

// Sizes of XDR pieces, for the worst case of MAX_HEADER_PEEK.
const U32: usize = 4;
const U64: usize = 8;
const HASH: usize = 32;
/// `UpgradeType upgrades<6>`, where `UpgradeType = opaque<128>`.
const MAX_UPGRADES: u32 = 6;
const MAX_UPGRADE_LEN: u32 = 128;
/// `Signature = opaque<64>`.
const MAX_SIGNATURE_LEN: u32 = 64;
/// `LedgerCloseValueSignature { NodeID nodeID (PublicKey: u32 type + uint256); Signature }`.
const MAX_LC_VALUE_SIGNATURE: usize = (U32 + HASH) + (U32 + MAX_SIGNATURE_LEN as usize);
/// The largest arm of `StellarValue.ext` is `STELLAR_VALUE_EMPTY_TX_SET_MS`:
/// `{ closeTimeMs; txSetHash; previousLedgerHash; previousLedgerVersion; lcValueSignature }`.
const MAX_STELLAR_VALUE_EXT: usize = U32 + U64 + HASH + HASH + U32 + MAX_LC_VALUE_SIGNATURE;
const MAX_STELLAR_VALUE: usize = HASH
    + U64
    + U32
    + MAX_UPGRADES as usize * (U32 + MAX_UPGRADE_LEN as usize)
    + MAX_STELLAR_VALUE_EXT;
/// `LedgerHeader.ext` at its largest: v1 `{ u32 flags; ext (u32 0) }`.
const MAX_LEDGER_HEADER_EXT: usize = U32 + U32 + U32;
const MAX_LEDGER_HEADER: usize = U32 // ledgerVersion
    + HASH // previousLedgerHash
    + MAX_STELLAR_VALUE
    + HASH // txSetResultHash
    + HASH // bucketListHash
    + U32 // ledgerSeq
    + U64 // totalCoins
    + U64 // feePool
    + U32 // inflationSeq
    + U64 // idPool
    + U32 // baseFee
    + U32 // baseReserve
    + U32 // maxTxSetSize
    + 4 * HASH // skipList
    + MAX_LEDGER_HEADER_EXT;
/// The `LedgerCloseMeta` bytes before the `LedgerHeaderHistoryEntry` at their largest: the
/// union tag, then `LedgerCloseMetaExt` v1 `{ u32 1; ExtensionPoint (u32 0); int64 }`.
const MAX_PREFIX: usize = U32 + U32 + U32 + U64;

/// Bytes that always suffice for [`peek_header`] to answer: with this many bytes of a
/// `LedgerCloseMeta` (or all of it, if shorter) it returns `Ok(Some(_))` or an error, never
/// `Ok(None)`.
///
/// 1356 bytes: the worst case of every variable part, that is a `LedgerCloseMetaExt` v1, six
/// 128-byte upgrades, the largest `StellarValue.ext` arm with a 64-byte signature, and a
/// `LedgerHeader.ext` v1. Real headers are about 400 bytes.
pub const MAX_HEADER_PEEK: usize = MAX_PREFIX + HASH + MAX_LEDGER_HEADER;

/// What was wrong in a field, for [`HeaderError::Malformed`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Malformation {
    /// A union discriminant that the schema does not define.
    #[error("unknown discriminant {tag}")]
    UnknownDiscriminant {
        /// The discriminant read.
        tag: u32,
    },
    /// A variable-length field longer than its schema bound.
    #[error("length {len} exceeds the bound {max}")]
    TooLong {
        /// The length read.
        len: u32,
        /// The schema's bound.
        max: u32,
    },
    /// Padding after opaque data is not zero, which XDR forbids.
    #[error("non-zero padding")]
    NonZeroPadding,
    /// A bool (or an optional's presence flag) that is neither 0 nor 1.
    #[error("bool value {value} is neither 0 nor 1")]
    InvalidBool {
        /// The value read.
        value: u32,
    },
    /// Recursive types (such as `SCVal`) nested deeper than the bound.
    #[error("nested deeper than {max} levels")]
    TooDeep {
        /// The bound.
        max: u32,
    },
}

/// Why [`peek_header`] rejected a `LedgerCloseMeta`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HeaderError {
    /// The `LedgerCloseMeta` union discriminant is not 0, 1 or 2.
    #[error("unknown LedgerCloseMeta version {tag}")]
    UnknownVersion {
        /// The discriminant read.
        tag: u32,
    },
    /// A field of the header (or of what precedes it) breaks the XDR schema.
    #[error("malformed {field} at byte {offset}: {problem}")]
    Malformed {
        /// The field's XDR path, such as `scpValue.upgrades`.
        field: &'static str,
        /// Offset of the offending bytes in the `LedgerCloseMeta`.
        offset: usize,
        /// What is wrong with it.
        problem: Malformation,
    },
    /// The stored ledger hash is not the sha256 of the header's XDR.
    #[error("ledger {seq}: stored hash is not the sha256 of its header")]
    HashMismatch {
        /// The header's `ledgerSeq` (unverified, since the hash does not match).
        seq: u32,
    },
}

/// Internal result of a parse step: either more bytes are needed or the input is bad.
enum Stop {
    NeedMore,
    Bad(HeaderError),
}

impl From<HeaderError> for Stop {
    fn from(e: HeaderError) -> Self {
        Stop::Bad(e)
    }
}

/// A bounds-checked XDR reader over a prefix of a `LedgerCloseMeta`.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Stop> {
        let end = self.pos.checked_add(n).ok_or(Stop::NeedMore)?;
        let bytes = self.buf.get(self.pos..end).ok_or(Stop::NeedMore)?;
        self.pos = end;
        Ok(bytes)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], Stop> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn u32(&mut self) -> Result<u32, Stop> {
        self.array().map(u32::from_be_bytes)
    }

    fn u64(&mut self) -> Result<u64, Stop> {
        self.array().map(u64::from_be_bytes)
    }

    fn skip(&mut self, n: usize) -> Result<(), Stop> {
        self.take(n).map(drop)
    }

    fn malformed(&self, field: &'static str, offset: usize, problem: Malformation) -> Stop {
        Stop::Bad(HeaderError::Malformed {
            field,
            offset,
            problem,
        })
    }

    /// Reads a union discriminant and checks it is at most `max`.
    fn tag(&mut self, field: &'static str, max: u32) -> Result<u32, Stop> {
        let offset = self.pos;
        let tag = self.u32()?;
        if tag > max {
            return Err(self.malformed(field, offset, Malformation::UnknownDiscriminant { tag }));
        }
        Ok(tag)
    }

    /// Reads an XDR count or length and checks it is at most `max`.
    fn len(&mut self, field: &'static str, max: u32) -> Result<u32, Stop> {
        let offset = self.pos;
        let len = self.u32()?;
        if len > max {
            return Err(self.malformed(field, offset, Malformation::TooLong { len, max }));
        }
        Ok(len)
    }

    /// Skips variable-length opaque data of at most `max` bytes, checking its padding.
    fn opaque(&mut self, field: &'static str, max: u32) -> Result<(), Stop> {
        // `len <= max <= 128`, so the cast is lossless.
        let len = self.len(field, max)? as usize;
        self.skip(len)?;
        let offset = self.pos;
        let padding = self.take((4 - len % 4) % 4)?;
        if padding.iter().any(|&b| b != 0) {
            return Err(self.malformed(field, offset, Malformation::NonZeroPadding));
        }
        Ok(())
    }

    /// Skips a `LedgerCloseValueSignature { NodeID nodeID; Signature signature; }`.
    fn lc_value_signature(&mut self) -> Result<(), Stop> {
        // PublicKey: only PUBLIC_KEY_TYPE_ED25519 (0) exists.
        self.tag("lcValueSignature.nodeID", 0)?;
        self.skip(HASH)?;
        self.opaque("lcValueSignature.signature", MAX_SIGNATURE_LEN)
    }
}

/// Reads the header of a `LedgerCloseMeta` from its first bytes.
///
/// `lcm` may be the whole ledger or any prefix of it; [`MAX_HEADER_PEEK`] bytes always
/// suffice. Checks every discriminant and length up to the end of the `LedgerHeader`, then
/// that the stored hash is the sha256 of the header's XDR. Bytes after the header are not
/// looked at.
///
/// Ok(None): `lcm` is a valid prefix but too short to answer; give it more bytes.
pub fn peek_header(lcm: &[u8]) -> Result<Option<LedgerHeaderInfo>, HeaderError> {
    match parse(lcm) {
        Ok(info) => Ok(Some(info)),
        Err(Stop::NeedMore) => Ok(None),
        Err(Stop::Bad(e)) => Err(e),
    }
}

fn parse(lcm: &[u8]) -> Result<LedgerHeaderInfo, Stop> {
    let mut c = Cursor { buf: lcm, pos: 0 };
    let lcm_version = c.u32()?;
    match lcm_version {
        0 => {}
        1 | 2 => {
            // LedgerCloseMetaExt: v1 carries { ExtensionPoint ext; int64 sorobanFeeWrite1KB }.
            if c.tag("LedgerCloseMetaExt", 1)? == 1 {
                c.tag("LedgerCloseMetaExtV1.ext", 0)?;
                c.skip(U64)?;
            }
        }
        tag => return Err(HeaderError::UnknownVersion { tag }.into()),
    }
    let hash: [u8; 32] = c.array()?;
    let header_start = c.pos;

    // LedgerHeader
    let protocol_version = c.u32()?;
    let previous_hash: [u8; 32] = c.array()?;
    // StellarValue scpValue
    let tx_set_hash: [u8; 32] = c.array()?;
    let close_time = c.u64()?;
    let upgrades = c.len("scpValue.upgrades", MAX_UPGRADES)?;
    for _ in 0..upgrades {
        c.opaque("scpValue.upgrades[]", MAX_UPGRADE_LEN)?;
    }
    match c.tag("scpValue.ext", 4)? {
        // STELLAR_VALUE_BASIC
        0 => {}
        // STELLAR_VALUE_SIGNED
        1 => c.lc_value_signature()?,
        // STELLAR_VALUE_EMPTY_TX_SET: { txSetHash; previousLedgerHash; previousLedgerVersion; sig }
        2 => {
            c.skip(HASH + HASH + U32)?;
            c.lc_value_signature()?;
        }
        // STELLAR_VALUE_SIGNED_MS: { closeTimeMs; sig }
        3 => {
            c.skip(U64)?;
            c.lc_value_signature()?;
        }
        // STELLAR_VALUE_EMPTY_TX_SET_MS: { closeTimeMs; txSetHash; previousLedgerHash;
        // previousLedgerVersion; sig }
        _ => {
            c.skip(U64 + HASH + HASH + U32)?;
            c.lc_value_signature()?;
        }
    }
    let tx_set_result_hash: [u8; 32] = c.array()?;
    c.skip(HASH)?; // bucketListHash
    let ledger_seq = c.u32()?;
    // totalCoins, feePool, inflationSeq, idPool, baseFee, baseReserve, maxTxSetSize, skipList
    c.skip(U64 + U64 + U32 + U64 + U32 + U32 + U32 + 4 * HASH)?;
    if c.tag("LedgerHeader.ext", 1)? == 1 {
        c.skip(U32)?; // flags
        c.tag("LedgerHeaderExtensionV1.ext", 0)?;
    }
    let header_end = c.pos;

    let computed: [u8; 32] = Sha256::digest(&lcm[header_start..header_end]).into();
    if computed != hash {
        return Err(HeaderError::HashMismatch { seq: ledger_seq }.into());
    }
    Ok(LedgerHeaderInfo {
        lcm_version,
        ledger_seq,
        hash,
        previous_hash,
        protocol_version,
        close_time,
        tx_set_hash,
        tx_set_result_hash,
        header_end,
    })
}

/// Formats a 32-byte hash (a header, transaction-set or result hash) as 64 lowercase hex
/// digits: the one formatter every crate of the workspace uses for hashes in messages, logs,
/// lake keys and `--anchor` values.
///
/// ```
/// use ledger_relay_wire::Hex;
/// let mut h = [0u8; 32];
/// h[0] = 0xab;
/// assert!(Hex(&h).to_string().starts_with("ab00"));
/// assert_eq!(Hex(&h).to_string().len(), 64);
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Hex<'a>(pub &'a [u8; 32]);

impl std::fmt::Display for Hex<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

/// Parses a trusted ledger written `SEQ:HASH` (a sequence and the 64 hex digits of its header
/// hash): the one grammar of every anchor an operator gives (`ledger-subscribe --anchor`,
/// `ledger-relay --upstream-anchor`, the captive-core stand-in's `anchor`). On failure, the
/// reason in a few words.
///
/// ```
/// # use ledger_relay_wire::header::parse_anchor;
/// let (seq, hash) = parse_anchor(&format!("1410048:{}", "ab".repeat(32))).unwrap();
/// assert_eq!((seq, hash), (1_410_048, [0xab; 32]));
/// assert_eq!(parse_anchor("1410048"), Err("expected SEQ:HASH"));
/// ```
pub fn parse_anchor(s: &str) -> Result<(u32, [u8; 32]), &'static str> {
    let (seq, hex) = s.trim().split_once(':').ok_or("expected SEQ:HASH")?;
    let seq = match seq.parse::<u32>() {
        Ok(0) => return Err("ledger sequence 0 names no ledger"),
        Ok(seq) => seq,
        Err(_) => return Err("SEQ is not a ledger sequence"),
    };
    if hex.len() != 64 {
        return Err("HASH must be 64 hex digits");
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    };
    let mut hash = [0u8; 32];
    for (byte, pair) in hash.iter_mut().zip(hex.as_bytes().chunks(2)) {
        match (digit(pair[0]), digit(pair[1])) {
            (Some(hi), Some(lo)) => *byte = hi << 4 | lo,
            _ => return Err("HASH is not hex"),
        }
    }
    Ok((seq, hash))
}

/// Why [`ChainVerifier::check`] rejected a ledger.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ChainError {
    /// The ledger is not the one expected next (a gap, a repeat or a wrong start).
    #[error("expected ledger {expected}, got {got}")]
    UnexpectedSequence {
        /// The sequence number expected.
        expected: u32,
        /// The sequence number received.
        got: u32,
    },
    /// The ledger's previous-ledger hash is not the hash of the ledger before it.
    #[error(
        "ledger {seq} does not link to its predecessor: previous hash {}, expected {}",
        Hex(got_previous),
        Hex(expected_previous)
    )]
    BrokenChain {
        /// The sequence number of the ledger that does not link.
        seq: u32,
        /// The hash of the ledger before it.
        expected_previous: [u8; 32],
        /// The ledger's `previousLedgerHash`.
        got_previous: [u8; 32],
    },
    /// The previous ledger was number `u32::MAX`, so none can follow.
    #[error("no ledger can follow ledger {seq}")]
    SequenceExhausted {
        /// The last ledger's sequence number.
        seq: u32,
    },
}

/// Where the chain stands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Link {
    /// Nothing seen; any ledger may come first.
    #[default]
    Any,
    /// Nothing seen; the first ledger must be this one.
    First(u32),
    /// The last ledger accepted: the next must be `seq + 1` and link to `hash`.
    After { seq: u32, hash: [u8; 32] },
}

/// What the chain rule reads of a ledger: its sequence, its hash and the hash it links to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChainLink {
    /// The ledger's sequence.
    pub seq: u32,
    /// Its header hash.
    pub hash: [u8; 32],
    /// Its header's `previousLedgerHash`.
    pub previous_hash: [u8; 32],
}

impl From<&LedgerHeaderInfo> for ChainLink {
    fn from(info: &LedgerHeaderInfo) -> ChainLink {
        ChainLink {
            seq: info.ledger_seq,
            hash: info.hash,
            previous_hash: info.previous_hash,
        }
    }
}

impl From<&LedgerEnd> for ChainLink {
    fn from(end: &LedgerEnd) -> ChainLink {
        ChainLink {
            seq: end.seq,
            hash: end.header_hash,
            previous_hash: end.previous_hash,
        }
    }
}

/// Layer 4 of the integrity checks (`docs/architecture.md`, "Integrity in five layers"):
/// sequence is previous+1 (or the requested start), previousLedgerHash == previous ledger's
/// hash.
///
/// Feed it [`LedgerHeaderInfo`]s from [`peek_header`], whose hashes are already checked
/// against the headers. It is strict: a repeated ledger is an error, so deduplicate (core may
/// emit a ledger twice after a restart) before checking.
#[derive(Debug, Clone, Default)]
pub struct ChainVerifier {
    link: Link,
}

impl ChainVerifier {
    /// Returns a verifier that accepts any first ledger.
    pub fn new() -> Self {
        Self::default()
    }

    /// Returns a verifier whose first ledger must be `seq` (with any previous hash).
    pub fn starting_at(seq: u32) -> Self {
        Self {
            link: Link::First(seq),
        }
    }

    /// Returns a verifier resuming after ledger `seq` with hash `hash`: the next ledger must
    /// be `seq + 1` and link to `hash`.
    pub fn after(seq: u32, hash: [u8; 32]) -> Self {
        Self {
            link: Link::After { seq, hash },
        }
    }

    /// Checks that `info` is the next ledger of the chain and, if so, advances to it. On
    /// error the verifier is unchanged.
    pub fn check(&mut self, info: &LedgerHeaderInfo) -> Result<(), ChainError> {
        self.check_link(info.into())
    }

    /// [`check`](Self::check) for a ledger known by its place in the chain alone: an end record,
    /// a stored record, a lake's ledger.
    pub fn check_link(&mut self, link: ChainLink) -> Result<(), ChainError> {
        let got = link.seq;
        match self.link {
            Link::Any => {}
            Link::First(expected) => {
                if got != expected {
                    return Err(ChainError::UnexpectedSequence { expected, got });
                }
            }
            Link::After { seq, hash } => {
                let expected = seq
                    .checked_add(1)
                    .ok_or(ChainError::SequenceExhausted { seq })?;
                if got != expected {
                    return Err(ChainError::UnexpectedSequence { expected, got });
                }
                if link.previous_hash != hash {
                    return Err(ChainError::BrokenChain {
                        seq: got,
                        expected_previous: hash,
                        got_previous: link.previous_hash,
                    });
                }
            }
        }
        self.link = Link::After {
            seq: got,
            hash: link.hash,
        };
        Ok(())
    }

    /// Returns the sequence number and hash of the last ledger accepted (or given to
    /// [`after`](Self::after)), if any.
    pub fn last(&self) -> Option<(u32, [u8; 32])> {
        match self.link {
            Link::After { seq, hash } => Some((seq, hash)),
            Link::Any | Link::First(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stellar_xdr::{
        Hash, LedgerCloseMeta, LedgerCloseMetaExt, LedgerCloseMetaExtV1, LedgerCloseValueSignature,
        LedgerHeader, LedgerHeaderExt, LedgerHeaderExtensionV1, LedgerHeaderExtensionV1Ext, Limits,
        NodeId, PublicKey, ReadXdr, Signature, StellarValue, StellarValueExt,
        StellarValueProposedMsValue, StellarValueProposedValue, StellarValueSignedMsValue,
        TimePoint, TimePointMs, Uint256, UpgradeType, WriteXdr,
    };

    fn signature(len: usize) -> LedgerCloseValueSignature {
        LedgerCloseValueSignature {
            node_id: NodeId(PublicKey::PublicKeyTypeEd25519(Uint256([0x11; 32]))),
            signature: Signature(vec![0x22; len].try_into().unwrap()),
        }
    }

    fn header(
        seq: u32,
        previous: [u8; 32],
        ext: StellarValueExt,
        upgrades: &[usize],
    ) -> LedgerHeader {
        LedgerHeader {
            ledger_version: 23,
            previous_ledger_hash: Hash(previous),
            scp_value: StellarValue {
                tx_set_hash: Hash([3; 32]),
                close_time: TimePoint(1_700_000_000 + u64::from(seq)),
                upgrades: upgrades
                    .iter()
                    .map(|&n| UpgradeType(vec![0x33; n].try_into().unwrap()))
                    .collect::<Vec<_>>()
                    .try_into()
                    .unwrap(),
                ext,
            },
            tx_set_result_hash: Hash([4; 32]),
            bucket_list_hash: Hash([5; 32]),
            ledger_seq: seq,
            total_coins: 1_000_000_000_000_000_000,
            fee_pool: 7,
            inflation_seq: 8,
            id_pool: 9,
            base_fee: 100,
            base_reserve: 5_000_000,
            max_tx_set_size: 1000,
            skip_list: [Hash([6; 32]), Hash([7; 32]), Hash([8; 32]), Hash([9; 32])],
            ext: LedgerHeaderExt::V0,
        }
    }

    /// The bytes of a `LedgerCloseMeta` up to and including its `LedgerHeader`, with union
    /// tag `lcm_version` and, for v1 and v2, `ext`.
    fn lcm_prefix(lcm_version: u32, ext: Option<LedgerCloseMetaExt>, h: &LedgerHeader) -> Vec<u8> {
        let header_xdr = h.to_xdr(Limits::none()).unwrap();
        let mut out = lcm_version.to_be_bytes().to_vec();
        if let Some(ext) = ext {
            out.extend(ext.to_xdr(Limits::none()).unwrap());
        }
        out.extend_from_slice(&Sha256::digest(&header_xdr));
        out.extend(header_xdr);
        out
    }

    fn worst_case_header() -> LedgerHeader {
        let mut h = header(
            77,
            [1; 32],
            StellarValueExt::EmptyTxSetMs(StellarValueProposedMsValue {
                close_time_ms: TimePointMs(1_700_000_000_123),
                tx_set_hash: Hash([1; 32]),
                previous_ledger_hash: Hash([2; 32]),
                previous_ledger_version: 22,
                lc_value_signature: signature(64),
            }),
            &[128; 6],
        );
        h.ext = LedgerHeaderExt::V1(LedgerHeaderExtensionV1 {
            flags: 7,
            ext: LedgerHeaderExtensionV1Ext::V0,
        });
        h
    }

    fn ext_v1() -> Option<LedgerCloseMetaExt> {
        Some(LedgerCloseMetaExt::V1(LedgerCloseMetaExtV1 {
            ext: stellar_xdr::ExtensionPoint::V0,
            soroban_fee_write1_kb: 11424,
        }))
    }

    /// Checks a synthetic prefix: it answers exactly at its end and matches the header.
    fn check_prefix(bytes: &[u8], lcm_version: u32, h: &LedgerHeader) {
        let info = peek_header(bytes).unwrap().unwrap();
        assert_eq!(info.header_end, bytes.len());
        assert_eq!(info.lcm_version, lcm_version);
        assert_eq!(info.ledger_seq, h.ledger_seq);
        assert_eq!(info.previous_hash, h.previous_ledger_hash.0);
        assert_eq!(info.protocol_version, h.ledger_version);
        assert_eq!(info.close_time, h.scp_value.close_time.0);
        assert_eq!(info.tx_set_hash, h.scp_value.tx_set_hash.0);
        assert_eq!(info.tx_set_result_hash, h.tx_set_result_hash.0);
        assert_eq!(
            info.hash,
            <[u8; 32]>::from(Sha256::digest(h.to_xdr(Limits::none()).unwrap()))
        );
        for cut in 0..bytes.len() {
            assert_eq!(peek_header(&bytes[..cut]), Ok(None), "cut {cut}");
        }
        let mut longer = bytes.to_vec();
        longer.extend_from_slice(&[0xFF; 64]);
        assert_eq!(peek_header(&longer), Ok(Some(info)));
    }

    #[test]
    fn max_header_peek_is_the_worst_case() {
        assert_eq!(MAX_HEADER_PEEK, 1356);
        let h = worst_case_header();
        let bytes = lcm_prefix(2, ext_v1(), &h);
        assert_eq!(bytes.len(), MAX_HEADER_PEEK);
        check_prefix(&bytes, 2, &h);
    }

    #[test]
    fn every_stellar_value_ext_arm() {
        let arms = [
            StellarValueExt::Basic,
            StellarValueExt::Signed(signature(64)),
            StellarValueExt::Signed(signature(0)),
            StellarValueExt::Signed(signature(61)),
            StellarValueExt::EmptyTxSet(StellarValueProposedValue {
                tx_set_hash: Hash([1; 32]),
                previous_ledger_hash: Hash([2; 32]),
                previous_ledger_version: 22,
                lc_value_signature: signature(63),
            }),
            StellarValueExt::SignedMs(StellarValueSignedMsValue {
                close_time_ms: TimePointMs(5),
                lc_value_signature: signature(62),
            }),
        ];
        for (i, arm) in arms.into_iter().enumerate() {
            for upgrades in [&[][..], &[1], &[4, 5, 6, 7, 127, 128]] {
                let h = header(100 + i as u32, [i as u8; 32], arm.clone(), upgrades);
                check_prefix(&lcm_prefix(0, None, &h), 0, &h);
                check_prefix(&lcm_prefix(1, Some(LedgerCloseMetaExt::V0), &h), 1, &h);
                check_prefix(&lcm_prefix(2, ext_v1(), &h), 2, &h);
            }
        }
    }

    /// Offset of the `upgrades` count in a v0 prefix: tag, hash, version, previous, txSetHash,
    /// closeTime.
    const V0_UPGRADES: usize = 4 + 32 + 4 + 32 + 32 + 8;

    fn malformed(bytes: &[u8]) -> (&'static str, usize, Malformation) {
        match peek_header(bytes) {
            Err(HeaderError::Malformed {
                field,
                offset,
                problem,
            }) => (field, offset, problem),
            other => panic!("expected Malformed, got {other:?}"),
        }
    }

    #[test]
    fn rejects_schema_violations() {
        assert_eq!(
            peek_header(&[0, 0, 0, 3]),
            Err(HeaderError::UnknownVersion { tag: 3 })
        );
        assert_eq!(
            peek_header(&[0xFF, 0xFF, 0xFF, 0xFF, 0, 0]),
            Err(HeaderError::UnknownVersion { tag: u32::MAX })
        );
        assert_eq!(
            malformed(&[0, 0, 0, 1, 0, 0, 0, 2]),
            (
                "LedgerCloseMetaExt",
                4,
                Malformation::UnknownDiscriminant { tag: 2 }
            )
        );
        assert_eq!(
            malformed(&[0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 1]),
            (
                "LedgerCloseMetaExtV1.ext",
                8,
                Malformation::UnknownDiscriminant { tag: 1 }
            )
        );

        let h = header(5, [0; 32], StellarValueExt::Signed(signature(63)), &[3]);
        let good = lcm_prefix(0, None, &h);
        let patch = |at: usize, bytes: &[u8]| {
            let mut b = good.clone();
            b[at..at + bytes.len()].copy_from_slice(bytes);
            b
        };
        assert_eq!(
            malformed(&patch(V0_UPGRADES, &7u32.to_be_bytes())),
            (
                "scpValue.upgrades",
                V0_UPGRADES,
                Malformation::TooLong { len: 7, max: 6 }
            )
        );
        assert_eq!(
            malformed(&patch(V0_UPGRADES + 4, &129u32.to_be_bytes())),
            (
                "scpValue.upgrades[]",
                V0_UPGRADES + 4,
                Malformation::TooLong { len: 129, max: 128 }
            )
        );
        // Upgrade of 3 bytes: one byte of padding after it.
        assert_eq!(
            malformed(&patch(V0_UPGRADES + 4 + 4 + 3, &[1])),
            (
                "scpValue.upgrades[]",
                V0_UPGRADES + 11,
                Malformation::NonZeroPadding
            )
        );
        let ext = V0_UPGRADES + 12;
        assert_eq!(
            malformed(&patch(ext, &5u32.to_be_bytes())),
            (
                "scpValue.ext",
                ext,
                Malformation::UnknownDiscriminant { tag: 5 }
            )
        );
        assert_eq!(
            malformed(&patch(ext + 4, &1u32.to_be_bytes())),
            (
                "lcValueSignature.nodeID",
                ext + 4,
                Malformation::UnknownDiscriminant { tag: 1 }
            )
        );
        let sig = ext + 4 + 36;
        assert_eq!(
            malformed(&patch(sig, &65u32.to_be_bytes())),
            (
                "lcValueSignature.signature",
                sig,
                Malformation::TooLong { len: 65, max: 64 }
            )
        );
        assert_eq!(
            malformed(&patch(sig + 4 + 63, &[0x80])),
            (
                "lcValueSignature.signature",
                sig + 67,
                Malformation::NonZeroPadding
            )
        );
        let header_ext = good.len() - 4;
        assert_eq!(
            malformed(&patch(header_ext, &2u32.to_be_bytes())),
            (
                "LedgerHeader.ext",
                header_ext,
                Malformation::UnknownDiscriminant { tag: 2 }
            )
        );
        // A v1 header ext whose inner ext is not 0.
        let mut v1 = header(5, [0; 32], StellarValueExt::Basic, &[]);
        v1.ext = LedgerHeaderExt::V1(LedgerHeaderExtensionV1 {
            flags: 1,
            ext: LedgerHeaderExtensionV1Ext::V0,
        });
        let mut bad = lcm_prefix(0, None, &v1);
        let at = bad.len() - 4;
        bad[at..].copy_from_slice(&1u32.to_be_bytes());
        assert_eq!(
            malformed(&bad),
            (
                "LedgerHeaderExtensionV1.ext",
                at,
                Malformation::UnknownDiscriminant { tag: 1 }
            )
        );

        // An error is reported as soon as its bytes are in, not held back for more input.
        let bad = patch(V0_UPGRADES, &7u32.to_be_bytes());
        assert!(peek_header(&bad[..V0_UPGRADES + 4]).is_err());
        assert_eq!(peek_header(&bad[..V0_UPGRADES + 3]), Ok(None));
    }

    #[test]
    fn hash_mismatch() {
        let h = header(42, [0; 32], StellarValueExt::Basic, &[]);
        let good = lcm_prefix(1, Some(LedgerCloseMetaExt::V0), &h);
        let header_start = 8 + 32;
        // Any fixed-size byte of the header (or of the stored hash) flipped: the hash fails.
        for at in (8..header_start + 4).chain([header_start + 100, good.len() - 5]) {
            let mut bad = good.clone();
            bad[at] ^= 0x01;
            assert_eq!(
                peek_header(&bad),
                Err(HeaderError::HashMismatch { seq: 42 }),
                "at {at}"
            );
        }
    }

    #[test]
    fn error_messages() {
        let e = HeaderError::Malformed {
            field: "scpValue.upgrades",
            offset: 120,
            problem: Malformation::TooLong { len: 7, max: 6 },
        };
        assert_eq!(
            e.to_string(),
            "malformed scpValue.upgrades at byte 120: length 7 exceeds the bound 6"
        );
        let mut got_previous = [0; 32];
        got_previous[0] = 0xab;
        let e = ChainError::BrokenChain {
            seq: 9,
            expected_previous: [0x01; 32],
            got_previous,
        };
        assert_eq!(
            e.to_string(),
            format!(
                "ledger 9 does not link to its predecessor: previous hash ab{}, expected {}",
                "00".repeat(31),
                "01".repeat(32)
            )
        );
    }

    fn info(seq: u32, hash: u8, previous: u8) -> LedgerHeaderInfo {
        LedgerHeaderInfo {
            lcm_version: 0,
            ledger_seq: seq,
            hash: [hash; 32],
            previous_hash: [previous; 32],
            protocol_version: 19,
            close_time: 0,
            tx_set_hash: [0; 32],
            tx_set_result_hash: [0; 32],
            header_end: 0,
        }
    }

    #[test]
    fn chain_verifier() {
        let mut v = ChainVerifier::new();
        assert_eq!(v.last(), None);
        v.check(&info(10, 0xA, 0x9)).unwrap();
        assert_eq!(v.last(), Some((10, [0xA; 32])));
        v.check(&info(11, 0xB, 0xA)).unwrap();

        // A gap, a repeat, and a wrong link: each rejected, none advances.
        assert_eq!(
            v.check(&info(13, 0xD, 0xC)),
            Err(ChainError::UnexpectedSequence {
                expected: 12,
                got: 13
            })
        );
        assert_eq!(
            v.check(&info(11, 0xB, 0xA)),
            Err(ChainError::UnexpectedSequence {
                expected: 12,
                got: 11
            })
        );
        assert_eq!(
            v.check(&info(12, 0xC, 0xE)),
            Err(ChainError::BrokenChain {
                seq: 12,
                expected_previous: [0xB; 32],
                got_previous: [0xE; 32]
            })
        );
        assert_eq!(v.last(), Some((11, [0xB; 32])));
        v.check(&info(12, 0xC, 0xB)).unwrap();
        assert_eq!(v.last(), Some((12, [0xC; 32])));

        let mut v = ChainVerifier::starting_at(100);
        assert_eq!(
            v.check(&info(99, 1, 0)),
            Err(ChainError::UnexpectedSequence {
                expected: 100,
                got: 99
            })
        );
        assert_eq!(v.last(), None);
        v.check(&info(100, 1, 0)).unwrap();
        v.check(&info(101, 2, 1)).unwrap();

        let mut v = ChainVerifier::after(7, [7; 32]);
        assert_eq!(v.last(), Some((7, [7; 32])));
        assert!(matches!(
            v.check(&info(8, 8, 6)),
            Err(ChainError::BrokenChain { seq: 8, .. })
        ));
        v.check(&info(8, 8, 7)).unwrap();

        let mut v = ChainVerifier::after(u32::MAX, [0; 32]);
        assert_eq!(
            v.check(&info(0, 1, 0)),
            Err(ChainError::SequenceExhausted { seq: u32::MAX })
        );
    }

    #[test]
    fn an_end_record_is_checked_by_the_same_rule_as_a_header() {
        let end = |seq: u32, hash: u8, previous: u8| LedgerEnd {
            seq,
            chunk_count: 1,
            raw_len: 1,
            checksum: 0,
            header_hash: [hash; 32],
            previous_hash: [previous; 32],
            first_byte_ns: 0,
            last_byte_ns: 0,
        };
        assert_eq!(
            ChainLink::from(&end(8, 8, 7)),
            ChainLink::from(&info(8, 8, 7))
        );
        let mut v = ChainVerifier::after(7, [7; 32]);
        assert!(matches!(
            v.check_link((&end(8, 8, 6)).into()),
            Err(ChainError::BrokenChain { seq: 8, .. })
        ));
        assert!(matches!(
            v.check_link((&end(9, 9, 8)).into()),
            Err(ChainError::UnexpectedSequence {
                expected: 8,
                got: 9
            })
        ));
        v.check_link((&end(8, 8, 7)).into()).unwrap();
        assert_eq!(v.last(), Some((8, [8; 32])));
    }

    #[test]
    fn real_testnet_ledger_every_prefix() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../testdata/testnet/testnet-1410048-1410367.lcm-v0.framed.xdr"
        );
        let stream = std::fs::read(path).unwrap();
        let mut records = crate::record::RecordReader::new(crate::record::DEFAULT_MAX_RECORD_LEN);
        records.feed(&stream).unwrap();
        let lcm = records.next_record().unwrap();
        let info = peek_header(&lcm).unwrap().unwrap();
        assert_eq!(info.ledger_seq, 1410048);
        let upto = MAX_HEADER_PEEK.min(lcm.len());
        for cut in 0..=upto {
            match peek_header(&lcm[..cut]) {
                Ok(None) => assert!(cut < info.header_end, "cut {cut}"),
                Ok(Some(got)) => assert_eq!(got, info, "cut {cut}"),
                Err(e) => panic!("cut {cut}: {e}"),
            }
        }
        let full = LedgerCloseMeta::from_xdr(&lcm, Limits::none()).unwrap();
        let LedgerCloseMeta::V0(v0) = full else {
            panic!("testnet sample is v0");
        };
        assert_eq!(
            v0.ledger_header.header.to_xdr(Limits::none()).unwrap(),
            lcm[4 + 32..info.header_end]
        );
    }
}
