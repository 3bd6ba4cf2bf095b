//! The emulation is real: with a per-flow cap, one lane's measured rate stays under the cap and
//! two lanes exceed it. Not a timing test: it checks rates against a cap, with a wide margin.
//! The rate is the sustained one of the `bulk-*` rows (ledgers back to back from the ring, over
//! several ledgers), not one ledger's goodput, which HTB's burst allowance can lift a few
//! percent over the cap. Root only (network namespaces, tc); skips with a printed reason
//! otherwise.

use ledger_relay_bench::{Args, Cli, Network};

use clap::Parser;

#[test]
fn one_lane_stays_under_the_flow_cap_and_two_lanes_exceed_it() {
    if let Some(reason) = ledger_relay_bench::netem::unavailable_reason() {
        eprintln!("skipped: {reason}");
        return;
    }
    for bin in ["ledger-relay", "ledger-subscribe"] {
        if let Err(e) = ledger_relay_bench::proc::sibling_binary(bin) {
            eprintln!("skipped: {e:#} (cargo test --workspace builds it)");
            return;
        }
    }
    // 40 Mbit/s per flow: far below what this machine moves, so the cap, not the CPU, is
    // what limits a lane. 250 KB ledgers take about 51 ms on one flow: 40 back to back, about
    // 2 s; the warm-up leaves out the first window of ledgers, which complete in a burst.
    let cli = Cli::try_parse_from([
        "ledger-bench",
        "--network",
        "emulated",
        "--only",
        "bulk-raw-l1",
        "--only",
        "bulk-raw-l2",
        "--ledgers",
        "40",
        "--warmup",
        "10",
        "--cadence-ms",
        "300",
        "--flow-mbit",
        "40",
        "--emulated-flow-mbit",
        "40",
        "--ledger-bytes",
        "256000",
        "--chunk-bytes",
        "16384",
        "--no-progress",
    ])
    .unwrap();
    let args: Args = cli.args;
    assert_eq!(args.network, Network::Emulated);
    let start = std::time::Instant::now();
    let rows = ledger_relay_bench::run(&args).unwrap();
    assert!(start.elapsed().as_secs() < 60, "took {:?}", start.elapsed());
    let cap_mib_s = 40e6 / 8.0 / f64::from(1 << 20);
    let rate = |name: &str| {
        let row = rows.iter().find(|r| r.scenario.name == name).unwrap();
        assert!(row.error.is_none(), "{name}: {:?}", row.error);
        assert!(row.summary.ledgers >= 5, "{name}: {:?}", row.summary);
        row.summary.throughput_mib_s
    };
    let (one, two) = (rate("bulk-raw-l1"), rate("bulk-raw-l2"));
    eprintln!("cap {cap_mib_s:.2} MiB/s: 1 lane {one:.2} MiB/s, 2 lanes {two:.2} MiB/s");
    assert!(
        one < cap_mib_s,
        "1 lane {one:.2} MiB/s is not under the cap"
    );
    assert!(
        two > cap_mib_s,
        "2 lanes {two:.2} MiB/s do not exceed the cap"
    );
}
