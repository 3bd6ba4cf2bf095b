//! `--plots DIR`: each row's delivery CDF, goodput against lanes and relay CPU against
//! subscribers (each where the rows vary it), as SVG.

use std::path::Path;

use anyhow::Context;
use plotters::prelude::*;

use crate::row::Row;
use crate::scenario::Mode;

/// Draws the plots `out` asks for; one that cannot be drawn is reported on stderr.
pub fn draw(out: &crate::report::Output, rows: &[Row]) {
    if let Some(dir) = &out.plots {
        match plots(rows, dir) {
            Ok(files) => eprintln!("ledger-bench: plots: {}", files.join(", ")),
            Err(e) => eprintln!("ledger-bench: no plots: {e:#}"),
        }
    }
}

fn err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow::anyhow!("plotting: {e}")
}

/// The `ab_glyph` backend needs a font's bytes: DejaVu Sans (`fonts-dejavu-core`).
fn register_font() -> anyhow::Result<()> {
    let candidates = [
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/TTF/DejaVuSans.ttf",
    ];
    let path = (candidates.iter().find(|p| Path::new(p).is_file()))
        .context("no DejaVuSans.ttf found (apt-get install fonts-dejavu-core)")?;
    let bytes: &'static [u8] = Box::leak(std::fs::read(path)?.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| anyhow::anyhow!("{path} is not a usable font"))
}

/// A series: its label and its points.
type Series = (String, Vec<(f64, f64)>);

fn plots(rows: &[Row], dir: &Path) -> anyhow::Result<Vec<String>> {
    register_font()?;
    std::fs::create_dir_all(dir)?;
    let ok: Vec<&Row> = rows.iter().filter(|r| r.error.is_none()).collect();
    let cdf: Vec<Series> = (ok.iter())
        .filter(|r| r.scenario.mode != Mode::CatchUp && !r.delivery_ms.is_empty())
        .map(|r| {
            let n = r.delivery_ms.len() as f64;
            let point = |(k, d): (usize, &f64)| (d.max(0.011).log10(), (k + 1) as f64 / n);
            let points = r.delivery_ms.iter().enumerate().map(point);
            (r.scenario.name.clone(), points.collect())
        })
        .collect();
    let cdf_labels = [
        "delivery-cdf",
        "Delivery CDF after the warm-up",
        "log10 delivery ms",
        "fraction of ledgers",
    ];
    let mut files = vec![chart(dir, cdf_labels, &cdf)?];
    let by = |x: fn(&Row) -> f64, y: fn(&Row) -> Option<f64>| {
        let mut series: Vec<Series> = Vec::new();
        for r in &ok {
            let sc = &r.scenario;
            let (net, codec, carrier, mode) = (sc.network, &sc.codec, sc.carrier, sc.mode);
            let key = format!("{net:?} {codec} {carrier:?} {mode:?}").to_lowercase();
            let Some(y) = y(r) else { continue };
            match series.iter_mut().find(|s| s.0 == key) {
                Some(s) => s.1.push((x(r), y)),
                None => series.push((key, vec![(x(r), y)])),
            }
        }
        series.retain(|s| s.1.len() > 1 && s.1.iter().any(|p| p.0 != s.1[0].0));
        series
            .iter_mut()
            .for_each(|s| s.1.sort_by(|a, b| a.0.total_cmp(&b.0)));
        series
    };
    type Axis = fn(&Row) -> f64;
    type Value = fn(&Row) -> Option<f64>;
    let charts: [([&str; 4], Axis, Value); 2] = [
        (
            [
                "goodput-vs-lanes",
                "Whole-transfer goodput against lanes",
                "lanes",
                "MiB/s",
            ],
            |r| f64::from(r.scenario.lanes),
            |r| Some(r.delivery.as_ref()?.transfer_mib_s),
        ),
        (
            [
                "relay-cpu-vs-subscribers",
                "Relay CPU per ledger against subscribers",
                "subscribers",
                "ms per ledger",
            ],
            |r| f64::from(r.scenario.subscribers),
            |r| Some(r.cpu.as_ref()?.relay_ms),
        ),
    ];
    for (labels, x, y) in charts {
        let mut series = by(x, y);
        if labels[0] == "relay-cpu-vs-subscribers" {
            // The target: each series' first row plus 1.5 ms of relay CPU per extra subscriber.
            let line = |s: &Series| {
                let (x0, y0) = s.1[0];
                let target = s.1.iter().map(|p| (p.0, y0 + 1.5 * (p.0 - x0)));
                (format!("{} + 1.5 ms/subscriber", s.0), target.collect())
            };
            let targets: Vec<Series> = series.iter().map(line).collect();
            series.extend(targets);
        }
        if !series.is_empty() {
            files.push(chart(dir, labels, &series)?);
        }
    }
    Ok(files)
}

/// A line chart of `series` in `dir/NAME.svg`, with its caption and axes; returns the file.
fn chart(
    dir: &Path,
    [name, caption, x, y]: [&str; 4],
    series: &[Series],
) -> anyhow::Result<String> {
    let path = dir.join(format!("{name}.svg"));
    let points = || series.iter().flat_map(|s| s.1.iter());
    let (x0, x1) = points().fold((f64::INFINITY, f64::NEG_INFINITY), |m, p| {
        (m.0.min(p.0), m.1.max(p.0))
    });
    let y1 = points().map(|p| p.1).fold(0.0, f64::max) * 1.1;
    let root = SVGBackend::new(&path, (1000, 640)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut c = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(x0.min(x1)..x1.max(x0 + 1.0), 0.0..y1.max(1e-9))
        .map_err(err)?;
    c.configure_mesh().x_desc(x).y_desc(y).draw().map_err(err)?;
    for (i, (label, pts)) in series.iter().enumerate() {
        let colour = Palette99::pick(i).stroke_width(2);
        c.draw_series(LineSeries::new(pts.clone(), colour))
            .map_err(err)?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour));
    }
    c.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 11))
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(path.display().to_string())
}
