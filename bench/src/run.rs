//! `ledger-bench run`: a preset's rows (a built-in one or a file), with flags and `--set`
//! overriding fields of every row and `--sweep` multiplying them, through the runner.

use std::path::PathBuf;

use anyhow::bail;

use crate::row::Row;
use crate::scenario::{assignment, sweep, value, Preset, Scenario, PRESETS};

/// Flags for the fields most often set (`--set` reaches every field): `(flag, field)`, each
/// taking the field's value.
macro_rules! field_flags {
    ($($(#[doc = $doc:literal])* $field:ident),* $(,)?) => {
        /// Fields of every row, set by name.
        #[derive(Debug, Clone, Default, clap::Args)]
        pub struct Fields {
            $($(#[doc = $doc])* #[arg(long, value_name = "VALUE")] pub $field: Option<String>,)*
        }

        impl Fields {
            /// The fields given, as `--set` gives them.
            pub fn given(&self) -> Vec<(String, toml::Value)> {
                let mut out = Vec::new();
                $(if let Some(v) = &self.$field {
                    out.push((stringify!($field).to_owned(), value(v)));
                })*
                out
            }
        }
    };
}

field_flags! {
    /// `loopback` or `emulated` (root).
    network,
    /// Per-flow cap of the emulated network, Mbit/s.
    flow_mbit,
    /// Ledgers measured per subscriber, after the warm-up.
    ledgers,
    /// Ledgers left out at the start of each subscriber.
    warmup,
    /// Synthetic ledger size (`594KiB`; a number is bytes).
    size,
    /// Time between ledgers (`600ms`; a number is milliseconds).
    cadence,
    /// Raw bytes per chunk.
    chunk,
    /// Largest UDP payload of the lanes, both ends (8952 for jumbo frames).
    max_mtu,
    /// UDP payload the lanes take the path to carry, both ends.
    min_mtu,
}

/// `ledger-bench run` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// A built-in preset (see --list) or a preset file.
    #[arg(long, value_name = "NAME|FILE", default_value = "table")]
    pub preset: String,
    /// Print the built-in presets and exit.
    #[arg(long)]
    pub list: bool,
    /// Run only these rows (repeatable): a row's name, or `FIELD=VALUE` for the rows whose field
    /// has that value in the preset (`--only network=loopback`).
    #[arg(long, value_name = "ROW|FIELD=VALUE")]
    pub only: Vec<String>,
    /// Set any field of every row (repeatable): `--set receive_only=true`.
    #[arg(long, value_name = "FIELD=VALUE", value_parser = assignment)]
    pub set: Vec<(String, toml::Value)>,
    /// Run every row once per value (repeatable; after the preset's own sweeps):
    /// `--sweep subscribers=1,4,16,64`.
    #[arg(long, value_name = "FIELD=V1,V2,...", value_parser = sweep)]
    pub sweep: Vec<(String, Vec<toml::Value>)>,
    /// Fields by name.
    #[command(flatten)]
    pub fields: Fields,
    /// Runs of the whole list, one after another (the table shows every run).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub repeat: u32,
    /// Directory of the `file:` sources' relative paths.
    #[arg(long, value_name = "DIR", default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata"))]
    pub testdata: PathBuf,
    /// `--csv`, `--json`, `--plots`.
    #[command(flatten)]
    pub output: crate::report::Output,
}

/// What a run measured (its `--json`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    /// The preset.
    pub preset: String,
    /// The machine's load averages (1, 5, 15 min) before the first row and after the last.
    pub load: [Option<[f64; 3]>; 2],
    /// The rows.
    pub rows: Vec<Row>,
}

impl RunArgs {
    /// The rows these arguments select, in the order they run.
    pub fn scenarios(&self) -> anyhow::Result<Vec<Scenario>> {
        let mut set = self.fields.given();
        set.extend(self.set.iter().cloned());
        let rows = Preset::load(&self.preset)?.expand(&set, &self.sweep, &self.only)?;
        let names: std::collections::BTreeSet<&str> =
            rows.iter().map(|r| r.name.as_str()).collect();
        if names.len() != rows.len() {
            bail!("two rows have the same name");
        }
        Ok((0..self.repeat).flat_map(|_| rows.clone()).collect())
    }
}

/// Runs the rows one after another (a failed row carries its error).
pub fn run(a: &RunArgs) -> anyhow::Result<Report> {
    let rows = a.scenarios()?;
    let mut env = crate::runner::Env::local(&rows, a.testdata.clone())?;
    let load = crate::procs::load_average();
    let mut out = Vec::new();
    for (i, sc) in rows.iter().enumerate() {
        eprintln!("ledger-bench: row {} of {}: {}", i + 1, rows.len(), sc.name);
        out.push(Row::finish(sc, crate::runner::take(&mut env, sc), 0.0));
    }
    Ok(Report {
        preset: a.preset.clone(),
        load: [load, crate::procs::load_average()],
        rows: out,
    })
}

/// The whole command: runs, prints the tables, writes the files.
pub fn main(a: &RunArgs) -> anyhow::Result<()> {
    if a.list {
        for (name, text) in PRESETS {
            let about = toml::from_str::<Preset>(text).map_or_else(|_| String::new(), |p| p.about);
            println!("{name:<14} {about}");
        }
        return Ok(());
    }
    let report = run(a)?;
    let fmt =
        |l: Option<[f64; 3]>| l.map_or("?".into(), |[a, b, c]| format!("{a:.2} {b:.2} {c:.2}"));
    let (before, after) = (fmt(report.load[0]), fmt(report.load[1]));
    let head = format!("preset {}; load average {before} -> {after}\n", a.preset);
    crate::row::emit(&a.output, &head, &report.rows, &report)
}
