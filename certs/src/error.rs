//! The one error type of this crate.

use std::io;
use std::path::PathBuf;

use time::OffsetDateTime;

use crate::Role;

/// Everything that can go wrong while managing a certificate directory or loading its files.
///
/// Messages are one lowercase line without the source; print the chain (`{:#}` with anyhow)
/// to see the underlying IO or rcgen error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CertError {
    /// A file or directory could not be read, written, created, linked or renamed.
    #[error("cannot {action} {}", path.display())]
    Io {
        /// What was being done: "read", "write", "create directory", ...
        action: &'static str,
        /// The file or directory concerned.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },

    /// The directory holds no certificate authority: `ca.pem` or `ca.key` is missing.
    #[error("no certificate authority in {}: {} is missing (run `init` first)", dir.display(), missing.display())]
    NotInitialized {
        /// The certificate directory.
        dir: PathBuf,
        /// The file that is missing.
        missing: PathBuf,
    },

    /// `init` found a file that belongs to an existing certificate authority.
    #[error("{} already exists: refusing to overwrite a certificate authority", path.display())]
    AlreadyInitialized {
        /// The existing file.
        path: PathBuf,
    },

    /// A certificate name is not usable as an identity and a file name.
    #[error("invalid certificate name {name:?}: {reason}")]
    InvalidName {
        /// The rejected name.
        name: String,
        /// Why it was rejected.
        reason: &'static str,
    },

    /// A certificate of that name is already issued and not revoked.
    #[error("a {role} certificate named {name} is already issued (serial {serial}); revoke it first or pick another name")]
    DuplicateName {
        /// The name asked for.
        name: String,
        /// The role of the existing certificate.
        role: Role,
        /// The serial number of the existing certificate, in hex.
        serial: String,
    },

    /// Issuing would overwrite a file that the index does not account for.
    #[error("{} already exists: refusing to overwrite it", path.display())]
    FileExists {
        /// The existing file.
        path: PathBuf,
    },

    /// No certificate of that name was ever issued from this certificate authority.
    #[error("no certificate named {name} was issued from this certificate authority")]
    UnknownName {
        /// The name asked for.
        name: String,
    },

    /// Every certificate of that name is already revoked.
    #[error("certificate {name} is already revoked (serial {serial})")]
    AlreadyRevoked {
        /// The name asked for.
        name: String,
        /// The serial number of the most recent certificate of that name, in hex.
        serial: String,
    },

    /// `NAME.pem` is not the certificate the index holds as current for that name.
    #[error("{} has serial {serial}, but the current certificate of that name is {current}: restore it before renewing", path.display())]
    NotCurrent {
        /// The certificate file.
        path: PathBuf,
        /// Its serial, in hex.
        serial: String,
        /// The current serial per the index, in hex.
        current: String,
    },

    /// A subject alternative name for a server certificate is neither an IP address nor a
    /// valid DNS name.
    #[error("invalid subject alternative name {san:?}: {reason}")]
    InvalidSan {
        /// The rejected value.
        san: String,
        /// Why it was rejected.
        reason: &'static str,
    },

    /// A server certificate was requested without any subject alternative name; TLS clients
    /// match the server name only against SANs, so it would be useless.
    #[error("server certificate {name} needs at least one subject alternative name (a DNS name or an IP address)")]
    MissingSan {
        /// The name of the server certificate.
        name: String,
    },

    /// A validity in days outside the accepted range.
    #[error("invalid validity of {days} days: expected 1 to {max}")]
    InvalidDays {
        /// The rejected number of days.
        days: u32,
        /// The largest accepted number of days.
        max: u32,
    },

    /// An explicit validity window that ends before it starts.
    #[error("invalid validity window: not_before {} is not before not_after {}", crate::rfc3339(*.not_before), crate::rfc3339(*.not_after))]
    InvalidValidity {
        /// Start of the window.
        not_before: OffsetDateTime,
        /// End of the window.
        not_after: OffsetDateTime,
    },

    /// A certificate would outlive the certificate authority that signs it; it would stop
    /// verifying when the authority expires.
    #[error("certificate would expire at {}, after the certificate authority does ({}); ask for fewer days", crate::rfc3339(*.not_after), crate::rfc3339(*.ca_not_after))]
    OutlivesCa {
        /// The requested end of validity.
        not_after: OffsetDateTime,
        /// The end of validity of the certificate authority.
        ca_not_after: OffsetDateTime,
    },

    /// A PEM file is malformed or holds no item of the expected kind.
    #[error("invalid PEM file {}: {reason}", path.display())]
    Pem {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },

    /// The index of issued certificates is missing, malformed or inconsistent.
    #[error("invalid index {}: {reason}", path.display())]
    Index {
        /// The index file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },

    /// The CA private key does not belong to the CA certificate.
    #[error("{} does not match the public key in {}", key.display(), cert.display())]
    KeyMismatch {
        /// The CA certificate.
        cert: PathBuf,
        /// The CA private key.
        key: PathBuf,
    },

    /// DER bytes do not parse as an X.509 certificate.
    #[error("invalid certificate: {reason}")]
    Certificate {
        /// The parser's complaint.
        reason: String,
    },

    /// A certificate carries no usable client identity: no `urn:ledger-relay:client:NAME`
    /// URI and no common name, or several different ones.
    #[error("certificate carries no usable client identity: {reason}")]
    NoIdentity {
        /// Why no identity could be taken from it.
        reason: String,
    },

    /// rcgen refused to build or sign a key, certificate or CRL.
    #[error("cannot {what}")]
    Generate {
        /// What was being generated.
        what: &'static str,
        /// rcgen's error.
        #[source]
        source: rcgen::Error,
    },

    /// The operating system's random number generator failed.
    #[error("cannot draw a random serial number")]
    Random {
        /// The generator's error.
        #[source]
        source: io::Error,
    },
}

impl CertError {
    pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        CertError::Io {
            action,
            path: path.into(),
            source,
        }
    }
}
