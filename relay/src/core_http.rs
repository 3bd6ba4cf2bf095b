//! Requests for stellar-core's HTTP ports, forwarded by the relay (`docs/protocol.md` section
//! 6): a stand-in on an RPC box (or a tier relay below this one) sends each request meant for
//! core as a `CoreRequest` on a *request connection*, and the relay answers it with core's own
//! answer or with one of its own.
//!
//! - [`decide`] is the whole forwarding decision, a pure function: is the endpoint forwarded
//!   at all (`Endpoint::classify`), may this client use that port (`--core-http-allow`,
//!   `--core-query-allow`), is there a core (or an upstream relay) for it, is the request
//!   within `--core-max-request`, and is the client under `--core-concurrency` requests in
//!   flight. A refusal is a [`Refusal`], answered with its status by the relay.
//! - [`forward::Forwarder`] is the one place that takes that decision, forwards what passes
//!   with the timeout [`budget`] gives, and counts ([`CoreMetrics`]) and logs every request.
//! - [`CoreBackend`] is where a request goes: [`http::HttpBackend`] for stellar-core's ports
//!   (`--core-http URL`, `--core-query URL`), or, for a tier relay, a client of its upstream
//!   relays (built by the `ledger-relay` binary, since it needs the subscriber library).
//! - [`conn`] serves a request connection: every bidirectional stream one request, each read
//!   whole and answered on a task of its own, so requests run at once and never on a
//!   session's tasks.
//!
//! What it does not do: look into core's answers. Status, content type and body pass through
//! byte for byte.

pub(crate) mod conn;
pub(crate) mod forward;
pub mod http;
#[cfg(test)]
mod tests;

use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;

use futures::future::BoxFuture;
pub use ledger_relay_wire::core_http::{
    CorePort, CoreRequest, CoreResponse, Endpoint, NotForwarded, Origin,
};
use tokio::time::Instant;

use crate::defaults::DEFAULTS;

pub use crate::metrics::core::{CoreMetrics, Outcome};
pub use http::CoreUrl;

/// Where the relay sends the requests it forwards: stellar-core's HTTP port, or another relay.
pub trait CoreBackend: Send + Sync + fmt::Debug {
    /// Sends `request` on and returns the answer, by `deadline`: core's answer
    /// ([`Origin::Core`], passed through byte for byte), or one made with
    /// [`CoreResponse::from_relay`] when there is none (503 unreachable, 504 no answer in
    /// time, 502 an answer that cannot be carried). `identity` is the client the request
    /// came from, for logs. The caller answers 504 itself when `deadline` passes first.
    fn forward<'a>(
        &'a self,
        request: CoreRequest,
        identity: &'a str,
        deadline: Instant,
    ) -> BoxFuture<'a, CoreResponse>;
}

/// The relay's settings for requests to stellar-core (`--core-*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoreSettings {
    /// `--core-http`: core's command port (`/tx`, `/info`).
    pub http: Option<CoreUrl>,
    /// `--core-query`: core's query server (`/getledgerentry`, `/getledgerentryraw`).
    pub query: Option<CoreUrl>,
    /// `--core-http-allow`: the clients that may use the command port; `None`: every client
    /// the relay admits (`--allow`).
    pub http_allow: Option<Vec<String>>,
    /// `--core-query-allow`: likewise for the query port.
    pub query_allow: Option<Vec<String>>,
    /// `--core-timeout`: the longest a request is given.
    pub timeout: Duration,
    /// `--core-max-request`: the largest request forwarded (target, content type and body).
    pub max_request: u32,
    /// `--core-concurrency`: requests of one client in flight at once.
    pub concurrency: u32,
}

impl Default for CoreSettings {
    fn default() -> CoreSettings {
        CoreSettings {
            http: None,
            query: None,
            http_allow: None,
            query_allow: None,
            timeout: DEFAULTS.core_timeout,
            max_request: DEFAULTS.core_max_request,
            concurrency: DEFAULTS.core_concurrency,
        }
    }
}

impl CoreSettings {
    /// Whether this relay names a core port of its own (a tier relay without one forwards to
    /// its upstream relays instead).
    pub fn has_own_core(&self) -> bool {
        self.http.is_some() || self.query.is_some()
    }
}

/// What [`decide`] knows of one of core's ports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PortRule {
    /// Requests for it have somewhere to go (core's port, or an upstream relay).
    pub backend: bool,
    /// The clients that may use it; `None`: every client the relay admits.
    pub allow: Option<BTreeSet<String>>,
}

/// Everything [`decide`] decides by, besides the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rules {
    /// The command port.
    pub command: PortRule,
    /// The query server.
    pub query: PortRule,
    /// `--core-max-request`.
    pub max_request: u32,
    /// `--core-concurrency`.
    pub concurrency: u32,
}

impl Rules {
    /// The rule of `port`.
    pub fn port(&self, port: CorePort) -> &PortRule {
        match port {
            CorePort::Command => &self.command,
            CorePort::Query => &self.query,
        }
    }
}

/// Why the relay answers a request itself instead of forwarding it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// A protocol version this relay does not speak (400).
    #[error(
        "request of protocol version {version}; this relay speaks {}",
        ledger_relay_wire::PROTOCOL_VERSION
    )]
    Version {
        /// The version the request carries.
        version: u16,
    },
    /// Not one of the forwarded endpoints (403).
    #[error(transparent)]
    NotForwarded(#[from] NotForwarded),
    /// The client may not use this port (403).
    #[error("client {identity} may not send requests to stellar-core's {} port", port.name())]
    NotAllowed {
        /// The client.
        identity: String,
        /// The port.
        port: CorePort,
    },
    /// The relay has no core for this port and no upstream relay (403).
    #[error("this relay forwards nothing to stellar-core's {} port", port.name())]
    NoCore {
        /// The port.
        port: CorePort,
    },
    /// The request is larger than `--core-max-request` (413).
    #[error("request of {len} bytes is larger than this relay's limit of {limit} bytes")]
    TooLarge {
        /// Target, content type and body.
        len: usize,
        /// `--core-max-request`.
        limit: u32,
    },
    /// The client already has `--core-concurrency` requests in flight (429).
    #[error("client {identity} already has {limit} requests in flight")]
    Busy {
        /// The client.
        identity: String,
        /// `--core-concurrency`.
        limit: u32,
    },
}

impl Refusal {
    /// The HTTP status the relay answers with (`docs/protocol.md` section 6).
    pub fn status(&self) -> u16 {
        match self {
            Refusal::Version { .. } => 400,
            Refusal::NotForwarded(_) | Refusal::NotAllowed { .. } | Refusal::NoCore { .. } => 403,
            Refusal::TooLarge { .. } => 413,
            Refusal::Busy { .. } => 429,
        }
    }

    /// The relay's answer.
    pub fn response(&self) -> CoreResponse {
        CoreResponse::from_relay(self.status(), &self.to_string())
    }
}

/// A request's size as `--core-max-request` counts it: target, content type and body.
pub fn request_size(request: &CoreRequest) -> usize {
    request.target.len() + request.content_type.len() + request.body.len()
}

/// Whether `request` from client `identity`, which has `in_flight` requests forwarded and not
/// answered yet, is forwarded, and to which endpoint. The checks run in this order, and the
/// first that fails is the answer: the endpoint is one the relay forwards, the client may use
/// its port, the port has a core (or an upstream), the request fits `--core-max-request`, and
/// the client is under `--core-concurrency` (refused at once, never queued).
pub fn decide(
    rules: &Rules,
    request: &CoreRequest,
    identity: &str,
    in_flight: u32,
) -> Result<Endpoint, Refusal> {
    if request.version != ledger_relay_wire::PROTOCOL_VERSION {
        return Err(Refusal::Version {
            version: request.version,
        });
    }
    let endpoint = Endpoint::classify(request.port, request.method, &request.target)?;
    let rule = rules.port(request.port);
    if rule.allow.as_ref().is_some_and(|a| !a.contains(identity)) {
        return Err(Refusal::NotAllowed {
            identity: identity.to_owned(),
            port: request.port,
        });
    }
    if !rule.backend {
        return Err(Refusal::NoCore { port: request.port });
    }
    let len = request_size(request);
    if len > rules.max_request as usize {
        return Err(Refusal::TooLarge {
            len,
            limit: rules.max_request,
        });
    }
    if in_flight >= rules.concurrency {
        return Err(Refusal::Busy {
            identity: identity.to_owned(),
            limit: rules.concurrency,
        });
    }
    Ok(endpoint)
}

/// The time a forwarded request is given: `--core-timeout`, or the sender's own timeout
/// (`timeout_ms`) when that is shorter, so the relay answers (504 at worst) before the sender
/// gives up. `timeout_ms` 0 names no timeout.
pub fn budget(timeout: Duration, timeout_ms: u32) -> Duration {
    match timeout_ms {
        0 => timeout,
        ms => timeout.min(Duration::from_millis(u64::from(ms))),
    }
}
