//! The client identity the relay authorizes.

use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::{names, CertError};

/// Prefix of the SAN URI that carries a client's name: `urn:ledger-relay:client:NAME`.
pub const CLIENT_URI_PREFIX: &str = "urn:ledger-relay:client:";

/// The client identity in a DER leaf certificate: the name in its SAN URI
/// `urn:ledger-relay:client:NAME` if it has one, else its subject common name.
///
/// Call it only on a certificate that the TLS stack has already verified against the CA: it
/// reads names, it does not check signatures, validity or revocation.
///
/// Fails if the certificate does not parse, if it has neither, if its URIs name different
/// clients or a name that [`validate_name`](crate::validate_name) rejects, or if it has several
/// common names.
pub fn client_identity(cert_der: &[u8]) -> Result<String, CertError> {
    let no_identity = |reason: String| CertError::NoIdentity { reason };
    let (_, cert) = X509Certificate::from_der(cert_der).map_err(|e| CertError::Certificate {
        reason: e.to_string(),
    })?;
    let san = cert
        .subject_alternative_name()
        .map_err(|e| CertError::Certificate {
            reason: e.to_string(),
        })?;
    let mut uri_names = Vec::new();
    if let Some(san) = san {
        for general_name in &san.value.general_names {
            if let GeneralName::URI(uri) = general_name {
                if let Some(name) = uri.strip_prefix(CLIENT_URI_PREFIX) {
                    uri_names.push(name);
                }
            }
        }
    }
    if let Some(first) = uri_names.first() {
        if uri_names.iter().any(|n| n != first) {
            return Err(no_identity(format!(
                "several client URIs name different clients: {}",
                uri_names.join(", ")
            )));
        }
        names::validate_name(first).map_err(|e| no_identity(e.to_string()))?;
        return Ok((*first).to_owned());
    }
    let mut common_names = cert.subject().iter_common_name();
    let Some(cn) = common_names.next() else {
        return Err(no_identity(format!(
            "no {CLIENT_URI_PREFIX}NAME URI and no common name"
        )));
    };
    if common_names.next().is_some() {
        return Err(no_identity("several common names".into()));
    }
    let cn = cn
        .as_str()
        .map_err(|_| no_identity("the common name is not a string".into()))?;
    if cn.is_empty() {
        return Err(no_identity("the common name is empty".into()));
    }
    Ok(cn.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::string::Ia5String;
    use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair, SanType};

    /// A self-signed certificate with an optional CN (rcgen writes at most one) and URIs.
    fn cert(cn: Option<&str>, uris: &[&str]) -> Vec<u8> {
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        if let Some(cn) = cn {
            params.distinguished_name.push(DnType::CommonName, cn);
        }
        params.subject_alt_names = uris
            .iter()
            .map(|u| SanType::URI(Ia5String::try_from(*u).unwrap()))
            .collect();
        params
            .subject_alt_names
            .push(SanType::DnsName(Ia5String::try_from("x.example").unwrap()));
        let key = KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn uri_wins_over_common_name() {
        let der = cert(
            Some("something-else"),
            &["https://example.com/", "urn:ledger-relay:client:rpc-1"],
        );
        assert_eq!(client_identity(&der).unwrap(), "rpc-1");
    }

    #[test]
    fn common_name_is_the_fallback() {
        let der = cert(Some("rpc-2"), &["https://example.com/"]);
        assert_eq!(client_identity(&der).unwrap(), "rpc-2");
    }

    #[test]
    fn repeated_identical_uris_are_one_identity() {
        let der = cert(
            None,
            &["urn:ledger-relay:client:a", "urn:ledger-relay:client:a"],
        );
        assert_eq!(client_identity(&der).unwrap(), "a");
    }

    #[test]
    fn missing_or_ambiguous_identities_are_errors() {
        for der in [
            cert(None, &[]),
            cert(Some(""), &[]),
            cert(
                Some("rpc-1"),
                &["urn:ledger-relay:client:a", "urn:ledger-relay:client:b"],
            ),
            cert(Some("rpc-1"), &["urn:ledger-relay:client:"]),
            cert(Some("rpc-1"), &["urn:ledger-relay:client:ca"]),
            cert(Some("rpc-1"), &["urn:ledger-relay:client:a/b"]),
        ] {
            let err = client_identity(&der).unwrap_err();
            assert!(matches!(err, CertError::NoIdentity { .. }), "{err}");
        }
    }

    #[test]
    fn garbage_is_not_a_certificate() {
        let err = client_identity(b"not a certificate").unwrap_err();
        assert!(matches!(err, CertError::Certificate { .. }), "{err}");
        let der = cert(Some("rpc-1"), &[]);
        let err = client_identity(&der[..der.len() / 2]).unwrap_err();
        assert!(matches!(err, CertError::Certificate { .. }), "{err}");
    }
}
