//! Lanes behind a deep bottleneck queue, as in the bench's emulated network (an HTB class per
//! lane whose queue holds about 1,000 packets, some 110 ms at 100 Mbit/s): the round trip quinn
//! reports then grows with the bytes a lane has queued there, not only with the path.

use super::*;

/// A 1,000-packet queue of 1,452-byte packets at 12.5 MB/s.
const HTB_QUEUE: Duration = Duration::from_millis(116);

fn queued(mut sc: Scenario) -> Scenario {
    for l in &mut sc.lanes {
        l.buffer = HTB_QUEUE;
    }
    sc
}

/// A lane given bytes for its round trip as reported fills the queue, which lengthens the
/// round trip, which raises what it is given: unless the sender sizes lanes by the path's own
/// round trip, it binds most of the window to lanes at once and late binding is lost.
#[test]
fn behind_a_deep_queue_four_equal_lanes_share_evenly() {
    let o = check(
        queued(Scenario::bulk(vec![lane(12.5); 4])),
        0.02,
        Shares::Within5,
    );
    assert_eq!(o.resent, 0, "no stall: nothing asked again");
}

#[test]
fn behind_a_deep_queue_eight_equal_lanes_share_evenly() {
    check(
        queued(Scenario::bulk(vec![lane(12.5); 8])),
        0.03,
        Shares::Within5,
    );
}

#[test]
fn behind_a_deep_queue_one_lane_at_half_still_fills_the_sum_of_caps() {
    let lanes = vec![lane(6.25), lane(12.5), lane(12.5), lane(12.5)];
    check(queued(Scenario::bulk(lanes)), 0.03, Shares::Within5);
}

#[test]
fn live_behind_a_deep_queue_one_lane_at_half_still_fills_the_sum_of_caps() {
    let lanes = vec![lane(6.25), lane(12.5), lane(12.5), lane(12.5)];
    check(queued(Scenario::live(lanes)), 0.03, Shares::Within5);
}
