//! The relay's side of one session as a state machine: which ledger to send next, where to read
//! it (the live stream, or complete ledgers from memory or the ring), which chunk goes on which
//! lane, what to send again, and when and why to end the session.
//!
//! Like the [`crate::Reassembler`] (its peer on the subscriber) and `quinn-proto`'s
//! `Connection`, it does no IO and reads no clock. The relay's session shell feeds it inputs and
//! carries out its outputs:
//!
//! - inputs: lanes joining and dying ([`Sender::handle_lane_up`], [`Sender::handle_lane_down`],
//!   [`Sender::handle_lane_report`]); frames from the control stream ([`Sender::handle_frame`],
//!   [`Sender::handle_control_error`]); streams that ended ([`Sender::handle_stream_done`]);
//!   ledgers it asked for ([`Sender::handle_loaded`], [`Sender::handle_joined`]) and items of
//!   the live stream ([`Sender::handle_live`]); the end of the session decided elsewhere
//!   ([`Sender::handle_close`]: revocation, shutdown); and time ([`Sender::handle_timeout`]);
//! - outputs: [`Sender::poll_transmit`] (a unit to put on its own stream of a given lane),
//!   [`Sender::poll_event`] (load a ledger, join or leave the live stream, send a heartbeat,
//!   close with a typed [`CloseReason`]) and [`Sender::poll_timeout`] (when to call
//!   `handle_timeout` next); [`Sender::wants_live`] says whether to read the live stream now.
//!
//! Rules it owns, all in this module and its children:
//! - **Order and window**: ledgers are queued strictly in sequence from the session's first,
//!   at most `window` beyond the newest the subscriber acknowledged.
//! - **Live and catch-up**: a session reads complete ledgers ([`Event::Load`]) until it reaches
//!   the ledger in progress, then joins the live stream ([`Event::JoinLive`]) with no gap and no
//!   duplicate; when it falls behind the live stream ([`LiveItem::Lagged`]) it goes back to
//!   loading complete ledgers at its own pace, so a slow subscriber never holds the source or
//!   other subscribers back and costs the relay no more than the live channel's capacity.
//! - **Striping** ([`lanes`]): late binding to the lane with room that is expected to deliver
//!   first.
//! - **Resends**: a stream that fails (its lane died) is sent again on another lane; a
//!   subscriber's `Resend` is honoured only for ledgers sent and not yet acknowledged, once per
//!   chunk while a copy is queued or in flight, and ring reads for resends are rate-limited. So
//!   the bytes queued for resending are bounded by the window, whatever the subscriber sends.
//! - **Ending**: every close reason is typed ([`CloseReason`]) and one function turns it into
//!   the `Error` frame. A session that cannot load its next ledger first lets the subscriber
//!   receive everything already sent before it (bounded by `drain_limit`), so the next session
//!   does not have to send it again.

mod admit;
mod close;
pub mod lanes;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

pub use admit::{check_join, check_open, JoinTarget};
pub use close::{CloseReason, Violation};
pub use lanes::{LaneInfo, LaneReport};

use crate::frame::{
    Chunk, Frame, LedgerEnd, Resend, CHUNK_FIXED_LEN, FRAME_HEADER_LEN, LEDGER_END_LEN,
};

/// A ledger whose end record and chunks are all known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompleteLedger {
    /// The end record.
    pub end: LedgerEnd,
    /// Chunks in index order.
    pub chunks: Vec<Chunk>,
}

impl CompleteLedger {
    /// Payload bytes over all chunks.
    pub fn wire_bytes(&self) -> u64 {
        self.chunks.iter().map(|c| c.payload.len() as u64).sum()
    }

    /// A ledger for the sender's tests and its fuzz harness: `chunks` uncompressed chunks of
    /// `chunk_len` bytes (chunk `i` filled with the byte `i`), hashes that are functions of
    /// `seq` (ledger `seq`'s previous hash is ledger `seq - 1`'s hash), no checksum.
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn filled(seq: u32, chunks: u32, chunk_len: u32) -> Arc<CompleteLedger> {
        use crate::compress::Codec;
        use crate::frame::ChunkHeader;
        let chunks: Vec<Chunk> = (0..chunks)
            .map(|i| Chunk {
                header: ChunkHeader {
                    seq,
                    index: i,
                    raw_offset: u64::from(i) * u64::from(chunk_len),
                    raw_len: chunk_len,
                    codec: Codec::None,
                },
                payload: bytes::Bytes::from(vec![i as u8; chunk_len as usize]),
            })
            .collect();
        Arc::new(CompleteLedger {
            end: LedgerEnd {
                seq,
                chunk_count: chunks.len() as u32,
                raw_len: u64::from(chunk_len) * chunks.len() as u64,
                checksum: 0,
                header_hash: [seq as u8; 32],
                previous_hash: [seq.wrapping_sub(1) as u8; 32],
                first_byte_ns: 0,
                last_byte_ns: 0,
            },
            chunks,
        })
    }
}

/// What one data stream carries: one chunk, or one end record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unit {
    /// A chunk frame.
    Chunk(Chunk),
    /// A `LedgerEnd` frame.
    End(LedgerEnd),
}

/// (sequence, chunk index), with `u32::MAX` standing for the end record.
type Key = (u32, u32);

const END_INDEX: u32 = u32::MAX;

impl Unit {
    /// The ledger this unit belongs to.
    pub fn seq(&self) -> u32 {
        match self {
            Unit::Chunk(c) => c.header.seq,
            Unit::End(e) => e.seq,
        }
    }

    fn key(&self) -> Key {
        match self {
            Unit::Chunk(c) => (c.header.seq, c.header.index),
            Unit::End(e) => (e.seq, END_INDEX),
        }
    }

    /// Bytes the unit occupies on its stream, framing included.
    pub fn wire_len(&self) -> u64 {
        match self {
            Unit::Chunk(c) => (FRAME_HEADER_LEN + CHUNK_FIXED_LEN + c.payload.len()) as u64,
            Unit::End(_) => (FRAME_HEADER_LEN + LEDGER_END_LEN) as u64,
        }
    }
}

/// Names a stream the sender asked for, so its end can be reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId(pub u64);

/// Put `unit` on a new unidirectional stream of lane `lane`, finish it, and report with
/// [`Sender::handle_stream_done`] once the subscriber has acknowledged all of it (or it failed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    /// The stream's name.
    pub stream: StreamId,
    /// The lane to open it on.
    pub lane: u8,
    /// What it carries.
    pub unit: Unit,
}

/// What the shell found when asked to load a ledger ([`Event::Load`]).
#[derive(Debug, Clone)]
pub enum LoadResult {
    /// The ledger is complete (in memory, in the ring or in the backfill lake, verified).
    Complete(Arc<CompleteLedger>),
    /// The ledger is being published now: its chunks so far.
    InProgress(Vec<Chunk>),
    /// The ledger is newer than anything the relay holds.
    NotYet,
    /// The ledger is older than anything the relay holds (or was lost).
    NotHeld {
        /// Oldest ledger held in memory or the ring (0: none).
        oldest: u32,
        /// Newest ledger held (0: none).
        newest: u32,
        /// The backfill lake's oldest and newest ledger, when the relay has one that holds
        /// any (the ledger is not among them).
        lake: Option<(u32, u32)>,
    },
    /// The stored ledger failed verification (in the ring, or its object in the backfill
    /// lake is missing or damaged).
    Corrupt {
        /// What failed.
        detail: String,
    },
    /// The ledger could not be read and the session should not wait for it (the backfill
    /// lake failed after its client's own retries): the subscriber reconnects, or fails over.
    Failed {
        /// Why.
        detail: String,
    },
    /// It could not be read now (the store is degraded or a read failed): ask again later.
    Unavailable {
        /// Why.
        detail: String,
    },
}

/// An item of the relay's live stream.
#[derive(Debug, Clone)]
pub enum LiveItem {
    /// A chunk of the ledger being published.
    Chunk(Chunk),
    /// A ledger completed (its chunks were published before it, unless the relay stores and
    /// forwards).
    End(Arc<CompleteLedger>),
    /// The ledger `seq` was cut off by the source; its published chunks are void.
    Abort(u32),
    /// The session fell behind the live stream by more than it holds.
    Lagged,
    /// The live stream ended (the relay is stopping).
    Closed,
}

/// What the shell must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Load ledger `seq` (from memory, else from the ring on a thread that may block, else
    /// from the backfill lake) and report with [`Sender::handle_loaded`].
    Load(u32),
    /// Join the live stream and report with [`Sender::handle_joined`].
    JoinLive,
    /// Drop the live stream's receiver.
    LeaveLive,
    /// Send a heartbeat on the control stream.
    Heartbeat,
    /// End the session: send the reason's `Error` frame (if any) and close every lane. No
    /// other output follows.
    Close(CloseReason),
}

/// Why the control stream failed, as the shell saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControlError {
    /// The subscriber finished its control stream.
    Ended,
    /// The bytes on it do not decode (a protocol violation).
    BadFrame(String),
    /// The stream or the connection failed.
    Failed(String),
}

/// Session parameters.
#[derive(Debug, Clone)]
pub struct SenderConfig {
    /// The first ledger to send.
    pub first: u32,
    /// Lanes granted, counting lane 0.
    pub lanes: u8,
    /// Ledgers sent beyond the newest acknowledged.
    pub window: u16,
    /// Raw bytes per chunk the relay cuts (a lane keeps at least two chunks in flight).
    pub chunk_size: u32,
    /// Most bytes in flight on one lane (the transport's per-connection send buffer).
    pub lane_budget: u64,
    /// Most streams open at once on one lane (`None`: no limit).
    pub streams_per_lane: Option<u32>,
    /// Time between heartbeats. After the first (at once), they fall on the multiples of the
    /// interval on the shell's clock, so that a shell that gives its senders one clock (the
    /// relay) sends the heartbeats of all its sessions in one wake-up, and their
    /// acknowledgements come back together, instead of one wake-up per session and interval.
    pub heartbeat: Duration,
    /// How long a session that cannot go on waits for the subscriber to acknowledge what was
    /// already sent before it closes.
    pub drain_limit: Duration,
    /// Transmission time each lane keeps queued beyond its round trip (see [`lanes`]).
    pub queue_target: Duration,
    /// Units queued before the session stops reading the live stream.
    pub live_queue: usize,
    /// Wire bytes queued before the session stops loading more complete ledgers: enough to
    /// keep every lane busy while the next ledger is read, whatever the chunk size (a count of
    /// units instead held a ledger of small chunks to one ledger ahead).
    pub catch_up_bytes: u64,
    /// Ledger loads for resends per second (a burst of as many is allowed).
    pub resend_loads_per_sec: u32,
    /// How long to wait before asking again for a ledger that was `Unavailable`.
    pub load_retry: Duration,
}

impl SenderConfig {
    /// Defaults for a session starting at `first` with `lanes` lanes.
    pub fn new(first: u32, lanes: u8) -> SenderConfig {
        SenderConfig {
            first,
            lanes: lanes.max(1),
            window: 8,
            chunk_size: 256 << 10,
            lane_budget: 32 << 20,
            streams_per_lane: None,
            heartbeat: Duration::from_millis(250),
            drain_limit: Duration::from_secs(5),
            queue_target: Duration::from_millis(4),
            live_queue: 256,
            catch_up_bytes: 8 << 20,
            resend_loads_per_sec: 32,
            load_retry: Duration::from_millis(250),
        }
    }
}

/// Where the session reads the ledgers it sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Loading complete ledgers.
    CatchUp,
    /// Asked the shell to join the live stream; waiting for `handle_joined`.
    Joining,
    /// Reading the live stream.
    Live,
}

/// A unit on a lane.
#[derive(Debug)]
struct Flight {
    lane: u8,
    unit: Unit,
    len: u64,
}

/// What the subscriber asked to have again of one ledger.
#[derive(Debug, Default)]
struct Wanted {
    whole: bool,
    indices: BTreeSet<u32>,
}

/// Counters for metrics and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SenderStats {
    /// Ledgers queued in full.
    pub ledgers: u64,
    /// Streams delivered.
    pub streams: u64,
    /// Units sent again because their stream failed.
    pub retried: u64,
    /// Units sent again because the subscriber asked.
    pub resent: u64,
    /// Resend requests dropped by the rate limit.
    pub resends_limited: u64,
    /// Times the session fell behind the live stream.
    pub lagged: u64,
}

/// One session's sender. See the module documentation.
#[derive(Debug)]
pub struct Sender {
    cfg: SenderConfig,
    /// Newest ledger acknowledged.
    acked: u32,
    /// Next ledger to queue.
    next: u32,
    /// Chunk indices of `next` already queued.
    sent: HashSet<u32>,
    mode: Mode,
    /// Units waiting for a lane: failed and resent ones first, then ledgers in order.
    urgent: VecDeque<Unit>,
    queue: VecDeque<Unit>,
    /// Wire bytes of the units in `urgent` and `queue`.
    queued_bytes: u64,
    /// Keys queued or in flight.
    pending: HashSet<Key>,
    flights: HashMap<StreamId, Flight>,
    next_stream: u64,
    lanes: Vec<Option<lanes::Lane>>,
    last_lane: usize,
    /// Loads asked for and not yet reported.
    loading: BTreeSet<u32>,
    /// The catch-up load of `next` is among `loading`.
    catch_up_loading: bool,
    /// After an `Unavailable` load: when to ask again.
    retry_at: Option<Duration>,
    wanted: BTreeMap<u32, Wanted>,
    /// Token bucket of resend loads.
    resend_tokens: f64,
    resend_refilled: Duration,
    events: VecDeque<Event>,
    next_heartbeat: Duration,
    /// Why the session must end, and since when (draining).
    ending: Option<(CloseReason, Duration)>,
    closed: bool,
    stats: SenderStats,
}

impl Sender {
    /// A sender for a session whose lane 0 is up, at time `now`.
    pub fn new(cfg: SenderConfig, now: Duration) -> Sender {
        let mut lanes = vec![None; usize::from(cfg.lanes.max(1))];
        lanes[0] = Some(lanes::Lane::new());
        let burst = f64::from(cfg.resend_loads_per_sec.max(1));
        Sender {
            acked: cfg.first.saturating_sub(1),
            next: cfg.first,
            sent: HashSet::new(),
            mode: Mode::CatchUp,
            urgent: VecDeque::new(),
            queue: VecDeque::new(),
            queued_bytes: 0,
            pending: HashSet::new(),
            flights: HashMap::new(),
            next_stream: 0,
            lanes,
            last_lane: 0,
            loading: BTreeSet::new(),
            catch_up_loading: false,
            retry_at: None,
            wanted: BTreeMap::new(),
            resend_tokens: burst,
            resend_refilled: now,
            events: VecDeque::new(),
            next_heartbeat: now,
            ending: None,
            closed: false,
            stats: SenderStats::default(),
            cfg,
        }
    }

    /// Newest ledger the subscriber acknowledged (`first - 1` before any).
    pub fn acked(&self) -> u32 {
        self.acked
    }

    /// Next ledger to be queued.
    pub fn next_seq(&self) -> u32 {
        self.next
    }

    /// Whether the session reads complete ledgers rather than the live stream.
    pub fn catching_up(&self) -> bool {
        self.mode != Mode::Live
    }

    /// Lanes up.
    pub fn lanes_up(&self) -> u8 {
        self.lanes.iter().filter(|l| l.is_some()).count() as u8
    }

    /// Units waiting for a lane.
    pub fn queued(&self) -> usize {
        self.urgent.len() + self.queue.len()
    }

    /// Counters.
    pub fn stats(&self) -> SenderStats {
        self.stats
    }

    /// Whether a `Close` has been emitted.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Each lane's state at `now`.
    pub fn lanes(&self, now: Duration) -> Vec<LaneInfo> {
        self.lanes
            .iter()
            .enumerate()
            .map(|(i, l)| match l {
                Some(l) => l.info(
                    i as u8,
                    now,
                    self.chunk_wire_len(),
                    self.cfg.queue_target,
                    self.cfg.lane_budget,
                ),
                None => LaneInfo {
                    lane: i as u8,
                    up: false,
                    outstanding: 0,
                    streams: 0,
                    delivered: 0,
                    busy: Duration::ZERO,
                    rate: 0.0,
                    target: 0,
                },
            })
            .collect()
    }

    /// Whether the shell should read the next live item now.
    pub fn wants_live(&self) -> bool {
        !self.closed
            && self.ending.is_none()
            && self.mode == Mode::Live
            && self.queued() < self.cfg.live_queue
            && self.window_allows(self.next)
    }

    fn chunk_wire_len(&self) -> u64 {
        (FRAME_HEADER_LEN + CHUNK_FIXED_LEN) as u64 + u64::from(self.cfg.chunk_size)
    }

    fn window_allows(&self, seq: u32) -> bool {
        u64::from(seq) <= u64::from(self.acked) + u64::from(self.cfg.window)
    }

    // ---- inputs ----------------------------------------------------------------------------

    /// Lane `lane` joined (or rejoined: what the old connection had in flight is sent again).
    pub fn handle_lane_up(&mut self, lane: u8, now: Duration) {
        let i = usize::from(lane);
        if i >= self.lanes.len() || self.closed {
            return;
        }
        if self.lanes[i].is_some() {
            self.fail_lane(lane);
        }
        self.lanes[i] = Some(lanes::Lane::new());
        let _ = now;
    }

    /// Lane `lane`'s connection is gone. Its streams are sent again on the others; lane 0
    /// carries the control stream, so losing it ends the session.
    pub fn handle_lane_down(&mut self, lane: u8, detail: &str, now: Duration) {
        let i = usize::from(lane);
        if i >= self.lanes.len() || self.lanes[i].is_none() || self.closed {
            return;
        }
        self.fail_lane(lane);
        self.lanes[i] = None;
        if lane == 0 {
            self.close(CloseReason::PeerGone {
                detail: format!("lane 0 closed: {detail}"),
            });
        }
        let _ = now;
    }

    /// What the shell measured of a lane's path.
    pub fn handle_lane_report(&mut self, lane: u8, report: LaneReport) {
        if let Some(Some(l)) = self.lanes.get_mut(usize::from(lane)) {
            l.report(report);
        }
    }

    /// Requeues everything in flight on `lane`, in the order it was sent.
    fn fail_lane(&mut self, lane: u8) {
        let mut ids: Vec<StreamId> = self
            .flights
            .iter()
            .filter(|(_, f)| f.lane == lane)
            .map(|(id, _)| *id)
            .collect();
        ids.sort_unstable();
        for id in ids {
            if let Some(f) = self.flights.remove(&id) {
                self.retry(f.unit);
            }
        }
    }

    fn retry(&mut self, unit: Unit) {
        if self.acked_covers(unit.seq()) {
            self.pending.remove(&unit.key());
            return;
        }
        self.stats.retried += 1;
        self.queued_bytes += unit.wire_len();
        self.urgent.push_back(unit);
    }

    /// Whether the subscriber already holds ledger `seq`. Sequences are compared plainly: a
    /// session never spans the end of the sequence space (ledger 2^32 - 1 is centuries away),
    /// and `acked` starts at `first - 1` with `first >= 1`.
    fn acked_covers(&self, seq: u32) -> bool {
        seq <= self.acked
    }

    /// A stream the sender asked for ended: `delivered` when the subscriber acknowledged all
    /// of it, else it failed (reset, or its connection died) and is sent again.
    pub fn handle_stream_done(&mut self, stream: StreamId, delivered: bool, now: Duration) {
        let Some(f) = self.flights.remove(&stream) else {
            return; // its lane was already failed
        };
        let (chunk, budget) = (self.chunk_wire_len(), self.cfg.lane_budget);
        if let Some(Some(l)) = self.lanes.get_mut(usize::from(f.lane)) {
            l.close(f.len, delivered, now, chunk, budget);
        }
        if delivered {
            self.stats.streams += 1;
            self.pending.remove(&f.unit.key());
        } else if !self.closed {
            self.retry(f.unit);
        }
    }

    /// A frame from the subscriber's control stream.
    pub fn handle_frame(&mut self, frame: Frame, now: Duration) {
        if self.closed {
            return;
        }
        match frame {
            Frame::Ack(seq) => {
                self.ack(seq);
                self.check_drained(now);
            }
            Frame::Resend(r) => self.resend(r, now),
            other => self.close(
                Violation::UnexpectedFrame {
                    frame: other.frame_type().name(),
                    place: "the control stream",
                }
                .into(),
            ),
        }
        self.refill();
    }

    /// The control stream failed.
    pub fn handle_control_error(&mut self, error: ControlError) {
        let reason = match error {
            ControlError::BadFrame(detail) => Violation::BadFrame { detail }.into(),
            ControlError::Ended => CloseReason::PeerGone {
                detail: "control stream ended".into(),
            },
            ControlError::Failed(detail) => CloseReason::PeerGone {
                detail: format!("control stream: {detail}"),
            },
        };
        self.close(reason);
    }

    /// The session must end now for a reason decided outside it (revocation, shutdown).
    pub fn handle_close(&mut self, reason: CloseReason) {
        self.close(reason);
    }

    fn ack(&mut self, seq: u32) {
        // Only ledgers queued in full can have been delivered.
        if seq < self.cfg.first || seq >= self.next {
            self.close(
                Violation::AckNotSent {
                    seq,
                    next: self.next,
                }
                .into(),
            );
            return;
        }
        if seq <= self.acked {
            return;
        }
        self.acked = seq;
        self.wanted.retain(|&s, _| s > seq);
        // Units of acknowledged ledgers still waiting need not go out.
        let (pending, bytes) = (&mut self.pending, &mut self.queued_bytes);
        for q in [&mut self.urgent, &mut self.queue] {
            q.retain(|u| {
                let keep = u.seq() > seq;
                if !keep {
                    pending.remove(&u.key());
                    *bytes -= u.wire_len();
                }
                keep
            });
        }
    }

    fn resend(&mut self, r: Resend, now: Duration) {
        if self.acked_covers(r.seq) {
            self.close(
                Violation::ResendOfAcked {
                    seq: r.seq,
                    acked: self.acked,
                }
                .into(),
            );
            return;
        }
        let started = r.seq < self.next || (r.seq == self.next && !self.sent.is_empty());
        if !started || r.seq < self.cfg.first {
            return; // not sent yet: it will be
        }
        let w = self.wanted.entry(r.seq).or_default();
        w.whole |= r.whole;
        w.indices.extend(r.indices);
        if self.loading.contains(&r.seq) {
            return; // served when that load comes back
        }
        // A token per ring read: a subscriber asking for the same ledgers over and over makes
        // the relay read its disk at most this often; a dropped request is asked again after
        // the subscriber's next stall timeout.
        let rate = f64::from(self.cfg.resend_loads_per_sec.max(1));
        let dt = now.saturating_sub(self.resend_refilled).as_secs_f64();
        self.resend_tokens = (self.resend_tokens + dt * rate).min(rate);
        self.resend_refilled = now;
        if self.resend_tokens < 1.0 {
            self.wanted.remove(&r.seq);
            self.stats.resends_limited += 1;
            return;
        }
        self.resend_tokens -= 1.0;
        self.loading.insert(r.seq);
        self.events.push_back(Event::Load(r.seq));
    }

    /// The shell loaded ledger `seq` as asked by [`Event::Load`].
    pub fn handle_loaded(&mut self, seq: u32, result: LoadResult, now: Duration) {
        if !self.loading.remove(&seq) || self.closed {
            return;
        }
        let catch_up = self.catch_up_loading && seq == self.next && self.mode == Mode::CatchUp;
        if catch_up {
            self.catch_up_loading = false;
        }
        let wanted = self.wanted.remove(&seq);
        match result {
            LoadResult::Complete(ledger) => {
                if let Some(w) = wanted {
                    self.queue_resend(&ledger.chunks, Some(ledger.end), &w);
                }
                if catch_up {
                    self.queue_ledger(&ledger);
                }
            }
            LoadResult::InProgress(chunks) => {
                if let Some(w) = wanted {
                    // Its end record goes out live.
                    self.queue_resend(&chunks, None, &w);
                }
                if catch_up {
                    self.join();
                }
            }
            LoadResult::NotYet => {
                if catch_up {
                    self.join();
                }
            }
            LoadResult::NotHeld {
                oldest,
                newest,
                lake,
            } => {
                if catch_up {
                    self.end_after_drain(
                        CloseReason::BelowRetention {
                            seq,
                            oldest,
                            newest,
                            lake,
                        },
                        now,
                    );
                }
            }
            LoadResult::Corrupt { detail } => {
                if catch_up {
                    self.end_after_drain(CloseReason::Corrupt { seq, detail }, now);
                }
            }
            LoadResult::Failed { detail } => {
                if catch_up {
                    let detail = format!("ledger {seq} cannot be read: {detail}");
                    self.end_after_drain(CloseReason::Internal { detail }, now);
                }
            }
            LoadResult::Unavailable { .. } => {
                if catch_up {
                    self.retry_at = Some(now + self.cfg.load_retry);
                }
                // A resend's want is dropped: the subscriber asks again after its stall timeout.
            }
        }
        self.refill();
    }

    /// The shell joined the live stream as asked by [`Event::JoinLive`]: `current` is the ledger
    /// being published at that moment with its chunks so far, `newest` the newest complete
    /// ledger at that moment.
    pub fn handle_joined(&mut self, current: Option<(u32, Vec<Chunk>)>, newest: u32) {
        if self.mode != Mode::Joining || self.closed {
            return;
        }
        if newest >= self.next && newest != 0 {
            // The ledger completed while joining: read it whole instead.
            self.mode = Mode::CatchUp;
            self.events.push_back(Event::LeaveLive);
        } else {
            self.mode = Mode::Live;
            if let Some((seq, chunks)) = current {
                if seq == self.next {
                    for c in chunks {
                        self.queue_chunk(c);
                    }
                }
            }
        }
        self.refill();
    }

    /// An item of the live stream, read because [`Sender::wants_live`] said so.
    pub fn handle_live(&mut self, item: LiveItem) {
        if self.mode != Mode::Live || self.closed {
            return;
        }
        match item {
            LiveItem::Chunk(c) => {
                if c.header.seq == self.next {
                    self.queue_chunk(c);
                }
            }
            LiveItem::End(l) => {
                let seq = l.end.seq;
                if seq == self.next {
                    // Chunks missed while joining (none, normally) come from the ledger itself.
                    self.queue_ledger(&l);
                } else if seq > self.next {
                    // Something was missed: read from the ledgers held instead of guessing.
                    self.leave_live();
                }
            }
            LiveItem::Abort(seq) => {
                if seq == self.next && !self.sent.is_empty() {
                    self.close(CloseReason::SourceReset { seq });
                }
            }
            LiveItem::Lagged => {
                self.stats.lagged += 1;
                self.leave_live();
            }
            LiveItem::Closed => self.close(CloseReason::ShuttingDown),
        }
        self.refill();
    }

    /// Time passed: heartbeats, the drain limit, load retries.
    pub fn handle_timeout(&mut self, now: Duration) {
        if self.closed {
            return;
        }
        if now >= self.next_heartbeat {
            self.events.push_back(Event::Heartbeat);
            self.next_heartbeat = next_tick(now, self.cfg.heartbeat);
        }
        if self.retry_at.is_some_and(|t| now >= t) {
            self.retry_at = None;
        }
        self.check_drained(now);
        self.refill();
    }

    // ---- outputs ---------------------------------------------------------------------------

    /// The next thing the shell must do.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// When to call [`Sender::handle_timeout`] next.
    pub fn poll_timeout(&self) -> Option<Duration> {
        if self.closed {
            return None;
        }
        let mut t = self.next_heartbeat;
        if let Some(r) = self.retry_at {
            t = t.min(r);
        }
        if let Some((_, since)) = &self.ending {
            t = t.min(*since + self.cfg.drain_limit);
        }
        Some(t)
    }

    /// The next unit to put on a stream, if a lane has room for it.
    pub fn poll_transmit(&mut self, now: Duration) -> Option<Transmit> {
        if self.closed {
            return None;
        }
        loop {
            let unit = self.urgent.front().or(self.queue.front())?;
            let len = unit.wire_len();
            let lane = lanes::choose(
                &self.lanes,
                lanes::Ask {
                    len,
                    chunk: self.chunk_wire_len(),
                    queued: self.queued_bytes,
                    last: self.last_lane,
                    queue_target: self.cfg.queue_target,
                    budget: self.cfg.lane_budget,
                    streams_per_lane: self.cfg.streams_per_lane,
                    now,
                },
            )?;
            let unit = match self.urgent.pop_front() {
                Some(u) => u,
                // `front()` above found one in one of the two queues.
                None => self.queue.pop_front()?,
            };
            self.queued_bytes -= len;
            if self.acked_covers(unit.seq()) {
                self.pending.remove(&unit.key());
                continue;
            }
            self.last_lane = lane;
            let stream = StreamId(self.next_stream);
            self.next_stream += 1;
            if let Some(Some(l)) = self.lanes.get_mut(lane) {
                l.open(len, now);
            }
            self.flights.insert(
                stream,
                Flight {
                    lane: lane as u8,
                    unit: unit.clone(),
                    len,
                },
            );
            // The queue shrank: catching up may load the next ledger now.
            self.refill();
            return Some(Transmit {
                stream,
                lane: lane as u8,
                unit,
            });
        }
    }

    // ---- internals -------------------------------------------------------------------------

    fn close(&mut self, reason: CloseReason) {
        if self.closed {
            return;
        }
        self.closed = true;
        self.ending = None;
        self.events.clear();
        self.urgent.clear();
        self.queue.clear();
        self.queued_bytes = 0;
        self.events.push_back(Event::Close(reason));
    }

    /// The session cannot go on past `next`; it ends once the subscriber has everything sent
    /// before (or after the drain limit), so the next session need not send it again.
    fn end_after_drain(&mut self, reason: CloseReason, now: Duration) {
        if self.ending.is_none() {
            self.ending = Some((reason, now));
        }
        self.check_drained(now);
    }

    fn check_drained(&mut self, now: Duration) {
        let Some((_, since)) = &self.ending else {
            return;
        };
        let drained = self.acked.wrapping_add(1) == self.next;
        if drained || now >= *since + self.cfg.drain_limit {
            if let Some((reason, _)) = self.ending.take() {
                self.close(reason);
            }
        }
    }

    fn join(&mut self) {
        self.mode = Mode::Joining;
        self.events.push_back(Event::JoinLive);
    }

    fn leave_live(&mut self) {
        self.mode = Mode::CatchUp;
        self.events.push_back(Event::LeaveLive);
    }

    fn enqueue(&mut self, unit: Unit, urgent: bool) {
        if self.pending.insert(unit.key()) {
            self.queued_bytes += unit.wire_len();
            if urgent {
                self.urgent.push_back(unit);
            } else {
                self.queue.push_back(unit);
            }
        }
    }

    fn queue_chunk(&mut self, c: Chunk) {
        if self.sent.insert(c.header.index) {
            self.enqueue(Unit::Chunk(c), false);
        }
    }

    /// Queues ledger `next` in full (its chunks not queued yet, then its end) and moves on.
    fn queue_ledger(&mut self, l: &CompleteLedger) {
        for c in &l.chunks {
            self.queue_chunk(c.clone());
        }
        self.enqueue(Unit::End(l.end), false);
        self.stats.ledgers += 1;
        self.next = self.next.wrapping_add(1);
        self.sent.clear();
    }

    fn queue_resend(&mut self, chunks: &[Chunk], end: Option<LedgerEnd>, w: &Wanted) {
        for c in chunks {
            if (w.whole || w.indices.contains(&c.header.index))
                && !self.pending.contains(&(c.header.seq, c.header.index))
            {
                self.stats.resent += 1;
                self.enqueue(Unit::Chunk(c.clone()), true);
            }
        }
        if let (true, Some(end)) = (w.whole, end) {
            if !self.pending.contains(&(end.seq, END_INDEX)) {
                self.stats.resent += 1;
                self.enqueue(Unit::End(end), true);
            }
        }
    }

    /// Asks for the next complete ledger when catching up and the window and queue allow.
    fn refill(&mut self) {
        if self.closed
            || self.ending.is_some()
            || self.mode != Mode::CatchUp
            || self.catch_up_loading
            || self.retry_at.is_some()
            || !self.window_allows(self.next)
            || self.queued_bytes >= self.cfg.catch_up_bytes
        {
            return;
        }
        if self.loading.insert(self.next) {
            self.events.push_back(Event::Load(self.next));
        }
        self.catch_up_loading = true;
    }
}

/// The first multiple of `every` after `now` (`now + every` for an interval under 1 ms, which
/// no configuration gives).
pub fn next_tick(now: Duration, every: Duration) -> Duration {
    let every_ns = every.as_nanos();
    if every_ns < 1_000_000 {
        return now + every;
    }
    let ticks = now.as_nanos() / every_ns + 1;
    // Within u64 nanoseconds for any clock under 584 years.
    Duration::from_nanos(u64::try_from(ticks * every_ns).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests;
