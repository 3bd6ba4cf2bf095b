//! The double's ledger state: every entry the replayed ledgers changed, versioned by ledger
//! sequence, so an answer for `ledgerSeq=N` is the state after ledger N.
//!
//! Built from the entry changes of each ledger's meta in the order core applies them: every
//! transaction's fee processing, then each transaction's apply meta (every `TransactionMeta`
//! version: changes before, per operation, after), then the post-apply fee refunds, then the
//! upgrades, then the evictions. A `STATE` change (an entry's value before a change) of a key
//! the double has not seen yet records that value as held since before the first ledger: the
//! entry existed and had not changed. Entries the ledgers never touch are unknown to the double
//! and answered as not found.
//!
//! Eviction: a persistent Soroban entry (contract code, persistent contract data) moves to the
//! hot archive (answered `archived`, as core does since protocol 23); anything else evicted
//! (temporary data, TTL entries) is gone.

use std::collections::HashMap;
use std::sync::Arc;

use base64::Engine;
use sha2::{Digest, Sha256};
use stellar_xdr::{
    ContractDataDurability, Hash, LedgerCloseMeta, LedgerEntry, LedgerEntryChange,
    LedgerEntryChanges, LedgerEntryData, LedgerKey, LedgerKeyTtl, Limits, TransactionMeta,
    WriteXdr,
};

/// An entry as the double holds it: decoded, and as core's answers spell it (standard base64
/// of its XDR).
#[derive(Debug, PartialEq, Eq)]
pub struct Stored {
    /// The entry.
    pub entry: LedgerEntry,
    /// Base64 of its XDR.
    pub base64: String,
}

impl Stored {
    fn new(entry: &LedgerEntry) -> Arc<Stored> {
        // Encoding a value of a generated XDR type fails only past a limit; there is none.
        let xdr = entry
            .to_xdr(Limits::none())
            .expect("an entry decoded from XDR encodes again");
        Arc::new(Stored {
            entry: entry.clone(),
            base64: base64::engine::general_purpose::STANDARD.encode(xdr),
        })
    }
}

/// A key's value from some ledger on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// In the live state.
    Live(Arc<Stored>),
    /// Evicted to the hot archive (persistent Soroban entries).
    Archived(Arc<Stored>),
    /// Removed or evicted.
    Gone,
}

/// What `/getledgerentry` says of a key at a ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// Live; Soroban entries carry the ledger their TTL runs to, when the ledgers showed it.
    Live {
        /// The entry.
        stored: Arc<Stored>,
        /// Its TTL entry's `liveUntilLedgerSeq` (Soroban entries only).
        live_until: Option<u32>,
    },
    /// A persistent Soroban entry whose TTL ran out, or that was evicted to the hot archive.
    Archived(Arc<Stored>),
    /// Unknown, removed, or a temporary entry whose TTL ran out.
    NotFound,
}

/// Every key's versions, oldest first: `(first ledger, value)`; sequence 0 for a value held
/// since before the first replayed ledger.
#[derive(Debug, Default)]
pub struct State {
    versions: HashMap<LedgerKey, Vec<(u32, Value)>>,
}

impl State {
    /// Applies ledger `meta` (sequence `seq`, above every ledger applied before).
    pub fn apply(&mut self, seq: u32, meta: &LedgerCloseMeta) {
        for changes in ordered_changes(meta) {
            for change in changes.iter() {
                self.apply_change(seq, change);
            }
        }
        for key in evicted_keys(meta) {
            self.evict(seq, key);
        }
    }

    fn apply_change(&mut self, seq: u32, change: &LedgerEntryChange) {
        match change {
            LedgerEntryChange::Created(e)
            | LedgerEntryChange::Updated(e)
            | LedgerEntryChange::Restored(e) => {
                self.set(e.to_key(), seq, Value::Live(Stored::new(e)))
            }
            LedgerEntryChange::Removed(k) => self.set(k.clone(), seq, Value::Gone),
            LedgerEntryChange::State(e) => {
                self.versions
                    .entry(e.to_key())
                    .or_insert_with(|| vec![(0, Value::Live(Stored::new(e)))]);
            }
        }
    }

    fn evict(&mut self, seq: u32, key: &LedgerKey) {
        let value = match self.at(key, seq) {
            Some(Value::Live(s)) if is_persistent(key) => Value::Archived(s.clone()),
            _ => Value::Gone,
        };
        self.set(key.clone(), seq, value);
    }

    fn set(&mut self, key: LedgerKey, seq: u32, value: Value) {
        let versions = self.versions.entry(key).or_default();
        match versions.last_mut() {
            Some(last) if last.0 == seq => last.1 = value,
            _ => versions.push((seq, value)),
        }
    }

    /// The value of `key` after ledger `seq`, or `None` if the ledgers never showed it by then.
    pub fn at(&self, key: &LedgerKey, seq: u32) -> Option<&Value> {
        let versions = self.versions.get(key)?;
        let after = versions.partition_point(|(from, _)| *from <= seq);
        versions[..after].last().map(|(_, v)| v)
    }

    /// What core's `/getledgerentry` answers for `key` at ledger `seq`: a Soroban entry is live
    /// while its TTL reaches `seq`, then archived (persistent) or not found (temporary).
    pub fn lookup(&self, key: &LedgerKey, seq: u32) -> Found {
        match self.at(key, seq) {
            Some(Value::Live(s)) if !is_soroban(key) => Found::Live {
                stored: s.clone(),
                live_until: None,
            },
            Some(Value::Live(s)) => match self.live_until(key, seq) {
                Some(until) if until < seq && is_persistent(key) => Found::Archived(s.clone()),
                Some(until) if until < seq => Found::NotFound,
                live_until => Found::Live {
                    stored: s.clone(),
                    live_until,
                },
            },
            Some(Value::Archived(s)) => Found::Archived(s.clone()),
            Some(Value::Gone) | None => Found::NotFound,
        }
    }

    /// The `liveUntilLedgerSeq` of `key`'s TTL entry at `seq`, if the ledgers showed one.
    pub fn live_until(&self, key: &LedgerKey, seq: u32) -> Option<u32> {
        match self.at(&ttl_key(key), seq)? {
            Value::Live(s) => match &s.entry.data {
                LedgerEntryData::Ttl(t) => Some(t.live_until_ledger_seq),
                _ => None,
            },
            _ => None,
        }
    }

    /// Every key the ledgers showed, for tests and benches that pick keys to ask for.
    pub fn keys(&self) -> impl Iterator<Item = &LedgerKey> {
        self.versions.keys()
    }

    /// The accounts live at `seq`, in no particular order.
    pub fn live_accounts(&self, seq: u32) -> impl Iterator<Item = &LedgerKey> {
        let live = move |k: &&LedgerKey| matches!(self.lookup(k, seq), Found::Live { .. });
        let accounts = self.keys().filter(|k| matches!(k, LedgerKey::Account(_)));
        accounts.filter(live)
    }

    /// Every version of `key`, oldest first.
    pub fn history(&self, key: &LedgerKey) -> &[(u32, Value)] {
        self.versions.get(key).map_or(&[], Vec::as_slice)
    }
}

/// The key of the TTL entry of Soroban key `key`: the sha256 of its XDR.
pub fn ttl_key(key: &LedgerKey) -> LedgerKey {
    // Encoding a value of a generated XDR type fails only past a limit; there is none.
    let xdr = key
        .to_xdr(Limits::none())
        .expect("a ledger key encodes to XDR");
    LedgerKey::Ttl(LedgerKeyTtl {
        key_hash: Hash(Sha256::digest(xdr).into()),
    })
}

/// Contract data and contract code: the entries with a TTL.
pub fn is_soroban(key: &LedgerKey) -> bool {
    matches!(key, LedgerKey::ContractData(_) | LedgerKey::ContractCode(_))
}

/// Contract code and persistent contract data: the entries archived rather than deleted.
pub fn is_persistent(key: &LedgerKey) -> bool {
    match key {
        LedgerKey::ContractCode(_) => true,
        LedgerKey::ContractData(d) => d.durability == ContractDataDurability::Persistent,
        _ => false,
    }
}

/// The change lists of a ledger in the order core applies them.
fn ordered_changes(meta: &LedgerCloseMeta) -> Vec<&LedgerEntryChanges> {
    let mut fees = Vec::new();
    let mut applied = Vec::new();
    let mut refunds = Vec::new();
    let upgrades = match meta {
        LedgerCloseMeta::V0(m) => {
            for t in m.tx_processing.iter() {
                fees.push(&t.fee_processing);
                applied.extend(tx_changes(&t.tx_apply_processing));
            }
            &m.upgrades_processing
        }
        LedgerCloseMeta::V1(m) => {
            for t in m.tx_processing.iter() {
                fees.push(&t.fee_processing);
                applied.extend(tx_changes(&t.tx_apply_processing));
            }
            &m.upgrades_processing
        }
        LedgerCloseMeta::V2(m) => {
            for t in m.tx_processing.iter() {
                fees.push(&t.fee_processing);
                applied.extend(tx_changes(&t.tx_apply_processing));
                refunds.push(&t.post_tx_apply_fee_processing);
            }
            &m.upgrades_processing
        }
    };
    fees.extend(applied);
    fees.extend(refunds);
    fees.extend(upgrades.iter().map(|u| &u.changes));
    fees
}

/// The change lists of one transaction's apply meta, in order.
fn tx_changes(meta: &TransactionMeta) -> Vec<&LedgerEntryChanges> {
    match meta {
        TransactionMeta::V0(ops) => ops.iter().map(|o| &o.changes).collect(),
        TransactionMeta::V1(m) => std::iter::once(&m.tx_changes)
            .chain(m.operations.iter().map(|o| &o.changes))
            .collect(),
        TransactionMeta::V2(m) => std::iter::once(&m.tx_changes_before)
            .chain(m.operations.iter().map(|o| &o.changes))
            .chain(std::iter::once(&m.tx_changes_after))
            .collect(),
        TransactionMeta::V3(m) => std::iter::once(&m.tx_changes_before)
            .chain(m.operations.iter().map(|o| &o.changes))
            .chain(std::iter::once(&m.tx_changes_after))
            .collect(),
        TransactionMeta::V4(m) => std::iter::once(&m.tx_changes_before)
            .chain(m.operations.iter().map(|o| &o.changes))
            .chain(std::iter::once(&m.tx_changes_after))
            .collect(),
    }
}

/// The keys a ledger evicted (none before protocol 20).
fn evicted_keys(meta: &LedgerCloseMeta) -> &[LedgerKey] {
    match meta {
        LedgerCloseMeta::V0(_) => &[],
        LedgerCloseMeta::V1(m) => &m.evicted_keys,
        LedgerCloseMeta::V2(m) => &m.evicted_keys,
    }
}
