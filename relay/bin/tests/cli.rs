//! The `ledger-relay` binary's contract (`docs/operations.md`, "The command contract"): `--help` exits 0, bad arguments exit 2
//! with a one-line reason (the delivery-mode flags among them); and the metrics endpoint of a
//! running relay.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use crate::support::{certs, relay_config, Running, LAST, SYNTHETIC, TESTNET};

fn relay_bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ledger-relay"))
}

#[test]
fn help_exits_0() {
    for args in [&["--help"][..], &["run", "--help"], &["demo", "--help"]] {
        let out = relay_bin().args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("Usage"), "{args:?}: {text}");
    }
    let out = relay_bin().args(["run", "--help"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--listen",
        "--certs",
        "--name",
        "--data-dir",
        "--source",
        "--cadence",
        "--retention",
        "--allow",
        "--metrics",
        "--config",
    ] {
        assert!(text.contains(flag), "run --help lacks {flag}");
    }
}

#[test]
fn bad_arguments_exit_2_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let cases: Vec<Vec<String>> = vec![
        vec!["frobnicate".into()],
        vec!["run".into()],
        vec![
            "run".into(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--certs".into(),
            dir.path().display().to_string(),
            "--data-dir".into(),
            dir.path().join("d").display().to_string(),
            "--source".into(),
            "tcp:nowhere".into(),
        ],
        vec![
            "run".into(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--certs".into(),
            dir.path().join("no-certs").display().to_string(),
            "--data-dir".into(),
            dir.path().join("d").display().to_string(),
            "--source".into(),
            "synthetic".into(),
        ],
        vec!["demo".into(), "--ledgers".into(), "0".into()],
    ];
    for args in cases {
        let out = relay_bin()
            .args(&args)
            .env("RUST_LOG", "off")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        assert!(
            lines.first().is_some_and(|l| l.starts_with("error")),
            "{args:?}: {err}"
        );
    }
}

fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_healthz_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let certs = certs(dir.path());
    let mut config = relay_config(certs.path(), &dir.path().join("data"), SYNTHETIC);
    config.metrics = Some("127.0.0.1:0".parse().unwrap());
    let relay = Running::start(config).await;
    relay.wait_for(12).await;
    let addr = relay.relay.metrics_addr.unwrap();
    let metrics = tokio::task::spawn_blocking(move || http_get(addr, "/metrics"))
        .await
        .unwrap();
    assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
    for series in [
        "ledger_relay_ledgers_in_total ",
        "ledger_relay_wire_bytes_total ",
        "ledger_relay_ring_newest ",
        "ledger_relay_ring_degraded 0",
        "# TYPE ledger_relay_sessions_open gauge",
        "ledger_relay_source_last_ledger_age_seconds ",
        "ledger_relay_source_last_byte_age_seconds ",
        "ledger_relay_healthy 1",
        "ledger_relay_health_reason{reason=\"ring_degraded\"} 0",
        "# TYPE ledger_relay_certificate_not_after_timestamp_seconds gauge",
        "# TYPE ledger_relay_crl_next_update_timestamp_seconds gauge",
    ] {
        assert!(metrics.contains(series), "missing {series}");
    }
    // The relay's certificate (issued for 30 days) and the CRL (next update in 30 days).
    let gauge = |name: &str| -> u64 {
        let prefix = format!("{name} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .unwrap()
            .parse()
            .unwrap()
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let in_30_days = now + 30 * 86_400;
    for name in [
        "ledger_relay_certificate_not_after_timestamp_seconds",
        "ledger_relay_crl_next_update_timestamp_seconds",
    ] {
        let t = gauge(name);
        assert!(t > in_30_days - 600 && t <= in_30_days, "{name} {t}");
    }
    let health = tokio::task::spawn_blocking(move || http_get(addr, "/healthz"))
        .await
        .unwrap();
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    assert!(health.contains("\"status\":\"ok\""), "{health}");
    assert!(health.contains("\"reasons\":[]"), "{health}");
    let missing = tokio::task::spawn_blocking(move || http_get(addr, "/nope"))
        .await
        .unwrap();
    assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
    relay.stop().await;
}

#[test]
fn the_binary_documents_the_flags_and_refuses_bad_values() {
    let bin = || std::process::Command::new(env!("CARGO_BIN_EXE_ledger-relay"));
    let help = bin().args(["run", "--help"]).output().unwrap();
    assert_eq!(help.status.code(), Some(0));
    let help = String::from_utf8_lossy(&help.stdout);
    for flag in ["--store-and-forward", "--streams-per-lane <N>"] {
        assert!(help.contains(flag), "run --help lacks {flag}");
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    for (bad, reason) in [
        (
            vec!["--streams-per-lane", "0"],
            "--streams-per-lane 0: expected 1..=1024",
        ),
        (vec!["--streams-per-lane", "5000"], "expected 1..=1024"),
        (vec!["--streams-per-lane", "many"], "invalid value 'many'"),
        (vec!["--streams-per-lane=-3"], "invalid value '-3'"),
        (vec!["--store-and-forward=yes"], "--store-and-forward"),
    ] {
        let out = bin()
            .args([
                "run",
                "--listen",
                "127.0.0.1:0",
                "--certs",
                &d,
                "--data-dir",
                &d,
            ])
            .args(["--source", "synthetic"])
            .args(&bad)
            .env("RUST_LOG", "off")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        let first = err.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
        assert!(
            first.starts_with("error") && first.contains(reason),
            "{bad:?}: {err}"
        );
    }
}

/// A file replayed to its end: no more ledgers will come, and `/healthz` says so at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_source_is_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    let certs = certs(dir.path());
    let mut config = relay_config(
        certs.path(),
        &dir.path().join("data"),
        &format!("file:{TESTNET}"),
    );
    config.metrics = Some("127.0.0.1:0".parse().unwrap());
    // The file's ledgers come every 2 ms: with its paced default (1 s) the `no_ledger` reason
    // joins the answer when the check comes a second after the last one, as it can on a loaded
    // machine. The finished source is what this asks about; staleness is tested elsewhere.
    config.stale_after = Duration::from_secs(60);
    let relay = Running::start(config).await;
    relay.wait_for(LAST).await;
    let addr = relay.relay.metrics_addr.unwrap();
    let health = eventually_get(addr, "/healthz", |h| h.contains("\"source\":\"finished\"")).await;
    assert!(health.starts_with("HTTP/1.1 503"), "{health}");
    assert!(
        health.contains("\"reasons\":[\"source finished: no more ledgers will come\"]"),
        "{health}"
    );
    assert!(
        health.contains("\"reason_codes\":[\"source_finished\"]"),
        "{health}"
    );
    relay.stop().await;
}

/// `GET path` every 20 ms until the answer satisfies `want` (5 s at most).
async fn eventually_get(
    addr: std::net::SocketAddr,
    path: &'static str,
    want: impl Fn(&str) -> bool,
) -> String {
    for _ in 0..250 {
        let got = tokio::task::spawn_blocking(move || http_get(addr, path))
            .await
            .unwrap();
        if want(&got) {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("GET {path}: no wanted answer within 5 s")
}

/// A config file for `check-config` in `dir` with `certs`, plus `extra` lines.
fn config_file(dir: &std::path::Path, certs: &std::path::Path, extra: &str) -> std::path::PathBuf {
    let path = dir.join("relay.toml");
    std::fs::write(
        &path,
        format!(
            "listen = \"127.0.0.1:0\"\ncerts = \"{}\"\ndata_dir = \"{}\"\n{extra}",
            certs.display(),
            dir.join("data").display()
        ),
    )
    .unwrap();
    path
}

#[test]
fn check_config_exits_0_for_a_good_file_and_2_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let certs = certs(dir.path());
    let good = config_file(
        dir.path(),
        certs.path(),
        "source = \"synthetic\"\nmetrics = \"127.0.0.1:9100\"\nstale_after = \"45s\"\n\
         max_connections_per_address = 32\nmax_connections_per_identity = 64\n\
         max_sessions_per_identity = 8\nretry_threshold = 16\nstart_wait = \"10s\"\n",
    );
    let out = relay_bin()
        .args(["check-config", "--config"])
        .arg(&good)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains(": ok (listen 127.0.0.1:0"), "{stdout}");
    assert!(stdout.contains("certificate expires 20"), "{stdout}");

    let cases: &[(&str, &str)] = &[
        (
            "source = \"synthetic\"\nbogus = 1\n",
            "line 5, column 1 (`bogus = 1`): unknown field `bogus`",
        ),
        (
            "source = \"synthetic\"\nretention = \"many\"\n",
            "invalid type",
        ),
        (
            "source = \"synthetic\"\nretention = 0\n",
            "--retention must be at least 1",
        ),
        (
            "source = \"synthetic\"\nstale_after = \"0s\"\n",
            "--stale-after must be more than 0",
        ),
        (
            "source = \"synthetic\"\nmax_sessions_per_identity = 0\n",
            "--max-sessions-per-identity must be at least 1",
        ),
        (
            "source = \"synthetic\"\nstart_wait = \"a while\"\n",
            "--start-wait",
        ),
        ("source = \"tcp:nowhere\"\n", "unknown source kind"),
        ("", "--source is required"),
        (
            "source = \"synthetic\"\nname = \"nobody\"\n",
            "loading certificates",
        ),
        (
            "source = \"file:/nonexistent/dump.xdr\"\n",
            "source file:/nonexistent/dump.xdr",
        ),
    ];
    for (extra, want) in cases {
        let path = config_file(dir.path(), certs.path(), extra);
        let out = relay_bin()
            .args(["check-config", "--config"])
            .arg(&path)
            .env("RUST_LOG", "off")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{extra:?}: one line: {err}");
        assert!(err.starts_with("error: "), "{extra:?}: {err}");
        assert!(err.contains(want), "{extra:?}: {err}");
        assert!(out.stdout.is_empty());
    }
    let out = relay_bin()
        .args(["check-config", "--config", "/nonexistent/relay.toml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("reading /nonexistent/relay.toml"));
}

#[test]
fn json_logs_are_one_json_object_per_line() {
    let dir = tempfile::tempdir().unwrap();
    let certs = certs(dir.path());
    let log = dir.path().join("relay.log");
    let mut child = relay_bin()
        .args([
            "run",
            "--log-format",
            "json",
            "--listen",
            "127.0.0.1:0",
            "--certs",
        ])
        .arg(certs.path())
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .args([
            "--source",
            SYNTHETIC,
            "--cadence",
            "20ms",
            "--metrics",
            "127.0.0.1:0",
        ])
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    // Until ledgers flow, then a graceful stop: start, work and shutdown are all logged.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("ring opened")
    {
        assert!(std::time::Instant::now() < deadline, "no log");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(500));
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    assert!(child.wait().unwrap().success());
    let text = std::fs::read_to_string(&log).unwrap();
    let mut messages = Vec::new();
    for line in text.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
        for key in ["timestamp", "level", "target", "message"] {
            assert!(v.get(key).is_some(), "{key} missing: {line}");
        }
        messages.push(v["message"].as_str().unwrap().to_owned());
    }
    for want in [
        "relay listening",
        "metrics listening",
        "source starting",
        "signal received: shutting down (again to exit at once)",
    ] {
        assert!(
            messages.iter().any(|m| m == want),
            "{want:?} not in {messages:?}"
        );
    }
    // The fatal line of a failing command is JSON too.
    let out = relay_bin()
        .args([
            "--log-format",
            "json",
            "check-config",
            "--config",
            "/nonexistent/x.toml",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    let v: serde_json::Value = serde_json::from_str(err.trim_end()).unwrap();
    assert_eq!(v["level"], "ERROR");
    assert!(v["message"]
        .as_str()
        .unwrap()
        .contains("reading /nonexistent/x.toml"));
}

#[test]
fn man_pages_and_completions_come_from_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let out = relay_bin().arg("man").arg(dir.path()).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    for page in [
        "ledger-relay.1",
        "ledger-relay-run.1",
        "ledger-relay-check-config.1",
    ] {
        let text = std::fs::read_to_string(dir.path().join(page)).unwrap();
        assert!(text.contains(".TH"), "{page} is roff");
    }
    let run = std::fs::read_to_string(dir.path().join("ledger-relay-run.1")).unwrap();
    assert!(run.contains("stale\\-after"), "every flag documented");
    for shell in ["bash", "zsh", "fish"] {
        let out = relay_bin().args(["completions", shell]).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{shell}");
        let script = String::from_utf8(out.stdout).unwrap();
        assert!(script.contains("check-config"), "{shell}");
        assert!(script.contains("stale-after"), "{shell}");
    }
    let out = relay_bin().args(["completions", "tcsh"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}
