//! When a certificate or a CRL runs out, for the relay's metrics and the subscriber's
//! warnings. Reads dates only: it verifies nothing.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use x509_parser::prelude::{CertificateRevocationList, FromDer, X509Certificate};

use crate::CertError;

/// The end of validity (`notAfter`) of a DER certificate.
pub fn cert_not_after(cert_der: &[u8]) -> Result<SystemTime, CertError> {
    let (_, cert) = X509Certificate::from_der(cert_der).map_err(|e| CertError::Certificate {
        reason: e.to_string(),
    })?;
    Ok(to_system_time(cert.validity().not_after.timestamp()))
}

/// The `nextUpdate` of a DER CRL: when its issuer promised a newer one. `None` when the CRL
/// does not say (the field is optional).
pub fn crl_next_update(crl_der: &[u8]) -> Result<Option<SystemTime>, CertError> {
    let (_, crl) =
        CertificateRevocationList::from_der(crl_der).map_err(|e| CertError::Certificate {
            reason: format!("invalid crl: {e}"),
        })?;
    Ok(crl.next_update().map(|t| to_system_time(t.timestamp())))
}

/// Seconds since the epoch as a `SystemTime`; times before 1970 (which no certificate of this
/// tool carries) read as the epoch.
fn to_system_time(secs: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(u64::try_from(secs).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CertDir;

    #[test]
    fn dates_match_what_was_issued() {
        let dir = tempfile::tempdir().unwrap();
        let ca = CertDir::init(dir.path(), 100).unwrap();
        let issued = ca.issue_client("rpc-1", 10).unwrap();
        let got = cert_not_after(&issued.cert_der).unwrap();
        let want = UNIX_EPOCH + Duration::from_secs(issued.not_after.unix_timestamp() as u64);
        assert_eq!(got, want);
        let crl = crate::load_crls(&ca.crl_path()).unwrap().remove(0);
        let next = crl_next_update(&crl).unwrap().unwrap();
        let in_days = next.duration_since(SystemTime::now()).unwrap().as_secs() / 86_400;
        assert_eq!(in_days, 29, "30 days ahead, less the seconds since");
        assert!(cert_not_after(b"nope").is_err());
        assert!(crl_next_update(b"nope").is_err());
    }
}
