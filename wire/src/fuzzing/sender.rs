//! The sender's fuzz body: the sans-IO [`Sender`] driven by a fuzzer's operations, its outputs
//! checked against the session's rules.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use crate::frame::{Frame, Resend};
use crate::sender::{
    CompleteLedger, ControlError, Event, LaneReport, LiveItem, LoadResult, SenderConfig, StreamId,
    Unit,
};
use crate::Sender;

const FIRST: u32 = 50;
const LANES: u8 = 3;
const WINDOW: u16 = 4;

/// The relay's session state machine: bytes become a sequence of inputs (lanes joining and
/// dying, acks and resends of any ledger, streams ending, loads answered in every way, live
/// items, joins, timeouts, control errors), and after each the outputs are checked:
/// - no unit of a ledger outside `[first, acked + window]`, and no two copies of one unit on
///   the wire at once;
/// - every stream goes on a lane that is up;
/// - what waits for a lane stays bounded by the window (resends included);
/// - after `Close`, nothing more comes out.
pub fn sender(data: &[u8]) {
    let mut h = Harness::new();
    let mut bytes = data.iter().copied();
    while let Some(op) = bytes.next() {
        let arg = bytes.next().unwrap_or(0);
        h.step(op, arg, &mut || bytes.next().unwrap_or(0));
        h.check_outputs();
    }
}

/// A ledger of 1 to 4 chunks of 100 bytes, a function of its sequence.
fn ledger(seq: u32) -> Arc<CompleteLedger> {
    CompleteLedger::filled(seq, 1 + seq % 4, 100)
}

/// A ledger of the session's first 16, picked by `arg`.
fn pick(arg: u8) -> u32 {
    FIRST.wrapping_add(u32::from(arg % 16))
}

/// The sender and what the harness knows of its connections: lanes up, streams in flight (lane
/// and unit), loads asked for, whether it asked to join the live stream, whether it closed.
struct Harness {
    s: Sender,
    now: Duration,
    up: HashSet<u8>,
    flights: HashMap<StreamId, (u8, (u32, u32))>,
    order: Vec<StreamId>,
    loads: Vec<u32>,
    joining: bool,
    closed: bool,
}

impl Harness {
    fn new() -> Harness {
        let mut cfg = SenderConfig::new(FIRST, LANES);
        cfg.window = WINDOW;
        cfg.chunk_size = 100;
        cfg.live_queue = 16;
        cfg.catch_up_bytes = 1000;
        Harness {
            s: Sender::new(cfg, Duration::ZERO),
            now: Duration::ZERO,
            up: [0].into_iter().collect(),
            flights: HashMap::new(),
            order: Vec::new(),
            loads: Vec::new(),
            joining: false,
            closed: false,
        }
    }

    /// One operation: `op` picks it, `arg` and `next` give its parameters.
    fn step(&mut self, op: u8, arg: u8, next: &mut dyn FnMut() -> u8) {
        let now = self.now;
        match op % 12 {
            0 => {
                // A rejoin fails what the old connection carried, as a death does.
                let lane = arg % LANES;
                self.s.handle_lane_up(lane, now);
                self.up.insert(lane);
                self.flights.retain(|_, (l, _)| *l != lane);
            }
            1 => {
                let lane = arg % LANES;
                self.s.handle_lane_down(lane, "fuzz", now);
                self.up.remove(&lane);
                self.flights.retain(|_, (l, _)| *l != lane);
            }
            2 => self.s.handle_frame(Frame::Ack(pick(arg)), now),
            3 => self.resend(arg, next),
            4 => {
                if !self.order.is_empty() {
                    let id = self.order.remove(usize::from(arg) % self.order.len());
                    self.flights.remove(&id);
                    self.s.handle_stream_done(id, arg & 1 == 0, now);
                }
            }
            5 => self.loaded(arg, next),
            6 => self.joined(arg, next),
            7 => self.live(arg, next),
            8 => {
                self.now += Duration::from_millis(u64::from(arg) * 4);
                self.s.handle_timeout(self.now);
            }
            9 => self.s.handle_lane_report(
                arg % LANES,
                LaneReport {
                    rtt: Duration::from_micros(u64::from(arg) * 50),
                    min_rtt: Duration::from_micros(u64::from(arg % 8) * 50),
                },
            ),
            10 => self
                .s
                .handle_control_error(ControlError::BadFrame("fuzz".into())),
            _ => self.s.handle_frame(Frame::LaneAccept(arg), now),
        }
    }

    fn resend(&mut self, arg: u8, next: &mut dyn FnMut() -> u8) {
        let n = usize::from(next() % 6);
        let indices = (0..n).map(|_| u32::from(next() % 6)).collect();
        let r = Resend {
            seq: pick(arg),
            whole: arg & 0x80 != 0,
            indices,
        };
        self.s.handle_frame(Frame::Resend(r), self.now);
    }

    /// Answers one of the loads asked for, in any of the ways a ring or lake can.
    fn loaded(&mut self, arg: u8, next: &mut dyn FnMut() -> u8) {
        if self.loads.is_empty() {
            return;
        }
        let seq = self.loads.remove(usize::from(arg) % self.loads.len());
        let fail = || "fuzz".to_string();
        let r = match next() % 8 {
            0 | 1 => LoadResult::Complete(ledger(seq)),
            2 => LoadResult::InProgress(ledger(seq).chunks[..1].to_vec()),
            3 => LoadResult::NotYet,
            4 => LoadResult::NotHeld {
                oldest: FIRST,
                newest: FIRST + 20,
                lake: (arg & 1 == 1).then_some((1, FIRST + 5)),
            },
            5 => LoadResult::Corrupt { detail: fail() },
            6 => LoadResult::Failed { detail: fail() },
            _ => LoadResult::Unavailable { detail: fail() },
        };
        self.s.handle_loaded(seq, r, self.now);
    }

    fn joined(&mut self, arg: u8, next: &mut dyn FnMut() -> u8) {
        if !self.joining {
            return;
        }
        self.joining = false;
        let seq = pick(arg);
        let current = (arg & 1 == 0).then(|| (seq, ledger(seq).chunks[..1].to_vec()));
        self.s.handle_joined(current, pick(next()));
    }

    fn live(&mut self, arg: u8, next: &mut dyn FnMut() -> u8) {
        let seq = pick(arg);
        let item = match next() % 5 {
            0 => LiveItem::Chunk(ledger(seq).chunks[0].clone()),
            1 => LiveItem::End(ledger(seq)),
            2 => LiveItem::Abort(seq),
            3 => LiveItem::Lagged,
            _ => LiveItem::Closed,
        };
        if self.s.wants_live() {
            self.s.handle_live(item);
        }
    }

    /// Takes the sender's outputs and checks their invariants: nothing after close; streams
    /// only on lanes that are up, inside the session and its window, never two copies of a
    /// unit at once; what waits bounded by the window.
    fn check_outputs(&mut self) {
        while let Some(e) = self.s.poll_event() {
            assert!(!self.closed, "output after close: {e:?}");
            match e {
                Event::Load(seq) => self.loads.push(seq),
                Event::JoinLive => self.joining = true,
                Event::LeaveLive => self.joining = false,
                Event::Heartbeat => {}
                Event::Close(_) => self.closed = true,
            }
        }
        while let Some(t) = self.s.poll_transmit(self.now) {
            assert!(!self.closed, "transmit after close");
            assert!(
                self.up.contains(&t.lane),
                "stream on lane {} which is down",
                t.lane
            );
            let key = match &t.unit {
                Unit::Chunk(c) => (c.header.seq, c.header.index),
                Unit::End(e) => (e.seq, u32::MAX),
            };
            let acked = self.s.acked();
            assert!(key.0 >= FIRST, "{key:?} before the session's first ledger");
            assert!(
                u64::from(key.0) <= u64::from(acked) + u64::from(WINDOW),
                "{key:?} beyond the window (acked {acked})"
            );
            assert!(
                !self.flights.values().any(|(_, k)| *k == key),
                "two copies of {key:?} on the wire"
            );
            self.flights.insert(t.stream, (t.lane, key));
            self.order.push(t.stream);
        }
        // Each ledger has at most 4 chunks and its end: the window bounds what waits.
        let queued = self.s.queued();
        assert!(queued <= usize::from(WINDOW + 1) * 5, "{queued} units wait");
        assert_eq!(self.s.is_closed(), self.closed);
    }
}
