//! Opening the store, and the repair that follows a crash (see "Crash consistency" in the
//! [module doc](super)).

use std::collections::VecDeque;
use std::fs;
use std::path::Path;
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

use nix::fcntl::{Flock, FlockArg};
use tracing::{info, warn};

use ledger_relay_wire::stored::{
    file_len, record_key, record_seq, seal, seal_u32, seal_u64, surviving, unseal_str, unseal_u32,
    unseal_u64, Record, META_EPOCH, META_FORMAT, META_NETWORK, RECORD_PREFIX,
};

use super::files::ReadFail;
use super::files::{Files, Name};
use super::read::read_ledger;
use super::{
    sled_tuning, Held, Ring, RingConfig, RingError, State, CACHE_BYTES, FORMAT_VERSION,
    RELEASE_WAIT, SLED_FILE,
};

impl Ring {
    /// Opens the ring in `cfg.dir`, creating it if needed.
    ///
    /// Refuses a store recorded for another network or written in another format, and repairs
    /// what a crash could leave (see the module doc): the result holds runs of consecutive,
    /// hash-linked ledgers separated by gaps, whose newest ledger verifies.
    pub fn open(cfg: &RingConfig) -> Result<Ring, RingError> {
        check_config(cfg)?;
        let db = open_db(&cfg.dir)?;
        let files = Files::open(&cfg.dir)?;

        let mut repair = Repair::default();
        let epoch = read_epoch(&db, &mut repair)?;
        let network = read_network(&db, cfg, &mut repair)?;
        let mut kept = keep_records(&db, &mut repair)?;
        drop_torn_newest(&db, &files, epoch, &mut kept, &mut repair)?;
        if repair.dirty {
            db.apply_batch(repair.batch)?;
            db.flush()?;
        }
        remove_unowned_files(&files, epoch, &kept)?;

        let state = state_of(&kept, epoch);
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

/// The changes opening makes to the store, applied at once.
#[derive(Default)]
struct Repair {
    batch: sled::Batch,
    dirty: bool,
}

impl Repair {
    fn insert(&mut self, key: &[u8], value: Vec<u8>) {
        self.batch.insert(key, value);
        self.dirty = true;
    }

    fn remove(&mut self, key: &[u8]) {
        self.batch.remove(key);
        self.dirty = true;
    }
}

fn check_config(cfg: &RingConfig) -> Result<(), RingError> {
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
    Ok(())
}

fn open_db(dir: &Path) -> Result<sled::Db, RingError> {
    fs::create_dir_all(dir).map_err(|source| RingError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    wait_for_release(&dir.join(SLED_FILE));
    let (segment_size, flush_every_ms) = sled_tuning()?;
    Ok(sled::Config::new()
        .path(dir)
        .segment_size(segment_size)
        .cache_capacity(CACHE_BYTES)
        .flush_every_ms(Some(flush_every_ms))
        .open()?)
}

/// The store's run counter, after checking its format; a new store gets both.
fn read_epoch(db: &sled::Db, repair: &mut Repair) -> Result<u64, RingError> {
    let Some(v) = db.get(META_FORMAT)? else {
        if db.first()?.is_some() {
            return Err(RingError::BadMeta {
                key: "format",
                detail: "missing from a non-empty store",
            });
        }
        repair.insert(META_FORMAT, seal_u32(FORMAT_VERSION));
        repair.insert(META_EPOCH, seal_u64(0));
        return Ok(0);
    };
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
    })
}

/// The network the store belongs to: refuses another than the configured one, and records the
/// configured one in a store that has none.
fn read_network(
    db: &sled::Db,
    cfg: &RingConfig,
    repair: &mut Repair,
) -> Result<Option<String>, RingError> {
    let stored = match db.get(META_NETWORK)? {
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
    Ok(match (stored, &cfg.network) {
        (Some(stored), Some(configured)) if stored != *configured => {
            return Err(RingError::NetworkMismatch {
                stored,
                configured: configured.clone(),
            });
        }
        (None, Some(configured)) => {
            repair.insert(
                META_NETWORK,
                seal(|b| b.extend_from_slice(configured.as_bytes())),
            );
            Some(configured.clone())
        }
        (stored, _) => stored,
    })
}

/// The records that survive (the rule is [`surviving`]); the others are removed.
fn keep_records(db: &sled::Db, repair: &mut Repair) -> Result<Vec<Record>, RingError> {
    let mut keys = Vec::new();
    let mut records = Vec::new();
    for kv in db.scan_prefix([RECORD_PREFIX]) {
        let (k, v) = kv?;
        records.push(record_seq(&k).and_then(|seq| Record::decode(seq, &v).ok()));
        keys.push(k);
    }
    let kept = surviving(&records);
    for (i, (key, rec)) in keys.iter().zip(&records).enumerate() {
        if !kept.contains(&i) {
            warn!(key = ?key, readable = rec.is_some(), "ring: dropping a record that does not belong to the runs kept");
            repair.remove(key);
        }
    }
    Ok(records[kept].iter().flatten().copied().collect())
}

/// Drops newest ledgers until the newest one reads back whole.
fn drop_torn_newest(
    db: &sled::Db,
    files: &Files,
    epoch: u64,
    kept: &mut Vec<Record>,
    repair: &mut Repair,
) -> Result<(), RingError> {
    while let Some(last) = kept.last().copied() {
        match read_ledger(db, files, epoch, last.end.seq, Some(last)) {
            Ok(_) => break,
            Err(ReadFail::Sled(e)) => return Err(e.into()),
            Err(ReadFail::Io(e)) => return Err(e),
            Err(ReadFail::Corrupt(detail)) => {
                warn!(seq = last.end.seq, %detail, "ring: dropping a torn newest ledger");
                repair.remove(&record_key(last.end.seq)[..]);
                kept.pop();
            }
        }
    }
    Ok(())
}

/// Removes the files no kept record owns: a ledger written when the relay stopped before its
/// record was committed, or pruned or reset before its file was removed, or of a dropped record.
fn remove_unowned_files(files: &Files, epoch: u64, kept: &[Record]) -> Result<(), RingError> {
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
    Ok(())
}

fn state_of(kept: &[Record], epoch: u64) -> State {
    let held: VecDeque<Held> = kept
        .iter()
        .map(|r| Held {
            seq: r.end.seq,
            bytes: r.bytes,
            file: file_len(r).unwrap_or(0),
        })
        .collect();
    State {
        newest_hash: kept.last().map(|r| r.end.header_hash).unwrap_or_default(),
        live_bytes: held.iter().map(|h| h.bytes).sum(),
        file_bytes: held.iter().map(|h| h.file).sum(),
        held,
        epoch,
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
