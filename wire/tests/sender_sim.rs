//! The relay's real [`Sender`] against the subscriber's real [`Reassembler`] over N virtual
//! lanes, in virtual time, in the spirit of quinn-proto's test `Pair`: no sockets, no sleeps.
//!
//! Each lane is a FIFO link with its own rate, one-way delay, jitter and loss, that can die and
//! rejoin; a lost packet costs a retransmission (link time) and a round trip, as QUIC's own
//! recovery would, and never loses the stream. A stream is acknowledged back to the sender one
//! delay after it arrived. The relay side is a small model of the shell: a source that
//! publishes ledgers chunk by chunk at a cadence, a store of complete ledgers (the ring), a
//! live channel of bounded capacity, and ledger loads that take time. The subscriber side
//! delivers to a consumer that may be slow, acknowledges what it delivered and asks for what
//! stalled.
//!
//! Each scenario asserts: every ledger delivered complete, in order, exactly once and
//! byte-identical; the whole transfer (subscription start to the last ledger delivered) within
//! a stated tolerance of the fluid bound (bytes over the lanes' summed rates, integrated over
//! the time each lane is up, plus one round trip); and each lane's share of the bytes within 5%
//! of its share of the capacity.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ledger_relay_wire::compress::Codec;
use ledger_relay_wire::frame::{Chunk, ChunkHeader, Frame, LedgerEnd, Resend};
use ledger_relay_wire::sender::lanes::PROBE_AFTER;
use ledger_relay_wire::sender::{
    CompleteLedger, Event, LaneReport, LiveItem, LoadResult, SenderConfig, StreamId, Unit,
};
use ledger_relay_wire::{Limits, Reassembler, Sender};
use proptest::prelude::*;
use proptest::test_runner::RngSeed;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const MS: Duration = Duration::from_millis(1);
/// The subscriber's default stall timeout.
const STALL: Duration = Duration::from_millis(500);
/// Time to read a ledger from the store.
const LOAD_TIME: Duration = Duration::from_micros(300);
/// Bytes per second.
const MBPS: f64 = 1e6;

#[derive(Clone, Debug)]
struct LaneSpec {
    rate: f64,
    delay: Duration,
    jitter: Duration,
    loss: f64,
    /// How long the bottleneck's queue may hold this lane's packets before it drops them: a
    /// congestion controller fills it, so the round trip the lane's QUIC connection reports
    /// counts what waits there, up to this (zero: the path's round trip only).
    buffer: Duration,
}

fn lane(rate_mb: f64) -> LaneSpec {
    LaneSpec {
        rate: rate_mb * MBPS,
        delay: MS,
        jitter: Duration::ZERO,
        loss: 0.0,
        buffer: Duration::ZERO,
    }
}

#[derive(Clone, Debug)]
struct Scenario {
    lanes: Vec<LaneSpec>,
    ledgers: u32,
    size: usize,
    chunk: usize,
    /// Ledgers complete in the store when the session starts; the rest are published live.
    backlog: u32,
    cadence: Duration,
    emit: Duration,
    /// Time the consumer spends on each ledger.
    consume: Duration,
    window: u16,
    /// (lane, dies at, rejoins at).
    deaths: Vec<(usize, Duration, Option<Duration>)>,
    /// (lane, from, to, stream loss probability).
    loss_burst: Option<(usize, Duration, Duration, f64)>,
    live_capacity: usize,
    seed: u64,
    /// How long the subscriber's QUIC stack holds the acknowledgement of a stream that fits one
    /// packet ([`PACKET`] bytes): it acknowledges every second packet at once and a lone one
    /// when its delayed-ACK timer fires (quinn's 25 ms). Zero: every stream is acknowledged a
    /// round trip after its last byte.
    ack_delay: Duration,
    /// (lane, bytes): the lane carries its first `bytes` at a third of its rate (a connection
    /// still in slow start, or a late handshake), so its first rate sample reads low.
    slow_start: Option<(usize, u64)>,
}

/// A lane's packet size in [`Scenario::ack_delay`].
const PACKET: u64 = 1452;

impl Scenario {
    /// The measurement: 96 incompressible 2 MiB ledgers caught up from the store.
    fn bulk(lanes: Vec<LaneSpec>) -> Scenario {
        Scenario {
            lanes,
            ledgers: 96,
            size: 2 << 20,
            chunk: 256 << 10,
            backlog: 96,
            cadence: Duration::from_millis(600),
            emit: Duration::from_millis(8),
            consume: Duration::ZERO,
            window: 8,
            deaths: Vec::new(),
            loss_burst: None,
            live_capacity: 512,
            seed: 1,
            ack_delay: Duration::ZERO,
            slow_start: None,
        }
    }
}

impl Scenario {
    /// The live measurement (`ledger-bench lanes`, live rows): the session subscribes
    /// before the first ledger, and the source publishes 96 incompressible 2 MiB ledgers every
    /// 15 ms, each over an 8 ms emit window, far faster than the lanes carry; so the session
    /// joins live, falls behind the live stream and reads the rest from the store while the
    /// source is still writing it. Lanes with the veth's sub-millisecond delay.
    fn live(lanes: Vec<LaneSpec>) -> Scenario {
        let lanes = lanes
            .into_iter()
            .map(|l| LaneSpec {
                delay: Duration::from_micros(300),
                ..l
            })
            .collect();
        Scenario {
            backlog: 0,
            cadence: Duration::from_millis(15),
            ..Scenario::bulk(lanes)
        }
    }

    /// When the source publishes its first chunk (the transfer cannot start before).
    fn first_publish(&self) -> Duration {
        if self.backlog > 0 {
            Duration::ZERO
        } else {
            self.cadence
        }
    }

    /// The longest round trip of its lanes.
    fn rtt(&self) -> Duration {
        self.lanes
            .iter()
            .map(|l| l.delay * 2)
            .max()
            .unwrap_or_default()
    }

    /// The time a transfer may spend finding its lanes' rates, beyond the fluid bound:
    /// [`RAMP_RTTS`] round trips, plus one chunk's time on the slowest lane (every lane starts
    /// with one chunk before its rate is known; on a lane far slower than the others, that chunk
    /// holds its ledger, and so the window, for that long).
    fn startup(&self) -> Duration {
        let slowest = self
            .lanes
            .iter()
            .map(|l| l.rate)
            .fold(f64::INFINITY, f64::min);
        self.rtt() * RAMP_RTTS + Duration::from_secs_f64(self.chunk as f64 / slowest)
    }
}

#[derive(Debug)]
enum Ev {
    Publish {
        seq: u32,
        index: u32,
    },
    PublishEnd {
        seq: u32,
    },
    Arrive {
        lane: usize,
        epoch: u32,
        unit: Unit,
    },
    StreamAcked {
        lane: usize,
        epoch: u32,
        stream: StreamId,
        len: u64,
    },
    ToRelay(Frame),
    Heartbeat {
        newest: u32,
    },
    Die {
        lane: usize,
    },
    Rejoin {
        lane: usize,
    },
    Loaded {
        seq: u32,
    },
    Consume,
    /// The shell's periodic report of every lane's round trips ([`REPORT_EVERY`]).
    Report,
}

/// How often the relay's session reports its lanes' round trips to the sender.
const REPORT_EVERY: Duration = Duration::from_millis(50);

struct Timed {
    at: Duration,
    id: u64,
    ev: Ev,
}

impl PartialEq for Timed {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.id) == (o.at, o.id)
    }
}
impl Eq for Timed {}
impl PartialOrd for Timed {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Timed {
    // The heap is a max-heap: earliest first.
    fn cmp(&self, o: &Self) -> Ordering {
        (o.at, o.id).cmp(&(self.at, self.id))
    }
}

struct LaneState {
    spec: LaneSpec,
    alive: bool,
    epoch: u32,
    busy_until: Duration,
    delivered: u64,
    /// Bytes the lane has carried (for [`Scenario::slow_start`]).
    carried: u64,
}

impl LaneState {
    /// The round trips the lane's QUIC connection would report at `now`: the smallest is the
    /// path's; the smoothed one adds what waits in the bottleneck's queue, up to its buffer.
    fn report(&self, now: Duration) -> LaneReport {
        let path = self.spec.delay * 2;
        let queued = self.busy_until.saturating_sub(now).min(self.spec.buffer);
        LaneReport {
            rtt: path + queued,
            min_rtt: path,
        }
    }
}

#[derive(Debug)]
struct Outcome {
    /// When the last ledger reached the consumer.
    done_at: Duration,
    lane_bytes: Vec<u64>,
    wire_bytes: u64,
    resent: u64,
    retried: u64,
    /// Times the session fell behind the live stream.
    lagged: u64,
}

struct Sim {
    sc: Scenario,
    rng: SmallRng,
    now: Duration,
    heap: BinaryHeap<Timed>,
    next_id: u64,
    // relay side
    ledgers: Vec<Arc<CompleteLedger>>,
    raw: Vec<Bytes>,
    first: u32,
    newest: u32,
    current: Option<(u32, Vec<Chunk>)>,
    joined: bool,
    live: VecDeque<LiveItem>,
    lagged: bool,
    sender: Sender,
    lanes: Vec<LaneState>,
    // subscriber side
    reasm: Reassembler,
    to_consume: VecDeque<u32>,
    consumer_busy: bool,
    delivered: Vec<u32>,
    done_at: Option<Duration>,
}

/// Incompressible, cheap bytes: a 64-bit mix of the seed, the ledger and the offset.
fn ledger_bytes(seed: u64, seq: u32, len: usize) -> Bytes {
    let mut v = Vec::with_capacity(len + 8);
    let mut x = seed ^ (u64::from(seq) << 32) ^ 0x9E37_79B9_7F4A_7C15;
    while v.len() < len {
        x ^= x >> 33;
        x = x.wrapping_mul(0xFF51_AFD7_ED55_8CCD);
        x ^= x >> 29;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    Bytes::from(v)
}

fn build_ledger(seq: u32, raw: &Bytes, chunk: usize) -> CompleteLedger {
    let chunks: Vec<Chunk> = raw
        .chunks(chunk)
        .enumerate()
        .map(|(i, c)| Chunk {
            header: ChunkHeader {
                seq,
                index: i as u32,
                raw_offset: (i * chunk) as u64,
                raw_len: c.len() as u32,
                codec: Codec::None,
            },
            payload: raw.slice(i * chunk..i * chunk + c.len()),
        })
        .collect();
    CompleteLedger {
        end: LedgerEnd {
            seq,
            chunk_count: chunks.len() as u32,
            raw_len: raw.len() as u64,
            checksum: ledger_relay_wire::checksum(raw),
            header_hash: [seq as u8; 32],
            previous_hash: [seq.wrapping_sub(1) as u8; 32],
            first_byte_ns: 0,
            last_byte_ns: 0,
        },
        chunks,
    }
}

impl Sim {
    fn new(sc: Scenario) -> Sim {
        let first = 1000;
        let raw: Vec<Bytes> = (0..sc.ledgers)
            .map(|i| ledger_bytes(sc.seed, first + i, sc.size))
            .collect();
        let ledgers = raw
            .iter()
            .enumerate()
            .map(|(i, r)| Arc::new(build_ledger(first + i as u32, r, sc.chunk)))
            .collect();
        let mut cfg = SenderConfig::new(first, sc.lanes.len() as u8);
        cfg.window = sc.window;
        cfg.chunk_size = sc.chunk as u32;
        let mut sender = Sender::new(cfg, Duration::ZERO);
        let lanes: Vec<LaneState> = sc
            .lanes
            .iter()
            .map(|spec| LaneState {
                spec: spec.clone(),
                alive: true,
                epoch: 0,
                busy_until: Duration::ZERO,
                delivered: 0,
                carried: 0,
            })
            .collect();
        for (i, l) in lanes.iter().enumerate() {
            if i > 0 {
                sender.handle_lane_up(i as u8, Duration::ZERO);
            }
            sender.handle_lane_report(i as u8, l.report(Duration::ZERO));
        }
        let limits = Limits {
            max_ledgers_in_flight: u32::from(sc.window),
            ..Limits::default()
        };
        let mut sim = Sim {
            rng: SmallRng::seed_from_u64(sc.seed),
            now: Duration::ZERO,
            heap: BinaryHeap::new(),
            next_id: 0,
            ledgers,
            raw,
            first,
            newest: if sc.backlog > 0 {
                first + sc.backlog - 1
            } else {
                0
            },
            current: None,
            joined: false,
            live: VecDeque::new(),
            lagged: false,
            sender,
            lanes,
            reasm: Reassembler::new(limits, first, STALL),
            to_consume: VecDeque::new(),
            consumer_busy: false,
            delivered: Vec::new(),
            done_at: None,
            sc,
        };
        // Live ledgers: one per cadence after the backlog, each emitted chunk by chunk.
        for k in sim.sc.backlog..sim.sc.ledgers {
            let seq = first + k;
            let start = sim.sc.cadence * (k - sim.sc.backlog + 1);
            let n = sim.ledgers[k as usize].chunks.len() as u32;
            for index in 0..n {
                let at = start + sim.sc.emit * index / n.max(1);
                sim.at(at, Ev::Publish { seq, index });
            }
            sim.at(start + sim.sc.emit, Ev::PublishEnd { seq });
        }
        sim.at(REPORT_EVERY, Ev::Report);
        for (lane, die, rejoin) in sim.sc.deaths.clone() {
            sim.at(die, Ev::Die { lane });
            if let Some(r) = rejoin {
                sim.at(r, Ev::Rejoin { lane });
            }
        }
        sim
    }

    fn at(&mut self, at: Duration, ev: Ev) {
        self.next_id += 1;
        self.heap.push(Timed {
            at,
            id: self.next_id,
            ev,
        });
    }

    fn d0(&self) -> Duration {
        self.lanes[0].spec.delay
    }

    fn ledger(&self, seq: u32) -> &Arc<CompleteLedger> {
        &self.ledgers[(seq - self.first) as usize]
    }

    fn load(&self, seq: u32) -> LoadResult {
        if seq < self.first {
            return LoadResult::NotHeld {
                oldest: self.first,
                newest: self.newest,
                lake: None,
            };
        }
        if self.newest != 0 && seq <= self.newest {
            return LoadResult::Complete(self.ledger(seq).clone());
        }
        match &self.current {
            Some((s, chunks)) if *s == seq => LoadResult::InProgress(chunks.clone()),
            _ => LoadResult::NotYet,
        }
    }

    fn broadcast(&mut self, item: LiveItem) {
        if !self.joined || self.lagged {
            return;
        }
        if self.live.len() >= self.sc.live_capacity {
            self.live.clear();
            self.lagged = true;
            return;
        }
        self.live.push_back(item);
    }

    fn transmit(&mut self, lane: usize, stream: StreamId, unit: Unit) {
        let now = self.now;
        let loss = match self.sc.loss_burst {
            Some((l, from, to, p)) if l == lane && now >= from && now < to => p,
            _ => self.lanes[lane].spec.loss,
        };
        let lost = loss > 0.0 && self.rng.gen_bool(loss);
        let l = &mut self.lanes[lane];
        let len = unit.wire_len();
        let slow = match self.sc.slow_start {
            Some((s, bytes)) if s == lane => len.min(bytes.saturating_sub(l.carried)),
            _ => 0,
        };
        l.carried += len;
        let mut link = Duration::from_secs_f64((len + 2 * slow) as f64 / l.spec.rate);
        let mut extra = Duration::ZERO;
        if lost {
            // QUIC resends the lost packets (about a tenth of the stream) after a round trip.
            link += link / 10;
            extra = l.spec.delay * 2;
        }
        let start = now.max(l.busy_until);
        l.busy_until = start + link;
        let jitter = l.spec.jitter.mul_f64(self.rng.gen::<f64>());
        let arrive = l.busy_until + l.spec.delay + extra + jitter;
        let mut acked = arrive + l.spec.delay;
        if len <= PACKET {
            acked += self.sc.ack_delay;
        }
        let epoch = l.epoch;
        self.at(arrive, Ev::Arrive { lane, epoch, unit });
        self.at(
            acked,
            Ev::StreamAcked {
                lane,
                epoch,
                stream,
                len,
            },
        );
    }

    /// The shell: carries out everything the sender asks until it asks nothing more.
    fn pump(&mut self) -> Result<(), String> {
        loop {
            let mut busy = false;
            while let Some(e) = self.sender.poll_event() {
                busy = true;
                match e {
                    Event::Load(seq) => self.at(self.now + LOAD_TIME, Ev::Loaded { seq }),
                    Event::JoinLive => {
                        self.joined = true;
                        self.lagged = false;
                        self.live.clear();
                        self.sender.handle_joined(self.current.clone(), self.newest);
                    }
                    Event::LeaveLive => {
                        self.joined = false;
                        self.live.clear();
                    }
                    Event::Heartbeat => {
                        let newest = self.newest;
                        self.at(self.now + self.d0(), Ev::Heartbeat { newest });
                    }
                    Event::Close(reason) => return Err(format!("session closed: {reason}")),
                }
            }
            while self.sender.wants_live() {
                let item = if self.lagged {
                    self.lagged = false;
                    self.joined = false;
                    LiveItem::Lagged
                } else if let Some(item) = self.live.pop_front() {
                    item
                } else {
                    break;
                };
                busy = true;
                self.sender.handle_live(item);
            }
            while let Some(t) = self.sender.poll_transmit(self.now) {
                busy = true;
                self.transmit(usize::from(t.lane), t.stream, t.unit);
            }
            if !busy {
                return Ok(());
            }
        }
    }

    fn subscriber_took(&mut self) -> Result<(), String> {
        while let Some(l) = self.reasm.poll_ledger() {
            let i = (l.seq - self.first) as usize;
            if l.data != self.raw[i] {
                return Err(format!("ledger {} delivered with other bytes", l.seq));
            }
            self.to_consume.push_back(l.seq);
        }
        while let Some(m) = self.reasm.poll_missing() {
            let r = Resend {
                seq: m.seq,
                whole: m.whole,
                indices: m.indices,
            };
            self.at(self.now + self.d0(), Ev::ToRelay(Frame::Resend(r)));
        }
        if !self.consumer_busy {
            self.consume();
        }
        Ok(())
    }

    fn consume(&mut self) {
        let Some(seq) = self.to_consume.pop_front() else {
            self.consumer_busy = false;
            return;
        };
        self.delivered.push(seq);
        if self.delivered.len() == self.sc.ledgers as usize {
            self.done_at = Some(self.now);
        }
        self.at(self.now + self.d0(), Ev::ToRelay(Frame::Ack(seq)));
        if !self.sc.consume.is_zero() {
            self.consumer_busy = true;
            self.at(self.now + self.sc.consume, Ev::Consume);
        } else {
            self.consume();
        }
    }

    fn apply(&mut self, ev: Ev) -> Result<(), String> {
        let now = self.now;
        match ev {
            Ev::Publish { seq, index } => {
                let c = self.ledger(seq).chunks[index as usize].clone();
                match &mut self.current {
                    Some((s, chunks)) if *s == seq => chunks.push(c.clone()),
                    _ => self.current = Some((seq, vec![c.clone()])),
                }
                self.broadcast(LiveItem::Chunk(c));
            }
            Ev::PublishEnd { seq } => {
                self.current = None;
                self.newest = seq;
                let l = self.ledger(seq).clone();
                self.broadcast(LiveItem::End(l));
            }
            Ev::Arrive { lane, epoch, unit } => {
                if epoch != self.lanes[lane].epoch {
                    return Ok(()); // the lane died with it on the wire
                }
                let r = match &unit {
                    Unit::Chunk(c) => self.reasm.handle_chunk(c, now),
                    Unit::End(e) => self.reasm.handle_end(e, now),
                };
                r.map_err(|e| format!("reassembler: {e}"))?;
                self.subscriber_took()?;
            }
            Ev::StreamAcked {
                lane,
                epoch,
                stream,
                len,
            } => {
                if epoch == self.lanes[lane].epoch {
                    self.lanes[lane].delivered += len;
                    self.sender.handle_stream_done(stream, true, now);
                }
            }
            Ev::ToRelay(f) => self.sender.handle_frame(f, now),
            Ev::Heartbeat { newest } => {
                self.reasm.handle_heartbeat(newest, now);
                self.subscriber_took()?;
            }
            Ev::Die { lane } => {
                let l = &mut self.lanes[lane];
                l.alive = false;
                l.epoch += 1;
                l.busy_until = now;
                self.sender.handle_lane_down(lane as u8, "killed", now);
            }
            Ev::Rejoin { lane } => {
                let l = &mut self.lanes[lane];
                l.alive = true;
                l.busy_until = now;
                let report = l.report(now);
                self.sender.handle_lane_up(lane as u8, now);
                self.sender.handle_lane_report(lane as u8, report);
            }
            Ev::Loaded { seq } => {
                let r = self.load(seq);
                self.sender.handle_loaded(seq, r, now);
            }
            Ev::Consume => self.consume(),
            Ev::Report => {
                for (i, l) in self.lanes.iter().enumerate().filter(|(_, l)| l.alive) {
                    self.sender.handle_lane_report(i as u8, l.report(now));
                }
                self.at(now + REPORT_EVERY, Ev::Report);
            }
        }
        Ok(())
    }

    fn run(mut self, limit: Duration) -> Result<Outcome, String> {
        loop {
            self.pump()?;
            if let Some(done_at) = self.done_at {
                let st = self.sender.stats();
                let expected: Vec<u32> = (0..self.sc.ledgers).map(|i| self.first + i).collect();
                if self.delivered != expected {
                    return Err("ledgers out of order or repeated".into());
                }
                return Ok(Outcome {
                    done_at,
                    lane_bytes: self.lanes.iter().map(|l| l.delivered).collect(),
                    wire_bytes: self.ledgers.iter().map(|l| wire_len(l)).sum(),
                    resent: st.resent,
                    retried: st.retried,
                    lagged: st.lagged,
                });
            }
            let mut next = self.heap.peek().map(|t| t.at);
            for t in [self.sender.poll_timeout(), self.reasm.poll_timeout()]
                .into_iter()
                .flatten()
            {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
            let Some(next) = next else {
                return Err("stuck: nothing left to happen".into());
            };
            if next > limit {
                return Err(format!(
                    "not done by {limit:?}: {} of {} ledgers delivered, sender at {}, acked {}",
                    self.delivered.len(),
                    self.sc.ledgers,
                    self.sender.next_seq(),
                    self.sender.acked()
                ));
            }
            // `SIM_TRACE=1` prints the session every 20 ms of virtual time.
            if std::env::var_os("SIM_TRACE").is_some() {
                let b = |t: Duration| t.as_millis() / 20;
                if b(next) != b(self.now) {
                    let lanes: Vec<String> = self
                        .sender
                        .lanes(self.now)
                        .iter()
                        .map(|l| {
                            format!(
                                "{}:{}k/{}k@{:.1}",
                                l.lane,
                                l.outstanding >> 10,
                                l.target >> 10,
                                l.rate / 1e6
                            )
                        })
                        .collect();
                    eprintln!(
                        "{:>5}ms next={} acked={} queued={} delivered={} reasm_next={} {}",
                        self.now.as_millis(),
                        self.sender.next_seq(),
                        self.sender.acked(),
                        self.sender.queued(),
                        self.delivered.len(),
                        self.reasm.next_seq(),
                        lanes.join(" ")
                    );
                }
            }
            self.now = self.now.max(next);
            while self.heap.peek().is_some_and(|t| t.at <= self.now) {
                let t = self.heap.pop().expect("peeked");
                self.apply(t.ev)?;
            }
            if self.sender.poll_timeout().is_some_and(|t| t <= self.now) {
                self.sender.handle_timeout(self.now);
            }
            if self.reasm.poll_timeout().is_some_and(|t| t <= self.now) {
                self.reasm.handle_timeout(self.now);
                self.subscriber_took()?;
            }
        }
    }
}

/// Wire bytes of a ledger: its chunk frames and its end frame.
fn wire_len(l: &CompleteLedger) -> u64 {
    l.chunks
        .iter()
        .map(|c| Unit::Chunk(c.clone()).wire_len())
        .sum::<u64>()
        + Unit::End(l.end).wire_len()
}

/// The fluid bound of a transfer of `bytes` that can start at once: the time at which the
/// lanes, each at its rate while it is up, have carried them all, plus one round trip.
fn fluid_bound(sc: &Scenario, bytes: u64) -> Duration {
    let rtt = sc.rtt();
    let mut carried = 0.0;
    let mut t = Duration::ZERO;
    while carried < bytes as f64 {
        let rate: f64 = sc
            .lanes
            .iter()
            .enumerate()
            .filter(|(i, _)| lane_up(sc, *i, t))
            .map(|(_, l)| l.rate)
            .sum();
        carried += rate * STEP.as_secs_f64();
        t += STEP;
    }
    t + rtt
}

/// The step of the integrals over lanes' up time.
const STEP: Duration = Duration::from_micros(100);

/// Whether `lane` is up at `t` (it is unless one of its deaths covers `t`).
fn lane_up(sc: &Scenario, lane: usize, t: Duration) -> bool {
    sc.deaths
        .iter()
        .filter(|(l, _, _)| *l == lane)
        .all(|(_, die, rejoin)| t < *die || rejoin.is_some_and(|r| t >= r))
}

/// What `lane` could carry until `until`: its rate times the time it was up.
fn lane_capacity(sc: &Scenario, lane: usize, until: Duration) -> f64 {
    let mut up = Duration::ZERO;
    let mut t = Duration::ZERO;
    while t < until {
        if lane_up(sc, lane, t) {
            up += STEP;
        }
        t += STEP;
    }
    sc.lanes[lane].rate * up.as_secs_f64()
}

/// Round trips a transfer may spend finding the lanes' rates, beyond the fluid bound: a lane
/// starts with one chunk in flight and doubles about every round trip, as a transport's
/// congestion window does in slow start.
const RAMP_RTTS: u32 = 10;

/// How close each lane's share of the bytes must come to its share of the capacity.
#[derive(Debug, Clone, Copy)]
enum Shares {
    /// Within 5%.
    Within5,
    /// Within 5%, plus [`startup_slack`]: for transfers too short for the 5% alone.
    Within5AfterStartup,
}

/// The checks every bulk scenario makes: runs `sc`, then checks that the whole transfer takes at
/// most `1 + tolerance` times the fluid bound plus its start-up time ([`Scenario::startup`]),
/// and that each lane carried its share of the bytes ([`check_shares`]); returns the outcome.
/// (Every ledger complete, in order and once is checked by the run itself.)
fn check(sc: Scenario, tolerance: f64, shares: Shares) -> Outcome {
    let o = Sim::new(sc.clone()).run(Duration::from_secs(600)).unwrap();
    let bound = fluid_bound(&sc, o.wire_bytes);
    let allowed = bound.mul_f64(1.0 + tolerance) + sc.startup() + sc.first_publish();
    let ratio = o.done_at.as_secs_f64() / bound.as_secs_f64();
    assert!(
        o.done_at <= allowed,
        "whole transfer {:?} is {ratio:.3}x the fluid bound {bound:?} (allowed {allowed:?}): {o:?}",
        o.done_at
    );
    let slack = match shares {
        Shares::Within5 => vec![0.0; sc.lanes.len()],
        Shares::Within5AfterStartup => startup_slack(&sc, &o),
    };
    check_shares(&sc, &o, &slack);
    o
}

/// Each lane's share of the bytes is within 5% (plus `slack[i]` of the total bytes for lane `i`)
/// of its share of the capacity: its rate times the time it was up until the transfer ended
/// (for lanes that never die, its share of the summed rates). Bytes count when their stream is
/// acknowledged on the lane's live connection, so what a lane had in flight when it died counts
/// for the lane that carried it again.
fn check_shares(sc: &Scenario, o: &Outcome, slack: &[f64]) {
    let total: u64 = o.lane_bytes.iter().sum();
    let caps: Vec<f64> = (0..sc.lanes.len())
        .map(|i| lane_capacity(sc, i, o.done_at))
        .collect();
    let cap: f64 = caps.iter().sum();
    for (i, (c, bytes)) in caps.iter().zip(&o.lane_bytes).enumerate() {
        let share = *bytes as f64 / total as f64;
        let want = c / cap;
        let allowed = 0.05 * want + slack[i];
        assert!(
            (share - want).abs() <= allowed,
            "lane {i} carried {share:.4} of the bytes, its capacity share is {want:.4} \
             (allowed {allowed:.4}): {:?}",
            o.lane_bytes
        );
    }
}

/// Per lane, the part of the bytes it may be off by beyond the 5% in a short transfer: one chunk
/// (a lane carries whole chunks, and a slow one is left out of the last), plus what it carries
/// in the start-up time `check` allows beyond the fluid bound ([`Scenario::startup`]), in which
/// the lanes' rates are still being found.
fn startup_slack(sc: &Scenario, o: &Outcome) -> Vec<f64> {
    let startup = sc.startup().as_secs_f64();
    sc.lanes
        .iter()
        .map(|l| (sc.chunk as f64 + l.rate * startup) / o.wire_bytes as f64)
        .collect()
}

/// Four equal lanes of 100 Mbit/s, the set-up.
#[test]
fn equal_lanes_share_evenly_and_finish_at_the_fluid_bound() {
    let lanes = vec![lane(12.5); 4];
    let o = check(Scenario::bulk(lanes), 0.02, Shares::Within5);
    assert_eq!(o.resent, 0, "no stall: nothing asked again");
}

#[test]
fn eight_equal_lanes() {
    let lanes = vec![lane(12.5); 8];
    check(Scenario::bulk(lanes), 0.03, Shares::Within5);
}

/// The bench's catch-up at eight lanes (`ledger-bench run --preset lanes --only catch-up-l8`:
/// 100 Mbit/s per lane, one ledger in flight) with what the other scenarios leave out: lane 1's
/// first `slow` bytes go at a third of its rate (a slow start), and a stream of one packet is
/// acknowledged only when the subscriber's delayed-ACK timer fires, 25 ms on.
fn catch_up_with_delayed_acks(slow: u64) -> Scenario {
    let lanes = vec![
        LaneSpec {
            delay: Duration::from_micros(100),
            ..lane(12.5)
        };
        8
    ];
    Scenario {
        ack_delay: 25 * MS,
        slow_start: Some((1, slow)),
        window: 1,
        ..Scenario::bulk(lanes)
    }
}

/// Lane 1's first chunk goes slowly. A lane whose first sample read low was left the ledgers'
/// one-packet ends, measured from those at the ACK timer's pace (100 bytes per 27 ms), and its
/// rate fell by a quarter with every such sample, to 5 KB/s: on the bench, two lanes of eight
/// carried 0.27 MB of 201 and the transfer ran at 3.96x one lane.
#[test]
fn eight_lanes_whose_short_streams_wait_for_delayed_acks() {
    // Window 1 costs 2.4% against the fluid bound here with every lane at its rate from the
    // start (a round trip and a delayed ACK per ledger), and the slow lane's first chunk 42 ms.
    check(
        catch_up_with_delayed_acks(256 << 10),
        0.05,
        Shares::Within5AfterStartup,
    );
}

/// Lane 1's first two chunks go slowly, so the second sample confirms the first and the lane's
/// rate stops growing at a third of its path's: it is left out until its rate is measured
/// again, [`PROBE_AFTER`] on.
#[test]
fn a_lane_measured_low_twice_is_measured_again() {
    let sc = catch_up_with_delayed_acks(512 << 10);
    let o = Sim::new(sc.clone()).run(Duration::from_secs(600)).unwrap();
    let bound = fluid_bound(&sc, o.wire_bytes);
    // Two slow chunks (84 ms more than at the lane's rate) and a probe's wait.
    let allowed = bound.mul_f64(1.05) + PROBE_AFTER;
    assert!(
        o.done_at <= allowed,
        "{:?} against {allowed:?}: {o:?}",
        o.done_at
    );
    let mean = o.lane_bytes.iter().sum::<u64>() / 8;
    assert!(o.lane_bytes[1] > mean * 3 / 4, "lane 1 left out: {o:?}");
}

#[test]
fn unequal_lanes_carry_in_proportion_to_their_rates() {
    let lanes = vec![lane(5.0), lane(10.0), lane(15.0), lane(20.0)];
    check(Scenario::bulk(lanes), 0.03, Shares::Within5);
}

#[test]
fn one_lane_at_half_the_others_still_fills_the_sum_of_caps() {
    // The target: the total reaches at least 90% of the sum of the caps.
    let lanes = vec![lane(12.5), lane(12.5), lane(12.5), lane(6.25)];
    check(Scenario::bulk(lanes), 0.03, Shares::Within5);
}

#[test]
fn a_lane_at_a_tenth_of_the_others_helps_and_holds_nothing_back() {
    let lanes = vec![lane(12.5), lane(12.5), lane(12.5), lane(1.25)];
    check(Scenario::bulk(lanes), 0.03, Shares::Within5);
}

/// The live rows of the bench: the same lanes as the bulk scenarios above, but the
/// session meets the source while it publishes (faster than the lanes carry) and joins the live
/// stream; if it falls behind by more than the live channel holds, it reads the rest from the
/// store as the source writes it. These passed when they were written, before any change to
/// the sender: its striping and window leave no lane idle or unbalanced live either, so the
/// live rows' idle time in the bench is not the sender's.
#[test]
fn live_four_equal_lanes_share_evenly_and_finish_at_the_fluid_bound() {
    // The live channel (512 items) holds what the session is behind by: it stays live.
    let o = check(Scenario::live(vec![lane(12.5); 4]), 0.02, Shares::Within5);
    assert_eq!(o.lagged, 0, "{o:?}");
    assert_eq!(o.resent, 0, "no stall: nothing asked again");
}

#[test]
fn live_eight_equal_lanes() {
    check(Scenario::live(vec![lane(12.5); 8]), 0.03, Shares::Within5);
}

#[test]
fn live_one_lane_at_half_the_others_still_fills_the_sum_of_caps() {
    // Behind by more than the live channel holds: the rest comes from the store.
    let lanes = vec![lane(6.25), lane(12.5), lane(12.5), lane(12.5)];
    let o = check(Scenario::live(lanes), 0.03, Shares::Within5);
    assert!(
        o.lagged > 0,
        "the session fell behind the live stream: {o:?}"
    );
}

/// As the bench meets it: the subscriber's handshakes take long enough that the source has
/// published ten ledgers when the session starts, so it reads them from the store and then
/// joins the live stream; lanes with the veth's longest delay.
#[test]
fn live_joined_after_a_backlog_with_one_lane_at_half() {
    let lanes = vec![lane(6.25), lane(12.5), lane(12.5), lane(12.5)];
    let mut sc = Scenario::live(lanes);
    sc.backlog = 10;
    for l in &mut sc.lanes {
        l.delay = MS;
    }
    check(sc, 0.03, Shares::Within5);
}

#[test]
fn a_lane_dying_mid_ledger_and_rejoining_costs_only_its_capacity() {
    let lanes = vec![lane(12.5); 4];
    let mut sc = Scenario::bulk(lanes);
    sc.deaths = vec![
        (
            2,
            Duration::from_millis(1003),
            Some(Duration::from_millis(2500)),
        ),
        (3, Duration::from_millis(2001), None),
    ];
    // Shares over the time each lane was up.
    let o = check(sc, 0.03, Shares::Within5);
    assert!(o.retried > 0, "the dead lanes' streams went again: {o:?}");
}

#[test]
fn a_loss_burst_on_one_lane_costs_little() {
    let mut lanes = vec![lane(12.5); 4];
    lanes[1].jitter = Duration::from_micros(500);
    let mut sc = Scenario::bulk(lanes);
    sc.loss_burst = Some((
        1,
        Duration::from_millis(500),
        Duration::from_millis(1500),
        0.5,
    ));
    // The lost packets' resends take link time the fluid bound does not count.
    check(sc, 0.05, Shares::Within5);
}

#[test]
fn a_slow_consumer_is_paced_by_the_window_and_loses_nothing() {
    let lanes = vec![lane(12.5); 4];
    let mut sc = Scenario::bulk(lanes);
    sc.ledgers = 24;
    sc.backlog = 24;
    sc.consume = Duration::from_millis(200);
    let o = Sim::new(sc.clone()).run(Duration::from_secs(60)).unwrap();
    // The consumer is the bottleneck: 24 ledgers at 200 ms each, plus the first ledger's
    // transfer.
    let floor = sc.consume * (sc.ledgers - 1);
    assert!(
        o.done_at >= floor && o.done_at < floor + Duration::from_millis(400),
        "{o:?}"
    );
}

#[test]
fn catching_up_from_the_store_joins_live_with_no_gap() {
    // 48 ledgers in the store, then 16 more published live every 600 ms while catching up.
    let lanes = vec![lane(12.5); 4];
    let mut sc = Scenario::bulk(lanes);
    sc.ledgers = 64;
    sc.backlog = 48;
    let o = Sim::new(sc.clone()).run(Duration::from_secs(60)).unwrap();
    // The last ledger is published at 16 x 600 ms + 8 ms; it then needs its own transfer time
    // over the four lanes (2 MiB at 50 MB/s, ~42 ms) and a round trip.
    let last_published = sc.cadence * 16 + sc.emit;
    let one_ledger = Duration::from_secs_f64(o.wire_bytes as f64 / 64.0 / (50.0 * MBPS));
    assert!(
        o.done_at <= last_published + one_ledger + Duration::from_millis(10),
        "{o:?}"
    );
}

#[test]
fn live_ledgers_stream_while_the_source_writes_them() {
    // 14.5 MiB ledgers emitted over 8 ms, four lanes of 5 Gbit/s: each ledger is delivered
    // about its transfer time after the source's last byte, not after a store-and-forward.
    let lanes = vec![lane(625.0); 4];
    let mut sc = Scenario::bulk(lanes);
    sc.ledgers = 6;
    sc.backlog = 0;
    sc.size = 14_500 << 10;
    let o = Sim::new(sc.clone()).run(Duration::from_secs(60)).unwrap();
    let last_published = sc.cadence * 6 + sc.emit;
    // 14.5 MiB over 2.5 GB/s is ~6 ms, most of it overlapped with the 8 ms emit window.
    assert!(
        o.done_at <= last_published + Duration::from_millis(4),
        "{o:?}"
    );
}

/// A scenario `random_lane_sets` found, run on its own: equal delays, 24 MiB.
fn short_transfer(rates: &[f64], delay_us: u64, chunk_kib: usize) -> Scenario {
    let lanes: Vec<LaneSpec> = rates
        .iter()
        .map(|r| LaneSpec {
            rate: r * MBPS,
            delay: Duration::from_micros(delay_us),
            jitter: Duration::ZERO,
            loss: 0.0,
            buffer: Duration::ZERO,
        })
        .collect();
    let mut sc = Scenario::bulk(lanes);
    sc.ledgers = 24;
    sc.backlog = 24;
    sc.size = 1 << 20;
    sc.chunk = chunk_kib << 10;
    sc
}

/// One lane whose round trip is longer than its two chunks' time: with only two chunks in
/// flight it idled after each acknowledgement and ran 18% below its rate (1.181x the bound).
#[test]
fn one_lane_keeps_its_round_trip_and_a_chunk_in_flight() {
    let sc = short_transfer(&[23.483915780046456], 4702, 154);
    let o = check(sc.clone(), 0.02, Shares::Within5);
    let ratio = o.done_at.as_secs_f64() / fluid_bound(&sc, o.wire_bytes).as_secs_f64();
    assert!(ratio < 1.02, "{ratio:.3}x the fluid bound: {o:?}");
}

/// A lane at 1 MB/s beside three of 13-40 MB/s, 342 KiB chunks: while unmeasured it took a
/// short last chunk and then a whole one beside it, held their ledgers (and the window) for
/// two chunk times, and the transfer took 3.09x the fluid bound; a 12 MB/s lane measured
/// from one short stream at 2 MB/s was left idle (2.02x with lanes of 15, 4.4, 29 and 1).
#[test]
fn a_lane_not_yet_measured_holds_one_chunk() {
    let sc = short_transfer(
        &[
            13.050393642219685,
            33.968623097497925,
            39.961752745045395,
            1.0,
        ],
        100,
        342,
    );
    let o = check(sc, 0.05, Shares::Within5AfterStartup);
    assert!(
        o.lane_bytes[3] <= 360_000,
        "one chunk on the slow lane: {o:?}"
    );
    let sc = short_transfer(
        &[
            14.952388708941093,
            4.4470649910690385,
            29.138655771043208,
            1.0,
        ],
        100,
        342,
    );
    check(sc, 0.05, Shares::Within5AfterStartup);
    let sc = short_transfer(
        &[
            11.855172656919796,
            8.945600955778707,
            25.7620816411505,
            39.89692624338318,
            10.566289645973026,
        ],
        2496,
        253,
    );
    check(sc, 0.05, Shares::Within5AfterStartup);
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("SIM_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(24),
        failure_persistence: None,
        // Fixed, so a run of the suite is repeatable; `SIM_SEED=N` (or `random`) with
        // `SIM_CASES` explores further.
        rng_seed: std::env::var("SIM_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(RngSeed::Fixed(54)),
        ..ProptestConfig::default()
    })]

    /// Random lane sets: every ledger arrives in order, and the transfer stays near the bound.
    #[test]
    fn random_lane_sets(
        rates in proptest::collection::vec(1.0f64..40.0, 1..6),
        delay_us in 100u64..5000,
        chunk_kib in 16usize..512,
        seed in 0u64..1000,
    ) {
        let mut sc = short_transfer(&rates, delay_us, chunk_kib);
        sc.seed = seed;
        // These transfers are short (24 MiB, about a second) over lanes as slow as 1 MB/s with
        // chunks up to 512 KiB, too short for the 5% alone: a slow lane's whole share can be
        // two chunks, and the start-up, while rates are found, is a large part of the whole.
        // Until every lane has delivered its first chunk, an unmeasured one counts at
        // `INITIAL_RATE`, and a measured slow lane may wait for it rather than start a chunk
        // it would finish later (seen: a 4 MB/s lane idle for 80 ms beside three 1 MB/s lanes
        // on their first 123 KiB chunk); fast lanes ramp for several round trips. So each lane
        // may also be off by the bytes of `startup_slack`.
        //
        // Known limit, open: `SIM_SEED=2 SIM_CASES=1000` and `SIM_SEED=4 SIM_CASES=1000` find
        // sets with two or three 1 MB/s lanes and ~510 KiB chunks (half a second per chunk,
        // as long as the whole transfer), where a fast lane measured only from short units
        // is left idle and the transfer takes 2-2.7x its bound. Seeds 1, 3, 5 and 6 pass
        // 1000 cases each.
        check(sc, 0.05, Shares::Within5AfterStartup);
    }
}

mod bufferbloat;
