//! One subscriber's session: the shell around [`ledger_relay_wire::sender::Sender`], which
//! makes every protocol decision (window, acks, resends, striping, live or catch-up, why and
//! when to end). This module only carries them out:
//!
//! - it feeds the sender what happens: lanes joining and dying, control frames, streams that
//!   ended, ledgers loaded from memory, the ring (on a blocking thread) or the backfill lake
//!   ([`backfill`]), items of the hub's live stream, revocation and shutdown, and time;
//! - it does what the sender asks: open a stream on a lane and send a unit, load a ledger, join
//!   or leave the live stream, write a heartbeat, close with the `Error` frame of a
//!   [`CloseReason`];
//! - it keeps the metrics.
//!
//! Every wait, control writes included, races the session's cancellation, and every control
//! write a deadline as well, so a subscriber that withholds flow-control credit can keep neither
//! a revoked or ended session open nor a live one waiting.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};
use ledger_relay_transport::{FrameReader, FrameWriter};
use ledger_relay_wire::frame::{Frame, Heartbeat, SessionAccept, TOKEN_LEN};
use ledger_relay_wire::sender::{
    next_tick, CloseReason, ControlError, Event, LaneReport, LiveItem, LoadResult, Sender,
    SenderConfig, SenderStats, StreamId, Unit,
};
use ledger_relay_wire::{Limits, PROTOCOL_VERSION};
use quinn::{Connection, ConnectionError};
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

use crate::auth::ClientId;
use crate::closing::{close_for, close_plain};
use crate::hub::Item;
use crate::metrics::{Metrics, SessionInfo};

mod backfill;
mod held;
use backfill::SessionLake;
pub(crate) use held::damaged;
use held::load;
pub use held::{held_range, resolve_start, Shared};

/// Session parameters from the relay's configuration.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// Protocol limits.
    pub limits: Limits,
    /// Raw bytes per chunk (announced in `SessionAccept`).
    pub chunk_size: u32,
    /// Most ledgers unacknowledged per session.
    pub window: u16,
    /// Heartbeat interval on the control stream.
    pub heartbeat: Duration,
    /// Most bytes in flight (sent, not yet acknowledged by the peer's QUIC stack) per lane.
    pub lane_budget: u64,
    /// Most streams open at once per lane (`--streams-per-lane`); a stream counts from its
    /// opening until the peer has acknowledged all of it. `None`: no limit.
    pub streams_per_lane: Option<u32>,
    /// How long a session waits for the relay to reach its start (a start ahead of the newest
    /// ledger held, or the tip of a relay that holds none yet) before it is refused; `None`
    /// waits until shutdown.
    pub start_wait: Option<Duration>,
}

/// A request to add a lane, from the accept loop.
#[derive(Debug)]
pub struct LaneRequest {
    /// Lane number.
    pub lane: u8,
    /// Its connection.
    pub conn: Connection,
    /// Its control stream's send half (for `LaneAccept` and `Error`).
    pub send: FrameWriter,
    /// Its control stream's receive half (kept open).
    pub recv: FrameReader,
}

/// What the accept loop needs to route lanes and revocations to a session.
#[derive(Debug, Clone)]
pub struct SessionHandle {
    /// Session id.
    pub id: u64,
    /// Lane token.
    pub token: [u8; TOKEN_LEN],
    /// Identity of lane 0's certificate.
    pub client: ClientId,
    /// Serials of the certificates the other lanes joined with, where they differ from lane
    /// 0's (same name, another certificate): revoking any of them ends the session. Each once,
    /// at most [`MAX_LANE_CERTIFICATES`] ([`SessionHandle::add_lane_serial`]).
    pub lane_serials: Arc<Mutex<Vec<Vec<u8>>>>,
    /// Lanes granted.
    pub lanes: u8,
    /// Where lane joins go.
    pub lanes_tx: mpsc::Sender<LaneRequest>,
    /// Why the session was ended from outside (revocation, shutdown).
    pub close: Arc<Mutex<Option<CloseReason>>>,
    /// Cancelled to end the session.
    pub cancel: CancellationToken,
}

/// Most certificates other than lane 0's that the lanes of one session may join with. Each is
/// another certificate of the same identity (a renewal gives one), so a correct subscriber
/// shows a handful at most; the list is bounded so that rejoining lanes cannot grow it.
pub const MAX_LANE_CERTIFICATES: usize = 16;

impl SessionHandle {
    /// Notes the serial of the certificate a lane joins with, so that revoking it ends the
    /// session. `false` when it is a new one and the session already holds
    /// [`MAX_LANE_CERTIFICATES`]: the lane is refused.
    pub fn add_lane_serial(&self, serial: &[u8]) -> bool {
        if serial == self.client.serial.as_slice() {
            return true;
        }
        let mut serials = self.lane_serials.lock().unwrap_or_else(|e| e.into_inner());
        if serials.iter().any(|s| s.as_slice() == serial) {
            return true;
        }
        if serials.len() >= MAX_LANE_CERTIFICATES {
            return false;
        }
        serials.push(serial.to_vec());
        true
    }

    /// Whether lane 0's certificate or any lane's is revoked according to `revoked`.
    pub fn any_revoked(&self, revoked: impl Fn(&[u8]) -> bool) -> bool {
        revoked(&self.client.serial)
            || self
                .lane_serials
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .any(|s| revoked(s))
    }

    /// Ends the session for `reason` (the first reason given wins).
    pub fn end(&self, reason: CloseReason) {
        let mut c = self.close.lock().unwrap_or_else(|e| e.into_inner());
        if c.is_none() {
            *c = Some(reason);
        }
        self.cancel.cancel();
    }

    /// The reason given to [`SessionHandle::end`], if any.
    pub fn end_reason(&self) -> Option<CloseReason> {
        self.close.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// How often each lane's round trip is read from its connection and given to the sender.
const LANE_REPORT_EVERY: Duration = Duration::from_millis(50);

/// How often an idle session (nothing queued, nothing in flight) reads its lanes: the per-lane
/// metrics stay current to within this, and the first report after work resumes refreshes the
/// round trips. Idle reports fall on the multiples of this on [`clock_origin`]'s clock, with
/// every other idle session's and a heartbeat.
const LANE_REPORT_IDLE: Duration = Duration::from_secs(1);

/// The clock every session of the process counts from, so that their heartbeats and idle lane
/// reports fall on the same instants: a relay with many idle sessions wakes once per heartbeat
/// interval for all of them, and their acknowledgements come back together.
fn clock_origin() -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

/// Reads frames from a control stream into `tx` until it ends or fails; the last message says
/// how it ended.
pub async fn read_control(mut reader: FrameReader, tx: mpsc::Sender<Result<Frame, ControlError>>) {
    loop {
        let r = match reader.next().await {
            Ok(Some(f)) => Ok(f),
            Ok(None) => Err(ControlError::Ended),
            Err(e) if e.is_protocol_violation() => Err(ControlError::BadFrame(format!("{e:#}"))),
            Err(e) => Err(ControlError::Failed(format!("{e:#}"))),
        };
        let last = r.is_err();
        if tx.send(r).await.is_err() || last {
            return;
        }
    }
}

/// One lane's connection and, for lanes 1.., its control stream (kept open so the peer's
/// stays up).
struct Lane {
    conn: Connection,
    _control: Option<(FrameWriter, FrameReader)>,
    /// What the per-lane metrics have been given of this connection so far.
    seen: Seen,
}

/// A lane's running totals as last added to the metrics.
#[derive(Debug, Default, Clone, Copy)]
struct Seen {
    bytes: u64,
    packets: u64,
    lost: u64,
    delivered: u64,
    busy_us: u64,
}

/// What a stream task reports when its stream has ended.
struct Done {
    stream: StreamId,
    delivered: bool,
    /// Payload bytes of a chunk (0 for an end record), for the metrics.
    payload: u64,
}

/// Everything a session task owns.
pub struct Session {
    cfg: SessionConfig,
    shared: Shared,
    handle: SessionHandle,
    lanes: Vec<Option<Lane>>,
    control: FrameWriter,
    sender: Sender,
    epoch: Instant,
    live: Option<broadcast::Receiver<Item>>,
    /// The streams in flight, each resolving once its peer acknowledged all of it or it
    /// failed. Polled by the session's own task: no task and no channel per chunk.
    sending: FuturesUnordered<BoxFuture<'static, Done>>,
    loaded_tx: mpsc::UnboundedSender<(u32, LoadResult)>,
    /// The end of each lane's connection, polled only when one ends: (lane, the connection's
    /// `stable_id`, why). A replaced lane's old connection ends here too, and is told apart by
    /// its id.
    ended: FuturesUnordered<BoxFuture<'static, (usize, usize, ConnectionError)>>,
    /// Reads below the ring, with a backfill lake.
    lake: Option<Arc<SessionLake>>,
    /// What was last published to the metrics.
    info: Option<SessionInfo>,
    stats: SenderStats,
}

impl Session {
    /// Runs a session whose lane 0 is `conn` with control stream (`send`, `recv`), after
    /// `SessionOpen` was read and the start resolved to `first`; returns why it ended.
    #[allow(clippy::too_many_arguments)]
    pub async fn run(
        cfg: SessionConfig,
        shared: Shared,
        handle: SessionHandle,
        conn: Connection,
        send: FrameWriter,
        recv: FrameReader,
        first: u32,
        mut lanes_rx: mpsc::Receiver<LaneRequest>,
    ) -> CloseReason {
        let (oldest, newest) = held_range(&shared);
        let accept = Frame::SessionAccept(SessionAccept {
            version: PROTOCOL_VERSION,
            session_id: handle.id,
            token: handle.token,
            lanes: handle.lanes,
            first_seq: first,
            oldest,
            newest,
            chunk_size: cfg.chunk_size,
            window: cfg.window,
            heartbeat_ms: cfg.heartbeat.as_millis().min(u128::from(u32::MAX)) as u32,
            max_chunk_raw: cfg.limits.max_chunk_raw,
            max_ledger_raw: cfg.limits.max_ledger_raw,
        });
        let (ctl_tx, mut ctl_rx) = mpsc::channel(64);
        let (loaded_tx, mut loaded_rx) = mpsc::unbounded_channel();
        let mut sender_cfg = SenderConfig::new(first, handle.lanes);
        sender_cfg.window = cfg.window;
        sender_cfg.chunk_size = cfg.chunk_size;
        sender_cfg.lane_budget = cfg.lane_budget;
        sender_cfg.streams_per_lane = cfg.streams_per_lane;
        sender_cfg.heartbeat = cfg.heartbeat;
        let mut lanes: Vec<Option<Lane>> = (0..handle.lanes).map(|_| None).collect();
        lanes[0] = Some(Lane {
            conn: conn.clone(),
            _control: None,
            seen: Seen::default(),
        });
        let epoch = clock_origin();
        let ended = FuturesUnordered::new();
        ended.push(lane_end(0, conn.clone()));
        let mut s = Session {
            sender: Sender::new(sender_cfg, epoch.elapsed()),
            epoch,
            live: None,
            sending: FuturesUnordered::new(),
            loaded_tx,
            ended,
            lake: SessionLake::new(&shared, &handle.client.name, cfg.window),
            info: None,
            stats: SenderStats::default(),
            control: send,
            lanes,
            cfg,
            shared,
            handle,
        };
        let reason = match s.write_control(&accept).await {
            Ok(()) => {
                tokio::spawn(read_control(recv, ctl_tx));
                s.main(&mut ctl_rx, &mut lanes_rx, &mut loaded_rx).await
            }
            Err(WriteError::Cancelled) => s.cancelled_reason(),
            Err(WriteError::Failed(e)) => CloseReason::PeerGone {
                detail: format!("writing session-accept: {e}"),
            },
        };
        s.finish(&reason).await;
        reason
    }

    fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    /// Why the session was cancelled from outside (revocation, shutdown).
    fn cancelled_reason(&self) -> CloseReason {
        self.handle
            .end_reason()
            .unwrap_or(CloseReason::ShuttingDown)
    }

    /// Writes a frame on lane 0's control stream (see [`write_control`]).
    async fn write_control(&mut self, frame: &Frame) -> Result<(), WriteError> {
        write_control(
            &mut self.control,
            frame,
            self.cfg.heartbeat,
            &self.handle.cancel,
        )
        .await
    }

    async fn main(
        &mut self,
        ctl_rx: &mut mpsc::Receiver<Result<Frame, ControlError>>,
        lanes_rx: &mut mpsc::Receiver<LaneRequest>,
        loaded_rx: &mut mpsc::UnboundedReceiver<(u32, LoadResult)>,
    ) -> CloseReason {
        let cancel = self.handle.cancel.clone();
        // Both timers live across iterations and are reset only when their deadline moves: a
        // session goes round this loop for every chunk it sends and every one acknowledged.
        let report = tokio::time::sleep(LANE_REPORT_EVERY);
        tokio::pin!(report);
        let timer = tokio::time::sleep(Duration::ZERO);
        tokio::pin!(timer);
        let mut timer_at = None;
        self.sender.handle_timeout(self.now());
        loop {
            if let Some(reason) = self.carry_out().await {
                return reason;
            }
            self.publish_metrics();
            let want = self
                .sender
                .poll_timeout()
                .map(|t| tokio::time::Instant::from_std(self.epoch + t));
            if want != timer_at {
                if let Some(at) = want {
                    timer.as_mut().reset(at);
                }
                timer_at = want;
            }
            let wants_live = self.live.is_some() && self.sender.wants_live();
            tokio::select! {
                biased;
                _ = cancel.cancelled() => {
                    let reason = self.cancelled_reason();
                    self.sender.handle_close(reason);
                }
                Some((lane, id, err)) = self.ended.next(), if !self.ended.is_empty() => {
                    let current = self.lanes[lane]
                        .as_ref()
                        .is_some_and(|l| l.conn.stable_id() == id);
                    if !current {
                        continue;
                    }
                    if lane != 0 {
                        info!(session = self.handle.id, lane, error = %err, "lane lost");
                        self.shared.metrics.lanes_open.fetch_sub(1, Ordering::Relaxed);
                        self.lanes[lane] = None;
                    }
                    let now = self.now();
                    self.sender.handle_lane_down(lane as u8, &err.to_string(), now);
                }
                frame = ctl_rx.recv() => {
                    let now = self.now();
                    match frame {
                        Some(Ok(f)) => self.sender.handle_frame(f, now),
                        Some(Err(e)) => self.sender.handle_control_error(e),
                        None => self.sender.handle_control_error(ControlError::Ended),
                    }
                }
                Some(req) = lanes_rx.recv() => self.add_lane(req).await,
                Some(done) = self.sending.next(), if !self.sending.is_empty() => {
                    if done.delivered && done.payload > 0 {
                        Metrics::add(&self.shared.metrics.chunks_out_total, 1);
                        Metrics::add(&self.shared.metrics.bytes_out_total, done.payload);
                    }
                    let now = self.now();
                    self.sender.handle_stream_done(done.stream, done.delivered, now);
                }
                Some((seq, result)) = loaded_rx.recv() => {
                    let now = self.now();
                    self.sender.handle_loaded(seq, result, now);
                }
                item = recv_live(&mut self.live), if wants_live => {
                    let item = match item {
                        Ok(Item::Chunk(c)) => LiveItem::Chunk(c),
                        Ok(Item::End(l)) => LiveItem::End(l),
                        Ok(Item::Abort(seq)) => LiveItem::Abort(seq),
                        Err(broadcast::error::RecvError::Lagged(n)) => {
                            debug!(session = self.handle.id, skipped = n, "fell behind the live stream");
                            LiveItem::Lagged
                        }
                        Err(broadcast::error::RecvError::Closed) => LiveItem::Closed,
                    };
                    self.sender.handle_live(item);
                }
                () = &mut report => {
                    self.report_lanes();
                    // Everything the lanes did is in the report just made: an idle session
                    // needs no fresh round trips, and 20 reports a second of every idle
                    // session were most of a relay's CPU at the tip.
                    let idle = self.sender.queued() == 0
                        && self.sender.lanes(self.now()).iter().all(|l| l.outstanding == 0);
                    let next = if idle {
                        let at = next_tick(self.now(), LANE_REPORT_IDLE);
                        tokio::time::Instant::from_std(self.epoch + at)
                    } else {
                        tokio::time::Instant::now() + LANE_REPORT_EVERY
                    };
                    report.as_mut().reset(next);
                }
                () = &mut timer, if timer_at.is_some() => {
                    timer_at = None;
                    let now = self.now();
                    self.sender.handle_timeout(now);
                }
            }
        }
    }

    /// Carries out what the sender asks until it asks nothing more; returns the reason once it
    /// closes.
    async fn carry_out(&mut self) -> Option<CloseReason> {
        loop {
            let mut busy = false;
            while let Some(event) = self.sender.poll_event() {
                busy = true;
                match event {
                    Event::Load(seq) => {
                        let (shared, tx) = (self.shared.clone(), self.loaded_tx.clone());
                        let lake = self.lake.clone();
                        tokio::spawn(async move {
                            let r = load(&shared, lake.as_deref(), seq).await;
                            let _ = tx.send((seq, r));
                        });
                    }
                    Event::JoinLive => {
                        let join = self.shared.hub.join();
                        // Read after joining: a ledger completed meanwhile is in memory.
                        let newest = self.shared.hub.tip().newest;
                        let current = join.current.map(|c| (c.seq, c.chunks));
                        self.live = Some(join.rx);
                        self.sender.handle_joined(current, newest);
                    }
                    Event::LeaveLive => self.live = None,
                    Event::Heartbeat => {
                        let (oldest, newest) = held_range(&self.shared);
                        let hb = Frame::Heartbeat(Heartbeat {
                            newest,
                            oldest,
                            time_ns: crate::source::now_ns(),
                        });
                        match self.write_control(&hb).await {
                            Ok(()) => {}
                            Err(WriteError::Cancelled) => {
                                let reason = self.cancelled_reason();
                                self.sender.handle_close(reason);
                            }
                            Err(WriteError::Failed(e)) => {
                                self.sender.handle_control_error(ControlError::Failed(e));
                            }
                        }
                    }
                    Event::Close(reason) => return Some(reason),
                }
            }
            let now = self.now();
            while let Some(t) = self.sender.poll_transmit(now) {
                busy = true;
                let Some(Some(lane)) = self.lanes.get(usize::from(t.lane)) else {
                    // The sender only picks lanes it was told are up; report it lost.
                    let done = Done {
                        stream: t.stream,
                        delivered: false,
                        payload: 0,
                    };
                    self.sending.push(Box::pin(std::future::ready(done)));
                    continue;
                };
                self.sending
                    .push(Box::pin(send_unit(lane.conn.clone(), t.stream, t.unit)));
            }
            if !busy {
                return None;
            }
        }
    }

    /// Gives the sender each lane's round trip, and adds what each lane did since the last
    /// report to the per-lane metrics.
    fn report_lanes(&mut self) {
        let now = self.now();
        let info = self.sender.lanes(now);
        let mut agg = self
            .shared
            .metrics
            .lanes
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        for (i, l) in self.lanes.iter_mut().enumerate() {
            let Some(l) = l else { continue };
            let st = l.conn.stats();
            self.sender.handle_lane_report(i as u8, lane_report(&st));
            let now_seen = Seen {
                bytes: st.udp_tx.bytes,
                packets: st.udp_tx.datagrams,
                lost: st.path.lost_packets,
                delivered: info.get(i).map_or(0, |x| x.delivered),
                busy_us: info.get(i).map_or(0, |x| x.busy.as_micros() as u64),
            };
            let m = agg.entry(i as u8).or_default();
            m.bytes_sent += now_seen.bytes.saturating_sub(l.seen.bytes);
            m.packets_sent += now_seen.packets.saturating_sub(l.seen.packets);
            m.lost_packets += now_seen.lost.saturating_sub(l.seen.lost);
            m.delivered_bytes += now_seen.delivered.saturating_sub(l.seen.delivered);
            m.busy_us += now_seen.busy_us.saturating_sub(l.seen.busy_us);
            m.rtt_us = st.path.rtt.as_micros() as u64;
            m.cwnd_bytes = st.path.cwnd;
            m.mtu_bytes = u64::from(st.path.current_mtu);
            l.seen = now_seen;
        }
    }

    async fn add_lane(&mut self, mut req: LaneRequest) {
        let lane = usize::from(req.lane);
        if lane == 0 || lane >= self.lanes.len() {
            return;
        }
        let ack = Frame::LaneAccept(req.lane);
        let written =
            write_control(&mut req.send, &ack, self.cfg.heartbeat, &self.handle.cancel).await;
        if let Err(e) = written {
            let reason = match e {
                WriteError::Cancelled => self.cancelled_reason(),
                WriteError::Failed(detail) => CloseReason::PeerGone { detail },
            };
            debug!(session = self.handle.id, lane, %reason, "lane not joined");
            // Not a lane of the session yet, so its end does not close it: the accept loop's
            // task (and the connection's slot) would wait for the peer to close it.
            close_plain(&req.conn, &reason);
            return;
        }
        if let Some(old) = self.lanes[lane].take() {
            close_plain(&old.conn, &CloseReason::LaneReplaced);
        } else {
            Metrics::add(&self.shared.metrics.lanes_open, 1);
        }
        info!(session = self.handle.id, lane, "lane joined");
        let report = lane_report(&req.conn.stats());
        self.ended.push(lane_end(lane, req.conn.clone()));
        self.lanes[lane] = Some(Lane {
            conn: req.conn,
            _control: Some((req.send, req.recv)),
            seen: Seen::default(),
        });
        let now = self.now();
        self.sender.handle_lane_up(req.lane, now);
        self.sender.handle_lane_report(req.lane, report);
    }

    /// Publishes the session's state and the sender's counters to the metrics.
    fn publish_metrics(&mut self) {
        let (lanes, acked, catching_up) = (
            u32::from(self.sender.lanes_up()),
            self.sender.acked(),
            self.sender.catching_up(),
        );
        let same = self
            .info
            .as_ref()
            .is_some_and(|i| (i.lanes, i.acked, i.catching_up) == (lanes, acked, catching_up));
        if !same {
            let info = SessionInfo {
                identity: self.handle.client.name.clone(),
                lanes,
                acked,
                catching_up,
            };
            self.shared
                .metrics
                .sessions
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(self.handle.id, info.clone());
            self.info = Some(info);
        }
        let st = self.sender.stats();
        let m = &self.shared.metrics;
        Metrics::add(&m.ledgers_out_total, st.ledgers - self.stats.ledgers);
        Metrics::add(
            &m.resent_chunks_total,
            (st.retried + st.resent) - (self.stats.retried + self.stats.resent),
        );
        Metrics::add(&m.lagged_total, st.lagged - self.stats.lagged);
        self.stats = st;
    }

    async fn finish(&mut self, reason: &CloseReason) {
        self.report_lanes();
        self.publish_metrics();
        if reason.is_violation() {
            Metrics::add(&self.shared.metrics.protocol_errors_total, 1);
        }
        // A below-retention end tells the bounds as they are now, not as they were when the
        // session found it could not go on.
        let reason = match reason {
            CloseReason::BelowRetention { seq, lake, .. } => {
                let (oldest, newest) = held_range(&self.shared);
                CloseReason::BelowRetention {
                    seq: *seq,
                    oldest,
                    newest,
                    lake: *lake,
                }
            }
            other => other.clone(),
        };
        // Lanes 1.. first (no frame: lane 0's control stream carries the reason).
        for lane in self.lanes.iter().skip(1).flatten() {
            close_plain(&lane.conn, &reason);
        }
        if let Some(lane0) = &self.lanes[0] {
            let conn = lane0.conn.clone();
            close_for(&conn, self.control.stream_mut(), &reason).await;
        }
        let lanes_up = self.lanes.iter().skip(1).filter(|l| l.is_some()).count() as u64;
        let lane0 = u64::from(self.lanes[0].is_some());
        self.shared
            .metrics
            .lanes_open
            .fetch_sub(lanes_up + lane0, Ordering::Relaxed);
        self.shared
            .metrics
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.handle.id);
    }
}

async fn recv_live(
    live: &mut Option<broadcast::Receiver<Item>>,
) -> Result<Item, broadcast::error::RecvError> {
    match live {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// Why a control write did not complete.
enum WriteError {
    /// The session was cancelled (revocation, shutdown) meanwhile.
    Cancelled,
    /// The stream failed, or the peer gave no credit before the deadline.
    Failed(String),
}

/// Writes a control frame, racing the session's cancellation and a deadline of four heartbeat
/// intervals (at least a second): a peer that withholds flow-control credit holds neither a
/// session that must end (revoked, shutting down) nor, past the deadline, one that goes on.
async fn write_control(
    w: &mut FrameWriter,
    frame: &Frame,
    heartbeat: Duration,
    cancel: &CancellationToken,
) -> Result<(), WriteError> {
    let limit = (heartbeat * 4).max(Duration::from_secs(1));
    tokio::select! {
        biased;
        _ = cancel.cancelled() => Err(WriteError::Cancelled),
        r = tokio::time::timeout(limit, w.write(frame)) => match r {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(WriteError::Failed(format!("control stream: {e:#}"))),
            Err(_) => Err(WriteError::Failed(format!(
                "control stream blocked for {} ms",
                limit.as_millis()
            ))),
        },
    }
}

/// Resolves when `conn` ends, with `lane`, the connection's id and why.
fn lane_end(lane: usize, conn: Connection) -> BoxFuture<'static, (usize, usize, ConnectionError)> {
    Box::pin(async move {
        let why = conn.closed().await;
        (lane, conn.stable_id(), why)
    })
}

/// Sends `unit` on its own unidirectional stream of `conn`, waits until the peer has
/// acknowledged all of it, and says how it went.
async fn send_unit(conn: Connection, stream: StreamId, unit: Unit) -> Done {
    let payload = match &unit {
        Unit::Chunk(c) => c.payload.len() as u64,
        Unit::End(_) => 0,
    };
    let delivered = send_stream(&conn, unit).await.is_ok();
    Done {
        stream,
        delivered,
        payload,
    }
}

async fn send_stream(conn: &Connection, unit: Unit) -> Result<(), String> {
    let mut s = conn.open_uni().await.map_err(|e| e.to_string())?;
    match unit {
        Unit::Chunk(c) => {
            let prefix = Bytes::copy_from_slice(&c.header.frame_prefix(c.payload.len()));
            s.write_all_chunks(&mut [prefix, c.payload])
                .await
                .map_err(|e| e.to_string())?;
        }
        Unit::End(end) => s
            .write_chunk(Bytes::from(Frame::LedgerEnd(end).to_vec()))
            .await
            .map_err(|e| e.to_string())?,
    }
    s.finish().map_err(|e| e.to_string())?;
    match s.stopped().await {
        Ok(None) => Ok(()),
        Ok(Some(code)) => Err(format!("stream stopped by peer: {code}")),
        Err(e) => Err(e.to_string()),
    }
}

/// What the sender is told of a lane's path: quinn's smoothed and smallest round trips.
fn lane_report(st: &quinn::ConnectionStats) -> LaneReport {
    LaneReport {
        rtt: st.path.rtt,
        min_rtt: st.path.min_rtt,
    }
}
