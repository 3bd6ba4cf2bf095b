//! Crash-safe file writes: every file is written under a temporary name in the same
//! directory, flushed, and only then published under its real name, so a reader (a relay
//! reloading `crl.pem`, an operator copying a key) never sees half a file.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use rand::RngCore;

use crate::CertError;

/// Mode of private keys: readable by their owner only.
pub(crate) const KEY_MODE: u32 = 0o600;
/// Mode of certificates, CRLs and the index: public information.
pub(crate) const PUBLIC_MODE: u32 = 0o644;

/// Whether anything (file, directory, dangling symlink) is at `path`.
pub(crate) fn exists(path: &Path) -> Result<bool, CertError> {
    match fs::symlink_metadata(path) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(CertError::io("inspect", path, e)),
    }
}

/// Reads a whole file.
pub(crate) fn read(path: &Path) -> Result<Vec<u8>, CertError> {
    fs::read(path).map_err(|e| CertError::io("read", path, e))
}

/// Creates `dir` (and its parents) if needed; a directory created here is private to its
/// owner, since it will hold private keys.
pub(crate) fn create_dir(dir: &Path) -> Result<(), CertError> {
    let mut builder = fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder
        .create(dir)
        .map_err(|e| CertError::io("create directory", dir, e))
}

/// Writes `bytes` to `path`, failing with [`CertError::FileExists`] if anything is already
/// there. Publishing is a hard link of the complete temporary file: it cannot clobber a file
/// that appeared in the meantime, unlike a rename.
pub(crate) fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<(), CertError> {
    let tmp = write_temp(path, bytes, mode)?;
    let linked = fs::hard_link(&tmp, path);
    let _ = fs::remove_file(&tmp);
    match linked {
        Ok(()) => {
            sync_parent(path);
            Ok(())
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Err(CertError::FileExists {
            path: path.to_owned(),
        }),
        Err(e) => Err(CertError::io("create", path, e)),
    }
}

/// Writes `bytes` to `path`, atomically replacing whatever is there (temporary file +
/// rename).
pub(crate) fn write_replace(path: &Path, bytes: &[u8], mode: u32) -> Result<(), CertError> {
    let tmp = write_temp(path, bytes, mode)?;
    if let Err(e) = fs::rename(&tmp, path) {
        let _ = fs::remove_file(&tmp);
        return Err(CertError::io("replace", path, e));
    }
    sync_parent(path);
    Ok(())
}

/// Moves `from` to `to` without overwriting anything at `to`.
pub(crate) fn move_new(from: &Path, to: &Path) -> Result<(), CertError> {
    match fs::hard_link(from, to) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            return Err(CertError::FileExists {
                path: to.to_owned(),
            })
        }
        Err(e) => return Err(CertError::io("create", to, e)),
    }
    fs::remove_file(from).map_err(|e| CertError::io("remove", from, e))?;
    sync_parent(to);
    sync_parent(from);
    Ok(())
}

/// Removes a file, ignoring its absence; used to undo a half-finished operation.
pub(crate) fn remove_quietly(path: &Path) {
    let _ = fs::remove_file(path);
}

fn write_temp(path: &Path, bytes: &[u8], mode: u32) -> Result<PathBuf, CertError> {
    let tmp = temp_path(path);
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        // Set at creation: a key must never exist on disk with wider permissions, even
        // briefly.
        options.mode(mode);
    }
    #[cfg(not(unix))]
    let _ = mode;
    let mut file: File = options
        .open(&tmp)
        .map_err(|e| CertError::io("create", &tmp, e))?;
    let written = file.write_all(bytes).and_then(|()| file.sync_all());
    if let Err(e) = written {
        drop(file);
        let _ = fs::remove_file(&tmp);
        return Err(CertError::io("write", &tmp, e));
    }
    Ok(tmp)
}

/// `.NAME.tmp.PID.RANDOM` beside `path`: hidden, never a valid certificate name (those start
/// with a letter or digit), and unique across concurrent writers.
fn temp_path(path: &Path) -> PathBuf {
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let nonce = rand::thread_rng().next_u32();
    path.with_file_name(format!(
        ".{file_name}.tmp.{}.{nonce:08x}",
        std::process::id()
    ))
}

/// Makes a rename or link durable. Best effort: not every file system lets a directory be
/// opened and synced, and the data itself was already synced.
fn sync_parent(path: &Path) {
    if let Some(parent) = path.parent() {
        let parent = if parent.as_os_str().is_empty() {
            Path::new(".")
        } else {
            parent
        };
        if let Ok(dir) = File::open(parent) {
            let _ = dir.sync_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_new_never_overwrites() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.pem");
        write_new(&path, b"one", PUBLIC_MODE).unwrap();
        let err = write_new(&path, b"two", PUBLIC_MODE).unwrap_err();
        assert!(matches!(err, CertError::FileExists { .. }), "{err}");
        assert_eq!(fs::read(&path).unwrap(), b"one");
        // No temporary file is left behind.
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn write_replace_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("crl.pem");
        write_replace(&path, b"one", PUBLIC_MODE).unwrap();
        write_replace(&path, b"two", PUBLIC_MODE).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[cfg(unix)]
    #[test]
    fn keys_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.key");
        write_new(&path, b"secret", KEY_MODE).unwrap();
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn move_new_never_overwrites() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        let b = dir.path().join("b");
        fs::write(&a, b"a").unwrap();
        fs::write(&b, b"b").unwrap();
        assert!(matches!(
            move_new(&a, &b),
            Err(CertError::FileExists { .. })
        ));
        fs::remove_file(&b).unwrap();
        move_new(&a, &b).unwrap();
        assert!(!a.exists());
        assert_eq!(fs::read(&b).unwrap(), b"a");
    }
}
