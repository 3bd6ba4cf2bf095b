//! The command port: `/tx` classifies envelopes as core's queue would answer them, `/info`
//! reports the last closed ledger in core's styled JSON.

use base64::Engine;
use stellar_xdr::{
    FeeBumpTransaction, FeeBumpTransactionEnvelope, FeeBumpTransactionInnerTx, Limits, Operation,
    ReadXdr, Transaction, TransactionEnvelope, TransactionResult, TransactionResultResult,
    TransactionV1Envelope,
};

use ledger_relay_core_double::answer;

use crate::support::{b64, command, escape, testnet, FIRST};

fn envelope(fee: u32, ops: usize) -> TransactionV1Envelope {
    TransactionV1Envelope {
        tx: Transaction {
            fee,
            operations: vec![Operation::default(); ops].try_into().unwrap(),
            ..Default::default()
        },
        signatures: Default::default(),
    }
}

fn tx(e: &TransactionEnvelope) -> String {
    format!("/tx?blob={}", escape(&b64(e)))
}

#[test]
fn a_new_envelope_is_pending_and_the_same_again_a_duplicate() {
    let d = testnet(4);
    d.close_next();
    let e = TransactionEnvelope::Tx(envelope(200, 2));
    let first = command(&d, &tx(&e));
    assert_eq!(
        (first.status, first.content_type),
        (200, "application/json")
    );
    assert_eq!(first.text(), "{\"status\":\"PENDING\"}\n");
    assert_eq!(command(&d, &tx(&e)).text(), "{\"status\":\"DUPLICATE\"}\n");
    let other = TransactionEnvelope::Tx(envelope(201, 2));
    assert_eq!(
        command(&d, &tx(&other)).text(),
        "{\"status\":\"PENDING\"}\n"
    );
}

/// The `TransactionResult` of an `ERROR` answer.
fn error_result(text: &str) -> TransactionResult {
    let v: serde_json::Value = serde_json::from_str(text).unwrap();
    assert_eq!(v["status"], "ERROR", "{text}");
    assert!(text.starts_with("{\"error\":\"") && text.ends_with("\",\"status\":\"ERROR\"}\n"));
    let xdr = base64::engine::general_purpose::STANDARD
        .decode(v["error"].as_str().unwrap())
        .unwrap();
    TransactionResult::from_xdr(xdr, Limits::none()).unwrap()
}

#[test]
fn a_fee_under_the_base_fee_per_operation_is_an_error_with_its_result() {
    let d = testnet(4);
    d.close_next();
    let low = command(&d, &tx(&TransactionEnvelope::Tx(envelope(199, 2))));
    let r = error_result(&low.text());
    assert_eq!(r.result, TransactionResultResult::TxInsufficientFee);
    assert_eq!(r.fee_charged, 199);
    // Refused, so not remembered: the same envelope with enough fee is new.
    let ok = command(&d, &tx(&TransactionEnvelope::Tx(envelope(200, 2))));
    assert_eq!(ok.text(), "{\"status\":\"PENDING\"}\n");
    // A fee bump pays for one operation more.
    let bump = |fee| {
        TransactionEnvelope::TxFeeBump(FeeBumpTransactionEnvelope {
            tx: FeeBumpTransaction {
                fee,
                inner_tx: FeeBumpTransactionInnerTx::Tx(envelope(100, 1)),
                fee_source: Default::default(),
                ext: Default::default(),
            },
            signatures: Default::default(),
        })
    };
    assert_eq!(
        error_result(&command(&d, &tx(&bump(199))).text()).fee_charged,
        199
    );
    assert_eq!(
        command(&d, &tx(&bump(200))).text(),
        "{\"status\":\"PENDING\"}\n"
    );
}

#[test]
fn a_missing_or_undecodable_blob_is_cores_exception() {
    let d = testnet(4);
    d.close_next();
    for target in ["/tx", "/tx?blob=", "/tx?other=1"] {
        let a = command(&d, target);
        assert_eq!(
            (a.status, a.text().as_str()),
            (200, answer::NO_BLOB),
            "{target}"
        );
    }
    let bad = command(&d, "/tx?blob=AAAAAAAA");
    assert_eq!(bad.status, 200);
    let v: serde_json::Value = serde_json::from_slice(&bad.body).unwrap();
    assert!(
        v["exception"].as_str().is_some_and(|e| !e.is_empty()),
        "{}",
        bad.text()
    );
    assert!(bad.text().starts_with("{\"exception\": \""));
}

#[test]
fn before_the_first_ledger_core_is_booting() {
    let d = testnet(4);
    for target in ["/info", "/tx?blob=AAAA"] {
        let a = command(&d, target);
        assert_eq!((a.status, a.text().as_str()), (200, answer::BOOTING));
    }
    let unknown = command(&d, "/upgrades?mode=get");
    assert_eq!((unknown.status, unknown.content_type), (404, "text/html"));
    assert_eq!(unknown.text(), answer::COMMAND_NOT_FOUND);
}

#[test]
fn info_reports_the_last_closed_ledger_in_cores_shape() {
    let d = testnet(4);
    d.close_through(FIRST + 2);
    let a = command(&d, "/info");
    assert_eq!((a.status, a.content_type), (200, "application/json"));
    let text = a.text();
    assert!(
        text.starts_with("{\n   \"info\" : {\n      \"build\" : \"ledger-core-double "),
        "{text}"
    );
    assert!(text.ends_with("\n   }\n}\n"), "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let info = &v["info"];
    assert_eq!(info["ledger"]["num"], FIRST + 2);
    assert_eq!(info["ledger"]["version"], 19);
    assert_eq!(info["ledger"]["baseFee"], 100);
    assert_eq!(info["ledger"]["hash"].as_str().unwrap().len(), 64);
    assert_eq!(info["protocol_version"], 19);
    assert_eq!(info["network"], "Test SDF Network ; September 2015");
    assert_eq!(info["state"], "Synced!");
    let h = d.ledgers()[2].header();
    assert_eq!(info["ledger"]["closeTime"], h.header.scp_value.close_time.0);
}
