//! A request connection (`docs/protocol.md` section 6): a QUIC connection whose first
//! bidirectional stream carried a `CoreRequest`. Every stream on it carries one request and
//! FIN and gets one `CoreResponse` and FIN. Each stream is read and answered on a task of its
//! own, so requests run at once (up to the client's `--core-concurrency`, which is also the
//! connection's stream limit) and never on a session's tasks: a flood of queries costs the
//! relay's ledger delivery CPU, not a place in a session's queue.
//!
//! A stream that does not hold exactly one `CoreRequest` frame breaks the protocol: it is
//! reset and the connection closed with `ProtocolViolation`. The connection ends when the
//! client closes it, its certificate is revoked, or the relay shuts down ([`RequestConns`]).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use bytes::BytesMut;
use ledger_relay_transport::{write_single_frame, FrameReader, FrameWriter};
use ledger_relay_wire::frame::{self, ErrorCode, Frame, FrameType, FRAME_HEADER_LEN};
use ledger_relay_wire::sender::{CloseReason, Violation};
use ledger_relay_wire::Limits;
use quinn::{Connection, RecvStream, SendStream, VarInt};
use tracing::debug;

use super::forward::Forwarder;
use super::CoreRequest;
use crate::auth::ClientId;
use crate::closing::close_plain;
use crate::metrics::Metrics;

/// The request connections open, so that a revoked certificate's and, at shutdown, all of
/// them can be closed.
#[derive(Debug, Default)]
pub(crate) struct RequestConns {
    open: Mutex<HashMap<usize, (ClientId, Connection)>>,
}

/// A connection's entry in [`RequestConns`], removed when dropped.
pub(crate) struct Registered<'a> {
    conns: &'a RequestConns,
    id: usize,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.conns.lock().remove(&self.id);
    }
}

impl RequestConns {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<usize, (ClientId, Connection)>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Notes `conn`, of `client`, until the returned entry is dropped.
    pub(crate) fn register(&self, conn: &Connection, client: &ClientId) -> Registered<'_> {
        let id = conn.stable_id();
        self.lock().insert(id, (client.clone(), conn.clone()));
        Registered { conns: self, id }
    }

    /// Closes with `Revoked` every connection whose certificate `revoked` says is revoked;
    /// returns their identities.
    pub(crate) fn close_revoked(&self, revoked: impl Fn(&[u8]) -> bool) -> Vec<String> {
        let mut closed = Vec::new();
        for (client, conn) in self.lock().values() {
            if revoked(&client.serial) {
                let reason = CloseReason::Revoked {
                    identity: client.name.clone(),
                };
                close_plain(conn, &reason);
                closed.push(client.name.clone());
            }
        }
        closed
    }

    /// Closes every connection for `reason`.
    pub(crate) fn close_all(&self, reason: &CloseReason) {
        for (_, conn) in self.lock().values() {
            close_plain(conn, reason);
        }
    }
}

/// A request connection being served.
pub(crate) struct RequestConn {
    /// The connection.
    pub conn: Connection,
    /// Its client's identity.
    pub identity: Arc<str>,
    /// Where its requests go.
    pub forwarder: Arc<Forwarder>,
    /// Frame limits (`max_core_request` bounds a request stream).
    pub limits: Limits,
    /// The relay's metrics.
    pub metrics: Arc<Metrics>,
}

/// Counts a request connection open while it lives.
struct Open(Arc<Metrics>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.core.connections_open.fetch_sub(1, Ordering::Relaxed);
    }
}

impl RequestConn {
    /// Answers `first` (read from the first stream, `send` and `recv`), then every stream the
    /// client opens, until the connection closes.
    pub(crate) async fn run(self, first: CoreRequest, mut send: FrameWriter, recv: FrameReader) {
        Metrics::add(&self.metrics.core.connections_open, 1);
        let _open = Open(self.metrics.clone());
        self.conn
            .set_max_concurrent_bi_streams(VarInt::from_u32(self.forwarder.concurrency()));
        let this = Arc::new(self);
        let answering = this.clone();
        tokio::spawn(async move {
            answering.answer(first, send.stream_mut()).await;
            // The request was the stream's one frame; its end is not waited for.
            drop(recv);
        });
        while let Ok((send, recv)) = this.conn.accept_bi().await {
            let stream = this.clone();
            tokio::spawn(async move { stream.serve_stream(send, recv).await });
        }
    }

    /// Reads one request stream whole and answers it.
    async fn serve_stream(&self, mut send: SendStream, mut recv: RecvStream) {
        let read = read_request(&mut recv, &self.limits);
        match tokio::time::timeout(self.forwarder.timeout(), read).await {
            Ok(Ok(request)) => self.answer(request, &mut send).await,
            Ok(Err(ReadFailed::Violation(detail))) => {
                Metrics::add(&self.metrics.protocol_errors_total, 1);
                debug!(client = %self.identity, %detail, "request stream broke the protocol");
                let code = VarInt::from_u32(ErrorCode::ProtocolViolation.close_code());
                let _ = send.reset(code);
                let _ = recv.stop(code);
                close_plain(&self.conn, &Violation::BadFrame { detail }.into());
            }
            Ok(Err(ReadFailed::Gone)) => {}
            // A request that does not arrive within the time an answer is given: not read on.
            Err(_) => {
                let _ = send.reset(VarInt::from_u32(0));
                let _ = recv.stop(VarInt::from_u32(0));
            }
        }
    }

    /// Forwards `request` and writes the answer and FIN on `send`.
    async fn answer(&self, request: CoreRequest, send: &mut SendStream) {
        let response = self.forwarder.serve(request, &self.identity).await;
        if let Err(e) = write_single_frame(send, &Frame::CoreResponse(response)).await {
            debug!(client = %self.identity, error = %e, "answer to a core request not delivered");
        }
    }
}

/// Why a request stream was not read.
#[derive(Debug)]
enum ReadFailed {
    /// The stream does not hold exactly one `CoreRequest`.
    Violation(String),
    /// The client reset the stream, or the connection is gone.
    Gone,
}

/// Reads a request stream: a frame header, checked against `limits` before anything more is
/// read (a `CoreRequest` of at most `max_core_request`), then exactly the body it announces.
async fn read_request(recv: &mut RecvStream, limits: &Limits) -> Result<CoreRequest, ReadFailed> {
    let mut header = [0u8; FRAME_HEADER_LEN];
    recv.read_exact(&mut header).await.map_err(|e| match e {
        quinn::ReadExactError::FinishedEarly(_) => {
            ReadFailed::Violation("stream ended inside a frame header".into())
        }
        quinn::ReadExactError::ReadError(_) => ReadFailed::Gone,
    })?;
    let (ty, len) =
        frame::check_header(&header, limits).map_err(|e| ReadFailed::Violation(e.to_string()))?;
    if ty != FrameType::CoreRequest {
        let msg = format!("{} frame on a request stream", ty.name());
        return Err(ReadFailed::Violation(msg));
    }
    let body = recv.read_to_end(len as usize).await.map_err(|e| match e {
        quinn::ReadToEndError::TooLong => {
            ReadFailed::Violation("bytes after the request on its stream".into())
        }
        quinn::ReadToEndError::Read(_) => ReadFailed::Gone,
    })?;
    let mut whole = BytesMut::with_capacity(FRAME_HEADER_LEN + body.len());
    whole.extend_from_slice(&header);
    whole.extend_from_slice(&body);
    match frame::decode_exact(whole.freeze(), limits) {
        Ok(Frame::CoreRequest(request)) => Ok(request),
        Ok(other) => Err(ReadFailed::Violation(format!(
            "{} frame on a request stream",
            other.frame_type().name()
        ))),
        Err(e) => Err(ReadFailed::Violation(e.to_string())),
    }
}
