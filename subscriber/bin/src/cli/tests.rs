//! Unit tests of `cli`.

use super::*;
use clap::Parser;

/// `ledger-subscribe --relay r:1 --certs d --name n` followed by `extra`, parsed.
fn parse_with(extra: &[&str]) -> Result<Args, clap::Error> {
    let base = [
        "ledger-subscribe",
        "--relay",
        "r:1",
        "--certs",
        "d",
        "--name",
        "n",
    ];
    Args::try_parse_from(base.iter().chain(extra))
}

fn ledger(seq: u32, received_ns: u64, last_byte_ns: u64) -> Ledger {
    Ledger {
        seq,
        data: bytes::Bytes::from(vec![0u8; 1000]),
        raw_len: 1000,
        header_hash: [0; 32],
        previous_hash: [0; 32],
        relay_first_byte_ns: 0,
        relay_last_byte_ns: last_byte_ns,
        received_ns,
        wire_bytes: 400,
        relay: "127.0.0.1:1".parse().unwrap(),
    }
}

#[test]
fn stats_rows() {
    assert_eq!(
        stats_row(&ledger(7, 3_500_000, 1_000_000), None),
        "7,1000,400,2.500,,3.500\n"
    );
    assert_eq!(
        stats_row(&ledger(8, 603_500_000, 600_000_000), Some(3_500_000)),
        "8,1000,400,3.500,600.000,603.500\n"
    );
    // Clocks that disagree give a negative delivery, not a wrapped one.
    assert!(stats_row(&ledger(9, 1, 2_000_000), None).starts_with("9,1000,400,-2.000,"));
}

#[test]
fn arguments_parse() {
    let args = Args::try_parse_from([
        "ledger-subscribe",
        "--relay",
        "a.example:7000,127.0.0.1:7001",
        "--certs",
        "/tmp/certs",
        "--name",
        "rpc-1",
        "--from",
        "1410048",
        "--count",
        "10",
        "--lanes",
        "2",
        "--lane-ports",
        "9000",
        "--hedge",
    ])
    .unwrap();
    assert!(args.hedge);
    assert_eq!(args.relay.len(), 2);
    assert_eq!(args.relay[0].host(), "a.example");
    assert_eq!(args.from, Some(Start::Seq(1_410_048)));
    assert_eq!(args.count, Some(10));
    assert_eq!(args.out, "-");
    assert_eq!(args.consume_delay, None);
    let defaults = parse_with(&[]).unwrap();
    assert_eq!(defaults.from, None);
    assert_eq!(defaults.anchor, None);
    assert!(!defaults.no_content_check);
    assert_eq!(defaults.lanes, 4);
    assert!(!defaults.hedge);
    for bad in [
        vec!["--relay", "nope", "--certs", "d", "--name", "n"],
        vec!["--relay", "r:1", "--certs", "d"],
    ] {
        let argv = std::iter::once("ledger-subscribe").chain(bad.iter().copied());
        assert!(Args::try_parse_from(argv).is_err(), "{bad:?}");
    }
    for bad in [
        &["--from", "0"][..],
        &["--consume-delay", "10"],
        &["--anchor", "5:abcd"],
        &["--consume-delay", "-1s"],
    ] {
        assert!(parse_with(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn watchdog_timeouts_parse() {
    let a = parse_with(&["--heartbeat-timeout", "3s", "--progress-timeout", "12.5s"]).unwrap();
    assert_eq!(a.heartbeat_timeout, Some(Duration::from_secs(3)));
    assert_eq!(a.progress_timeout, Some(Duration::from_millis(12_500)));
    let defaults = parse_with(&[]).unwrap();
    assert_eq!(
        (defaults.heartbeat_timeout, defaults.progress_timeout),
        (None, None)
    );
}

#[test]
fn consume_delay_parses_like_other_durations() {
    let parse = |v: &str| parse_with(&["--consume-delay", v]).map(|a| a.consume_delay);
    assert_eq!(parse("2.5s").unwrap(), Some(Duration::from_millis(2500)));
    assert_eq!(parse("250ms").unwrap(), Some(Duration::from_millis(250)));
    assert_eq!(parse("0ms").unwrap(), Some(Duration::ZERO));
    assert!(parse("fast").is_err());
}

#[test]
fn consume_pause_waits_and_stops_when_the_sender_goes() {
    let (tx, rx) = mpsc::channel::<()>(1);
    let t = Instant::now();
    consume_pause(Duration::from_millis(120), &rx);
    assert!(
        t.elapsed() >= Duration::from_millis(120),
        "{:?}",
        t.elapsed()
    );
    drop(tx);
    let t = Instant::now();
    consume_pause(Duration::from_secs(30), &rx);
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
}

#[test]
fn status_line_shows_lag_and_lanes() {
    let mut m = Meter::new();
    m.add(&ledger(100, 0, 0));
    let mut status = Status::default();
    status.relay = Some("127.0.0.1:7000".parse().unwrap());
    status.lanes_up = 3;
    status.lanes_granted = 4;
    status.newest = 103;
    let line = m.line(&status);
    assert!(line.starts_with("seq 100 | lag 3 |"), "{line}");
    assert!(line.contains("lanes 3/4 | relay 127.0.0.1:7000"), "{line}");
}

#[test]
fn lane_stats_arguments() {
    let parse = parse_with;
    let a = parse(&[
        "--lane-stats",
        "/tmp/l.csv",
        "--lane-stats-interval",
        "200ms",
    ])
    .unwrap();
    assert_eq!(a.lane_stats, Some(PathBuf::from("/tmp/l.csv")));
    assert_eq!(a.lane_stats_interval, Some(Duration::from_millis(200)));
    assert_eq!(
        parse(&["--lane-stats", "x"]).unwrap().lane_stats_interval,
        None
    );
    // An interval without the file says nothing: refused.
    assert!(parse(&["--lane-stats-interval", "1s"]).is_err());
    assert!(parse(&["--lane-stats", "x", "--lane-stats-interval", "soon"]).is_err());
}

#[test]
fn a_hedged_runs_first_look_goes_beside_its_stats() {
    let dir = tempfile::tempdir().unwrap();
    let stats = dir.path().join("s.csv");
    let look = |relay: &str, first, later, share, gain: Option<(f64, f64)>| FirstLook {
        relay: relay.into(),
        first,
        later,
        first_share: share,
        gain_mean_ms: gain.map(|g| g.0),
        gain_p99_ms: gain.map(|g| g.1),
    };
    let both = [
        look("a:7400", 3, 1, 0.75, Some((1.0, 4.0))),
        look("b:7400", 1, 0, 0.25, None),
    ];
    report_first_look(&both, Some(&stats)).unwrap();
    let text = std::fs::read_to_string(dir.path().join("s.csv.first-look")).unwrap();
    assert_eq!(
        text,
        "relay,first,later,first_share,gain_mean_ms,gain_p99_ms\n\
         a:7400,3,1,0.7500,1.000,4.000\n\
         b:7400,1,0,0.2500,,\n"
    );
    // A plain run (no relays compared) writes no file.
    let plain = dir.path().join("plain.csv");
    report_first_look(&[], Some(&plain)).unwrap();
    assert!(!dir.path().join("plain.csv.first-look").exists());
}

/// `--help` shows each default of [`shown_defaults`], and no other flag states a number as its
/// default by hand.
#[test]
fn help_shows_the_defaults_the_code_uses() {
    use clap::CommandFactory;
    let cmd = Args::command();
    let shown = shown_defaults();
    for arg in cmd.get_arguments() {
        let long = arg.get_long().unwrap_or_default();
        let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
        match shown.iter().find(|(flag, ..)| *flag == long) {
            Some((_, value, note)) => {
                let tag = match note {
                    Some(note) => format!(" [default: {value}; {note}]"),
                    None => format!(" [default: {value}]"),
                };
                assert!(help.ends_with(&tag), "--{long}: {help:?}");
                assert_eq!(help.matches("[default: ").count(), 1, "--{long}: {help:?}");
            }
            None => assert!(
                !help
                    .split("[default: ")
                    .skip(1)
                    .any(|rest| rest.starts_with(|c: char| c.is_ascii_digit())),
                "--{long} states a default by hand: {help:?}"
            ),
        }
    }
    for (flag, ..) in &shown {
        assert!(
            cmd.get_arguments().any(|a| a.get_long() == Some(flag)),
            "--{flag} is not a flag"
        );
    }
}

/// docs/operations.md states each default of [`shown_defaults`] where it names the flag:
/// "`--FLAG ...` (default VALUE)", the value as the flag reads it.
#[test]
fn the_docs_state_the_defaults_the_code_uses() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/operations.md");
    let docs = std::fs::read_to_string(path).unwrap().replace('\n', " ");
    // Every "(default X)" that follows a mention of the flag, X as the flag would read it.
    let documented = |flag: &str| -> Vec<String> {
        let mention = format!("`--{flag}");
        docs.match_indices(&mention)
            .filter_map(|(at, _)| {
                let rest = &docs[at + mention.len()..];
                let rest = &rest[rest.find('`')? + 1..];
                let value = rest.trim_start().strip_prefix("(default ")?;
                Some(value[..value.find(')')?].replace(' ', ""))
            })
            .collect()
    };
    // Durations compare as durations (`60 s` is `60s`), other values as written.
    let same = |a: &str, b: &str| match (parse_duration(a), parse_duration(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    };
    for (flag, value, note) in shown_defaults() {
        // The value, and for a flag with two defaults (a note) the other one too.
        let mut values = vec![value];
        values.extend(note.and_then(|n| n.rsplit(' ').next().map(str::to_owned)));
        let found = documented(flag);
        for v in &values {
            assert!(
                found.iter().any(|f| same(f, v)),
                "--{flag}: the docs state {found:?}, the code {v}"
            );
        }
        for f in &found {
            assert!(
                values.iter().any(|v| same(f, v)),
                "--{flag}: the docs state {f}, the code {values:?}"
            );
        }
    }
}
