use super::*;
use ledger_relay_wire::compress::Codec;

fn base() -> RunArgs {
    RunArgs {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        certs: Some("/tmp/certs".into()),
        data_dir: Some("/tmp/data".into()),
        source: Some("synthetic".into()),
        ..RunArgs::default()
    }
}

#[test]
fn sizes_and_durations() {
    assert_eq!(parse_size("256KiB").unwrap(), 256 << 10);
    assert_eq!(parse_size("14.5MiB").unwrap(), 15_204_352);
    assert_eq!(parse_size("1GB").unwrap(), 1_000_000_000);
    assert_eq!(parse_size("42").unwrap(), 42);
    assert!(parse_size("12 parsecs").is_err());
    assert!(parse_size("MiB").is_err());
    assert_eq!(parse_duration("600ms").unwrap(), Duration::from_millis(600));
    assert!(parse_duration("soon").is_err());
}

#[test]
fn defaults_and_required_flags() {
    let c = RelayConfig::from_args(base()).unwrap();
    assert_eq!(c.retention, 10_000);
    assert_eq!(c.name, "relay");
    assert_eq!(c.pipeline.codec, Codec::Zstd);
    assert_eq!(c.source_options.cadence, Duration::from_millis(600));
    assert_eq!(
        c.stale_after,
        Duration::from_secs(3),
        "5 cadences of a paced source"
    );
    let mut a = base();
    a.listen = None;
    let e = RelayConfig::from_args(a).unwrap_err().to_string();
    assert!(e.contains("--listen is required"), "{e}");
    let mut a = base();
    a.codec = Some("brotli".into());
    assert!(RelayConfig::from_args(a).is_err());
    let mut a = base();
    a.window = Some(0);
    assert!(RelayConfig::from_args(a).is_err());
}

#[test]
fn stale_after_defaults_by_source_and_parses() {
    let mut a = base();
    a.source = Some("pipe:stellar-core run".into());
    assert_eq!(
        RelayConfig::from_args(a).unwrap().stale_after,
        Duration::from_secs(30)
    );
    let mut a = base();
    a.cadence = Some("10s".into());
    assert_eq!(
        RelayConfig::from_args(a).unwrap().stale_after,
        Duration::from_secs(50)
    );
    let mut a = base();
    a.source = Some("stdin".into());
    a.stale_after = Some("1m 30s".into());
    assert_eq!(
        RelayConfig::from_args(a).unwrap().stale_after,
        Duration::from_secs(90)
    );
    for (bad, want) in [
        ("0s", "--stale-after must be more than 0"),
        ("soon", "--stale-after: bad duration \"soon\""),
    ] {
        let mut a = base();
        a.stale_after = Some(bad.into());
        let e = format!("{:#}", RelayConfig::from_args(a).unwrap_err());
        assert!(e.starts_with(want), "{bad}: {e}");
    }
}

#[test]
fn delivery_modes_default_off_and_parse() {
    let c = RelayConfig::from_args(base()).unwrap();
    assert!(!c.pipeline.store_and_forward);
    assert_eq!(c.server.session.streams_per_lane, None, "unlimited");
    let mut a = base();
    a.store_and_forward = true;
    a.streams_per_lane = Some(1);
    let c = RelayConfig::from_args(a).unwrap();
    assert!(c.pipeline.store_and_forward);
    assert_eq!(c.server.session.streams_per_lane, Some(1));
    let mut a = base();
    a.streams_per_lane = Some(MAX_STREAMS_PER_LANE);
    assert_eq!(
        RelayConfig::from_args(a)
            .unwrap()
            .server
            .session
            .streams_per_lane,
        Some(1024)
    );
    for bad in [0, MAX_STREAMS_PER_LANE + 1, u32::MAX] {
        let mut a = base();
        a.streams_per_lane = Some(bad);
        let e = format!("{:#}", RelayConfig::from_args(a).unwrap_err());
        assert_eq!(e, format!("--streams-per-lane {bad}: expected 1..=1024"));
    }
}

#[test]
fn admission_flags_default_and_parse() {
    let c = RelayConfig::from_args(base()).unwrap();
    let s = &c.server;
    assert_eq!(
        (
            s.max_connections_per_address,
            s.max_connections_per_identity,
            s.max_sessions_per_identity,
            s.retry_threshold
        ),
        (256, 256, 64, 64)
    );
    assert_eq!(s.session.start_wait, Some(DEFAULTS.start_wait));
    let mut a = base();
    a.max_connections_per_address = Some(8);
    a.max_connections_per_identity = Some(16);
    a.max_sessions_per_identity = Some(2);
    a.retry_threshold = Some(0);
    a.start_wait = Some("1m".into());
    let c = RelayConfig::from_args(a).unwrap();
    let s = &c.server;
    assert_eq!(
        (
            s.max_connections_per_address,
            s.max_connections_per_identity,
            s.max_sessions_per_identity,
            s.retry_threshold
        ),
        (8, 16, 2, 0)
    );
    assert_eq!(s.session.start_wait, Some(Duration::from_secs(60)));
    for (set, want) in [
        (
            (|a: &mut RunArgs| a.max_sessions_per_identity = Some(0)) as fn(&mut RunArgs),
            "--max-sessions-per-identity must be at least 1",
        ),
        (
            |a| a.max_connections_per_address = Some(0),
            "--max-connections-per-address must be at least 1",
        ),
        (|a| a.start_wait = Some("soon".into()), "--start-wait"),
    ] {
        let mut a = base();
        set(&mut a);
        let e = format!("{:#}", RelayConfig::from_args(a).unwrap_err());
        assert!(e.starts_with(want), "{e}");
    }
}

#[test]
fn handshake_pool_flags_default_parse_and_are_checked() {
    let c = RelayConfig::from_args(base()).unwrap();
    let s = &c.server;
    assert_eq!(
        (
            s.handshake_pool,
            s.handshake_pool_per_source,
            s.handshake_timeout
        ),
        (128, 32, Duration::from_secs(2))
    );
    assert_eq!(s.first_frame_timeout, Duration::from_secs(10));
    let mut a = base();
    a.handshake_pool = Some(16);
    a.handshake_pool_per_source = Some(4);
    a.handshake_timeout = Some("1500ms".into());
    let s = RelayConfig::from_args(a).unwrap().server;
    assert_eq!(
        (
            s.handshake_pool,
            s.handshake_pool_per_source,
            s.handshake_timeout
        ),
        (16, 4, Duration::from_millis(1500))
    );
    // A pool smaller than the default share: the share is the pool.
    let mut a = base();
    a.handshake_pool = Some(8);
    assert_eq!(
        RelayConfig::from_args(a)
            .unwrap()
            .server
            .handshake_pool_per_source,
        8
    );
    for (set, want) in [
        (
            (|a: &mut RunArgs| a.handshake_pool = Some(0)) as fn(&mut RunArgs),
            "--handshake-pool 0: expected 1..=65536",
        ),
        (
            |a| a.handshake_pool_per_source = Some(129),
            "--handshake-pool-per-source 129: expected 1..=--handshake-pool (128)",
        ),
        (
            |a| a.handshake_timeout = Some("10ms".into()),
            "--handshake-timeout 10ms: expected 100ms..=60s",
        ),
        (
            |a| a.handshake_timeout = Some("soon".into()),
            "--handshake-timeout",
        ),
    ] {
        let mut a = base();
        set(&mut a);
        let e = format!("{:#}", RelayConfig::from_args(a).unwrap_err());
        assert!(e.starts_with(want), "{e}");
    }
}

#[test]
fn lake_flags_parse_and_are_checked() {
    let c = RelayConfig::from_args(base()).unwrap();
    assert!(c.export.is_none() && c.backfill.is_none());
    let mut a = base();
    a.export = Some("s3://lake/pubnet".into());
    a.network = Some("pubnet".into());
    a.export_ledgers_per_file = Some(8);
    a.backfill = Some("file:///var/lake".into());
    a.backfill_sessions = Some(2);
    let c = RelayConfig::from_args(a).unwrap();
    let e = c.export.unwrap();
    assert_eq!(e.url.to_string(), "s3://lake/pubnet");
    assert_eq!(e.network, ledger_relay_lake::PUBNET_PASSPHRASE);
    assert_eq!(e.layout.ledgers_per_batch, Some(8));
    assert_eq!(e.layout.batches_per_partition, None, "the lake's, or 64000");
    assert_eq!(e.zstd_level, 1);
    let b = c.backfill.unwrap();
    assert_eq!(b.url.to_string(), "file:///var/lake");
    assert_eq!(
        (b.sessions, b.sessions_per_identity, b.prefetch.depth),
        (2, 1, 8)
    );
    assert_eq!(
        b.network.as_deref(),
        Some(ledger_relay_lake::PUBNET_PASSPHRASE)
    );
    let mut a = base();
    a.network_passphrase = Some("Standalone Network ; February 2017".into());
    a.source = Some("datalake:file:///l,from=5,to=9".into());
    let c = RelayConfig::from_args(a).unwrap();
    assert_eq!(
        c.source_options.network_passphrase.as_deref(),
        Some("Standalone Network ; February 2017")
    );
    for (set, want) in [
        (
            (|a: &mut RunArgs| a.export = Some("s3://lake".into())) as fn(&mut RunArgs),
            "--export needs the network's passphrase",
        ),
        (
            |a| {
                a.export = Some("http://lake".into());
                a.network = Some("testnet".into());
            },
            "--export: bad lake url \"http://lake\": unknown scheme",
        ),
        (
            |a| {
                a.export = Some("file:///l".into());
                a.network = Some("testnet".into());
                a.export_files_per_partition = Some(0);
            },
            "batches per partition must be at least 1",
        ),
        (
            |a| {
                a.export = Some("file:///l".into());
                a.network = Some("testnet".into());
                a.export_zstd_level = Some(30);
            },
            "--export-zstd-level 30: expected 1..=22",
        ),
        (
            |a| a.export_ledgers_per_file = Some(4),
            "--export-ledgers-per-file needs --export URL",
        ),
        (
            |a| a.backfill = Some("file://relative".into()),
            "--backfill: bad lake url",
        ),
        (
            |a| a.backfill_prefetch = Some(4),
            "--backfill-prefetch needs --backfill URL",
        ),
        (
            |a| {
                a.backfill = Some("file:///l".into());
                a.backfill_sessions = Some(0);
            },
            "--backfill-sessions 0: expected 1..=1024",
        ),
        (
            |a| a.backfill_sessions_per_identity = Some(1),
            "--backfill-sessions-per-identity needs --backfill URL",
        ),
        (
            |a| {
                a.backfill = Some("file:///l".into());
                a.backfill_sessions_per_identity = Some(5);
            },
            "--backfill-sessions-per-identity 5: expected 1..=--backfill-sessions (4)",
        ),
        (
            |a| a.source = Some("datalake:s3://b,from=9,to=5".into()),
            "bad datalake source: to=5 is before from=9",
        ),
    ] {
        let mut a = base();
        set(&mut a);
        let e = format!("{:#}", RelayConfig::from_args(a).unwrap_err());
        assert!(e.contains(want), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }
}

#[test]
fn flags_override_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("relay.toml");
    std::fs::write(
        &path,
        "listen = \"127.0.0.1:7400\"\ncerts = \"/c\"\ndata_dir = \"/d\"\nsource = \"stdin\"\n\
         retention = 50\nallow = [\"rpc-1\"]\ncodec = \"lz4\"\nstale_after = \"45s\"\n\
         max_sessions_per_identity = 3\nretry_threshold = 5\nstart_wait = \"2s\"\n\
         max_connections_per_address = 7\nmax_connections_per_identity = 9\n\
         handshake_pool = 64\nhandshake_pool_per_source = 8\nhandshake_timeout = \"1s\"\n\
         backfill = \"file:///l\"\nbackfill_sessions = 6\nbackfill_sessions_per_identity = 2\n[transport]\nsend_window = 1000000\n",
    )
    .unwrap();
    let args = RunArgs {
        config: Some(path.clone()),
        retention: Some(7),
        ..RunArgs::default()
    };
    let c = RelayConfig::from_args(args).unwrap();
    assert_eq!(c.retention, 7, "flag wins");
    assert_eq!(c.allow, vec!["rpc-1".to_string()]);
    assert_eq!(c.pipeline.codec, Codec::Lz4);
    assert_eq!(c.transport.send_window, 1_000_000);
    assert_eq!(c.listen.port(), 7400);
    assert_eq!(c.stale_after, Duration::from_secs(45));
    assert_eq!(
        (
            c.server.max_sessions_per_identity,
            c.server.retry_threshold,
            c.server.max_connections_per_address,
            c.server.max_connections_per_identity
        ),
        (3, 5, 7, 9)
    );
    assert_eq!(c.server.session.start_wait, Some(Duration::from_secs(2)));
    let s = &c.server;
    assert_eq!(
        (
            s.handshake_pool,
            s.handshake_pool_per_source,
            s.handshake_timeout
        ),
        (64, 8, Duration::from_secs(1))
    );
    let b = c.backfill.as_ref().unwrap();
    assert_eq!((b.sessions, b.sessions_per_identity), (6, 2));
    std::fs::write(&path, "listen = \"127.0.0.1:7400\"\nbogus = 1\n").unwrap();
    let args = RunArgs {
        config: Some(path),
        ..RunArgs::default()
    };
    let e = format!("{:#}", RelayConfig::from_args(args).unwrap_err());
    assert!(e.contains("bogus"), "{e}");
}

#[test]
fn a_relay_source_needs_an_upstream_name_and_only_it_takes_one() {
    let mut a = base();
    a.source = Some("relay:10.0.0.1:7400,10.0.0.2:7400".into());
    let e = RelayConfig::from_args(a.clone()).unwrap_err().to_string();
    assert!(e.contains("--upstream-name"), "{e}");
    a.upstream_name = Some("edge-1".into());
    let c = RelayConfig::from_args(a.clone()).unwrap();
    assert_eq!(
        c.upstream,
        Some(UpstreamConfig {
            name: "edge-1".into(),
            lanes: DEFAULTS.upstream_lanes,
            cut_through: false,
            anchor: None,
        })
    );
    assert!(c.external_source.is_none(), "set by the binary");
    let mut ct = a.clone();
    ct.cut_through = true;
    let c = RelayConfig::from_args(ct).unwrap();
    assert!(c.upstream.is_some_and(|u| u.cut_through));
    a.upstream_lanes = Some(0);
    assert!(RelayConfig::from_args(a).is_err());
    let mut b = base();
    b.upstream_name = Some("edge-1".into());
    let e = RelayConfig::from_args(b).unwrap_err().to_string();
    assert!(e.contains("go with --source relay:"), "{e}");
    let mut b = base();
    b.cut_through = true;
    let e = RelayConfig::from_args(b).unwrap_err().to_string();
    assert!(e.contains("go with --source relay:"), "{e}");
}

#[test]
fn core_flags_default_parse_and_are_checked() {
    let c = RelayConfig::from_args(base()).unwrap();
    assert_eq!(c.core, CoreSettings::default());
    assert_eq!(c.core.timeout, Duration::from_secs(5));
    assert_eq!(c.core.max_request, 1 << 20);
    assert_eq!(c.core.concurrency, 16);
    assert!(!c.core.has_own_core() && c.core_upstream.is_none());
    let mut a = base();
    a.core_http = Some("http://127.0.0.1:11626".into());
    a.core_query = Some("http://[::1]:11628/".into());
    a.core_query_allow = vec!["rpc-1".into(), "rpc-2".into()];
    a.core_timeout = Some("1500ms".into());
    a.core_max_request = Some("64KiB".into());
    a.core_concurrency = Some(4);
    let c = RelayConfig::from_args(a).unwrap().core;
    assert_eq!(c.http.unwrap().to_string(), "http://127.0.0.1:11626");
    assert_eq!(c.query.unwrap().to_string(), "http://[::1]:11628");
    assert_eq!(c.http_allow, None, "every client --allow admits");
    assert_eq!(c.query_allow, Some(vec!["rpc-1".into(), "rpc-2".into()]));
    assert_eq!(
        (c.timeout, c.max_request, c.concurrency),
        (Duration::from_millis(1500), 64 << 10, 4)
    );
    let refused = |f: &dyn Fn(&mut RunArgs), why: &str| {
        let mut a = base();
        f(&mut a);
        let e = format!("{:#}", RelayConfig::from_args(a).unwrap_err());
        assert!(e.contains(why), "{why}: {e}");
    };
    refused(
        &|a| a.core_http = Some("https://core:11626".into()),
        "not http",
    );
    refused(&|a| a.core_query = Some("http://core".into()), "no port");
    refused(
        &|a| a.core_query = Some("core:11628".into()),
        "--core-query",
    );
    refused(
        &|a| a.core_http_allow = vec!["bad name".into()],
        "--core-http-allow",
    );
    refused(&|a| a.core_timeout = Some("0s".into()), "--core-timeout");
    refused(&|a| a.core_timeout = Some("2m".into()), "--core-timeout");
    refused(
        &|a| a.core_max_request = Some("2MiB".into()),
        "--core-max-request",
    );
    refused(
        &|a| a.core_max_request = Some("0".into()),
        "--core-max-request",
    );
    refused(&|a| a.core_concurrency = Some(0), "--core-concurrency");
    refused(&|a| a.core_concurrency = Some(5000), "--core-concurrency");
}

#[test]
fn core_keys_in_the_file_and_flags_over_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("relay.toml");
    std::fs::write(
        &path,
        "listen = \"127.0.0.1:7400\"\ncerts = \"/c\"\ndata_dir = \"/d\"\nsource = \"stdin\"\n\
         core_http = \"http://127.0.0.1:11626\"\ncore_query = \"http://127.0.0.1:11628\"\n\
         core_http_allow = [\"rpc-1\"]\ncore_query_allow = [\"rpc-2\"]\ncore_timeout = \"2s\"\n\
         core_max_request = \"512KiB\"\ncore_concurrency = 8\n",
    )
    .unwrap();
    let args = RunArgs {
        config: Some(path.clone()),
        core_query_allow: vec!["rpc-3".into()],
        core_concurrency: Some(3),
        ..RunArgs::default()
    };
    let c = RelayConfig::from_args(args).unwrap().core;
    assert_eq!(c.http.unwrap().to_string(), "http://127.0.0.1:11626");
    assert_eq!(c.query.unwrap().to_string(), "http://127.0.0.1:11628");
    assert_eq!(c.http_allow, Some(vec!["rpc-1".into()]));
    assert_eq!(c.query_allow, Some(vec!["rpc-3".into()]), "flag wins");
    assert_eq!(
        (c.timeout, c.max_request, c.concurrency),
        (Duration::from_secs(2), 512 << 10, 3)
    );
    std::fs::write(
        &path,
        "listen = \"127.0.0.1:7400\"\ncerts = \"/c\"\ndata_dir = \"/d\"\nsource = \"stdin\"\n\
         core_http = \"ftp://127.0.0.1:11626\"\n",
    )
    .unwrap();
    let args = RunArgs {
        config: Some(path),
        ..RunArgs::default()
    };
    let e = format!("{:#}", RelayConfig::from_args(args).unwrap_err());
    assert!(e.contains("--core-http ftp://127.0.0.1:11626"), "{e}");
}

/// `--upstream-anchor SEQ:HASH` (or `upstream_anchor` in the file) takes the grammar of
/// `ledger-subscribe --anchor`, and only with a `relay:` source.
#[test]
fn an_upstream_anchor_is_a_trusted_ledger_for_a_relay_source() {
    let hex = "0f".repeat(32);
    let mut a = base();
    a.source = Some("relay:10.0.0.1:7400".into());
    a.upstream_name = Some("edge-1".into());
    a.upstream_anchor = Some(format!("1410048:{hex}"));
    let c = RelayConfig::from_args(a.clone()).unwrap();
    assert_eq!(c.upstream.unwrap().anchor, Some((1_410_048, [0x0f; 32])));
    for (bad, reason) in [
        ("1410048", "expected SEQ:HASH"),
        ("1410048:abcd", "HASH must be 64 hex digits"),
        (&format!("0:{hex}")[..], "ledger sequence 0 names no ledger"),
    ] {
        a.upstream_anchor = Some(bad.into());
        let e = format!("{:#}", RelayConfig::from_args(a.clone()).unwrap_err());
        assert!(e.contains("--upstream-anchor") && e.contains(reason), "{e}");
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("relay.toml");
    std::fs::write(&path, format!("upstream_anchor = \"7:{hex}\"\n")).unwrap();
    a.upstream_anchor = None;
    a.config = Some(path);
    let c = RelayConfig::from_args(a).unwrap();
    assert_eq!(c.upstream.unwrap().anchor, Some((7, [0x0f; 32])));
    let mut b = base();
    b.upstream_anchor = Some(format!("7:{hex}"));
    let e = RelayConfig::from_args(b).unwrap_err().to_string();
    assert!(e.contains("go with --source relay:"), "{e}");
}

/// For a duration, a size, a count and a switch: a flag given wins over the file's key, the
/// file's key over the default, and without either the setting is [`DEFAULTS`]'.
#[test]
fn a_flag_wins_over_the_file_and_the_file_over_the_default() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("relay.toml");
    std::fs::write(
        &path,
        "heartbeat = \"400ms\"\nretention_bytes = \"2GiB\"\nmax_sessions = 9\n\
         store_and_forward = true\n",
    )
    .unwrap();
    let settings = |c: &RelayConfig| {
        (
            c.server.session.heartbeat,
            c.retention_bytes,
            c.server.max_sessions,
            c.pipeline.store_and_forward,
        )
    };
    let c = RelayConfig::from_args(base()).unwrap();
    assert_eq!(
        settings(&c),
        (
            DEFAULTS.heartbeat,
            DEFAULTS.retention_bytes,
            DEFAULTS.max_sessions,
            false
        ),
        "neither: the defaults"
    );
    let file = RunArgs {
        config: Some(path.clone()),
        ..base()
    };
    let c = RelayConfig::from_args(file.clone()).unwrap();
    assert_eq!(
        settings(&c),
        (Duration::from_millis(400), 2 << 30, 9, true),
        "the file over the defaults"
    );
    let flags = RunArgs {
        heartbeat: Some("1s".into()),
        retention_bytes: Some("3GiB".into()),
        max_sessions: Some(5),
        ..file
    };
    let c = RelayConfig::from_args(flags).unwrap();
    assert_eq!(
        settings(&c),
        (Duration::from_secs(1), 3 << 30, 5, true),
        "flags over the file (a switch is on when either turns it on)"
    );
    std::fs::write(&path, "store_and_forward = false\n").unwrap();
    let c = RelayConfig::from_args(RunArgs {
        config: Some(path),
        store_and_forward: true,
        ..base()
    })
    .unwrap();
    assert!(c.pipeline.store_and_forward, "the flag over the file");
}
