use super::*;
use ledger_relay_wire::core_http::CorePort;
use std::time::Duration;

fn args(line: &str) -> Vec<String> {
    line.split_whitespace().map(str::to_owned).collect()
}

#[test]
fn every_command_line_the_sdk_builds_parses() {
    assert_eq!(parse_args(&args("version")).unwrap(), Command::Version);
    assert_eq!(
        parse_args(&args("--conf /s/stellar-core.conf --console new-db")).unwrap(),
        Command::NewDb
    );
    assert_eq!(
        parse_args(&args("--conf c offline-info")).unwrap(),
        Command::OfflineInfo
    );
    assert_eq!(
        parse_args(&args("--conf c --console catchup 1410046/0")).unwrap(),
        Command::Catchup {
            to: 1410046,
            count: 0,
            stream: None,
            conf: Some("c".into()),
        }
    );
    assert_eq!(
        parse_args(&args(
            "--conf c --console catchup 1410200/101 --metadata-output-stream fd:3"
        ))
        .unwrap(),
        Command::Catchup {
            to: 1410200,
            count: 101,
            stream: Some(3),
            conf: Some("c".into()),
        }
    );
    assert_eq!(
        parse_args(&args(
            "--conf c --console run --metadata-output-stream fd:3"
        ))
        .unwrap(),
        Command::Run {
            stream: Some(3),
            conf: Some("c".into()),
            start_at: None,
            start_hash: None
        }
    );
    let hash = "ab".repeat(32);
    assert_eq!(
        parse_args(&args(&format!(
            "run --metadata-output-stream fd:3 --start-at-ledger 9 --start-at-hash {hash}"
        )))
        .unwrap(),
        Command::Run {
            stream: Some(3),
            conf: None,
            start_at: Some(9),
            start_hash: Some([0xab; 32])
        }
    );
}

#[test]
fn command_lines_it_cannot_answer_are_refused_by_name() {
    for line in [
        "",
        "http-command info",
        "catchup 10",
        "catchup x/1",
        "run --metadata-output-stream 3",
        "run --unknown",
        "--conf",
    ] {
        let e = parse_args(&args(line)).unwrap_err();
        assert!(matches!(e, CaptiveError::Usage(_)), "{line}: {e}");
        assert_eq!(e.exit_code(), 2);
    }
}

#[test]
fn catch_up_starts_where_core_replays_from() {
    // The SDK expects a bounded stream to begin at the first ledger of the checkpoint.
    assert_eq!(checkpoint_start(1410100, 64), 1410048);
    assert_eq!(checkpoint_start(1410048, 64), 1410048);
    assert_eq!(checkpoint_start(1410111, 64), 1410048);
    assert_eq!(checkpoint_start(1410112, 64), 1410112);
    assert_eq!(checkpoint_start(5, 64), 2);
    assert_eq!(checkpoint_start(20, 8), 16);
    assert_eq!(catchup_range(1410200, 101, 64).unwrap(), (1410048, 153));
    assert_eq!(catchup_range(10, 1000, 64).unwrap(), (2, 9));
    assert_eq!(catchup_range(2, 1, 64).unwrap(), (2, 1));
    for (to, count) in [(1, 1), (0, 5), (100, 0)] {
        let e = catchup_range(to, count, 64).unwrap_err();
        assert!(matches!(e, CaptiveError::Usage(_)), "{to}/{count}: {e}");
    }
}

#[test]
fn state_round_trips_and_damage_is_named() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(State::load(dir.path()).unwrap(), None);
    let s = State {
        ledger: 7,
        hash: None,
        protocol: None,
    };
    s.save(dir.path()).unwrap();
    assert_eq!(State::load(dir.path()).unwrap(), Some(s));
    let s = State {
        ledger: 1410100,
        hash: Some([7; 32]),
        protocol: None,
    };
    s.save(dir.path()).unwrap();
    assert_eq!(State::load(dir.path()).unwrap(), Some(s));
    let s = State {
        protocol: Some(25),
        ..s
    };
    s.save(dir.path()).unwrap();
    assert_eq!(State::load(dir.path()).unwrap(), Some(s));
    // Moved (new-db, catchup TO/0): the position and hash go, the protocol stays.
    let moved = s.moved_to(1);
    moved.save(dir.path()).unwrap();
    let back = State::load(dir.path()).unwrap().unwrap();
    assert_eq!((back.ledger, back.hash, back.protocol), (1, None, Some(25)));
    let json = s.info_json("v23.0.0-x", 23);
    assert!(json.contains("\"num\":1410100"), "{json}");
    assert!(json.contains(&"07".repeat(32)), "{json}");
    for bad in [
        "seven\n",
        "7 protocol=x\n",
        "7 protocol=23 protocol=24\n",
        "7 protocol=23 abab\n",
        "7 nothex\n",
    ] {
        std::fs::write(dir.path().join(STATE_FILE), bad).unwrap();
        let e = State::load(dir.path()).unwrap_err().to_string();
        assert!(e.contains("damaged"), "{bad}: {e}");
    }
}

#[test]
fn settings_come_from_the_file_and_the_environment_overrides() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("captive-core.toml");
    std::fs::write(
        &file,
        "relay = [\"127.0.0.1:7000\"]\ncerts = \"/c\"\nname = \"rpc-1\"\nlanes = 2\n",
    )
    .unwrap();
    let mut env = HashMap::new();
    env.insert(CONFIG_ENV.to_owned(), file.display().to_string());
    env.insert(
        format!("{ENV_PREFIX}RELAY"),
        "127.0.0.1:7001,127.0.0.1:7002".to_owned(),
    );
    env.insert(format!("{ENV_PREFIX}HEDGE"), "true".to_owned());
    let s = Settings::load(&env).unwrap();
    assert_eq!(s.relay, ["127.0.0.1:7001", "127.0.0.1:7002"]);
    assert_eq!(s.lanes, Some(2));
    assert_eq!(s.hedge, Some(true));
    assert_eq!(s.name.as_deref(), Some("rpc-1"));
    assert_eq!(s.checkpoint_frequency(), 64);

    env.insert(format!("{ENV_PREFIX}LANES"), "many".to_owned());
    let e = Settings::load(&env).unwrap_err().to_string();
    assert!(e.contains("LEDGER_CAPTIVE_CORE_LANES=many"), "{e}");
    env.remove(&format!("{ENV_PREFIX}LANES"));
    env.insert(format!("{ENV_PREFIX}RELAYS"), "x".to_owned());
    let e = Settings::load(&env).unwrap_err().to_string();
    assert!(e.contains("unknown setting"), "{e}");

    std::fs::write(&file, "relays = []\n").unwrap();
    let e = Settings::load(&HashMap::from([(
        CONFIG_ENV.to_owned(),
        file.display().to_string(),
    )]))
    .unwrap_err()
    .to_string();
    assert!(e.contains("relays"), "{e}");
    // A named file that is missing is an error, not an empty configuration.
    let e = Settings::load(&HashMap::from([(
        CONFIG_ENV.to_owned(),
        "/nonexistent/x.toml".to_owned(),
    )]))
    .unwrap_err()
    .to_string();
    assert!(e.contains("/nonexistent/x.toml"), "{e}");
    // Nothing set: the missing key is named.
    let e = Settings::default()
        .subscription(5, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("relay not set"), "{e}");
}

#[test]
fn version_prints_what_the_sdk_parses() {
    let v = version_text(23);
    let first = v.lines().next().unwrap();
    assert!(first.starts_with("v23.0.0-"), "{first}");
    assert!(v.lines().any(|l| l == "ledger protocol version: 23"), "{v}");
}

#[test]
fn the_packaged_example_settings_parse() {
    let text = include_str!("../../../../packaging/config/captive-core.toml");
    let s: Settings = toml::from_str(text).unwrap();
    assert_eq!(s.relay.len(), 2);
    assert_eq!(s.name.as_deref(), Some("rpc-1"));
}

#[test]
fn run_starts_after_the_last_closed_ledger_and_links_to_it() {
    let fresh = State {
        ledger: 1,
        hash: None,
        protocol: None,
    };
    assert_eq!(run_start(fresh, None, None).unwrap(), (2, None));
    let streamed = State {
        ledger: 1410098,
        hash: Some([9; 32]),
        protocol: Some(23),
    };
    let (from, anchor) = run_start(streamed, None, None).unwrap();
    assert_eq!(from, 1410099);
    assert_eq!(
        anchor.unwrap().to_string(),
        format!("1410098:{}", "09".repeat(32))
    );
    // --start-at-ledger wins over the state.
    let (from, anchor) = run_start(streamed, Some(500), Some([1; 32])).unwrap();
    assert_eq!((from, anchor.unwrap().seq), (501, 500));
    assert!(run_start(fresh, Some(u32::MAX), None).is_err());
}

#[test]
fn version_reports_the_streamed_protocol_never_below_the_sdks_floor() {
    let state = |protocol| State {
        ledger: 9,
        hash: None,
        protocol,
    };
    let settings = Settings::default();
    assert_eq!(settings.protocol_version(None), 23, "nothing known");
    assert_eq!(settings.protocol_version(Some(&state(None))), 23);
    assert_eq!(settings.protocol_version(Some(&state(Some(25)))), 25);
    // Older ledgers (the testnet sample is protocol 19) still report what the SDK accepts.
    assert_eq!(settings.protocol_version(Some(&state(Some(19)))), 23);
    let pinned = Settings {
        protocol_version: Some(24),
        ..Settings::default()
    };
    assert_eq!(
        pinned.protocol_version(Some(&state(Some(25)))),
        24,
        "the setting wins"
    );
}

#[test]
fn version_finds_the_state_where_the_sdk_keeps_it() {
    // The SDK runs `version` in the service's directory (by default its storage path) and
    // everything else in STORAGE/captive-core.
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(State::find(dir.path()), None);
    let sdk = dir.path().join(SDK_WORKING_DIR);
    std::fs::create_dir(&sdk).unwrap();
    let s = State {
        ledger: 5,
        hash: None,
        protocol: Some(24),
    };
    s.save(&sdk).unwrap();
    assert_eq!(State::find(dir.path()), Some(s));
    assert_eq!(State::find(&sdk), Some(s));
}

/// The shape go-stellar-sdk's `CaptiveCoreToml.Marshal` writes for stellar-rpc (its query
/// server parameters set), with the other keys a generated file carries.
pub(crate) const SDK_CONF: &str = r#"# Generated file, do not edit
BUCKETLIST_DB_INDEX_PAGE_SIZE_EXPONENT = 12
BUCKETLIST_DB_MEMORY_FOR_CACHING = 0
DATABASE = "sqlite3://stellar.db"
ENABLE_DIAGNOSTICS_FOR_TX_SUBMISSION = true
ENABLE_SOROBAN_DIAGNOSTIC_EVENTS = true
FAILURE_SAFETY = -1
HTTP_PORT = 11626
HTTP_QUERY_PORT = 11628
LOG_FILE_PATH = ""
NETWORK_PASSPHRASE = "Test SDF Network ; September 2015"
QUERY_SNAPSHOT_LEDGERS = 4
QUERY_THREAD_POOL_SIZE = 2

[[HOME_DOMAINS]]
  HOME_DOMAIN = "testnet.stellar.org"
  QUALITY = "MEDIUM"

[[VALIDATORS]]
  ADDRESS = "core-testnet1.stellar.org"
  HOME_DOMAIN = "testnet.stellar.org"
  NAME = "sdf_testnet_1"
  PUBLIC_KEY = "GDKXE2OZMJIPOSLNA6N6F2BVCI3O777I2OOC4BV7VOYUEHYX7RTRYA7Y"

[HISTORY.h0]
  get = "curl -sf http://history.stellar.org/prd/core-testnet/core_testnet_001/{0} -o {1}"
"#;

#[test]
fn core_ports_are_read_from_the_file_the_sdk_writes() {
    let conf = CoreConf::parse(SDK_CONF).unwrap();
    assert_eq!(conf.http_port, 11626);
    assert_eq!(conf.query_port, 11628);
    assert!(!conf.public);
    assert_eq!(conf.query_snapshot_ledgers, Some(4));
    let local = conf.listen_addrs();
    assert_eq!(
        local,
        [
            (CorePort::Command, "127.0.0.1:11626".parse().unwrap()),
            (CorePort::Query, "127.0.0.1:11628".parse().unwrap()),
        ]
    );
    // PUBLIC_HTTP_PORT = true: every interface, both ports, as core binds them.
    let public = CoreConf::parse(&SDK_CONF.replace(
        "HTTP_PORT = 11626\n",
        "HTTP_PORT = 11626\nPUBLIC_HTTP_PORT = true\n",
    ))
    .unwrap();
    assert!(public.public);
    assert!(public
        .listen_addrs()
        .iter()
        .all(|(_, a)| a.ip().is_unspecified()));
    // The catch-up file (HTTP_PORT = 0) and Horizon's (no query port): only what is non-zero.
    let catchup = CoreConf::parse(&SDK_CONF.replace("HTTP_PORT = 11626", "HTTP_PORT = 0")).unwrap();
    assert_eq!(
        catchup.listen_addrs(),
        [(CorePort::Query, "127.0.0.1:11628".parse().unwrap())]
    );
    let horizon = CoreConf::parse("HTTP_PORT = 11626\n").unwrap();
    assert_eq!(horizon.listen_addrs().len(), 1);
    // No HTTP_PORT at all: core's default.
    assert_eq!(CoreConf::parse("").unwrap().http_port, DEFAULT_HTTP_PORT);
    assert!(CoreConf::off().listen_addrs().is_empty());
}

#[test]
fn core_port_values_core_would_refuse_are_named() {
    for (text, key) in [
        ("HTTP_PORT = 70000", "HTTP_PORT"),
        ("HTTP_PORT = \"11626\"", "HTTP_PORT"),
        ("HTTP_QUERY_PORT = -1", "HTTP_QUERY_PORT"),
        ("PUBLIC_HTTP_PORT = \"true\"", "PUBLIC_HTTP_PORT"),
        ("QUERY_SNAPSHOT_LEDGERS = -4", "QUERY_SNAPSHOT_LEDGERS"),
        ("HTTP_PORT = 9\nHTTP_QUERY_PORT = 9", "HTTP_QUERY_PORT"),
        ("HTTP_PORT = ", "not TOML"),
    ] {
        let e = CoreConf::parse(text).unwrap_err();
        assert!(e.contains(key), "{text}: {e}");
    }
}

#[test]
fn request_settings_have_defaults_and_come_from_the_environment() {
    let s = Settings::default();
    assert_eq!(
        Settings::duration(&s.query_wait, "query_wait", DEFAULT_QUERY_WAIT).unwrap(),
        Duration::from_secs(1)
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("captive-core.toml");
    std::fs::write(&file, "query_wait = \"250ms\"\ncore_timeout = \"5s\"\n").unwrap();
    let mut env = HashMap::from([(CONFIG_ENV.to_owned(), file.display().to_string())]);
    env.insert(format!("{ENV_PREFIX}CORE_TIMEOUT"), "3s".to_owned());
    let s = Settings::load(&env).unwrap();
    assert_eq!(s.query_wait.as_deref(), Some("250ms"));
    assert_eq!(
        s.core_timeout.as_deref(),
        Some("3s"),
        "the environment wins"
    );
    for bad in ["0s", "soon"] {
        let e = Settings::duration(&Some(bad.into()), "core_timeout", DEFAULT_CORE_TIMEOUT)
            .unwrap_err()
            .to_string();
        assert!(e.contains("core_timeout"), "{bad}: {e}");
    }
}

/// A stream with a hash of its own keeps it; without one the `anchor` setting anchors it:
/// directly at the anchor or the ledger after, through the ledgers between (verified, not
/// written) from further on, and never from before it.
#[test]
fn a_stream_without_a_hash_of_its_own_is_anchored_to_the_setting() {
    let trusted = Some(Anchor {
        seq: 100,
        hash: [7; 32],
    });
    let own = Some(Anchor {
        seq: 499,
        hash: [1; 32],
    });
    let at = |from, write_from, anchor: Option<Anchor>| StreamStart {
        from,
        anchor,
        write_from,
    };
    assert_eq!(
        anchored_start(500, own, trusted).unwrap(),
        at(500, 500, own)
    );
    assert_eq!(anchored_start(500, None, None).unwrap(), at(500, 500, None));
    assert_eq!(
        anchored_start(100, None, trusted).unwrap(),
        at(100, 100, trusted)
    );
    assert_eq!(
        anchored_start(101, None, trusted).unwrap(),
        at(101, 101, trusted)
    );
    assert_eq!(
        anchored_start(500, None, trusted).unwrap(),
        at(101, 500, trusted)
    );
    let e = anchored_start(99, None, trusted).unwrap_err();
    assert!(
        matches!(
            e,
            CaptiveError::BeforeAnchor {
                start: 99,
                anchor: 100
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("at or below ledger 98"), "{e}");
}

#[test]
fn the_anchor_setting_takes_the_subscriber_s_grammar() {
    let hex = "ab".repeat(32);
    let mut env = HashMap::from([(CONFIG_ENV.to_owned(), String::new())]);
    env.insert(format!("{ENV_PREFIX}ANCHOR"), format!("1410048:{hex}"));
    let s = Settings::load(&env).unwrap();
    let a = s.anchor().unwrap().unwrap();
    assert_eq!((a.seq, a.hash), (1_410_048, [0xab; 32]));
    env.insert(format!("{ENV_PREFIX}ANCHOR"), "1410048:abc".to_owned());
    let e = Settings::load(&env)
        .unwrap()
        .anchor()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("anchor") && e.contains("HASH must be 64 hex digits"),
        "{e}"
    );
    let s: Settings = toml::from_str(&format!("anchor = \"7:{hex}\"\n")).unwrap();
    assert_eq!(s.anchor().unwrap().unwrap().seq, 7);
    assert_eq!(Settings::default().anchor().unwrap(), None);
}

/// `docs/operations.md`'s table of the stand-in's settings names each setting with a default,
/// its environment variable, and the default the code uses.
#[test]
fn the_docs_state_the_stand_ins_defaults() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/operations.md");
    let docs = std::fs::read_to_string(path).unwrap();
    let header = "| setting (`captive-core.toml`) | environment | default | what it does |";
    let table = docs
        .split_once(header)
        .expect("docs/operations.md has the table of the stand-in's settings")
        .1;
    let rows: Vec<Vec<&str>> = table
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| l.trim_matches('|').split(" | ").map(str::trim).collect())
        .collect();
    let keys: Vec<&str> = rows.iter().map(|r| r[0].trim_matches('`')).collect();
    let with_default: Vec<&str> = DEFAULTS.iter().map(|(k, _)| *k).collect();
    assert_eq!(keys, with_default, "the settings the docs' table lists");
    for (row, (key, default)) in rows.iter().zip(DEFAULTS) {
        assert_eq!(
            row[1],
            format!("`{ENV_PREFIX}{}`", key.to_uppercase()),
            "{key}"
        );
        let documented = parse_duration(row[2].trim_matches('`')).unwrap();
        assert_eq!(documented, default, "{key}: the docs state {}", row[2]);
    }
    // Unset, each setting is its default; set, it is what was set.
    let waits = Settings::default().waits().unwrap();
    let resolved = [
        ("query_wait", waits.query_wait),
        ("core_timeout", waits.core_timeout),
    ];
    assert_eq!(resolved, DEFAULTS);
    let set = Settings {
        query_wait: Some("250ms".into()),
        core_timeout: Some("3s".into()),
        ..Settings::default()
    };
    assert_eq!(
        set.waits().unwrap(),
        Waits {
            core_timeout: Duration::from_secs(3),
            query_wait: Duration::from_millis(250),
        }
    );
}
