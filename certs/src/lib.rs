//! The operator's certificate authority for Ledger Relay, and the certificate plumbing the
//! relay and the subscriber share.
//!
//! What it does:
//! - [`CertDir`] manages a certificate directory: a P-256 CA (`ca.pem`, `ca.key`), server and
//!   client certificates it issues (`NAME.pem`, `NAME.key`), a signed CRL (`crl.pem`) and an
//!   index of every issued serial (`index.toml`, see [Index format](#index-format)). The
//!   `ledger-certs` binary is a thin command line over it.
//! - [`client_identity`] reads the name the relay authorizes out of a client certificate.
//! - [`load_certs`], [`load_key`], [`load_crls`] read PEM files into rustls' types.
//! - [`cert_not_after`] and [`crl_next_update`] say when a certificate or a CRL runs out.
//!
//! What it does not do: it verifies nothing at connection time (rustls' webpki verifiers do,
//! with the CA and CRL loaded from here), it does not distribute files or reload anything, and
//! it does not serialize concurrent writers to one directory.
//!
//! # Directory layout
//!
//! ```text
//! DIR/ca.pem         CA certificate (the trust anchor relays and subscribers load)
//! DIR/ca.key         CA private key, mode 0600; needed only to issue and revoke
//! DIR/crl.pem        signed CRL listing every revoked serial, always present
//! DIR/index.toml     every issued certificate: name, role, serial, validity, revocation
//! DIR/NAME.pem       an issued certificate
//! DIR/NAME.key       its private key, mode 0600
//! DIR/revoked/       NAME.SERIAL.{pem,key} of revoked certificates whose name was reissued
//! DIR/renewed/       NAME.SERIAL.{pem,key} of certificates `renew` replaced (valid until they expire)
//! ```
//!
//! # Index format
//!
//! `index.toml`, version 1: top-level `version = 1` and `crl_number` (the number of the
//! current `crl.pem`, strictly increasing), then one `[[certificate]]` table per issued
//! certificate in issue order, with `name`, `role` (`ca`, `server` or `client`), `serial`
//! (lowercase hex), `not_before` and `not_after` (RFC 3339, UTC), `revoked_at` once revoked
//! and `renewed_at` once `renew` replaced it. The file is rewritten whole through a temporary file and a rename.

#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod dir;
mod error;
mod expiry;
mod fsutil;
mod identity;
mod index;
mod load;
mod names;

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

pub use dir::{
    CertDir, Issued, CLOCK_SKEW, CRL_VALIDITY, DEFAULT_CA_DAYS, DEFAULT_LEAF_DAYS, MAX_DAYS,
};
pub use error::CertError;
pub use expiry::{cert_not_after, crl_next_update};
pub use identity::{client_identity, CLIENT_URI_PREFIX};
pub use load::{load_certs, load_crls, load_key, parse_certs, parse_key};
pub use names::{validate_name, MAX_NAME_LEN};

/// What a certificate is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The certificate authority itself.
    Ca,
    /// A relay: EKU serverAuth, DNS and IP SANs.
    Server,
    /// A subscriber: EKU clientAuth, identity in CN and SAN URI.
    Client,
}

impl Role {
    /// `ca`, `server` or `client`, as in the index and in `list`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Ca => "ca",
            Role::Server => "server",
            Role::Client => "client",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "ca" => Ok(Role::Ca),
            "server" => Ok(Role::Server),
            "client" => Ok(Role::Client),
            other => Err(format!("unknown role {other:?}")),
        }
    }
}

/// One certificate of the index, as `list` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Entry {
    /// The certificate's name (`ca` for the CA).
    pub name: String,
    /// What it is for.
    pub role: Role,
    /// Its serial number (big-endian, positive, as encoded in DER).
    pub serial: Vec<u8>,
    /// Start of validity.
    pub not_before: OffsetDateTime,
    /// End of validity.
    pub not_after: OffsetDateTime,
    /// Whether it is listed in `crl.pem`.
    pub revoked: bool,
    /// When it was revoked, if it was.
    pub revoked_at: Option<OffsetDateTime>,
    /// When `renew` replaced it with a newer certificate of the same name, if it did.
    pub renewed_at: Option<OffsetDateTime>,
}

/// Certificates that expire within this many days are marked in `list`: time to renew.
pub const EXPIRY_WARNING_DAYS: i64 = 30;

impl Entry {
    /// The serial number in lowercase hex.
    pub fn serial_hex(&self) -> String {
        index::encode_hex(&self.serial)
    }

    /// What `list` notes about it at `now`: `revoked` and `renewed` ones need nothing, so
    /// `-`; else `expired`, or `expires-in-Nd` within [`EXPIRY_WARNING_DAYS`] days (`N`
    /// rounded down), else `-`.
    pub fn note(&self, now: OffsetDateTime) -> String {
        if self.revoked || self.renewed_at.is_some() {
            return "-".into();
        }
        let left = self.not_after - now;
        if left <= time::Duration::ZERO {
            "expired".into()
        } else if left < time::Duration::days(EXPIRY_WARNING_DAYS) {
            format!("expires-in-{}d", left.whole_days())
        } else {
            "-".into()
        }
    }
}

/// The table `ledger-certs list` prints: a header line, then one line per entry with name,
/// role, serial (hex), not_after (RFC 3339), revoked (yes/no) and a note ([`Entry::note`] at
/// `now`, plus `renewed` for a certificate `renew` replaced), in aligned columns. Every cell
/// is one word, so scripts can split on whitespace.
pub fn format_list(entries: &[Entry], now: OffsetDateTime) -> String {
    let rows: Vec<[String; 6]> = entries
        .iter()
        .map(|e| {
            [
                e.name.clone(),
                e.role.to_string(),
                e.serial_hex(),
                rfc3339(e.not_after),
                if e.revoked { "yes" } else { "no" }.to_owned(),
                if e.renewed_at.is_some() && !e.revoked {
                    "renewed".to_owned()
                } else {
                    e.note(now)
                },
            ]
        })
        .collect();
    let header = ["NAME", "ROLE", "SERIAL", "NOT_AFTER", "REVOKED", "NOTE"].map(str::to_owned);
    let mut widths = header.clone().map(|h| h.len());
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let mut out = String::new();
    for row in std::iter::once(&header).chain(&rows) {
        let mut line = String::new();
        for (i, (cell, w)) in row.iter().zip(widths).enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<w$}  "));
            }
        }
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// RFC 3339 in UTC with whole seconds, e.g. `2026-01-01T12:00:00Z`.
pub fn rfc3339(t: OffsetDateTime) -> String {
    let t = t.to_offset(time::UtcOffset::UTC);
    let t = t.replace_nanosecond(0).unwrap_or(t);
    t.format(&time::format_description::well_known::Rfc3339)
        // Only years outside 0..=9999 fail to format, and X.509 cannot encode those.
        .unwrap_or_else(|_| t.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    #[test]
    fn list_table_is_aligned() {
        let entries = vec![
            Entry {
                name: "ca".into(),
                role: Role::Ca,
                serial: vec![0x01, 0x02],
                not_before: datetime!(2025-01-01 0:00 UTC),
                not_after: datetime!(2035-01-01 0:00 UTC),
                revoked: false,
                revoked_at: None,
                renewed_at: None,
            },
            Entry {
                name: "a-much-longer-name".into(),
                role: Role::Client,
                serial: vec![0x7f, 0xff],
                not_before: datetime!(2025-01-01 0:00 UTC),
                not_after: datetime!(2026-01-01 12:30:15 UTC),
                revoked: true,
                revoked_at: Some(datetime!(2025-06-01 0:00 UTC)),
                renewed_at: None,
            },
        ];
        let table = format_list(&entries, datetime!(2025-07-01 0:00 UTC));
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("NAME"));
        assert!(
            lines[1].starts_with("ca                  ca      0102"),
            "{table}"
        );
        assert!(
            lines[2].ends_with("7fff    2026-01-01T12:30:15Z  yes      -"),
            "{table}"
        );
        let col = lines[0].find("ROLE").unwrap();
        assert_eq!(&lines[2][col..col + 6], "client");
    }

    #[test]
    fn notes_mark_expiry_within_30_days() {
        let mut e = Entry {
            name: "relay".into(),
            role: Role::Server,
            serial: vec![1],
            not_before: datetime!(2025-01-01 0:00 UTC),
            not_after: datetime!(2026-01-31 12:00 UTC),
            revoked: false,
            revoked_at: None,
            renewed_at: None,
        };
        assert_eq!(e.note(datetime!(2025-12-01 0:00 UTC)), "-", "61 days left");
        assert_eq!(e.note(datetime!(2026-01-01 12:00 UTC)), "-", "30 days left");
        assert_eq!(e.note(datetime!(2026-01-01 12:00:01 UTC)), "expires-in-29d");
        assert_eq!(e.note(datetime!(2026-01-31 11:00 UTC)), "expires-in-0d");
        assert_eq!(e.note(datetime!(2026-01-31 12:00 UTC)), "expired");
        e.renewed_at = Some(datetime!(2026-01-20 0:00 UTC));
        assert_eq!(e.note(datetime!(2026-01-25 0:00 UTC)), "-", "renewed");
        let table = format_list(&[e.clone()], datetime!(2026-01-25 0:00 UTC));
        assert!(
            table.lines().nth(1).unwrap().ends_with("no       renewed"),
            "{table}"
        );
        e.renewed_at = None;
        e.revoked = true;
        assert_eq!(e.note(datetime!(2026-01-25 0:00 UTC)), "-", "revoked");
    }

    #[test]
    fn roles_round_trip() {
        for role in [Role::Ca, Role::Server, Role::Client] {
            assert_eq!(role.as_str().parse::<Role>().unwrap(), role);
        }
        assert!("admin".parse::<Role>().is_err());
    }
}
