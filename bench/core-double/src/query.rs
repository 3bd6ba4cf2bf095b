//! The query port: `POST /getledgerentry` and `POST /getledgerentryraw`, with core's checks in
//! core's order and its answers byte for byte (compact JSON, keys sorted, a trailing newline).

use std::collections::{BTreeSet, HashSet};

use serde::Serialize;
use stellar_xdr::LedgerKey;

use crate::answer::{self, Answer};
use crate::double::Book;
use crate::form::{params, values, xdr_from_base64};
use crate::state::{Found, Value};

/// One element of `/getledgerentry`'s `entries`.
#[derive(Serialize)]
struct EntryJson<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    entry: Option<&'a str>,
    #[serde(rename = "liveUntilLedgerSeq", skip_serializing_if = "Option::is_none")]
    live_until: Option<u32>,
    state: &'static str,
}

/// One element of `/getledgerentryraw`'s `entries`.
#[derive(Serialize)]
struct RawJson<'a> {
    entry: &'a str,
}

/// The whole answer; `entries` is left out when empty (core's raw answer with nothing found).
#[derive(Serialize)]
struct Entries<T> {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    entries: Vec<T>,
    #[serde(rename = "ledgerSeq")]
    ledger_seq: u32,
}

/// `serde_json` of `value` and a newline, as jsoncpp's `FastWriter` writes.
fn fast_writer<T: Serialize>(value: &T) -> Answer {
    // Structs of strings and integers always serialize.
    let mut body = serde_json::to_vec(value).expect("plain JSON serializes");
    body.push(b'\n');
    Answer::json(body)
}

/// The form's `ledgerSeq`: absent, one `u32`, or core's error.
fn ledger_seq(form: &[(Vec<u8>, Vec<u8>)]) -> Result<Option<u32>, Answer> {
    match values(form, "ledgerSeq").as_slice() {
        [] => Ok(None),
        [one] => std::str::from_utf8(one)
            .ok()
            .and_then(|s| s.parse::<u32>().ok())
            .map(Some)
            .ok_or_else(|| Answer::not_found(answer::SEQ_UNPARSED)),
        _ => Err(Answer::not_found(answer::SEQ_TWICE)),
    }
}

/// Decodes every `key` of the form, in order; the first undecodable one is core's exception.
fn keys(form: &[(Vec<u8>, Vec<u8>)]) -> Result<Vec<LedgerKey>, Answer> {
    values(form, "key")
        .into_iter()
        .map(|k| {
            xdr_from_base64::<LedgerKey>(k)
                .map_err(|e| Answer::not_found(format!("exception: {e}")))
        })
        .collect()
}

/// The ledger an answer is for: the one asked for if the double holds its snapshot, else the
/// last closed one if none was asked for.
fn snapshot(book: &Book, asked: Option<u32>) -> Result<u32, Answer> {
    match asked.or(book.lcl_seq()) {
        Some(seq) if book.holds(seq) => Ok(seq),
        _ => Err(Answer::not_found(answer::LEDGER_NOT_FOUND)),
    }
}

/// `POST /getledgerentry` with the URL-decoded form `decoded`.
pub fn get_ledger_entry(book: &Book, decoded: &[u8]) -> Answer {
    match ledger_entries(book, decoded) {
        Ok(a) | Err(a) => a,
    }
}

fn ledger_entries(book: &Book, decoded: &[u8]) -> Result<Answer, Answer> {
    let form = params(decoded);
    let asked = ledger_seq(&form)?;
    if values(&form, "key").is_empty() {
        return Err(Answer::not_found(answer::NO_KEY));
    }
    let keys = keys(&form)?;
    let mut seen = HashSet::new();
    for k in &keys {
        if matches!(k, LedgerKey::Ttl(_)) {
            return Err(Answer::not_found(answer::TTL_KEYS));
        }
        if !seen.insert(k) {
            return Err(Answer::not_found(answer::DUPLICATE_KEYS));
        }
    }
    let seq = snapshot(book, asked)?;
    let found: Vec<Found> = keys.iter().map(|k| book.state.lookup(k, seq)).collect();
    let entries = found.iter().map(entry_json).collect();
    Ok(fast_writer(&Entries {
        entries,
        ledger_seq: seq,
    }))
}

fn entry_json(found: &Found) -> EntryJson<'_> {
    match found {
        Found::Live { stored, live_until } => EntryJson {
            entry: Some(&stored.base64),
            live_until: *live_until,
            state: "live",
        },
        Found::Archived(stored) => EntryJson {
            entry: Some(&stored.base64),
            live_until: Some(0),
            state: "archived",
        },
        Found::NotFound => EntryJson {
            entry: None,
            live_until: None,
            state: "not-found",
        },
    }
}

/// `POST /getledgerentryraw` with the URL-decoded form `decoded`: the live entries among the
/// keys (TTL keys and repeats allowed), in key order.
pub fn get_ledger_entry_raw(book: &Book, decoded: &[u8]) -> Answer {
    let form = params(decoded);
    let found = ledger_seq(&form).and_then(|asked| {
        if values(&form, "key").is_empty() {
            return Err(Answer::not_found(answer::NO_KEY_RAW));
        }
        let keys: BTreeSet<LedgerKey> = keys(&form)?.into_iter().collect();
        Ok((keys, snapshot(book, asked)?))
    });
    let (keys, seq) = match found {
        Ok(f) => f,
        Err(a) => return a,
    };
    let entries = keys
        .iter()
        .filter_map(|k| match book.state.at(k, seq) {
            Some(Value::Live(s)) => Some(RawJson { entry: &s.base64 }),
            _ => None,
        })
        .collect();
    fast_writer(&Entries {
        entries,
        ledger_seq: seq,
    })
}
