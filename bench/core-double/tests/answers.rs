//! The query port's answers byte for byte: core's error texts and the order of its checks,
//! entries in request order, and `/getledgerentryraw`.

use stellar_xdr::ContractDataDurability::Persistent;

use ledger_relay_core_double::answer;

use crate::support::{account, b64, data, entries, escape, form, query, testnet, ttl, FIRST};

const A: &str = "644f51e502775e0ec67b4922b8ded549649f50c3df4e38543abe1894f3be834d";
const B: &str = "31eb410398b021cc9604256bea24f664090b4322894c226e496ec9c935901331";

fn not_found(a: &ledger_relay_core_double::Answer, text: &str) {
    assert_eq!(
        (a.status, a.content_type, a.text().as_str()),
        (404, "text/html", text)
    );
}

#[test]
fn core_error_texts_in_core_order() {
    let d = testnet(4);
    d.close_through(FIRST + 5);
    let (a, b) = (account(A), account(B));
    let ttl_key = ttl(&data("x", Persistent, 0, 0), 9, 0).to_key();
    let q = |body: &str| query(&d, "/getledgerentry", body);
    not_found(&q(""), answer::NO_KEY);
    not_found(&q(&format!("ledgerSeq={FIRST}")), answer::NO_KEY);
    // ledgerSeq is checked before the keys.
    not_found(&q("ledgerSeq=x"), answer::SEQ_UNPARSED);
    not_found(&q("ledgerSeq=12x&key=AAAA"), answer::SEQ_UNPARSED);
    not_found(&q("ledgerSeq=1&ledgerSeq=2"), answer::SEQ_TWICE);
    not_found(&q(&form(&[&ttl_key], None)), answer::TTL_KEYS);
    // The first failing key decides: a TTL key before a repeat, a repeat before the window.
    not_found(&q(&form(&[&ttl_key, &a, &a], None)), answer::TTL_KEYS);
    not_found(
        &q(&form(&[&a, &b, &a, &ttl_key], None)),
        answer::DUPLICATE_KEYS,
    );
    not_found(&q(&form(&[&a, &a], Some(1))), answer::DUPLICATE_KEYS);
    let bad = q("key=AAAAAAAA");
    assert_eq!((bad.status, bad.content_type), (404, "text/html"));
    assert!(bad.text().starts_with("exception: "), "{}", bad.text());
    not_found(&q(&form(&[&a], Some(FIRST + 6))), answer::LEDGER_NOT_FOUND);
    not_found(&query(&d, "/getledgerentry/", ""), answer::QUERY_NOT_FOUND);
    not_found(&query(&d, "/info", ""), answer::QUERY_NOT_FOUND);
    let escape = query(&d, "/getledgerentry", "key=%zz");
    assert_eq!(
        (escape.status, escape.text()),
        (400, answer::BAD_REQUEST.into())
    );
}

#[test]
fn one_entry_per_key_in_request_order() {
    let d = testnet(4);
    d.close_through(FIRST + 5);
    let (a, b) = (account(A), account(B));
    let missing = account(&"ab".repeat(32));
    let ab = entries(&query(
        &d,
        "/getledgerentry",
        &form(&[&a, &missing, &b], None),
    ));
    let ba = entries(&query(
        &d,
        "/getledgerentry",
        &form(&[&b, &missing, &a], None),
    ));
    assert_eq!(ab.len(), 3);
    assert_eq!((&ab[0], &ab[1], &ab[2]), (&ba[2], &ba[1], &ba[0]));
    assert_eq!(ab[1], serde_json::json!({"state": "not-found"}));
    assert_ne!(ab[0], ab[2]);
}

#[test]
fn core_reads_the_form_as_it_does() {
    let d = testnet(4);
    d.close_through(FIRST + 5);
    let a = account(A);
    let want = query(&d, "/getledgerentry", &form(&[&a], Some(FIRST + 3))).text();
    // `=` padding dropped, parameters in any order, an unknown one ignored, `+` escaped.
    let key = escape(&b64(&a));
    let bodies = [
        format!("ledgerSeq={}&key={}", FIRST + 3, key.replace("%3D", "")),
        format!("other=1&key={key}&ledgerSeq={}", FIRST + 3),
        format!("key={}&ledgerSeq={}", b64(&a), FIRST + 3),
    ];
    for body in bodies {
        assert_eq!(query(&d, "/getledgerentry", &body).text(), want, "{body}");
    }
}

#[test]
fn the_raw_endpoint_takes_ttl_keys_and_repeats_and_lists_only_what_it_found() {
    let d = testnet(4);
    d.close_through(FIRST + 5);
    let (a, b) = (account(A), account(B));
    let missing = account(&"ab".repeat(32));
    let ttl_key = ttl(&data("x", Persistent, 0, 0), 9, 0).to_key();
    let raw = |body: &str| query(&d, "/getledgerentryraw", body);
    let none = raw(&form(&[&missing, &ttl_key, &missing], Some(FIRST + 2)));
    assert_eq!(none.text(), format!("{{\"ledgerSeq\":{}}}\n", FIRST + 2));
    let both = raw(&form(&[&b, &a, &missing, &a], None));
    let v: serde_json::Value = serde_json::from_slice(&both.body).unwrap();
    assert_eq!(v["ledgerSeq"], FIRST + 5);
    let got: Vec<&str> = v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["entry"].as_str().unwrap())
        .collect();
    let full = entries(&query(&d, "/getledgerentry", &form(&[&b, &a], None)));
    // In key order (B's account, 31eb..., sorts before A's, 644f...), each once.
    assert_eq!(
        got,
        [
            full[0]["entry"].as_str().unwrap(),
            full[1]["entry"].as_str().unwrap()
        ]
    );
    not_found(&raw(""), answer::NO_KEY_RAW);
    not_found(&raw(&form(&[&a], Some(FIRST))), answer::LEDGER_NOT_FOUND);
}
