//! One subscriber's session: its lanes, the chunk scheduler across them, the replay from the
//! ring and the switch to live, the window, resends and heartbeats.
//!
//! A session sends every ledger from its start on, in order, each chunk on its own QUIC stream
//! on the lane with the least outstanding bytes per unit of measured rate. It keeps at most
//! `window` ledgers unacknowledged. In live mode it reads the hub's broadcast channel; when it
//! falls behind by more than the channel holds (a slow subscriber), it switches to reading
//! complete ledgers from memory or the ring at its own pace, and back to live when it catches
//! up. A chunk whose lane dies before the subscriber acknowledged its stream is sent again on
//! another lane.
//!
//! With `--streams-per-lane N`, each lane has N stream permits: a stream holds one from its
//! opening until the subscriber has acknowledged all of it, and the items dispatched to the
//! lane wait for a permit in dispatch order (in the lane's gate, counted in its outstanding
//! bytes, so striping sees them). Without it every dispatched item opens its stream at once,
//! bounded only by the session's byte budget.

use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ledger_relay_transport::{close_with_error, FrameReader, FrameWriter};
use ledger_relay_wire::frame::{
    ErrorCode, ErrorFrame, Frame, Heartbeat, LedgerEnd, Resend, SessionAccept, Start, TOKEN_LEN,
};
use ledger_relay_wire::{Limits, PROTOCOL_VERSION};
use quinn::Connection;
use tokio::sync::{broadcast, mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::auth::ClientId;
use crate::hub::{ChunkItem, CompleteLedger, Hub, Item};
use crate::metrics::{Metrics, SessionInfo};
use crate::ring::{Ring, RingError};

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
    /// How long a session waits for its first ledger (start above the tip) before giving up;
    /// `None` waits until shutdown.
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
    /// 0's (same name, another certificate): revoking any of them ends the session.
    pub lane_serials: Arc<Mutex<Vec<Vec<u8>>>>,
    /// Lanes granted.
    pub lanes: u8,
    /// Where lane joins go.
    pub lanes_tx: mpsc::Sender<LaneRequest>,
    /// Ends the session; the code says why.
    pub close: Arc<Mutex<Option<(ErrorCode, String)>>>,
    /// Cancelled to end the session.
    pub cancel: CancellationToken,
}

impl SessionHandle {
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

    /// Ends the session with `code`.
    pub fn end(&self, code: ErrorCode, message: impl Into<String>) {
        let mut c = self.close.lock().unwrap_or_else(|e| e.into_inner());
        if c.is_none() {
            *c = Some((code, message.into()));
        }
        self.cancel.cancel();
    }
}

/// How a session ended.
#[derive(Debug)]
pub struct SessionEnd {
    /// The code sent to the subscriber (if any).
    pub code: Option<ErrorCode>,
    /// Why.
    pub reason: String,
}

/// A unit the scheduler puts on one stream.
#[derive(Debug, Clone)]
enum SendItem {
    Chunk(Arc<ChunkItem>),
    End(Bytes),
}

impl SendItem {
    /// (sequence, chunk index), with `u32::MAX` standing for the end record.
    fn key(&self) -> (u32, u32) {
        match self {
            SendItem::Chunk(c) => (c.header.seq, c.header.index),
            SendItem::End(b) => (end_seq(b), u32::MAX),
        }
    }

    fn len(&self) -> u64 {
        match self {
            SendItem::Chunk(c) => c.wire_len() as u64,
            SendItem::End(b) => b.len() as u64,
        }
    }
}

fn end_bytes(end: &LedgerEnd) -> Bytes {
    Bytes::from(Frame::LedgerEnd(*end).to_vec())
}

/// The sequence of an encoded end record (its first body field).
fn end_seq(b: &Bytes) -> u32 {
    b.get(5..9)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u32::from_be_bytes)
}

/// Items dispatched to a lane and not yet acknowledged or failed.
type InFlight = Arc<Mutex<HashSet<(u32, u32)>>>;

/// Measured delivery of one lane.
#[derive(Debug)]
struct LaneStats {
    outstanding: AtomicU64,
    acked: AtomicU64,
    /// Time the lane has had bytes outstanding: the rate is measured over it.
    busy: Mutex<BusyClock>,
}

/// Accumulated time with bytes outstanding on a lane.
#[derive(Debug, Default)]
struct BusyClock {
    total: Duration,
    since: Option<Instant>,
}

impl LaneStats {
    fn new() -> LaneStats {
        LaneStats {
            outstanding: AtomicU64::new(0),
            acked: AtomicU64::new(0),
            busy: Mutex::new(BusyClock::default()),
        }
    }

    /// Adds `n` outstanding bytes.
    fn add(&self, n: u64) {
        self.outstanding.fetch_add(n, Ordering::Relaxed);
        self.sync_busy(Instant::now());
    }

    /// Takes `n` outstanding bytes away (sent, or failed).
    fn remove(&self, n: u64) {
        self.outstanding.fetch_sub(n, Ordering::Relaxed);
        self.sync_busy(Instant::now());
    }

    /// Starts or stops the busy clock after a change of the outstanding bytes. The check of
    /// the counter is under the clock's lock, so the last change decides, whatever the order
    /// in which concurrent changes reach the lock.
    fn sync_busy(&self, now: Instant) {
        let mut b = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        let busy = self.outstanding.load(Ordering::Relaxed) > 0;
        match (busy, b.since) {
            (true, None) => b.since = Some(now),
            (false, Some(since)) => {
                b.total += now.saturating_duration_since(since);
                b.since = None;
            }
            _ => {}
        }
    }

    /// Busy time up to `now`.
    fn busy_until(&self, now: Instant) -> Duration {
        let b = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        b.total
            + b.since
                .map_or(Duration::ZERO, |s| now.saturating_duration_since(s))
    }
}

struct Lane {
    conn: Connection,
    stats: Arc<LaneStats>,
    /// Bytes per second, exponentially averaged over intervals with data in flight: bytes
    /// acknowledged over the time the lane had bytes outstanding, not over wall time, so a
    /// lane that was given less to send does not look slower (which would give it still less:
    /// striping would collapse onto fewer lanes).
    rate: f64,
    acked_seen: u64,
    busy_seen: Duration,
    /// With a streams-per-lane limit: where dispatched items wait for a stream permit (see
    /// [`gate`]); unbounded, as each item holds its bytes of the session's budget. Dropping the
    /// lane drops the sender, and the gate fails what still waits.
    gate: Option<mpsc::UnboundedSender<Outgoing>>,
    /// Kept open so the peer's control stream stays up.
    _control: Option<(FrameWriter, FrameReader)>,
}

/// One item dispatched to a lane, with everything its stream's task accounts for when it ends.
struct Outgoing {
    item: SendItem,
    size: u64,
    /// The session's byte budget it holds until it ends.
    budget: OwnedSemaphorePermit,
    stats: Arc<LaneStats>,
    retry: mpsc::UnboundedSender<SendItem>,
    metrics: Arc<Metrics>,
    in_flight: InFlight,
}

impl Outgoing {
    /// Sends the item on its own stream of `conn`, holding `stream` (a lane's stream permit, if
    /// the lane has a limit) until the stream has ended.
    async fn run(self, conn: Connection, stream: Option<OwnedSemaphorePermit>) {
        let r = send_stream(&conn, &self.item).await;
        drop(stream);
        self.done(r.is_ok());
    }

    /// Releases what the item held; a failed item goes back to the session to be sent again
    /// (the lane died under it, or before it was opened).
    fn done(self, sent: bool) {
        self.stats.remove(self.size);
        self.in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.item.key());
        drop(self.budget);
        if sent {
            self.stats.acked.fetch_add(self.size, Ordering::Relaxed);
            if let SendItem::Chunk(c) = &self.item {
                Metrics::add(&self.metrics.chunks_out_total, 1);
                Metrics::add(&self.metrics.bytes_out_total, c.payload.len() as u64);
            }
        } else {
            let _ = self.retry.send(self.item);
        }
    }
}

/// A lane's stream limit: starts the items of `rx` in the order they came, each once one of
/// `streams`' permits is free (the permit goes with it to `start`). Once `closed` resolves (the
/// lane's connection is gone), every item still waiting and every later one goes to `fail`, so
/// a dead lane never holds items back. Returns when `rx`'s senders are gone and it is empty.
async fn gate<T>(
    mut rx: mpsc::UnboundedReceiver<T>,
    streams: Arc<Semaphore>,
    closed: impl Future<Output = ()>,
    mut start: impl FnMut(T, OwnedSemaphorePermit),
    mut fail: impl FnMut(T),
) {
    let mut closed = std::pin::pin!(closed);
    let mut is_closed = false;
    while let Some(t) = rx.recv().await {
        let permit = if is_closed {
            None
        } else {
            tokio::select! {
                biased;
                () = &mut closed => {
                    is_closed = true;
                    None
                }
                p = streams.clone().acquire_owned() => p.ok(),
            }
        };
        match permit {
            Some(p) => start(t, p),
            None => fail(t),
        }
    }
}

/// How long an ending session waits for its `Error` frame to be acknowledged.
pub const CLOSE_LINGER: Duration = Duration::from_millis(500);

/// Starting rate estimate for a new lane: every lane starts equal and measurement takes over
/// within a few ticks.
const INITIAL_RATE: f64 = 100e6;
const RATE_TICK: Duration = Duration::from_millis(50);
/// Least busy time a rate sample is taken over.
const MIN_RATE_SAMPLE: Duration = Duration::from_millis(2);

/// How long a session that cannot load its next ledger keeps going so that the subscriber
/// receives the ledgers already sent before it (see `Session::ending`).
const DRAIN_LIMIT: Duration = Duration::from_secs(5);

impl Lane {
    /// A lane on `conn`; with `streams` (`--streams-per-lane`), its gate task starts too.
    fn new(
        conn: Connection,
        control: Option<(FrameWriter, FrameReader)>,
        streams: Option<u32>,
    ) -> Lane {
        let gate = streams.map(|n| {
            let (tx, rx) = mpsc::unbounded_channel::<Outgoing>();
            let permits = Arc::new(Semaphore::new(n as usize));
            let closed = {
                let conn = conn.clone();
                async move {
                    conn.closed().await;
                }
            };
            let opener = conn.clone();
            tokio::spawn(gate(
                rx,
                permits,
                closed,
                move |out, permit| {
                    tokio::spawn(out.run(opener.clone(), Some(permit)));
                },
                |out| out.done(false),
            ));
            tx
        });
        Lane {
            conn,
            stats: Arc::new(LaneStats::new()),
            rate: INITIAL_RATE,
            acked_seen: 0,
            busy_seen: Duration::ZERO,
            gate,
            _control: control,
        }
    }

    /// Expected time until `extra` more bytes would be delivered on this lane.
    fn score(&self, extra: u64) -> f64 {
        (self.stats.outstanding.load(Ordering::Relaxed) + extra) as f64 / self.rate
    }

    fn tick(&mut self, now: Instant) {
        let acked = self.stats.acked.load(Ordering::Relaxed);
        let busy = self.stats.busy_until(now);
        let (delta, busy_dt) = (acked - self.acked_seen, busy.saturating_sub(self.busy_seen));
        // Too little busy time says nothing of the rate: keep accumulating.
        if delta == 0 || busy_dt < MIN_RATE_SAMPLE {
            return;
        }
        self.acked_seen = acked;
        self.busy_seen = busy;
        let sample = delta as f64 / busy_dt.as_secs_f64();
        self.rate = 0.7 * self.rate + 0.3 * sample;
    }
}

/// Where the session reads the ledgers it sends.
enum Mode {
    /// Reading complete ledgers from memory or the ring.
    CatchUp,
    /// Reading the hub's broadcast channel.
    Live(broadcast::Receiver<Item>),
}

/// Shared relay state a session reads.
#[derive(Clone)]
pub struct Shared {
    /// Live state.
    pub hub: Arc<Hub>,
    /// The ring, if the relay keeps one.
    pub ring: Option<Arc<Ring>>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
}

/// Oldest and newest ledger the relay can serve now.
pub fn held_range(shared: &Shared) -> (u32, u32) {
    let tip = shared.hub.tip();
    let ring = shared.ring.as_ref().and_then(|r| r.range());
    let oldest = match (ring.map(|r| r.0), shared.hub.oldest_recent()) {
        (Some(a), Some(b)) => a.min(b),
        (Some(a), None) | (None, Some(a)) => a,
        (None, None) => 0,
    };
    let newest = tip.newest.max(ring.map_or(0, |r| r.1));
    (oldest, newest)
}

/// Decides the first ledger to send for `start`, waiting for the tip if the relay holds
/// nothing yet. `Err` carries the error frame to send.
pub async fn resolve_start(
    shared: &Shared,
    start: Start,
    cancel: &CancellationToken,
    wait: Option<Duration>,
) -> Result<u32, ErrorFrame> {
    match start {
        Start::Seq(seq) => {
            let (oldest, newest) = held_range(shared);
            if oldest != 0 && seq < oldest {
                return Err(ErrorFrame {
                    code: ErrorCode::BelowRetention,
                    oldest,
                    newest,
                    message: format!("start {seq} is below the oldest ledger held, {oldest}"),
                });
            }
            if oldest == 0 && newest != 0 && seq <= newest {
                // Nothing retained (no ring) but the relay has moved past the start.
                return Err(ErrorFrame {
                    code: ErrorCode::BelowRetention,
                    oldest: newest,
                    newest,
                    message: format!("start {seq} is not retained; newest is {newest}"),
                });
            }
            Ok(seq)
        }
        Start::Tip => {
            let mut tip = shared.hub.watch_tip();
            let deadline = wait.map(|w| tokio::time::Instant::now() + w);
            loop {
                let t = *tip.borrow_and_update();
                if t.newest != 0 {
                    return Ok(t.newest);
                }
                if t.current != 0 {
                    return Ok(t.current);
                }
                if let Some((_, newest)) = shared.ring.as_ref().and_then(|r| r.range()) {
                    return Ok(newest);
                }
                tokio::select! {
                    r = tip.changed() => if r.is_err() {
                        return Err(shutting_down());
                    },
                    _ = cancel.cancelled() => return Err(shutting_down()),
                    _ = async {
                        match deadline {
                            Some(d) => tokio::time::sleep_until(d).await,
                            None => std::future::pending().await,
                        }
                    } => return Err(ErrorFrame {
                        code: ErrorCode::Overloaded,
                        oldest: 0,
                        newest: 0,
                        message: "the relay has no ledger yet".into(),
                    }),
                }
            }
        }
    }
}

fn shutting_down() -> ErrorFrame {
    ErrorFrame {
        code: ErrorCode::ShuttingDown,
        oldest: 0,
        newest: 0,
        message: "relay shutting down".into(),
    }
}

/// Reads frames from a control stream into `tx` until it ends or fails; the reason it ended
/// is sent last, as `Err`, starting with "protocol violation" when the peer broke the protocol.
pub async fn read_control(mut reader: FrameReader, tx: mpsc::Sender<Result<Frame, String>>) {
    loop {
        let r = match reader.next().await {
            Ok(Some(f)) => Ok(f),
            Ok(None) => Err("control stream ended".to_string()),
            Err(e) if e.is_protocol_violation() => Err(format!("protocol violation: {e:#}")),
            Err(e) => Err(format!("control stream: {e:#}")),
        };
        let last = r.is_err();
        if tx.send(r).await.is_err() || last {
            return;
        }
    }
}

/// Everything a session task owns.
pub struct Session {
    cfg: SessionConfig,
    shared: Shared,
    handle: SessionHandle,
    lanes: Vec<Option<Lane>>,
    control: FrameWriter,
    /// Newest ledger the subscriber acknowledged.
    acked: u32,
    /// Next ledger to send.
    next: u32,
    /// Chunk indices of ledger `next` already sent (live mode, or before a lag).
    sent: HashSet<u32>,
    mode: Mode,
    /// Items waiting for a lane: resends first, then ledgers in order.
    urgent: VecDeque<SendItem>,
    queue: VecDeque<SendItem>,
    budget: Arc<Semaphore>,
    retry_tx: mpsc::UnboundedSender<SendItem>,
    retry_rx: mpsc::UnboundedReceiver<SendItem>,
    rr: usize,
    in_flight: InFlight,
    /// Why the session must end, set when ledger `next` could not be loaded (not held any more,
    /// or corrupt in the ring), and since when. It ends once the subscriber has acknowledged
    /// every ledger sent before (or after `DRAIN_LIMIT`): ending at once would cut the ledgers
    /// still in flight, which the next session would send again only to be cut again.
    ending: Option<(SessionEnd, Instant)>,
}

/// Semaphore permits count KiB of wire bytes.
fn kib(n: u64) -> u32 {
    n.div_ceil(1024).min(u64::from(u32::MAX)) as u32
}

impl Session {
    /// Runs a session whose lane 0 is `conn` with control stream (`send`, `recv`), after
    /// `SessionOpen` was read and the start resolved to `first`.
    #[allow(clippy::too_many_arguments)]
    pub async fn run(
        cfg: SessionConfig,
        shared: Shared,
        handle: SessionHandle,
        conn: Connection,
        mut send: FrameWriter,
        recv: FrameReader,
        first: u32,
        mut lanes_rx: mpsc::Receiver<LaneRequest>,
    ) -> SessionEnd {
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
        if let Err(e) = send.write(&accept).await {
            return SessionEnd {
                code: None,
                reason: format!("writing session-accept: {e}"),
            };
        }
        let (ctl_tx, mut ctl_rx) = mpsc::channel(64);
        tokio::spawn(read_control(recv, ctl_tx));
        let (retry_tx, retry_rx) = mpsc::unbounded_channel();
        let budget = Arc::new(Semaphore::new(
            kib(cfg.lane_budget) as usize * usize::from(handle.lanes.max(1)),
        ));
        let mut lanes: Vec<Option<Lane>> = (0..handle.lanes).map(|_| None).collect();
        lanes[0] = Some(Lane::new(conn.clone(), None, cfg.streams_per_lane));
        let mut s = Session {
            acked: first.wrapping_sub(1),
            next: first,
            sent: HashSet::new(),
            mode: Mode::CatchUp,
            urgent: VecDeque::new(),
            queue: VecDeque::new(),
            budget,
            retry_tx,
            retry_rx,
            rr: 0,
            in_flight: Arc::new(Mutex::new(HashSet::new())),
            ending: None,
            control: send,
            lanes,
            cfg,
            shared,
            handle,
        };
        s.publish_info();
        let end = s.main(&conn, &mut ctl_rx, &mut lanes_rx).await;
        s.finish(&end).await;
        end
    }

    fn lanes_up(&self) -> u32 {
        self.lanes.iter().filter(|l| l.is_some()).count() as u32
    }

    fn publish_info(&self) {
        let mut sessions = self
            .shared
            .metrics
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        sessions.insert(
            self.handle.id,
            SessionInfo {
                identity: self.handle.client.name.clone(),
                lanes: self.lanes_up(),
                acked: self.acked,
                catching_up: matches!(self.mode, Mode::CatchUp),
            },
        );
    }

    async fn main(
        &mut self,
        conn: &Connection,
        ctl_rx: &mut mpsc::Receiver<Result<Frame, String>>,
        lanes_rx: &mut mpsc::Receiver<LaneRequest>,
    ) -> SessionEnd {
        let mut heartbeat = tokio::time::interval(self.cfg.heartbeat);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut rate_tick = tokio::time::interval(RATE_TICK);
        let cancel = self.handle.cancel.clone();
        loop {
            if let Err(end) = self.fill().await {
                return end;
            }
            if let Some((_, since)) = &self.ending {
                // Woken by acks and at least every heartbeat.
                if self.acked.wrapping_add(1) == self.next || since.elapsed() >= DRAIN_LIMIT {
                    if let Some((end, _)) = self.ending.take() {
                        return end;
                    }
                }
            }
            // Per lane: some of the lanes may die; their streams fail and come back here.
            let lane_died = futures::future::select_all(
                self.lanes
                    .iter()
                    .enumerate()
                    .filter_map(|(i, l)| l.as_ref().map(|l| (i, l.conn.clone())))
                    .map(|(i, c)| Box::pin(async move { (i, c.closed().await) })),
            );
            let have_item = !self.urgent.is_empty() || !self.queue.is_empty();
            let next_len = self
                .urgent
                .front()
                .or(self.queue.front())
                .map_or(0, |i| i.len());
            let budget = self.budget.clone();
            tokio::select! {
                biased;
                _ = cancel.cancelled() => {
                    let (code, reason) = self
                        .handle
                        .close
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .clone()
                        .unwrap_or((ErrorCode::ShuttingDown, "relay shutting down".into()));
                    return SessionEnd { code: Some(code), reason };
                }
                ((lane, err), _, _) = lane_died => {
                    if lane == 0 {
                        return SessionEnd { code: None, reason: format!("lane 0 closed: {err}") };
                    }
                    info!(session = self.handle.id, lane, error = %err, "lane lost");
                    self.lanes[lane] = None;
                    self.shared.metrics.lanes_open.fetch_sub(1, Ordering::Relaxed);
                    self.publish_info();
                }
                frame = ctl_rx.recv() => match frame {
                    Some(Ok(f)) => if let Err(end) = self.control_frame(f).await { return end; },
                    Some(Err(reason)) => {
                        let code = reason.starts_with("protocol violation").then_some(ErrorCode::ProtocolViolation);
                        if code.is_some() {
                            Metrics::add(&self.shared.metrics.protocol_errors_total, 1);
                        }
                        return SessionEnd { code, reason };
                    }
                    None => return SessionEnd { code: None, reason: "control reader ended".into() },
                },
                Some(req) = lanes_rx.recv() => self.add_lane(req).await,
                Some(item) = self.retry_rx.recv() => {
                    Metrics::add(&self.shared.metrics.resent_chunks_total, 1);
                    self.urgent.push_back(item);
                }
                _ = heartbeat.tick() => {
                    let (oldest, newest) = held_range(&self.shared);
                    let hb = Frame::Heartbeat(Heartbeat { newest, oldest, time_ns: crate::source::now_ns() });
                    if let Err(e) = self.control.write(&hb).await {
                        return SessionEnd { code: None, reason: format!("control stream: {e}") };
                    }
                    let _ = conn;
                }
                _ = rate_tick.tick() => {
                    let now = Instant::now();
                    for lane in self.lanes.iter_mut().flatten() {
                        lane.tick(now);
                    }
                }
                permit = budget.acquire_many_owned(kib(next_len)), if have_item => {
                    let Ok(permit) = permit else { continue };
                    let item = self.urgent.pop_front().or_else(|| self.queue.pop_front());
                    if let Some(item) = item {
                        self.dispatch(item, permit);
                    }
                }
                r = Self::live_recv(&mut self.mode), if self.wants_live() => {
                    if let Err(end) = self.live_item(r) { return end; }
                }
            }
        }
    }

    /// Whether the session should read the next live item now.
    fn wants_live(&self) -> bool {
        matches!(self.mode, Mode::Live(_))
            && self.queue.len() < 256
            && self.window_allows(self.next)
    }

    async fn live_recv(mode: &mut Mode) -> Result<Item, broadcast::error::RecvError> {
        match mode {
            Mode::Live(rx) => rx.recv().await,
            Mode::CatchUp => std::future::pending().await,
        }
    }

    fn window_allows(&self, seq: u32) -> bool {
        u64::from(seq) <= u64::from(self.acked) + u64::from(self.cfg.window)
    }

    fn live_item(
        &mut self,
        r: Result<Item, broadcast::error::RecvError>,
    ) -> Result<(), SessionEnd> {
        match r {
            Ok(Item::Chunk(c)) => {
                if c.header.seq == self.next && self.sent.insert(c.header.index) {
                    self.queue.push_back(SendItem::Chunk(c));
                }
            }
            Ok(Item::End(l)) => {
                if l.end.seq == self.next {
                    // Chunks missed while joining (none, normally) are completed from the
                    // ledger itself.
                    for c in &l.chunks {
                        if self.sent.insert(c.header.index) {
                            self.queue.push_back(SendItem::Chunk(c.clone()));
                        }
                    }
                    self.queue.push_back(SendItem::End(end_bytes(&l.end)));
                    self.advance();
                }
            }
            Ok(Item::Abort(seq)) => {
                if seq == self.next && !self.sent.is_empty() {
                    return Err(SessionEnd {
                        code: Some(ErrorCode::SourceReset),
                        reason: format!("source cut off ledger {seq} after some of it was sent"),
                    });
                }
            }
            Err(broadcast::error::RecvError::Lagged(n)) => {
                debug!(
                    session = self.handle.id,
                    skipped = n,
                    "fell behind the live stream"
                );
                Metrics::add(&self.shared.metrics.lagged_total, 1);
                self.mode = Mode::CatchUp;
                self.publish_info();
            }
            Err(broadcast::error::RecvError::Closed) => {
                return Err(SessionEnd {
                    code: Some(ErrorCode::ShuttingDown),
                    reason: "live stream closed".into(),
                })
            }
        }
        Ok(())
    }

    fn advance(&mut self) {
        Metrics::add(&self.shared.metrics.ledgers_out_total, 1);
        self.next = self.next.wrapping_add(1);
        self.sent.clear();
    }

    /// In catch-up mode, queues complete ledgers the window allows, and switches to live once
    /// the session reaches the ledger in progress.
    async fn fill(&mut self) -> Result<(), SessionEnd> {
        while matches!(self.mode, Mode::CatchUp)
            && self.ending.is_none()
            && self.window_allows(self.next)
            && self.queue.len() < 64
        {
            // Complete ledgers are in memory (the hub's tip) or, after a restart, in the ring.
            let (_, newest) = held_range(&self.shared);
            if newest != 0 && self.next <= newest {
                let ledger = match self.load(self.next).await {
                    Ok(ledger) => ledger,
                    Err(end) => {
                        self.ending = Some((end, Instant::now()));
                        break;
                    }
                };
                for c in &ledger.chunks {
                    if self.sent.insert(c.header.index) {
                        self.queue.push_back(SendItem::Chunk(c.clone()));
                    }
                }
                self.queue.push_back(SendItem::End(end_bytes(&ledger.end)));
                self.advance();
                continue;
            }
            let join = self.shared.hub.join();
            if held_range(&self.shared).1 >= self.next {
                // The ledger completed while joining: read it from memory instead.
                continue;
            }
            if let Some(cur) = join.current {
                if cur.seq == self.next {
                    for c in cur.chunks {
                        if self.sent.insert(c.header.index) {
                            self.queue.push_back(SendItem::Chunk(c));
                        }
                    }
                }
            }
            self.mode = Mode::Live(join.rx);
            self.publish_info();
        }
        Ok(())
    }

    /// A complete ledger from memory, else from the ring (verified before it is served).
    async fn load(&self, seq: u32) -> Result<Arc<CompleteLedger>, SessionEnd> {
        if let Some(l) = self.shared.hub.recent(seq) {
            return Ok(l);
        }
        let below = |shared: &Shared| {
            let (oldest, newest) = held_range(shared);
            SessionEnd {
                code: Some(ErrorCode::BelowRetention),
                reason: format!(
                    "ledger {seq} is no longer held (oldest {oldest}, newest {newest})"
                ),
            }
        };
        let Some(ring) = self.shared.ring.clone() else {
            return Err(below(&self.shared));
        };
        Metrics::add(&self.shared.metrics.ring_reads_total, 1);
        let got = tokio::task::spawn_blocking(move || ring.get(seq))
            .await
            .map_err(|e| SessionEnd {
                code: Some(ErrorCode::Internal),
                reason: format!("ring read task: {e}"),
            })?;
        match got {
            Ok(Some((end, chunks))) => Ok(Arc::new(CompleteLedger {
                end,
                chunks: chunks
                    .into_iter()
                    .map(|c| {
                        Arc::new(ChunkItem::new(
                            ledger_relay_wire::frame::ChunkHeader {
                                seq,
                                index: c.index,
                                raw_offset: c.raw_offset,
                                raw_len: c.raw_len,
                                codec: c.codec,
                            },
                            c.payload,
                        ))
                    })
                    .collect(),
            })),
            Ok(None) => Err(below(&self.shared)),
            Err(RingError::Corrupt { seq, detail }) => {
                Metrics::add(&self.shared.metrics.ring_corrupt_total, 1);
                warn!(seq, %detail, "stored ledger failed verification: not served");
                Err(SessionEnd {
                    code: Some(ErrorCode::Internal),
                    reason: format!("stored ledger {seq} is corrupt"),
                })
            }
            Err(e) => Err(SessionEnd {
                code: Some(ErrorCode::Internal),
                reason: format!("ring read of {seq}: {e}"),
            }),
        }
    }

    async fn control_frame(&mut self, f: Frame) -> Result<(), SessionEnd> {
        match f {
            Frame::Ack(seq) => {
                if seq >= self.next {
                    Metrics::add(&self.shared.metrics.protocol_errors_total, 1);
                    return Err(SessionEnd {
                        code: Some(ErrorCode::ProtocolViolation),
                        reason: format!("ack of ledger {seq}, which was not sent"),
                    });
                }
                if seq > self.acked || self.acked.wrapping_add(1) == 0 {
                    self.acked = seq;
                    self.publish_info();
                }
                Ok(())
            }
            Frame::Resend(r) => {
                self.resend(r).await;
                Ok(())
            }
            other => {
                Metrics::add(&self.shared.metrics.protocol_errors_total, 1);
                Err(SessionEnd {
                    code: Some(ErrorCode::ProtocolViolation),
                    reason: format!(
                        "unexpected {} frame on the control stream",
                        other.frame_type().name()
                    ),
                })
            }
        }
    }

    async fn resend(&mut self, r: Resend) {
        let started = r.seq < self.next || (r.seq == self.next && !self.sent.is_empty());
        if !started {
            return; // Not sent yet: it will be.
        }
        let items: Vec<SendItem> = if let Ok(l) = self.load(r.seq).await {
            let mut v: Vec<SendItem> = l
                .chunks
                .iter()
                .filter(|c| r.whole || r.indices.contains(&c.header.index))
                .map(|c| SendItem::Chunk(c.clone()))
                .collect();
            if r.whole {
                v.push(SendItem::End(end_bytes(&l.end)));
            }
            v
        } else {
            // The ledger in progress: what has been published so far (its end comes live).
            let join = self.shared.hub.join();
            join.current
                .filter(|c| c.seq == r.seq)
                .map(|c| {
                    c.chunks
                        .into_iter()
                        .filter(|c| r.whole || r.indices.contains(&c.header.index))
                        .map(SendItem::Chunk)
                        .collect()
                })
                .unwrap_or_default()
        };
        // A chunk still queued or on its way needs no second copy: the subscriber's stall timer
        // can fire for ledgers a slow lane has not reached yet.
        let pending: HashSet<(u32, u32)> = {
            let flying = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
            self.urgent
                .iter()
                .chain(self.queue.iter())
                .map(|i| i.key())
                .chain(flying.iter().copied())
                .collect()
        };
        let items: Vec<SendItem> = items
            .into_iter()
            .filter(|i| !pending.contains(&i.key()))
            .collect();
        Metrics::add(&self.shared.metrics.resent_chunks_total, items.len() as u64);
        self.urgent.extend(items);
    }

    async fn add_lane(&mut self, mut req: LaneRequest) {
        let lane = req.lane as usize;
        if lane >= self.lanes.len() {
            return;
        }
        if req.send.write(&Frame::LaneAccept(req.lane)).await.is_err() {
            return;
        }
        if let Some(old) = self.lanes[lane].take() {
            old.conn.close(0u32.into(), b"replaced by a rejoin");
        } else {
            Metrics::add(&self.shared.metrics.lanes_open, 1);
        }
        info!(session = self.handle.id, lane, "lane joined");
        self.lanes[lane] = Some(Lane::new(
            req.conn,
            Some((req.send, req.recv)),
            self.cfg.streams_per_lane,
        ));
        self.publish_info();
    }

    /// Puts `item` on the lane with the least outstanding bytes per measured rate.
    fn dispatch(&mut self, item: SendItem, permit: OwnedSemaphorePermit) {
        let size = item.len();
        let n = self.lanes.len();
        let mut best: Option<(usize, f64)> = None;
        for k in 0..n {
            // Start the scan after the last choice so ties rotate.
            let i = (self.rr + 1 + k) % n;
            if let Some(l) = &self.lanes[i] {
                let s = l.score(size);
                if best.is_none_or(|(_, b)| s < b) {
                    best = Some((i, s));
                }
            }
        }
        let Some((i, _)) = best else {
            self.urgent.push_front(item);
            return;
        };
        self.rr = i;
        let Some(lane) = &self.lanes[i] else { return };
        self.in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(item.key());
        // Counted from now, also while it waits in the lane's gate: striping sees it.
        lane.stats.add(size);
        let out = Outgoing {
            item,
            size,
            budget: permit,
            stats: lane.stats.clone(),
            retry: self.retry_tx.clone(),
            metrics: self.shared.metrics.clone(),
            in_flight: self.in_flight.clone(),
        };
        match &lane.gate {
            Some(gate) => {
                if let Err(mpsc::error::SendError(out)) = gate.send(out) {
                    // The gate ends only once the lane is dropped; fail safe all the same.
                    out.done(false);
                }
            }
            None => {
                tokio::spawn(out.run(lane.conn.clone(), None));
            }
        }
    }

    async fn finish(&mut self, end: &SessionEnd) {
        let code = end.code.map_or(0u32, |c| c.close_code());
        // Lanes 1.. first (no frame: lane 0's control stream carries the reason).
        for lane in self.lanes.iter().skip(1).flatten() {
            lane.conn.close(code.into(), end.reason.as_bytes());
        }
        if let (Some(code), Some(lane0)) = (end.code, self.lanes[0].as_ref()) {
            let (oldest, newest) = if code == ErrorCode::BelowRetention {
                held_range(&self.shared)
            } else {
                (0, 0)
            };
            let frame = ErrorFrame {
                code,
                oldest,
                newest,
                message: ledger_relay_wire::frame::truncate_utf8(&end.reason, 512).to_string(),
            };
            let conn = lane0.conn.clone();
            close_with_error(&conn, self.control.stream_mut(), &frame, CLOSE_LINGER).await;
        } else if let Some(lane0) = &self.lanes[0] {
            lane0.conn.close(code.into(), end.reason.as_bytes());
        }
        let lanes = self.lanes_up();
        self.shared
            .metrics
            .lanes_open
            .fetch_sub(u64::from(lanes), Ordering::Relaxed);
        self.shared
            .metrics
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.handle.id);
    }
}

/// Sends one frame on its own unidirectional stream and waits until the peer has acknowledged
/// all of it.
async fn send_stream(conn: &Connection, item: &SendItem) -> Result<(), String> {
    let mut s = conn.open_uni().await.map_err(|e| e.to_string())?;
    match item {
        SendItem::Chunk(c) => {
            s.write_all(&c.prefix).await.map_err(|e| e.to_string())?;
            s.write_chunk(c.payload.clone())
                .await
                .map_err(|e| e.to_string())?;
        }
        SendItem::End(b) => s.write_chunk(b.clone()).await.map_err(|e| e.to_string())?,
    }
    s.finish().map_err(|e| e.to_string())?;
    match s.stopped().await {
        Ok(None) => Ok(()),
        Ok(Some(code)) => Err(format!("stream stopped by peer: {code}")),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    /// The rate is measured over the time a lane had bytes outstanding: a lane that sent
    /// 100 KB in 10 ms and then idled 40 ms ran at 10 MB/s, not 2 MB/s; concurrent changes
    /// leave the clock as the last one says.
    #[test]
    fn the_busy_clock_counts_only_time_with_bytes_outstanding() {
        let stats = LaneStats::new();
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        stats.outstanding.fetch_add(60_000, Ordering::Relaxed);
        stats.sync_busy(t0);
        stats.outstanding.fetch_add(40_000, Ordering::Relaxed);
        stats.sync_busy(t0 + ms(1));
        assert_eq!(stats.busy_until(t0 + ms(4)), ms(4));
        stats.outstanding.fetch_sub(60_000, Ordering::Relaxed);
        stats.sync_busy(t0 + ms(6));
        stats.outstanding.fetch_sub(40_000, Ordering::Relaxed);
        stats.sync_busy(t0 + ms(10));
        assert_eq!(stats.busy_until(t0 + ms(50)), ms(10));
        let rate = 100_000.0 / stats.busy_until(t0 + ms(50)).as_secs_f64();
        assert!((rate - 10e6).abs() < 1.0, "{rate}");
        // An add and a remove whose syncs arrive in the other order: the counter read under
        // the lock decides, so the lane is busy again.
        stats.outstanding.fetch_sub(0, Ordering::Relaxed);
        stats.outstanding.fetch_add(5_000, Ordering::Relaxed);
        stats.sync_busy(t0 + ms(60));
        stats.sync_busy(t0 + ms(61));
        assert_eq!(stats.busy_until(t0 + ms(70)), ms(20));
        // add/remove keep the counter and the clock together.
        stats.remove(5_000);
        let idle = stats.busy_until(Instant::now() + ms(100));
        assert_eq!(stats.busy_until(Instant::now() + ms(200)), idle);
        stats.add(1);
        assert!(stats.busy_until(Instant::now() + ms(100)) >= idle + ms(100));
    }

    /// Runs a gate of `n` permits over `items`, each "stream" lasting 20 ms; returns the order
    /// they started in and the most open at once.
    async fn run_gate(n: u32, items: u32) -> (Vec<u32>, usize) {
        let (tx, rx) = mpsc::unbounded_channel();
        let open = Arc::new(AtomicUsize::new(0));
        let peak = Arc::new(AtomicUsize::new(0));
        let started = Arc::new(Mutex::new(Vec::new()));
        let (done_tx, mut done_rx) = mpsc::unbounded_channel();
        let task = {
            let (open, peak, started) = (open.clone(), peak.clone(), started.clone());
            tokio::spawn(gate(
                rx,
                Arc::new(Semaphore::new(n as usize)),
                std::future::pending(),
                move |i: u32, permit| {
                    started.lock().unwrap().push(i);
                    let now = open.fetch_add(1, Ordering::SeqCst) + 1;
                    peak.fetch_max(now, Ordering::SeqCst);
                    let (open, done) = (open.clone(), done_tx.clone());
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        open.fetch_sub(1, Ordering::SeqCst);
                        drop(permit);
                        let _ = done.send(i);
                    });
                },
                |i| panic!("item {i} failed on a live lane"),
            ))
        };
        for i in 0..items {
            tx.send(i).unwrap();
        }
        drop(tx);
        for _ in 0..items {
            tokio::time::timeout(Duration::from_secs(10), done_rx.recv())
                .await
                .expect("every item ends")
                .unwrap();
        }
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("the gate ends with its sender")
            .unwrap();
        let order = started.lock().unwrap().clone();
        (order, peak.load(Ordering::SeqCst))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_gate_opens_at_most_n_streams_in_dispatch_order() {
        for n in [1, 3] {
            let (order, peak) = run_gate(n, 12).await;
            assert_eq!(order, (0..12).collect::<Vec<_>>(), "dispatch order");
            assert_eq!(peak, n as usize, "at most {n} at once, and that many used");
        }
        let (_, peak) = run_gate(64, 12).await;
        assert_eq!(peak, 12, "a large limit does not serialize");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_closed_lane_fails_everything_waiting_and_after() {
        let (tx, rx) = mpsc::unbounded_channel();
        let (close_tx, close_rx) = tokio::sync::oneshot::channel::<()>();
        let held = Arc::new(Mutex::new(Vec::new()));
        let failed = Arc::new(Mutex::new(Vec::new()));
        let streams = Arc::new(Semaphore::new(1));
        let task = {
            let (held, failed) = (held.clone(), failed.clone());
            tokio::spawn(gate(
                rx,
                streams.clone(),
                async move {
                    let _ = close_rx.await;
                },
                // A stream that never ends: its permit stays taken.
                move |i: u32, permit| held.lock().unwrap().push((i, permit)),
                move |i| failed.lock().unwrap().push(i),
            ))
        };
        for i in 0..4 {
            tx.send(i).unwrap();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            held.lock().unwrap().len(),
            1,
            "one stream open, three waiting"
        );
        assert!(failed.lock().unwrap().is_empty());
        close_tx.send(()).unwrap();
        tx.send(4).unwrap();
        drop(tx);
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("the gate ends")
            .unwrap();
        assert_eq!(*failed.lock().unwrap(), vec![1, 2, 3, 4]);
        held.lock().unwrap().clear();
        assert_eq!(
            streams.available_permits(),
            1,
            "the open stream's permit returns"
        );
    }
}
