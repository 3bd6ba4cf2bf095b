//! `ledger-bench lanes --plots DIR`: goodput against lanes with the ideal line, and the bytes
//! each lane carried.

use std::path::Path;

use plotters::prelude::*;

use super::{LaneMode, LaneRow, MIB};
use crate::report::{both_backends, err, register_font, series_style};

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
        root.fill(&WHITE).map_err(err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                format!("Whole-transfer goodput against lanes ({flow_mbit} Mbit/s per flow)"),
                ("sans-serif", 22),
            )
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..xmax, 0f64..ymax)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("lanes")
            .y_desc("MiB/s (raw bytes / (last arrival - subscriber start))")
            .draw()
            .map_err(err)?;
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
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperLeft)
            .label_font(("sans-serif", 14))
            .draw()
            .map_err(err)?;
    });
    let bars: Vec<&LaneRow> = rows.iter().filter(|r| r.error.is_none()).collect();
    let mb_max = bars
        .iter()
        .flat_map(|r| r.per_lane.iter().map(|l| l.delivered_bytes / 1e6))
        .fold(1.0, f64::max);
    both_backends!(dir, "lanes-bytes", written, |root| {
        root.fill(&WHITE).map_err(err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                "Bytes carried per lane, each row (dashes: equal share)",
                ("sans-serif", 22),
            )
            .margin(12)
            .x_label_area_size(90)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..(bars.len().max(1) as f64), 0f64..mb_max * 1.15)
            .map_err(err)?;
        let labels: Vec<String> = bars
            .iter()
            .map(|r| format!("{} #{}", r.label(), r.run))
            .collect();
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(bars.len().max(1))
            .x_label_formatter(&|x| labels.get(x.floor() as usize).cloned().unwrap_or_default())
            .x_label_style(("sans-serif", 11))
            .y_desc("MB acknowledged on the lane")
            .draw()
            .map_err(err)?;
        let max_lanes = bars.iter().map(|r| r.per_lane.len()).max().unwrap_or(0);
        for k in 0..max_lanes {
            let colour = series_style(k).0;
            let rects: Vec<Rectangle<(f64, f64)>> = bars
                .iter()
                .enumerate()
                .filter_map(|(i, r)| {
                    let l = r.per_lane.get(k)?;
                    let w = 0.8 / r.per_lane.len().max(1) as f64;
                    let x0 = i as f64 + 0.1 + k as f64 * w;
                    Some(Rectangle::new(
                        [(x0, 0.0), (x0 + w * 0.9, l.delivered_bytes / 1e6)],
                        colour.filled(),
                    ))
                })
                .collect();
            chart
                .draw_series(rects)
                .map_err(err)?
                .label(format!("lane {k}"))
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 14, y + 5)], colour.filled())
                });
        }
        // Each row's equal share (its mean), dashed across its group.
        for (i, r) in bars.iter().enumerate() {
            let n = r.per_lane.len().max(1) as f64;
            let mean = r.per_lane.iter().map(|l| l.delivered_bytes).sum::<f64>() / n / 1e6;
            chart
                .draw_series(DashedLineSeries::new(
                    vec![(i as f64 + 0.05, mean), (i as f64 + 0.95, mean)],
                    6,
                    4,
                    BLACK.stroke_width(1),
                ))
                .map_err(err)?;
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperRight)
            .label_font(("sans-serif", 12))
            .draw()
            .map_err(err)?;
    });
    Ok(written)
}
