//! The unscaled projection of a row (issue 12 item 5): its CPU per ledger at the real ledger
//! size, and a projected EC2 delivery p50/p99 that adds what the scaled run left out.
//!
//! The bench divides the ledger size (and the per-flow cap, on the emulated network) by
//! `scale`, so that wire times keep EC2's proportions; CPU then shrinks with the bytes and is
//! understated `scale` times. For each relay or TCP row:
//!
//! ```text
//! cpu_row   = relay path CPU + subscriber CPU, ms per ledger, measured at the row's size
//! cpu_real  = cpu_row / raw bytes per ledger of the row * real ledger size
//! cores     = min(lanes, cores of this machine)     (1 for one TCP flow)
//! wire_add  = 0 on the emulated network (its cap was scaled with the size, so the measured
//!             delivery already holds the wire time of the real size at EC2's per-flow cap);
//!             on loopback, the model bound at the real size: real wire bytes over
//!             min(lanes x EC2 per-flow cap, aggregate), at least one real chunk at one flow's
//!             cap, less the emit window
//! projected pXX = measured pXX + (cpu_real - cpu_row) / cores + wire_add
//! ```
//!
//! Pessimistic in two ways, both stated with the results: every CPU millisecond is taken as on
//! the delivery path and serial between the two ends (they overlap while chunks stream), and
//! CPU is taken as linear in bytes (a fixed per-ledger cost is scaled too).

use crate::report::{opt, table_of, Col};
use crate::scenario::{model_bound_ms, Kind, Row, Settings};

/// The moonshot for raw ledgers: delivery p99 at most this, ms.
pub const MOONSHOT_RAW_P99_MS: f64 = 4.0;
/// The moonshot for compressed ledgers.
pub const MOONSHOT_COMPRESSED_P99_MS: f64 = 1.0;

/// One row's projection.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Projection {
    /// Real ledger size, raw bytes.
    pub real_bytes: f64,
    /// Real size over the row's mean raw bytes per ledger.
    pub scale: f64,
    /// CPU per ledger at the row's size on the delivery path (relay path + subscriber), ms.
    pub cpu_row_ms: f64,
    /// The same at the real size, ms.
    pub cpu_real_ms: f64,
    /// Cores the CPU is spread over.
    pub cores: f64,
    /// `(cpu_real - cpu_row) / cores`, ms.
    pub cpu_add_ms: f64,
    /// Wire time the row did not have (loopback), ms.
    pub wire_add_ms: f64,
    /// Projected delivery p50, ms.
    pub p50_ms: f64,
    /// Projected delivery p99, ms.
    pub p99_ms: f64,
    /// The moonshot this row is held to (raw or compressed), ms.
    pub target_ms: f64,
    /// Whether the projected p99 meets it.
    pub met: bool,
}

/// The projection of `row`, when it has the inputs: a relay or TCP row (not catch-up: its
/// delivery is queueing), delivered ledgers and both ends' CPU.
pub fn project(
    row: &Row,
    s: &Settings,
    real_bytes: f64,
    machine_cores: usize,
) -> Option<Projection> {
    let (lanes, codec) = match &row.scenario.kind {
        Kind::Relay { mode, .. } if mode.catch_up => return None,
        Kind::Relay { lanes, codec, .. } => (*lanes, codec.as_str()),
        Kind::Tcp => (1, "none"),
        _ => return None,
    };
    if row.error.is_some() || row.summary.ledgers == 0 || row.summary.raw_bytes <= 0.0 {
        return None;
    }
    let relay = row.relay_path_cpu_ms.or(row.relay_cpu_ms)?;
    let sub = row.sub_run_cpu_ms.or(row.sub_cpu_ms)?;
    let cpu_row_ms = relay + sub;
    if !cpu_row_ms.is_finite() {
        return None;
    }
    let scale = real_bytes / row.summary.raw_bytes;
    let cpu_real_ms = cpu_row_ms * scale;
    let cores = f64::from(lanes).min(machine_cores.max(1) as f64);
    let cpu_add_ms = (cpu_real_ms - cpu_row_ms).max(0.0) / cores;
    let wire_add_ms = if row.scenario.emulated {
        0.0
    } else {
        // EC2's per-flow cap and aggregate: the emulated ones times the size's scale.
        let flow = s.shape.flow_bps as f64 * s.scale;
        let per_sub = s.shape.aggregate_bps as f64 * s.scale / f64::from(row.subscribers.max(1));
        let cap = (f64::from(lanes) * flow).min(per_sub);
        let wire_real = row.summary.wire_bytes * scale;
        let chunk_real = s.chunk as f64 * s.scale / row.summary.ratio.max(1.0);
        model_bound_ms(wire_real, chunk_real.min(wire_real), cap, flow, s.emit_ms)
    };
    let target_ms = if codec == "none" {
        MOONSHOT_RAW_P99_MS
    } else {
        MOONSHOT_COMPRESSED_P99_MS
    };
    let p99_ms = row.summary.p99_ms + cpu_add_ms + wire_add_ms;
    Some(Projection {
        real_bytes,
        scale,
        cpu_row_ms,
        cpu_real_ms,
        cores,
        cpu_add_ms,
        wire_add_ms,
        p50_ms: row.summary.p50_ms + cpu_add_ms + wire_add_ms,
        p99_ms,
        target_ms,
        met: p99_ms <= target_ms,
    })
}

/// The projection table: one line per row that has one.
pub fn table(rows: &[Row]) -> String {
    let rows: Vec<(&Row, &Projection)> = rows
        .iter()
        .filter_map(|r| Some((r, r.projection.as_ref()?)))
        .collect();
    if rows.is_empty() {
        return String::new();
    }
    let cols: [Col<(&Row, &Projection)>; 14] = [
        Col::l("projection (real size)", 22, |x| x.0.scenario.name.clone()),
        Col::r("net", 6, |x| x.0.scenario.network().into()),
        Col::r("ln", 3, |x| x.0.lanes.to_string()),
        Col::r("p50 ms", 8, |x| format!("{:.2}", x.0.summary.p50_ms)),
        Col::r("p99 ms", 8, |x| format!("{:.2}", x.0.summary.p99_ms)),
        Col::r("cpu@real", 9, |x| format!("{:.1}", x.1.cpu_real_ms)),
        Col::r("cores", 5, |x| format!("{:.0}", x.1.cores)),
        Col::r("+cpu", 8, |x| format!("{:.2}", x.1.cpu_add_ms)),
        Col::r("+wire", 8, |x| format!("{:.2}", x.1.wire_add_ms)),
        Col::r("cpu@row", 8, |x| format!("{:.2}", x.1.cpu_row_ms)),
        Col::r("proj p50", 9, |x| format!("{:.2}", x.1.p50_ms)),
        Col::r("proj p99", 9, |x| format!("{:.2}", x.1.p99_ms)),
        Col::r("moon", 6, |x| format!("<={}", x.1.target_ms)),
        Col::l("verdict", 0, |x| crate::report::met(x.1.met).into()),
    ];
    table_of(&cols, &rows, (0, ""), |_| None)
}

/// CSV fields for a row: cpu_real_ms, cores, cpu_add_ms, wire_add_ms, projected p50 and p99,
/// target and verdict (empty without a projection).
pub fn csv_fields(r: &Row) -> String {
    match &r.projection {
        Some(p) => format!(
            "{},{},{},{},{},{},{},{}",
            opt(Some(p.cpu_real_ms), 3),
            p.cores,
            opt(Some(p.cpu_add_ms), 3),
            opt(Some(p.wire_add_ms), 3),
            opt(Some(p.p50_ms), 3),
            opt(Some(p.p99_ms), 3),
            p.target_ms,
            if p.met { "met" } else { "missed" }
        ),
        None => ",,,,,,,".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netem::Shape;
    use crate::scenario::{Mode, Payload, Scenario};
    use crate::stats::Summary;

    fn settings() -> Settings {
        Settings {
            ledgers: 20,
            warmup: 3,
            size: 1_000_000,
            cadence_ms: 600.0,
            emit_ms: 0.0,
            chunk: 100_000,
            shape: Shape {
                flow_bps: 200_000_000,
                aggregate_bps: 1_600_000_000,
            },
            scale: 25.0,
            max_mtu: None,
            min_mtu: None,
        }
    }

    fn row(emulated: bool, codec: &str, lanes: u8) -> Row {
        let sc = Scenario {
            name: "r".into(),
            kind: Kind::Relay {
                lanes,
                codec: codec.into(),
                payload: Payload::Synthetic(1.0),
                subscribers: 1,
                mode: Mode::default(),
            },
            emulated,
        };
        let mut r = Row::empty(&sc, lanes, 1);
        r.summary = Summary {
            ledgers: 10,
            p50_ms: 2.0,
            p99_ms: 3.0,
            raw_bytes: 1_000_000.0,
            wire_bytes: 1_000_000.0,
            ratio: 1.0,
            ..Summary::default()
        };
        r.relay_cpu_ms = Some(9.0);
        r.relay_path_cpu_ms = Some(4.0);
        r.sub_run_cpu_ms = Some(6.0);
        r
    }

    #[test]
    fn cpu_scales_with_bytes_and_loopback_adds_the_wire() {
        // Emulated, 4 lanes on 2 cores: 10 ms at 1 MB is 250 ms at 25 MB, 240 more over 2 cores.
        let p = project(&row(true, "none", 4), &settings(), 25e6, 2).unwrap();
        assert_eq!(p.scale, 25.0);
        assert_eq!(p.cpu_row_ms, 10.0);
        assert_eq!(p.cpu_real_ms, 250.0);
        assert_eq!(p.cores, 2.0);
        assert_eq!(p.cpu_add_ms, 120.0);
        assert_eq!(p.wire_add_ms, 0.0);
        assert_eq!(p.p99_ms, 123.0);
        assert!(!p.met);
        assert_eq!(p.target_ms, MOONSHOT_RAW_P99_MS);
        // Loopback, 1 lane: 25 MB over one 5 Gbit/s flow (97% usable) is about 41.2 ms.
        let p = project(&row(false, "zstd", 1), &settings(), 25e6, 2).unwrap();
        assert_eq!(p.cores, 1.0);
        assert_eq!(p.cpu_add_ms, 240.0);
        let wire = 25e6 / (5e9 * 0.97 / 8.0) * 1e3;
        assert!((p.wire_add_ms - wire).abs() < 1e-9, "{}", p.wire_add_ms);
        assert_eq!(p.target_ms, MOONSHOT_COMPRESSED_P99_MS);
        // Without the subscriber's CPU there is nothing to project.
        let mut r = row(true, "none", 1);
        r.sub_run_cpu_ms = None;
        assert!(project(&r, &settings(), 25e6, 2).is_none());
    }
}
