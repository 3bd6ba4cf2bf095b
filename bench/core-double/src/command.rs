//! The command port: `GET /tx?blob=` and `GET /info`, answered as core answers them (always
//! 200 `application/json`; see the crate doc for what the double decides differently).

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::SystemTime;

use base64::Engine;
use sha2::{Digest, Sha256};
use stellar_xdr::{
    FeeBumpTransactionInnerTx, Limits, TransactionEnvelope, TransactionExt, TransactionResult,
    TransactionResultExt, TransactionResultResult, WriteXdr,
};

use crate::answer::{self, Answer};
use crate::double::Book;
use crate::form::{params, values, xdr_from_base64};

/// The envelopes `/tx` has accepted (sha256 of their XDR): a second submission is `DUPLICATE`.
pub type Seen = Mutex<HashSet<[u8; 32]>>;

/// `GET /tx` with the URL-decoded query string `query`: `PENDING` for a new envelope,
/// `DUPLICATE` for one accepted before, `ERROR` with a `txINSUFFICIENT_FEE` result when its
/// inclusion fee is under the last closed ledger's base fee per operation, core's exception
/// JSON for a missing or undecodable blob.
pub fn tx(book: &Book, seen: &Seen, query: &[u8]) -> Answer {
    let Some(header) = book.lcl_header() else {
        return Answer::json(answer::BOOTING);
    };
    let form = params(query);
    // Core keeps the last value of a repeated parameter.
    let Some(blob) = values(&form, "blob").pop() else {
        return Answer::json(answer::NO_BLOB);
    };
    let envelope = match xdr_from_base64::<TransactionEnvelope>(blob) {
        Ok(e) => e,
        Err(e) => return Answer::json(format!(r#"{{"exception": "{e}"}}"#)),
    };
    let (fee, inclusion_fee, ops) = fees(&envelope);
    if inclusion_fee < i64::from(header.header.base_fee) * ops {
        return insufficient_fee(fee);
    }
    // Encoding a decoded envelope again cannot fail: there is no limit.
    let xdr = envelope
        .to_xdr(Limits::none())
        .expect("a decoded envelope encodes");
    let new = seen
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(Sha256::digest(xdr).into());
    let status = if new { "PENDING" } else { "DUPLICATE" };
    Answer::json(format!("{{\"status\":\"{status}\"}}\n"))
}

/// The full fee an envelope offers, its inclusion fee (without a Soroban resource fee) and the
/// operations it pays for (a fee bump pays for one more).
fn fees(envelope: &TransactionEnvelope) -> (i64, i64, i64) {
    let len = |n: usize| n as i64;
    match envelope {
        TransactionEnvelope::TxV0(e) => {
            let fee = i64::from(e.tx.fee);
            (fee, fee, len(e.tx.operations.len()))
        }
        TransactionEnvelope::Tx(e) => {
            let fee = i64::from(e.tx.fee);
            (
                fee,
                fee - resource_fee(&e.tx.ext),
                len(e.tx.operations.len()),
            )
        }
        TransactionEnvelope::TxFeeBump(e) => {
            let FeeBumpTransactionInnerTx::Tx(inner) = &e.tx.inner_tx;
            let ops = len(inner.tx.operations.len()) + 1;
            (e.tx.fee, e.tx.fee - resource_fee(&inner.tx.ext), ops)
        }
    }
}

fn resource_fee(ext: &TransactionExt) -> i64 {
    match ext {
        TransactionExt::V0 => 0,
        TransactionExt::V1(data) => data.resource_fee,
    }
}

/// `{"error":"<base64 TransactionResult>","status":"ERROR"}`: `txINSUFFICIENT_FEE`, the fee
/// offered as `feeCharged` (core's validation result charges the full fee).
fn insufficient_fee(fee: i64) -> Answer {
    let result = TransactionResult {
        fee_charged: fee,
        result: TransactionResultResult::TxInsufficientFee,
        ext: TransactionResultExt::V0,
    };
    // A result of fixed shape encodes.
    let xdr = result.to_xdr(Limits::none()).expect("a result encodes");
    let b64 = base64::engine::general_purpose::STANDARD.encode(xdr);
    Answer::json(format!("{{\"error\":\"{b64}\",\"status\":\"ERROR\"}}\n"))
}

/// What `/info` reports besides the last closed ledger.
#[derive(Debug, Clone)]
pub struct InfoFacts {
    /// `build`.
    pub build: String,
    /// `network`: the network passphrase.
    pub network: String,
    /// `startedOn`.
    pub started: SystemTime,
}

/// `GET /info`: core's shape (jsoncpp's styled writer: keys sorted, three-space indent) with
/// the last closed ledger, its protocol, and `"state" : "Synced!"`.
pub fn info(book: &Book, facts: &InfoFacts) -> Answer {
    let (Some(h), Some(closed)) = (book.lcl_header(), book.lcl_closed_at()) else {
        return Answer::json(answer::BOOTING);
    };
    let hdr = &h.header;
    let hash: String = h.hash.0.iter().map(|b| format!("{b:02x}")).collect();
    let ledger = Styled::Obj(vec![
        ("age", Styled::Num(closed.elapsed().as_secs())),
        ("baseFee", Styled::Num(hdr.base_fee.into())),
        ("baseReserve", Styled::Num(hdr.base_reserve.into())),
        ("closeTime", Styled::Num(hdr.scp_value.close_time.0)),
        ("hash", Styled::Str(hash)),
        ("maxTxSetSize", Styled::Num(hdr.max_tx_set_size.into())),
        ("num", Styled::Num(hdr.ledger_seq.into())),
        ("version", Styled::Num(hdr.ledger_version.into())),
    ]);
    let peers = Styled::Obj(vec![
        ("authenticated_count", Styled::Num(0)),
        ("pending_count", Styled::Num(0)),
    ]);
    let started = humantime::format_rfc3339_seconds(facts.started).to_string();
    let info = Styled::Obj(vec![
        ("build", Styled::Str(facts.build.clone())),
        ("ledger", ledger),
        ("network", Styled::Str(facts.network.clone())),
        ("peers", peers),
        ("protocol_version", Styled::Num(hdr.ledger_version.into())),
        ("startedOn", Styled::Str(started)),
        ("state", Styled::Str("Synced!".into())),
    ]);
    let mut body = String::new();
    Styled::Obj(vec![("info", info)]).write(0, &mut body);
    body.push('\n');
    Answer::json(body)
}

/// A JSON value written as jsoncpp's `StyledWriter` writes it (objects only hold keys in the
/// order given, which callers keep sorted).
enum Styled {
    Num(u64),
    Str(String),
    Obj(Vec<(&'static str, Styled)>),
}

impl Styled {
    fn write(&self, indent: usize, out: &mut String) {
        match self {
            Styled::Num(n) => out.push_str(&n.to_string()),
            Styled::Str(s) => out.push_str(&serde_json::Value::from(s.as_str()).to_string()),
            Styled::Obj(fields) => {
                out.push_str("{\n");
                for (i, (key, value)) in fields.iter().enumerate() {
                    out.push_str(&" ".repeat(indent + 3));
                    out.push_str(&format!("\"{key}\" : "));
                    value.write(indent + 3, out);
                    out.push_str(if i + 1 < fields.len() { ",\n" } else { "\n" });
                }
                out.push_str(&" ".repeat(indent));
                out.push('}');
            }
        }
    }
}
