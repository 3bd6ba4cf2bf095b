use clap::{Args, FromArgMatches};

use super::*;
use crate::config::{RelayConfig, RunArgs};

/// `ledger-relay run`'s flags as clap builds them.
fn run_command() -> clap::Command {
    RunArgs::augment_args(clap::Command::new("run"))
}

/// Flags that every default can be given beside: a `relay:` source (for `--upstream-*`), an
/// export lake and a backfill lake (for their settings).
const CONTEXT: &[&str] = &[
    "run",
    "--listen=127.0.0.1:0",
    "--certs=/tmp/certs",
    "--data-dir=/tmp/data",
    "--source=relay:127.0.0.1:7400",
    "--upstream-name=edge",
    "--network=testnet",
    "--export=file:///tmp/export",
    "--backfill=file:///tmp/backfill",
];

fn config_of(args: &[String]) -> RelayConfig {
    let matches = run_command()
        .try_get_matches_from(args)
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    let args = RunArgs::from_arg_matches(&matches).unwrap();
    RelayConfig::from_args(args).unwrap()
}

/// Giving a flag its shown default on the command line builds the same configuration as not
/// giving it: what help and docs show is what the code uses. (The export lake's layout flags,
/// when given, are also held against an existing lake's own layout; without them the lake's
/// own is taken: that difference is their note.)
#[test]
fn each_shown_default_given_as_a_flag_changes_nothing() {
    let context: Vec<String> = CONTEXT.iter().map(|s| s.to_string()).collect();
    let without = format!("{:?}", config_of(&context));
    for d in DEFAULTS.shown() {
        let mut args = context.clone();
        args.push(format!("--{}={}", d.flag, d.value));
        let mut c = config_of(&args);
        let export = c.export.as_mut().unwrap();
        let given = match d.flag {
            "export-ledgers-per-file" => export.layout.ledgers_per_batch.take(),
            "export-files-per-partition" => export.layout.batches_per_partition.take(),
            _ => None,
        };
        if let Some(given) = given {
            assert_eq!(given.to_string(), d.value);
        }
        assert_eq!(format!("{c:?}"), without, "--{}", d.flag);
    }
    // The check can fail: a value other than the default changes the configuration.
    let mut args = context.clone();
    args.push("--heartbeat=251ms".into());
    assert_ne!(format!("{:?}", config_of(&args)), without);
}

#[test]
fn every_shown_default_names_a_flag_of_run_once() {
    let cmd = run_command();
    let mut seen = std::collections::BTreeSet::new();
    for d in DEFAULTS.shown() {
        assert!(seen.insert(d.flag), "--{} shown twice", d.flag);
        assert!(
            cmd.get_arguments().any(|a| a.get_long() == Some(d.flag)),
            "--{} is not a flag of run",
            d.flag
        );
    }
}

/// `--help` shows every default of the table, and no flag's help states a number as its
/// default by hand.
#[test]
fn help_shows_the_defaults_of_the_table() {
    let cmd = run_command();
    let shown = DEFAULTS.shown();
    for arg in cmd.get_arguments() {
        let long = arg.get_long().unwrap_or_default();
        let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
        match shown.iter().find(|d| d.flag == long) {
            Some(d) => {
                let tag = match &d.note {
                    Some(note) => format!(" [default: {}; {note}]", d.value),
                    None => format!(" [default: {}]", d.value),
                };
                assert!(help.ends_with(&tag), "--{long}: {help:?}");
                assert_eq!(help.matches("[default: ").count(), 1, "--{long}: {help:?}");
            }
            None => assert!(
                !help
                    .split("[default: ")
                    .skip(1)
                    .any(|rest| rest.starts_with(|c: char| c.is_ascii_digit())),
                "--{long} states a default outside the table: {help:?}"
            ),
        }
    }
    let help = run_command().render_help().to_string();
    assert!(help.contains("[default: 600ms]"), "{help}");
    assert!(help.contains("[default: 64GiB]"), "{help}");
}

/// The rows of `docs/operations.md`'s "All flags" table: (flag without dashes, default cell).
fn documented_defaults() -> Vec<(String, String)> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/operations.md");
    let text = std::fs::read_to_string(path).unwrap();
    let table = text
        .split("\n### All flags\n")
        .nth(1)
        .expect("docs/operations.md has an \"All flags\" section");
    let table = table.split("\n#").next().unwrap();
    let rows: Vec<(String, String)> = table
        .lines()
        .filter(|l| l.starts_with("| `--"))
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split(" | ").map(str::trim).collect();
            assert!(cells.len() >= 3, "{l}");
            let flag = cells[0]
                .trim_matches('`')
                .trim_start_matches("--")
                .split(' ')
                .next()
                .unwrap()
                .to_owned();
            (flag, cells[1].to_owned())
        })
        .collect();
    assert!(rows.len() > 40, "{} rows", rows.len());
    rows
}

/// docs/operations.md states each default of the table, every flag of `run` is documented,
/// and no documented fixed default is missing from the table.
#[test]
fn the_docs_flag_table_states_the_defaults_of_the_table() {
    let docs = documented_defaults();
    let cmd = run_command();
    let shown = DEFAULTS.shown();
    for d in &shown {
        let (_, cell) = docs
            .iter()
            .find(|(flag, _)| flag == d.flag)
            .unwrap_or_else(|| panic!("--{} is not in the docs' flag table", d.flag));
        let value = format!("`{}`", d.value);
        match d.note {
            None => assert_eq!(cell, &value, "--{}", d.flag),
            Some(_) => assert!(cell.starts_with(&value), "--{}: {cell:?}", d.flag),
        }
    }
    for arg in cmd.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        assert!(
            docs.iter().any(|(flag, _)| flag == long),
            "--{long} is not in the docs' flag table"
        );
    }
    for (flag, cell) in &docs {
        // `--log-format` belongs to every command of the binary, not to `run`'s settings.
        if flag == "log-format" {
            continue;
        }
        assert!(
            cmd.get_arguments().any(|a| a.get_long() == Some(flag)),
            "the docs' flag table names --{flag}, which run does not have"
        );
        let fixed = cell.starts_with('`') && !cell.starts_with("`--");
        assert!(
            !fixed || shown.iter().any(|d| d.flag == flag),
            "--{flag}: the docs state {cell:?}, the table has no default"
        );
    }
}

#[test]
fn paced_sources_go_stale_after_five_cadences_and_at_least_a_second() {
    assert_eq!(
        DEFAULTS.paced_stale_after(Duration::from_millis(600)),
        Duration::from_secs(3)
    );
    assert_eq!(
        DEFAULTS.paced_stale_after(Duration::from_millis(2)),
        Duration::from_secs(1)
    );
}

#[test]
fn defaults_are_within_the_protocols_limits() {
    let limits = ledger_relay_wire::Limits::default();
    assert_eq!(DEFAULTS.core_max_request, limits.max_core_request);
    assert!(DEFAULTS.chunk_size <= limits.max_chunk_raw);
    assert!(u32::from(DEFAULTS.window) <= limits.max_ledgers_in_flight);
}
