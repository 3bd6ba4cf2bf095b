//! The QUIC endpoint: accepting connections, authorizing them, opening sessions, routing lane
//! joins, enforcing connection and session limits ([`crate::admission`]), and revoking live
//! sessions when the CRL changes.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ledger_relay_transport::{FrameReader, FrameWriter};
use ledger_relay_wire::compress::Codec;
use ledger_relay_wire::frame::{Frame, TOKEN_LEN};
use ledger_relay_wire::sender::{CloseReason, Violation};
use ledger_relay_wire::PROTOCOL_VERSION;
use quinn::{Connection, Endpoint};
use rand::RngCore;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::admission::{Admission, Caps, Decision, Slot};
use crate::auth::Auth;
use crate::closing::{close_for, close_plain};
use crate::metrics::Metrics;
use crate::reload::{Reloader, CRL_POLL};
use crate::session::{
    resolve_start, LaneRequest, Session, SessionConfig, SessionHandle, Shared,
    MAX_LANE_CERTIFICATES,
};

/// Limits and parameters of the accept loop.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Per-session parameters.
    pub session: SessionConfig,
    /// Most QUIC connections (lanes) from validated addresses open at once; more are refused
    /// before the handshake.
    pub max_connections: usize,
    /// Most sessions open at once.
    pub max_sessions: usize,
    /// Most lanes per session.
    pub max_lanes: u8,
    /// Most connections from one validated IP address at once.
    pub max_connections_per_address: usize,
    /// Most connections of one client identity at once.
    pub max_connections_per_identity: usize,
    /// Most sessions of one client identity at once.
    pub max_sessions_per_identity: usize,
    /// Handshakes from addresses not validated yet beyond which new attempts get a QUIC Retry.
    pub retry_threshold: usize,
    /// Time allowed for the TLS handshake and for the first frame.
    pub handshake_timeout: Duration,
    /// The codec chunks are compressed with (a subscriber must accept it).
    pub codec: Codec,
}

impl ServerConfig {
    /// The caps the accept loop enforces.
    pub fn caps(&self) -> Caps {
        Caps {
            max_connections: self.max_connections,
            max_connections_per_address: self.max_connections_per_address,
            max_connections_per_identity: self.max_connections_per_identity,
            max_sessions: self.max_sessions,
            max_sessions_per_identity: self.max_sessions_per_identity,
            retry_threshold: self.retry_threshold,
        }
    }
}

type Registry = Arc<Mutex<HashMap<u64, SessionHandle>>>;

struct Ctx {
    cfg: ServerConfig,
    auth: Arc<Auth>,
    shared: Shared,
    registry: Registry,
    admission: Arc<Admission>,
    shutdown: CancellationToken,
}

impl Ctx {
    /// The sessions open now (a snapshot, so none is ended under the registry's lock).
    fn sessions(&self) -> Vec<SessionHandle> {
        self.registry
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect()
    }
}

/// Accepts connections on `endpoint` until `shutdown`, then ends every session with
/// `ShuttingDown` and waits (briefly) for the endpoint to go idle.
pub async fn serve(
    endpoint: Endpoint,
    auth: Arc<Auth>,
    shared: Shared,
    cfg: ServerConfig,
    shutdown: CancellationToken,
) {
    let admission = Admission::new(cfg.caps(), shared.metrics.clone());
    let ctx = Arc::new(Ctx {
        cfg,
        auth,
        admission,
        shared,
        registry: Arc::new(Mutex::new(HashMap::new())),
        shutdown: shutdown.clone(),
    });
    tokio::spawn(watch_crl(ctx.clone(), endpoint.clone()));
    loop {
        let incoming = tokio::select! {
            i = endpoint.accept() => match i {
                Some(i) => i,
                None => break,
            },
            _ = shutdown.cancelled() => break,
        };
        // Counted here, before the task is spawned, under one lock with the check.
        let remote = incoming.remote_address();
        match ctx
            .admission
            .incoming(remote.ip(), incoming.remote_address_validated())
        {
            Decision::Admit(slot) => {
                tokio::spawn(handle(ctx.clone(), incoming, slot));
            }
            Decision::Retry => {
                Metrics::add(&ctx.shared.metrics.retries_total, 1);
                // Only unvalidated attempts are retried, and those may always be.
                if let Err(e) = incoming.retry() {
                    e.into_incoming().refuse();
                }
            }
            Decision::Refuse(reason) => {
                Metrics::add(&ctx.shared.metrics.sessions_refused_total, 1);
                debug!(%remote, %reason, "connection refused");
                incoming.refuse();
            }
        }
    }
    for h in &ctx.sessions() {
        h.end(CloseReason::ShuttingDown);
    }
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        while !ctx
            .registry
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let reason = CloseReason::ShuttingDown;
    endpoint.close(reason.close_code().into(), reason.to_string().as_bytes());
    let _ = tokio::time::timeout(Duration::from_secs(2), endpoint.wait_idle()).await;
}

/// Polls the CRL and the relay's certificate and key ([`Reloader`]); on a change installs a new
/// server config (new handshakes only) and ends sessions whose certificate a new CRL revokes.
async fn watch_crl(ctx: Arc<Ctx>, endpoint: Endpoint) {
    let mut tick = tokio::time::interval(CRL_POLL);
    let mut reloader = Reloader::new();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = ctx.shutdown.cancelled() => return,
        }
        let changed = reloader.poll(&ctx.auth, &ctx.shared.metrics);
        if !changed.any() {
            continue;
        }
        match ctx.auth.server_config() {
            Ok(sc) => endpoint.set_server_config(Some(sc)),
            Err(e) => warn!(error = %e, "new server config after a reload failed"),
        }
        if !changed.crl {
            continue;
        }
        for h in ctx.sessions() {
            if h.any_revoked(|s| ctx.auth.is_revoked(s)) {
                info!(session = h.id, client = %h.client.name, "certificate revoked: closing session");
                Metrics::add(&ctx.shared.metrics.revoked_sessions_total, 1);
                h.end(CloseReason::Revoked {
                    identity: h.client.name.clone(),
                });
            }
        }
    }
}

/// Refuses a lane or session: the reason's `Error` frame, then the close.
async fn refuse(conn: &Connection, send: &mut FrameWriter, reason: CloseReason) {
    close_for(conn, send.stream_mut(), &reason).await;
}

fn unauthorized(detail: impl Into<String>) -> CloseReason {
    CloseReason::Unauthorized {
        detail: detail.into(),
    }
}

fn violation(detail: impl Into<String>) -> CloseReason {
    Violation::BadRequest {
        detail: detail.into(),
    }
    .into()
}

/// Reads the first frame of a control stream.
async fn first_frame(reader: &mut FrameReader) -> Result<Frame, String> {
    match reader.next().await {
        Ok(Some(f)) => Ok(f),
        Ok(None) => Err("stream ended before the first frame".into()),
        Err(e) => Err(format!("{e:#}")),
    }
}

async fn handle(ctx: Arc<Ctx>, incoming: quinn::Incoming, mut slot: Slot) {
    let timeout = ctx.cfg.handshake_timeout;
    let remote = incoming.remote_address();
    let conn = match tokio::time::timeout(timeout, incoming).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            Metrics::add(&ctx.shared.metrics.handshakes_failed_total, 1);
            debug!(%remote, error = %e, "handshake failed");
            return;
        }
        Err(_) => {
            Metrics::add(&ctx.shared.metrics.handshakes_timed_out_total, 1);
            debug!(%remote, "handshake timed out");
            return;
        }
    };
    // The handshake proved the address: it counts against the connection caps now.
    if let Err(reason) = slot.handshake_done() {
        Metrics::add(&ctx.shared.metrics.sessions_refused_total, 1);
        debug!(%remote, %reason, "connection refused after its handshake");
        close_plain(&conn, &reason);
        return;
    }
    let client = ctx.auth.identify(&conn);
    // Counted as soon as the identity is known: a connection that never opens a stream holds
    // its place until the handshake timeout, and must hold it against its identity's cap.
    if let Ok(c) = &client {
        if let Err(reason) = slot.identify(&c.name) {
            Metrics::add(&ctx.shared.metrics.sessions_refused_total, 1);
            info!(%remote, client = %c.name, %reason, "connection refused");
            close_plain(&conn, &reason);
            return;
        }
    }
    let (mut send, mut recv) = match tokio::time::timeout(timeout, conn.accept_bi()).await {
        Ok(Ok((send, recv))) => (
            FrameWriter::new(send),
            FrameReader::new(recv, ctx.cfg.session.limits.clone()),
        ),
        _ => {
            close_plain(&conn, &Violation::NoControlStream.into());
            return;
        }
    };
    let client = match client {
        Ok(c) => c,
        Err(refusal) => {
            Metrics::add(&ctx.shared.metrics.sessions_refused_total, 1);
            info!(%remote, %refusal, "connection refused");
            refuse(&conn, &mut send, refusal.into()).await;
            return;
        }
    };
    let first = match tokio::time::timeout(timeout, first_frame(&mut recv)).await {
        Ok(Ok(f)) => f,
        Ok(Err(e)) => {
            Metrics::add(&ctx.shared.metrics.protocol_errors_total, 1);
            refuse(&conn, &mut send, violation(e)).await;
            return;
        }
        Err(_) => {
            Metrics::add(&ctx.shared.metrics.protocol_errors_total, 1);
            refuse(&conn, &mut send, violation("no first frame in time")).await;
            return;
        }
    };
    match first {
        Frame::SessionOpen(open) => {
            if open.version != PROTOCOL_VERSION {
                let msg = format!("protocol version {} not supported", open.version);
                refuse(&conn, &mut send, violation(msg)).await;
                return;
            }
            if ctx.cfg.codec != Codec::None && open.codecs & ctx.cfg.codec.bit() == 0 {
                let msg = format!("this relay sends {} chunks", ctx.cfg.codec);
                refuse(&conn, &mut send, violation(msg)).await;
                return;
            }
            let mut token = [0u8; TOKEN_LEN];
            rand::thread_rng().fill_bytes(&mut token);
            let id = rand::thread_rng().next_u64();
            let (lanes_tx, lanes_rx) = mpsc::channel(8);
            let lanes = open.lanes.min(ctx.cfg.max_lanes).max(1);
            let handle = SessionHandle {
                id,
                token,
                client: client.clone(),
                lane_serials: Arc::default(),
                lanes,
                lanes_tx,
                close: Arc::new(Mutex::new(None)),
                cancel: ctx.shutdown.child_token(),
            };
            if let Err(reason) = ctx
                .admission
                .register_session(&ctx.registry, handle.clone())
            {
                Metrics::add(&ctx.shared.metrics.sessions_refused_total, 1);
                info!(%remote, client = %client.name, %reason, "session refused");
                refuse(&conn, &mut send, reason).await;
                return;
            }
            // The CRL may have changed since `identify`, and the watcher may have scanned the
            // registry before this session was in it: check again now that it is.
            if ctx.auth.is_revoked(&client.serial) {
                ctx.registry
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&id);
                Metrics::add(&ctx.shared.metrics.sessions_refused_total, 1);
                info!(%remote, client = %client.name, "connection refused: certificate revoked");
                let reason = CloseReason::Revoked {
                    identity: client.name.clone(),
                };
                refuse(&conn, &mut send, reason).await;
                return;
            }
            let mut cfg = ctx.cfg.session.clone();
            cfg.window = cfg.window.min(open.window);
            let start =
                resolve_start(&ctx.shared, open.start, &handle.cancel, cfg.start_wait).await;
            match start {
                Ok(first) => {
                    Metrics::add(&ctx.shared.metrics.sessions_total, 1);
                    Metrics::add(&ctx.shared.metrics.sessions_open, 1);
                    Metrics::add(&ctx.shared.metrics.lanes_open, 1);
                    info!(session = id, client = %client.name, %remote, first, lanes, "session opened");
                    let end = Session::run(
                        cfg,
                        ctx.shared.clone(),
                        handle,
                        conn.clone(),
                        send,
                        recv,
                        first,
                        lanes_rx,
                    )
                    .await;
                    ctx.shared
                        .metrics
                        .sessions_open
                        .fetch_sub(1, Ordering::Relaxed);
                    info!(session = id, client = %client.name, code = ?end.code(), reason = %end, "session ended");
                }
                Err(reason) => {
                    // Ended while waiting for its first ledger: say why (revoked), not just
                    // that the wait was cut short.
                    let reason = handle.end_reason().unwrap_or(reason);
                    info!(session = id, client = %client.name, %reason, "session refused");
                    refuse(&conn, &mut send, reason).await;
                }
            }
            ctx.registry
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&id);
        }
        Frame::LaneJoin(join) => {
            let handle = ctx
                .registry
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&join.session_id)
                .cloned();
            let refusal = match &handle {
                None => Some(unauthorized("no such session")),
                Some(h) if !tokens_equal(&h.token, &join.token) => {
                    Some(unauthorized("wrong session token"))
                }
                Some(h) if h.client.name != client.name => Some(unauthorized(format!(
                    "lane identity {} differs from the session's {}",
                    client.name, h.client.name
                ))),
                Some(h) if join.lane >= h.lanes => Some(violation(format!(
                    "lane {} beyond the {} granted",
                    join.lane, h.lanes
                ))),
                Some(_) if join.version != PROTOCOL_VERSION => Some(violation(format!(
                    "protocol version {} not supported",
                    join.version
                ))),
                Some(_) => None,
            };
            if let Some(reason) = refusal {
                Metrics::add(&ctx.shared.metrics.sessions_refused_total, 1);
                info!(%remote, client = %client.name, %reason, "lane refused");
                refuse(&conn, &mut send, reason).await;
                return;
            }
            if let Some(h) = handle {
                if !h.add_lane_serial(&client.serial) {
                    Metrics::add(&ctx.shared.metrics.sessions_refused_total, 1);
                    let reason = CloseReason::Overloaded {
                        detail: format!(
                            "the session already holds {MAX_LANE_CERTIFICATES} other certificates"
                        ),
                    };
                    info!(%remote, client = %client.name, %reason, "lane refused");
                    refuse(&conn, &mut send, reason).await;
                    return;
                }
                if client.serial != h.client.serial {
                    // As at session open: the CRL watcher may have scanned the session before
                    // this serial was on it.
                    if ctx.auth.is_revoked(&client.serial) {
                        Metrics::add(&ctx.shared.metrics.sessions_refused_total, 1);
                        let reason = CloseReason::Revoked {
                            identity: client.name.clone(),
                        };
                        refuse(&conn, &mut send, reason).await;
                        return;
                    }
                }
                let req = LaneRequest {
                    lane: join.lane,
                    conn: conn.clone(),
                    send,
                    recv,
                };
                if h.lanes_tx.send(req).await.is_err() {
                    close_plain(&conn, &CloseReason::SessionEnded);
                    return;
                }
                // The session owns the lane now; keep this task (and its connection count)
                // until the lane closes.
                let _ = conn.closed().await;
            }
        }
        other => {
            Metrics::add(&ctx.shared.metrics.protocol_errors_total, 1);
            let msg = format!("{} frame cannot open a lane", other.frame_type().name());
            refuse(&conn, &mut send, violation(msg)).await;
        }
    }
}

/// Compares tokens without an early exit, so timing does not reveal a prefix.
fn tokens_equal(a: &[u8; TOKEN_LEN], b: &[u8; TOKEN_LEN]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
