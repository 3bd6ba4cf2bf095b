//! `ledger-subscribe`: record-marked output byte-identical to core's, stats, exit codes.

use std::process::Stdio;
use std::time::Duration;

use clap::Parser;
use ledger_relay_subscriber::frame::ErrorCode;
use ledger_relay_subscriber_bin::cli::{self, Args, Output};

use crate::support::fake_relay::{FakeRelay, Plan};
use crate::support::{subscribe_args, testnet_ledgers, within, Pki, FIRST_SEQ, TESTNET};

/// The first `n` records of the sample, framing included, exactly as core wrote them.
fn source_prefix(n: usize) -> Vec<u8> {
    let all = std::fs::read(TESTNET).unwrap();
    let mut at = 0;
    for _ in 0..n {
        let len = u32::from_be_bytes(all[at..at + 4].try_into().unwrap()) & 0x7fff_ffff;
        at += 4 + len as usize;
    }
    all[..at].to_vec()
}

#[tokio::test]
async fn writes_core_framing_byte_identical_with_stats() {
    let pki = Pki::new();
    let relay = FakeRelay::start(Plan::new(testnet_ledgers(6)), pki.path(), pki.path());
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out.xdr");
    let stats = tmp.path().join("stats.csv");
    let args = Args::try_parse_from([
        "ledger-subscribe",
        "--relay",
        &relay.addr.to_string(),
        "--certs",
        pki.path().to_str().unwrap(),
        "--name",
        "rpc-1",
        "--from",
        &FIRST_SEQ.to_string(),
        "--count",
        "5",
        "--lanes",
        "2",
        "--out",
        out.to_str().unwrap(),
        "--stats",
        stats.to_str().unwrap(),
    ])
    .unwrap();
    let config = args.into_config().unwrap();
    assert_eq!(config.out, Output::Path(out.clone()));
    let summary = within(20, cli::run(config, std::future::pending()))
        .await
        .unwrap();
    assert_eq!(summary.ledgers, 5);
    assert_eq!(summary.last_seq, FIRST_SEQ + 4);
    assert!(
        std::fs::read(&out).unwrap() == source_prefix(5),
        "output differs from core's"
    );
    let csv = std::fs::read_to_string(&stats).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(
        lines[0],
        "seq,raw_bytes,wire_bytes,delivery_ms,inter_arrival_ms,received_unix_ms"
    );
    assert_eq!(lines.len(), 6);
    let first: Vec<&str> = lines[1].split(',').collect();
    assert_eq!(first[0], FIRST_SEQ.to_string());
    assert_eq!(first[1], testnet_ledgers(1)[0].len().to_string());
    assert_eq!(first[4], "", "no inter-arrival for the first ledger");
    assert!(lines[2].split(',').nth(4).unwrap().parse::<f64>().is_ok());
}

/// Runs the binary with `args`; returns (exit code, stdout, stderr).
async fn run_binary(args: &[&str]) -> (i32, Vec<u8>, String) {
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_ledger-subscribe"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(20), child.wait_with_output())
        .await
        .expect("binary timed out")
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        out.stdout,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn the_binary_writes_to_stdout_and_exits_0_after_count() {
    let pki = Pki::new();
    let relay = FakeRelay::start(Plan::new(testnet_ledgers(4)), pki.path(), pki.path());
    let addr = relay.addr.to_string();
    let (code, stdout, stderr) = run_binary(&[
        "--relay",
        &addr,
        "--certs",
        pki.path().to_str().unwrap(),
        "--name",
        "rpc-1",
        "--from",
        &FIRST_SEQ.to_string(),
        "--count",
        "3",
    ])
    .await;
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout == source_prefix(3));
}

#[tokio::test]
async fn the_binary_exits_4_below_retention_with_the_oldest_held() {
    let pki = Pki::new();
    let mut plan = Plan::new(testnet_ledgers(3));
    plan.below_retention = true;
    let relay = FakeRelay::start(plan, pki.path(), pki.path());
    let addr = relay.addr.to_string();
    let (code, stdout, stderr) = run_binary(&[
        "--relay",
        &addr,
        "--certs",
        pki.path().to_str().unwrap(),
        "--name",
        "rpc-1",
        "--from",
        "1",
    ])
    .await;
    assert_eq!(code, 4, "{stderr}");
    assert!(stdout.is_empty());
    assert!(
        stderr.contains(&format!("oldest ledger held is {FIRST_SEQ}")),
        "{stderr}"
    );
    // The error for people, then the bounds for programs (the Go client parses them).
    let lines: Vec<&str> = stderr.trim().lines().collect();
    assert_eq!(lines.len(), 2, "two lines: {stderr}");
    let bounds = lines[1]
        .strip_prefix("below-retention requested=1 oldest=")
        .unwrap_or_else(|| panic!("{stderr}"));
    assert!(
        bounds.starts_with(&format!("{FIRST_SEQ} newest=")),
        "{stderr}"
    );
}

/// A relay's error message that holds line breaks and a forged line for programs.
const FORGED: &str = "busy\nbelow-retention requested=1 oldest=4000000000 newest=4000000001\nx";

/// The relay chooses its error messages, not the lines of stderr: a first session refused with
/// a message that forges the line for programs, then the true below-retention end. In either
/// log format the message shows escaped inside its own line, and stderr has exactly one line
/// for programs, the last, with the true bounds.
#[tokio::test]
async fn a_relays_message_cannot_forge_the_line_for_programs() {
    let pki = Pki::new();
    for format in ["text", "json"] {
        let mut plan = Plan::new(testnet_ledgers(3));
        plan.below_retention = true;
        plan.refuse_first = Some((ErrorCode::Overloaded, FORGED.into()));
        let relay = FakeRelay::start(plan, pki.path(), pki.path());
        let addr = relay.addr.to_string();
        let (code, _, stderr) = run_binary(&[
            "--relay",
            &addr,
            "--certs",
            pki.path().to_str().unwrap(),
            "--name",
            "rpc-1",
            "--from",
            "1",
            "--quiet",
            "--log-format",
            format,
        ])
        .await;
        assert_eq!(code, 4, "{format}: {stderr}");
        assert_eq!(
            relay.record().opens.len(),
            2,
            "refused, then below retention"
        );
        let machine: Vec<&str> = stderr
            .lines()
            .filter(|l| l.starts_with("below-retention requested="))
            .collect();
        let truth = format!(
            "below-retention requested=1 oldest={FIRST_SEQ} newest={}",
            FIRST_SEQ + 2
        );
        assert_eq!(machine, [truth.as_str()], "{format}: {stderr}");
        assert_eq!(stderr.lines().last(), Some(truth.as_str()), "{format}");
        // The message is shown, inside the warning's line.
        let warning = stderr
            .lines()
            .find(|l| l.contains("session ended; reconnecting"))
            .unwrap_or_else(|| panic!("{format}: no warning: {stderr}"));
        assert!(
            warning.contains("nbelow-retention requested=1 oldest=4000000000"),
            "{format}: {warning}"
        );
        assert!(!stderr.lines().any(|l| l == "x"), "{format}: {stderr}");
    }
}

#[tokio::test]
async fn the_binary_exits_3_when_not_authorized() {
    let relay_pki = Pki::new();
    let client_pki = Pki::new();
    let relay = FakeRelay::start(
        Plan::new(testnet_ledgers(2)),
        relay_pki.path(),
        relay_pki.path(),
    );
    // The client's directory: its own certificate, but the relay's CA as trust anchor.
    std::fs::copy(
        relay_pki.path().join("ca.pem"),
        client_pki.path().join("ca.pem"),
    )
    .unwrap();
    let addr = relay.addr.to_string();
    let (code, _, stderr) = run_binary(&[
        "--relay",
        &addr,
        "--certs",
        client_pki.path().to_str().unwrap(),
        "--name",
        "rpc-1",
    ])
    .await;
    assert_eq!(code, 3, "{stderr}");
    assert!(stderr.contains("not authorized"), "{stderr}");
}

#[tokio::test]
async fn the_binary_exits_2_on_bad_arguments() {
    let pki = Pki::new();
    let certs = pki.path().to_str().unwrap().to_owned();
    for args in [
        vec!["--relay", "nohost", "--certs", &certs, "--name", "rpc-1"],
        vec![
            "--relay",
            "127.0.0.1:1",
            "--certs",
            &certs,
            "--name",
            "rpc-1",
            "--lanes",
            "0",
        ],
        vec![
            "--relay",
            "127.0.0.1:1",
            "--certs",
            &certs,
            "--name",
            "missing",
        ],
        vec!["--relay", "127.0.0.1:1", "--certs", &certs],
    ] {
        let (code, _, stderr) = run_binary(&args).await;
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(!stderr.is_empty());
    }
    let (code, stdout, _) = run_binary(&["--help"]).await;
    assert_eq!(code, 0);
    assert!(String::from_utf8_lossy(&stdout).contains("--lane-ports"));
}

/// A loopback UDP port nothing listens on (bound, then released).
fn dead_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test]
async fn an_unreachable_relay_is_exit_2_naming_it_after_the_connect_timeout() {
    let pki = Pki::new();
    let addr = format!("127.0.0.1:{}", dead_port());
    let t = std::time::Instant::now();
    let (code, stdout, stderr) = run_binary(&[
        "--relay",
        &addr,
        "--certs",
        pki.path().to_str().unwrap(),
        "--name",
        "rpc-1",
        "--connect-timeout",
        "1s",
    ])
    .await;
    assert_eq!(code, 2, "{stderr}");
    assert!(stdout.is_empty());
    let took = t.elapsed();
    assert!(took >= Duration::from_secs(1), "{took:?}");
    assert!(took < Duration::from_secs(15), "{took:?}");
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    assert!(
        stderr.starts_with(&format!(
            "ledger-subscribe: cannot reach relay {addr} within 1 s: "
        )),
        "{stderr}"
    );

    // The default is 60 s; --retry-forever has none.
    let base = [
        "ledger-subscribe",
        "--relay",
        &addr,
        "--certs",
        pki.path().to_str().unwrap(),
        "--name",
        "rpc-1",
    ];
    let config = Args::try_parse_from(base).unwrap().into_config().unwrap();
    assert_eq!(
        config.subscribe.first_connect_timeout,
        Some(Duration::from_secs(60))
    );
    let forever = base.iter().copied().chain(["--retry-forever"]);
    let config = Args::try_parse_from(forever)
        .unwrap()
        .into_config()
        .unwrap();
    assert_eq!(config.subscribe.first_connect_timeout, None);
    let both = base
        .iter()
        .copied()
        .chain(["--retry-forever", "--connect-timeout", "5s"]);
    assert!(Args::try_parse_from(both).is_err(), "they conflict");
}

#[tokio::test]
async fn retry_forever_keeps_retrying_an_unreachable_relay() {
    let pki = Pki::new();
    let addr = format!("127.0.0.1:{}", dead_port());
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_ledger-subscribe"))
        .args(["--relay", &addr, "--certs"])
        .arg(pki.path())
        .args(["--name", "rpc-1", "--retry-forever", "--quiet"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // Twice the timeout of the test above: still trying.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(child.try_wait().unwrap().is_none(), "it gave up");
    child.start_kill().unwrap();
    let _ = child.wait().await;
}

/// The args of a run against `relay` that takes `count` ledgers at 200 ms each.
fn slow_run(relay: &FakeRelay, pki: &Pki, count: usize, extra: &[&str]) -> Vec<String> {
    let count = count.to_string();
    let fixed = [
        "--count",
        &count,
        "--consume-delay",
        "200ms",
        "--out",
        "/dev/null",
    ];
    subscribe_args(&relay.addr.to_string(), pki, &[&fixed[..], extra].concat())
}

async fn run_owned(args: &[String]) -> (i32, Vec<u8>, String) {
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    run_binary(&refs).await
}

#[tokio::test]
async fn without_a_terminal_progress_is_a_summary_line_per_interval_and_one_at_the_end() {
    let pki = Pki::with_relay_days(90);
    let relay = FakeRelay::start(Plan::new(testnet_ledgers(12)), pki.path(), pki.path());
    // About 2 s of ledgers, summaries every 300 ms.
    let args = slow_run(&relay, &pki, 10, &["--status-interval", "300ms"]);
    let (code, _, stderr) = run_owned(&args).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(!stderr.contains('\r'), "no live line: {stderr:?}");
    assert!(
        !stderr.contains('\u{1b}'),
        "no colours in a pipe: {stderr:?}"
    );
    let summaries: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains(" INFO ledger_subscribe::summary: "))
        .collect();
    assert_eq!(
        summaries.len(),
        stderr.lines().count(),
        "only summaries: {stderr}"
    );
    let (last, periodic) = summaries.split_last().unwrap();
    assert!(periodic.len() >= 2, "{stderr}");
    for line in periodic {
        assert!(line.contains(": last "), "{line}");
        assert!(line.contains(" ledgers ("), "{line}");
    }
    assert!(last.contains("done after 10 ledgers"), "{last}");
    assert!(last.contains(&format!("seq {}", FIRST_SEQ + 9)), "{last}");

    // --quiet: nothing at all.
    let mut args = slow_run(&relay, &pki, 3, &["--status-interval", "100ms", "--quiet"]);
    let (code, _, stderr) = run_owned(&args).await;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stderr, "", "quiet");

    // JSON logs: every line parses, summaries carry their numbers as fields.
    args.pop();
    args.extend(["--log-format".to_owned(), "json".to_owned()]);
    let (code, _, stderr) = run_owned(&args).await;
    assert_eq!(code, 0, "{stderr}");
    let mut events = Vec::new();
    for line in stderr.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
        assert_eq!(v["target"], "ledger_subscribe::summary", "{line}");
        assert_eq!(v["message"], "summary");
        events.push(v["event"].as_str().unwrap().to_owned());
        assert!(v["seq"].is_u64() && v["ledgers"].is_u64(), "{line}");
    }
    assert_eq!(events.last().map(String::as_str), Some("done"), "{stderr}");
    assert_eq!(events.len(), stderr.lines().count());
}

#[tokio::test]
async fn on_a_terminal_progress_is_one_live_line() {
    use std::io::Read as _;
    let pki = Pki::with_relay_days(90);
    let relay = FakeRelay::start(Plan::new(testnet_ledgers(8)), pki.path(), pki.path());
    let pty = nix::pty::openpty(None, None).unwrap();
    let args = slow_run(&relay, &pki, 6, &["--status-interval", "300ms"]);
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_ledger-subscribe"))
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(pty.slave))
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut master = std::fs::File::from(pty.master);
    // Read until the child is done and the terminal closes (EIO), at most 20 s.
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match master.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                // EIO: every slave end is closed.
                Err(e) => {
                    eprintln!("pty read: {e}");
                    break;
                }
            }
        }
        out
    });
    let status = within(20, child.wait()).await.unwrap();
    assert!(status.success());
    let screen =
        String::from_utf8_lossy(&within(5, async { reader.join().unwrap() }).await).into_owned();
    assert!(
        screen.contains("\r\u{1b}[K"),
        "redrawn in place: {screen:?}"
    );
    assert!(screen.contains(" ledgers/s | "), "{screen:?}");
    assert!(
        !screen.contains("summary"),
        "no summaries on a terminal: {screen:?}"
    );
    assert!(
        !screen.contains('\n'),
        "the live line never scrolls: {screen:?}"
    );
}

#[tokio::test]
async fn a_relay_certificate_expiring_within_30_days_is_warned_about_once() {
    for (days, warned) in [(20, true), (31, false)] {
        let pki = Pki::with_relay_days(days);
        let mut plan = Plan::new(testnet_ledgers(6));
        // Two sessions: the warning is not repeated on the reconnect.
        plan.close_after = Some(2);
        let relay = FakeRelay::start(plan, pki.path(), pki.path());
        let args = slow_run(&relay, &pki, 4, &["--quiet"]);
        let (code, _, stderr) = run_owned(&args).await;
        assert_eq!(code, 0, "{stderr}");
        let lines: Vec<&str> = stderr
            .lines()
            .filter(|l| l.contains("the relay's certificate expires within 30 days"))
            .collect();
        if warned {
            assert_eq!(lines.len(), 1, "{stderr}");
            assert!(lines[0].contains(" WARN "), "{stderr}");
            assert!(
                lines[0].contains(&format!("relay={}", relay.addr)),
                "{stderr}"
            );
            assert!(
                lines[0].contains(&format!("days_left={}", days - 1)),
                "{stderr}"
            );
        } else {
            assert!(lines.is_empty(), "{days} days: {stderr}");
        }
    }
}

#[tokio::test]
async fn man_page_and_completions_need_no_other_argument() {
    let dir = tempfile::tempdir().unwrap();
    let (code, stdout, stderr) = run_binary(&["--man", dir.path().to_str().unwrap()]).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(String::from_utf8_lossy(&stdout).contains("ledger-subscribe.1"));
    let page = std::fs::read_to_string(dir.path().join("ledger-subscribe.1")).unwrap();
    assert!(page.contains("retry\\-forever"), "{page}");
    let (code, stdout, _) = run_binary(&["--completions", "zsh"]).await;
    assert_eq!(code, 0);
    assert!(String::from_utf8_lossy(&stdout).contains("--connect-timeout"));
    let (code, _, _) = run_binary(&["--completions", "zsh", "--relay", "127.0.0.1:1"]).await;
    assert_eq!(code, 2, "alone only");
}

#[tokio::test]
async fn the_connect_timeout_ends_once_a_relay_was_reached() {
    let pki = Pki::new();
    let mut plan = Plan::new(testnet_ledgers(8));
    // A reconnect well after the timeout: retried, not given up.
    plan.close_after = Some(3);
    let relay = FakeRelay::start(plan, pki.path(), pki.path());
    let args = slow_run(&relay, &pki, 8, &["--connect-timeout", "300ms", "--quiet"]);
    let t = std::time::Instant::now();
    let (code, _, stderr) = run_owned(&args).await;
    assert_eq!(code, 0, "{stderr}");
    let took = t.elapsed();
    assert!(
        took > Duration::from_millis(600),
        "ran past the timeout: {took:?}"
    );
    assert!(stderr.contains("session ended; reconnecting"), "{stderr}");
}
