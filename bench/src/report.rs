//! Output: the table on stdout, `--csv`, `--json`, and the plots (SVG and PNG).

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;
use plotters::element::DashedPathElement;
use plotters::prelude::*;

use crate::scenario::{Kind, Mode, Row};

/// The row's delivery mode (default for the baselines).
fn mode(r: &Row) -> Mode {
    match &r.scenario.kind {
        Kind::Relay { mode, .. } => *mode,
        _ => Mode::default(),
    }
}

/// `v` with `prec` decimals, or `-` when absent or not finite.
pub(crate) fn opt(v: Option<f64>, prec: usize) -> String {
    match v {
        Some(x) if x.is_finite() => format!("{x:.prec$}"),
        _ => "-".into(),
    }
}

/// A column of a fixed-width table: its header, width, whether it is left-aligned, and its
/// cell of a row (a cell may carry its own padding, as `  20/80  `; it is padded to the width
/// only when shorter).
pub(crate) struct Col<R>(&'static str, usize, bool, fn(&R) -> String);

impl<R> Col<R> {
    /// Right-aligned.
    pub(crate) const fn r(head: &'static str, width: usize, cell: fn(&R) -> String) -> Col<R> {
        Col(head, width, false, cell)
    }

    /// Left-aligned.
    pub(crate) const fn l(head: &'static str, width: usize, cell: fn(&R) -> String) -> Col<R> {
        Col(head, width, true, cell)
    }

    fn pad(&self, text: &str) -> String {
        if self.2 {
            format!("{text:<w$}", w = self.1)
        } else {
            format!("{text:>w$}", w = self.1)
        }
    }
}

/// The table of `rows` under `cols`' headers, a space between columns. A row whose `error`
/// is set shows its first `lead` cells, then `FAILED: ERROR` (`failed` is the word).
pub(crate) fn table_of<R>(
    cols: &[Col<R>],
    rows: &[R],
    (lead, failed): (usize, &str),
    error: impl Fn(&R) -> Option<&str>,
) -> String {
    let line = |cells: Vec<String>| cells.join(" ") + "\n";
    let mut s = line(cols.iter().map(|c| c.pad(c.0)).collect());
    for r in rows {
        let shown = if error(r).is_some() { lead } else { cols.len() };
        let mut cells: Vec<String> = cols[..shown].iter().map(|c| c.pad(&(c.3)(r))).collect();
        if let Some(e) = error(r) {
            cells.push(format!("{failed}: {e}"));
        }
        s.push_str(&line(cells));
    }
    s
}

/// A CSV column: its name and its field of a row.
pub(crate) type CsvCol<R> = (&'static str, fn(&R) -> String);

/// CSV of `rows`: a header line of the column names, then one line per row.
pub(crate) fn csv_of<R>(cols: &[CsvCol<R>], rows: &[R]) -> String {
    let mut s = cols.iter().map(|c| c.0).collect::<Vec<_>>().join(",") + "\n";
    for r in rows {
        s.push_str(&(cols.iter().map(|c| (c.1)(r)).collect::<Vec<_>>().join(",") + "\n"));
    }
    s
}

/// `codec` of a row ("-" for the baselines).
fn codec(r: &Row) -> &str {
    match &r.scenario.kind {
        Kind::Relay { codec, .. } => codec,
        Kind::Tcp | Kind::Remote { lanes: None, .. } => "tcp",
        Kind::Remote { .. } => "quic",
        Kind::Pipe => "pipe",
    }
}

/// The table printed on stdout.
pub fn table(rows: &[Row]) -> String {
    let cols: [Col<Row>; 18] = [
        Col::l("scenario", 22, |r| r.scenario.name.clone()),
        Col::r("net", 6, |r| r.scenario.network().into()),
        Col::r("ln", 3, |r| r.lanes.to_string()),
        Col::r("codec", 5, |r| codec(r).into()),
        Col::r("subs", 4, |r| r.subscribers.to_string()),
        Col::r("p50 ms", 8, |r| format!("{:.2}", r.summary.p50_ms)),
        Col::r("p90 ms", 8, |r| format!("{:.2}", r.summary.p90_ms)),
        Col::r("p99 ms", 8, |r| format!("{:.2}", r.summary.p99_ms)),
        Col::r("max ms", 8, |r| format!("{:.2}", r.summary.max_ms)),
        Col::r("ia ms", 7, |r| format!("{:.1}", r.summary.inter_p50_ms)),
        Col::r("gput", 8, |r| format!("{:.1}", r.summary.goodput_mib_s)),
        Col::r("tput", 8, |r| format!("{:.1}", r.summary.throughput_mib_s)),
        Col::r("xfer", 8, |r| format!("{:.1}", r.summary.transfer_mib_s)),
        Col::r("ratio", 6, |r| format!("{:.2}", r.summary.ratio)),
        Col::r("rly cpu", 8, |r| opt(r.relay_cpu_ms, 2)),
        Col::r("sub cpu", 8, |r| opt(r.sub_cpu_ms, 2)),
        Col::r("bound", 8, |r| opt(r.bound_ms, 2)),
        Col::r("p99/b", 6, |r| opt(r.p99_over_bound, 2)),
    ];
    table_of(&cols, rows, (2, "ERROR"), |r| r.error.as_deref())
}

/// CSV, one line per row.
pub fn csv(rows: &[Row]) -> String {
    let mut s = String::from(
        "scenario,network,kind,lanes,codec,payload,subscribers,ledgers,p50_ms,p90_ms,p99_ms,max_ms,\
inter_p50_ms,inter_max_ms,goodput_mib_s,throughput_mib_s,transfer_mib_s,streams_per_lane,store_and_forward,catch_up,raw_bytes,wire_bytes,ratio,relay_cpu_ms_per_ledger,\
sub_cpu_ms_per_ledger,bound_ms,p99_over_bound,wall_s,relay_path_cpu_ms_per_ledger,sub_run_cpu_ms_per_ledger,\
cpu_real_ms_per_ledger,cores,cpu_add_ms,wire_add_ms,projected_p50_ms,projected_p99_ms,moonshot_p99_ms,moonshot,\
lane_rx_mb,lane_rtt_ms,lane_mtu,error\n",
    );
    for r in rows {
        let m = &r.summary;
        let (kind, payload) = match &r.scenario.kind {
            Kind::Relay { payload, .. } => ("relay", payload.label()),
            Kind::Tcp => ("tcp", "raw".into()),
            Kind::Pipe => ("pipe", "raw".into()),
            // What a remote relay serves is its own business: the ratio column tells.
            Kind::Remote { .. } => ("remote", String::new()),
        };
        let network = match r.scenario.network() {
            "emu" => "emulated",
            "lo" => "loopback",
            other => other,
        };
        let _ = writeln!(
            s,
            "{},{network},{kind},{},{},{payload},{},{},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{:.2},{:.2},{:.2},{},{},{},{:.0},{:.0},{:.3},{},{},{},{},{:.3},{},{},{},{},{},{},{}",
            r.scenario.name,
            r.lanes,
            codec(r),
            r.subscribers,
            m.ledgers,
            m.p50_ms,
            m.p90_ms,
            m.p99_ms,
            m.max_ms,
            m.inter_p50_ms,
            m.inter_max_ms,
            m.goodput_mib_s,
            m.throughput_mib_s,
            m.transfer_mib_s,
            mode(r).streams_per_lane.map(|n| n.to_string()).unwrap_or_default(),
            mode(r).store_and_forward,
            mode(r).catch_up,
            m.raw_bytes,
            m.wire_bytes,
            m.ratio,
            opt(r.relay_cpu_ms, 3).replace('-', ""),
            opt(r.sub_cpu_ms, 3).replace('-', ""),
            opt(r.bound_ms, 3).replace('-', ""),
            opt(r.p99_over_bound, 3).replace('-', ""),
            r.wall_s,
            opt(r.relay_path_cpu_ms, 3).replace('-', ""),
            opt(r.sub_run_cpu_ms, 3).replace('-', ""),
            crate::projection::csv_fields(r),
            lane_list(r, |l| format!("{:.3}", l.rx_bytes as f64 / 1e6)),
            lane_list(r, |l| format!("{:.3}", l.rtt_ms)),
            lane_list(r, |l| l.mtu_bytes.to_string()),
            r.error.as_deref().unwrap_or("").replace([',', '\n'], ";"),
        );
    }
    s
}

/// A per-lane figure of the row's first subscriber, lanes separated by `;`.
fn lane_list(r: &Row, f: impl Fn(&crate::perlane::LaneFig) -> String) -> String {
    r.per_lane.iter().map(f).collect::<Vec<_>>().join(";")
}

/// Loads a TrueType font for plot text. The `ab_glyph` backend of plotters needs the font's
/// bytes (no fontconfig); DejaVu Sans is in `fonts-dejavu-core` on Debian and Ubuntu.
pub(crate) fn register_font() -> anyhow::Result<()> {
    const CANDIDATES: &[&str] = &[
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/TTF/DejaVuSans.ttf",
    ];
    let path = CANDIDATES
        .iter()
        .find(|p| Path::new(p).is_file())
        .context("no DejaVuSans.ttf found (apt-get install fonts-dejavu-core)")?;
    let bytes: &'static [u8] = Box::leak(std::fs::read(path)?.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| anyhow::anyhow!("{path} is not a usable font"))?;
    Ok(())
}

/// Writes the plots as SVG and PNG into `dir`: delivery-cdf, throughput-vs-lanes (with the
/// ideal line on the emulated network), lanes-rx (bytes per lane of each row) and fanout-cost.
/// Returns the files written.
/// `flow_bps`: the emulated per-flow cap (0: none, no ideal line).
pub fn plots(rows: &[Row], dir: &Path, flow_bps: u64) -> anyhow::Result<Vec<String>> {
    register_font()?;
    std::fs::create_dir_all(dir)?;
    let mut written = Vec::new();
    let ok: Vec<&Row> = rows.iter().filter(|r| r.error.is_none()).collect();
    // Catch-up rows' delivery times are queueing behind the ring, not latency.
    let live: Vec<&Row> = ok.iter().copied().filter(|r| !mode(r).catch_up).collect();
    cdf(&live, dir, &mut written)?;
    lanes(&ok, dir, flow_bps, &mut written)?;
    if ok.iter().any(|r| r.per_lane.len() > 1) {
        lane_bars(&ok, dir, &mut written)?;
    }
    if ok.iter().any(|r| r.scenario.name.starts_with("fanout")) {
        fanout(&ok, dir, &mut written)?;
    }
    Ok(written)
}

/// Ten colours far apart (Tableau 10), so that neighbouring series do not look alike.
pub(crate) const COLOURS: [RGBColor; 10] = [
    RGBColor(78, 121, 167),
    RGBColor(242, 142, 43),
    RGBColor(225, 87, 89),
    RGBColor(118, 183, 178),
    RGBColor(89, 161, 79),
    RGBColor(237, 201, 72),
    RGBColor(176, 122, 161),
    RGBColor(255, 157, 167),
    RGBColor(156, 117, 95),
    RGBColor(64, 64, 64),
];

/// Series `i`'s colour and dash (dash length and gap in pixels; `None`: solid): the ten colours
/// solid, then dashed, then in short dashes, so up to 30 series differ in colour or dash.
pub(crate) fn series_style(i: usize) -> (RGBColor, Option<(u32, u32)>) {
    let dash = match (i / COLOURS.len()) % 3 {
        0 => None,
        1 => Some((10, 5)),
        _ => Some((3, 4)),
    };
    (COLOURS[i % COLOURS.len()], dash)
}

/// Draws `$pts` on `$chart` in series `$i`'s style, with `$label` in the legend drawn the same
/// way.
macro_rules! styled_line {
    ($chart:expr, $pts:expr, $i:expr, $label:expr) => {{
        let (colour, dash) = series_style($i);
        let style = colour.stroke_width(2);
        match dash {
            None => {
                $chart
                    .draw_series(LineSeries::new($pts, style))
                    .map_err(err)?
                    .label($label)
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], style));
            }
            Some((len, gap)) => {
                $chart
                    .draw_series(DashedLineSeries::new($pts, len, gap, style))
                    .map_err(err)?
                    .label($label)
                    .legend(move |(x, y)| {
                        DashedPathElement::new(vec![(x, y), (x + 24, y)], len, gap, style)
                    });
            }
        }
    }};
}

macro_rules! both_backends {
    ($dir:expr, $name:expr, $written:expr, |$root:ident| $body:block) => {{
        let svg = $dir.join(format!("{}.svg", $name));
        {
            let $root = SVGBackend::new(&svg, (1000, 640)).into_drawing_area();
            $body
            $root.present().map_err(|e| anyhow::anyhow!("{e}"))?;
        }
        let png = $dir.join(format!("{}.png", $name));
        {
            let $root = BitMapBackend::new(&png, (1000, 640)).into_drawing_area();
            $body
            $root.present().map_err(|e| anyhow::anyhow!("{e}"))?;
        }
        $written.push(svg.display().to_string());
        $written.push(png.display().to_string());
    }};
}
pub(crate) use both_backends;

pub(crate) fn err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow::anyhow!("plotting: {e}")
}

/// A chart on a white `root` with `caption`, linear axes over `x` and `y` and their mesh.
pub(crate) fn frame<'a, DB: DrawingBackend + 'a>(
    root: &'a DrawingArea<DB, plotters::coord::Shift>,
    caption: &str,
    (x, x_desc): (std::ops::Range<f64>, &str),
    (y, y_desc): (std::ops::Range<f64>, &str),
) -> anyhow::Result<
    ChartContext<
        'a,
        DB,
        Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
    >,
> {
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(root)
        .caption(caption, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(x, y)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .draw()
        .map_err(err)?;
    Ok(chart)
}

/// Draws the legend of `chart` at `pos` in `font`-point text.
pub(crate) fn legend<'a, DB: DrawingBackend + 'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    pos: SeriesLabelPosition,
    font: u32,
) -> anyhow::Result<()> {
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(pos)
        .label_font(("sans-serif", font))
        .draw()
        .map_err(err)
}

fn cdf(rows: &[&Row], dir: &Path, written: &mut Vec<String>) -> anyhow::Result<()> {
    let max = rows
        .iter()
        .filter_map(|r| r.delivery_ms.last().copied())
        .fold(1.0f64, f64::max);
    both_backends!(dir, "delivery-cdf", written, |root| {
        root.fill(&WHITE).map_err(err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                "Delivery latency CDF (warm-up excluded)",
                ("sans-serif", 22),
            )
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d((0.01f64..max * 1.1).log_scale(), 0f64..1f64)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("delivery ms (log)")
            .y_desc("fraction of ledgers")
            .draw()
            .map_err(err)?;
        for (i, r) in rows.iter().enumerate() {
            let n = r.delivery_ms.len() as f64;
            let pts: Vec<(f64, f64)> = r
                .delivery_ms
                .iter()
                .enumerate()
                .map(|(k, d)| (d.max(0.011), (k + 1) as f64 / n))
                .collect();
            let label = format!(
                "{} ({}, {} lanes, p99 {:.1} ms)",
                r.scenario.name,
                r.scenario.network(),
                r.lanes,
                r.summary.p99_ms
            );
            styled_line!(chart, pts, i, label);
        }
        legend(&mut chart, SeriesLabelPosition::LowerRight, 11)?;
    });
    Ok(())
}

fn lanes(
    rows: &[&Row],
    dir: &Path,
    flow_bps: u64,
    written: &mut Vec<String>,
) -> anyhow::Result<()> {
    // One series per (network, codec, payload) among single-subscriber relay rows.
    let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for r in rows {
        if let Kind::Remote { lanes, .. } = &r.scenario.kind {
            let y = r.summary.goodput_mib_s;
            // One TCP flow is drawn as a level across the lane counts, for comparison.
            let (key, pts) = match lanes {
                Some(n) => ("remote quic live (per ledger)", vec![(f64::from(*n), y)]),
                None => (
                    "remote tcp, one flow (per ledger)",
                    vec![(1.0, y), (8.0, y)],
                ),
            };
            match series.iter_mut().find(|(k, _)| k == key) {
                Some((_, v)) => v.extend(pts),
                None => series.push((key.to_owned(), pts)),
            }
            continue;
        }
        let Kind::Relay {
            codec,
            payload,
            subscribers: 1,
            ..
        } = &r.scenario.kind
        else {
            continue;
        };
        let m = mode(r);
        if m.store_and_forward || m.streams_per_lane.is_some() {
            continue;
        }
        let key = format!(
            "{} {} {}{}",
            r.scenario.network(),
            codec,
            payload.label(),
            if m.catch_up {
                " bulk (sustained)"
            } else {
                " live (per ledger)"
            }
        );
        let y = if m.catch_up {
            r.summary.throughput_mib_s
        } else {
            r.summary.goodput_mib_s
        };
        let p = (f64::from(r.lanes), y);
        match series.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => v.push(p),
            None => series.push((key, vec![p])),
        }
    }
    series.retain(|(_, v)| v.len() > 1);
    for (_, v) in series.iter_mut() {
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    // The ideal on the emulated network: lanes x the per-flow cap (raw bytes; compressed rows
    // can exceed it). Loopback has no cap, so no ideal.
    let cap = flow_bps as f64 / 8.0 / f64::from(1 << 20);
    let ideal = rows.iter().any(|r| r.scenario.emulated) && cap > 0.0;
    let ymax = series
        .iter()
        .flat_map(|(_, v)| v.iter().map(|p| p.1))
        .fold(1.0f64, f64::max);
    let ymax = if ideal {
        ymax.max(8.0 * cap * 0.6)
    } else {
        ymax
    };
    both_backends!(dir, "throughput-vs-lanes", written, |root| {
        let mut chart = frame(
            &root,
            "Goodput against lanes",
            (0f64..9f64, "lanes"),
            (
                0f64..ymax * 1.15,
                "MiB/s (live: raw / (delivery + emit); bulk: sustained)",
            ),
        )?;
        if ideal {
            chart
                .draw_series(DashedLineSeries::new(
                    vec![(0.0, 0.0), (8.5, 8.5 * cap)],
                    8,
                    4,
                    BLACK.stroke_width(1),
                ))
                .map_err(err)?
                .label(format!(
                    "ideal: lanes x cap ({cap:.1} MiB/s per flow, emulated)"
                ))
                .legend(|(x, y)| {
                    DashedPathElement::new(vec![(x, y), (x + 24, y)], 8, 4, BLACK.stroke_width(1))
                });
        }
        for (i, (k, v)) in series.iter().enumerate() {
            styled_line!(chart, v.clone(), i, k.clone());
            let c = series_style(i).0;
            chart
                .draw_series(v.iter().map(|p| Circle::new(*p, 4, c.filled())))
                .map_err(err)?;
        }
        legend(&mut chart, SeriesLabelPosition::UpperLeft, 12)?;
    });
    Ok(())
}

/// Bytes each lane of a row's first subscriber received, as bars grouped by row, one colour
/// per lane number (legend), with each row's equal share drawn across its group.
fn lane_bars(rows: &[&Row], dir: &Path, written: &mut Vec<String>) -> anyhow::Result<()> {
    let groups: Vec<(String, Vec<f64>)> = rows
        .iter()
        .filter(|r| r.per_lane.len() > 1)
        .map(|r| {
            (
                format!("{} ({})", r.scenario.name, r.scenario.network()),
                r.per_lane.iter().map(|l| l.rx_bytes as f64 / 1e6).collect(),
            )
        })
        .collect();
    per_lane_bars(
        dir,
        "lanes-rx",
        "Bytes received per lane (first subscriber; dashes: equal share)",
        "MB received on the lane (UDP payload)",
        &groups,
        written,
    )
}

/// One group of bars per row, a bar per lane (MB), each group's equal share (its mean) dashed
/// across it: the plot of how evenly lanes were used, for `lanes-rx` here and `lanes-bytes` of
/// `ledger-bench lanes`.
pub fn per_lane_bars(
    dir: &Path,
    name: &str,
    caption: &str,
    y_desc: &str,
    groups: &[(String, Vec<f64>)],
    written: &mut Vec<String>,
) -> anyhow::Result<()> {
    let max_lanes = groups.iter().map(|g| g.1.len()).max().unwrap_or(1);
    let mb_max = groups
        .iter()
        .flat_map(|g| g.1.iter().copied())
        .fold(0.001, f64::max);
    let n = groups.len().max(1);
    both_backends!(dir, name, written, |root| {
        root.fill(&WHITE).map_err(err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(caption, ("sans-serif", 22))
            .margin(12)
            .x_label_area_size(60)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..(n as f64), 0f64..mb_max * 1.25)
            .map_err(err)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(n * 2 + 1)
            .x_label_formatter(&|x| {
                let i = x.floor() as usize;
                if (x - i as f64 - 0.5).abs() < 0.01 {
                    groups.get(i).map(|g| g.0.clone()).unwrap_or_default()
                } else {
                    String::new()
                }
            })
            .x_label_style(("sans-serif", 12))
            .y_desc(y_desc)
            .draw()
            .map_err(err)?;
        for k in 0..max_lanes {
            let colour = series_style(k).0;
            let rects: Vec<Rectangle<(f64, f64)>> = groups
                .iter()
                .enumerate()
                .filter_map(|(i, g)| {
                    let mb = *g.1.get(k)?;
                    let w = 0.8 / g.1.len() as f64;
                    let x0 = i as f64 + 0.1 + k as f64 * w;
                    Some(Rectangle::new(
                        [(x0, 0.0), (x0 + w * 0.9, mb)],
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
        for (i, g) in groups.iter().enumerate() {
            let mean = g.1.iter().sum::<f64>() / g.1.len().max(1) as f64;
            chart
                .draw_series(DashedLineSeries::new(
                    vec![(i as f64 + 0.05, mean), (i as f64 + 0.95, mean)],
                    6,
                    4,
                    BLACK.stroke_width(1),
                ))
                .map_err(err)?;
        }
        legend(&mut chart, SeriesLabelPosition::UpperRight, 12)?;
    });
    Ok(())
}

fn fanout(rows: &[&Row], dir: &Path, written: &mut Vec<String>) -> anyhow::Result<()> {
    let mut pts: Vec<(f64, f64)> = rows
        .iter()
        .filter(|r| r.scenario.name.starts_with("fanout"))
        .filter_map(|r| Some((f64::from(r.subscribers), r.relay_cpu_ms?)))
        .collect();
    pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    let ymax = pts.iter().map(|p| p.1).fold(1.0f64, f64::max);
    both_backends!(dir, "fanout-cost", written, |root| {
        let mut chart = frame(
            &root,
            "Fan-out cost: relay CPU per ledger",
            (0f64..17f64, "subscribers"),
            (0f64..ymax * 1.2, "relay CPU ms per ledger"),
        )?;
        chart
            .draw_series(LineSeries::new(pts.clone(), BLUE.stroke_width(2)))
            .map_err(err)?;
        chart
            .draw_series(pts.iter().map(|p| Circle::new(*p, 4, BLUE.filled())))
            .map_err(err)?;
    });
    Ok(())
}

/// A row by name, if it ran without error.
fn named<'a>(rows: &'a [Row], name: &str) -> Option<&'a Row> {
    rows.iter()
        .find(|r| r.scenario.name == name && r.error.is_none() && r.summary.ledgers > 0)
}

/// A target's verdict: `met` or `MISSED`.
pub(crate) fn met(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "MISSED"
    }
}

/// Issue 6's targets, computed from the rows of this run that they need (rows not run are
/// left out): one line each with the measured ratio and the verdict.
pub fn targets(rows: &[Row]) -> String {
    let mut s = String::new();
    let mut line = |what: &str, value: Option<(f64, String)>, ok: &dyn Fn(f64) -> bool| {
        if let Some((v, detail)) = value {
            let verdict = met(ok(v));
            let _ = writeln!(s, "{what:<48} {v:>7.3}  {verdict:<6} ({detail})");
        }
    };
    let ratio = |a: &str, b: &str, f: &dyn Fn(&Row) -> Option<f64>| {
        let (x, y) = (f(named(rows, a)?)?, f(named(rows, b)?)?);
        Some((x / y, format!("{a} {x:.2} / {b} {y:.2}")))
    };
    let p = |r: &Row| Some(r.summary.p99_ms);
    line(
        "raw p99: 4 lanes / 1 lane (<= 0.3)",
        ratio("raw-l4", "raw-l1", &p),
        &|v| v <= 0.3,
    );
    line(
        "raw p99: 4 lanes / one TCP flow (<= 0.3)",
        ratio("raw-l4", "tcp-1flow", &p),
        &|v| v <= 0.3,
    );
    line(
        "raw sustained goodput: 4 lanes / 1 lane (>= 3.6)",
        ratio("bulk-raw-l4", "bulk-raw-l1", &|r| {
            Some(r.summary.throughput_mib_s)
        }),
        &|v| v >= 3.6,
    );
    line(
        "raw per-ledger goodput: 4 lanes / 1 lane (>= 3.6)",
        ratio("raw-l4", "raw-l1", &|r| Some(r.summary.goodput_mib_s)),
        &|v| v >= 3.6,
    );
    // Streams alone do not beat a flow cap: four streams at most on one lane against the
    // default (a stream per chunk in flight). One stream at a time (raw-l1-s1) also pays a
    // round trip per chunk: its slot is held until the subscriber has the whole stream.
    line(
        "1 lane p99: 4 streams / default streams (0.9-1.1)",
        ratio("raw-l1-s4", "raw-l1", &p),
        &|v| (0.9..=1.1).contains(&v),
    );
    line(
        "1 lane p99: raw / calibrated 7.6x zstd (>= 3)",
        ratio("raw-l1", "x7.6-zstd-l1", &p),
        &|v| v >= 3.0,
    );
    line(
        "relay CPU/ledger: 16 subscribers / 1 (< 4)",
        ratio("fanout-16", "fanout-1", &|r| r.relay_cpu_ms),
        &|v| v < 4.0,
    );
    let bounded: Vec<&Row> = rows.iter().filter(|r| r.p99_over_bound.is_some()).collect();
    if !bounded.is_empty() {
        let within = bounded
            .iter()
            .filter(|r| r.p99_over_bound.is_some_and(|b| b <= 1.3))
            .count();
        let worst = bounded
            .iter()
            .filter_map(|r| r.p99_over_bound)
            .fold(0.0f64, f64::max);
        line(
            "rows with p99 within 1.3x of the bound (all)",
            Some((
                within as f64 / bounded.len() as f64,
                format!("{within} of {} rows; worst {worst:.2}x", bounded.len()),
            )),
            &|v| v >= 1.0,
        );
    }
    let pipe = named(rows, "pipe").map(|r| r.wall_s);
    for r in rows
        .iter()
        .filter(|r| r.scenario.network() == "lo" && r.error.is_none() && r.scenario.name != "pipe")
    {
        if let Some(pw) = pipe.filter(|w| w.is_finite() && *w > 0.0) {
            let ratio = r.wall_s / pw;
            line(
                &format!("loopback wall: {} / pipe (<= 1.02)", r.scenario.name),
                Some((
                    ratio,
                    format!(
                        "{:.3} s vs {pw:.3} s over {} ledgers, {:+.3}%",
                        r.wall_s,
                        r.summary.ledgers,
                        (ratio - 1.0) * 100.0
                    ),
                )),
                &|v| v <= 1.02,
            );
        }
    }
    s
}

/// Writes `text` to `path`.
pub fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::{Payload, Scenario};
    use crate::stats::Summary;

    fn row(name: &str, lanes: u8, mode: Mode, p99: f64, tput: f64, bound: Option<f64>) -> Row {
        let sc = Scenario {
            name: name.into(),
            kind: Kind::Relay {
                lanes,
                codec: "none".into(),
                payload: Payload::Synthetic(1.0),
                subscribers: 1,
                mode,
            },
            emulated: true,
        };
        Row {
            summary: Summary {
                ledgers: 10,
                p99_ms: p99,
                throughput_mib_s: tput,
                goodput_mib_s: tput,
                ..Summary::default()
            },
            bound_ms: bound,
            p99_over_bound: bound.map(|b| p99 / b),
            ..Row::empty(&sc, lanes, 1)
        }
    }

    #[test]
    fn columns_pad_their_cells_and_a_failed_row_keeps_its_lead() {
        let cols: [Col<(u32, Option<&str>)>; 3] = [
            Col::l("name", 6, |r| format!("r{}", r.0)),
            Col::r("n", 4, |r| r.0.to_string()),
            Col::r("x", 3, |r| format!("{:>2}/", r.0)),
        ];
        let t = table_of(&cols, &[(7, None), (8, Some("boom"))], (1, "FAILED"), |r| {
            r.1
        });
        assert_eq!(t, "name      n   x\nr7        7  7/\nr8     FAILED: boom\n");
        let c: [CsvCol<u32>; 2] = [("a", |r| r.to_string()), ("b", |r| (r * 2).to_string())];
        assert_eq!(csv_of(&c, &[1, 2]), "a,b\n1,2\n2,4\n");
    }

    #[test]
    fn targets_compare_the_rows_of_the_run() {
        let bulk = Mode {
            catch_up: true,
            ..Mode::default()
        };
        let s = |n| Mode {
            streams_per_lane: Some(n),
            ..Mode::default()
        };
        let rows = vec![
            row("raw-l1", 1, Mode::default(), 20.0, 22.0, Some(17.0)),
            row("raw-l4", 4, Mode::default(), 4.0, 60.0, Some(1.0)),
            row("bulk-raw-l1", 1, bulk, 900.0, 23.0, None),
            row("bulk-raw-l4", 4, bulk, 300.0, 85.0, None),
            row("raw-l1-s4", 1, s(4), 23.0, 22.0, None),
        ];
        let t = targets(&rows);
        let verdict = |what: &str| {
            t.lines()
                .find(|l| l.starts_with(what))
                .unwrap_or_else(|| panic!("no {what:?} in\n{t}"))
                .to_owned()
        };
        assert!(
            verdict("raw p99: 4 lanes / 1 lane").contains(" 0.200  met"),
            "{t}"
        );
        assert!(
            verdict("raw sustained goodput").contains("3.696  met"),
            "{t}"
        );
        assert!(verdict("raw per-ledger goodput").contains("MISSED"), "{t}");
        assert!(
            verdict("1 lane p99: 4 streams").contains("1.150  MISSED"),
            "{t}"
        );
        assert!(
            verdict("rows with p99 within").contains("1 of 2 rows; worst 4.00x"),
            "{t}"
        );
        // Rows not in the run give no line.
        assert!(!t.contains("TCP"), "{t}");
        assert!(!t.contains("fan"), "{t}");
    }
}
