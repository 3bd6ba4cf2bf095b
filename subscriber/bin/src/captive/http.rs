//! stellar-core's two HTTP ports on the RPC box, answered through relays.
//!
//! stellar-rpc calls its captive core's query server (`POST /getledgerentry`, for
//! `getLedgerEntries` and `simulateTransaction`) and command port (`GET /tx?blob=`, for
//! `sendTransaction`) on localhost; Horizon and the SDK's metrics call `GET /info`. The stand-in
//! listens where core would and sends each request, as received, to a relay
//! ([`CoreClient`]); the answer's status, `Content-Type` and body go back verbatim.
//!
//! The query server answers "as of a ledger", and the ledger the RPC has ingested is the last
//! one this stand-in wrote on its meta pipe (L), not the source core's newest. So on the query
//! port (docs/rpc.md, "Consistency"):
//! - `ledgerSeq=N`, N <= L: forwarded as is (the source core answers for N while it holds N);
//! - N > L: held up to `query_wait` for L to reach N, then forwarded; otherwise answered as a
//!   core that has not applied N answers: 404, `text/html`, `Ledger not found\n`;
//! - no `ledgerSeq`: pinned to L (`&ledgerSeq=L` appended), as the RPC's own core would answer
//!   for the ledger it last applied; before the first ledger is written, `Ledger not found`;
//! - a `ledgerSeq` core cannot parse: forwarded untouched, so core answers its own error.
//!
//! Every request is answered within `core_timeout` of its arrival: a relay that cannot be
//! reached gives 503, one that does not answer in time 504, both as JSON
//! (`CoreResponse::from_relay`). A body over `max_core_request` is refused here with 413.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{CONTENT_LENGTH, CONTENT_TYPE};
use hyper::{Method, Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use ledger_relay_wire::core_http::{
    form_ledger_seq, form_params, pin_ledger_seq, url_decode, CorePort, CoreRequest, CoreResponse,
    Endpoint, HttpMethod, LedgerSeqParam, Origin,
};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::CaptiveError;
use ledger_relay_subscriber::core_http::CoreClient;

/// Open client connections served at once, over both ports; more wait in the listen backlog.
/// stellar-rpc holds a handful (Go's default keeps two idle per host).
const MAX_CONNECTIONS: usize = 256;

/// How long a client may take to send a request's headers before its connection is closed.
const HEADER_TIMEOUT: Duration = Duration::from_secs(30);

/// At most one warning per this interval about requests that got no answer from a relay (the
/// others are counted into the next one), so an outage does not flood the service's log.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// How the servers answer.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// Where requests go.
    pub client: CoreClient,
    /// How long a query for a ledger newer than the last one written waits for it (default
    /// 1 s).
    pub query_wait: Duration,
    /// How long a request may take in all, waiting included (default 2 s, stellar-rpc's own
    /// client timeout).
    pub core_timeout: Duration,
    /// Largest request (target, content type and body together; `max_core_request`).
    pub max_request: u32,
}

/// The running servers. Dropping them without [`HttpServers::stop`] leaves the tasks to the
/// runtime's shutdown.
#[derive(Debug)]
pub struct HttpServers {
    addrs: Vec<(CorePort, SocketAddr)>,
    cancel: CancellationToken,
    tasks: JoinSet<()>,
}

impl HttpServers {
    /// Binds every address of `listen` (all or none) and serves them; `written` is L, the last
    /// ledger written on the meta pipe (0: none yet).
    pub async fn start(
        listen: &[(CorePort, SocketAddr)],
        options: HttpOptions,
        written: watch::Receiver<u32>,
    ) -> Result<HttpServers, CaptiveError> {
        let mut listeners = Vec::new();
        for &(port, addr) in listen {
            let listener = TcpListener::bind(addr)
                .await
                .map_err(|source| CaptiveError::Io {
                    what: format!("cannot listen on {addr} (core's {} port)", port.name()),
                    source,
                })?;
            listeners.push((port, listener));
        }
        let handler = Arc::new(Handler {
            options,
            written,
            warned: Mutex::new(Warned::default()),
        });
        let cancel = CancellationToken::new();
        let connections = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        let mut tasks = JoinSet::new();
        let mut addrs = Vec::new();
        for (port, listener) in listeners {
            let addr = listener.local_addr().map_err(|source| CaptiveError::Io {
                what: "cannot read a listening address".into(),
                source,
            })?;
            tracing::info!(%addr, port = port.name(), "serving stellar-core's port through the relays");
            addrs.push((port, addr));
            let accept = Accept {
                listener,
                port,
                handler: handler.clone(),
                connections: connections.clone(),
                cancel: cancel.clone(),
            };
            tasks.spawn(accept.run());
        }
        Ok(HttpServers {
            addrs,
            cancel,
            tasks,
        })
    }

    /// The address `port` is served on, if it is.
    pub fn local_addr(&self, port: CorePort) -> Option<SocketAddr> {
        self.addrs.iter().find(|(p, _)| *p == port).map(|(_, a)| *a)
    }

    /// Stops listening and closes every connection.
    pub async fn stop(mut self) {
        self.cancel.cancel();
        while self.tasks.join_next().await.is_some() {}
    }
}

/// One listener's accept loop.
struct Accept {
    listener: TcpListener,
    port: CorePort,
    handler: Arc<Handler>,
    connections: Arc<Semaphore>,
    cancel: CancellationToken,
}

impl Accept {
    async fn run(self) {
        let mut conns = JoinSet::new();
        loop {
            let permit = tokio::select! {
                _ = self.cancel.cancelled() => break,
                p = self.connections.clone().acquire_owned() => match p {
                    Ok(p) => p,
                    Err(_) => break,
                },
            };
            let stream = tokio::select! {
                _ = self.cancel.cancelled() => break,
                r = self.listener.accept() => match r {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        // Out of file descriptors and the like: wait rather than spin.
                        tracing::warn!(error = %e, "accepting an HTTP connection failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            let (handler, port, cancel) = (self.handler.clone(), self.port, self.cancel.clone());
            conns.spawn(async move {
                let _permit = permit;
                let service = hyper::service::service_fn(move |req| {
                    let handler = handler.clone();
                    async move { Ok::<_, Infallible>(handler.handle(port, req).await) }
                });
                let mut builder = hyper::server::conn::http1::Builder::new();
                // Core's servers send no Date header: neither do we.
                builder
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_TIMEOUT)
                    .auto_date_header(false);
                let conn = builder.serve_connection(TokioIo::new(stream), service);
                tokio::select! {
                    _ = conn => {}
                    _ = cancel.cancelled() => {}
                }
            });
            // Reap finished connections so the set does not grow.
            while conns.try_join_next().is_some() {}
        }
        conns.shutdown().await;
    }
}

/// Counts failures between warnings.
#[derive(Default)]
struct Warned {
    last: Option<Instant>,
    suppressed: u64,
}

struct Handler {
    options: HttpOptions,
    written: watch::Receiver<u32>,
    warned: Mutex<Warned>,
}

/// How core's query server answers for a ledger it holds no snapshot of.
fn ledger_not_found() -> CoreResponse {
    CoreResponse {
        status: 404,
        origin: Origin::Core,
        content_type: "text/html".into(),
        body: Bytes::from_static(b"Ledger not found\n"),
    }
}

impl Handler {
    async fn handle(&self, port: CorePort, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let deadline = Instant::now() + self.options.core_timeout;
        let answer = match self.forward(port, req, deadline).await {
            Ok(answer) | Err(answer) => answer,
        };
        to_http(answer)
    }

    /// The answer to one request: the relay's, or the stand-in's own (`Err`).
    async fn forward(
        &self,
        port: CorePort,
        req: Request<Incoming>,
        deadline: Instant,
    ) -> Result<CoreResponse, CoreResponse> {
        let mut request = self.read_request(port, req, deadline).await?;
        if port == CorePort::Query {
            request.body = self.consistent(&request, deadline).await?;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        request.timeout_ms = u32::try_from(left.as_millis()).unwrap_or(u32::MAX).max(1);
        match self.options.client.request(request).await {
            Ok(answer) => Ok(answer),
            Err(e) => {
                self.warn(port, &e);
                Err(e.to_response())
            }
        }
    }

    /// The request as a `CoreRequest`, its body read whole and bounded; refusals answered
    /// here.
    async fn read_request(
        &self,
        port: CorePort,
        req: Request<Incoming>,
        deadline: Instant,
    ) -> Result<CoreRequest, CoreResponse> {
        let method = match *req.method() {
            Method::GET => HttpMethod::Get,
            Method::POST => HttpMethod::Post,
            ref other => {
                let reason = format!("{other} is not forwarded to stellar-core");
                return Err(CoreResponse::from_relay(403, &reason));
            }
        };
        let target = req
            .uri()
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_owned();
        if !target.starts_with('/') || !target.bytes().all(|c| c.is_ascii_graphic()) {
            return Err(CoreResponse::from_relay(
                400,
                "request target is not a path",
            ));
        }
        // Core ignores the content type; one a frame cannot carry is not sent.
        let content_type = req
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .filter(|v| v.len() <= 255 && v.bytes().all(|c| c == b' ' || c.is_ascii_graphic()))
            .unwrap_or("")
            .to_owned();
        let max = self.options.max_request as usize;
        let body = match max.checked_sub(target.len() + content_type.len()) {
            Some(room) => read_body(req, room, deadline).await,
            None => Err(BodyError::TooLarge),
        };
        let body = body.map_err(|e| match e {
            BodyError::TooLarge => {
                CoreResponse::from_relay(413, &format!("request larger than {max} bytes"))
            }
            BodyError::Late => CoreResponse::from_relay(408, "request body not received in time"),
            BodyError::Broken => CoreResponse::from_relay(400, "request body not received"),
        })?;
        Ok(CoreRequest {
            version: ledger_relay_wire::PROTOCOL_VERSION,
            port,
            method,
            timeout_ms: 0,
            target,
            content_type,
            body,
        })
    }

    /// The query-port body to forward under the consistency rule (module docs), or the
    /// answer of a core that has not applied the ledger asked for.
    async fn consistent(
        &self,
        request: &CoreRequest,
        deadline: Instant,
    ) -> Result<Bytes, CoreResponse> {
        let is_query = matches!(
            Endpoint::classify(request.port, request.method, &request.target),
            Ok(Endpoint::GetLedgerEntry | Endpoint::GetLedgerEntryRaw)
        );
        if !is_query {
            return Ok(request.body.clone());
        }
        match form_ledger_seq(&request.body) {
            LedgerSeqParam::Invalid => Ok(request.body.clone()),
            LedgerSeqParam::Seq(n) => {
                let until = deadline.min(Instant::now() + self.options.query_wait);
                if self.wait_for(n, until).await {
                    Ok(request.body.clone())
                } else {
                    Err(ledger_not_found())
                }
            }
            // Without a key core answers its "Must specify key" whatever the ledger.
            LedgerSeqParam::Absent if !has_key(&request.body) => Ok(request.body.clone()),
            LedgerSeqParam::Absent => match *self.written.borrow() {
                0 => Err(ledger_not_found()),
                last => Ok(Bytes::from(pin_ledger_seq(&request.body, last))),
            },
        }
    }

    /// Whether ledger `n` has been written on the meta pipe by `until`.
    async fn wait_for(&self, n: u32, until: Instant) -> bool {
        let mut written = self.written.clone();
        let reached = tokio::time::timeout_at(until, written.wait_for(|&last| last >= n)).await;
        // A closed channel (the stream ended) keeps its last value: the ledger never comes.
        matches!(reached, Ok(Ok(_)))
    }

    fn warn(&self, port: CorePort, e: &ledger_relay_subscriber::core_http::CoreClientError) {
        let mut warned = self.warned.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if warned.last.is_some_and(|t| now < t + WARN_EVERY) {
            warned.suppressed += 1;
            return;
        }
        let before = std::mem::take(&mut warned.suppressed);
        warned.last = Some(now);
        tracing::warn!(
            port = port.name(),
            status = e.http_status(),
            error = ?format!("{e:#}"),
            earlier_failures = before,
            "a request for stellar-core got no answer from a relay"
        );
    }
}

/// Why a request body was not read.
enum BodyError {
    /// Longer than the room left.
    TooLarge,
    /// Not complete by the deadline.
    Late,
    /// The connection broke or the framing was bad.
    Broken,
}

/// `req`'s body, at most `room` bytes (refused at once when its Content-Length says more).
async fn read_body(
    req: Request<Incoming>,
    room: usize,
    deadline: Instant,
) -> Result<Bytes, BodyError> {
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > room as u64) {
        return Err(BodyError::TooLarge);
    }
    let body = Limited::new(req.into_body(), room).collect();
    match tokio::time::timeout_at(deadline, body).await {
        Err(_) => Err(BodyError::Late),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(BodyError::TooLarge),
        Ok(Err(_)) => Err(BodyError::Broken),
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
    }
}

fn has_key(body: &[u8]) -> bool {
    url_decode(body).is_some_and(|d| form_params(&d).iter().any(|(name, _)| *name == b"key"))
}

/// `answer` as an HTTP response: its status, its content type (none if empty), its body.
fn to_http(answer: CoreResponse) -> Response<Full<Bytes>> {
    let mut builder = Response::builder().status(answer.status);
    if !answer.content_type.is_empty() {
        builder = builder.header(CONTENT_TYPE, answer.content_type.as_str());
    }
    builder.body(Full::new(answer.body)).unwrap_or_else(|_| {
        // A status of 100..=599 and a visible-ASCII content type (the frame's rules) always
        // build; this answers anything else.
        let mut r = Response::new(Full::new(Bytes::from_static(b"bad answer from the relay")));
        *r.status_mut() = hyper::StatusCode::BAD_GATEWAY;
        r
    })
}
