//! Ledgers, keys and requests for the tests.

use std::path::PathBuf;

use base64::Engine;
use bytes::Bytes;
use stellar_xdr::{
    AccountId, ContractCodeEntry, ContractDataDurability, ContractDataEntry, ContractId, Hash,
    LedgerCloseMeta, LedgerCloseMetaV2, LedgerEntry, LedgerEntryChange, LedgerEntryData,
    LedgerHeader, LedgerHeaderHistoryEntry, LedgerKey, LedgerKeyAccount, Limits, PublicKey,
    ReadXdr, ScAddress, ScSymbol, ScVal, TransactionMeta, TransactionMetaV4,
    TransactionResultMetaV1, TtlEntry, Uint256, WriteXdr,
};

use ledger_relay_core_double::{Answer, CoreDouble, Ledger, Request, Settings};
use ledger_relay_wire::core_http::CorePort;

/// The testnet file: 320 ledgers of protocol 19.
pub fn testnet_path() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../testdata/testnet/testnet-1410048-1410367.lcm-v0.framed.xdr"
    ))
}

/// The standalone protocol-23 file: ledgers 84, 85 and 88.
pub fn standalone_path() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../testdata/standalone/load-test-ledgers-v23-standalone.xdr.zstd"
    ))
}

/// The first and last testnet ledgers.
pub const FIRST: u32 = 1410048;
/// The last.
pub const LAST: u32 = 1410367;

/// A double of the testnet ledgers with a window of `window`.
pub fn testnet(window: u32) -> CoreDouble {
    let settings = Settings {
        snapshot_ledgers: window,
        ..Settings::default()
    };
    CoreDouble::load(&testnet_path(), settings).unwrap()
}

/// 32 bytes from 64 hex digits.
pub fn hex32(hex: &str) -> [u8; 32] {
    let mut k = [0u8; 32];
    for (i, b) in k.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap();
    }
    k
}

/// The account key of a hex ed25519 public key.
pub fn account(hex: &str) -> LedgerKey {
    LedgerKey::Account(LedgerKeyAccount {
        account_id: AccountId(PublicKey::PublicKeyTypeEd25519(Uint256(hex32(hex)))),
    })
}

/// Base64 of a value's XDR.
pub fn b64(v: &impl WriteXdr) -> String {
    base64::engine::general_purpose::STANDARD.encode(v.to_xdr(Limits::none()).unwrap())
}

/// A form value escaped as Go's `url.QueryEscape` does (`+`, `/`, `=`).
pub fn escape(s: &str) -> String {
    s.replace('+', "%2B")
        .replace('/', "%2F")
        .replace('=', "%3D")
}

/// `key=K1&key=K2...` and `&ledgerSeq=N` when given.
pub fn form(keys: &[&LedgerKey], seq: Option<u32>) -> String {
    let mut parts: Vec<String> = keys
        .iter()
        .map(|k| format!("key={}", escape(&b64(*k))))
        .collect();
    if let Some(s) = seq {
        parts.push(format!("ledgerSeq={s}"));
    }
    parts.join("&")
}

/// `POST /getledgerentry` (or `path`) with `body` to the double.
pub fn query(d: &CoreDouble, path: &str, body: &str) -> Answer {
    d.answer_now(&Request {
        port: CorePort::Query,
        target: path.into(),
        body: Bytes::from(body.to_owned()),
    })
}

/// `GET target` on the command port.
pub fn command(d: &CoreDouble, target: &str) -> Answer {
    d.answer_now(&Request {
        port: CorePort::Command,
        target: target.into(),
        body: Bytes::new(),
    })
}

/// The `entries` of a 200 `/getledgerentry` answer, as JSON values.
pub fn entries(a: &Answer) -> Vec<serde_json::Value> {
    assert_eq!(a.status, 200, "{}", a.text());
    let v: serde_json::Value = serde_json::from_slice(&a.body).unwrap();
    v["entries"].as_array().cloned().unwrap_or_default()
}

/// The `LedgerEntry` of one element of `entries`.
pub fn entry_of(e: &serde_json::Value) -> LedgerEntry {
    let b = base64::engine::general_purpose::STANDARD
        .decode(e["entry"].as_str().unwrap())
        .unwrap();
    LedgerEntry::from_xdr(b, Limits::none()).unwrap()
}

/// A persistent or temporary contract-data entry named `name` holding `val`.
pub fn data(name: &str, durability: ContractDataDurability, val: u32, seq: u32) -> LedgerEntry {
    LedgerEntry {
        last_modified_ledger_seq: seq,
        data: LedgerEntryData::ContractData(ContractDataEntry {
            ext: Default::default(),
            contract: ScAddress::Contract(ContractId(Hash([7; 32]))),
            key: ScVal::Symbol(ScSymbol(name.try_into().unwrap())),
            durability,
            val: ScVal::U32(val),
        }),
        ext: Default::default(),
    }
}

/// A contract-code entry.
pub fn code(seq: u32) -> LedgerEntry {
    LedgerEntry {
        last_modified_ledger_seq: seq,
        data: LedgerEntryData::ContractCode(ContractCodeEntry {
            ext: Default::default(),
            hash: Hash([9; 32]),
            code: vec![0, 97, 115, 109].try_into().unwrap(),
        }),
        ext: Default::default(),
    }
}

/// The TTL entry of `entry`, live until `until`.
pub fn ttl(entry: &LedgerEntry, until: u32, seq: u32) -> LedgerEntry {
    let LedgerKey::Ttl(k) = ledger_relay_core_double::state::ttl_key(&entry.to_key()) else {
        unreachable!()
    };
    LedgerEntry {
        last_modified_ledger_seq: seq,
        data: LedgerEntryData::Ttl(TtlEntry {
            key_hash: k.key_hash,
            live_until_ledger_seq: until,
        }),
        ext: Default::default(),
    }
}

/// A protocol-23 ledger `seq` with one transaction whose meta holds `changes`, evicting
/// `evicted`.
pub fn ledger(seq: u32, changes: Vec<LedgerEntryChange>, evicted: Vec<LedgerKey>) -> Ledger {
    let tx = TransactionResultMetaV1 {
        tx_apply_processing: TransactionMeta::V4(TransactionMetaV4 {
            tx_changes_before: changes.try_into().unwrap(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let meta = LedgerCloseMeta::V2(LedgerCloseMetaV2 {
        ledger_header: LedgerHeaderHistoryEntry {
            hash: Hash([seq as u8; 32]),
            header: LedgerHeader {
                ledger_version: 23,
                ledger_seq: seq,
                base_fee: 100,
                ..Default::default()
            },
            ext: Default::default(),
        },
        tx_processing: vec![tx].try_into().unwrap(),
        evicted_keys: evicted.try_into().unwrap(),
        ..Default::default()
    });
    Ledger::decode(Bytes::from(meta.to_xdr(Limits::none()).unwrap())).unwrap()
}
