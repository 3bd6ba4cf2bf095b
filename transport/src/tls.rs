//! The mutual-TLS configurations of a lane: TLS 1.3 only, the ring provider chosen explicitly,
//! ALPN [`ledger_relay_wire::ALPN`].

use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer};
use rustls::server::danger::ClientCertVerifier;

use crate::settings::{server_transport_config, transport_config, TransportSettings};

/// The rustls crypto provider both ends use: ring, built explicitly (aws-lc-rs only in a
/// build with this crate's `aws-lc-rs` feature, which exists to measure it against ring).
///
/// quinn's `rustls-ring` feature and rustls' own defaults can leave two providers compiled in
/// and no unambiguous process default, so nothing here relies on
/// `CryptoProvider::get_default`.
pub fn crypto_provider() -> Arc<rustls::crypto::CryptoProvider> {
    #[cfg(feature = "aws-lc-rs")]
    let provider = rustls::crypto::aws_lc_rs::default_provider();
    #[cfg(not(feature = "aws-lc-rs"))]
    let provider = rustls::crypto::ring::default_provider();
    Arc::new(provider)
}

/// Why a TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsConfigError {
    /// No CA certificate was given, so no relay could be trusted.
    #[error("no CA certificate to trust")]
    NoCa,
    /// A CA certificate could not be used as a trust anchor.
    #[error("unusable CA certificate {index}")]
    BadCa {
        /// Position of the certificate in the CA list.
        index: usize,
        /// What rustls said.
        #[source]
        source: rustls::Error,
    },
    /// A certificate revocation list could not be used (it does not parse as a CRL).
    #[error("unusable certificate revocation list")]
    Crl(#[from] rustls::client::VerifierBuilderError),
    /// rustls refused the configuration (for example a key that does not match the
    /// certificate, or a key type it cannot sign with).
    #[error("invalid TLS configuration")]
    Rustls(#[from] rustls::Error),
    /// The provider lacks the cipher suite QUIC's initial packets need.
    #[error("TLS configuration unusable for QUIC")]
    Quic(#[from] quinn::crypto::rustls::NoInitialCipherSuite),
}

/// The QUIC client configuration of a lane: TLS 1.3 only, trusting exactly the CA
/// certificates `ca`, refusing a relay certificate that `crls` revoke, presenting `cert_chain`
/// (leaf first) and `key` for mutual TLS, ALPN [`ledger_relay_wire::ALPN`], with the transport
/// settings `transport`.
///
/// Only the relay's own certificate is checked against the CRLs (the CA is the trust anchor),
/// and a certificate no CRL speaks for is accepted: a CRL of another CA must not lock a
/// subscriber out of every relay.
pub fn client_config(
    ca: &[CertificateDer<'static>],
    crls: &[CertificateRevocationListDer<'static>],
    cert_chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    transport: &TransportSettings,
) -> Result<quinn::ClientConfig, TlsConfigError> {
    let tls = client_tls(ca, crls, cert_chain, key, ledger_relay_wire::ALPN)?;
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(tls)?;
    let mut config = quinn::ClientConfig::new(Arc::new(quic));
    config.transport_config(Arc::new(transport_config(transport)));
    Ok(config)
}

/// The QUIC server configuration of the relay: TLS 1.3 only, presenting `cert_chain` (leaf
/// first) and `key`, verifying clients with `verifier` (the relay's CA, allow-list and CRL),
/// ALPN [`ledger_relay_wire::ALPN`], no 0-RTT, and the relay's side of the lane settings
/// ([`server_transport_config`]).
pub fn server_config(
    cert_chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    verifier: Arc<dyn ClientCertVerifier>,
    transport: &TransportSettings,
) -> Result<quinn::ServerConfig, TlsConfigError> {
    let tls = server_tls(cert_chain, key, verifier, ledger_relay_wire::ALPN)?;
    let quic = quinn::crypto::rustls::QuicServerConfig::try_from(tls)?;
    let mut server = quinn::ServerConfig::with_crypto(Arc::new(quic));
    server.transport_config(Arc::new(server_transport_config(transport)));
    Ok(server)
}

/// The rustls client configuration under [`client_config`], with ALPN `alpn`: TLS 1.3 only,
/// trusting exactly `ca`, presenting `cert_chain` and `key`: a TLS-over-TCP client with the
/// lanes' settings (the bench's TCP yardstick).
pub fn client_tls(
    ca: &[CertificateDer<'static>],
    crls: &[CertificateRevocationListDer<'static>],
    cert_chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    alpn: &[u8],
) -> Result<rustls::ClientConfig, TlsConfigError> {
    if ca.is_empty() {
        return Err(TlsConfigError::NoCa);
    }
    let mut roots = rustls::RootCertStore::empty();
    for (index, cert) in ca.iter().enumerate() {
        roots
            .add(cert.clone())
            .map_err(|source| TlsConfigError::BadCa { index, source })?;
    }
    let provider = crypto_provider();
    let verifier = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .with_crls(crls.iter().cloned())
        .only_check_end_entity_revocation()
        .allow_unknown_revocation_status()
        .build()?;
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_webpki_verifier(verifier)
        .with_client_auth_cert(cert_chain, key)?;
    tls.alpn_protocols = vec![alpn.to_vec()];
    Ok(tls)
}

/// The rustls server configuration under [`server_config`], with ALPN `alpn`: TLS 1.3 only,
/// presenting `cert_chain` and `key`, verifying clients with `verifier`, no 0-RTT: a
/// TLS-over-TCP server with the lanes' settings (the bench's TCP yardstick).
pub fn server_tls(
    cert_chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    verifier: Arc<dyn ClientCertVerifier>,
    alpn: &[u8],
) -> Result<rustls::ServerConfig, TlsConfigError> {
    let mut tls = rustls::ServerConfig::builder_with_provider(crypto_provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(verifier)
        .with_single_cert(cert_chain, key)?;
    tls.alpn_protocols = vec![alpn.to_vec()];
    // 0-RTT data could be replayed; the protocol has nothing to say before the handshake.
    tls.max_early_data_size = 0;
    Ok(tls)
}
