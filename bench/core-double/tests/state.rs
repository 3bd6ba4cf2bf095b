//! The state behind the query port: entries appear, change and disappear at the ledgers the
//! testnet meta says (values read off the meta by hand), and synthetic Soroban ledgers go
//! live, expire, are evicted and restored.

use stellar_xdr::{
    ContractDataDurability, ContractId, Hash, LedgerEntryChange, LedgerEntryData, LedgerKey,
    LedgerKeyContractData, ScAddress, ScSymbol, ScVal, ScVec,
};

use ledger_relay_core_double::{CoreDouble, Settings};

use crate::support::{
    account, code, data, entries, entry_of, form, hex32, ledger, query, standalone_path, testnet,
    ttl, FIRST, LAST,
};

/// Created by a `CREATE_ACCOUNT` in 1410049 with 10000 XLM, merged away in 1410051.
const MERGED: &str = "6ee6f96ff50ad37b9250bf5f248a7060a911d8b22778a6cbe9f15edb4be67649";
/// Pays a fee and bumps its sequence in 1410050, 1410051, 1410052 and 1410053.
const BUSY: &str = "644f51e502775e0ec67b4922b8ded549649f50c3df4e38543abe1894f3be834d";

fn balance_and_seq(e: &serde_json::Value) -> (i64, i64, u32) {
    let entry = entry_of(e);
    let LedgerEntryData::Account(a) = &entry.data else {
        panic!("not an account: {entry:?}")
    };
    (a.balance, a.seq_num.0, entry.last_modified_ledger_seq)
}

#[test]
fn an_account_is_not_found_before_its_creation_live_from_it_and_gone_once_merged() {
    let d = testnet(LAST - FIRST);
    d.close_through(LAST);
    let key = account(MERGED);
    let at = |seq| query(&d, "/getledgerentry", &form(&[&key], Some(seq)));
    let before = at(1410048);
    assert_eq!(
        before.text(),
        "{\"entries\":[{\"state\":\"not-found\"}],\"ledgerSeq\":1410048}\n"
    );
    for seq in [1410049, 1410050] {
        let e = entries(&at(seq));
        assert_eq!(e[0]["state"], "live");
        assert!(e[0].get("liveUntilLedgerSeq").is_none(), "classic: no TTL");
        assert_eq!(
            balance_and_seq(&e[0]),
            (100000000000, 6056114340757504, 1410049)
        );
    }
    assert_eq!(entries(&at(1410051))[0]["state"], "not-found");
    assert_eq!(entries(&at(LAST))[0]["state"], "not-found");
}

#[test]
fn an_updated_account_answers_the_value_of_each_ledger() {
    let d = testnet(LAST - FIRST);
    d.close_through(1410060);
    let key = account(BUSY);
    let at = |seq| {
        balance_and_seq(&entries(&query(&d, "/getledgerentry", &form(&[&key], Some(seq))))[0])
    };
    // Before its first change: the value its first STATE change showed.
    assert_eq!(at(1410048), (95171406278, 1876900902688, 1410047));
    assert_eq!(at(1410049), (95171406278, 1876900902688, 1410047));
    // Fee charged, then the sequence bumped, in the same ledger.
    assert_eq!(at(1410050), (95171405278, 1876900902689, 1410050));
    assert_eq!(at(1410051), (95171305278, 1876900902690, 1410051));
    assert_eq!(at(1410052), (95171305178, 1876900902691, 1410052));
    assert_eq!(at(1410053), (95171205178, 1876900902692, 1410053));
}

#[test]
fn the_window_holds_the_last_closed_ledger_and_the_snapshot_ledgers_before_it() {
    let d = testnet(4);
    let key = account(BUSY);
    let ask = |seq| query(&d, "/getledgerentry", &form(&[&key], seq));
    let nothing = ask(None);
    assert_eq!((nothing.status, nothing.content_type), (404, "text/html"));
    assert_eq!(nothing.text(), "Ledger not found\n");
    assert_eq!(d.close_through(FIRST + 10).len(), 11);
    assert_eq!(d.lcl(), Some(FIRST + 10));
    for seq in FIRST + 6..=FIRST + 10 {
        assert_eq!(ask(Some(seq)).status, 200, "{seq} is in the window");
    }
    for seq in [FIRST + 5, FIRST + 11, FIRST] {
        let a = ask(Some(seq));
        assert_eq!(
            (a.status, a.text()),
            (404, "Ledger not found\n".into()),
            "{seq}"
        );
    }
    let latest: serde_json::Value = serde_json::from_slice(&ask(None).body).unwrap();
    assert_eq!(latest["ledgerSeq"], FIRST + 10, "no ledgerSeq: the LCL");
}

/// Ledgers 100-104: a persistent and a temporary entry live until 101, contract code whose TTL
/// is extended in 101; in 103 both data entries are evicted; in 104 the persistent one is
/// restored until 300.
fn soroban() -> CoreDouble {
    use ContractDataDurability::{Persistent, Temporary};
    let (p, t, c) = (
        data("p", Persistent, 1, 100),
        data("t", Temporary, 2, 100),
        code(100),
    );
    let created = vec![
        LedgerEntryChange::Created(p.clone()),
        LedgerEntryChange::Created(ttl(&p, 101, 100)),
        LedgerEntryChange::Created(t.clone()),
        LedgerEntryChange::Created(ttl(&t, 101, 100)),
        LedgerEntryChange::Created(c.clone()),
        LedgerEntryChange::Created(ttl(&c, 200, 100)),
    ];
    let extended = vec![
        LedgerEntryChange::State(ttl(&c, 200, 100)),
        LedgerEntryChange::Updated(ttl(&c, 250, 101)),
    ];
    let evicted = [&p, &t]
        .iter()
        .flat_map(|e| [e.to_key(), ttl(e, 101, 100).to_key()])
        .collect();
    let restored = vec![
        LedgerEntryChange::Restored(p.clone()),
        LedgerEntryChange::Restored(ttl(&p, 300, 104)),
    ];
    let ledgers = vec![
        ledger(100, created, vec![]),
        ledger(101, extended, vec![]),
        ledger(102, vec![], vec![]),
        ledger(103, vec![], evicted),
        ledger(104, restored, vec![]),
    ];
    let settings = Settings {
        snapshot_ledgers: 10,
        ..Settings::default()
    };
    let d = CoreDouble::new(ledgers, settings);
    d.close_through(104);
    d
}

/// `(state, liveUntilLedgerSeq, has entry)` of p, t and c at `seq`.
fn states(d: &CoreDouble, seq: u32) -> Vec<(String, Option<u64>, bool)> {
    use ContractDataDurability::{Persistent, Temporary};
    let keys = [
        data("p", Persistent, 0, 0).to_key(),
        data("t", Temporary, 0, 0).to_key(),
        code(0).to_key(),
    ];
    let a = query(
        d,
        "/getledgerentry",
        &form(&[&keys[0], &keys[1], &keys[2]], Some(seq)),
    );
    entries(&a)
        .iter()
        .map(|e| {
            (
                e["state"].as_str().unwrap().to_owned(),
                e["liveUntilLedgerSeq"].as_u64(),
                e.get("entry").is_some(),
            )
        })
        .collect()
}

fn s(state: &str, until: Option<u64>, entry: bool) -> (String, Option<u64>, bool) {
    (state.into(), until, entry)
}

#[test]
fn soroban_entries_are_live_until_their_ttl_then_archived_or_gone_and_restored() {
    let d = soroban();
    let nf = || s("not-found", None, false);
    let live = |n| s("live", Some(n), true);
    assert_eq!(states(&d, 100), vec![live(101), live(101), live(200)]);
    assert_eq!(states(&d, 101), vec![live(101), live(101), live(250)]);
    // TTL 101 < 102: the persistent entry is archived, the temporary one gone.
    let archived = || s("archived", Some(0), true);
    assert_eq!(states(&d, 102), vec![archived(), nf(), live(250)]);
    // Evicted: the persistent entry is in the hot archive, the temporary one deleted.
    assert_eq!(states(&d, 103), vec![archived(), nf(), live(250)]);
    assert_eq!(states(&d, 104), vec![live(300), nf(), live(250)]);
}

#[test]
fn an_archived_entry_carries_its_last_value() {
    let d = soroban();
    let key = data("p", ContractDataDurability::Persistent, 0, 0).to_key();
    let e = entries(&query(&d, "/getledgerentry", &form(&[&key], Some(103))));
    assert_eq!(
        entry_of(&e[0]),
        data("p", ContractDataDurability::Persistent, 1, 100)
    );
    let text = query(&d, "/getledgerentry", &form(&[&key], Some(103))).text();
    assert!(
        text.starts_with("{\"entries\":[{\"entry\":\"")
            && text.ends_with(
                "\",\"liveUntilLedgerSeq\":0,\"state\":\"archived\"}],\"ledgerSeq\":103}\n"
            ),
        "{text}"
    );
}

/// In the protocol-23 file: the `Balance` of contract 0017c4... in token contract d8b2b1...,
/// created in ledger 85 with amount 10000000 and a TTL until 518485, updated in 88 to 20000000.
fn balance_key() -> LedgerKey {
    let contract = |hex| ScAddress::Contract(ContractId(Hash(hex32(hex))));
    let holder = contract("0017c499a5de93a00ed6d8ee1f736d275efb82df486a3b970391a16bdeee96a8");
    let name = ScVal::Symbol(ScSymbol("Balance".try_into().unwrap()));
    LedgerKey::ContractData(LedgerKeyContractData {
        contract: contract("d8b2b14c60fecb65fb2aa81cbea79d0835cafc0e0d851f8611257c1e5b41e1c2"),
        key: ScVal::Vec(Some(ScVec(
            vec![name, ScVal::Address(holder)].try_into().unwrap(),
        ))),
        durability: ContractDataDurability::Persistent,
    })
}

fn amount(e: &serde_json::Value) -> u64 {
    let LedgerEntryData::ContractData(c) = entry_of(e).data else {
        panic!("not contract data")
    };
    let ScVal::Map(Some(map)) = c.val else {
        panic!("not a map")
    };
    match &map[0].val {
        ScVal::I128(parts) => parts.lo,
        other => panic!("amount {other:?}"),
    }
}

#[test]
fn protocol_23_contract_data_by_ledger_with_its_ttl() {
    let settings = Settings {
        snapshot_ledgers: 10,
        ..Settings::default()
    };
    let d = CoreDouble::load(&standalone_path(), settings).unwrap();
    d.close_through(88);
    let key = balance_key();
    let at = |seq| query(&d, "/getledgerentry", &form(&[&key], Some(seq)));
    assert_eq!(
        entries(&at(84))[0],
        serde_json::json!({"state": "not-found"})
    );
    let e85 = entries(&at(85));
    assert_eq!(
        (
            e85[0]["state"].as_str(),
            e85[0]["liveUntilLedgerSeq"].as_u64()
        ),
        (Some("live"), Some(518485))
    );
    assert_eq!(amount(&e85[0]), 10000000);
    // 86 and 87 are not in the file: never closed, so never held.
    for seq in [86, 87] {
        assert_eq!(at(seq).text(), "Ledger not found\n");
    }
    let e88 = entries(&at(88));
    assert_eq!(amount(&e88[0]), 20000000);
    assert_eq!(e88[0]["liveUntilLedgerSeq"], 518485);
}
