//! Mutual TLS on every lane: the server certificate, client verification against the operator's
//! CA and CRL, identities and the allow-list, and what is in force of the CRL and of the relay's
//! own certificate and key, replaceable without a restart.
//!
//! rustls freezes CRLs into a verifier when it is built, and a new server config affects new
//! connections only. So when `crl.pem` changes, [`Auth`] validates the new CRL (issued and
//! signed by the CA), installs a new server config on the endpoint, and reports the newly
//! revoked serials so the server can close the live sessions that use them. An unreadable or
//! invalid CRL keeps the previous one in force; it is reported (logged and counted) once, not
//! on every poll, until the file changes again. The relay's own certificate and key are
//! replaced the same way ([`Auth::replace_identity`], driven by [`crate::reload`]): live
//! connections keep the certificate they were opened with.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;
use tracing::{error, info};
use x509_parser::prelude::{FromDer, X509Certificate};
use x509_parser::revocation_list::CertificateRevocationList;

use ledger_relay_transport::{crypto_provider, TransportSettings};
use ledger_relay_wire::sender::CloseReason;

/// Where the relay's certificates are and who may connect.
#[derive(Debug, Clone)]
pub struct AuthConfig {
    /// CA certificate(s), PEM.
    pub ca: PathBuf,
    /// The relay's certificate chain, PEM.
    pub cert: PathBuf,
    /// The relay's private key, PEM.
    pub key: PathBuf,
    /// The CRL, PEM; watched and reloaded when it changes. Absent file: no revocations.
    pub crl: PathBuf,
    /// Identities allowed to connect; empty: any certificate from the CA.
    pub allow: Vec<String>,
}

/// Why a configuration could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    /// A certificate, key or CRL file could not be loaded.
    #[error(transparent)]
    Certs(#[from] ledger_relay_certs::CertError),
    /// rustls refused the configuration.
    #[error("tls configuration: {0}")]
    Tls(String),
    /// The CRL is not a valid CRL of this CA.
    #[error("invalid crl {path}: {reason}")]
    InvalidCrl {
        /// The CRL file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A new certificate and key of the relay cannot be served (the ones in force stay).
    #[error("relay certificate {cert} with key {key}: {reason}")]
    InvalidIdentity {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// A connected client's identity, taken from its leaf certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientId {
    /// The name: SAN URI `urn:ledger-relay:client:NAME`, else the CN.
    pub name: String,
    /// The certificate's serial number, big-endian, without leading zero bytes.
    pub serial: Vec<u8>,
}

/// Why a connection is refused after its handshake.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// The certificate carries no usable identity.
    #[error("client certificate has no identity: {0}")]
    NoIdentity(String),
    /// The identity is not on the allow-list.
    #[error("client {0} is not on the allow-list")]
    NotAllowed(String),
    /// The certificate is revoked (a CRL loaded after the handshake began).
    #[error("client {0} certificate is revoked")]
    Revoked(String),
}

impl From<Refusal> for CloseReason {
    fn from(r: Refusal) -> CloseReason {
        match r {
            Refusal::Revoked(identity) => CloseReason::Revoked { identity },
            other => CloseReason::Unauthorized {
                detail: other.to_string(),
            },
        }
    }
}

struct CrlState {
    /// Raw bytes of the CRL file in force (to notice changes).
    raw: Option<Vec<u8>>,
    ders: Vec<CertificateRevocationListDer<'static>>,
    revoked: HashSet<Vec<u8>>,
    /// The highest CRL number in the file (big-endian, no leading zeros; empty if none).
    number: Vec<u8>,
}

/// What the CRL file held when it was last rejected, so that one bad file is reported once.
#[derive(Debug, PartialEq, Eq)]
enum Rejected {
    /// The file was missing.
    Missing,
    /// The file could not be read (the error's kind).
    Unreadable(std::io::ErrorKind),
    /// The file held these bytes, which are not a valid CRL of the CA.
    Invalid(Vec<u8>),
}

/// The relay's own certificate chain and key in force, with the file contents they came from
/// (to notice when the files change).
struct Identity {
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    cert_raw: Vec<u8>,
    key_raw: Vec<u8>,
}

/// The relay's TLS state. See the module documentation.
pub struct Auth {
    config: AuthConfig,
    transport: TransportSettings,
    roots: Arc<RootCertStore>,
    ca_ders: Vec<CertificateDer<'static>>,
    identity: RwLock<Identity>,
    allow: HashSet<String>,
    crl: RwLock<CrlState>,
    /// The last rejected content of the CRL file, while it is still there.
    rejected: Mutex<Option<Rejected>>,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// Compares two big-endian unsigned numbers without leading zero bytes.
fn crl_number_cmp(a: &[u8], b: &[u8]) -> std::cmp::Ordering {
    a.len().cmp(&b.len()).then_with(|| a.cmp(b))
}

fn strip_zeros(serial: &[u8]) -> Vec<u8> {
    let first = serial.iter().position(|b| *b != 0).unwrap_or(serial.len());
    serial[first..].to_vec()
}

impl Auth {
    /// Loads the certificates, key and CRL.
    pub fn load(config: AuthConfig, transport: TransportSettings) -> Result<Auth, AuthError> {
        let ca_ders = ledger_relay_certs::load_certs(&config.ca)?;
        let mut roots = RootCertStore::empty();
        for c in &ca_ders {
            roots
                .add(c.clone())
                .map_err(|e| AuthError::Tls(format!("ca certificate: {e}")))?;
        }
        // Read once: the bytes parsed are the bytes a later change is compared with.
        let cert_raw = read_file(&config.cert)?;
        let key_raw = read_file(&config.key)?;
        let identity = Identity {
            chain: ledger_relay_certs::parse_certs(&config.cert, &cert_raw)?,
            key: ledger_relay_certs::parse_key(&config.key, &key_raw)?,
            cert_raw,
            key_raw,
        };
        let allow = config.allow.iter().cloned().collect();
        let auth = Auth {
            roots: Arc::new(roots),
            ca_ders,
            identity: RwLock::new(identity),
            allow,
            transport,
            crl: RwLock::new(CrlState {
                raw: None,
                ders: Vec::new(),
                revoked: HashSet::new(),
                number: Vec::new(),
            }),
            rejected: Mutex::new(None),
            config,
        };
        // A missing file means no revocations; an unreadable one must not silently mean that.
        let raw = auth.read_crl_file().map_err(|e| AuthError::InvalidCrl {
            path: auth.config.crl.clone(),
            reason: format!("cannot read it: {e}"),
        })?;
        if let Some(raw) = raw {
            let state = auth.validate_crl(&raw)?;
            *auth.crl.write().unwrap_or_else(|e| e.into_inner()) = state;
        }
        Ok(auth)
    }

    /// The CRL file's bytes; `None` if it does not exist.
    fn read_crl_file(&self) -> std::io::Result<Option<Vec<u8>>> {
        match std::fs::read(&self.config.crl) {
            Ok(raw) => Ok(Some(raw)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Checks that `raw` is a PEM CRL issued and signed by the CA, and lists its serials.
    fn validate_crl(&self, raw: &[u8]) -> Result<CrlState, AuthError> {
        let invalid = |reason: String| AuthError::InvalidCrl {
            path: self.config.crl.clone(),
            reason,
        };
        // Parsed from `raw`, not read again: the file may change in between.
        let ders = CertificateRevocationListDer::pem_slice_iter(raw)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| invalid(format!("not a PEM CRL: {e}")))?;
        if ders.is_empty() {
            return Err(invalid("no CRL in the file".into()));
        }
        let mut revoked = HashSet::new();
        let mut number: Vec<u8> = Vec::new();
        for der in &ders {
            let (_, crl) = CertificateRevocationList::from_der(der.as_ref())
                .map_err(|e| invalid(e.to_string()))?;
            let signed_by_ca = self.ca_ders.iter().any(|ca| {
                X509Certificate::from_der(ca.as_ref()).is_ok_and(|(_, ca)| {
                    ca.subject() == crl.issuer() && crl.verify_signature(ca.public_key()).is_ok()
                })
            });
            if !signed_by_ca {
                return Err(invalid("not issued and signed by the configured CA".into()));
            }
            for r in crl.iter_revoked_certificates() {
                revoked.insert(strip_zeros(r.raw_serial()));
            }
            if let Some(n) = crl.crl_number() {
                let n = strip_zeros(&n.to_bytes_be());
                if crl_number_cmp(&n, &number).is_gt() {
                    number = n;
                }
            }
        }
        Ok(CrlState {
            raw: Some(raw.to_vec()),
            ders,
            revoked,
            number,
        })
    }

    /// A quinn server config with the CRL and the relay's certificate now in force.
    pub fn server_config(&self) -> Result<quinn::ServerConfig, AuthError> {
        let (chain, key) = self.identity();
        ledger_relay_transport::server_config(chain, key, self.client_verifier()?, &self.transport)
            .map_err(tls_error)
    }

    /// The client verifier of the CA with the CRL in force.
    fn client_verifier(
        &self,
    ) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, AuthError> {
        let crls = self
            .crl
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .ders
            .clone();
        let mut builder =
            WebPkiClientVerifier::builder_with_provider(self.roots.clone(), crypto_provider());
        if !crls.is_empty() {
            builder = builder.with_crls(crls).only_check_end_entity_revocation();
        }
        builder
            .build()
            .map_err(|e| AuthError::Tls(format!("client verifier: {e}")))
    }

    /// The relay's certificate chain and key in force.
    fn identity(&self) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
        let id = self.identity.read().unwrap_or_else(|e| e.into_inner());
        (id.chain.clone(), id.key.clone_key())
    }

    /// Whether `cert` and `key` (file contents) are the certificate and key in force.
    pub fn identity_is(&self, cert: &[u8], key: &[u8]) -> bool {
        let id = self.identity.read().unwrap_or_else(|e| e.into_inner());
        id.cert_raw == cert && id.key_raw == key
    }

    /// Puts a new certificate chain and key of the relay (file contents) in force for the next
    /// server config, after checking that they can be served: both parse, the key is the
    /// certificate's, and the certificate is issued by the CA and valid now (a pair that fails
    /// would leave subscribers refusing the relay, while the one in force still works). Returns
    /// the new leaf certificate.
    pub fn replace_identity(
        &self,
        cert: &[u8],
        key: &[u8],
    ) -> Result<CertificateDer<'static>, AuthError> {
        let invalid = |reason: String| AuthError::InvalidIdentity {
            cert: self.config.cert.clone(),
            key: self.config.key.clone(),
            reason,
        };
        let chain = ledger_relay_certs::parse_certs(&self.config.cert, cert)
            .map_err(|e| invalid(e.to_string()))?;
        let private = ledger_relay_certs::parse_key(&self.config.key, key)
            .map_err(|e| invalid(e.to_string()))?;
        // `parse_certs` fails on a file without a certificate: there is a leaf.
        let leaf = chain[0].clone();
        let (_, parsed) = X509Certificate::from_der(leaf.as_ref())
            .map_err(|e| invalid(format!("certificate: {e}")))?;
        let issued_by_ca = self.ca_ders.iter().any(|ca| {
            X509Certificate::from_der(ca.as_ref()).is_ok_and(|(_, ca)| {
                ca.subject() == parsed.issuer()
                    && parsed.verify_signature(Some(ca.public_key())).is_ok()
            })
        });
        if !issued_by_ca {
            return Err(invalid(
                "the certificate is not issued and signed by the configured CA".into(),
            ));
        }
        if !parsed.validity().is_valid() {
            return Err(invalid(format!(
                "the certificate is not valid now (valid {} to {})",
                parsed.validity().not_before,
                parsed.validity().not_after
            )));
        }
        // rustls compares the key's public half with the certificate's.
        rustls::sign::CertifiedKey::from_der(
            chain.clone(),
            private.clone_key(),
            &crypto_provider(),
        )
        .map_err(|e| invalid(format!("the key does not fit the certificate: {e}")))?;
        *self.identity.write().unwrap_or_else(|e| e.into_inner()) = Identity {
            chain,
            key: private,
            cert_raw: cert.to_vec(),
            key_raw: key.to_vec(),
        };
        Ok(leaf)
    }

    /// The relay's certificate and key files.
    pub fn identity_paths(&self) -> (&std::path::Path, &std::path::Path) {
        (&self.config.cert, &self.config.key)
    }

    /// The identity of a connected client, checked against the allow-list and the CRL in force.
    pub fn identify(&self, conn: &quinn::Connection) -> Result<ClientId, Refusal> {
        let certs = conn
            .peer_identity()
            .and_then(|any| any.downcast::<Vec<CertificateDer<'static>>>().ok())
            .map(|certs| *certs)
            .unwrap_or_default();
        self.identify_certs(&certs)
    }

    /// [`Auth::identify`] of the certificate chain a client presented (leaf first), for
    /// transports other than QUIC.
    pub fn identify_certs(&self, certs: &[CertificateDer<'_>]) -> Result<ClientId, Refusal> {
        let leaf = certs
            .first()
            .ok_or_else(|| Refusal::NoIdentity("no client certificate".into()))?;
        let name = ledger_relay_certs::client_identity(leaf.as_ref())
            .map_err(|e| Refusal::NoIdentity(e.to_string()))?;
        let serial = X509Certificate::from_der(leaf.as_ref())
            .map(|(_, c)| strip_zeros(c.raw_serial()))
            .map_err(|e| Refusal::NoIdentity(e.to_string()))?;
        if !self.allow.is_empty() && !self.allow.contains(&name) {
            return Err(Refusal::NotAllowed(name));
        }
        if self.is_revoked(&serial) {
            return Err(Refusal::Revoked(name));
        }
        Ok(ClientId { name, serial })
    }

    /// Whether a serial is revoked by the CRL in force.
    pub fn is_revoked(&self, serial: &[u8]) -> bool {
        self.crl
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .revoked
            .contains(serial)
    }

    /// Rereads the CRL file if it changed. Returns `Ok(true)` when a new CRL was installed (the
    /// caller then installs a new server config and closes revoked sessions), `Ok(false)` when
    /// nothing changed, and an error (the previous CRL stays in force) when the new file is
    /// missing, unreadable or invalid. A rejected file is reported once: until its content
    /// changes, later calls return `Ok(false)`.
    pub fn reload_crl(&self) -> Result<bool, AuthError> {
        let invalid = |reason: String| AuthError::InvalidCrl {
            path: self.config.crl.clone(),
            reason,
        };
        let raw = match self.read_crl_file() {
            Ok(raw) => raw,
            Err(e) => {
                return self.reject(
                    Rejected::Unreadable(e.kind()),
                    invalid(format!("cannot read it: {e}")),
                )
            }
        };
        {
            let st = self.crl.read().unwrap_or_else(|e| e.into_inner());
            if st.raw == raw {
                *self.rejected.lock().unwrap_or_else(|e| e.into_inner()) = None;
                return Ok(false);
            }
        }
        let Some(raw) = raw else {
            // The file was removed: keep the CRL in force (revocations never silently lapse).
            return self.reject(Rejected::Missing, invalid("file missing".into()));
        };
        {
            let rejected = self.rejected.lock().unwrap_or_else(|e| e.into_inner());
            if matches!(&*rejected, Some(Rejected::Invalid(bad)) if *bad == raw) {
                return Ok(false);
            }
        }
        match self.validate_crl(&raw) {
            Ok(state)
                if crl_number_cmp(
                    &state.number,
                    &self.crl.read().unwrap_or_else(|e| e.into_inner()).number,
                )
                .is_lt() =>
            {
                // An older CRL (a restored backup, a replayed file) would un-revoke
                // certificates: ledger-certs only ever raises the number.
                self.reject(
                    Rejected::Invalid(raw),
                    invalid("its CRL number is lower than the one in force".into()),
                )
            }
            Ok(state) => {
                *self.crl.write().unwrap_or_else(|e| e.into_inner()) = state;
                *self.rejected.lock().unwrap_or_else(|e| e.into_inner()) = None;
                Ok(true)
            }
            Err(e) => self.reject(Rejected::Invalid(raw), e),
        }
    }

    /// Records a rejected CRL file; returns `error` the first time, `Ok(false)` when the same
    /// file was already rejected.
    fn reject(&self, what: Rejected, error: AuthError) -> Result<bool, AuthError> {
        let mut rejected = self.rejected.lock().unwrap_or_else(|e| e.into_inner());
        if rejected.as_ref() == Some(&what) {
            return Ok(false);
        }
        *rejected = Some(what);
        Err(error)
    }
}

fn tls_error(e: ledger_relay_transport::TlsConfigError) -> AuthError {
    AuthError::Tls(format!("relay certificate: {:#}", anyhow::Error::from(e)))
}

fn read_file(path: &std::path::Path) -> Result<Vec<u8>, ledger_relay_certs::CertError> {
    std::fs::read(path).map_err(|source| ledger_relay_certs::CertError::Io {
        action: "read",
        path: path.to_owned(),
        source,
    })
}

/// How often the CRL file is checked for changes: revocations take effect within this.
pub const CRL_POLL: Duration = Duration::from_millis(250);

/// Logs a CRL reload result and counts it.
pub fn log_reload(r: &Result<bool, AuthError>, metrics: &crate::metrics::Metrics) {
    match r {
        Ok(true) => {
            crate::metrics::Metrics::add(&metrics.crl_reloads_total, 1);
            info!("crl reloaded");
        }
        Ok(false) => {}
        Err(e) => {
            crate::metrics::Metrics::add(&metrics.crl_errors_total, 1);
            error!(error = %e, "crl reload failed; the previous crl stays in force");
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use ledger_relay_certs::CertDir;

    /// An [`Auth`] of a relay certificate `relay` issued now in `certs` (also `reload`'s tests).
    pub(crate) fn auth(certs: &CertDir) -> Result<Auth, AuthError> {
        certs
            .issue_server("relay", &["127.0.0.1".into()], 30)
            .unwrap();
        Auth::load(
            AuthConfig {
                ca: certs.ca_path(),
                cert: certs.cert_path("relay"),
                key: certs.key_path("relay"),
                crl: certs.crl_path(),
                allow: Vec::new(),
            },
            TransportSettings::default(),
        )
    }

    fn serial(certs: &CertDir, name: &str) -> Vec<u8> {
        let der = ledger_relay_certs::load_certs(&certs.cert_path(name)).unwrap();
        let (_, cert) = X509Certificate::from_der(der[0].as_ref()).unwrap();
        strip_zeros(cert.raw_serial())
    }

    #[test]
    fn a_rejected_crl_is_reported_once_per_change() {
        let dir = tempfile::tempdir().unwrap();
        let certs = CertDir::init(&dir.path().join("ca"), 365).unwrap();
        certs.issue_client("a", 30).unwrap();
        certs.revoke("a").unwrap();
        let a = serial(&certs, "a");
        let auth = auth(&certs).unwrap();
        assert!(auth.is_revoked(&a));
        let good = std::fs::read(certs.crl_path()).unwrap();
        assert!(!auth.reload_crl().unwrap(), "unchanged");

        std::fs::write(certs.crl_path(), b"garbage").unwrap();
        assert!(matches!(
            auth.reload_crl(),
            Err(AuthError::InvalidCrl { .. })
        ));
        assert!(
            !auth.reload_crl().unwrap(),
            "the same bad file is reported once"
        );
        std::fs::write(certs.crl_path(), b"other garbage").unwrap();
        assert!(auth.reload_crl().is_err(), "another bad file is reported");
        std::fs::remove_file(certs.crl_path()).unwrap();
        assert!(auth.reload_crl().is_err(), "a missing file is reported");
        assert!(!auth.reload_crl().unwrap(), "once");
        assert!(auth.is_revoked(&a), "the CRL in force stays");

        // Back to the CRL in force, then the first garbage again: reported again.
        std::fs::write(certs.crl_path(), &good).unwrap();
        assert!(!auth.reload_crl().unwrap());
        std::fs::write(certs.crl_path(), b"garbage").unwrap();
        assert!(auth.reload_crl().is_err());

        certs.issue_client("b", 30).unwrap();
        certs.revoke("b").unwrap();
        assert!(auth.reload_crl().unwrap(), "a valid new CRL is installed");
        assert!(auth.is_revoked(&a) && auth.is_revoked(&serial(&certs, "b")));
    }

    #[test]
    fn an_older_crl_never_replaces_a_newer_one() {
        let dir = tempfile::tempdir().unwrap();
        let certs = CertDir::init(&dir.path().join("ca"), 365).unwrap();
        certs.issue_client("a", 30).unwrap();
        certs.issue_client("b", 30).unwrap();
        certs.revoke("a").unwrap();
        let older = std::fs::read(certs.crl_path()).unwrap();
        let auth = auth(&certs).unwrap();
        certs.revoke("b").unwrap();
        assert!(auth.reload_crl().unwrap());
        let b = serial(&certs, "b");
        assert!(auth.is_revoked(&b));
        // A restored backup: validly signed, but it would un-revoke b.
        std::fs::write(certs.crl_path(), &older).unwrap();
        let err = auth.reload_crl().unwrap_err().to_string();
        assert!(err.contains("lower than the one in force"), "{err}");
        assert!(auth.is_revoked(&b), "b stays revoked");
    }

    #[test]
    fn an_unreadable_crl_at_startup_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let certs = CertDir::init(&dir.path().join("ca"), 365).unwrap();
        // A directory where the CRL should be: reading fails with something else than NotFound.
        std::fs::remove_file(certs.crl_path()).unwrap();
        std::fs::create_dir(certs.crl_path()).unwrap();
        assert!(matches!(auth(&certs), Err(AuthError::InvalidCrl { .. })));
    }

    #[test]
    fn a_missing_crl_at_startup_means_no_revocations() {
        let dir = tempfile::tempdir().unwrap();
        let certs = CertDir::init(&dir.path().join("ca"), 365).unwrap();
        std::fs::remove_file(certs.crl_path()).unwrap();
        let auth = auth(&certs).unwrap();
        assert!(
            !auth.reload_crl().unwrap(),
            "still missing: nothing changed"
        );
    }
}
