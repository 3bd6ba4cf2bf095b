//! The one way a measurement is printed and written: fixed-width tables on stdout, and the
//! `--csv`, `--json` and `--plots` files every subcommand takes ([`Output`]).

use std::path::{Path, PathBuf};

use anyhow::Context;

/// `--csv`, `--json` and `--plots`.
#[derive(Debug, Clone, Default, clap::Args, serde::Serialize)]
pub struct Output {
    /// Write the rows as CSV.
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    /// Write everything measured (every delivery sample included) as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Draw the plots (SVG) in this directory.
    #[arg(long, value_name = "DIR")]
    pub plots: Option<PathBuf>,
}

impl Output {
    /// Prints `table` and writes `csv` and `json` where asked.
    pub fn emit(
        &self,
        table: &str,
        csv: impl FnOnce() -> String,
        json: &impl serde::Serialize,
    ) -> anyhow::Result<()> {
        print!("{table}");
        if let Some(p) = &self.csv {
            write(p, &csv())?;
        }
        if let Some(p) = &self.json {
            write(p, &serde_json::to_string_pretty(json)?)?;
        }
        Ok(())
    }
}

/// Writes `text` to `path`.
pub fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// `v` with `prec` decimals, or `-` when absent or not finite.
pub fn opt(v: Option<f64>, prec: usize) -> String {
    match v {
        Some(x) if x.is_finite() => format!("{x:.prec$}"),
        _ => "-".into(),
    }
}

/// A column of a fixed-width table: header, width, left-aligned or not, and its cell of a row.
pub struct Col<R>(&'static str, usize, bool, fn(&R) -> String);

impl<R> Col<R> {
    /// Right-aligned.
    pub const fn r(head: &'static str, width: usize, cell: fn(&R) -> String) -> Col<R> {
        Col(head, width, false, cell)
    }

    /// Left-aligned.
    pub const fn l(head: &'static str, width: usize, cell: fn(&R) -> String) -> Col<R> {
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

/// The table of `rows` under `cols`' headers, a space between columns. A row for which
/// `error` gives a message shows its first `lead` cells, then `FAILED: MESSAGE`.
pub fn table_of<R>(
    cols: &[Col<R>],
    rows: &[R],
    lead: usize,
    error: impl Fn(&R) -> Option<&str>,
) -> String {
    let line = |cells: Vec<String>| cells.join(" ").trim_end().to_owned() + "\n";
    let mut s = line(cols.iter().map(|c| c.pad(c.0)).collect());
    for r in rows {
        let shown = if error(r).is_some() { lead } else { cols.len() };
        let mut cells: Vec<String> = cols[..shown].iter().map(|c| c.pad(&(c.3)(r))).collect();
        if let Some(e) = error(r) {
            cells.push(format!("FAILED: {e}"));
        }
        s.push_str(&line(cells));
    }
    s
}

/// `v`'s scalars by their path (`delivery.p99_ms`), a list's values joined by `;` under one.
fn flatten(path: String, v: &serde_json::Value, out: &mut Vec<(String, String)>) {
    use serde_json::Value;
    let join = |k: &str| {
        if path.is_empty() {
            k.to_owned()
        } else {
            format!("{path}.{k}")
        }
    };
    match v {
        Value::Null => {}
        Value::Object(m) => m.iter().for_each(|(k, v)| flatten(join(k), v, out)),
        Value::Array(items) => {
            let mut cols: Vec<(String, String)> = Vec::new();
            for item in items {
                let mut one = Vec::new();
                flatten(path.clone(), item, &mut one);
                for (k, v) in one {
                    match cols.iter_mut().find(|c| c.0 == k) {
                        Some(c) => c.1 = format!("{};{v}", c.1),
                        None => cols.push((k, v)),
                    }
                }
            }
            out.extend(cols);
        }
        Value::String(t) => out.push((path, t.replace([',', '\n'], ";"))),
        other => out.push((path, other.to_string())),
    }
}

/// One CSV line per row: every figure, named by its path in the JSON (`delivery.p99_ms`,
/// `cpu.relay_ms`, `lanes.delivered_bytes`), empty where the row has none; the top-level
/// fields in `skip` are in the JSON only.
pub fn csv(rows: &[impl serde::Serialize], skip: &[&str]) -> String {
    let flat: Vec<Vec<(String, String)>> = (rows.iter())
        .map(|r| {
            let mut v = serde_json::to_value(r).unwrap_or_default();
            if let Some(m) = v.as_object_mut() {
                skip.iter().for_each(|k| drop(m.remove(*k)));
            }
            let mut out = Vec::new();
            flatten(String::new(), &v, &mut out);
            out
        })
        .collect();
    let mut cols: Vec<&str> = Vec::new();
    for (k, _) in flat.iter().flatten() {
        if !cols.contains(&k.as_str()) {
            cols.push(k);
        }
    }
    let mut s = cols.join(",") + "\n";
    for row in &flat {
        let cell = |c: &&str| (row.iter().find(|(k, _)| k == c)).map_or("", |(_, v)| v.as_str());
        s += &(cols.iter().map(cell).collect::<Vec<_>>().join(",") + "\n");
    }
    s
}
