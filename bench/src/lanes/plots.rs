//! `ledger-bench lanes --plots DIR`: goodput against lanes with the ideal line, and the bytes
//! each lane carried.

use std::path::Path;

use plotters::prelude::*;

use super::{LaneMode, LaneRow, MIB};
use crate::report::{
    both_backends, err, frame, legend, per_lane_bars, register_font, series_style,
};

/// Goodput against lanes per mode with the ideal line (lanes x cap), and each row's bytes per
/// lane as bars. Returns the files written.
pub fn plots(rows: &[LaneRow], dir: &Path, flow_mbit: f64) -> anyhow::Result<Vec<String>> {
    register_font()?;
    std::fs::create_dir_all(dir)?;
    let mut written = Vec::new();
    let ok: Vec<&LaneRow> = rows
        .iter()
        .filter(|r| r.error.is_none() && !r.half_capped())
        .collect();
    let cap = flow_mbit * 1e6 / 8.0 / MIB;
    let xmax = ok.iter().map(|r| f64::from(r.lanes)).fold(1.0, f64::max) + 1.0;
    let ymax = (xmax - 1.0) * cap * 1.1;
    both_backends!(dir, "lanes-goodput", written, |root| {
        let caption = format!("Whole-transfer goodput against lanes ({flow_mbit} Mbit/s per flow)");
        let mut chart = frame(
            &root,
            &caption,
            (0f64..xmax, "lanes"),
            (
                0f64..ymax,
                "MiB/s (raw bytes / (last arrival - subscriber start))",
            ),
        )?;
        chart
            .draw_series(DashedLineSeries::new(
                vec![(0.0, 0.0), (xmax - 1.0, (xmax - 1.0) * cap)],
                8,
                4,
                BLACK.stroke_width(1),
            ))
            .map_err(err)?
            .label("ideal: lanes x cap")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], BLACK));
        for (i, mode) in [LaneMode::Live, LaneMode::CatchUp].into_iter().enumerate() {
            let mut pts: Vec<(f64, f64)> = ok
                .iter()
                .filter(|r| r.mode == mode)
                .map(|r| (f64::from(r.lanes), r.goodput_mib_s))
                .collect();
            if pts.is_empty() {
                continue;
            }
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            let c = series_style(i).0;
            chart
                .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))
                .map_err(err)?
                .label(mode.name())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2))
                });
            chart
                .draw_series(pts.iter().map(|p| Circle::new(*p, 4, c.filled())))
                .map_err(err)?;
        }
        legend(&mut chart, SeriesLabelPosition::UpperLeft, 14)?;
    });
    let groups: Vec<(String, Vec<f64>)> = rows
        .iter()
        .filter(|r| r.error.is_none())
        .map(|r| {
            (
                format!("{} #{}", r.label(), r.run),
                r.per_lane.iter().map(|l| l.delivered_bytes / 1e6).collect(),
            )
        })
        .collect();
    per_lane_bars(
        dir,
        "lanes-bytes",
        "Bytes carried per lane, each row (dashes: equal share)",
        "MB acknowledged on the lane",
        &groups,
        &mut written,
    )?;
    Ok(written)
}

#[cfg(test)]
mod tests {
    use crate::report::per_lane_bars;

    /// The per-lane plot draws a bar per lane of every group, in both formats.
    #[test]
    fn per_lane_bars_draw_a_bar_per_lane_of_every_group() {
        let dir = tempfile::tempdir().unwrap();
        crate::report::register_font().unwrap();
        let groups = vec![
            ("live l4 #1".to_string(), vec![20.2, 31.8, 30.1, 24.0]),
            ("live l2 #1".to_string(), vec![48.0, 48.1]),
        ];
        let mut written = Vec::new();
        per_lane_bars(dir.path(), "bars", "caption", "MB", &groups, &mut written).unwrap();
        assert_eq!(written.len(), 2, "{written:?}");
        let svg = std::fs::read_to_string(dir.path().join("bars.svg")).unwrap();
        // plotters draws each bar as a filled <rect>; the legend adds one per lane, the
        // background and the legend box two more.
        let rects = svg.matches("<rect").count();
        assert!(rects >= 6 + 4, "{rects} rects");
        assert!(
            std::fs::metadata(dir.path().join("bars.png"))
                .unwrap()
                .len()
                > 0
        );
    }
}
