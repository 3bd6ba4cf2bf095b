//! When the relay's certificate and its CRL run out, as metrics, so that an alert fires weeks
//! before a peer starts refusing them.
//!
//! It reads dates only: the certificate's from the file at start and from each certificate
//! [`crate::reload`] puts in force, `crl.pem`'s every [`CRL_POLL`]. It verifies nothing and
//! decides nothing: `auth` loads, checks and reloads what is in force.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// How often `crl.pem` is read for its next update: a date that moves once a refresh, so
/// seconds-fresh is plenty.
pub const CRL_POLL: Duration = Duration::from_secs(10);

/// Sets `certificate_not_after_timestamp_seconds` from the leaf of `cert` (0 if unreadable).
pub fn record_certificate(cert: &Path, metrics: &Metrics) {
    let not_after = ledger_relay_certs::load_certs(cert)
        .ok()
        .and_then(|certs| certs.first().cloned())
        .and_then(|leaf| ledger_relay_certs::cert_not_after(&leaf).ok());
    Metrics::set(
        &metrics.certificate_not_after_timestamp_seconds,
        not_after.map_or(0, unix_secs),
    );
}

/// Sets `certificate_not_after_timestamp_seconds` from `leaf`, the certificate now in force
/// (0 if its date cannot be read).
pub fn record_leaf(leaf: &[u8], metrics: &Metrics) {
    let not_after = ledger_relay_certs::cert_not_after(leaf).ok();
    Metrics::set(
        &metrics.certificate_not_after_timestamp_seconds,
        not_after.map_or(0, unix_secs),
    );
}

/// Sets `crl_next_update_timestamp_seconds` from `crl` now and every [`CRL_POLL`] until
/// `shutdown` (0 while there is no readable CRL or it states no next update).
pub async fn watch_crl(crl: PathBuf, metrics: Arc<Metrics>, shutdown: CancellationToken) {
    loop {
        let path = crl.clone();
        // A small file, but still a read: off the runtime's workers.
        let next = tokio::task::spawn_blocking(move || crl_next_update(&path))
            .await
            .ok()
            .flatten();
        Metrics::set(
            &metrics.crl_next_update_timestamp_seconds,
            next.map_or(0, unix_secs),
        );
        tokio::select! {
            _ = tokio::time::sleep(CRL_POLL) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}

fn crl_next_update(path: &Path) -> Option<std::time::SystemTime> {
    let crls = ledger_relay_certs::load_crls(path).ok()?;
    ledger_relay_certs::crl_next_update(crls.first()?).ok()?
}

fn unix_secs(t: std::time::SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_certificate_and_crl_dates_become_gauges() {
        let dir = tempfile::tempdir().unwrap();
        let ca = ledger_relay_certs::CertDir::init(dir.path(), 365).unwrap();
        let issued = ca.issue_server("relay", &["127.0.0.1".into()], 40).unwrap();
        let m = Metrics::new();
        record_certificate(&issued.cert_path, &m);
        assert_eq!(
            m.certificate_not_after_timestamp_seconds
                .load(std::sync::atomic::Ordering::Relaxed),
            issued.not_after.unix_timestamp() as u64
        );
        record_certificate(&dir.path().join("missing.pem"), &m);
        assert_eq!(
            m.certificate_not_after_timestamp_seconds
                .load(std::sync::atomic::Ordering::Relaxed),
            0
        );
        let stop = CancellationToken::new();
        let task = tokio::spawn(watch_crl(ca.crl_path(), m.clone(), stop.clone()));
        let now = std::time::SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        for _ in 0..200 {
            if m.crl_next_update_timestamp_seconds
                .load(std::sync::atomic::Ordering::Relaxed)
                != 0
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let next = m
            .crl_next_update_timestamp_seconds
            .load(std::sync::atomic::Ordering::Relaxed);
        // ledger-certs promises the next CRL in 30 days.
        assert!(
            next > now + 29 * 86_400 && next <= now + 30 * 86_400,
            "{next}"
        );
        stop.cancel();
        task.await.unwrap();
    }
}
