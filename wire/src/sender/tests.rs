//! The sender's rules one by one; `wire/tests/sender_sim.rs` drives it against the real
//! reassembler over virtual lanes.

use bytes::Bytes;

use super::*;
use crate::compress::Codec;
use crate::frame::{ChunkHeader, ErrorCode};

const MS: Duration = Duration::from_millis(1);

/// Ledger `seq` of `chunks` chunks of 1000 bytes.
fn ledger(seq: u32, chunks: u32) -> Arc<CompleteLedger> {
    CompleteLedger::filled(seq, chunks, 1000)
}

fn sender(first: u32, lanes: u8) -> Sender {
    let mut cfg = SenderConfig::new(first, lanes);
    cfg.window = 2;
    let mut s = Sender::new(cfg, Duration::ZERO);
    for l in 1..lanes {
        s.handle_lane_up(l, Duration::ZERO);
    }
    s
}

fn events(s: &mut Sender) -> Vec<Event> {
    std::iter::from_fn(|| s.poll_event()).collect()
}

fn transmits(s: &mut Sender, now: Duration) -> Vec<Transmit> {
    std::iter::from_fn(|| s.poll_transmit(now)).collect()
}

fn keys(t: &[Transmit]) -> Vec<(u32, u32)> {
    t.iter().map(|t| t.unit.key()).collect()
}

fn deliver(s: &mut Sender, t: &[Transmit], now: Duration) {
    for t in t {
        s.handle_stream_done(t.stream, true, now);
    }
}

#[test]
fn catching_up_loads_ledgers_in_order_within_the_window() {
    let mut s = sender(10, 1);
    s.handle_timeout(Duration::ZERO);
    assert_eq!(events(&mut s), vec![Event::Heartbeat, Event::Load(10)]);
    s.handle_loaded(10, LoadResult::Complete(ledger(10, 2)), MS);
    assert_eq!(events(&mut s), vec![Event::Load(11)]);
    s.handle_loaded(11, LoadResult::Complete(ledger(11, 1)), MS);
    // Window 2 past acked 9: ledgers 10 and 11, nothing more until an ack.
    assert_eq!(events(&mut s), vec![]);
    let t = transmits(&mut s, MS);
    assert_eq!(
        keys(&t),
        vec![(10, 0), (10, 1), (10, END_INDEX), (11, 0), (11, END_INDEX)]
    );
    s.handle_frame(Frame::Ack(10), 2 * MS);
    assert_eq!(events(&mut s), vec![Event::Load(12)]);
    assert_eq!(s.acked(), 10);
}

#[test]
fn reaching_the_ledger_in_progress_joins_live_without_gap_or_duplicate() {
    let mut s = sender(5, 1);
    s.handle_timeout(Duration::ZERO);
    events(&mut s);
    s.handle_loaded(5, LoadResult::InProgress(vec![]), MS);
    assert_eq!(events(&mut s), vec![Event::JoinLive]);
    assert!(!s.wants_live(), "not live until joined");
    let l = ledger(5, 3);
    s.handle_joined(Some((5, l.chunks[..2].to_vec())), 4);
    assert!(s.wants_live());
    s.handle_live(LiveItem::Chunk(l.chunks[1].clone())); // already had it from the join
    s.handle_live(LiveItem::Chunk(l.chunks[2].clone()));
    s.handle_live(LiveItem::End(l.clone()));
    let t = transmits(&mut s, MS);
    assert_eq!(keys(&t), vec![(5, 0), (5, 1), (5, 2), (5, END_INDEX)]);
    assert_eq!(s.next_seq(), 6);
}

#[test]
fn a_ledger_completed_while_joining_is_read_whole() {
    let mut s = sender(5, 1);
    s.handle_timeout(Duration::ZERO);
    events(&mut s);
    s.handle_loaded(5, LoadResult::NotYet, MS);
    assert_eq!(events(&mut s), vec![Event::JoinLive]);
    s.handle_joined(None, 5);
    assert_eq!(events(&mut s), vec![Event::LeaveLive, Event::Load(5)]);
}

#[test]
fn falling_behind_live_reads_the_rest_from_the_ledgers_held() {
    let mut s = sender(5, 1);
    s.handle_timeout(Duration::ZERO);
    events(&mut s);
    s.handle_loaded(5, LoadResult::NotYet, MS);
    events(&mut s);
    s.handle_joined(None, 4);
    let l = ledger(5, 3);
    s.handle_live(LiveItem::Chunk(l.chunks[0].clone()));
    s.handle_live(LiveItem::Lagged);
    assert_eq!(events(&mut s), vec![Event::LeaveLive, Event::Load(5)]);
    assert!(s.catching_up());
    s.handle_loaded(5, LoadResult::Complete(l), 2 * MS);
    let t = transmits(&mut s, 2 * MS);
    assert_eq!(keys(&t), vec![(5, 0), (5, 1), (5, 2), (5, END_INDEX)]);
    assert_eq!(s.stats().lagged, 1);
}

#[test]
fn streams_of_a_dead_lane_go_again_on_the_others() {
    let mut s = sender(1, 2);
    s.handle_timeout(Duration::ZERO);
    events(&mut s);
    s.handle_loaded(1, LoadResult::Complete(ledger(1, 4)), MS);
    let t = transmits(&mut s, MS);
    assert_eq!(t.len(), 5, "{t:?}");
    let on_lane_1: Vec<_> = t
        .iter()
        .filter(|t| t.lane == 1)
        .map(|t| t.unit.key())
        .collect();
    assert!(!on_lane_1.is_empty(), "both lanes used: {t:?}");
    s.handle_lane_down(1, "gone", 2 * MS);
    let again = transmits(&mut s, 2 * MS);
    assert_eq!(keys(&again), on_lane_1);
    assert!(again.iter().all(|t| t.lane == 0));
    // The dead lane's late failure reports change nothing.
    for t in t.iter().filter(|t| t.lane == 1) {
        s.handle_stream_done(t.stream, false, 3 * MS);
    }
    assert!(transmits(&mut s, 3 * MS).is_empty());
    assert_eq!(s.stats().retried, on_lane_1.len() as u64);
}

#[test]
fn a_failed_stream_is_sent_again_unless_its_ledger_was_acknowledged() {
    let mut s = sender(1, 1);
    s.handle_timeout(Duration::ZERO);
    events(&mut s);
    s.handle_loaded(1, LoadResult::Complete(ledger(1, 1)), MS);
    let t = transmits(&mut s, MS);
    s.handle_stream_done(t[0].stream, false, 2 * MS);
    let again = transmits(&mut s, 2 * MS);
    assert_eq!(keys(&again), vec![(1, 0)]);
    s.handle_stream_done(t[1].stream, true, 2 * MS);
    s.handle_frame(Frame::Ack(1), 3 * MS);
    s.handle_stream_done(again[0].stream, false, 3 * MS);
    assert!(transmits(&mut s, 3 * MS).is_empty());
}

#[test]
fn resends_are_honoured_once_per_copy_in_flight_and_only_for_unacknowledged_ledgers() {
    let mut s = sender(1, 1);
    s.handle_timeout(Duration::ZERO);
    events(&mut s);
    let l = ledger(1, 3);
    s.handle_loaded(1, LoadResult::Complete(l.clone()), MS);
    let t = transmits(&mut s, MS);
    // Chunk 1 is still in flight: asking for 1 and 2 after 0 and 2 were delivered.
    s.handle_stream_done(t[0].stream, true, MS);
    s.handle_stream_done(t[2].stream, true, MS);
    s.handle_frame(
        Frame::Resend(Resend {
            seq: 1,
            whole: false,
            indices: vec![1, 2],
        }),
        2 * MS,
    );
    assert!(events(&mut s).contains(&Event::Load(1)));
    s.handle_loaded(1, LoadResult::Complete(l), 2 * MS);
    let again = transmits(&mut s, 2 * MS);
    assert_eq!(keys(&again), vec![(1, 2)], "chunk 1 is still on its way");
    // A resend of a ledger not sent yet is ignored.
    s.handle_frame(
        Frame::Resend(Resend {
            seq: 9,
            whole: true,
            indices: vec![],
        }),
        3 * MS,
    );
    assert!(!events(&mut s).iter().any(|e| matches!(e, Event::Load(9))));
    deliver(&mut s, &t, 3 * MS);
    deliver(&mut s, &again, 3 * MS);
    s.handle_frame(Frame::Ack(1), 4 * MS);
    s.handle_frame(
        Frame::Resend(Resend {
            seq: 1,
            whole: true,
            indices: vec![],
        }),
        5 * MS,
    );
    assert_eq!(
        events(&mut s).last(),
        Some(&Event::Close(CloseReason::Violation(
            Violation::ResendOfAcked { seq: 1, acked: 1 }
        )))
    );
    assert!(s.is_closed());
}

#[test]
fn resend_loads_are_rate_limited() {
    let mut s = sender(1, 1);
    s.handle_timeout(Duration::ZERO);
    events(&mut s);
    s.handle_loaded(1, LoadResult::Complete(ledger(1, 1)), MS);
    let _in_flight = transmits(&mut s, MS);
    let resend = || {
        Frame::Resend(Resend {
            seq: 1,
            whole: true,
            indices: vec![],
        })
    };
    let mut loads = 0;
    for _ in 0..1000 {
        s.handle_frame(resend(), 2 * MS);
        for e in events(&mut s) {
            if e == Event::Load(1) {
                loads += 1;
                s.handle_loaded(1, LoadResult::Complete(ledger(1, 1)), 2 * MS);
            }
        }
    }
    let burst = SenderConfig::new(1, 1).resend_loads_per_sec as usize;
    assert_eq!(loads, burst, "one burst, then nothing until tokens return");
    assert_eq!(s.stats().resends_limited, 1000 - burst as u64);
    // Everything asked for is already in flight: nothing was queued twice.
    assert!(transmits(&mut s, 2 * MS).is_empty());
    s.handle_frame(resend(), 2 * MS + Duration::from_millis(100));
    assert!(events(&mut s).contains(&Event::Load(1)), "tokens refill");
}

#[test]
fn acks_of_ledgers_not_sent_are_violations() {
    let mut s = sender(10, 1);
    s.handle_frame(Frame::Ack(10), MS);
    assert!(matches!(
        events(&mut s).last(),
        Some(Event::Close(CloseReason::Violation(
            Violation::AckNotSent { seq: 10, next: 10 }
        )))
    ));
    let mut s = sender(10, 1);
    s.handle_frame(Frame::Ack(3), MS);
    assert!(s.is_closed(), "below the session's start");
}

#[test]
fn other_frames_on_the_control_stream_are_violations() {
    let mut s = sender(1, 1);
    s.handle_frame(Frame::LaneAccept(1), MS);
    assert_eq!(
        events(&mut s),
        vec![Event::Close(CloseReason::Violation(
            Violation::UnexpectedFrame {
                frame: "lane-accept",
                place: "the control stream"
            }
        ))]
    );
}

/// Ledger 1 loaded and sent, ledger 2's load answered with `result`: what the sender does
/// before ledger 1 is acknowledged (it must wait), and once it is.
fn second_load_fails(result: LoadResult) -> (Vec<Event>, Vec<Event>) {
    let mut s = sender(1, 1);
    s.handle_timeout(Duration::ZERO);
    events(&mut s);
    s.handle_loaded(1, LoadResult::Complete(ledger(1, 1)), MS);
    events(&mut s);
    s.handle_loaded(2, result, MS);
    let before = events(&mut s);
    let t = transmits(&mut s, MS);
    deliver(&mut s, &t, 2 * MS);
    s.handle_frame(Frame::Ack(1), 3 * MS);
    (before, events(&mut s))
}

#[test]
fn a_ledger_no_longer_held_ends_the_session_after_the_rest_is_acknowledged() {
    let (before, after) = second_load_fails(LoadResult::NotHeld {
        oldest: 5,
        newest: 9,
        lake: None,
    });
    assert!(before.is_empty(), "ledger 1 is still on its way");
    assert_eq!(
        after,
        vec![Event::Close(CloseReason::BelowRetention {
            seq: 2,
            oldest: 5,
            newest: 9,
            lake: None,
        })]
    );
}

#[test]
fn a_ledger_neither_held_nor_in_the_lake_ends_with_both_ranges() {
    let mut s = sender(1, 1);
    s.handle_timeout(Duration::ZERO);
    events(&mut s);
    s.handle_loaded(
        1,
        LoadResult::NotHeld {
            oldest: 300,
            newest: 320,
            lake: Some((10, 200)),
        },
        MS,
    );
    assert_eq!(
        events(&mut s),
        vec![Event::Close(CloseReason::BelowRetention {
            seq: 1,
            oldest: 300,
            newest: 320,
            lake: Some((10, 200)),
        })]
    );
}

#[test]
fn a_failed_load_ends_the_session_as_the_relay_s_failure_after_the_drain() {
    let (before, after) = second_load_fails(LoadResult::Failed {
        detail: "lake unreachable at k: refused".into(),
    });
    assert!(before.is_empty(), "ledger 1 is still on its way");
    let [Event::Close(reason)] = after.as_slice() else {
        panic!("{after:?}");
    };
    assert_eq!(reason.code(), Some(ErrorCode::Internal), "retryable");
    assert_eq!(
        reason.to_string(),
        "ledger 2 cannot be read: lake unreachable at k: refused"
    );
}

#[test]
fn the_drain_has_a_time_limit() {
    let mut s = sender(1, 1);
    s.handle_timeout(Duration::ZERO);
    events(&mut s);
    s.handle_loaded(1, LoadResult::Complete(ledger(1, 1)), MS);
    events(&mut s);
    s.handle_loaded(
        2,
        LoadResult::Corrupt {
            detail: "bad".into(),
        },
        MS,
    );
    let limit = SenderConfig::new(1, 1).drain_limit;
    assert!(s.poll_timeout().unwrap() <= MS + limit);
    s.handle_timeout(MS + limit);
    assert!(events(&mut s)
        .iter()
        .any(|e| matches!(e, Event::Close(CloseReason::Corrupt { seq: 2, .. }))));
}

#[test]
fn an_unavailable_store_is_asked_again_later() {
    let mut s = sender(1, 1);
    s.handle_timeout(Duration::ZERO);
    events(&mut s);
    s.handle_loaded(
        1,
        LoadResult::Unavailable {
            detail: "store degraded".into(),
        },
        MS,
    );
    assert_eq!(events(&mut s), vec![]);
    let retry = SenderConfig::new(1, 1).load_retry;
    assert!(s.poll_timeout().unwrap() <= MS + retry);
    s.handle_timeout(MS + retry);
    let e: Vec<Event> = events(&mut s)
        .into_iter()
        .filter(|e| *e != Event::Heartbeat)
        .collect();
    assert_eq!(e, vec![Event::Load(1)]);
    assert!(!s.is_closed());
}

#[test]
fn a_source_cut_off_mid_ledger_resets_a_session_that_had_some_of_it() {
    let mut s = sender(1, 1);
    s.handle_timeout(Duration::ZERO);
    events(&mut s);
    s.handle_loaded(1, LoadResult::NotYet, MS);
    events(&mut s);
    s.handle_joined(None, 0);
    s.handle_live(LiveItem::Abort(1));
    assert!(!s.is_closed(), "nothing of it was queued");
    s.handle_live(LiveItem::Chunk(ledger(1, 2).chunks[0].clone()));
    s.handle_live(LiveItem::Abort(1));
    assert_eq!(
        events(&mut s),
        vec![Event::Close(CloseReason::SourceReset { seq: 1 })]
    );
}

#[test]
fn a_lane_takes_no_more_than_its_target() {
    let mut cfg = SenderConfig::new(1, 1);
    cfg.window = 64;
    cfg.catch_up_bytes = u64::MAX;
    let mut s = Sender::new(cfg, Duration::ZERO);
    s.handle_timeout(Duration::ZERO);
    events(&mut s);
    // 100 chunks of 10 KB: far more than the lane's first target.
    let big = Arc::new(CompleteLedger {
        end: ledger(1, 100).end,
        chunks: (0..100)
            .map(|i| Chunk {
                header: ChunkHeader {
                    seq: 1,
                    index: i,
                    raw_offset: u64::from(i) * 10_000,
                    raw_len: 10_000,
                    codec: Codec::None,
                },
                payload: Bytes::from(vec![0u8; 10_000]),
            })
            .collect(),
    });
    s.handle_loaded(1, LoadResult::Complete(big), MS);
    let t = transmits(&mut s, MS);
    let info = s.lanes(MS)[0];
    assert!(t.len() < 100, "late binding: the rest waits in the queue");
    // Unmeasured, the lane is held to one chunk: units go on while they fit within it.
    assert!(
        info.outstanding <= info.target && info.outstanding + 10_100 > info.target,
        "{info:?}"
    );
    s.handle_stream_done(t[0].stream, true, 2 * MS);
    assert_eq!(transmits(&mut s, 2 * MS).len(), 1, "one out, one in");
}

#[test]
fn streams_per_lane_limits_open_streams() {
    let mut cfg = SenderConfig::new(1, 1);
    cfg.streams_per_lane = Some(2);
    let mut s = Sender::new(cfg, Duration::ZERO);
    s.handle_timeout(Duration::ZERO);
    events(&mut s);
    s.handle_loaded(1, LoadResult::Complete(ledger(1, 5)), MS);
    let t = transmits(&mut s, MS);
    assert_eq!(t.len(), 2);
    s.handle_stream_done(t[0].stream, true, 2 * MS);
    assert_eq!(transmits(&mut s, 2 * MS).len(), 1);
}

#[test]
fn closing_stops_all_output() {
    let mut s = sender(1, 1);
    s.handle_timeout(Duration::ZERO);
    events(&mut s);
    s.handle_loaded(1, LoadResult::Complete(ledger(1, 2)), MS);
    s.handle_close(CloseReason::Revoked {
        identity: "rpc-1".into(),
    });
    assert_eq!(
        events(&mut s),
        vec![Event::Close(CloseReason::Revoked {
            identity: "rpc-1".into()
        })]
    );
    assert!(transmits(&mut s, MS).is_empty());
    assert_eq!(s.poll_timeout(), None);
    s.handle_timeout(Duration::from_secs(10));
    assert!(events(&mut s).is_empty());
}

#[test]
fn losing_lane_0_ends_the_session_without_a_frame() {
    let mut s = sender(1, 2);
    s.handle_lane_down(0, "connection lost", MS);
    let e = events(&mut s);
    let [Event::Close(reason)] = &e[..] else {
        panic!("{e:?}")
    };
    assert_eq!(reason.code(), None);
}

#[test]
fn heartbeats_follow_the_interval() {
    let mut s = sender(1, 1);
    s.handle_timeout(Duration::ZERO);
    assert!(events(&mut s).contains(&Event::Heartbeat));
    let hb = SenderConfig::new(1, 1).heartbeat;
    assert_eq!(s.poll_timeout(), Some(hb));
    s.handle_timeout(hb - MS);
    assert!(!events(&mut s).contains(&Event::Heartbeat));
    s.handle_timeout(hb);
    assert!(events(&mut s).contains(&Event::Heartbeat));
}

/// Sessions that start at different times on one clock send their heartbeats at the same
/// instants, the multiples of the interval, after a first one at once; however late the shell
/// calls, no two heartbeats are due more than an interval apart.
#[test]
fn heartbeats_of_all_sessions_fall_on_the_same_ticks() {
    let hb = SenderConfig::new(1, 1).heartbeat;
    for (start, late) in [
        (3 * MS, Duration::ZERO),
        (101 * MS, 7 * MS),
        (hb + 9 * MS, 60 * MS),
    ] {
        let mut s = Sender::new(SenderConfig::new(1, 1), start);
        let mut due = vec![start];
        let mut now = start;
        while now < start + 8 * hb {
            s.handle_timeout(now);
            if events(&mut s).contains(&Event::Heartbeat) {
                let next = s.poll_timeout().expect("a heartbeat is always due");
                due.push(next);
                now = next + late;
            } else {
                panic!("no heartbeat at {now:?}, due at {due:?}");
            }
        }
        for pair in due.windows(2) {
            assert!(pair[1] - pair[0] <= hb, "{start:?}: {due:?}");
        }
        for t in &due[1..] {
            assert_eq!(t.as_nanos() % hb.as_nanos(), 0, "{start:?}: {due:?}");
        }
    }
}

/// The address of each chunk payload a sender put on a stream, by chunk index.
fn payload_ptrs(t: &[Transmit]) -> Vec<(u32, *const u8, usize)> {
    t.iter()
        .filter_map(|t| match &t.unit {
            Unit::Chunk(c) => Some((c.header.index, c.payload.as_ptr(), c.payload.len())),
            Unit::End(_) => None,
        })
        .collect()
}

/// The relay compresses a chunk once and every session sends those bytes: a sender hands its
/// shell the very `Bytes` it was given (the same allocation, not a copy), whether the ledger
/// came whole (catching up), chunk by chunk (live, joined mid-ledger) or is sent again.
#[test]
fn every_session_sends_the_chunk_bytes_it_was_given_not_a_copy() {
    let l = ledger(5, 3);
    let want: Vec<(u32, *const u8, usize)> = l
        .chunks
        .iter()
        .map(|c| (c.header.index, c.payload.as_ptr(), c.payload.len()))
        .collect();

    // Catching up: the ledger whole.
    let mut a = sender(5, 2);
    a.handle_timeout(Duration::ZERO);
    events(&mut a);
    a.handle_loaded(5, LoadResult::Complete(l.clone()), MS);
    let ta = transmits(&mut a, MS);

    // Live: joined after chunk 0, chunks 1 and 2 from the broadcast, then the end record.
    let mut b = sender(5, 2);
    b.handle_timeout(Duration::ZERO);
    events(&mut b);
    b.handle_loaded(5, LoadResult::InProgress(vec![]), MS);
    events(&mut b);
    b.handle_joined(Some((5, l.chunks[..1].to_vec())), 4);
    b.handle_live(LiveItem::Chunk(l.chunks[1].clone()));
    b.handle_live(LiveItem::Chunk(l.chunks[2].clone()));
    b.handle_live(LiveItem::End(l.clone()));
    let tb = transmits(&mut b, MS);

    let mut got_a = payload_ptrs(&ta);
    let mut got_b = payload_ptrs(&tb);
    got_a.sort();
    got_b.sort();
    assert_eq!(got_a, want, "catching up sent a copy");
    assert_eq!(got_b, want, "live sent a copy");

    // A resend of chunk 1 goes out from the same bytes too.
    deliver(&mut a, &ta, MS);
    a.handle_frame(
        Frame::Resend(Resend {
            seq: 5,
            whole: false,
            indices: vec![1],
        }),
        2 * MS,
    );
    for e in events(&mut a) {
        if let Event::Load(5) = e {
            a.handle_loaded(5, LoadResult::Complete(l.clone()), 2 * MS);
        }
    }
    let again = payload_ptrs(&transmits(&mut a, 2 * MS));
    assert_eq!(again, vec![want[1]], "the resend sent a copy");
}
