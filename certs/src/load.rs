//! PEM loading for the relay and the subscriber, in the types rustls takes.

use std::path::Path;

use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer};

use crate::{fsutil, CertError};

/// Every certificate (`BEGIN CERTIFICATE`) in the PEM file at `path`, in file order (for a
/// chain: leaf first). Fails if there is none.
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, CertError> {
    load_all(path, "CERTIFICATE")
}

/// The first private key (PKCS#8, SEC1 or PKCS#1) in the PEM file at `path`.
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, CertError> {
    parse_key(path, &fsutil::read(path)?)
}

/// [`load_certs`] of bytes already read from `path` (named in errors): a caller that must
/// know exactly which bytes it loaded, to notice when the file changes, reads once.
pub fn parse_certs(path: &Path, bytes: &[u8]) -> Result<Vec<CertificateDer<'static>>, CertError> {
    parse_all(path, "CERTIFICATE", bytes)
}

/// [`load_key`] of bytes already read from `path` (named in errors).
pub fn parse_key(path: &Path, bytes: &[u8]) -> Result<PrivateKeyDer<'static>, CertError> {
    PrivateKeyDer::from_pem_slice(bytes).map_err(|e| pem_error(path, "PRIVATE KEY", e))
}

/// Every CRL (`BEGIN X509 CRL`) in the PEM file at `path`. Fails if there is none: a
/// certificate directory always has a signed CRL, even an empty one.
pub fn load_crls(path: &Path) -> Result<Vec<CertificateRevocationListDer<'static>>, CertError> {
    load_all(path, "X509 CRL")
}

fn load_all<T: PemObject>(path: &Path, label: &'static str) -> Result<Vec<T>, CertError> {
    parse_all(path, label, &fsutil::read(path)?)
}

fn parse_all<T: PemObject>(
    path: &Path,
    label: &'static str,
    bytes: &[u8],
) -> Result<Vec<T>, CertError> {
    let items = T::pem_slice_iter(bytes)
        .collect::<Result<Vec<T>, _>>()
        .map_err(|e| pem_error(path, label, e))?;
    if items.is_empty() {
        return Err(pem_error(path, label, pem::Error::NoItemsFound));
    }
    Ok(items)
}

fn pem_error(path: &Path, label: &str, e: pem::Error) -> CertError {
    let reason = match e {
        pem::Error::NoItemsFound => format!("no {label} section"),
        other => other.to_string(),
    };
    CertError::Pem {
        path: path.to_owned(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_and_garbage_files_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.pem");
        std::fs::write(&path, "").unwrap();
        assert!(matches!(load_certs(&path), Err(CertError::Pem { .. })));
        assert!(matches!(load_key(&path), Err(CertError::Pem { .. })));
        assert!(matches!(load_crls(&path), Err(CertError::Pem { .. })));
        std::fs::write(
            &path,
            "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        assert!(matches!(load_certs(&path), Err(CertError::Pem { .. })));
        let missing = dir.path().join("missing.pem");
        let err = load_certs(&missing).unwrap_err();
        assert!(matches!(err, CertError::Io { .. }), "{err}");
        assert!(err.to_string().contains("missing.pem"), "{err}");
    }
}
