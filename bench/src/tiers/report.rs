//! The tables of `ledger-bench tiers`.

use std::fmt::Write;

use super::{Part, TierRow};
use crate::report::{csv_of, opt, table_of, Col, CsvCol};

/// `part` or `payload` as the table and the CSV spell it.
fn lower(v: impl std::fmt::Debug) -> String {
    format!("{v:?}").to_lowercase()
}

/// The rows as a fixed-width table.
pub fn table(rows: &[TierRow]) -> String {
    let cols: [Col<TierRow>; 13] = [
        Col::l("part", 6, |r| lower(r.part)),
        Col::l("row", 10, |r| r.row.clone()),
        Col::l("payload", 10, |r| lower(r.payload)),
        Col::r("subs", 4, |r| r.subscribers.to_string()),
        Col::r("cadence", 7, |r| format!("{:.0}ms", r.cadence_ms)),
        Col::r("wire_MB", 7, |r| format!("{:.2}", r.wire_mb)),
        Col::r("p50_ms", 8, |r| format!("{:.1}", r.delivery.p50_ms)),
        Col::r("p99_ms", 8, |r| format!("{:.1}", r.delivery.p99_ms)),
        Col::r("max_ms", 8, |r| format!("{:.1}", r.delivery.max_ms)),
        Col::r("added50", 9, |r| opt(r.added.as_ref().map(|a| a.p50_ms), 1)),
        Col::r("added99", 9, |r| opt(r.added.as_ref().map(|a| a.p99_ms), 1)),
        Col::r("root_ms", 8, |r| opt(r.root_cpu_ms, 1)),
        Col::r("edge_ms", 8, |r| opt(r.edge_cpu_ms, 1)),
    ];
    table_of(&cols, rows, (3, "FAILED"), |r| r.error.as_deref())
}

/// The comparisons the issue asks for, from the rows that ran.
pub fn compare(rows: &[TierRow]) -> String {
    let mut out = String::new();
    let ok = |part: Part, name: &str| {
        rows.iter()
            .filter(|r| r.part == part && r.row == name && r.error.is_none())
            .collect::<Vec<_>>()
    };
    for (part, label) in [(Part::Tier, "tier"), (Part::TierZone, "tier-zone")] {
        for (name, what) in [("edge", "an edge"), ("edge-ct", "a cut-through edge")] {
            for r in ok(part, name) {
                if let Some(a) = &r.added {
                    let _ = writeln!(
                        out,
                        "{label}, {:?}: {what} adds {:.1} ms at p50 and {:.1} ms at p99 (largest {:.1}) to delivery; it costs {} ms of CPU per ledger",
                        r.payload,
                        a.p50_ms,
                        a.p99_ms,
                        a.max_ms,
                        opt(r.edge_cpu_ms, 1)
                    );
                }
            }
        }
        for sf in ok(part, "edge") {
            let ct = ok(part, "edge-ct")
                .into_iter()
                .find(|r| r.payload == sf.payload);
            if let (Some(a), Some(b)) = (&sf.added, ct.and_then(|c| c.added.as_ref())) {
                let _ = writeln!(
                    out,
                    "{label}, {:?}: cut-through against store-and-forward, added delivery p50 {:.1} against {:.1} ms, p99 {:.1} against {:.1} ms",
                    sf.payload, b.p50_ms, a.p50_ms, b.p99_ms, a.p99_ms
                );
            }
        }
    }
    let direct = rows
        .iter()
        .find(|r| r.part == Part::Tree && r.row.starts_with("direct") && r.error.is_none());
    let tree = rows
        .iter()
        .find(|r| r.part == Part::Tree && r.row.starts_with("tree") && r.error.is_none());
    if let (Some(d), Some(t)) = (direct, tree) {
        if let (Some(dc), Some(tc)) = (d.root_cpu_ms, t.root_cpu_ms) {
            let _ = writeln!(
                out,
                "tree: the root spends {tc:.1} ms per ledger behind {} against {dc:.1} ms with {} direct subscribers ({:.2}x); last subscriber p99 {:.1} ms against {:.1} ms",
                t.row,
                d.subscribers,
                tc / dc,
                t.delivery.p99_ms,
                d.delivery.p99_ms
            );
        }
    }
    let (a, b, h) = (
        ok(Part::Hedge, "A"),
        ok(Part::Hedge, "B"),
        ok(Part::Hedge, "hedged"),
    );
    if let (Some(a), Some(b), Some(h)) = (a.first(), b.first(), h.first()) {
        let _ = writeln!(
            out,
            "hedge: p99 {:.1} ms hedged on A and a degraded B, against {:.1} ms on A alone and {:.1} ms on B alone ({:.2}x A's)",
            h.delivery.p99_ms,
            a.delivery.p99_ms,
            b.delivery.p99_ms,
            h.delivery.p99_ms / a.delivery.p99_ms
        );
    }
    out
}

/// The rows as CSV (absent figures empty).
pub fn csv(rows: &[TierRow]) -> String {
    fn o(v: Option<f64>) -> String {
        v.map_or(String::new(), |v| format!("{v:.3}"))
    }
    let cols: [CsvCol<TierRow>; 15] = [
        ("part", |r| lower(r.part)),
        ("row", |r| r.row.clone()),
        ("payload", |r| lower(r.payload)),
        ("subscribers", |r| r.subscribers.to_string()),
        ("cadence_ms", |r| r.cadence_ms.to_string()),
        ("ledgers", |r| r.ledgers.to_string()),
        ("wire_mb", |r| format!("{:.3}", r.wire_mb)),
        ("p50_ms", |r| format!("{:.3}", r.delivery.p50_ms)),
        ("p99_ms", |r| format!("{:.3}", r.delivery.p99_ms)),
        ("max_ms", |r| format!("{:.3}", r.delivery.max_ms)),
        ("added_p50_ms", |r| o(r.added.as_ref().map(|a| a.p50_ms))),
        ("added_p99_ms", |r| o(r.added.as_ref().map(|a| a.p99_ms))),
        ("root_cpu_ms", |r| o(r.root_cpu_ms)),
        ("edge_cpu_ms", |r| o(r.edge_cpu_ms)),
        ("error", |r| {
            r.error.as_deref().unwrap_or("").replace(',', ";")
        }),
    ];
    csv_of(&cols, rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fanout::Payload;
    use crate::tiers::{row, Delivery};

    #[test]
    fn comparisons_come_from_the_rows() {
        let mut d = row(Part::Tier, "direct", Payload::Raw, 1, 600.0);
        d.delivery = Delivery::of(vec![(5, 100.0), (6, 120.0)]);
        let mut e = row(Part::Tier, "edge", Payload::Raw, 1, 600.0);
        e.delivery = Delivery::of(vec![(5, 150.0), (6, 200.0)]);
        e.added = Some(Delivery::of(vec![(5, 50.0), (6, 80.0)]));
        e.edge_cpu_ms = Some(42.0);
        let mut t0 = row(Part::Tree, "direct-16", Payload::Compressed, 16, 1500.0);
        t0.root_cpu_ms = Some(200.0);
        let mut t1 = row(Part::Tree, "tree-4x4", Payload::Compressed, 16, 1500.0);
        t1.root_cpu_ms = Some(50.0);
        let mut bad = row(Part::Hedge, "A+B", Payload::Compressed, 1, 600.0);
        bad.error = Some("no, really".into());
        let rows = vec![d, e, t0, t1, bad];
        let c = compare(&rows);
        assert!(c.contains("adds 50.0 ms at p50 and 80.0 ms at p99"), "{c}");
        assert!(c.contains("costs 42.0 ms"), "{c}");
        assert!(c.contains("(0.25x)"), "{c}");
        assert!(!c.contains("hedge:"), "{c}");
        let t = table(&rows);
        assert!(t.contains("FAILED: no, really"), "{t}");
        assert_eq!(csv(&rows).lines().count(), 6);
    }
}
