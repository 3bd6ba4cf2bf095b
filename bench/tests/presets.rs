//! Presets as data: every built-in one parses and expands into rows that can run; flags and
//! `--set` override fields of every row, sweeps multiply them, and mistakes are refused with
//! the row and the reason.

use clap::Parser;
use ledger_relay_bench::scenario::{Carrier, Mode, NetKind, Preset, Scenario, TopoKind, PRESETS};
use ledger_relay_bench::{Cli, Command};

/// The rows of `ledger-bench run ARGS`.
fn rows(args: &[&str]) -> anyhow::Result<Vec<Scenario>> {
    let Command::Run(a) =
        Cli::try_parse_from([&["ledger-bench", "run"][..], args].concat())?.command
    else {
        panic!("not run")
    };
    a.scenarios()
}

fn names(rows: &[Scenario]) -> Vec<&str> {
    rows.iter().map(|r| r.name.as_str()).collect()
}

#[test]
fn every_built_in_preset_expands_into_rows_that_can_run() {
    for (name, _) in PRESETS {
        let rows = rows(&["--preset", name]).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        assert!(!rows.is_empty(), "{name}");
        assert!(
            !Preset::load(name).unwrap().about.is_empty(),
            "{name} says what it measures"
        );
    }
    // The table: the yardstick's row, lanes, modes and the loopback rows, scaled ledgers.
    let table = rows(&[]).unwrap();
    assert_eq!(table.len(), 26);
    let tcp = &table[0];
    assert_eq!(
        (tcp.name.as_str(), tcp.carrier, tcp.network),
        ("tcp-1flow", Carrier::Tcp, NetKind::Emulated)
    );
    assert_eq!(
        (tcp.size, tcp.chunk, tcp.ledgers, tcp.warmup, tcp.cadence),
        (608_174, 10_485, 57, 3, 600.0)
    );
    let bulk = table.iter().find(|r| r.name == "bulk-raw-l4").unwrap();
    assert_eq!(
        (bulk.mode, bulk.lanes, bulk.cadence, bulk.codec.as_str()),
        (Mode::CatchUp, 4, 20.0, "none")
    );
    let shape = bulk.shape().unwrap_or_else(|| panic!("{bulk:?}"));
    assert_eq!(
        (shape.flow_bps, shape.aggregate_bps),
        (200_000_000, 1_600_000_000)
    );
    // The fan-out preset's own sweep: 2 payloads x 4 subscriber counts.
    let fanout = rows(&["--preset", "fanout"]).unwrap();
    assert_eq!(
        names(&fanout)[..5],
        [
            "compressed/subscribers=1",
            "compressed/subscribers=4",
            "compressed/subscribers=16",
            "compressed/subscribers=64",
            "raw/subscribers=1"
        ]
    );
    assert_eq!(fanout[3].cadence_ms(), 64.0 * 40.0);
    assert_eq!(fanout[7].cadence_ms(), 64.0 * 80.0);
    let tree = rows(&["--preset", "tiers", "--only", "tree-4x4"]).unwrap();
    let t = &tree[0];
    assert_eq!(
        (t.topology, t.edges, t.cut_through, t.root_subscriber),
        (TopoKind::Tier, 4, false, false)
    );
}

#[test]
fn flags_set_every_row_and_sweeps_multiply_them() {
    let r = rows(&[
        "--preset",
        "lanes",
        "--only",
        "live-l1",
        "--ledgers",
        "30",
        "--flow-mbit",
        "50",
        "--set",
        "receive_only=true",
        "--set",
        "cadence=40ms",
        "--set",
        r#"relay_transport=["gso = false", "fair_streams = true"]"#,
    ])
    .unwrap();
    assert_eq!(names(&r), ["live-l1"]);
    assert_eq!(r[0].relay_transport, ["gso = false", "fair_streams = true"]);
    assert_eq!(
        (
            r[0].ledgers,
            r[0].flow_mbit,
            r[0].receive_only,
            r[0].cadence
        ),
        (30, 50.0, true, 40.0)
    );
    let r = rows(&[
        "--preset",
        "fanout",
        "--only",
        "raw",
        "--sweep",
        "subscribers=2,3",
        "--sweep",
        "lanes=1,2",
    ])
    .unwrap();
    assert_eq!(
        names(&r),
        [
            "raw/subscribers=2/lanes=1",
            "raw/subscribers=2/lanes=2",
            "raw/subscribers=3/lanes=1",
            "raw/subscribers=3/lanes=2"
        ]
    );
    assert_eq!((r[3].subscribers, r[3].lanes), (3, 2));
    let r = rows(&[
        "--preset", "quick", "--only", "pipe", "--repeat", "2", "--size", "1MiB",
    ])
    .unwrap();
    assert_eq!((r.len(), r[1].size), (2, 1 << 20));
}

#[test]
fn mistakes_are_refused_with_the_row_and_the_reason() {
    let err = |args: &[&str]| format!("{:#}", rows(args).unwrap_err());
    assert!(err(&["--set", "lanse=2"]).contains("lanse"));
    assert!(err(&["--set", "lanes=0"]).contains("lanes 1 to 16"));
    assert!(err(&["--preset", "no-such-preset"]).contains("neither a preset"));
    assert!(err(&["--only", "nothing"]).contains("no row selected"));
    assert!(err(&["--cadence", "soon"]).contains("soon"));
    assert!(
        err(&["--preset", "hedge", "--network", "loopback"]).contains("needs the emulated network")
    );
    assert!(
        err(&["--preset", "lanes", "--set", "sessions_per_process=2"]).contains("its own process")
    );
}
