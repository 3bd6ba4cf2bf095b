//! The double's two HTTP servers (hyper): each request read whole and bounded, answered by
//! [`CoreDouble::answer`], and the connection closed after the answer as core's servers do.
//! The query port refuses a body-carrying request without a positive `Content-Length` (chunked
//! included) and a body with control bytes, with core's stock 400; both refuse requests over
//! core's 10 MB.
//!
//! [`Servers::stop`] is "core down": the listeners close and connections in flight are dropped,
//! so a client is refused at once; [`Servers::resume`] listens on the same addresses again.

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_LENGTH, CONTENT_TYPE, TRANSFER_ENCODING};
use hyper::{Method, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

use ledger_relay_wire::core_http::CorePort;

use crate::answer::Answer;
use crate::double::{CoreDouble, Request};
use crate::error::DoubleError;

/// Largest request core's servers read (`MAX_REQUEST_SIZE`); beyond it, 400.
pub const MAX_REQUEST: usize = 10 << 20;

/// The double's listening ports.
#[derive(Debug)]
pub struct Servers {
    double: CoreDouble,
    /// Each port with its bound address and, while serving, its accept task.
    ports: Vec<(CorePort, SocketAddr, Option<JoinHandle<()>>)>,
}

impl Servers {
    /// Listens on `http` (command port) and `query` (query port) where given (port 0: any
    /// free port; see [`Servers::addr`]).
    pub async fn start(
        double: CoreDouble,
        http: Option<SocketAddr>,
        query: Option<SocketAddr>,
    ) -> Result<Servers, DoubleError> {
        let mut servers = Servers {
            double,
            ports: Vec::new(),
        };
        for (port, addr) in [(CorePort::Command, http), (CorePort::Query, query)] {
            if let Some(addr) = addr {
                let listener = bind(addr).await?;
                let bound = listener
                    .local_addr()
                    .map_err(|source| DoubleError::Bind { addr, source })?;
                let task = servers.spawn(port, listener);
                servers.ports.push((port, bound, Some(task)));
            }
        }
        Ok(servers)
    }

    /// The address `port` listens on.
    pub fn addr(&self, port: CorePort) -> Option<SocketAddr> {
        self.ports.iter().find(|p| p.0 == port).map(|p| p.1)
    }

    /// Stops serving and returns once both listeners are closed: from then on a client is
    /// refused at once. Connections in flight are dropped.
    pub async fn stop(&mut self) {
        for (_, _, task) in &mut self.ports {
            if let Some(t) = task.take() {
                t.abort();
                // An aborted task's future (and with it the listener) is dropped before its
                // handle resolves.
                let _ = t.await;
            }
        }
    }

    /// Serves again on the same addresses.
    pub async fn resume(&mut self) -> Result<(), DoubleError> {
        self.stop().await;
        for i in 0..self.ports.len() {
            let (port, addr, _) = self.ports[i];
            let listener = bind(addr).await?;
            self.ports[i].2 = Some(self.spawn(port, listener));
        }
        Ok(())
    }

    fn spawn(&self, port: CorePort, listener: TcpListener) -> JoinHandle<()> {
        tokio::spawn(accept_loop(self.double.clone(), port, listener))
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        for (_, _, task) in &mut self.ports {
            if let Some(t) = task.take() {
                t.abort();
            }
        }
    }
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, DoubleError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| DoubleError::Bind { addr, source })
}

/// Accepts until aborted; aborting drops the connections' tasks with it.
async fn accept_loop(double: CoreDouble, port: CorePort, listener: TcpListener) {
    let mut conns = JoinSet::new();
    loop {
        let (tcp, _) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "core double: accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
        };
        let double = double.clone();
        conns.spawn(async move {
            let service = hyper::service::service_fn(move |req| handle(double.clone(), port, req));
            let served = hyper::server::conn::http1::Builder::new()
                .keep_alive(false)
                .title_case_headers(true)
                .auto_date_header(false)
                .serve_connection(TokioIo::new(tcp), service)
                .await;
            if let Err(e) = served {
                tracing::debug!(error = %e, "core double: connection ended");
            }
        });
        while conns.try_join_next().is_some() {}
    }
}

async fn handle(
    double: CoreDouble,
    port: CorePort,
    req: hyper::Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let target = req
        .uri()
        .path_and_query()
        .map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned());
    let answer = match read_body(port, req).await {
        Ok(body) => double.answer(Request { port, target, body }).await,
        Err(refused) => refused,
    };
    Ok(respond(answer))
}

/// The body core's server would read: none on the command port or for a `GET`; otherwise
/// exactly `Content-Length` bytes of visible characters, at most [`MAX_REQUEST`].
async fn read_body(port: CorePort, req: hyper::Request<Incoming>) -> Result<Bytes, Answer> {
    if port == CorePort::Command || req.method() == Method::GET {
        return Ok(Bytes::new());
    }
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if req.headers().contains_key(TRANSFER_ENCODING) || declared.is_none_or(|n| n == 0) {
        return Err(Answer::bad_request());
    }
    let body = Limited::new(req.into_body(), MAX_REQUEST)
        .collect()
        .await
        .map_err(|_| Answer::bad_request())?
        .to_bytes();
    if body.iter().any(|c| c.is_ascii_control()) {
        return Err(Answer::bad_request());
    }
    Ok(body)
}

fn respond(answer: Answer) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(answer.body));
    *resp.status_mut() =
        StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(answer.content_type));
    resp
}
