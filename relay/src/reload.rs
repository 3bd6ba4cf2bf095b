//! What the relay's TLS rests on, reloaded without a restart: `DIR/crl.pem`, and the relay's own
//! certificate and key (`DIR/NAME.pem`, `DIR/NAME.key`).
//!
//! One watcher ([`Reloader`]) reads the three files every [`CRL_POLL`]; the server installs a
//! new server config on its endpoint whenever [`Reloader::poll`] says something changed, so
//! new handshakes use what is now in force while live connections keep what they were opened
//! with (sessions go on).
//!
//! The certificate and key are two files that cannot be replaced at the same instant
//! (`ledger-certs renew` moves the old pair away, then writes the new key, then the new
//! certificate). So a change is acted on only once both files have held the same content for
//! two polls in a row, and then only if the pair can be served ([`Auth::replace_identity`]:
//! both parse, the key is the certificate's, the certificate is the CA's and valid now).
//! Anything else (a missing file, a key of another certificate, garbage) keeps the pair in
//! force; it is logged and counted (`ledger_relay_certificate_errors_total`) once, until the
//! files change again, as a bad CRL is (`auth`).

use std::io::ErrorKind;
use std::path::Path;

use tracing::{error, info};

use crate::auth::{log_reload, Auth};
use crate::metrics::Metrics;

pub use crate::auth::CRL_POLL;

/// What one file held when it was read.
#[derive(Debug, Clone, PartialEq, Eq)]
enum FileState {
    /// Its bytes.
    Bytes(Vec<u8>),
    /// It did not exist.
    Missing,
    /// It could not be read (the error's kind).
    Unreadable(ErrorKind),
}

impl FileState {
    fn read(path: &Path) -> FileState {
        match std::fs::read(path) {
            Ok(b) => FileState::Bytes(b),
            Err(e) if e.kind() == ErrorKind::NotFound => FileState::Missing,
            Err(e) => FileState::Unreadable(e.kind()),
        }
    }

    fn bytes(&self) -> Option<&[u8]> {
        match self {
            FileState::Bytes(b) => Some(b),
            _ => None,
        }
    }

    /// Why this file cannot be used, if it cannot.
    fn problem(&self, path: &Path) -> Option<String> {
        match self {
            FileState::Bytes(_) => None,
            FileState::Missing => Some(format!("{} is missing", path.display())),
            FileState::Unreadable(kind) => {
                Some(format!("{} cannot be read: {kind}", path.display()))
            }
        }
    }
}

/// The certificate and key files, as read together.
type Pair = (FileState, FileState);

/// What a poll changed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Changed {
    /// A new CRL is in force (the caller also closes sessions it revokes).
    pub crl: bool,
    /// A new certificate and key of the relay are in force.
    pub identity: bool,
}

impl Changed {
    /// Whether anything changed, so a new server config is due.
    pub fn any(self) -> bool {
        self.crl || self.identity
    }
}

/// Watches the CRL and the relay's certificate and key. See the module documentation.
#[derive(Debug, Default)]
pub struct Reloader {
    /// What the certificate and key files held at the last poll, when that differed from what
    /// is in force and was not acted on yet.
    pending: Option<Pair>,
    /// The pair last rejected, while the files still hold it.
    rejected: Option<Pair>,
}

impl Reloader {
    /// A watcher with nothing pending.
    pub fn new() -> Reloader {
        Reloader::default()
    }

    /// Reads the files once and puts what changed in force in `auth`, logging and counting
    /// reloads and rejections in `metrics` (the certificate-expiry gauge follows a new
    /// certificate). Reads files: call it off the runtime's hot path (a few small reads every
    /// poll).
    pub fn poll(&mut self, auth: &Auth, metrics: &Metrics) -> Changed {
        let crl = auth.reload_crl();
        log_reload(&crl, metrics);
        Changed {
            crl: matches!(crl, Ok(true)),
            identity: self.poll_identity(auth, metrics),
        }
    }

    fn poll_identity(&mut self, auth: &Auth, metrics: &Metrics) -> bool {
        let (cert_path, key_path) = auth.identity_paths();
        let now: Pair = (FileState::read(cert_path), FileState::read(key_path));
        if let (Some(c), Some(k)) = (now.0.bytes(), now.1.bytes()) {
            if auth.identity_is(c, k) {
                self.pending = None;
                self.rejected = None;
                return false;
            }
        }
        if self.rejected.as_ref() == Some(&now) {
            return false;
        }
        if self.pending.as_ref() != Some(&now) {
            // First sight of this content: the other file may still be on its way.
            self.pending = Some(now);
            return false;
        }
        self.pending = None;
        let problem = now.0.problem(cert_path).or_else(|| now.1.problem(key_path));
        let result = match (problem, now.0.bytes(), now.1.bytes()) {
            (None, Some(c), Some(k)) => auth.replace_identity(c, k).map_err(|e| e.to_string()),
            (Some(p), _, _) => Err(p),
            // `problem` is None exactly when both files were read.
            (None, _, _) => Err("the certificate or key was not read".into()),
        };
        match result {
            Ok(leaf) => {
                self.rejected = None;
                Metrics::add(&metrics.certificate_reloads_total, 1);
                crate::certinfo::record_leaf(&leaf, metrics);
                let expires = ledger_relay_certs::cert_not_after(&leaf)
                    .map(|t| humantime::format_rfc3339_seconds(t).to_string())
                    .unwrap_or_else(|_| "?".into());
                info!(cert = %cert_path.display(), %expires, "relay certificate reloaded: new handshakes use it");
                true
            }
            Err(reason) => {
                self.rejected = Some(now);
                Metrics::add(&metrics.certificate_errors_total, 1);
                error!(error = %reason, "relay certificate reload failed; the certificate in force stays");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ledger_relay_certs::CertDir;
    use std::sync::atomic::Ordering;

    fn setup() -> (tempfile::TempDir, CertDir, Auth) {
        let dir = tempfile::tempdir().unwrap();
        let certs = CertDir::init(&dir.path().join("ca"), 365).unwrap();
        let auth = crate::auth::tests::auth(&certs).unwrap();
        (dir, certs, auth)
    }

    fn read(p: &Path) -> Vec<u8> {
        std::fs::read(p).unwrap()
    }

    #[test]
    fn a_renewed_pair_is_installed_once_it_has_settled() {
        let (_dir, certs, auth) = setup();
        let m = Metrics::new();
        let mut r = Reloader::new();
        assert_eq!(r.poll(&auth, &m), Changed::default(), "nothing changed");
        let renewed = certs.renew("relay", 20).unwrap();
        assert!(!r.poll(&auth, &m).identity, "first sight: wait a poll");
        assert!(
            r.poll(&auth, &m).identity,
            "unchanged for a poll: installed"
        );
        assert!(auth.identity_is(
            &read(&certs.cert_path("relay")),
            &read(&certs.key_path("relay"))
        ));
        assert_eq!(m.certificate_reloads_total.load(Ordering::Relaxed), 1);
        assert_eq!(
            m.certificate_not_after_timestamp_seconds
                .load(Ordering::Relaxed),
            renewed.not_after.unix_timestamp() as u64,
            "the expiry gauge follows"
        );
        assert!(auth.server_config().is_ok());
        assert_eq!(r.poll(&auth, &m), Changed::default(), "in force now");
    }

    #[test]
    fn a_bad_pair_keeps_the_one_in_force_and_is_reported_once() {
        let (_dir, certs, auth) = setup();
        let m = Metrics::new();
        let mut r = Reloader::new();
        let (cert, key) = (certs.cert_path("relay"), certs.key_path("relay"));
        let (good_cert, good_key) = (read(&cert), read(&key));
        let errors = || m.certificate_errors_total.load(Ordering::Relaxed);

        // Half of a renewal: a new certificate beside the old key.
        certs
            .issue_server("other", &["127.0.0.1".into()], 30)
            .unwrap();
        std::fs::write(&cert, read(&certs.cert_path("other"))).unwrap();
        for _ in 0..4 {
            assert!(!r.poll(&auth, &m).identity);
        }
        assert_eq!(errors(), 1, "reported once while the files stay");
        assert!(
            auth.identity_is(&good_cert, &good_key),
            "the old pair stays"
        );

        // Garbage, then a missing key: each reported once.
        std::fs::write(&cert, b"garbage").unwrap();
        r.poll(&auth, &m);
        r.poll(&auth, &m);
        r.poll(&auth, &m);
        assert_eq!(errors(), 2);
        std::fs::write(&cert, &good_cert).unwrap();
        std::fs::remove_file(&key).unwrap();
        r.poll(&auth, &m);
        r.poll(&auth, &m);
        assert_eq!(errors(), 3);

        // A certificate of another CA with its own key: refused too.
        let foreign = CertDir::init(&_dir.path().join("foreign"), 365).unwrap();
        foreign
            .issue_server("relay", &["127.0.0.1".into()], 30)
            .unwrap();
        std::fs::write(&cert, read(&foreign.cert_path("relay"))).unwrap();
        std::fs::write(&key, read(&foreign.key_path("relay"))).unwrap();
        r.poll(&auth, &m);
        r.poll(&auth, &m);
        assert_eq!(errors(), 4);

        // Back to the pair in force: nothing to do, nothing reported.
        std::fs::write(&cert, &good_cert).unwrap();
        std::fs::write(&key, &good_key).unwrap();
        assert_eq!(r.poll(&auth, &m), Changed::default());
        assert_eq!(errors(), 4);
        assert_eq!(m.certificate_reloads_total.load(Ordering::Relaxed), 0);
    }
}
