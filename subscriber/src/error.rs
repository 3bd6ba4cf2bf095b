//! What can end a subscription, and how each failure is classified.
//!
//! Two kinds of failure exist:
//! - **Terminal** ([`SubscribeError`], returned on the Stream, which then ends): authorization
//!   failures, a start below the retention of every configured relay (the supervisor tries
//!   the next relay first), any integrity or verification failure, and a configuration that
//!   cannot work. Retrying cannot fix these, and for integrity failures a
//!   retry could hide a relay that serves the wrong chain.
//! - **Transient** ([`Transient`], logged and retried with backoff, failing over to the next
//!   relay): lost connections, timeouts, watchdogs, `Error` frames `ProtocolViolation`,
//!   `Overloaded`, `ShuttingDown`, `Internal`, and `SourceReset` (reconnected at once, to the
//!   same relay).
//!
//! `classify_connection` is the one place that turns a quinn error into one or the other.

use std::net::SocketAddr;

use ledger_relay_wire::content::ContentError;
use ledger_relay_wire::frame::{ErrorCode, ErrorFrame};
use ledger_relay_wire::header::{ChainError, HeaderError};
use ledger_relay_wire::text::Escaped;
use ledger_relay_wire::{AssemblyError, Hex};

use ledger_relay_transport::{FrameIoError, TlsConfigError};

/// Why the client certificate, or the relay's, was not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AuthReason {
    /// The relay does not know the CA that issued our certificate (TLS alert `unknown_ca`).
    UnknownCa,
    /// Our certificate is expired or not yet valid (TLS alert `certificate_expired`).
    Expired,
    /// Our certificate is revoked (TLS alert `certificate_revoked`, or `Revoked` from the
    /// relay).
    Revoked,
    /// Our certificate is valid but its identity is not allowed on this relay (TLS alert
    /// `access_denied`, or `Unauthorized` from the relay).
    NotAllowed,
    /// The relay rejected our certificate for another reason (the TLS alert number).
    Rejected {
        /// The TLS alert the relay sent.
        alert: u8,
    },
    /// We rejected the relay's certificate: not issued by our CA, expired, or not valid for
    /// the server name.
    RelayCertificate,
    /// We rejected the relay's certificate because our `crl.pem` revokes it (its key may be in
    /// other hands).
    RelayRevoked,
}

impl std::fmt::Display for AuthReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AuthReason::UnknownCa => f.write_str("our certificate's CA is unknown to the relay"),
            AuthReason::Expired => f.write_str("our certificate is expired or not yet valid"),
            AuthReason::Revoked => f.write_str("our certificate is revoked"),
            AuthReason::NotAllowed => f.write_str("our certificate's identity is not allowed"),
            AuthReason::Rejected { alert } => {
                write!(f, "the relay rejected our certificate (tls alert {alert})")
            }
            AuthReason::RelayCertificate => f.write_str("the relay's certificate is not trusted"),
            AuthReason::RelayRevoked => f.write_str("the relay's certificate is revoked"),
        }
    }
}

/// Layers 4 and 5 of the integrity checks failed for a ledger (see [`crate::verify`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VerifyError {
    /// The ledger's header could not be read, or its stored hash is not the sha256 of it.
    #[error("ledger {seq}: bad header")]
    Header {
        /// The sequence the relay sent it as.
        seq: u32,
        /// What was wrong.
        #[source]
        source: HeaderError,
    },
    /// The ledger is too short to hold a header.
    #[error("ledger {seq}: {len} bytes is too short for a ledger header")]
    Truncated {
        /// The sequence the relay sent it as.
        seq: u32,
        /// Its length.
        len: usize,
    },
    /// The header's `ledgerSeq` is not the sequence the relay sent the ledger as.
    #[error("ledger sent as {seq} carries header sequence {header_seq}")]
    SequenceMismatch {
        /// The sequence the relay sent it as.
        seq: u32,
        /// `ledgerSeq` from the header.
        header_seq: u32,
    },
    /// The header hash differs from the end record's.
    #[error("ledger {seq}: header hash differs from the end record's")]
    HashMismatch {
        /// The ledger.
        seq: u32,
        /// The hash of the delivered header.
        header: [u8; 32],
        /// The end record's `header hash`.
        end: [u8; 32],
    },
    /// The header's previous-ledger hash differs from the end record's.
    #[error("ledger {seq}: previous hash differs from the end record's")]
    PreviousHashMismatch {
        /// The ledger.
        seq: u32,
        /// `previousLedgerHash` of the delivered header.
        header: [u8; 32],
        /// The end record's `previous hash`.
        end: [u8; 32],
    },
    /// The ledger does not follow the last delivered one (sequence or hash chain).
    #[error("hash chain broken")]
    Chain(#[from] ChainError),
    /// Layer 5 failed: the transaction set or the results do not hash to what the header
    /// commits to (the relay changed, added, removed or reordered a transaction or a result;
    /// [`ContentError::TxSetHashMismatch`], [`ContentError::ResultSetHashMismatch`]), or the
    /// body is not a well-formed `LedgerCloseMeta`, so its hashes cannot be computed.
    #[error("ledger {seq}: content check failed")]
    Content {
        /// The ledger.
        seq: u32,
        /// What is wrong.
        #[source]
        source: ContentError,
    },
    /// The first ledger does not match the trusted anchor ([`crate::config::Anchor`]): ledger
    /// `anchor_seq` has another hash, or ledger `anchor_seq + 1` links to another one.
    #[error(
        "ledger {seq} does not match the anchor {anchor_seq}:{}: {} {}",
        Hex(expected),
        if *.seq == *.anchor_seq { "its hash is" } else { "its previous hash is" },
        Hex(got)
    )]
    AnchorMismatch {
        /// The ledger checked: the anchor's, or the one after it.
        seq: u32,
        /// The anchor's sequence.
        anchor_seq: u32,
        /// The anchor's hash.
        expected: [u8; 32],
        /// The ledger's hash (or, for the ledger after the anchor, its previous hash).
        got: [u8; 32],
    },
}

/// A terminal failure of a subscription: the Stream yields it once and then ends.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SubscribeError {
    /// The configuration cannot work.
    #[error("invalid configuration: {field}: {reason}")]
    InvalidConfig {
        /// The offending setting.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The CA, certificate or key could not be loaded.
    #[error("cannot load credentials")]
    Credentials(#[from] ledger_relay_certs::CertError),
    /// The TLS client configuration could not be built from the credentials.
    #[error("cannot build the TLS configuration")]
    Tls(#[from] TlsConfigError),
    /// `connect` was called outside a tokio runtime.
    #[error("connect must be called inside a tokio runtime")]
    NoRuntime,
    /// Authorization failed; not retried (CLI exit 3).
    #[error("not authorized by relay {relay}: {reason}{}", detail_suffix(.detail))]
    Unauthorized {
        /// The relay, as configured (`host:port`).
        relay: String,
        /// Why.
        reason: AuthReason,
        /// What the TLS stack or the relay said.
        detail: String,
    },
    /// The requested start is older than the oldest ledger every configured relay holds (the
    /// last one to say so is named); not retried (CLI exit 4).
    #[error(
        "ledger {requested} is below the retention of relay {relay}: oldest ledger held is {oldest}, newest {newest}"
    )]
    BelowRetention {
        /// The relay, as configured.
        relay: String,
        /// The ledger needed: the start asked for, or the one after the last delivered when
        /// the relay ends a session that fell behind its retention.
        requested: u32,
        /// The oldest ledger the relay holds (0 if only the close code was received).
        oldest: u32,
        /// The newest ledger the relay holds (0 if unknown).
        newest: u32,
    },
    /// No relay could be reached (no QUIC and TLS handshake completed) within
    /// [`crate::SubscribeConfig::first_connect_timeout`] of the start: a wrong address, a
    /// relay that is down, or a firewall. Not retried further (CLI exit 2).
    #[error("cannot reach relay {relays} within {}: {}", secs(*.waited), last_error.as_deref().unwrap_or("no answer to the QUIC handshake"))]
    Unreachable {
        /// The relays tried, as configured, comma-separated.
        relays: String,
        /// How long they were tried.
        waited: std::time::Duration,
        /// Why the last attempt failed, if one had ended.
        last_error: Option<String>,
    },
    /// Reassembly failed (layers 1 to 3: bounds, codec, checksum, order); nothing after it is
    /// delivered.
    #[error("integrity check failed on data from relay {relay}")]
    Integrity {
        /// The relay the data came from.
        relay: SocketAddr,
        /// The reassembler's error.
        #[source]
        source: AssemblyError,
    },
    /// A reassembled ledger failed the header and hash-chain checks (layer 4); nothing after
    /// it is delivered.
    #[error("ledger verification failed on data from relay {relay}")]
    Verify {
        /// The relay the ledger came from.
        relay: SocketAddr,
        /// What failed.
        #[source]
        source: VerifyError,
    },
}

/// `60 s`, `1.5 s`.
fn secs(d: std::time::Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

/// ` (DETAIL)`, escaped: the detail is the relay's or its TLS stack's text.
fn detail_suffix(detail: &str) -> String {
    if detail.is_empty() {
        String::new()
    } else {
        format!(" ({})", Escaped(detail))
    }
}

impl Transient {
    /// Whether to reconnect at once, to the same relay, without backoff: the relay's source
    /// was cut off mid-ledger (`SourceReset`), the relay itself is healthy.
    pub fn reconnect_at_once(&self) -> bool {
        matches!(
            self,
            Transient::Relay {
                code: ErrorCode::SourceReset,
                ..
            }
        )
    }
}

impl SubscribeError {
    /// Whether this is an authorization failure (the CLI exits 3).
    pub fn is_unauthorized(&self) -> bool {
        matches!(self, SubscribeError::Unauthorized { .. })
    }

    /// Whether the start was below the relay's retention (the CLI exits 4).
    pub fn is_below_retention(&self) -> bool {
        matches!(self, SubscribeError::BelowRetention { .. })
    }

    /// The process exit code of a subscription that ended with this error (the command
    /// contract, docs/operations.md): 3 for an authorization failure, 4 for a start below
    /// retention, 2 for everything else.
    pub fn exit_code(&self) -> u8 {
        if self.is_unauthorized() {
            3
        } else if self.is_below_retention() {
            4
        } else {
            2
        }
    }

    /// For a start below retention, the machine-readable line the CLIs print after the error
    /// (a stable contract, docs/operations.md): `below-retention requested=R oldest=O
    /// newest=N` (0: unknown).
    pub fn below_retention_line(&self) -> Option<String> {
        match self {
            SubscribeError::BelowRetention {
                requested,
                oldest,
                newest,
                ..
            } => Some(format!(
                "below-retention requested={requested} oldest={oldest} newest={newest}"
            )),
            _ => None,
        }
    }
}

/// A failure that ends a session (or a lane) but not the subscription: it is logged and the
/// subscriber reconnects with backoff, to the next relay in its list.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Transient {
    /// The relay's address did not resolve.
    #[error("cannot resolve relay {relay}")]
    Resolve {
        /// The relay, as configured.
        relay: String,
        /// The resolver's error.
        #[source]
        source: std::io::Error,
    },
    /// A local socket could not be bound (for example a fixed lane port still in use).
    #[error("cannot bind a UDP socket on {addr}")]
    Bind {
        /// The local address.
        addr: SocketAddr,
        /// The socket error.
        #[source]
        source: std::io::Error,
    },
    /// quinn refused to start the connection.
    #[error("cannot connect to {relay}")]
    Connect {
        /// The relay.
        relay: SocketAddr,
        /// quinn's error.
        #[source]
        source: quinn::ConnectError,
    },
    /// The connection failed or was closed.
    #[error("connection to {relay} lost")]
    Connection {
        /// The relay.
        relay: SocketAddr,
        /// quinn's error.
        #[source]
        source: quinn::ConnectionError,
    },
    /// A control stream failed.
    #[error("control stream to {relay} failed")]
    Stream {
        /// The relay.
        relay: SocketAddr,
        /// The stream error.
        #[source]
        source: FrameIoError,
    },
    /// The relay ended the session with a retryable `Error` frame or close code.
    #[error("relay {relay} ended the session: {}{}", .code.name(), detail_suffix(.message))]
    Relay {
        /// The relay.
        relay: SocketAddr,
        /// The error code.
        code: ErrorCode,
        /// The relay's message.
        message: String,
    },
    /// The relay broke the protocol; the session is closed with `ProtocolViolation`.
    #[error("relay {relay} broke the protocol: {}", Escaped(.detail))]
    Protocol {
        /// The relay.
        relay: SocketAddr,
        /// What it did.
        detail: String,
    },
    /// The relay closed the control stream or the connection without saying why.
    #[error("relay {relay} closed the session")]
    Closed {
        /// The relay.
        relay: SocketAddr,
    },
    /// Something did not happen in time: the handshake, `SessionAccept`, or heartbeats
    /// (watchdog), or announced ledgers never arrived (stall watchdog).
    #[error("relay {relay}: {what}")]
    Timeout {
        /// The relay.
        relay: SocketAddr,
        /// What was awaited.
        what: String,
    },
}

/// The outcome of classifying a failure.
#[derive(Debug)]
pub(crate) enum Failure {
    /// Not retried: returned to the consumer.
    Fatal(SubscribeError),
    /// Retried after backoff.
    Transient(Transient),
}

impl From<Transient> for Failure {
    fn from(t: Transient) -> Self {
        Failure::Transient(t)
    }
}

impl From<SubscribeError> for Failure {
    fn from(e: SubscribeError) -> Self {
        Failure::Fatal(e)
    }
}

/// TLS alerts carried in QUIC's crypto error codes (`0x100 + alert`, RFC 9001 section 4.8).
mod alert {
    pub const BAD_CERTIFICATE: u8 = 42;
    pub const UNSUPPORTED_CERTIFICATE: u8 = 43;
    pub const CERTIFICATE_REVOKED: u8 = 44;
    pub const CERTIFICATE_EXPIRED: u8 = 45;
    pub const CERTIFICATE_UNKNOWN: u8 = 46;
    pub const UNKNOWN_CA: u8 = 48;
    pub const ACCESS_DENIED: u8 = 49;
    pub const DECRYPT_ERROR: u8 = 51;
    pub const CERTIFICATE_REQUIRED: u8 = 116;
}

/// The TLS alert in a QUIC transport error code, if it is a crypto error.
fn tls_alert(code: quinn::TransportErrorCode) -> Option<u8> {
    let code = u64::from(code);
    // Lazily: `code - 0x100` underflows for the other codes (a refused connection is 0x2).
    (0x100..0x200).contains(&code).then(|| (code - 0x100) as u8)
}

/// The authorization reason a certificate-related TLS alert from the relay means, if it is one.
fn reason_for_alert(a: u8) -> Option<AuthReason> {
    Some(match a {
        alert::UNKNOWN_CA => AuthReason::UnknownCa,
        alert::CERTIFICATE_EXPIRED => AuthReason::Expired,
        alert::CERTIFICATE_REVOKED => AuthReason::Revoked,
        alert::ACCESS_DENIED => AuthReason::NotAllowed,
        alert::BAD_CERTIFICATE
        | alert::UNSUPPORTED_CERTIFICATE
        | alert::CERTIFICATE_UNKNOWN
        | alert::DECRYPT_ERROR
        | alert::CERTIFICATE_REQUIRED => AuthReason::Rejected { alert: a },
        _ => return None,
    })
}

/// Classifies a quinn connection error on a connection to `relay` (configured as `name`).
///
/// - A crypto error that *we* raised (`TransportError`, from our TLS stack) with a certificate
///   alert: we rejected the relay's certificate (wrong CA, expired, wrong name): terminal.
/// - A crypto error the *relay* sent (`ConnectionClosed`) with a certificate alert: it rejected
///   ours. In TLS 1.3 this arrives after our handshake completed, on the first stream
///   operation. Terminal, with the reason the alert names.
/// - An application close with `0x100 + Unauthorized/Revoked`: terminal; with
///   `0x100 + BelowRetention`: terminal (bounds unknown: the `Error` frame was lost); any other
///   code: transient.
/// - Everything else (timeouts, resets, version mismatch, other alerts such as ALPN
///   `no_application_protocol`): transient.
pub(crate) fn classify_connection(
    name: &str,
    relay: SocketAddr,
    requested: u32,
    e: &quinn::ConnectionError,
) -> Failure {
    use quinn::ConnectionError as C;
    match e {
        C::TransportError(t) => {
            if let Some(a) = tls_alert(t.code) {
                if reason_for_alert(a).is_some() {
                    let reason = if a == alert::CERTIFICATE_REVOKED {
                        AuthReason::RelayRevoked
                    } else {
                        AuthReason::RelayCertificate
                    };
                    return SubscribeError::Unauthorized {
                        relay: name.to_owned(),
                        reason,
                        detail: t.to_string(),
                    }
                    .into();
                }
            }
        }
        C::ConnectionClosed(close) => {
            if let Some(reason) = tls_alert(close.error_code).and_then(reason_for_alert) {
                return SubscribeError::Unauthorized {
                    relay: name.to_owned(),
                    reason,
                    detail: close.to_string(),
                }
                .into();
            }
        }
        C::ApplicationClosed(close) => {
            if let Some(code) = ErrorCode::from_close_code(close.error_code.into_inner()) {
                let message = String::from_utf8_lossy(&close.reason).into_owned();
                return classify_error_frame(
                    name,
                    relay,
                    requested,
                    &ErrorFrame {
                        code,
                        oldest: 0,
                        newest: 0,
                        message,
                    },
                );
            }
            if close.error_code.into_inner() == 0 {
                return Transient::Closed { relay }.into();
            }
        }
        _ => {}
    }
    Transient::Connection {
        relay,
        source: e.clone(),
    }
    .into()
}

/// Classifies an `Error` frame from `relay` (configured as `name`), per the table in
/// `docs/protocol.md` section 3.
pub(crate) fn classify_error_frame(
    name: &str,
    relay: SocketAddr,
    requested: u32,
    e: &ErrorFrame,
) -> Failure {
    let unauthorized = |reason| {
        SubscribeError::Unauthorized {
            relay: name.to_owned(),
            reason,
            detail: e.message.clone(),
        }
        .into()
    };
    match e.code {
        ErrorCode::BelowRetention => SubscribeError::BelowRetention {
            relay: name.to_owned(),
            requested,
            oldest: e.oldest,
            newest: e.newest,
        }
        .into(),
        ErrorCode::Unauthorized => unauthorized(AuthReason::NotAllowed),
        ErrorCode::Revoked => unauthorized(AuthReason::Revoked),
        ErrorCode::ProtocolViolation
        | ErrorCode::Overloaded
        | ErrorCode::ShuttingDown
        | ErrorCode::Internal
        | ErrorCode::SourceReset => Transient::Relay {
            relay,
            code: e.code,
            message: e.message.clone(),
        }
        .into(),
    }
}

/// Classifies a control-stream failure: the connection error underneath if there is one, a
/// protocol violation for bad frames, otherwise a transient stream failure.
pub(crate) fn classify_frame_io(
    name: &str,
    relay: SocketAddr,
    requested: u32,
    e: FrameIoError,
) -> Failure {
    if let Some(c) = e.connection_error() {
        return classify_connection(name, relay, requested, c);
    }
    if e.is_protocol_violation() {
        return Transient::Protocol {
            relay,
            detail: format!("{:#}", ErrorChain(&e)),
        }
        .into();
    }
    Transient::Stream { relay, source: e }.into()
}

/// Formats an error with its sources, `a: b: c`, escaped: a source may quote the relay (a
/// connection closed with the relay's reason).
pub struct ErrorChain<'a>(pub &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", Escaped(self.0))?;
        let mut source = self.0.source();
        while let Some(s) = source {
            write!(f, ": {}", Escaped(s))?;
            source = s.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
