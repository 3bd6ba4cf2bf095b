//! The QUIC endpoint: accepting connections, authorizing them, opening sessions, routing lane
//! joins, handing request connections to [`crate::core_http`], enforcing connection and
//! session limits ([`crate::admission`]), and revoking live sessions and request connections
//! when the CRL changes.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ledger_relay_transport::{FrameReader, FrameWriter};
use ledger_relay_wire::compress::Codec;
use ledger_relay_wire::core_http::CoreRequest;
use ledger_relay_wire::frame::{Frame, LaneJoin, SessionOpen, TOKEN_LEN};
use ledger_relay_wire::sender::{check_join, check_open, CloseReason, JoinTarget, Violation};
use quinn::{Connection, Endpoint};
use rand::RngCore;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::admission::{Admission, Caps, Decision, Pending, Slot};
use crate::auth::{Auth, ClientId};
use crate::closing::{close_for, close_plain};
use crate::core_http::conn::{RequestConn, RequestConns};
use crate::core_http::forward::Forwarder;
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
    /// Most QUIC connections (lanes) with a verified client certificate open at once; more are
    /// refused (before the handshake while authenticated ones fill it).
    pub max_connections: usize,
    /// Most sessions open at once.
    pub max_sessions: usize,
    /// Most lanes per session.
    pub max_lanes: u8,
    /// Most authenticated connections from one IP address at once.
    pub max_connections_per_address: usize,
    /// Most connections of one client identity at once.
    pub max_connections_per_identity: usize,
    /// Most sessions of one client identity at once.
    pub max_sessions_per_identity: usize,
    /// Handshakes from addresses not validated yet beyond which new attempts get a QUIC Retry.
    pub retry_threshold: usize,
    /// Handshakes without a verified client certificate yet held at once (the pending pool).
    pub handshake_pool: usize,
    /// Of those, most from one source (an IPv4 address or an IPv6 /64).
    pub handshake_pool_per_source: usize,
    /// Time allowed for the QUIC/TLS handshake, client certificate included; a handshake not
    /// done by then leaves the pending pool.
    pub handshake_timeout: Duration,
    /// Time an authenticated connection is allowed to open its control stream and send its
    /// first frame.
    pub first_frame_timeout: Duration,
    /// The codec chunks are compressed with (a subscriber must accept it).
    pub codec: Codec,
}

/// Time an authenticated connection has for its first frame.
pub const FIRST_FRAME_TIMEOUT: Duration = Duration::from_secs(10);

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
            handshake_pool: self.handshake_pool,
            handshake_pool_per_source: self.handshake_pool_per_source,
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
    /// Where requests for stellar-core go.
    forwarder: Arc<Forwarder>,
    /// The request connections open.
    core_conns: RequestConns,
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

/// Accepts connections on `endpoint` until `shutdown`, then ends every session and request
/// connection with `ShuttingDown` and waits (briefly) for the endpoint to go idle. Requests
/// for stellar-core go to `forwarder`.
pub(crate) async fn serve(
    endpoint: Endpoint,
    auth: Arc<Auth>,
    shared: Shared,
    cfg: ServerConfig,
    forwarder: Arc<Forwarder>,
    shutdown: CancellationToken,
) {
    let admission = Admission::new(cfg.caps(), shared.metrics.clone());
    let ctx = Arc::new(Ctx {
        cfg,
        auth,
        admission,
        shared,
        registry: Arc::new(Mutex::new(HashMap::new())),
        forwarder,
        core_conns: RequestConns::default(),
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
        dispatch(&ctx, incoming);
    }
    ctx.core_conns.close_all(&CloseReason::ShuttingDown);
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

/// Decides on one connection attempt: counted here, before its task is spawned, under one
/// lock with the check ([`Admission::incoming`]).
fn dispatch(ctx: &Arc<Ctx>, incoming: quinn::Incoming) {
    let remote = incoming.remote_address();
    let validated = incoming.remote_address_validated();
    match ctx.admission.incoming(remote.ip(), validated) {
        Decision::Admit(pending) => {
            tokio::spawn(handle(ctx.clone(), incoming, pending));
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
        Decision::Crowded(why) => {
            // Counted by the admission (`handshakes_refused_total`).
            debug!(%remote, reason = %why, "handshake refused");
            incoming.refuse();
        }
    }
}

/// Polls the CRL and the relay's certificate and key ([`Reloader`]); on a change installs a new
/// server config (new handshakes only) and ends sessions and request connections whose
/// certificate a new CRL revokes.
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
        for client in ctx.core_conns.close_revoked(|s| ctx.auth.is_revoked(s)) {
            info!(%client, "certificate revoked: closing request connection");
            Metrics::add(&ctx.shared.metrics.revoked_sessions_total, 1);
        }
    }
}

/// Refuses a lane or session: the reason's `Error` frame, then the close.
async fn refuse(conn: &Connection, send: &mut FrameWriter, reason: CloseReason) {
    close_for(conn, send.stream_mut(), &reason).await;
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

/// Serves one connection attempt admitted to the pending pool: its handshake, then (once
/// authenticated and counted) its first frame, which opens a session or joins a lane.
async fn handle(ctx: Arc<Ctx>, incoming: quinn::Incoming, pending: Pending) {
    let remote = incoming.remote_address();
    let Some(conn) = handshake(&ctx, incoming, &pending).await else {
        return;
    };
    // Held until the connection is done with: its place in the connection counts.
    let Some((_slot, client)) = admit(&ctx, &conn, pending, remote) else {
        return;
    };
    let Some((mut send, recv)) = control_stream(&ctx, &conn).await else {
        return;
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
    let req = Request {
        conn,
        send,
        recv,
        client,
        remote,
    };
    serve_request(&ctx, req).await;
}

/// The handshake of an admitted attempt, within the handshake timeout, unless the pending
/// pool evicts it first; `None` when it does not complete (dropping quinn's future then closes
/// the connection). A completed handshake carries a verified client certificate (see
/// [`crate::admission`]).
async fn handshake(ctx: &Ctx, incoming: quinn::Incoming, pending: &Pending) -> Option<Connection> {
    let remote = incoming.remote_address();
    let m = &ctx.shared.metrics;
    tokio::select! {
        done = tokio::time::timeout(ctx.cfg.handshake_timeout, incoming) => match done {
            Ok(Ok(c)) => Some(c),
            Ok(Err(e)) => {
                Metrics::add(&m.handshakes_failed_total, 1);
                debug!(%remote, error = %e, "handshake failed");
                None
            }
            Err(_) => {
                Metrics::add(&m.handshakes_timed_out_total, 1);
                debug!(%remote, "handshake timed out");
                None
            }
        },
        // Counted by the admission (`handshakes_evicted_total`).
        _ = pending.evicted() => {
            debug!(%remote, "pending handshake displaced by another source's");
            None
        }
    }
}

/// Counts an authenticated connection against the connection caps and, once its identity is
/// known, its identity's cap; `None` (the connection closed) when a cap refuses it. The
/// identity's refusal by the allow-list or the CRL is returned for the control stream.
fn admit(
    ctx: &Ctx,
    conn: &Connection,
    pending: Pending,
    remote: std::net::SocketAddr,
) -> Option<(Slot, Result<ClientId, crate::auth::Refusal>)> {
    let m = &ctx.shared.metrics;
    let mut slot = match pending.authenticated(remote.ip()) {
        Ok(slot) => slot,
        Err(reason) => {
            Metrics::add(&m.sessions_refused_total, 1);
            debug!(%remote, %reason, "connection refused after its handshake");
            close_plain(conn, &reason);
            return None;
        }
    };
    let client = ctx.auth.identify(conn);
    // Counted as soon as the identity is known: a connection that never opens a stream holds
    // its place until the first-frame timeout, and must hold it against its identity's cap.
    if let Ok(c) = &client {
        if let Err(reason) = slot.identify(&c.name) {
            Metrics::add(&m.sessions_refused_total, 1);
            info!(%remote, client = %c.name, %reason, "connection refused");
            close_plain(conn, &reason);
            return None;
        }
    }
    Some((slot, client))
}

/// The connection's control stream, opened by the client within the first-frame timeout.
async fn control_stream(ctx: &Ctx, conn: &Connection) -> Option<(FrameWriter, FrameReader)> {
    match tokio::time::timeout(ctx.cfg.first_frame_timeout, conn.accept_bi()).await {
        Ok(Ok((send, recv))) => Some((
            FrameWriter::new(send),
            FrameReader::new(recv, ctx.cfg.session.limits.clone()),
        )),
        _ => {
            close_plain(conn, &Violation::NoControlStream.into());
            None
        }
    }
}

/// An authenticated connection with its control stream, waiting for its first frame.
struct Request {
    conn: Connection,
    send: FrameWriter,
    recv: FrameReader,
    client: ClientId,
    remote: std::net::SocketAddr,
}

/// Reads the request's first frame and serves it: a session, a lane of one, or a request
/// connection.
async fn serve_request(ctx: &Arc<Ctx>, mut req: Request) {
    let m = &ctx.shared.metrics;
    let first = tokio::time::timeout(ctx.cfg.first_frame_timeout, first_frame(&mut req.recv));
    let first = match first.await {
        Ok(Ok(f)) => f,
        Ok(Err(e)) => {
            Metrics::add(&m.protocol_errors_total, 1);
            refuse(&req.conn, &mut req.send, violation(e)).await;
            return;
        }
        Err(_) => {
            Metrics::add(&m.protocol_errors_total, 1);
            refuse(
                &req.conn,
                &mut req.send,
                violation("no first frame in time"),
            )
            .await;
            return;
        }
    };
    match first {
        Frame::SessionOpen(open) => open_session(ctx, req, open).await,
        Frame::LaneJoin(join) => join_lane(ctx, req, join).await,
        Frame::CoreRequest(first) => serve_core(ctx, req, first).await,
        other => {
            Metrics::add(&m.protocol_errors_total, 1);
            let msg = format!("{} frame cannot open a lane", other.frame_type().name());
            refuse(&req.conn, &mut req.send, violation(msg)).await;
        }
    }
}

/// Serves a request connection, whose first stream carried `first`, until it closes. It
/// keeps its place in the connection counts meanwhile, as a lane does.
async fn serve_core(ctx: &Arc<Ctx>, req: Request, first: CoreRequest) {
    let Request {
        conn,
        send,
        recv,
        client,
        remote,
    } = req;
    let _registered = ctx.core_conns.register(&conn, &client);
    // As at session open: the CRL watcher may have scanned the request connections before
    // this one was among them.
    if ctx.auth.is_revoked(&client.serial) {
        let reason = CloseReason::Revoked {
            identity: client.name.clone(),
        };
        refuse_plain(ctx, &conn, &reason);
        return;
    }
    info!(%remote, client = %client.name, "request connection opened");
    let served = RequestConn {
        conn: conn.clone(),
        identity: client.name.as_str().into(),
        forwarder: ctx.forwarder.clone(),
        limits: ctx.cfg.session.limits.clone(),
        metrics: ctx.shared.metrics.clone(),
    };
    served.run(first, send, recv).await;
    let why = conn
        .close_reason()
        .map(|e| e.to_string())
        .unwrap_or_default();
    info!(%remote, client = %client.name, reason = %why, "request connection closed");
}

fn refuse_plain(ctx: &Ctx, conn: &Connection, reason: &CloseReason) {
    Metrics::add(&ctx.shared.metrics.sessions_refused_total, 1);
    close_plain(conn, reason);
}

/// Why a `SessionOpen` cannot be served by this relay (version, codecs), if it cannot.
fn open_refusal(ctx: &Ctx, open: &SessionOpen) -> Option<CloseReason> {
    check_open(open, ctx.cfg.codec).err()
}

/// A new session's handle and the receiver of its lane joins.
fn new_session(
    ctx: &Ctx,
    client: &ClientId,
    open: &SessionOpen,
) -> (SessionHandle, mpsc::Receiver<LaneRequest>) {
    let mut token = [0u8; TOKEN_LEN];
    rand::thread_rng().fill_bytes(&mut token);
    let (lanes_tx, lanes_rx) = mpsc::channel(8);
    let handle = SessionHandle {
        id: rand::thread_rng().next_u64(),
        token,
        client: client.clone(),
        lane_serials: Arc::default(),
        lanes: open.lanes.min(ctx.cfg.max_lanes).max(1),
        lanes_tx,
        close: Arc::new(Mutex::new(None)),
        cancel: ctx.shutdown.child_token(),
    };
    (handle, lanes_rx)
}

/// Puts `handle` in the registry if the session caps allow and its certificate is not
/// revoked; the reason to refuse it otherwise.
fn register(ctx: &Ctx, handle: &SessionHandle) -> Result<(), CloseReason> {
    ctx.admission
        .register_session(&ctx.registry, handle.clone())?;
    // The CRL may have changed since `identify`, and the watcher may have scanned the
    // registry before this session was in it: check again now that it is.
    if ctx.auth.is_revoked(&handle.client.serial) {
        ctx.registry
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&handle.id);
        return Err(CloseReason::Revoked {
            identity: handle.client.name.clone(),
        });
    }
    Ok(())
}

/// Serves a `SessionOpen`: checks it, registers the session, and runs it to its end.
async fn open_session(ctx: &Arc<Ctx>, mut req: Request, open: SessionOpen) {
    let (remote, name) = (req.remote, req.client.name.clone());
    if let Some(reason) = open_refusal(ctx, &open) {
        refuse(&req.conn, &mut req.send, reason).await;
        return;
    }
    let (handle, lanes_rx) = new_session(ctx, &req.client, &open);
    if let Err(reason) = register(ctx, &handle) {
        Metrics::add(&ctx.shared.metrics.sessions_refused_total, 1);
        info!(%remote, client = %name, %reason, "session refused");
        refuse(&req.conn, &mut req.send, reason).await;
        return;
    }
    let id = handle.id;
    run_session(ctx, req, open, handle, lanes_rx).await;
    ctx.registry
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&id);
}

/// Runs a registered session from its start until it ends.
async fn run_session(
    ctx: &Arc<Ctx>,
    mut req: Request,
    open: SessionOpen,
    handle: SessionHandle,
    lanes_rx: mpsc::Receiver<LaneRequest>,
) {
    let (id, lanes, remote) = (handle.id, handle.lanes, req.remote);
    let name = req.client.name.clone();
    let m = &ctx.shared.metrics;
    let mut cfg = ctx.cfg.session.clone();
    cfg.window = cfg.window.min(open.window);
    let start = resolve_start(&ctx.shared, open.start, &handle.cancel, cfg.start_wait).await;
    let first = match start {
        Ok(first) => first,
        Err(reason) => {
            // Ended while waiting for its first ledger: say why (revoked), not just that the
            // wait was cut short.
            let reason = handle.end_reason().unwrap_or(reason);
            info!(session = id, client = %name, %reason, "session refused");
            refuse(&req.conn, &mut req.send, reason).await;
            return;
        }
    };
    Metrics::add(&m.sessions_total, 1);
    Metrics::add(&m.sessions_open, 1);
    Metrics::add(&m.lanes_open, 1);
    info!(session = id, client = %name, %remote, first, lanes, "session opened");
    let shared = ctx.shared.clone();
    let end = Session::run(
        cfg, shared, handle, req.conn, req.send, req.recv, first, lanes_rx,
    )
    .await;
    m.sessions_open.fetch_sub(1, Ordering::Relaxed);
    info!(session = id, client = %name, code = ?end.code(), reason = %end, "session ended");
}

/// Why a `LaneJoin` for `handle` (`None`: no such session) is refused, if it is.
fn lane_refusal(
    ctx: &Ctx,
    handle: Option<&SessionHandle>,
    join: &LaneJoin,
    client: &ClientId,
) -> Option<CloseReason> {
    let target = handle.map(|h| JoinTarget {
        token: &h.token,
        identity: &h.client.name,
        lanes: h.lanes,
    });
    if let Err(reason) = check_join(join, target, &client.name) {
        return Some(reason);
    }
    // `check_join` refuses a join to no session.
    let h = handle?;
    if !h.add_lane_serial(&client.serial) {
        return Some(CloseReason::Overloaded {
            detail: format!("the session already holds {MAX_LANE_CERTIFICATES} other certificates"),
        });
    }
    // As at session open: the CRL watcher may have scanned the session before this serial
    // was on it.
    if client.serial != h.client.serial && ctx.auth.is_revoked(&client.serial) {
        return Some(CloseReason::Revoked {
            identity: client.name.clone(),
        });
    }
    None
}

/// Serves a `LaneJoin`: hands the lane to its session, and keeps the connection's place in the
/// counts until the lane closes.
async fn join_lane(ctx: &Arc<Ctx>, mut req: Request, join: LaneJoin) {
    let handle = ctx
        .registry
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&join.session_id)
        .cloned();
    if let Some(reason) = lane_refusal(ctx, handle.as_ref(), &join, &req.client) {
        Metrics::add(&ctx.shared.metrics.sessions_refused_total, 1);
        info!(remote = %req.remote, client = %req.client.name, %reason, "lane refused");
        refuse(&req.conn, &mut req.send, reason).await;
        return;
    }
    // `lane_refusal` refuses a join to no session.
    let Some(h) = handle else { return };
    let conn = req.conn.clone();
    let lane = LaneRequest {
        lane: join.lane,
        conn: req.conn,
        send: req.send,
        recv: req.recv,
    };
    if h.lanes_tx.send(lane).await.is_err() {
        close_plain(&conn, &CloseReason::SessionEnded);
        return;
    }
    // The session owns the lane now; keep this task (and its connection count) until the lane
    // closes.
    let _ = conn.closed().await;
}
