use super::*;

fn lane(lane: u8, cap_mbit: f64, mb: f64) -> LaneStat {
    LaneStat {
        lane,
        cap_mbit,
        delivered_bytes: mb * 1e6,
        ..LaneStat::default()
    }
}

#[test]
fn lane_series_parse_by_lane_number() {
    let text = "\
# HELP ledger_relay_lane_bytes_sent_total UDP bytes sent, by lane number.
ledger_relay_lane_bytes_sent_total{lane=\"0\"} 1000
ledger_relay_lane_bytes_sent_total{lane=\"1\"} 2000
ledger_relay_lane_delivered_bytes_total{lane=\"1\"} 1900
ledger_relay_lane_busy_seconds_total{lane=\"1\"} 1.5
ledger_relay_lane_rtt_seconds{lane=\"1\"} 0.002
ledger_relay_lane_lost_packets_total{lane=\"0\"} 7
ledger_relay_lane_mtu_bytes{lane=\"0\"} 1452
ledger_relay_lane_cwnd_bytes{lane=\"x\"} 5
ledger_relay_ring_bytes 12
";
    let lanes = parse_lanes(text);
    assert_eq!(lanes.len(), 2, "{lanes:?}");
    assert_eq!(lanes[&0].sent_bytes, 1000.0);
    assert_eq!(lanes[&0].lost_packets, 7.0);
    assert_eq!(lanes[&0].mtu_bytes, 1452.0);
    assert_eq!(lanes[&1].delivered_bytes, 1900.0);
    assert_eq!(lanes[&1].busy_s, 1.5);
    assert!((lanes[&1].rtt_ms - 2.0).abs() < 1e-9);
}

#[test]
fn imbalance_is_measured_against_each_lanes_share_of_its_cap() {
    // The 96 MiB transfer: 20.2, 31.8, 30.1 and 24.0 MB on four equal lanes.
    let seen = [
        lane(0, 100.0, 20.2),
        lane(1, 100.0, 31.8),
        lane(2, 100.0, 30.1),
        lane(3, 100.0, 24.0),
    ];
    let i = imbalance(&seen);
    assert!((i - (26.525 - 20.2) / 26.525).abs() < 1e-9, "{i}");
    // A half-cap lane carrying half as much is perfectly balanced.
    let unequal = [
        lane(0, 50.0, 10.0),
        lane(1, 100.0, 20.0),
        lane(2, 100.0, 20.0),
    ];
    assert!(imbalance(&unequal) < 1e-12);
    assert_eq!(imbalance(&[lane(0, 100.0, 5.0)]), 0.0);
    assert_eq!(imbalance(&[lane(0, 100.0, 0.0), lane(1, 100.0, 0.0)]), 0.0);
}

fn row(mode: LaneMode, caps: &[f64], goodput: f64, mb: &[f64]) -> LaneRow {
    let per_lane: Vec<LaneStat> = caps
        .iter()
        .zip(mb)
        .enumerate()
        .map(|(i, (&c, &m))| lane(i as u8, c, m))
        .collect();
    LaneRow {
        ledgers: 96,
        raw_bytes: 96 << 21,
        transfer_s: 1.0,
        goodput_mib_s: goodput,
        imbalance: imbalance(&per_lane),
        per_lane,
        sub_cpu_s: 1.0,
        relay_cpu_s: 1.0,
        ..LaneRow::new(mode, caps, 1)
    }
}

#[test]
fn targets_compare_with_one_lane_of_the_same_mode_and_run() {
    let rows = vec![
        row(LaneMode::Live, &[100.0], 11.0, &[100.0]),
        row(LaneMode::Live, &[100.0; 4], 40.0, &[25.0, 25.0, 25.0, 25.5]),
        row(LaneMode::CatchUp, &[100.0], 11.0, &[100.0]),
        row(
            LaneMode::CatchUp,
            &[100.0; 4],
            33.0,
            &[20.2, 31.8, 30.1, 24.0],
        ),
        row(
            LaneMode::Live,
            &[50.0, 100.0, 100.0, 100.0],
            40.0,
            &[10.0, 20.0, 20.0, 20.0],
        ),
    ];
    let t = targets(&rows);
    let line = |needle: &str| {
        t.lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no {needle:?} in\n{t}"))
            .to_owned()
    };
    assert!(
        line("live-l4 run 1: goodput / 1 lane").contains(" met "),
        "{t}"
    );
    assert!(line("live-l4 run 1: largest lane").contains(" met "), "{t}");
    assert!(
        line("catch-up-l4 run 1: goodput / 1 lane").contains("MISSED"),
        "{t}"
    );
    assert!(
        line("catch-up-l4 run 1: largest lane").contains("MISSED"),
        "{t}"
    );
    // 40 MiB/s of 350 Mbit/s (41.7 MiB/s): 96%.
    assert!(
        line("live-l4-halfcap run 1: goodput / sum of caps").contains(" met "),
        "{t}"
    );
    assert!(!t.contains("live-l1"), "one lane has no target: {t}");
    let table = table(&rows);
    assert!(table.contains("live-l4-halfcap"), "{table}");
    assert_eq!(csv(&rows).lines().count(), 1 + 1 + 4 + 1 + 4 + 4);
}
