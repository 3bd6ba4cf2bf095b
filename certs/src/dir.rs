//! A certificate directory: the CA, the certificates it issued, its CRL and its index.

use std::fmt;
use std::path::{Path, PathBuf};

use rand::RngCore;
use rcgen::string::Ia5String;
use rcgen::{
    BasicConstraints, CertificateParams, CertificateRevocationListParams, DnType,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyIdMethod, KeyPair, KeyUsagePurpose, PublicKeyData,
    RevokedCertParams, SanType, SerialNumber,
};
use rustls::pki_types::CertificateDer;
use time::{Duration, OffsetDateTime};
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::index::{self, decode_hex, encode_hex, Index, Record};
use crate::names::{self, San};
use crate::{fsutil, load, CertError, Entry, Role, CLIENT_URI_PREFIX};

/// Default validity of a new CA, in days (about ten years).
pub const DEFAULT_CA_DAYS: u32 = 3650;
/// Default validity of a server or client certificate, in days.
pub const DEFAULT_LEAF_DAYS: u32 = 365;
/// Longest accepted validity, in days (about a hundred years).
pub const MAX_DAYS: u32 = 36_500;
/// How far in the past `not_before` is set, so that a peer whose clock is a little behind
/// does not reject a certificate issued just now.
pub const CLOCK_SKEW: Duration = Duration::minutes(5);
/// How long a CRL is declared current (its `next_update`). rustls accepts an expired CRL
/// unless told otherwise; operators re-sign with `refresh-crl` (or by revoking).
pub const CRL_VALIDITY: Duration = Duration::days(30);
/// Organization in every subject this tool writes.
const ORGANIZATION: &str = "Ledger Relay";
/// Length of the random serial numbers: 16 bytes, well above the 64 bits of entropy that
/// public CAs must use, and within the 20 bytes that RFC 5280 allows.
const SERIAL_LEN: usize = 16;
/// Subdirectory where the files of a revoked certificate go when its name is issued again.
const REVOKED_DIR: &str = "revoked";
/// Subdirectory where `renew` moves the files of the certificate it replaces.
const RENEWED_DIR: &str = "renewed";

/// What is being issued, with what only that kind needs.
enum Kind<'a> {
    Server(&'a [San]),
    Client,
}

/// What an issue operation produced.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Issued {
    /// The certificate's name (its CN, and for a client its identity).
    pub name: String,
    /// Server or client.
    pub role: Role,
    /// The certificate's serial number (big-endian, positive, as encoded in DER).
    pub serial: Vec<u8>,
    /// Start of validity.
    pub not_before: OffsetDateTime,
    /// End of validity.
    pub not_after: OffsetDateTime,
    /// Where the certificate was written (`DIR/NAME.pem`).
    pub cert_path: PathBuf,
    /// Where the private key was written (`DIR/NAME.key`, mode 0600).
    pub key_path: PathBuf,
    /// The certificate itself.
    pub cert_der: CertificateDer<'static>,
}

impl Issued {
    /// The serial number in lowercase hex, as `list` and the index show it.
    pub fn serial_hex(&self) -> String {
        encode_hex(&self.serial)
    }
}

/// A certificate directory with its CA loaded and ready to sign.
///
/// Every operation reads the index from disk and writes it back whole, so a `CertDir` can be
/// kept open while the CLI works on the same directory. Two processes changing the same
/// directory at the same instant are not supported: one of their index updates would be lost.
pub struct CertDir {
    dir: PathBuf,
    issuer: Issuer<'static, KeyPair>,
    ca_not_after: OffsetDateTime,
}

impl fmt::Debug for CertDir {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the CA key.
        f.debug_struct("CertDir")
            .field("dir", &self.dir)
            .field("ca_not_after", &self.ca_not_after)
            .finish_non_exhaustive()
    }
}

impl CertDir {
    /// Creates a new certificate authority in `dir` (created if needed, mode 0700), valid
    /// for `days` days: writes `ca.key` (mode 0600), `ca.pem`, an empty signed `crl.pem`
    /// (CRL number 1) and `index.toml`.
    ///
    /// Refuses with [`CertError::AlreadyInitialized`] if any of these files exists.
    pub fn init(dir: &Path, days: u32) -> Result<CertDir, CertError> {
        check_days(days)?;
        fsutil::create_dir(dir)?;
        let ca_path = dir.join("ca.pem");
        let ca_key_path = dir.join("ca.key");
        let crl_path = dir.join("crl.pem");
        let index_path = index::path_in(dir);
        for path in [&ca_path, &ca_key_path, &crl_path, &index_path] {
            if fsutil::exists(path)? {
                return Err(CertError::AlreadyInitialized { path: path.clone() });
            }
        }

        let now = now();
        let not_before = now - CLOCK_SKEW;
        let not_after = now + Duration::days(i64::from(days));
        let serial = random_serial(|_| false)?;
        let key = KeyPair::generate().map_err(|source| CertError::Generate {
            what: "generate the CA key",
            source,
        })?;
        let mut params = CertificateParams::default();
        // Distinct CAs get distinct subjects, so an operator (and a TLS stack's error
        // message) can tell them apart.
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(
            DnType::CommonName,
            format!("Ledger Relay CA {}", encode_hex(&serial[..4])),
        );
        params
            .distinguished_name
            .push(DnType::OrganizationName, ORGANIZATION);
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.serial_number = Some(SerialNumber::from_slice(&serial));
        params.not_before = not_before;
        params.not_after = not_after;
        let cert = params
            .self_signed(&key)
            .map_err(|source| CertError::Generate {
                what: "sign the CA certificate",
                source,
            })?;
        let key_pem = key.serialize_pem();
        let cert_pem = cert.pem();
        let issuer = Issuer::new(params, key);

        let index = Index::new(Record {
            name: "ca".into(),
            role: Role::Ca,
            serial: encode_hex(&serial),
            not_before,
            not_after,
            revoked_at: None,
            renewed_at: None,
        });
        let crl_pem = sign_crl(&issuer, &index, now)?;

        // The key first: if anything below fails, `init` refuses to run again until the
        // operator has looked at the directory, rather than silently making a second CA.
        fsutil::write_new(&ca_key_path, key_pem.as_bytes(), fsutil::KEY_MODE)?;
        fsutil::write_new(&ca_path, cert_pem.as_bytes(), fsutil::PUBLIC_MODE)?;
        index.store_new(&index_path)?;
        fsutil::write_new(&crl_path, crl_pem.as_bytes(), fsutil::PUBLIC_MODE)?;

        Ok(CertDir {
            dir: dir.to_owned(),
            issuer,
            ca_not_after: not_after,
        })
    }

    /// Opens the certificate authority in `dir`: loads `ca.pem` and `ca.key`, checks that
    /// they belong together and that `index.toml` is readable.
    pub fn open(dir: &Path) -> Result<CertDir, CertError> {
        let ca_path = dir.join("ca.pem");
        let ca_key_path = dir.join("ca.key");
        for path in [&ca_path, &ca_key_path] {
            if !fsutil::exists(path)? {
                return Err(CertError::NotInitialized {
                    dir: dir.to_owned(),
                    missing: path.clone(),
                });
            }
        }
        let ca_der = load::load_certs(&ca_path)?.remove(0);
        let key_bytes = fsutil::read(&ca_key_path)?;
        let key_pem = std::str::from_utf8(&key_bytes).map_err(|_| CertError::Pem {
            path: ca_key_path.clone(),
            reason: "not UTF-8".into(),
        })?;
        let key = KeyPair::from_pem(key_pem).map_err(|e| CertError::Pem {
            path: ca_key_path.clone(),
            reason: e.to_string(),
        })?;
        let (_, ca) = X509Certificate::from_der(&ca_der).map_err(|e| CertError::Pem {
            path: ca_path.clone(),
            reason: format!("invalid certificate: {e}"),
        })?;
        if ca.public_key().raw != key.subject_public_key_info().as_slice() {
            return Err(CertError::KeyMismatch {
                cert: ca_path,
                key: ca_key_path,
            });
        }
        let ca_not_after = ca.validity().not_after.to_datetime();
        let issuer =
            Issuer::from_ca_cert_der(&ca_der, key).map_err(|source| CertError::Generate {
                what: "use ca.pem as an issuer",
                source,
            })?;
        Index::load(&index::path_in(dir))?;
        Ok(CertDir {
            dir: dir.to_owned(),
            issuer,
            ca_not_after,
        })
    }

    /// Issues a server certificate `NAME.pem` + `NAME.key` valid for `days` days, with
    /// EKU serverAuth and one SAN per entry of `sans` (an IP address becomes an IP SAN,
    /// anything else must be a DNS name).
    pub fn issue_server(
        &self,
        name: &str,
        sans: &[String],
        days: u32,
    ) -> Result<Issued, CertError> {
        names::validate_name(name)?;
        let sans = names::parse_sans(name, sans)?;
        check_days(days)?;
        let now = now();
        self.issue(
            name,
            Kind::Server(&sans),
            now - CLOCK_SKEW,
            now + Duration::days(i64::from(days)),
        )
    }

    /// Issues a client certificate `NAME.pem` + `NAME.key` valid for `days` days, with EKU
    /// clientAuth, CN=NAME and the SAN URI `urn:ledger-relay:client:NAME`.
    pub fn issue_client(&self, name: &str, days: u32) -> Result<Issued, CertError> {
        names::validate_name(name)?;
        check_days(days)?;
        let now = now();
        self.issue(
            name,
            Kind::Client,
            now - CLOCK_SKEW,
            now + Duration::days(i64::from(days)),
        )
    }

    /// Like [`CertDir::issue_client`] with an explicit validity window, which may lie
    /// entirely in the past or the future (for tests of expiry handling). Sub-second parts
    /// are dropped, as X.509 encodes whole seconds.
    pub fn issue_client_with_validity(
        &self,
        name: &str,
        not_before: OffsetDateTime,
        not_after: OffsetDateTime,
    ) -> Result<Issued, CertError> {
        names::validate_name(name)?;
        let not_before = whole_seconds(not_before);
        let not_after = whole_seconds(not_after);
        if not_before >= not_after {
            return Err(CertError::InvalidValidity {
                not_before,
                not_after,
            });
        }
        self.issue(name, Kind::Client, not_before, not_after)
    }

    /// Issues a fresh certificate (new key, new serial, `days` days from now) for `name`, which
    /// must have a current certificate: the same role, and for a server the same subject
    /// alternative names, read from `NAME.pem`. The new pair becomes `NAME.pem` + `NAME.key`;
    /// the old one moves to `renewed/NAME.SERIAL.{pem,key}` and stays valid until it expires
    /// (it is marked `renewed_at` in the index, and `revoke` revokes it with the new one).
    ///
    /// This is how a certificate is replaced before it expires without a moment in which the
    /// peer holds no valid certificate: deploy the new files, restart, and the old ones simply
    /// run out.
    pub fn renew(&self, name: &str, days: u32) -> Result<Issued, CertError> {
        names::validate_name(name)?;
        check_days(days)?;
        let index_path = self.index_path();
        let mut index = Index::load(&index_path)?;
        let Some(pos) = index
            .certificates
            .iter()
            .position(|r| r.name == name && r.is_current())
        else {
            return Err(match index.latest(name) {
                Some(r) => CertError::AlreadyRevoked {
                    name: name.to_owned(),
                    serial: r.serial.clone(),
                },
                None => CertError::UnknownName {
                    name: name.to_owned(),
                },
            });
        };
        let current = index.certificates[pos].clone();
        let cert_path = self.cert_path(name);
        let key_path = self.key_path(name);
        let der = load::load_certs(&cert_path)?.remove(0);
        let (_, cert) = X509Certificate::from_der(&der).map_err(|e| CertError::Pem {
            path: cert_path.clone(),
            reason: format!("invalid certificate: {e}"),
        })?;
        let on_disk = encode_hex(cert.raw_serial());
        if on_disk != current.serial {
            return Err(CertError::NotCurrent {
                path: cert_path,
                serial: on_disk,
                current: current.serial,
            });
        }
        let sans = match current.role {
            Role::Server => Some(sans_of(&cert, &cert_path)?),
            _ => None,
        };
        let now = now();
        let not_after = now + Duration::days(i64::from(days));
        if not_after > self.ca_not_after {
            return Err(CertError::OutlivesCa {
                not_after,
                ca_not_after: self.ca_not_after,
            });
        }

        // The old files go to the archive first (nothing is overwritten), then the index says
        // so, then the new certificate is issued under the name. A failure puts back what was
        // done.
        let archive = self.dir.join(RENEWED_DIR);
        fsutil::create_dir(&archive)?;
        let old_cert = archive.join(format!("{name}.{}.pem", current.serial));
        let old_key = archive.join(format!("{name}.{}.key", current.serial));
        fsutil::move_new(&cert_path, &old_cert)?;
        if let Err(e) = fsutil::move_new(&key_path, &old_key) {
            let _ = fsutil::move_new(&old_cert, &cert_path);
            return Err(e);
        }
        let restore = |index: &mut Index| {
            index.certificates[pos].renewed_at = None;
            let _ = index.store(&index_path);
            let _ = fsutil::move_new(&old_key, &key_path);
            let _ = fsutil::move_new(&old_cert, &cert_path);
        };
        index.certificates[pos].renewed_at = Some(now);
        if let Err(e) = index.store(&index_path) {
            restore(&mut index);
            return Err(e);
        }
        let kind = match &sans {
            Some(sans) => Kind::Server(sans),
            None => Kind::Client,
        };
        match self.issue(name, kind, now - CLOCK_SKEW, not_after) {
            Ok(issued) => Ok(issued),
            Err(e) => {
                restore(&mut index);
                Err(e)
            }
        }
    }

    /// Revokes every certificate named `name` that is not revoked yet (the current one, and
    /// any that [`CertDir::renew`] replaced) and writes a new signed `crl.pem` listing every
    /// revoked serial, with the next CRL number.
    pub fn revoke(&self, name: &str) -> Result<(), CertError> {
        names::validate_name(name)?;
        let index_path = self.index_path();
        let mut index = Index::load(&index_path)?;
        let now = now();
        // Every certificate of the name that is not revoked yet: the current one and any that
        // `renew` replaced but that are still valid.
        let positions: Vec<usize> = index
            .certificates
            .iter()
            .enumerate()
            .filter(|(_, r)| r.name == name && r.revoked_at.is_none())
            .map(|(i, _)| i)
            .collect();
        if positions.is_empty() {
            return Err(match index.latest(name) {
                Some(r) => CertError::AlreadyRevoked {
                    name: name.to_owned(),
                    serial: r.serial.clone(),
                },
                None => CertError::UnknownName {
                    name: name.to_owned(),
                },
            });
        }
        for &pos in &positions {
            index.certificates[pos].revoked_at = Some(now);
        }
        if let Err(e) = self.publish_crl(&mut index, now) {
            // Take the revocation back out of the index so that the operator can simply run
            // `revoke` again; keep the bumped CRL number, which must never be reused.
            for &pos in &positions {
                index.certificates[pos].revoked_at = None;
            }
            let _ = index.store(&index_path);
            return Err(e);
        }
        Ok(())
    }

    /// Re-signs `crl.pem` with the next CRL number and a fresh `next_update`, without
    /// changing which certificates are revoked. Returns the new CRL number.
    pub fn refresh_crl(&self) -> Result<u64, CertError> {
        let mut index = Index::load(&self.index_path())?;
        self.publish_crl(&mut index, now())?;
        Ok(index.crl_number)
    }

    /// Every certificate in the index, CA first, in issue order.
    pub fn list(&self) -> Result<Vec<Entry>, CertError> {
        let index_path = self.index_path();
        let index = Index::load(&index_path)?;
        Ok(index
            .certificates
            .iter()
            .map(|r| Entry {
                name: r.name.clone(),
                role: r.role,
                // `Index::load` checked that every serial is hex.
                serial: decode_hex(&r.serial).unwrap_or_default(),
                not_before: r.not_before,
                not_after: r.not_after,
                revoked: r.revoked_at.is_some(),
                revoked_at: r.revoked_at,
                renewed_at: r.renewed_at,
            })
            .collect())
    }

    /// The CRL number of the current `crl.pem`, as recorded in the index.
    pub fn crl_number(&self) -> Result<u64, CertError> {
        Ok(Index::load(&self.index_path())?.crl_number)
    }

    /// The certificate directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// `DIR/NAME.pem`.
    pub fn cert_path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.pem"))
    }

    /// `DIR/NAME.key`.
    pub fn key_path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.key"))
    }

    /// `DIR/ca.pem`: the trust anchor that relays and subscribers load.
    pub fn ca_path(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// `DIR/crl.pem`.
    pub fn crl_path(&self) -> PathBuf {
        self.dir.join("crl.pem")
    }

    /// `DIR/index.toml`.
    pub fn index_path(&self) -> PathBuf {
        index::path_in(&self.dir)
    }

    /// End of the CA's validity: no certificate may be issued beyond it.
    pub fn ca_not_after(&self) -> OffsetDateTime {
        self.ca_not_after
    }

    fn issue(
        &self,
        name: &str,
        kind: Kind<'_>,
        not_before: OffsetDateTime,
        not_after: OffsetDateTime,
    ) -> Result<Issued, CertError> {
        if not_after > self.ca_not_after {
            return Err(CertError::OutlivesCa {
                not_after,
                ca_not_after: self.ca_not_after,
            });
        }
        let index_path = self.index_path();
        let mut index = Index::load(&index_path)?;
        if let Some(existing) = index.active(name) {
            return Err(CertError::DuplicateName {
                name: name.to_owned(),
                role: existing.role,
                serial: existing.serial.clone(),
            });
        }
        let cert_path = self.cert_path(name);
        let key_path = self.key_path(name);
        self.archive_revoked(name, &index)?;
        for path in [&cert_path, &key_path] {
            if fsutil::exists(path)? {
                return Err(CertError::FileExists { path: path.clone() });
            }
        }

        let serial = random_serial(|s| index.has_serial(s))?;
        let key = KeyPair::generate().map_err(|source| CertError::Generate {
            what: "generate a key",
            source,
        })?;
        let mut params = CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, name);
        params
            .distinguished_name
            .push(DnType::OrganizationName, ORGANIZATION);
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.use_authority_key_identifier_extension = true;
        params.serial_number = Some(SerialNumber::from_slice(&serial));
        params.not_before = not_before;
        params.not_after = not_after;
        let role = match kind {
            Kind::Server(sans) => {
                params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
                params.subject_alt_names = sans
                    .iter()
                    .map(|san| match san {
                        San::Ip(ip) => Ok(SanType::IpAddress(*ip)),
                        San::Dns(dns) => Ia5String::try_from(dns.as_str())
                            .map(SanType::DnsName)
                            .map_err(|_| CertError::InvalidSan {
                                san: dns.clone(),
                                reason: "not ASCII",
                            }),
                    })
                    .collect::<Result<_, _>>()?;
                Role::Server
            }
            Kind::Client => {
                params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
                // Validated names are ASCII, hence valid IA5.
                let uri =
                    Ia5String::try_from(format!("{CLIENT_URI_PREFIX}{name}")).map_err(|_| {
                        CertError::InvalidName {
                            name: name.to_owned(),
                            reason: "not ASCII",
                        }
                    })?;
                params.subject_alt_names = vec![SanType::URI(uri)];
                Role::Client
            }
        };
        let what = match role {
            Role::Server => "sign the server certificate",
            _ => "sign the client certificate",
        };
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(|source| CertError::Generate { what, source })?;

        // The index first: every certificate that exists on disk is then in the index, and
        // so can be revoked by name. A failure below takes the entry out again.
        index.certificates.push(Record {
            name: name.to_owned(),
            role,
            serial: encode_hex(&serial),
            not_before,
            not_after,
            revoked_at: None,
            renewed_at: None,
        });
        index.store(&index_path)?;
        let written =
            fsutil::write_new(&key_path, key.serialize_pem().as_bytes(), fsutil::KEY_MODE)
                .and_then(|()| {
                    fsutil::write_new(&cert_path, cert.pem().as_bytes(), fsutil::PUBLIC_MODE)
                        .inspect_err(|_| fsutil::remove_quietly(&key_path))
                });
        if let Err(e) = written {
            index.certificates.pop();
            let _ = index.store(&index_path);
            return Err(e);
        }

        Ok(Issued {
            name: name.to_owned(),
            role,
            serial: serial.to_vec(),
            not_before,
            not_after,
            cert_path,
            key_path,
            cert_der: cert.der().clone(),
        })
    }

    /// If `NAME.pem` is the certificate of a revoked index entry, moves it and its key to
    /// `revoked/NAME.SERIAL.{pem,key}` so the name can be issued again without overwriting
    /// anything.
    fn archive_revoked(&self, name: &str, index: &Index) -> Result<(), CertError> {
        let cert_path = self.cert_path(name);
        if !fsutil::exists(&cert_path)? {
            return Ok(());
        }
        let Ok(certs) = load::load_certs(&cert_path) else {
            return Ok(());
        };
        let Ok((_, cert)) = X509Certificate::from_der(&certs[0]) else {
            return Ok(());
        };
        let serial = encode_hex(cert.raw_serial());
        let revoked = index
            .certificates
            .iter()
            .any(|r| r.name == name && r.serial == serial && r.revoked_at.is_some());
        if !revoked {
            return Ok(());
        }
        let archive = self.dir.join(REVOKED_DIR);
        fsutil::create_dir(&archive)?;
        let key_path = self.key_path(name);
        if fsutil::exists(&key_path)? {
            fsutil::move_new(&key_path, &archive.join(format!("{name}.{serial}.key")))?;
        }
        fsutil::move_new(&cert_path, &archive.join(format!("{name}.{serial}.pem")))
    }

    /// Bumps the CRL number, records it, then writes the CRL. In that order a failure can
    /// skip a number but never reuse one.
    fn publish_crl(&self, index: &mut Index, now: OffsetDateTime) -> Result<(), CertError> {
        index.crl_number += 1;
        let crl_pem = sign_crl(&self.issuer, index, now)?;
        index.store(&self.index_path())?;
        fsutil::write_replace(&self.crl_path(), crl_pem.as_bytes(), fsutil::PUBLIC_MODE)
    }
}

/// The subject alternative names of a server certificate, as `issue-server` takes them.
fn sans_of(cert: &X509Certificate<'_>, path: &Path) -> Result<Vec<San>, CertError> {
    use x509_parser::extensions::GeneralName;
    let bad = |reason: String| CertError::Pem {
        path: path.to_owned(),
        reason,
    };
    let ext = cert
        .subject_alternative_name()
        .map_err(|e| bad(format!("invalid subject alternative names: {e}")))?
        .ok_or_else(|| bad("a server certificate without subject alternative names".into()))?;
    let mut sans = Vec::new();
    for name in &ext.value.general_names {
        match name {
            GeneralName::DNSName(dns) => sans.push(San::Dns((*dns).to_owned())),
            GeneralName::IPAddress(ip) => {
                let ip: std::net::IpAddr = match ip.len() {
                    4 => <[u8; 4]>::try_from(*ip).map(Into::into),
                    16 => <[u8; 16]>::try_from(*ip).map(Into::into),
                    _ => return Err(bad(format!("an IP SAN of {} bytes", ip.len()))),
                }
                .map_err(|_| bad("an IP SAN of a bad length".into()))?;
                sans.push(San::Ip(ip));
            }
            other => return Err(bad(format!("a SAN this tool does not issue: {other:?}"))),
        }
    }
    if sans.is_empty() {
        return Err(bad(
            "a server certificate without subject alternative names".into(),
        ));
    }
    Ok(sans)
}

/// A signed CRL in PEM listing every revoked serial of `index`, numbered `index.crl_number`.
fn sign_crl(
    issuer: &Issuer<'_, KeyPair>,
    index: &Index,
    now: OffsetDateTime,
) -> Result<String, CertError> {
    let revoked_certs = index
        .certificates
        .iter()
        .filter_map(|r| {
            let revoked_at = r.revoked_at?;
            Some(RevokedCertParams {
                // `Index::load` checked that every serial is hex.
                serial_number: SerialNumber::from_slice(&decode_hex(&r.serial)?),
                revocation_time: revoked_at,
                reason_code: None,
                invalidity_date: None,
            })
        })
        .collect();
    let params = CertificateRevocationListParams {
        this_update: now,
        next_update: now + CRL_VALIDITY,
        crl_number: SerialNumber::from_slice(&positive_be_bytes(index.crl_number)),
        issuing_distribution_point: None,
        revoked_certs,
        key_identifier_method: KeyIdMethod::Sha256,
    };
    let crl = params
        .signed_by(issuer)
        .map_err(|source| CertError::Generate {
            what: "sign the CRL",
            source,
        })?;
    crl.pem().map_err(|source| CertError::Generate {
        what: "encode the CRL",
        source,
    })
}

/// A random positive serial that the index does not hold yet. The first byte is in
/// 0x01..=0x7f: positive, and no leading zero for DER to strip, so the bytes recorded are the
/// bytes in the certificate.
fn random_serial(taken: impl Fn(&str) -> bool) -> Result<[u8; SERIAL_LEN], CertError> {
    loop {
        let mut serial = [0u8; SERIAL_LEN];
        rand::rngs::OsRng
            .try_fill_bytes(&mut serial)
            .map_err(|e| CertError::Random { source: e.into() })?;
        serial[0] &= 0x7f;
        if serial[0] == 0 {
            serial[0] = 1;
        }
        if !taken(&encode_hex(&serial)) {
            return Ok(serial);
        }
    }
}

/// Big-endian bytes of `n` without leading zeros (at least one byte).
fn positive_be_bytes(n: u64) -> Vec<u8> {
    let bytes = n.to_be_bytes();
    let first = bytes
        .iter()
        .position(|&b| b != 0)
        .unwrap_or(bytes.len() - 1);
    bytes[first..].to_vec()
}

fn check_days(days: u32) -> Result<(), CertError> {
    if days == 0 || days > MAX_DAYS {
        return Err(CertError::InvalidDays {
            days,
            max: MAX_DAYS,
        });
    }
    Ok(())
}

fn now() -> OffsetDateTime {
    whole_seconds(OffsetDateTime::now_utc())
}

/// X.509 times have whole seconds; dropping the rest keeps the index equal to the
/// certificate.
fn whole_seconds(t: OffsetDateTime) -> OffsetDateTime {
    let t = t.to_offset(time::UtcOffset::UTC);
    // A nanosecond of 0 is always in range.
    t.replace_nanosecond(0).unwrap_or(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positive_be_bytes_is_minimal() {
        assert_eq!(positive_be_bytes(0), vec![0]);
        assert_eq!(positive_be_bytes(1), vec![1]);
        assert_eq!(positive_be_bytes(0x1_00), vec![1, 0]);
        assert_eq!(positive_be_bytes(u64::MAX), vec![0xff; 8]);
    }

    #[test]
    fn serials_are_positive_and_full_length() {
        for _ in 0..200 {
            let s = random_serial(|_| false).unwrap();
            assert!((1..=0x7f).contains(&s[0]), "{s:?}");
        }
    }

    #[test]
    fn days_are_bounded() {
        assert!(check_days(1).is_ok());
        assert!(check_days(MAX_DAYS).is_ok());
        assert!(matches!(check_days(0), Err(CertError::InvalidDays { .. })));
        assert!(matches!(
            check_days(MAX_DAYS + 1),
            Err(CertError::InvalidDays { .. })
        ));
    }
}
