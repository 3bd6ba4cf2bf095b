//! Requests for stellar-core's HTTP ports, carried to relays: [`CoreClient`].
//!
//! A stand-in on an RPC box (or a tier relay) sends each HTTP request meant for stellar-core
//! as one [`CoreRequest`] and gets one [`CoreResponse`] back (`docs/protocol.md` section 6).
//! The client keeps one *request connection*: a QUIC connection of its own, from its own UDP
//! socket, apart from any subscription's lanes, so a query never waits behind a ledger's
//! chunks. It is opened on the first request, with the same relay list, credentials and TLS
//! server names as a subscription, and shared by every request after it: each request is one
//! bidirectional stream (`CoreRequest`, FIN; `CoreResponse`, FIN), so many run at once.
//!
//! When the connection cannot be made, is lost, or the relay closes it, the request moves to
//! the next relay of the list (round robin, as a subscription fails over) and is sent again,
//! within the request's timeout and a bounded number of tries. A request sent again may reach
//! stellar-core twice: a transaction submitted twice is answered `DUPLICATE` the second time,
//! which is what core says of a transaction it already holds.
//!
//! What it does not do: decide what is forwarded (the relay does, `Endpoint::classify`),
//! retry a request a relay answered (any [`CoreResponse`], including a relay's own 503 or
//! 504, is the answer), or interpret stellar-core's answers.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ledger_relay_transport::{self as transport, TransportSettings};
pub use ledger_relay_wire::core_http::{CorePort, CoreRequest, CoreResponse, HttpMethod, Origin};
use ledger_relay_wire::frame::{self, ErrorCode, Frame};
use ledger_relay_wire::Limits;
use quinn::VarInt;
use tokio::time::Instant;

use crate::config::{Credentials, RelayAddr, SubscribeConfig};
use crate::error::{classify_connection, AuthReason, ErrorChain, Failure, SubscribeError};

/// What a [`CoreClient`] needs: the relays, the TLS identity, and bounds.
#[derive(Debug, Clone)]
pub struct CoreClientConfig {
    /// Relays in order of preference; requests fail over along this list.
    pub relays: Vec<RelayAddr>,
    /// Our TLS identity and the CA the relays' certificates chain to.
    pub credentials: Credentials,
    /// The TLS server name checked against every relay's certificate; `None` (default): each
    /// relay's host part, as [`SubscribeConfig::server_name`].
    pub server_name: Option<String>,
    /// Bounds on requests and answers (`max_core_request`, `max_core_response`).
    pub limits: Limits,
    /// QUIC settings of the request connection (default: a lane's).
    pub transport: TransportSettings,
    /// How long a request may take when it names no timeout of its own (`timeout_ms` 0;
    /// default 5 s).
    pub timeout: Duration,
    /// How long one attempt to connect to one relay may take before the next relay is tried
    /// (default 1 s): a relay that is down answers nothing, and without this bound a request
    /// would spend its whole timeout on it.
    pub connect_timeout: Duration,
}

impl CoreClientConfig {
    /// A configuration with the defaults documented on each field.
    pub fn new(relays: Vec<RelayAddr>, credentials: Credentials) -> CoreClientConfig {
        CoreClientConfig {
            relays,
            credentials,
            server_name: None,
            limits: Limits::default(),
            transport: TransportSettings::default(),
            timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(1),
        }
    }

    /// The relays, credentials, server name, limits and transport settings of a subscription,
    /// with the other defaults.
    pub fn from_subscription(config: &SubscribeConfig) -> CoreClientConfig {
        CoreClientConfig {
            server_name: config.server_name.clone(),
            limits: config.limits.clone(),
            transport: config.transport.clone(),
            ..CoreClientConfig::new(config.relays.clone(), config.credentials.clone())
        }
    }

    fn validate(&self) -> Result<(), CoreClientError> {
        let invalid = |field, reason: &str| {
            Err(CoreClientError::InvalidConfig {
                field,
                reason: reason.to_owned(),
            })
        };
        if self.relays.is_empty() {
            return invalid("relays", "no relay given");
        }
        for relay in &self.relays {
            let name = self.server_name.as_deref().unwrap_or(relay.host());
            if rustls::pki_types::ServerName::try_from(name).is_err() {
                return invalid("server_name", "not a valid DNS name or IP address");
            }
        }
        if self.timeout.is_zero() {
            return invalid("timeout", "must be positive");
        }
        if self.connect_timeout.is_zero() {
            return invalid("connect_timeout", "must be positive");
        }
        Ok(())
    }
}

/// Why a request got no [`CoreResponse`]. A relay's own refusals (403, 413, 429, 503, 504)
/// are responses, not errors.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CoreClientError {
    /// The configuration cannot work.
    #[error("invalid configuration: {field}: {reason}")]
    InvalidConfig {
        /// The offending setting.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The TLS client configuration could not be built from the credentials.
    #[error("cannot build the TLS configuration")]
    Tls(#[from] transport::TlsConfigError),
    /// The request is larger than `max_core_request`; not sent (a relay would take it for a
    /// protocol violation).
    #[error("request of {len} bytes is larger than the limit of {limit} bytes")]
    RequestTooLarge {
        /// Its frame body's length: fixed fields, target, content type and body.
        len: usize,
        /// `Limits::max_core_request`.
        limit: u32,
    },
    /// No relay took the request: every try failed, or the timeout ran out before a request
    /// connection was up.
    #[error("no relay reachable after {tries} tries in {} ms{}", waited.as_millis(), last_suffix(.last_error))]
    Unreachable {
        /// Connection attempts and sends made.
        tries: u32,
        /// How long it tried.
        waited: Duration,
        /// Why the last try failed, if one ended.
        last_error: Option<String>,
    },
    /// The request was sent but no answer came within the timeout.
    #[error("relay {relay} did not answer within {} ms", waited.as_millis())]
    Timeout {
        /// The relay it was sent to.
        relay: SocketAddr,
        /// The timeout.
        waited: Duration,
    },
    /// A relay refused our certificate, or we refused its; not tried further.
    #[error("not authorized by relay {relay}: {reason} ({detail})")]
    Unauthorized {
        /// The relay, as configured.
        relay: String,
        /// Why.
        reason: AuthReason,
        /// What the TLS stack or the relay said.
        detail: String,
    },
    /// The relay's answer is longer than a `CoreResponse` may be (`max_core_response` and the
    /// frame header); refused without buffering past the limit, and the connection is closed
    /// (a protocol violation).
    #[error("answer from relay {relay} is longer than {limit} bytes")]
    ResponseTooLarge {
        /// The relay.
        relay: SocketAddr,
        /// The limit.
        limit: usize,
    },
    /// The relay's answer is not one `CoreResponse` frame; the connection is closed.
    #[error("relay {relay} broke the protocol: {detail}")]
    Protocol {
        /// The relay.
        relay: SocketAddr,
        /// What it did.
        detail: String,
    },
}

fn last_suffix(last: &Option<String>) -> String {
    last.as_deref()
        .map(|e| format!(": {e}"))
        .unwrap_or_default()
}

impl CoreClientError {
    /// The HTTP status a stand-in answers with for this error, as a relay would: 503 no relay
    /// reachable, 504 no answer in time, 413 request too large, 502 a bad answer, 403 not
    /// authorized, 500 a configuration that cannot work.
    pub fn http_status(&self) -> u16 {
        match self {
            CoreClientError::Unreachable { .. } => 503,
            CoreClientError::Timeout { .. } => 504,
            CoreClientError::RequestTooLarge { .. } => 413,
            CoreClientError::ResponseTooLarge { .. } | CoreClientError::Protocol { .. } => 502,
            CoreClientError::Unauthorized { .. } => 403,
            CoreClientError::InvalidConfig { .. } | CoreClientError::Tls(_) => 500,
        }
    }

    /// This error as a relay's own answer (`CoreResponse::from_relay`: its status and a JSON
    /// body naming the reason), for an HTTP client that must get an answer.
    pub fn to_response(&self) -> CoreResponse {
        CoreResponse::from_relay(self.http_status(), &format!("{:#}", ErrorChain(self)))
    }
}

/// Requests for stellar-core, sent to relays over one shared request connection. Cheap to
/// clone (clones share the connection). Must be used inside a tokio runtime.
#[derive(Clone)]
pub struct CoreClient {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for CoreClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CoreClient")
            .field("relays", &self.inner.config.relays)
            .finish_non_exhaustive()
    }
}

struct Inner {
    config: CoreClientConfig,
    client: quinn::ClientConfig,
    state: tokio::sync::Mutex<State>,
}

/// The request connection, and where round robin goes next.
struct State {
    live: Option<Live>,
    /// Index (modulo the relay count) of the relay to connect to next.
    next: usize,
}

/// An open request connection.
#[derive(Clone)]
struct Live {
    /// Kept with the connection: it owns the UDP socket.
    _endpoint: quinn::Endpoint,
    conn: quinn::Connection,
    /// The relay as configured.
    name: String,
    addr: SocketAddr,
}

/// How one try ended without an answer.
enum TryFailed {
    /// Try the next relay (connect failed, connection lost or closed by the relay).
    Next(String),
    /// Give up with this error.
    Stop(CoreClientError),
}

impl CoreClient {
    /// A client for `config`'s relays. Checks the configuration and builds the TLS
    /// configuration; connects only when the first request is made.
    pub fn new(config: CoreClientConfig) -> Result<CoreClient, CoreClientError> {
        config.validate()?;
        let creds = &config.credentials;
        let client = transport::client_config(
            &creds.ca,
            &creds.crls,
            creds.cert_chain.clone(),
            creds.key.clone_key(),
            &config.transport,
        )?;
        Ok(CoreClient {
            inner: Arc::new(Inner {
                config,
                client,
                state: tokio::sync::Mutex::new(State {
                    live: None,
                    next: 0,
                }),
            }),
        })
    }

    /// Sends `request` and returns the answer: stellar-core's, or a relay's own
    /// ([`Origin::Relay`]). Takes at most `request.timeout_ms` (or the configured `timeout`
    /// when that is 0); each send carries the time left as its `timeout_ms`, so a relay answers
    /// (with 504 at worst) before the caller gives up. Fails over to the next relay when a
    /// connection cannot be made or is lost, at most twice round the list.
    pub async fn request(&self, mut request: CoreRequest) -> Result<CoreResponse, CoreClientError> {
        // The frame body: its fixed fields, then target, content type and body.
        let len = ledger_relay_wire::core_http::CORE_REQUEST_FIXED_LEN
            + request.target.len()
            + request.content_type.len()
            + request.body.len();
        let limit = self.inner.config.limits.max_core_request;
        if len > limit as usize {
            return Err(CoreClientError::RequestTooLarge { len, limit });
        }
        let budget = match request.timeout_ms {
            0 => self.inner.config.timeout,
            ms => Duration::from_millis(u64::from(ms)),
        };
        let started = Instant::now();
        let deadline = started + budget;
        let max_tries = 2 * self.inner.config.relays.len() as u32;
        let mut last_error = None;
        let unreachable = |tries, last_error| CoreClientError::Unreachable {
            tries,
            waited: started.elapsed(),
            last_error,
        };
        for tries in 1..=max_tries {
            if Instant::now() >= deadline {
                return Err(unreachable(tries - 1, last_error));
            }
            let live = match self.connection(deadline).await {
                Ok(live) => live,
                Err(TryFailed::Stop(e)) => return Err(e),
                Err(TryFailed::Next(why)) => {
                    last_error = Some(why);
                    continue;
                }
            };
            let left = deadline.saturating_duration_since(Instant::now());
            request.timeout_ms = u32::try_from(left.as_millis()).unwrap_or(u32::MAX).max(1);
            let limits = &self.inner.config.limits;
            match tokio::time::timeout_at(deadline, exchange(&live, &request, limits)).await {
                Err(_) => {
                    return Err(CoreClientError::Timeout {
                        relay: live.addr,
                        waited: budget,
                    })
                }
                Ok(Ok(response)) => return Ok(response),
                Ok(Err(TryFailed::Stop(e))) => {
                    self.drop_connection(&live, Some(ErrorCode::ProtocolViolation))
                        .await;
                    return Err(e);
                }
                Ok(Err(TryFailed::Next(why))) => {
                    tracing::debug!(relay = %live.addr, error = ?why, "request connection lost");
                    self.drop_connection(&live, None).await;
                    last_error = Some(why);
                }
            }
        }
        Err(unreachable(max_tries, last_error))
    }

    /// The relay the request connection is open to, if one is.
    pub async fn connected_relay(&self) -> Option<SocketAddr> {
        let state = self.inner.state.lock().await;
        state
            .live
            .as_ref()
            .filter(|l| l.conn.close_reason().is_none())
            .map(|l| l.addr)
    }

    /// Closes the request connection (the next request opens a new one).
    pub async fn close(&self) {
        if let Some(live) = self.inner.state.lock().await.live.take() {
            live.conn.close(VarInt::from_u32(0), b"closed");
        }
    }

    /// The open request connection, or a new one to the next relay in turn, by `deadline`.
    /// Concurrent callers wait for the same connection attempt. An attempt takes at most
    /// `connect_timeout` (and never past `deadline`); one that fails or runs out moves round
    /// robin on, so the next try (of this request or the next) goes to the next relay.
    async fn connection(&self, deadline: Instant) -> Result<Live, TryFailed> {
        let config = &self.inner.config;
        let Ok(mut state) = tokio::time::timeout_at(deadline, self.inner.state.lock()).await else {
            return Err(TryFailed::Next(
                "no request connection: another request's attempt took the time".into(),
            ));
        };
        if let Some(live) = &state.live {
            if live.conn.close_reason().is_none() {
                return Ok(live.clone());
            }
            // Lost while idle: the relay went away or closed it.
            state.live = None;
            state.next += 1;
        }
        let relay = &config.relays[state.next % config.relays.len()];
        let allowed = config
            .connect_timeout
            .min(deadline.saturating_duration_since(Instant::now()));
        let result = match tokio::time::timeout(allowed, self.connect(relay)).await {
            Ok(result) => result,
            Err(_) => Err(TryFailed::Next(format!(
                "{relay}: no answer to the QUIC handshake within {} ms",
                allowed.as_millis()
            ))),
        };
        match &result {
            Ok(live) => state.live = Some(live.clone()),
            Err(_) => state.next += 1,
        }
        result
    }

    /// Binds a socket and endpoint of its own and completes the QUIC handshake with `relay`.
    async fn connect(&self, relay: &RelayAddr) -> Result<Live, TryFailed> {
        let config = &self.inner.config;
        let next = |e: &(dyn std::error::Error + 'static)| {
            TryFailed::Next(format!("{relay}: {:#}", ErrorChain(e)))
        };
        let addr = relay.resolve().await.map_err(|e| next(&e))?;
        let ip: std::net::IpAddr = if addr.is_ipv4() {
            std::net::Ipv4Addr::UNSPECIFIED.into()
        } else {
            std::net::Ipv6Addr::UNSPECIFIED.into()
        };
        let socket = transport::udp_socket(SocketAddr::new(ip, 0), &config.transport)
            .map_err(|e| next(&e))?;
        let endpoint =
            transport::endpoint(socket, None, &config.transport).map_err(|e| next(&e))?;
        let server_name = config.server_name.as_deref().unwrap_or(relay.host());
        let connecting = endpoint
            .connect_with(self.inner.client.clone(), addr, server_name)
            .map_err(|e| next(&e))?;
        let name = relay.to_string();
        let conn = connecting
            .await
            .map_err(|e| connection_failed(&name, addr, &e))?;
        tracing::debug!(relay = %addr, "request connection open");
        Ok(Live {
            _endpoint: endpoint,
            conn,
            name,
            addr,
        })
    }

    /// Forgets `live` if it is still the current connection (closing it with `code` if given),
    /// and moves round robin to the next relay. Another request that already replaced it is
    /// left alone.
    async fn drop_connection(&self, live: &Live, code: Option<ErrorCode>) {
        let mut state = self.inner.state.lock().await;
        let current = state
            .live
            .as_ref()
            .is_some_and(|l| l.conn.stable_id() == live.conn.stable_id());
        if let Some(code) = code {
            live.conn
                .close(VarInt::from_u32(code.close_code()), b"bad answer");
        }
        if current {
            state.live = None;
            state.next += 1;
        }
    }
}

/// A lost or refused connection: the next relay, unless our certificate or the relay's was
/// refused (no other relay of the same CA would do better).
fn connection_failed(name: &str, addr: SocketAddr, e: &quinn::ConnectionError) -> TryFailed {
    match classify_connection(name, addr, 0, e) {
        Failure::Fatal(SubscribeError::Unauthorized {
            relay,
            reason,
            detail,
        }) => TryFailed::Stop(CoreClientError::Unauthorized {
            relay,
            reason,
            detail,
        }),
        Failure::Fatal(other) => TryFailed::Next(format!("{:#}", ErrorChain(&other))),
        Failure::Transient(t) => TryFailed::Next(format!("{:#}", ErrorChain(&t))),
    }
}

/// One request on one stream of `live`: the request and FIN, then the whole answer, bounded.
async fn exchange(
    live: &Live,
    request: &CoreRequest,
    limits: &Limits,
) -> Result<CoreResponse, TryFailed> {
    let lost = |e: &quinn::ConnectionError| connection_failed(&live.name, live.addr, e);
    let (mut send, mut recv) = live.conn.open_bi().await.map_err(|e| lost(&e))?;
    let frame = Frame::CoreRequest(request.clone());
    match transport::write_single_frame(&mut send, &frame).await {
        Ok(()) => {}
        // A relay that stops reading our request (it is over its limit) still answers it.
        Err(transport::FrameIoError::Write(quinn::WriteError::Stopped(_))) => {}
        Err(e) => return Err(stream_failed(live, e.connection_error(), &e)),
    }
    // An answer is a `CoreResponse`: bounded by `max_core_response`, tighter than
    // `max_core_frame_len` (the larger of a request and a response) when responses are
    // limited below requests.
    let limit = frame::FRAME_HEADER_LEN + limits.max_core_response as usize;
    let bytes = match recv.read_to_end(limit).await {
        Ok(bytes) => bytes,
        Err(quinn::ReadToEndError::TooLong) => {
            return Err(TryFailed::Stop(CoreClientError::ResponseTooLarge {
                relay: live.addr,
                limit,
            }))
        }
        Err(quinn::ReadToEndError::Read(e)) => {
            let conn = match &e {
                quinn::ReadError::ConnectionLost(c) => Some(c),
                _ => None,
            };
            return Err(stream_failed(live, conn, &e));
        }
    };
    match frame::decode_exact(bytes.into(), limits) {
        Ok(Frame::CoreResponse(response)) => Ok(response),
        // A relay that went away mid-answer (its connection is closed) is a lost connection,
        // not a bad answer.
        _ if live.conn.close_reason().is_some() => Err(TryFailed::Next(format!(
            "{}: connection closed during the answer",
            live.addr
        ))),
        Ok(other) => Err(protocol(
            live,
            format!("{} frame in answer to a request", other.frame_type().name()),
        )),
        Err(e) => Err(protocol(live, format!("{:#}", ErrorChain(&e)))),
    }
}

fn protocol(live: &Live, detail: String) -> TryFailed {
    TryFailed::Stop(CoreClientError::Protocol {
        relay: live.addr,
        detail,
    })
}

/// A stream that failed: a lost connection fails over; a stream the relay reset while its
/// connection lives is a refusal of this request, not of the relay.
fn stream_failed(
    live: &Live,
    conn: Option<&quinn::ConnectionError>,
    e: &(dyn std::error::Error + 'static),
) -> TryFailed {
    if let Some(c) = conn {
        return connection_failed(&live.name, live.addr, c);
    }
    if let Some(reason) = live.conn.close_reason() {
        return connection_failed(&live.name, live.addr, &reason);
    }
    protocol(live, format!("request stream failed: {:#}", ErrorChain(e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn credentials() -> Credentials {
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        Credentials {
            ca: vec![CertificateDer::from(vec![1u8])],
            crls: Vec::new(),
            cert_chain: vec![CertificateDer::from(vec![2u8])],
            key: PrivateKeyDer::Pkcs8(vec![3u8].into()),
        }
    }

    #[test]
    fn unworkable_configurations_are_named() {
        let relays = vec!["127.0.0.1:7000".parse().unwrap()];
        let check = |f: &dyn Fn(&mut CoreClientConfig), field: &str| {
            let mut c = CoreClientConfig::new(relays.clone(), credentials());
            f(&mut c);
            match c.validate() {
                Err(CoreClientError::InvalidConfig { field: got, .. }) => assert_eq!(got, field),
                other => panic!("{field}: {other:?}"),
            }
        };
        check(&|c| c.relays.clear(), "relays");
        check(
            &|c| c.server_name = Some("not a name".into()),
            "server_name",
        );
        check(&|c| c.timeout = Duration::ZERO, "timeout");
        check(&|c| c.connect_timeout = Duration::ZERO, "connect_timeout");
        CoreClientConfig::new(relays.clone(), credentials())
            .validate()
            .unwrap();
    }

    #[test]
    fn a_subscription_lends_its_relays_and_names() {
        let relays = vec!["relay-a.internal:7000".parse().unwrap()];
        let mut sub = SubscribeConfig::new(relays, credentials());
        sub.server_name = Some("relay".into());
        sub.limits.max_core_response = 1 << 20;
        let c = CoreClientConfig::from_subscription(&sub);
        assert_eq!(c.relays, sub.relays);
        assert_eq!(c.server_name.as_deref(), Some("relay"));
        assert_eq!(c.limits.max_core_response, 1 << 20);
        assert_eq!(c.timeout, Duration::from_secs(5));
    }

    #[test]
    fn errors_map_to_the_statuses_a_relay_answers_with() {
        let relay: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let unreachable = CoreClientError::Unreachable {
            tries: 2,
            waited: Duration::from_millis(2000),
            last_error: Some("127.0.0.1:1: refused".into()),
        };
        assert_eq!(unreachable.http_status(), 503);
        let r = unreachable.to_response();
        assert_eq!((r.status, r.origin), (503, Origin::Relay));
        let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(
            body["exception"],
            "ledger-relay: no relay reachable after 2 tries in 2000 ms: 127.0.0.1:1: refused"
        );
        let timeout = CoreClientError::Timeout {
            relay,
            waited: Duration::from_secs(1),
        };
        assert_eq!(timeout.http_status(), 504);
        let big = CoreClientError::ResponseTooLarge { relay, limit: 9 };
        assert_eq!(big.http_status(), 502);
        let req = CoreClientError::RequestTooLarge { len: 10, limit: 9 };
        assert_eq!(req.http_status(), 413);
    }
}
