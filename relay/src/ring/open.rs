//! Opening the store, and the repair that follows a crash (see "Crash consistency" in the
//! [module doc](super)).

use std::collections::VecDeque;
use std::fs;
use std::path::Path;
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

use nix::fcntl::{Flock, FlockArg};
use tracing::{info, warn};

use ledger_relay_wire::header::ChainVerifier;
use ledger_relay_wire::stored::{
    file_len, record_key, record_seq, seal, seal_u32, seal_u64, unseal_str, unseal_u32, unseal_u64,
    Record, META_EPOCH, META_FORMAT, META_NETWORK, RECORD_PREFIX,
};

use super::files::{Files, Name};
use super::read::{read_ledger, ReadFail};
use super::{
    after_gap, sled_tuning, Held, Ring, RingConfig, RingError, State, CACHE_BYTES, FORMAT_VERSION,
    RELEASE_WAIT, SLED_FILE,
};

impl Ring {
    /// Opens the ring in `cfg.dir`, creating it if needed.
    ///
    /// Refuses a store recorded for another network or written in another format, and repairs
    /// what a crash could leave (see the module doc): the result holds runs of consecutive,
    /// hash-linked ledgers separated by gaps, whose newest ledger verifies.
    pub fn open(cfg: &RingConfig) -> Result<Ring, RingError> {
        if cfg.max_ledgers == 0 {
            return Err(RingError::Config {
                detail: "max_ledgers must be at least 1",
            });
        }
        if cfg.max_bytes == 0 {
            return Err(RingError::Config {
                detail: "max_bytes must be at least 1",
            });
        }
        fs::create_dir_all(&cfg.dir).map_err(|source| RingError::Io {
            path: cfg.dir.clone(),
            source,
        })?;
        wait_for_release(&cfg.dir.join(SLED_FILE));
        let (segment_size, flush_every_ms) = sled_tuning()?;
        let db = sled::Config::new()
            .path(&cfg.dir)
            .segment_size(segment_size)
            .cache_capacity(CACHE_BYTES)
            .flush_every_ms(Some(flush_every_ms))
            .open()?;
        let files = Files::open(&cfg.dir)?;

        let mut batch = sled::Batch::default();
        let mut dirty = false;

        // Metadata.
        let epoch = match db.get(META_FORMAT)? {
            None => {
                if db.first()?.is_some() {
                    return Err(RingError::BadMeta {
                        key: "format",
                        detail: "missing from a non-empty store",
                    });
                }
                batch.insert(META_FORMAT, seal_u32(FORMAT_VERSION));
                batch.insert(META_EPOCH, seal_u64(0));
                dirty = true;
                0
            }
            Some(v) => {
                let found = unseal_u32(&v).ok_or(RingError::BadMeta {
                    key: "format",
                    detail: "bad checksum or length",
                })?;
                if found != FORMAT_VERSION {
                    return Err(RingError::Format {
                        found,
                        expected: FORMAT_VERSION,
                    });
                }
                let v = db.get(META_EPOCH)?.ok_or(RingError::BadMeta {
                    key: "epoch",
                    detail: "missing",
                })?;
                unseal_u64(&v).ok_or(RingError::BadMeta {
                    key: "epoch",
                    detail: "bad checksum or length",
                })?
            }
        };
        let stored_network = match db.get(META_NETWORK)? {
            None => None,
            Some(v) => Some(
                unseal_str(&v)
                    .map(str::to_owned)
                    .ok_or(RingError::BadMeta {
                        key: "network",
                        detail: "bad checksum or not UTF-8",
                    })?,
            ),
        };
        let network = match (stored_network, &cfg.network) {
            (Some(stored), Some(configured)) if stored != *configured => {
                return Err(RingError::NetworkMismatch {
                    stored,
                    configured: configured.clone(),
                });
            }
            (None, Some(configured)) => {
                batch.insert(
                    META_NETWORK,
                    seal(|b| b.extend_from_slice(configured.as_bytes())),
                );
                dirty = true;
                Some(configured.clone())
            }
            (stored, _) => stored,
        };

        // Records: keep, from the newest down, what decodes and is consecutive and hash-linked
        // within each run; a gap in the sequences separates two runs (see
        // `Ring::append_after_gap`), while two consecutive ledgers that do not link, or a
        // record that does not decode, end what is kept.
        let mut records: Vec<(Vec<u8>, Option<Record>)> = Vec::new();
        for kv in db.scan_prefix([RECORD_PREFIX]) {
            let (k, v) = kv?;
            let rec = record_seq(&k).and_then(|seq| Record::decode(seq, &v).ok());
            records.push((k.to_vec(), rec));
        }
        // Unreadable records above the newest readable one are a torn tail: skip them.
        let mut skip_top = records.len();
        while skip_top > 0 && records[skip_top - 1].1.is_none() {
            skip_top -= 1;
        }
        let mut keep_from = skip_top;
        while keep_from > 0 {
            let Some(rec) = records[keep_from - 1].1 else {
                break;
            };
            if keep_from < skip_top {
                if let Some(next) = records[keep_from].1 {
                    let gap = after_gap(rec.end.seq, next.end.seq);
                    let linked = ChainVerifier::after(rec.end.seq, rec.end.header_hash)
                        .check_link((&next.end).into())
                        .is_ok();
                    if !gap && !linked {
                        break;
                    }
                }
            }
            keep_from -= 1;
        }
        let dropped_records = records[..keep_from].iter().chain(&records[skip_top..]);
        for (key, rec) in dropped_records {
            warn!(key = ?key, readable = rec.is_some(), "ring: dropping a record that does not belong to the runs kept");
            batch.remove(key.as_slice());
            dirty = true;
        }
        let mut kept: Vec<Record> = records[keep_from..skip_top]
            .iter()
            .filter_map(|r| r.1)
            .collect();

        // The newest ledger must verify completely; a torn one is dropped.
        while let Some(last) = kept.last().copied() {
            match read_ledger(&db, &files, epoch, last.end.seq, Some(last)) {
                Ok(_) => break,
                Err(ReadFail::Sled(e)) => return Err(e.into()),
                Err(ReadFail::Io(e)) => return Err(e),
                Err(ReadFail::Corrupt(detail)) => {
                    warn!(seq = last.end.seq, %detail, "ring: dropping a torn newest ledger");
                    batch.remove(&record_key(last.end.seq)[..]);
                    dirty = true;
                    kept.pop();
                }
            }
        }

        if dirty {
            db.apply_batch(batch)?;
            db.flush()?;
        }

        // Files no kept record owns: a ledger written when the relay stopped before its record
        // was committed, or pruned or reset before its file was removed, or of a dropped record.
        let owned =
            |e: u64, seq: u32| e == epoch && kept.binary_search_by_key(&seq, |r| r.end.seq).is_ok();
        let mut removed = 0usize;
        for (path, name) in files.list()? {
            match name {
                Name::Ledger { epoch: e, seq } if owned(e, seq) => {}
                Name::Spare if files.keep_spare(&path) => {}
                Name::Ledger { .. } | Name::Partial | Name::Spare => {
                    fs::remove_file(&path).map_err(|source| RingError::Io {
                        path: path.clone(),
                        source,
                    })?;
                    removed += 1;
                }
                Name::Other => {
                    warn!(path = %path.display(), "ring: a file that is not the ring's, left alone");
                }
            }
        }
        if removed > 0 {
            info!(removed, "ring: removed ledger files no record owns");
            files.sync_dir()?;
        }

        let held: VecDeque<Held> = kept
            .iter()
            .map(|r| Held {
                seq: r.end.seq,
                bytes: r.bytes,
                file: file_len(r).unwrap_or(0),
            })
            .collect();
        let state = State {
            newest_hash: kept.last().map(|r| r.end.header_hash).unwrap_or_default(),
            live_bytes: held.iter().map(|h| h.bytes).sum(),
            file_bytes: held.iter().map(|h| h.file).sum(),
            held,
            epoch,
        };
        info!(
            dir = %cfg.dir.display(),
            range = ?state.range(),
            runs = state.runs().len(),
            epoch,
            network = network.as_deref().unwrap_or("-"),
            recovered = db.was_recovered(),
            "ring opened"
        );
        Ok(Ring {
            db: RwLock::new(Some(db)),
            files,
            dir: cfg.dir.clone(),
            max_ledgers: cfg.max_ledgers,
            max_bytes: cfg.max_bytes,
            network,
            writer: Mutex::new(()),
            failed: Mutex::new(None),
            state: RwLock::new(state),
            #[cfg(test)]
            hook: super::HookCell::default(),
        })
    }
}

/// Waits, up to [`RELEASE_WAIT`], until nothing holds sled's lock on `path` (a `Ring` of this
/// directory dropped a moment ago). Gives up silently: sled's own open then reports the lock.
fn wait_for_release(path: &Path) {
    let deadline = Instant::now() + RELEASE_WAIT;
    loop {
        let Ok(file) = fs::File::open(path) else {
            return; // no store yet
        };
        // The probe lock is released when it is dropped, before sled takes its own.
        if Flock::lock(file, FlockArg::LockExclusiveNonblock).is_ok() || Instant::now() >= deadline
        {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
