//! `index.toml`: the record of every certificate issued from a certificate authority.
//!
//! Format (version 1), human-readable TOML, rewritten whole (temporary file + rename) on every
//! change:
//!
//! ```toml
//! version = 1
//! crl_number = 2            # the CRL number of the current crl.pem; only ever increases
//!
//! [[certificate]]           # one table per certificate, in issue order
//! name = "ca"
//! role = "ca"               # "ca", "server" or "client"
//! serial = "4c0e..."        # lowercase hex, 16 bytes, as in the certificate
//! not_before = "2025-01-01T11:55:00Z"
//! not_after = "2035-01-01T12:00:00Z"
//!
//! [[certificate]]
//! name = "rpc-1"
//! role = "client"
//! serial = "1f3a..."
//! not_before = "2025-01-01T11:55:00Z"
//! not_after = "2026-01-01T12:00:00Z"
//! revoked_at = "2025-03-01T09:00:00Z"   # present only once revoked
//! renewed_at = "2025-12-01T09:00:00Z"   # present only once `renew` replaced it
//! ```
//!
//! A name may appear more than once: after a revocation the name can be issued again, and
//! the old entry stays (its serial is still listed in the CRL); after `renew`, the old entry
//! stays too, valid until it expires. At most one entry per name is neither revoked nor
//! renewed: the current one, whose files are `NAME.pem` and `NAME.key`.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::{fsutil, names, CertError, Role};

/// The only index format version this crate reads and writes.
const VERSION: u32 = 1;

const HEADER: &str = "\
# Ledger Relay certificate index, maintained by ledger-certs: one [[certificate]] table per
# certificate issued from the CA in this directory, in issue order. crl_number is the number of
# the current crl.pem. Times are RFC 3339 (UTC); serials are lowercase hex.
# Do not edit while ledger-certs runs; it rewrites this file whole.

";

/// The whole index file.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Index {
    pub version: u32,
    pub crl_number: u64,
    #[serde(default, rename = "certificate")]
    pub certificates: Vec<Record>,
}

/// One issued certificate.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Record {
    pub name: String,
    pub role: Role,
    pub serial: String,
    #[serde(with = "time::serde::rfc3339")]
    pub not_before: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub not_after: OffsetDateTime,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "time::serde::rfc3339::option"
    )]
    pub revoked_at: Option<OffsetDateTime>,
    /// When `renew` replaced this certificate with a newer one of the same name; the old one
    /// stays valid (and revocable) until it expires.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "time::serde::rfc3339::option"
    )]
    pub renewed_at: Option<OffsetDateTime>,
}

impl Record {
    /// Neither revoked nor replaced by `renew`.
    pub fn is_current(&self) -> bool {
        self.revoked_at.is_none() && self.renewed_at.is_none()
    }
}

impl Index {
    pub fn new(ca: Record) -> Self {
        Index {
            version: VERSION,
            // CRL numbers are positive; the CRL written by `init` is number 1.
            crl_number: 1,
            certificates: vec![ca],
        }
    }

    pub fn load(path: &Path) -> Result<Self, CertError> {
        let bad = |reason: String| CertError::Index {
            path: path.to_owned(),
            reason,
        };
        if !fsutil::exists(path)? {
            return Err(bad("the file is missing".into()));
        }
        let bytes = fsutil::read(path)?;
        let text = std::str::from_utf8(&bytes).map_err(|_| bad("not UTF-8".into()))?;
        let index: Index = toml::from_str(text).map_err(|e| bad(one_line(&e.to_string())))?;
        index.check().map_err(bad)?;
        Ok(index)
    }

    pub fn store(&self, path: &Path) -> Result<(), CertError> {
        fsutil::write_replace(path, self.to_text(path)?.as_bytes(), fsutil::PUBLIC_MODE)
    }

    /// Like [`Index::store`], failing if an index already exists.
    pub fn store_new(&self, path: &Path) -> Result<(), CertError> {
        fsutil::write_new(path, self.to_text(path)?.as_bytes(), fsutil::PUBLIC_MODE)
    }

    /// The file's text: the header comment, then the index as TOML (`path` names the file in
    /// an error).
    fn to_text(&self, path: &Path) -> Result<String, CertError> {
        let mut text = String::from(HEADER);
        // Serializing plain strings, integers and arrays of tables cannot fail.
        let body = toml::to_string(self).map_err(|e| CertError::Index {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
        text.push_str(&body);
        Ok(text)
    }

    /// The current entry of `name`: neither revoked nor renewed, if any.
    pub fn active(&self, name: &str) -> Option<&Record> {
        self.certificates
            .iter()
            .find(|r| r.name == name && r.is_current())
    }

    /// The most recent entry of `name`, revoked or not.
    pub fn latest(&self, name: &str) -> Option<&Record> {
        self.certificates.iter().rev().find(|r| r.name == name)
    }

    pub fn has_serial(&self, serial_hex: &str) -> bool {
        self.certificates.iter().any(|r| r.serial == serial_hex)
    }

    fn check(&self) -> Result<(), String> {
        if self.version != VERSION {
            return Err(format!(
                "unsupported version {} (this ledger-certs reads version {VERSION})",
                self.version
            ));
        }
        if self.crl_number == 0 {
            return Err("crl_number must be positive".into());
        }
        let mut serials = HashSet::new();
        let mut active = HashSet::new();
        let mut cas = 0;
        for r in &self.certificates {
            match r.role {
                Role::Ca => {
                    cas += 1;
                    if r.name != "ca" {
                        return Err(format!("the ca entry is named {:?}", r.name));
                    }
                }
                _ => names::validate_name(&r.name).map_err(|e| e.to_string())?,
            }
            let serial = decode_hex(&r.serial)
                .ok_or_else(|| format!("serial {:?} of {} is not hex", r.serial, r.name))?;
            if serial.is_empty() || serial.len() > 20 {
                return Err(format!("serial of {} is not 1 to 20 bytes", r.name));
            }
            if !serials.insert(r.serial.as_str()) {
                return Err(format!("serial {} appears twice", r.serial));
            }
            if r.is_current() && !active.insert(r.name.as_str()) {
                return Err(format!(
                    "{} has two certificates that are neither revoked nor renewed",
                    r.name
                ));
            }
        }
        if cas != 1 {
            return Err(format!("expected one ca entry, found {cas}"));
        }
        Ok(())
    }
}

/// Lowercase hex, the index's and `list`'s spelling of serial numbers.
pub(crate) fn encode_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Parses hex of either case; `None` if odd-length or not hex.
pub(crate) fn decode_hex(hex: &str) -> Option<Vec<u8>> {
    if hex.len() % 2 != 0 || !hex.is_ascii() {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).ok())
        .collect()
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Where an index lives in a certificate directory.
pub(crate) fn path_in(dir: &Path) -> PathBuf {
    dir.join("index.toml")
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    fn record(name: &str, role: Role, serial: &str) -> Record {
        Record {
            name: name.into(),
            role,
            serial: serial.into(),
            not_before: datetime!(2025-01-01 0:00 UTC),
            not_after: datetime!(2026-01-01 0:00 UTC),
            revoked_at: None,
            renewed_at: None,
        }
    }

    #[test]
    fn round_trip_is_readable_toml() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("index.toml");
        let mut index = Index::new(record("ca", Role::Ca, "01"));
        let mut revoked = record("rpc-1", Role::Client, "02");
        revoked.revoked_at = Some(datetime!(2025-02-01 0:00 UTC));
        index.certificates.push(revoked);
        index.certificates.push(record("rpc-1", Role::Client, "03"));
        index.crl_number = 2;
        index.store_new(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.starts_with("# Ledger Relay certificate index"),
            "{text}"
        );
        assert!(text.contains("[[certificate]]"), "{text}");
        assert!(
            text.contains("revoked_at = \"2025-02-01T00:00:00Z\""),
            "{text}"
        );
        assert!(text.contains("role = \"client\""), "{text}");
        let back = Index::load(&path).unwrap();
        assert_eq!(back.crl_number, 2);
        assert_eq!(back.certificates.len(), 3);
        assert_eq!(back.active("rpc-1").unwrap().serial, "03");
        assert_eq!(back.latest("rpc-1").unwrap().serial, "03");
        assert!(index.store_new(&path).is_err());
    }

    #[test]
    fn inconsistent_indexes_are_rejected() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("index.toml");
        let cases: Vec<Index> = vec![
            {
                let mut i = Index::new(record("ca", Role::Ca, "01"));
                i.certificates.push(record("a", Role::Client, "01"));
                i
            },
            {
                let mut i = Index::new(record("ca", Role::Ca, "01"));
                i.certificates.push(record("a", Role::Client, "02"));
                i.certificates.push(record("a", Role::Server, "03"));
                i
            },
            {
                let mut i = Index::new(record("ca", Role::Ca, "01"));
                i.certificates.push(record("a", Role::Client, "zz"));
                i
            },
            {
                let mut i = Index::new(record("ca", Role::Ca, "01"));
                i.version = 9;
                i
            },
            {
                let mut i = Index::new(record("ca", Role::Ca, "01"));
                i.crl_number = 0;
                i
            },
            Index {
                version: VERSION,
                crl_number: 1,
                certificates: vec![],
            },
        ];
        for index in cases {
            index.store(&path).unwrap();
            let err = Index::load(&path).unwrap_err();
            assert!(matches!(err, CertError::Index { .. }), "{err}");
        }
        std::fs::write(&path, "version = 1\ncrl_number = [").unwrap();
        let err = Index::load(&path).unwrap_err();
        assert!(!err.to_string().contains('\n'), "{err}");
    }

    #[test]
    fn hex() {
        assert_eq!(encode_hex(&[0x01, 0xab, 0x00]), "01ab00");
        assert_eq!(decode_hex("01AB00"), Some(vec![0x01, 0xab, 0x00]));
        assert_eq!(decode_hex("1"), None);
        assert_eq!(decode_hex("zz"), None);
    }
}
