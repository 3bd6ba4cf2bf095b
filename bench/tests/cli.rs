//! The command line as a whole: clap's own consistency checks, and the measurements it offers.

use clap::{CommandFactory, Parser};
use ledger_relay_bench::{Cli, Command};

#[test]
fn the_command_line_is_consistent_and_offers_each_measurement_once() {
    Cli::command().debug_assert();
    let names: Vec<String> = Cli::command()
        .get_subcommands()
        .map(|c| c.get_name().to_owned())
        .collect();
    assert_eq!(
        names,
        ["run", "remote", "yardstick", "cpu", "storage", "query"]
    );
    let help = Cli::command().render_long_help().to_string();
    for name in &names {
        assert!(help.contains(name.as_str()), "{name} missing from the help");
        let e = Cli::try_parse_from(["ledger-bench", name, "--help"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::DisplayHelp, "{name}");
    }
}

#[test]
fn the_remote_command_line_is_the_contracts() {
    let argv = [
        "ledger-bench",
        "remote",
        "--relay",
        "relay-a.example:7400",
        "--certs",
        "certs",
        "--name",
        "bench",
        "--lanes",
        "1,2,4,8",
        "--ledgers",
        "60",
        "--tcp",
        "relay-a.example:7401",
    ];
    let Command::Remote(a) = Cli::try_parse_from(argv).unwrap().command else {
        panic!("not remote")
    };
    assert_eq!(
        (&a.lanes[..], a.ledgers, a.tcp.as_deref()),
        (&[1, 2, 4, 8][..], 60, Some("relay-a.example:7401"))
    );
    let rows = ledger_relay_bench::remote::scenarios(&a);
    let names: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "remote-tcp",
            "remote-l1",
            "remote-l2",
            "remote-l4",
            "remote-l8"
        ]
    );
    rows.iter().for_each(|r| r.check().unwrap());
    // Each flag has one spelling: no alias is accepted.
    for other in [
        ["--cadence-ms", "300"],
        ["--ledger-bytes", "1024"],
        ["--lane-counts", "1"],
    ] {
        assert!(
            Cli::try_parse_from([&argv[..], &other[..]].concat()).is_err(),
            "{other:?}"
        );
    }
}
