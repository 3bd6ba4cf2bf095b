//! The command line as a whole: clap's own consistency checks (no flag declared twice in a
//! command, every default parses), and every subcommand's `--help` printing its flags.

use clap::CommandFactory;
use ledger_relay_bench::Cli;

#[test]
fn the_command_line_is_consistent() {
    Cli::command().debug_assert();
}

#[test]
fn every_subcommand_prints_its_help() {
    let mut cli = Cli::command();
    let names: Vec<String> = cli
        .get_subcommands()
        .filter(|c| !c.is_hide_set())
        .map(|c| c.get_name().to_owned())
        .collect();
    assert!(names.len() >= 9, "subcommands: {names:?}");
    for name in &names {
        let e = Cli::try_parse_from_help(name);
        assert_eq!(e.kind(), clap::error::ErrorKind::DisplayHelp, "{name}");
        let text = e.to_string();
        assert!(text.contains("Usage: ledger-bench"), "{name}: {text}");
        assert!(text.contains("--help"), "{name}: {text}");
    }
    let top = cli.render_long_help().to_string();
    for name in &names {
        assert!(
            top.contains(name.as_str()),
            "{name} missing from the top-level help"
        );
    }
}

#[test]
fn fanout_takes_the_shared_transport_and_output_groups() {
    let text = Cli::try_parse_from_help("fanout").to_string();
    for flag in [
        "--max-mtu",
        "--min-mtu",
        "--csv",
        "--json",
        "--plots",
        "--relay-arg",
    ] {
        assert!(text.contains(flag), "fanout --help lacks {flag}");
    }
}

trait HelpOf {
    fn try_parse_from_help(name: &str) -> clap::Error;
}

impl HelpOf for Cli {
    fn try_parse_from_help(name: &str) -> clap::Error {
        use clap::Parser;
        Cli::try_parse_from(["ledger-bench", name, "--help"]).expect_err("--help exits")
    }
}

#[test]
fn the_old_cadence_ms_spelling_still_parses_as_the_cadence() {
    use clap::Parser;
    use ledger_relay_bench::Helper;
    // Each subcommand keeps its own default through the one shared declaration.
    for (sub, default) in [
        ("fanout", 600.0),
        ("tiers", 600.0),
        ("lanes", 15.0),
        ("slow-subscriber", 250.0),
        ("load", 250.0),
        ("lake", 600.0),
    ] {
        let parse = |argv: &[&str]| {
            let cli = Cli::try_parse_from([&["ledger-bench", sub][..], argv].concat())
                .unwrap_or_else(|e| panic!("{sub} {argv:?}: {e}"));
            match cli.helper {
                Some(Helper::Fanout(a)) => a.cadence.cadence_ms,
                Some(Helper::Tiers(a)) => a.cadence.cadence_ms,
                Some(Helper::Lanes(a)) => a.cadence.cadence_ms,
                Some(Helper::SlowSubscriber(a)) => a.run.cadence.cadence_ms,
                Some(Helper::Load(a)) => a.run.cadence.cadence_ms,
                Some(Helper::Lake(a)) => a.cadence.cadence_ms,
                other => panic!("{sub}: {other:?}"),
            }
        };
        assert_eq!(parse(&[]), default, "{sub}");
        assert_eq!(parse(&["--cadence-ms", "300"]), 300.0, "{sub}");
        assert_eq!(parse(&["--cadence", "300ms"]), 300.0, "{sub}");
        assert_eq!(parse(&["--cadence", "1.5s"]), 1500.0, "{sub}");
        assert!(Cli::try_parse_from(["ledger-bench", sub, "--cadence", "soon"]).is_err());
    }
    let top = |argv: &[&str]| Cli::try_parse_from([&["ledger-bench"][..], argv].concat()).unwrap();
    assert_eq!(top(&["--cadence-ms", "300"]).args.cadence.cadence_ms, 300.0);
    assert_eq!(top(&[]).args.cadence.cadence_ms, 600.0);
    assert_eq!(top(&["--quick"]).args.cadence.cadence_ms, 250.0);
}

#[test]
fn the_ledger_size_is_one_flag_with_units_and_the_old_spelling() {
    use clap::Parser;
    use ledger_relay_bench::Helper;
    // Each subcommand keeps its own default through the one shared declaration.
    for (sub, default) in [
        ("fanout", 15_204_352),
        ("tiers", 15_204_352),
        ("lanes", 2 << 20),
        ("slow-subscriber", 608_174),
        ("load", 256 << 10),
        ("lake", 15_204_352),
        ("ring-disk", 15_204_352),
        ("cpu", 15_204_352),
    ] {
        let parse = |argv: &[&str]| {
            let cli = Cli::try_parse_from([&["ledger-bench", sub][..], argv].concat())
                .unwrap_or_else(|e| panic!("{sub} {argv:?}: {e}"));
            match cli.helper {
                Some(Helper::Fanout(a)) => a.stream.size.ledger_bytes,
                Some(Helper::Tiers(a)) => a.stream.size.ledger_bytes,
                Some(Helper::Lanes(a)) => a.size.ledger_bytes,
                Some(Helper::SlowSubscriber(a)) => a.run.workload.size.ledger_bytes,
                Some(Helper::Load(a)) => a.run.workload.size.ledger_bytes,
                Some(Helper::Lake(a)) => a.size.ledger_bytes,
                Some(Helper::RingDisk(a)) => a.workload.size.ledger_bytes,
                Some(Helper::Cpu(a)) => a.size.ledger_bytes,
                other => panic!("{sub}: {other:?}"),
            }
        };
        assert_eq!(parse(&[]), default, "{sub}");
        assert_eq!(parse(&["--size", "1MiB"]), 1 << 20, "{sub}");
        assert_eq!(parse(&["--ledger-bytes", "608174"]), 608_174, "{sub}");
        for bad in ["0", "big"] {
            assert!(Cli::try_parse_from(["ledger-bench", sub, "--size", bad]).is_err());
        }
    }
    let top = Cli::try_parse_from(["ledger-bench", "--ledger-bytes", "1048576"]).unwrap();
    assert_eq!(top.args.size.ledger_bytes, 1 << 20);
    let top = Cli::try_parse_from(["ledger-bench"]).unwrap();
    assert_eq!(top.args.size.ledger_bytes, 15_204_352);
}

#[test]
fn the_ledgers_and_warmup_are_one_flag_each_with_each_subcommands_defaults() {
    use clap::Parser;
    use ledger_relay_bench::Helper;
    for (sub, warmup, ledgers) in [
        ("fanout", 3, 20),
        ("tiers", 3, 20),
        ("slow-subscriber", 3, 100),
        ("lake", 3, 60),
        ("cpu", 2, 20),
    ] {
        let series = |argv: &[&str]| {
            let cli = Cli::try_parse_from([&["ledger-bench", sub][..], argv].concat()).unwrap();
            match cli.helper {
                Some(Helper::Fanout(a)) => a.series,
                Some(Helper::Tiers(a)) => a.series,
                Some(Helper::SlowSubscriber(a)) => a.series,
                Some(Helper::Lake(a)) => a.series,
                Some(Helper::Cpu(a)) => a.series,
                other => panic!("{sub}: {other:?}"),
            }
        };
        assert_eq!(series(&[]).warmup, warmup, "{sub}");
        assert_eq!(series(&[]).count.ledgers, ledgers, "{sub}");
        assert_eq!(series(&["--warmup", "7"]).warmup, 7, "{sub}");
        assert_eq!(series(&["--ledgers", "9"]).count.ledgers, 9, "{sub}");
    }
    let top = |argv: &[&str]| Cli::try_parse_from([&["ledger-bench"][..], argv].concat()).unwrap();
    assert_eq!(top(&["--warmup", "5"]).args.series.warmup, 5);
    // A --quick preset changes the default, not a value given.
    assert_eq!(top(&[]).args.series.count.ledgers, 60);
    assert_eq!(top(&["--quick"]).args.series.count.ledgers, 15);
    assert_eq!(
        top(&["--quick", "--ledgers", "30"])
            .args
            .series
            .count
            .ledgers,
        30
    );
}

#[test]
fn renamed_flags_keep_their_old_spelling() {
    use clap::Parser;
    use ledger_relay_bench::Helper;
    let helper = |argv: &[&str]| {
        Cli::try_parse_from([&["ledger-bench"][..], argv].concat())
            .unwrap()
            .helper
    };
    for (sub, old, new) in [
        ("lanes", "--lanes", "--lane-counts"),
        ("remote", "--lanes", "--lane-counts"),
        ("fanout", "--subscribers", "--subscriber-counts"),
    ] {
        let remote = ["--relay", "h:1", "--certs", "c", "--name", "n"];
        for flag in [old, new] {
            let extra: &[&str] = if sub == "remote" { &remote } else { &[] };
            let counts: Vec<u16> = match helper(&[&[sub, flag, "1,3"][..], extra].concat()) {
                Some(Helper::Lanes(a)) => a.lanes.counts.iter().map(|&n| u16::from(n)).collect(),
                Some(Helper::Remote(a)) => a.lanes.counts.iter().map(|&n| u16::from(n)).collect(),
                Some(Helper::Fanout(a)) => a.subscriber_counts,
                other => panic!("{sub}: {other:?}"),
            };
            assert_eq!(counts, [1, 3], "{sub} {flag}");
        }
    }
    for flag in ["--warmup", "--slope-warmup"] {
        match helper(&["load", flag, "3s"]) {
            Some(Helper::Load(a)) => assert_eq!(a.slope_warmup, Some(3.0)),
            other => panic!("load: {other:?}"),
        }
    }
    for flag in ["--chunk-size", "--chunk", "--chunk-bytes"] {
        match helper(&["cpu", flag, "64KiB"]) {
            Some(Helper::Cpu(a)) => assert_eq!(a.chunk.chunk_bytes, 64 << 10),
            other => panic!("cpu: {other:?}"),
        }
    }
}

/// The `ledger-bench` command lines recorded in bench/RESULTS.md: continuation lines joined,
/// from `ledger-bench` up to a comment, `;`, `|` or the end of a code span; optional parts
/// (`[--flag]`) taken as given; a shell variable left out, with the flag it is the value of.
fn recorded_commands() -> Vec<Vec<String>> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/RESULTS.md");
    let text = std::fs::read_to_string(path).unwrap();
    let joined = text.replace("\\\n", " ");
    let mut out = Vec::new();
    for line in joined.lines() {
        let Some(i) = line.find("target/release/ledger-bench") else {
            continue;
        };
        let rest = &line[i + "target/release/ledger-bench".len()..];
        let end = rest.find(['#', ';', '|', '`']).unwrap_or(rest.len());
        let mut argv = vec!["ledger-bench".to_owned()];
        for w in rest[..end].split_whitespace() {
            let w = w.trim_matches(['[', ']']);
            if w.contains('$') {
                if argv
                    .last()
                    .is_some_and(|f| f.starts_with("--") && !f.contains('='))
                {
                    argv.pop();
                }
            } else if !w.is_empty() {
                argv.push(w.to_owned());
            }
        }
        out.push(argv);
    }
    out
}

#[test]
fn every_command_recorded_in_results_still_parses() {
    use clap::Parser;
    let commands = recorded_commands();
    assert!(commands.len() >= 40, "{} commands found", commands.len());
    for argv in &commands {
        if let Err(e) = Cli::try_parse_from(argv) {
            panic!("{}: {e}", argv.join(" "));
        }
    }
}
