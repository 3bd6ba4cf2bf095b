//! `ledger-bench tiers` end to end in a tiny configuration against the real binaries: a root
//! and an edge relay, a tree of two edges, and (as root) the hedge part on the emulated network.
//! Every row is real: each subscriber wrote exactly its ledgers in order (checked by the run),
//! the edge's subscriber gets each ledger after the root's (store-and-forward), CPU is
//! measured, and the degraded relay is slower than the healthy one while the hedged
//! subscriber is not. Skips with the reason when the binaries are not built next to the test.

use clap::Parser;
use ledger_relay_bench::tiers::{self, Part};
use ledger_relay_bench::{Cli, Helper};

#[test]
fn tier_tree_and_hedge_rows_are_measured() {
    for bin in ["ledger-relay", "ledger-subscribe"] {
        if let Err(e) = ledger_relay_bench::proc::sibling_binary(bin) {
            eprintln!("skipped: {e:#} (cargo build --workspace builds it)");
            return;
        }
    }
    let argv = [
        "ledger-bench",
        "tiers",
        "--payload",
        "compressed",
        "--ledgers",
        "4",
        "--warmup",
        "1",
        "--cadence-ms",
        "200",
        "--tree-cadence-ms",
        "300",
        "--tree-subscribers",
        "2",
        "--edges",
        "2",
        "--ledger-bytes",
        "1048576",
        "--ratio",
        "2",
        "--lanes",
        "2",
    ];
    let Some(Helper::Tiers(args)) = Cli::try_parse_from(argv).unwrap().helper else {
        panic!("not the tiers subcommand")
    };
    let report = tiers::run(&args).unwrap();
    eprint!("{}", tiers::table(&report.rows));
    for r in &report.rows {
        assert_eq!(r.error, None, "{}", r.row);
        assert_eq!(r.ledgers, 4, "{}", r.row);
        assert_eq!(r.delivery.per_ledger.len(), 4, "{}", r.row);
        assert!(r.delivery.p50_ms > 0.0 && r.wire_mb > 0.0, "{r:?}");
    }
    let get = |part: Part, name: &str| {
        report
            .rows
            .iter()
            .find(|r| r.part == part && r.row == name)
            .unwrap_or_else(|| panic!("no {part:?} {name} row"))
    };
    // The edge forwards whole ledgers: its subscriber has each one after the root's.
    let edge = get(Part::Tier, "edge");
    let added = edge.added.as_ref().expect("added delivery");
    assert!(added.p50_ms > 0.0, "{added:?}");
    assert!(edge.edge_cpu_ms.is_some_and(|c| c > 0.0), "{edge:?}");
    let direct = get(Part::Tree, "direct-2");
    let tree = get(Part::Tree, "tree-2x1");
    assert!(direct.root_cpu_ms.is_some_and(|c| c > 0.0), "{direct:?}");
    assert!(
        tree.root_cpu_ms.is_some() && tree.edge_cpu_ms.is_some(),
        "{tree:?}"
    );
    match &report.extra.hedge_skipped {
        Some(why) => eprintln!("hedge part skipped: {why}"),
        None => {
            let (a, b, h) = (
                get(Part::Hedge, "A"),
                get(Part::Hedge, "B"),
                get(Part::Hedge, "hedged"),
            );
            // B's port has a tenth of A's rate: its ledgers take visibly longer, and the hedged
            // subscriber takes A's copies.
            assert!(b.delivery.p50_ms > a.delivery.p50_ms, "{a:?} {b:?}");
            assert!(h.delivery.p50_ms < b.delivery.p50_ms, "{h:?} {b:?}");
        }
    }
    assert!(tiers::csv(&report.rows).lines().count() == report.rows.len() + 1);
}
