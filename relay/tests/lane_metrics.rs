//! Per-lane metrics in a real run on loopback: a 4-lane `ledger-subscribe` (its `cli::run`, in
//! process) with `--lane-stats` against the relay; the relay's Prometheus lane series and the
//! subscriber's lane file are present for every lane and move while ledgers flow.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use clap::Parser as _;
use ledger_relay::config::{RelayConfig, RunArgs};
use ledger_relay_subscriber::LaneStats;
use ledger_relay_subscriber_bin::cli::{self, Args};

use crate::support::{eventually, init_tracing, within, Running, TestDir};

const LEDGERS: u64 = 200;
const LANES: u8 = 4;

/// The relay's `ledger_relay_lane_*` samples: (series, lane) -> value.
fn lane_series(text: &str) -> BTreeMap<(String, u8), f64> {
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with("ledger_relay_lane_")) {
        let Some((key, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Some((name, rest)) = key.split_once("{lane=\"") else {
            continue;
        };
        let lane: u8 = rest.trim_end_matches("\"}").parse().unwrap();
        out.insert((name.to_owned(), lane), value.parse().unwrap());
    }
    out
}

/// `ledger-subscribe` from ledger 2 for `count` ledgers over [`LANES`] lanes, writing its lane
/// file every 100 ms, with `extra` flags.
fn subscriber_args(
    relay: &Running,
    dir: &TestDir,
    count: u64,
    lane_file: &std::path::Path,
    extra: &[&str],
) -> Args {
    let out = dir.path().join("ledgers.xdr");
    let relay_addr = format!("127.0.0.1:{}", relay.relay.addr.port());
    let count = count.to_string();
    let lanes = LANES.to_string();
    let mut argv = vec![
        "ledger-subscribe",
        "--relay",
        &relay_addr,
        "--certs",
        dir.certs.path().to_str().unwrap(),
        "--name",
        "rpc-1",
        "--from",
        "2",
        "--count",
        &count,
        "--lanes",
        &lanes,
        "--out",
        out.to_str().unwrap(),
        "--lane-stats",
        lane_file.to_str().unwrap(),
        "--lane-stats-interval",
        "100ms",
        "--quiet",
    ];
    argv.extend_from_slice(extra);
    Args::try_parse_from(argv).unwrap()
}

/// A relay of 256 KiB raw ledgers (16 KiB chunks: 16 a ledger, spread over the lanes).
fn relay_config(dir: &TestDir, count: u64) -> RelayConfig {
    RelayConfig::from_args(RunArgs {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        certs: Some(dir.certs.path().to_path_buf()),
        data_dir: Some(dir.data()),
        source: Some(format!(
            "synthetic:size=256KiB,ratio=1,count={count},start=2"
        )),
        cadence: Some("15ms".into()),
        emit: Some("1ms".into()),
        heartbeat: Some("50ms".into()),
        codec: Some("none".into()),
        chunk_size: Some("16KiB".into()),
        ..RunArgs::default()
    })
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lane_metrics_move_on_both_ends() {
    init_tracing();
    let dir = TestDir::new();
    let config = relay_config(&dir, LEDGERS);
    let relay = Running::start(config).await;
    let lane_file = dir.path().join("lanes.csv");
    let args = subscriber_args(&relay, &dir, LEDGERS, &lane_file, &[]);
    // In this task, beside the checks (the run's future need not be Send).
    let run = cli::run(args.into_config().unwrap(), std::future::pending());

    // Two reads of the relay's series while ledgers flow: every lane's counters grew.
    let m = relay.relay.metrics.clone();
    let out_at = |n: u64| {
        let m = m.clone();
        move || m.ledgers_out_total.load(Ordering::Relaxed) >= n
    };
    let reads = async {
        eventually(60, "40 ledgers sent", out_at(40)).await;
        let first = lane_series(&m.render());
        eventually(60, "120 ledgers sent", out_at(120)).await;
        // The sessions report their lanes every 50 ms.
        tokio::time::sleep(std::time::Duration::from_millis(120)).await;
        (first, lane_series(&m.render()))
    };
    let (summary, (first, second)) = within(120, "the subscriber finishes", async {
        tokio::join!(run, reads)
    })
    .await;
    let summary = summary.unwrap();
    assert_eq!(summary.ledgers, LEDGERS);
    for lane in 0..LANES {
        let at = |s: &BTreeMap<(String, u8), f64>, name: &str| -> f64 {
            *s.get(&(format!("ledger_relay_{name}"), lane))
                .unwrap_or_else(|| panic!("no ledger_relay_{name} for lane {lane}"))
        };
        for counter in [
            "lane_bytes_sent_total",
            "lane_packets_sent_total",
            "lane_delivered_bytes_total",
            "lane_busy_seconds_total",
        ] {
            assert!(
                at(&second, counter) > at(&first, counter),
                "{counter} of lane {lane} did not move: {} then {}",
                at(&first, counter),
                at(&second, counter)
            );
        }
        assert!(at(&second, "lane_rtt_seconds") > 0.0, "lane {lane}");
        assert!(at(&second, "lane_cwnd_bytes") > 0.0, "lane {lane}");
        assert!(at(&second, "lane_mtu_bytes") >= 1200.0, "lane {lane}");
    }
    assert!(
        !second.keys().any(|(_, lane)| *lane >= LANES),
        "no series for lanes no session opened"
    );

    relay.stop().await;

    // The lane file: the header, rows for lanes 0..4 only, and each lane's received bytes and
    // packets growing over the run, with its path figures filled in.
    let text = std::fs::read_to_string(&lane_file).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some(LaneStats::CSV_HEADER));
    let header: Vec<&str> = LaneStats::CSV_HEADER.split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let mut per_lane: BTreeMap<u8, Vec<Vec<String>>> = BTreeMap::new();
    for line in lines {
        let f: Vec<String> = line.split(',').map(str::to_owned).collect();
        assert_eq!(f.len(), header.len(), "{line}");
        per_lane
            .entry(f[col("lane")].parse().unwrap())
            .or_default()
            .push(f);
    }
    assert_eq!(
        per_lane.keys().copied().collect::<Vec<u8>>(),
        (0..LANES).collect::<Vec<u8>>()
    );
    for (lane, rows) in &per_lane {
        assert!(rows.len() >= 3, "lane {lane}: {} rows", rows.len());
        let n = |row: &Vec<String>, name: &str| -> f64 { row[col(name)].parse().unwrap() };
        let (first, last) = (&rows[0], &rows[rows.len() - 1]);
        for counter in ["rx_bytes", "rx_packets", "tx_packets"] {
            assert!(
                n(last, counter) > n(first, counter),
                "lane {lane}: {counter} did not move"
            );
            // Cumulative: never decreasing.
            assert!(
                rows.windows(2)
                    .all(|w| n(&w[1], counter) >= n(&w[0], counter)),
                "lane {lane}: {counter} went down"
            );
        }
        // Rows in between moved too, not only the last one: at least one interval of the run
        // saw the lane receive.
        let moving = rows
            .windows(2)
            .filter(|w| n(&w[1], "rx_bytes") > n(&w[0], "rx_bytes"))
            .count();
        assert!(
            moving >= 2,
            "lane {lane}: rx_bytes moved in {moving} intervals"
        );
        // How evenly the lanes share the bytes is the striper's, asserted in the sender's
        // simulator (wire/tests/sender_sim.rs); a real run on a loaded machine only shows that
        // every lane carries data, which the counters above do.
        assert!(n(last, "rtt_ms") > 0.0, "lane {lane}");
        assert!(n(last, "cwnd_bytes") > 0.0, "lane {lane}");
        assert!(n(last, "mtu_bytes") >= 1200.0, "lane {lane}");
        assert_eq!(n(last, "up"), 1.0, "lane {lane} is up at the last rows");
        assert!(n(last, "connections") >= 1.0, "lane {lane}");
    }
}

/// Jumbo packets set on both ends (`[transport] max_mtu = min_mtu = 8952` on the relay,
/// `--max-mtu 8952 --min-mtu 8952` on the subscriber): every lane's path MTU is 8952 on both
/// sides, and the subscriber receives packets larger than a 1500-byte Ethernet frame carries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jumbo_packets_are_set_on_both_ends() {
    init_tracing();
    const JUMBO: u16 = 8952;
    const COUNT: u64 = 30;
    let dir = TestDir::new();
    let mut config = relay_config(&dir, COUNT);
    config.transport.max_mtu = JUMBO;
    config.transport.min_mtu = JUMBO;
    let relay = Running::start(config).await;
    let lane_file = dir.path().join("lanes.csv");
    let jumbo = JUMBO.to_string();
    let args = subscriber_args(
        &relay,
        &dir,
        COUNT,
        &lane_file,
        &["--max-mtu", &jumbo, "--min-mtu", &jumbo],
    );
    let config = args.into_config().unwrap();
    assert_eq!(config.subscribe.transport.max_mtu, JUMBO);
    assert_eq!(config.subscribe.transport.min_mtu, JUMBO);
    let summary = within(120, "the subscriber finishes", async {
        cli::run(config, std::future::pending()).await
    })
    .await
    .unwrap();
    assert_eq!(summary.ledgers, COUNT);
    tokio::time::sleep(std::time::Duration::from_millis(120)).await;
    let series = lane_series(&relay.relay.metrics.render());
    relay.stop().await;
    let get = |name: &str, lane: u8| -> f64 {
        *series
            .get(&(format!("ledger_relay_{name}"), lane))
            .unwrap_or_else(|| panic!("no {name} for lane {lane}"))
    };
    for lane in 0..LANES {
        assert_eq!(
            get("lane_mtu_bytes", lane),
            f64::from(JUMBO),
            "the relay's lane {lane}"
        );
    }
    // Loopback loses next to nothing; a GSO batch over 64 KiB (quinn's 10 packets of 8952
    // bytes) is refused by the kernel and was dropped whole, a third of the packets or more.
    let sent: f64 = (0..LANES).map(|l| get("lane_packets_sent_total", l)).sum();
    let lost: f64 = (0..LANES).map(|l| get("lane_lost_packets_total", l)).sum();
    assert!(
        lost <= 0.05 * sent,
        "{lost} of {sent} jumbo packets declared lost"
    );
    let text = std::fs::read_to_string(&lane_file).unwrap();
    let header: Vec<&str> = LaneStats::CSV_HEADER.split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let mut last: BTreeMap<u8, Vec<f64>> = BTreeMap::new();
    for line in text.lines().skip(1) {
        let f: Vec<f64> = line.split(',').map(|v| v.parse().unwrap_or(0.0)).collect();
        last.insert(f[col("lane")] as u8, f);
    }
    assert_eq!(last.len(), usize::from(LANES), "{text}");
    for (lane, f) in &last {
        assert_eq!(
            f[col("mtu_bytes")],
            f64::from(JUMBO),
            "the subscriber's lane {lane}"
        );
    }
    // Lane 0 also carries the session's control stream and every lane its acknowledgements,
    // all small packets; over all lanes, the chunks' full-size packets lift the mean above
    // what a 1452-byte path can carry.
    let sum = |name: &str| -> f64 { last.values().map(|f| f[col(name)]).sum() };
    let per_packet = sum("rx_bytes") / sum("rx_packets");
    assert!(
        per_packet > 1500.0,
        "{per_packet:.0} bytes a packet received: no jumbo packets\n{text}"
    );
}
