//! Per-lane accounting and the striping rule: how much each lane has in flight, how fast it
//! delivers, and which lane gets the next stream.
//!
//! Streams are bound to a lane late: a unit waits in the session's queue until some lane has
//! room, that is, less in flight than it delivers in one round trip of its path (the smallest
//! seen, not the smoothed one that counts the bottleneck's queue) plus
//! [`super::SenderConfig::queue_target`]. Each lane then pulls work at its own pace, so equal
//! lanes carry equal shares and a slow lane carries less without holding anything back. Binding
//! every unit to a lane as soon as it is ready (the relay's first design) committed a whole
//! window of ledgers to lanes on rate estimates that were still noisy, and under a per-flow
//! cap left lanes unevenly loaded and idle at the end of each window.

use std::time::Duration;

/// A lane's rate before it has been measured: lanes start equal and measurement takes over
/// after the first [`RATE_SAMPLE`] of busy time.
pub const INITIAL_RATE: f64 = 100e6;

/// Busy time a rate sample is taken over: long enough to average over several streams, short
/// enough to follow a lane whose path changes.
pub const RATE_SAMPLE: Duration = Duration::from_millis(5);

/// Weight of a new rate sample below the current estimate in the moving average. A sample
/// above it is taken whole: a lane's rate is measured with no more in flight than its target,
/// which is set from its rate, so an underestimate only grows by the ratio of the target's
/// horizon to the round trip per sample, and averaging that growth as well made a lane of
/// 36 MB/s with a 7 ms round trip take half a second to reach its rate (`random_lane_sets` in
/// `wire/tests/sender_sim.rs`).
const RATE_GAIN_DOWN: f64 = 0.25;

/// A ramping lane whose new rate sample is less than this factor above its estimate has
/// found its rate.
const RAMP_END: f64 = 1.1;

/// A measured lane whose round trip plus queue target covers less than this fraction of one
/// chunk's transmission keeps one chunk in flight: the round trip it then idles after each
/// chunk costs it at most this fraction of its rate. Any other lane keeps at least two, so the
/// next chunk is queued behind the one in transmission. Two chunks on a lane much slower than the rest hold the second one, and its ledger,
/// for a whole extra chunk time: with the window of ledgers in order, that stalls the fast
/// lanes (measured in `wire/tests/sender_sim.rs`, lanes at 1, 1 and 20 MB/s).
pub const ONE_CHUNK_COVER: f64 = 0.05;
/// How much longer than the best lane a lane may take for a unit it is given to find its rate
/// (see [`choose`]).
const PROBE_COST: f64 = 2.0;

/// How long a lane's rate stands without a sample before an idle lane is given a unit to
/// measure it again (see [`choose`]).
pub const PROBE_AFTER: Duration = Duration::from_millis(500);

/// What the relay's shell knows of a lane's path from its QUIC connection.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LaneReport {
    /// Smoothed round-trip time: the path's own plus whatever waits in the bottleneck's queue.
    pub rtt: Duration,
    /// Smallest round trip seen on the connection (zero: not known): the path's own, without
    /// the queue this session's own bytes build in front of the bottleneck.
    pub min_rtt: Duration,
}

/// What the sender knows of one lane, for metrics and tests.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LaneInfo {
    /// Lane number.
    pub lane: u8,
    /// Whether the lane is up.
    pub up: bool,
    /// Bytes on streams not yet acknowledged by the subscriber.
    pub outstanding: u64,
    /// Streams open.
    pub streams: u32,
    /// Bytes delivered (acknowledged) since the lane last joined.
    pub delivered: u64,
    /// Time the lane had bytes outstanding since it last joined.
    pub busy: Duration,
    /// Measured rate, bytes per second.
    pub rate: f64,
    /// Bytes the lane may have in flight now.
    pub target: u64,
}

/// One lane's state.
#[derive(Debug, Clone)]
pub(super) struct Lane {
    pub(super) outstanding: u64,
    pub(super) streams: u32,
    rate: f64,
    measured: bool,
    /// Growing: the rate is still measured as limited by the target, so the target looks two
    /// round trips ahead (as a congestion window doubles in slow start) until a sample shows
    /// less than [`RAMP_END`] growth.
    ramping: bool,
    rtt: Duration,
    busy_total: Duration,
    busy_since: Option<Duration>,
    delivered: u64,
    sample_bytes: u64,
    sample_busy: Duration,
    /// Busy periods begun since the sample started: each began with a round trip before its
    /// first acknowledgement, which is not the path's rate.
    sample_starts: u32,
    /// The most the lane had in flight since the sample started (see [`Lane::close`]).
    sample_peak: u64,
    /// When the rate was last set from a sample.
    sampled_at: Duration,
}

impl Lane {
    pub(super) fn new() -> Lane {
        Lane {
            outstanding: 0,
            streams: 0,
            rate: INITIAL_RATE,
            measured: false,
            ramping: true,
            rtt: Duration::ZERO,
            busy_total: Duration::ZERO,
            busy_since: None,
            delivered: 0,
            sample_bytes: 0,
            sample_busy: Duration::ZERO,
            sample_starts: 0,
            sample_peak: 0,
            sampled_at: Duration::ZERO,
        }
    }

    /// Time with bytes outstanding up to `now`.
    fn busy_until(&self, now: Duration) -> Duration {
        self.busy_total
            + self
                .busy_since
                .map_or(Duration::ZERO, |s| now.saturating_sub(s))
    }

    /// A stream of `len` bytes opened.
    pub(super) fn open(&mut self, len: u64, now: Duration) {
        if self.outstanding == 0 {
            self.busy_since = Some(now);
            self.sample_starts += 1;
        }
        self.outstanding += len;
        self.streams += 1;
        self.sample_peak = self.sample_peak.max(self.outstanding);
    }

    /// A stream of `len` bytes ended: delivered, or failed. `chunk` (a full chunk's wire bytes)
    /// and `budget` (see [`Lane::target`]) say what the lane must have had in flight during a
    /// rate sample for the sample to measure its path: half a chunk, or the budget if less.
    pub(super) fn close(
        &mut self,
        len: u64,
        delivered: bool,
        now: Duration,
        chunk: u64,
        budget: u64,
    ) {
        let busy = self.busy_until(now);
        self.outstanding = self.outstanding.saturating_sub(len);
        self.streams = self.streams.saturating_sub(1);
        if self.outstanding == 0 {
            self.busy_total = busy;
            self.busy_since = None;
        }
        if !delivered {
            return;
        }
        self.delivered += len;
        self.sample_bytes += len;
        // The rate is measured over the time the lane had bytes outstanding, not wall time: a
        // lane given less to do must not look slower (it would be given less still).
        //
        // Each busy period starts with a round trip in which nothing can be acknowledged; that
        // is not sending time. Counted as such, a lane given short streams one at a time looks
        // as slow as its round trip makes it (seen: a 12 MB/s lane with a 5 ms round trip
        // measured at 2 MB/s from one 12 KB stream, then given nothing for the rest of the
        // transfer, `random_lane_sets` in `wire/tests/sender_sim.rs`). A sample waits for
        // `RATE_SAMPLE` of sending time net of those round trips.
        let dt = busy.saturating_sub(self.sample_busy);
        let sending = dt.saturating_sub(self.rtt * self.sample_starts);
        if sending < RATE_SAMPLE {
            return;
        }
        let sample = self.sample_bytes as f64 / sending.as_secs_f64();
        // A lane that never held half a chunk during the sample was waiting for work, not
        // sending: what it delivered is what it was given, and the time is mostly the round
        // trip and the subscriber's delayed acknowledgement of a stream's last packet. Such a
        // sample may raise the rate but not lower it (as BBR treats samples taken while
        // application-limited). Counted, one-packet ledger ends read 4 KB/s each (109 bytes
        // acknowledged 27 ms later), and every one took a quarter off the rate of a lane left
        // only those: two lanes of eight fell to 5 KB/s and carried nothing for the rest of a
        // catch-up (`sender_sim::eight_lanes_whose_short_streams_wait_for_delayed_acks`).
        let limited = self.sample_peak < (chunk / 2).min(budget.max(1));
        self.sample_bytes = 0;
        self.sample_busy = busy;
        self.sample_starts = 0;
        self.sample_peak = self.outstanding;
        if limited && self.measured && sample < self.rate {
            return;
        }
        if self.measured && sample < RAMP_END * self.rate {
            self.ramping = false;
        }
        self.rate = if self.measured && sample < self.rate {
            (1.0 - RATE_GAIN_DOWN) * self.rate + RATE_GAIN_DOWN * sample
        } else {
            sample
        };
        self.measured = true;
        self.sampled_at = now;
    }

    /// Whether the lane's rate is worth measuring again with the next unit: it is idle and
    /// measured, and the rate is still growing (its first samples count its connection's slow
    /// start) or has not been sampled for [`PROBE_AFTER`].
    fn may_probe(&self, now: Duration) -> bool {
        self.measured
            && self.outstanding == 0
            && (self.ramping || now.saturating_sub(self.sampled_at) >= PROBE_AFTER)
    }

    /// Takes the path's own round trip: the smallest seen, when known. The smoothed one counts
    /// the bottleneck's queue, which this lane's own bytes fill: sizing the lane by it gave a
    /// lane more to queue for every millisecond its queue had already added, until most of the
    /// window sat bound to lanes and a lane at half the others' rate held its share of it (the
    /// bench's lanes reported 130-300 ms round trips over a sub-millisecond veth, with 83-92%
    /// of the caps used at one lane at half and up to 30% imbalance at equal caps;
    /// `sender_sim::bufferbloat` in `wire/tests`).
    pub(super) fn report(&mut self, r: LaneReport) {
        self.rtt = if r.min_rtt.is_zero() {
            r.rtt
        } else {
            r.min_rtt.min(r.rtt)
        };
    }

    /// Bytes this lane may have in flight: what it delivers in a round trip plus the queue
    /// target, so its path never runs dry between a stream's end and the next one's start, and
    /// at least one or two chunks of `chunk` wire bytes (see [`ONE_CHUNK_COVER`]).
    ///
    /// Until its first rate sample, a lane gets one chunk at a time: a lane much slower than
    /// the initial estimate would otherwise be handed more than it can carry in time, and the
    /// first ledgers (and with them the window) would wait for it. A fast lane is measured
    /// within a few round trips and grows from there.
    pub(super) fn target(&self, chunk: u64, queue_target: Duration, budget: u64) -> u64 {
        let budget = budget.max(1);
        if self.one_chunk(chunk, queue_target) {
            return chunk.min(budget);
        }
        let (pipe, cover) = self.cover(queue_target);
        // A lane opens a stream while it has less than its target in flight, so when a stream
        // is acknowledged it may hold one chunk less than the target: the target covers the
        // round trip plus one chunk, or the lane idles while the next chunk is not yet queued
        // (seen: one 23 MB/s lane, 9.4 ms round trip, 154 KiB chunks ran 18% below its rate
        // with two chunks in flight; `random_lane_sets` in `wire/tests/sender_sim.rs`).
        let pipe_and_chunk = pipe + chunk as f64;
        (cover.max(pipe_and_chunk) as u64)
            .max(2 * chunk)
            .min(budget)
    }

    /// Bytes the lane delivers in its round trip (two while ramping), and those plus what it
    /// delivers in `queue_target`.
    fn cover(&self, queue_target: Duration) -> (f64, f64) {
        let rtts = if self.ramping { 2 } else { 1 };
        let pipe = self.rate * (self.rtt * rtts).as_secs_f64();
        (pipe, pipe + self.rate * queue_target.as_secs_f64())
    }

    /// Whether the lane is held to one stream at a time: unmeasured, or so slow that its round
    /// trip and queue target are a small part of one chunk's time (see [`ONE_CHUNK_COVER`]).
    fn one_chunk(&self, chunk: u64, queue_target: Duration) -> bool {
        !self.measured || self.cover(queue_target).1 < ONE_CHUNK_COVER * chunk as f64
    }

    /// Whether the lane may open another stream, for a unit of `len` bytes. A lane held to one
    /// chunk takes a unit only if it fits beside what it has in flight: comparing what is in
    /// flight alone with the chunk let a short last chunk of a ledger plus a full one onto a
    /// lane still unmeasured, and a lane at 1 MB/s beside three of 13-40 MB/s then held a
    /// ledger, and the window, for a second chunk time (`random_lane_sets`). Short units (a
    /// ledger's last chunk, its end) still go beside each other, so they do not wait at the
    /// head of the queue for a whole chunk's round trip.
    pub(super) fn has_room(
        &self,
        len: u64,
        chunk: u64,
        queue_target: Duration,
        budget: u64,
    ) -> bool {
        if self.one_chunk(chunk, queue_target) {
            return self.outstanding == 0 || self.outstanding + len <= chunk.min(budget.max(1));
        }
        self.outstanding < self.target(chunk, queue_target, budget)
    }

    /// Expected time until `extra` more bytes would be delivered on this lane.
    pub(super) fn finish_time(&self, extra: u64) -> f64 {
        (self.outstanding + extra) as f64 / self.rate.max(1.0)
    }

    pub(super) fn info(
        &self,
        lane: u8,
        now: Duration,
        chunk: u64,
        queue_target: Duration,
        budget: u64,
    ) -> LaneInfo {
        LaneInfo {
            lane,
            up: true,
            outstanding: self.outstanding,
            streams: self.streams,
            delivered: self.delivered,
            busy: self.busy_until(now),
            rate: self.rate,
            target: self.target(chunk, queue_target, budget),
        }
    }
}

/// What [`choose`] needs besides the lanes.
#[derive(Debug, Clone, Copy)]
pub(super) struct Ask {
    /// Bytes of the unit to place.
    pub len: u64,
    /// Wire bytes of a full chunk of the session.
    pub chunk: u64,
    /// Bytes waiting for a lane, this unit included.
    pub queued: u64,
    /// The lane chosen last: the scan starts after it, so ties rotate.
    pub last: usize,
    pub queue_target: Duration,
    pub budget: u64,
    pub streams_per_lane: Option<u32>,
    pub now: Duration,
}

/// The lane that gets the unit at the head of the queue, or `None` to wait.
///
/// The unit goes to the lane expected to deliver it first, counting what each lane already has
/// in flight, if that lane has room (less in flight than its target). If it has none, a lane
/// that has room takes the unit only if it would deliver it before the other lanes could
/// deliver everything queued (earliest completion first, as multipath transports schedule):
/// a lane much slower than the rest is used while there is enough to do that it cannot delay
/// the end, and left alone for the last units of a transfer, which it would only hold back.
/// Before both rules, an idle lane whose rate is still growing or has not been sampled for
/// [`PROBE_AFTER`] takes the unit if it would deliver it within [`PROBE_COST`] times the best
/// lane's time, so a rate measured low is measured again.
pub(super) fn choose(lanes: &[Option<Lane>], ask: Ask) -> Option<usize> {
    let n = lanes.len();
    let permit = |l: &Lane| ask.streams_per_lane.is_none_or(|max| l.streams < max);
    let room = |l: &Lane| l.has_room(ask.len, ask.chunk, ask.queue_target, ask.budget);
    let mut best: Option<(usize, f64)> = None;
    let mut best_with_room: Option<(usize, f64)> = None;
    let mut probe = None;
    for k in 0..n {
        let i = (ask.last + 1 + k) % n;
        let Some(l) = &lanes[i] else { continue };
        if !permit(l) {
            continue;
        }
        let t = l.finish_time(ask.len);
        if best.is_none_or(|(_, b)| t < b) {
            best = Some((i, t));
        }
        if room(l) && best_with_room.is_none_or(|(_, b)| t < b) {
            best_with_room = Some((i, t));
        }
        if probe.is_none() && l.may_probe(ask.now) {
            probe = Some((i, t));
        }
    }
    let (b, best_finish) = best?;
    // Left to the rules below, a lane measured low keeps that rate for good: nothing is sent on
    // it to measure it again. A lane's first samples count its connection's slow start, and a
    // chunk now and then takes 2-3 times as long as the rest on the same path (seen on the
    // bench's capped veth: 48 ms against 20). So an idle lane whose rate is still growing, or
    // stale, takes the unit if that costs at most the best lane's time again at the rate it
    // has. A lane of eight measured at 5.4 MB/s this way, beside seven at 13, got nothing but
    // the ledgers' ends for a whole catch-up; a lane at a fortieth of the others', given a
    // second chunk, holds its ledger for a whole chunk time (`random_lane_sets`).
    if let Some((p, t)) = probe {
        if t <= PROBE_COST * best_finish {
            return Some(p);
        }
    }
    let (i, finish) = best_with_room?;
    if i == b {
        return Some(i);
    }
    // Time the other lanes would need to deliver what they have and everything queued.
    let (out, rate) = lanes
        .iter()
        .enumerate()
        .filter(|(j, _)| *j != i)
        .filter_map(|(_, l)| l.as_ref())
        .fold((0u64, 0f64), |(o, r), l| {
            (o + l.outstanding, r + l.rate.max(1.0))
        });
    let others = (out + ask.queued) as f64 / rate.max(1.0);
    (finish <= others).then_some(i)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_rate_is_measured_over_busy_time_only() {
        let mut l = Lane::new();
        // 100 KB in 10 ms, then idle for 40 ms: 10 MB/s, not 2 MB/s.
        l.open(60_000, Duration::ZERO);
        l.open(40_000, MS);
        l.close(60_000, true, 6 * MS, 0, u64::MAX);
        l.close(40_000, true, 10 * MS, 0, u64::MAX);
        assert_eq!(l.busy_until(50 * MS), 10 * MS);
        assert!((l.rate - 10e6).abs() < 1.0, "{}", l.rate);
        // Busy again later: the idle gap does not count.
        l.open(50_000, 100 * MS);
        l.close(50_000, true, 105 * MS, 0, u64::MAX);
        assert_eq!(l.busy_until(200 * MS), 15 * MS);
        assert!((l.rate - 10e6).abs() < 1.0, "{}", l.rate);
    }

    #[test]
    fn the_round_trip_that_starts_a_busy_period_is_not_sending_time() {
        let mut l = Lane::new();
        l.report(LaneReport {
            rtt: 5 * MS,
            min_rtt: 5 * MS,
        });
        // 12 KB at 12 MB/s takes 1 ms, acknowledged a round trip later: not yet a sample.
        l.open(12_000, Duration::ZERO);
        l.close(12_000, true, 6 * MS, 0, u64::MAX);
        assert!(!l.measured, "1 ms of sending is below RATE_SAMPLE");
        // Five more such streams, one at a time: 6 ms of sending in 36 ms of busy time.
        for k in 1..=5u32 {
            l.open(12_000, 10 * MS * k);
            l.close(12_000, true, 10 * MS * k + 6 * MS, 0, u64::MAX);
        }
        assert!(l.measured);
        assert!((l.rate - 12e6).abs() < 1.0, "{}", l.rate);
    }

    #[test]
    fn a_lane_held_to_one_chunk_takes_short_units_beside_each_other_but_not_a_second_chunk() {
        let mut l = Lane::new();
        let (chunk, qt) = (100_000, 4 * MS);
        assert!(l.has_room(chunk, chunk, qt, u64::MAX));
        // The short last chunk of a ledger, then its end: both fit within one chunk.
        l.open(12_000, Duration::ZERO);
        assert!(l.has_room(109, chunk, qt, u64::MAX));
        l.open(109, Duration::ZERO);
        // A whole chunk beside them would be two chunks' time on a lane not yet measured.
        assert!(!l.has_room(chunk, chunk, qt, u64::MAX));
        // A measured fast lane keeps its round trip plus one chunk in flight: 20 MB/s with a
        // 10 ms round trip is 200 KB, so three 100 KB chunks, not two.
        let mut fast = Lane::new();
        fast.measured = true;
        fast.ramping = false;
        fast.rate = 20e6;
        fast.report(LaneReport {
            rtt: 10 * MS,
            min_rtt: 10 * MS,
        });
        assert_eq!(fast.target(chunk, Duration::ZERO, u64::MAX), 300_000);
        fast.open(chunk, Duration::ZERO);
        fast.open(chunk, Duration::ZERO);
        assert!(fast.has_room(chunk, chunk, Duration::ZERO, u64::MAX));
    }

    #[test]
    fn a_failed_stream_frees_its_bytes_without_counting_as_delivered() {
        let mut l = Lane::new();
        l.open(1000, Duration::ZERO);
        l.close(1000, false, 10 * MS, 0, u64::MAX);
        assert_eq!((l.outstanding, l.streams, l.delivered), (0, 0, 0));
        assert!(!l.measured);
    }

    #[test]
    fn the_target_follows_rate_and_round_trip_within_bounds() {
        let l = Lane::new();
        assert_eq!(
            l.target(1000, 3 * MS, u64::MAX),
            1000,
            "unmeasured: one chunk"
        );
        let mut l = steady(1e9);
        l.report(LaneReport {
            rtt: 2 * MS,
            min_rtt: 2 * MS,
        });
        // 1 GB/s x (2 ms + 3 ms).
        assert_eq!(l.target(1000, 3 * MS, u64::MAX), 5_000_000);
        assert_eq!(
            l.target(1000, 3 * MS, 1_000_000),
            1_000_000,
            "capped by the budget"
        );
        // 10 MB/s x 5 ms is 50 KB: half a 100 KB chunk, so two chunks.
        l.rate = 10e6;
        assert_eq!(l.target(100_000, 3 * MS, u64::MAX), 200_000, "two chunks");
        // 100 KB/s x 5 ms is 500 bytes, far less than a chunk's 1 s: one chunk.
        l.rate = 100e3;
        assert_eq!(l.target(100_000, 3 * MS, u64::MAX), 100_000, "one chunk");
    }

    /// A lane whose rate was measured at `rate` and no longer ramps.
    fn steady(rate: f64) -> Lane {
        let mut l = Lane::new();
        l.measured = true;
        l.ramping = false;
        l.rate = rate;
        l
    }

    #[test]
    fn the_target_counts_the_path_not_the_queue_in_front_of_it() {
        let mut l = steady(1e9);
        // A 200 ms smoothed round trip over a 2 ms path: 198 ms of it is queue.
        l.report(LaneReport {
            rtt: 200 * MS,
            min_rtt: 2 * MS,
        });
        assert_eq!(l.target(1000, 3 * MS, u64::MAX), 5_000_000);
        // Not known (zero): the smoothed one is all there is.
        l.report(LaneReport {
            rtt: 2 * MS,
            min_rtt: Duration::ZERO,
        });
        assert_eq!(l.target(1000, 3 * MS, u64::MAX), 5_000_000);
    }

    fn ask(len: u64, queued: u64, last: usize) -> Ask {
        Ask {
            len,
            chunk: 1000,
            queued,
            last,
            queue_target: MS,
            budget: u64::MAX,
            streams_per_lane: None,
            now: Duration::ZERO,
        }
    }

    #[test]
    fn the_lane_expected_to_finish_first_wins_and_ties_rotate() {
        let mut fast = Lane::new();
        fast.rate = 2e8;
        let slow = Lane::new();
        let lanes = vec![Some(slow.clone()), Some(fast), None];
        assert_eq!(choose(&lanes, ask(1000, 1000, 0)), Some(1));
        let equal = vec![Some(slow.clone()), Some(slow.clone()), Some(slow)];
        assert_eq!(choose(&equal, ask(1000, 1000, 0)), Some(1));
        assert_eq!(choose(&equal, ask(1000, 1000, 1)), Some(2));
        assert_eq!(choose(&equal, ask(1000, 1000, 2)), Some(0));
    }

    #[test]
    fn a_full_lane_or_one_without_a_stream_permit_gets_nothing() {
        let mut full = Lane::new();
        full.open(1 << 20, Duration::ZERO);
        let lanes = vec![Some(full.clone())];
        let mut a = ask(1, 1, 0);
        a.queue_target = Duration::ZERO;
        assert_eq!(choose(&lanes, a), None);
        let mut one = Lane::new();
        one.open(1, Duration::ZERO);
        let lanes = vec![Some(one)];
        let mut a = ask(1, 1, 0);
        a.streams_per_lane = Some(1);
        assert_eq!(choose(&lanes, a), None);
        a.streams_per_lane = Some(2);
        assert_eq!(choose(&lanes, a), Some(0));
    }

    #[test]
    fn a_slow_lane_helps_with_a_long_queue_and_waits_out_the_tail() {
        // A fast lane that is full, and an idle lane at a tenth of its rate.
        let mut fast = Lane::new();
        fast.rate = 10e6;
        fast.measured = true;
        fast.open(524_288, Duration::ZERO);
        let mut slow = Lane::new();
        slow.rate = 1e6;
        slow.measured = true;
        slow.ramping = false;
        let lanes = vec![Some(fast.clone()), Some(slow.clone())];
        let chunk = 100_000;
        // The slow lane delivers a chunk in 100 ms; the fast lane needs about 52 ms for what it
        // has plus 1 s for 10 MB queued: the slow lane helps.
        assert_eq!(choose(&lanes, ask(chunk, 10_000_000, 0)), Some(1));
        // With only this chunk left, the fast lane is done with it in about 62 ms: wait.
        assert_eq!(choose(&lanes, ask(chunk, chunk, 0)), None);
        // Its rate not sampled for `PROBE_AFTER`, the slow lane may be slow no longer: idle,
        // it takes the chunk to find out (100 ms against the fast lane's 62: within twice).
        let mut later = ask(chunk, chunk, 0);
        later.now = PROBE_AFTER;
        assert_eq!(choose(&lanes, later), Some(1));
        // So it does while its rate is still growing (measured from its first samples only).
        slow.ramping = true;
        let lanes = vec![Some(fast.clone()), Some(slow.clone())];
        assert_eq!(choose(&lanes, ask(chunk, chunk, 0)), Some(1));
        // Not with something in flight, nor at more than twice the best lane's time.
        let mut busy = slow.clone();
        busy.open(1_000, Duration::ZERO);
        let lanes = vec![Some(fast.clone()), Some(busy)];
        assert_eq!(choose(&lanes, ask(chunk, chunk, 0)), None);
        slow.rate = 0.7e6;
        let lanes = vec![Some(fast), Some(slow)];
        assert_eq!(choose(&lanes, ask(chunk, chunk, 0)), None);
    }

    #[test]
    fn a_lane_waiting_for_work_is_not_measured_slower() {
        let mut l = Lane::new();
        l.report(LaneReport {
            rtt: MS / 5,
            min_rtt: MS / 5,
        });
        let chunk = 262_170;
        // One full chunk in 20 ms: about 13 MB/s.
        l.open(chunk, Duration::ZERO);
        l.close(chunk, true, 20 * MS, chunk, u64::MAX);
        let rate = l.rate;
        assert!((rate - chunk as f64 / 0.0198).abs() < 1.0, "{rate}");
        // Then only a ledger's 109-byte end at a time, each acknowledged 27 ms later (the
        // subscriber's delayed ACK): samples of 4 KB/s that say nothing of the path.
        for k in 1..=10u32 {
            let t = 100 * MS * k;
            l.open(109, t);
            l.close(109, true, t + 27 * MS, chunk, u64::MAX);
        }
        assert_eq!(l.rate, rate, "short streams alone must not lower the rate");
        assert!(l.ramping, "nor end the ramp");
        // A full chunk that goes slower does.
        l.open(chunk, 2000 * MS);
        l.close(chunk, true, 2040 * MS, chunk, u64::MAX);
        assert!(l.rate < rate, "{} against {rate}", l.rate);
        assert!(!l.ramping);
    }
}
