//! The stored values: keys, the checksummed seal around every value, ledger records and the
//! identity of chunk parts (see the storage layout in the [module doc](super)).

use ledger_relay_wire::checksum;
use ledger_relay_wire::frame::LedgerEnd;

pub(super) const META_FORMAT: &[u8] = b"mformat";
pub(super) const META_EPOCH: &[u8] = b"mepoch";
pub(super) const META_NETWORK: &[u8] = b"mnetwork";
pub(super) const RECORD_PREFIX: u8 = b'l';
pub(super) const CHUNK_PREFIX: u8 = b'c';

/// `LedgerEnd` fields (104) + parts (4) + stored bytes (8).
pub(super) const RECORD_BODY_LEN: usize = 104 + 4 + 8;
pub(super) const SEAL_LEN: usize = 8;
pub(super) const PART_START: u8 = 0;
pub(super) const PART_CONTINUE: u8 = 1;
/// seq + part + kind.
pub(super) const PART_ID_LEN: usize = 4 + 4 + 1;
/// index + codec + raw offset + raw length + payload length.
pub(super) const CHUNK_HEADER_LEN: usize = 4 + 1 + 8 + 4 + 4;

/// A ledger record as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Record {
    pub(super) end: LedgerEnd,
    pub(super) parts: u32,
    pub(super) bytes: u64,
}

pub(super) fn record_key(seq: u32) -> [u8; 5] {
    let mut k = [0u8; 5];
    k[0] = RECORD_PREFIX;
    k[1..].copy_from_slice(&seq.to_be_bytes());
    k
}

pub(super) fn record_seq(key: &[u8]) -> Option<u32> {
    match key {
        [RECORD_PREFIX, rest @ ..] if rest.len() == 4 => Some(be_u32(rest)),
        _ => None,
    }
}

pub(super) fn part_key(seq: u32, part: u32) -> [u8; 9] {
    let mut k = [0u8; 9];
    k[0] = CHUNK_PREFIX;
    k[1..5].copy_from_slice(&seq.to_be_bytes());
    k[5..].copy_from_slice(&part.to_be_bytes());
    k
}

pub(super) fn put_part_id(b: &mut Vec<u8>, seq: u32, part: u32, kind: u8) {
    b.extend_from_slice(&seq.to_be_bytes());
    b.extend_from_slice(&part.to_be_bytes());
    b.push(kind);
}

/// A value: `xxh3-64(body)` followed by the body `fill` writes.
pub(super) fn seal(fill: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut v = vec![0u8; SEAL_LEN];
    fill(&mut v);
    let sum = checksum(&v[SEAL_LEN..]);
    v[..SEAL_LEN].copy_from_slice(&sum.to_be_bytes());
    v
}

/// The body of a value whose checksum holds.
pub(super) fn unseal(v: &[u8]) -> Option<&[u8]> {
    if v.len() < SEAL_LEN {
        return None;
    }
    let (sum, body) = v.split_at(SEAL_LEN);
    (be_u64(sum) == checksum(body)).then_some(body)
}

pub(super) fn encode_record(r: &Record) -> Vec<u8> {
    let e = &r.end;
    seal(|b| {
        b.extend_from_slice(&e.seq.to_be_bytes());
        b.extend_from_slice(&e.chunk_count.to_be_bytes());
        b.extend_from_slice(&e.raw_len.to_be_bytes());
        b.extend_from_slice(&e.checksum.to_be_bytes());
        b.extend_from_slice(&e.header_hash);
        b.extend_from_slice(&e.previous_hash);
        b.extend_from_slice(&e.first_byte_ns.to_be_bytes());
        b.extend_from_slice(&e.last_byte_ns.to_be_bytes());
        b.extend_from_slice(&r.parts.to_be_bytes());
        b.extend_from_slice(&r.bytes.to_be_bytes());
    })
}

pub(super) fn decode_record(seq: u32, v: &[u8]) -> Result<Record, String> {
    let b = unseal(v).ok_or("record fails its checksum")?;
    if b.len() != RECORD_BODY_LEN {
        return Err(format!(
            "record of {} bytes, expected {RECORD_BODY_LEN}",
            b.len()
        ));
    }
    let hash = |at: usize| -> [u8; 32] {
        let mut h = [0u8; 32];
        h.copy_from_slice(&b[at..at + 32]);
        h
    };
    let end = LedgerEnd {
        seq: be_u32(&b[0..4]),
        chunk_count: be_u32(&b[4..8]),
        raw_len: be_u64(&b[8..16]),
        checksum: be_u64(&b[16..24]),
        header_hash: hash(24),
        previous_hash: hash(56),
        first_byte_ns: be_u64(&b[88..96]),
        last_byte_ns: be_u64(&b[96..104]),
    };
    if end.seq != seq {
        return Err(format!(
            "record for ledger {} stored under ledger {seq}",
            end.seq
        ));
    }
    Ok(Record {
        end,
        parts: be_u32(&b[104..108]),
        bytes: be_u64(&b[108..116]),
    })
}

/// Callers pass exactly 4 bytes.
pub(super) fn be_u32(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[..4]);
    u32::from_be_bytes(a)
}

/// Callers pass exactly 8 bytes.
pub(super) fn be_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}
