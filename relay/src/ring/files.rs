//! The ledger files: one file per held ledger under `ledgers/`, named by the run's epoch and
//! the ledger's sequence (`<epoch>-<seq>.parts`), holding what
//! [`ledger_relay_wire::stored::encode_file`] makes. Written whole and durably before the
//! ledger's record is committed to sled; once its record is gone, kept as a spare
//! (`spare-<n>.spare`, at most [`MAX_SPARES`]) that the next ledger is written over, else
//! deleted.
//!
//! Why spares: a ledger written into a new file costs the filesystem a fresh block allocation,
//! and writing over blocks a file already has does not. On this product's test machine (ext4,
//! virtio disk) 15 MiB into a new file plus `fdatasync` took 36-50 ms of CPU, over an existing
//! file's blocks 4 ms (bench/RESULTS.md, "Levers"). A full ring prunes a ledger for every one
//! it appends, so in steady state every ledger is written over the one pruned before it.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use ledger_relay_wire::stored::{file_len, read_file, Record, StoredError};
use tracing::warn;

use super::{RingError, StoredChunk};
use ledger_relay_wire::frame::LedgerEnd;

/// The directory of ledger files inside the ring's directory.
pub const LEDGERS_DIR: &str = "ledgers";

const SUFFIX: &str = ".parts";
const TMP_SUFFIX: &str = ".tmp";
const SPARE_PREFIX: &str = "spare-";
const SPARE_SUFFIX: &str = ".spare";

/// Pruned ledger files kept to be written over: beyond the ring's own bytes, the disk holds at
/// most this many ledgers' worth more.
pub const MAX_SPARES: usize = 2;

/// The file that holds ledger `seq` in ring directory `ring_dir` (of the newest run that has
/// one), for tools and tests that inspect a stopped relay's ring.
pub fn ledger_file(ring_dir: &Path, seq: u32) -> Option<PathBuf> {
    fs::read_dir(ring_dir.join(LEDGERS_DIR))
        .ok()?
        .flatten()
        .filter_map(|e| match e.file_name().to_str().map(parse_name) {
            Some(Name::Ledger { epoch, seq: s }) if s == seq => Some((epoch, e.path())),
            _ => None,
        })
        .max_by_key(|(epoch, _)| *epoch)
        .map(|(_, path)| path)
}

/// The ledger files of one ring.
#[derive(Debug)]
pub(super) struct Files {
    dir: PathBuf,
    /// Spare files, and the number the next one is named with.
    spares: Mutex<(Vec<PathBuf>, u64)>,
}

/// What a name in `ledgers/` is.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Name {
    /// A ledger file of run `epoch`.
    Ledger { epoch: u64, seq: u32 },
    /// A file being written when the relay stopped.
    Partial,
    /// A pruned ledger's file kept to be written over.
    Spare,
    /// Not ours.
    Other,
}

/// Parses a name in `ledgers/`: decimal epoch, `-`, decimal sequence, a suffix; nothing else.
pub(super) fn parse_name(name: &str) -> Name {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if let Some(n) = name
        .strip_prefix(SPARE_PREFIX)
        .and_then(|s| s.strip_suffix(SPARE_SUFFIX))
    {
        return if digits(n) { Name::Spare } else { Name::Other };
    }
    let (stem, partial) = if let Some(s) = name.strip_suffix(SUFFIX) {
        (s, false)
    } else if let Some(s) = name.strip_suffix(TMP_SUFFIX) {
        (s, true)
    } else {
        return Name::Other;
    };
    let Some((epoch, seq)) = stem.split_once('-') else {
        return Name::Other;
    };
    if !digits(epoch) || !digits(seq) {
        return Name::Other;
    }
    match (epoch.parse(), seq.parse()) {
        (Ok(_), Ok(_)) if partial => Name::Partial,
        (Ok(epoch), Ok(seq)) => Name::Ledger { epoch, seq },
        _ => Name::Other,
    }
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> RingError + '_ {
    move |source| RingError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl Files {
    /// The ledger files under ring directory `ring_dir`, creating their directory.
    pub(super) fn open(ring_dir: &Path) -> Result<Files, RingError> {
        let dir = ring_dir.join(LEDGERS_DIR);
        fs::create_dir_all(&dir).map_err(io_err(&dir))?;
        Ok(Files {
            dir,
            spares: Mutex::new((Vec::new(), 0)),
        })
    }

    /// Takes `path`, a file no record owns, as a spare if fewer than [`MAX_SPARES`] are kept;
    /// returns whether it did (else the caller removes it).
    pub(super) fn keep_spare(&self, path: &Path) -> bool {
        let mut spares = self.spares.lock().unwrap_or_else(PoisonError::into_inner);
        if spares.0.len() >= MAX_SPARES {
            return false;
        }
        let spare = loop {
            spares.1 += 1;
            let p = self
                .dir
                .join(format!("{SPARE_PREFIX}{}{SPARE_SUFFIX}", spares.1));
            if p == path || !p.exists() {
                break p;
            }
        };
        if spare != path && fs::rename(path, &spare).is_err() {
            return false;
        }
        spares.0.push(spare);
        true
    }

    /// Bytes the spares hold on disk.
    pub(super) fn spare_bytes(&self) -> u64 {
        let spares = self.spares.lock().unwrap_or_else(PoisonError::into_inner);
        spares
            .0
            .iter()
            .filter_map(|p| fs::metadata(p).ok())
            .map(|m| m.len())
            .sum()
    }

    /// Opens a spare under the name `tmp`, to be written over; `None` if there is none (or it
    /// cannot be taken).
    fn take_spare(&self, tmp: &Path) -> Option<File> {
        let spare = self
            .spares
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .0
            .pop()?;
        if fs::rename(&spare, tmp).is_err() {
            let _ = fs::remove_file(&spare);
            return None;
        }
        OpenOptions::new().write(true).open(tmp).ok()
    }

    /// The path of ledger `seq` of run `epoch`.
    pub(super) fn path(&self, epoch: u64, seq: u32) -> PathBuf {
        self.dir.join(format!("{epoch}-{seq}{SUFFIX}"))
    }

    /// Writes ledger `seq` of run `epoch` durably: into a temporary file, `fdatasync`, renamed
    /// over its name (so a ledger written again replaces the old copy whole), then the directory
    /// synced so that the name survives a power cut. A failed write leaves no file under the
    /// ledger's name (a temporary one, if any, is removed here or on the next open).
    pub(super) fn write(&self, epoch: u64, seq: u32, bytes: &[u8]) -> Result<(), RingError> {
        let tmp = self.dir.join(format!("{epoch}-{seq}{TMP_SUFFIX}"));
        let written = (|| {
            let mut f = match self.take_spare(&tmp) {
                Some(f) => f,
                None => File::create(&tmp)?,
            };
            f.write_all(bytes)?;
            // A spare longer than this ledger is cut to it.
            f.set_len(bytes.len() as u64)?;
            f.sync_data()
        })();
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            return Err(io_err(&tmp)(e));
        }
        let path = self.path(epoch, seq);
        if let Err(e) = fs::rename(&tmp, &path) {
            let _ = fs::remove_file(&tmp);
            return Err(io_err(&path)(e));
        }
        self.sync_dir()
    }

    /// Syncs the directory, so that names created, renamed or removed in it are durable.
    pub(super) fn sync_dir(&self) -> Result<(), RingError> {
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(io_err(&self.dir))
    }

    /// Reads ledger `record.end.seq` of run `epoch` back and verifies every part
    /// ([`read_file`]). A missing file, or one whose length is not the record's, is corrupt
    /// without being read; memory is the file's length, which the record fixes.
    pub(super) fn read(
        &self,
        epoch: u64,
        record: Record,
    ) -> Result<(LedgerEnd, Vec<StoredChunk>), ReadFail> {
        let path = self.path(epoch, record.end.seq);
        let expected = file_len(&record)?;
        let mut f = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(StoredError::FileMissing.into())
            }
            Err(e) => return Err(ReadFail::Io(io_err(&path)(e))),
        };
        let len = f
            .metadata()
            .map_err(|e| ReadFail::Io(io_err(&path)(e)))?
            .len();
        if len != expected {
            return Err(StoredError::FileLength { len, expected }.into());
        }
        // `len` is the file's own length, equal to what the record counts.
        let mut bytes = Vec::with_capacity(len as usize);
        f.read_to_end(&mut bytes)
            .map_err(|e| ReadFail::Io(io_err(&path)(e)))?;
        Ok(read_file(record, &bytes)?)
    }

    /// Removes ledger `seq` of run `epoch`, keeping its file as a spare if there is room; a
    /// file already gone is fine, another failure is logged (the next open removes what no
    /// record owns).
    pub(super) fn remove(&self, epoch: u64, seq: u32) {
        let path = self.path(epoch, seq);
        if self.keep_spare(&path) {
            return;
        }
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => warn!(path = %path.display(), error = %e, "ring: ledger file not removed"),
        }
    }

    /// Every name in the directory, parsed.
    pub(super) fn list(&self) -> Result<Vec<(PathBuf, Name)>, RingError> {
        let mut out = Vec::new();
        for entry in fs::read_dir(&self.dir).map_err(io_err(&self.dir))? {
            let entry = entry.map_err(io_err(&self.dir))?;
            let name = entry.file_name();
            let parsed = name.to_str().map_or(Name::Other, parse_name);
            out.push((entry.path(), parsed));
        }
        Ok(out)
    }
}

/// Why reading a ledger failed.
pub(super) enum ReadFail {
    Sled(sled::Error),
    /// Reading the ledger's file failed (not: it is missing or short, which is corrupt).
    Io(RingError),
    Corrupt(StoredError),
}

impl From<sled::Error> for ReadFail {
    fn from(e: sled::Error) -> Self {
        ReadFail::Sled(e)
    }
}

impl From<StoredError> for ReadFail {
    fn from(e: StoredError) -> Self {
        ReadFail::Corrupt(e)
    }
}

impl ReadFail {
    pub(super) fn into_error(self, seq: u32) -> RingError {
        match self {
            ReadFail::Sled(e) => RingError::Sled(e),
            ReadFail::Io(e) => e,
            ReadFail::Corrupt(e) => RingError::Corrupt {
                seq,
                detail: e.to_string(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_strictly() {
        assert_eq!(parse_name("3-17.parts"), Name::Ledger { epoch: 3, seq: 17 });
        assert_eq!(parse_name("0-4294967295.parts"), {
            Name::Ledger {
                epoch: 0,
                seq: u32::MAX,
            }
        });
        assert_eq!(parse_name("3-17.tmp"), Name::Partial);
        for other in [
            "3-4294967296.parts",
            "-17.parts",
            "3-.parts",
            "3_17.parts",
            "+3-17.parts",
            "3-17.parts.bak",
            "db",
            "conf",
            "3-1 7.parts",
        ] {
            assert_eq!(parse_name(other), Name::Other, "{other}");
        }
    }
}
