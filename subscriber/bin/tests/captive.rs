//! `ledger-captive-core` as a process, as the Go SDK's runner runs it (the Go suite in
//! clients/go drives it through the SDK itself): its commands, and core's HTTP ports as it
//! opens them from the SDK's `--conf` file.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::fake_relay::{FakeRelay, Plan};
use crate::support::{testnet_ledgers, within, Pki, FIRST_SEQ, TESTNET};

/// Runs the stand-in in `dir` with `env`; returns (exit code, stdout, stderr). Blocking: call
/// from `spawn_blocking` when a relay runs on the test's runtime.
fn standin(dir: &Path, env: &[(&str, String)], args: &[&str]) -> (i32, Vec<u8>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ledger-captive-core"))
        .args(args)
        .current_dir(dir)
        .env_remove("LEDGER_CAPTIVE_CORE_RELAY")
        // No settings file (an empty name is unset, and /etc/ledger-relay has none here).
        .env("LEDGER_CAPTIVE_CORE_CONFIG", "")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        out.stdout,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_database_commands_answer_as_core_does() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let conf = ["--conf", "stellar-core.conf"];
    // Before new-db there is no database: non-zero, one line that says so.
    let (code, out, err) = standin(d, &[], &[conf[0], conf[1], "offline-info"]);
    assert_ne!(code, 0);
    assert!(out.is_empty());
    assert!(err.contains("no database"), "{err}");
    let (code, _, err) = standin(d, &[], &[conf[0], conf[1], "--console", "new-db"]);
    assert_eq!(code, 0, "{err}");
    let (code, out, _) = standin(d, &[], &[conf[0], conf[1], "offline-info"]);
    assert_eq!(code, 0);
    let info: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(info["info"]["ledger"]["num"], 1);
    let (code, _, err) = standin(d, &[], &[conf[0], conf[1], "catchup", "1410098/0"]);
    assert_eq!(code, 0, "{err}");
    let (_, out, _) = standin(d, &[], &["offline-info"]);
    let info: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(info["info"]["ledger"]["num"], 1410098);
    // What it cannot answer, and a run without settings: exit 2 and the reason.
    let (code, _, err) = standin(d, &[], &["http-command", "info"]);
    assert_eq!(code, 2);
    assert!(err.contains("unsupported command line"), "{err}");
    let (code, _, err) = standin(d, &[], &["run", "--metadata-output-stream", "fd:3"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("relay not set"),
        "the missing setting is named: {err}"
    );
}

#[tokio::test]
async fn a_bounded_catchup_streams_from_the_checkpoint_start_and_exits_0() {
    let pki = Pki::new();
    let relay = FakeRelay::start(Plan::new(testnet_ledgers(8)), pki.path(), pki.path());
    let dir = tempfile::tempdir().unwrap();
    let env = vec![
        ("LEDGER_CAPTIVE_CORE_RELAY", relay.addr.to_string()),
        (
            "LEDGER_CAPTIVE_CORE_CERTS",
            pki.path().display().to_string(),
        ),
        ("LEDGER_CAPTIVE_CORE_NAME", "rpc-1".to_owned()),
    ];
    let d = dir.path().to_owned();
    // Ledgers FIRST+3..FIRST+5: core replays from the checkpoint's first ledger, FIRST (a
    // multiple of 64). fd:1 stands for the SDK's pipe on fd 3.
    let to = (FIRST_SEQ + 5).to_string();
    let range = format!("{to}/3");
    let (code, out, err) = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::task::spawn_blocking(move || {
            standin(
                &d,
                &env,
                &["catchup", &range, "--metadata-output-stream", "fd:1"],
            )
        }),
    )
    .await
    .expect("the stand-in timed out")
    .unwrap();
    assert_eq!(code, 0, "{err}");
    let all = std::fs::read(TESTNET).unwrap();
    let mut records = ledger_relay_wire::record::Records::new(&all[..], 256 << 20);
    let want: Vec<u8> = (0..6)
        .flat_map(|_| {
            let r = records.next().unwrap().unwrap();
            let mut framed = Vec::new();
            ledger_relay_wire::record::write_record_to(&mut framed, &r).unwrap();
            framed
        })
        .collect();
    assert!(
        out == want,
        "ledgers FIRST..FIRST+5, byte for byte, framed as core frames them"
    );
    // The last ledger streamed is now the last closed one, with its hash and protocol (the
    // testnet sample is protocol 19).
    let state = std::fs::read_to_string(dir.path().join("ledger-captive-core.state")).unwrap();
    let fields: Vec<&str> = state.split_whitespace().collect();
    assert_eq!(fields.len(), 3, "{state}");
    assert_eq!(fields[0], to);
    assert_eq!(fields[1].len(), 64, "{state}");
    assert_eq!(fields[2], "protocol=19");
}

/// A captive-core config as go-stellar-sdk writes it for stellar-rpc, with core's ports at
/// `http` and `query` and `extra` keys after them.
fn sdk_conf(http: u16, query: u16, extra: &str) -> String {
    format!(
        r#"# Generated file, do not edit
BUCKETLIST_DB_INDEX_PAGE_SIZE_EXPONENT = 12
DATABASE = "sqlite3://stellar.db"
ENABLE_DIAGNOSTICS_FOR_TX_SUBMISSION = true
FAILURE_SAFETY = -1
HTTP_PORT = {http}
HTTP_QUERY_PORT = {query}
LOG_FILE_PATH = ""
NETWORK_PASSPHRASE = "Test SDF Network ; September 2015"
QUERY_SNAPSHOT_LEDGERS = 4
QUERY_THREAD_POOL_SIZE = 2
{extra}
[[HOME_DOMAINS]]
  HOME_DOMAIN = "testnet.stellar.org"
  QUALITY = "MEDIUM"

[[VALIDATORS]]
  ADDRESS = "core-testnet1.stellar.org"
  HOME_DOMAIN = "testnet.stellar.org"
  NAME = "sdf_testnet_1"
  PUBLIC_KEY = "GDKXE2OZMJIPOSLNA6N6F2BVCI3O777I2OOC4BV7VOYUEHYX7RTRYA7Y"

[HISTORY.h0]
  get = "curl -sf http://history.stellar.org/prd/core-testnet/core_testnet_001/{{0}} -o {{1}}"
"#
    )
}

/// A TCP port nothing listens on now.
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// The TCP sockets process `pid` listens on: (address as /proc/net/tcp writes it, hex with
/// `0100007F` for 127.0.0.1 and `00000000` for 0.0.0.0; port), IPv4 and IPv6.
fn listening(pid: u32) -> Vec<(String, u16)> {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| {
            dir.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter_map(|l| {
                    let l = l.to_string_lossy().into_owned();
                    Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned())
                })
                .collect()
        })
        .unwrap_or_default();
    let mut found = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(state), Some(inode)) = (f.get(1), f.get(3), f.get(9)) else {
                continue;
            };
            let Some((ip, port)) = local.split_once(':') else {
                continue;
            };
            if *state == "0A" && inodes.iter().any(|i| i == inode) {
                found.push((ip.to_owned(), u16::from_str_radix(port, 16).unwrap()));
            }
        }
    }
    found.sort();
    found
}

/// A running stand-in, killed if the test fails before it stops it.
struct Running {
    child: std::process::Child,
    reader: Option<std::thread::JoinHandle<Vec<u8>>>,
}

impl Running {
    /// SIGINT (how the SDK stops core): the exit code and what it wrote on the pipe.
    fn interrupt(&mut self) -> (i32, Vec<u8>) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
        let code = self.child.wait().unwrap().code().unwrap_or(-1);
        let out = self.reader.take().unwrap().join().unwrap();
        (code, out)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `run --conf stellar-core.conf` in `dir` (after `new-db` and a catch-up to the ledger
/// before the first testnet ledger) against `relay`, its ledgers read from stdout (fd 1
/// stands for the SDK's pipe on fd 3) by a thread.
fn start_run(pki: &crate::support::Pki, relay: &FakeRelay, dir: &Path, conf: &str) -> Running {
    std::fs::write(dir.join("stellar-core.conf"), conf).unwrap();
    let env = [
        ("LEDGER_CAPTIVE_CORE_RELAY", relay.addr.to_string()),
        (
            "LEDGER_CAPTIVE_CORE_CERTS",
            pki.path().display().to_string(),
        ),
        ("LEDGER_CAPTIVE_CORE_NAME", "rpc-1".to_owned()),
        ("LEDGER_CAPTIVE_CORE_QUERY_WAIT", "200ms".to_owned()),
    ];
    let (code, _, err) = standin(dir, &env, &["new-db"]);
    assert_eq!(code, 0, "{err}");
    let before = (FIRST_SEQ - 1).to_string() + "/0";
    let (code, _, err) = standin(dir, &env, &["catchup", &before]);
    assert_eq!(code, 0, "{err}");
    let mut child = Command::new(env!("CARGO_BIN_EXE_ledger-captive-core"))
        .args(["--conf", "stellar-core.conf", "--console", "run"])
        .args(["--metadata-output-stream", "fd:1"])
        .current_dir(dir)
        .env("LEDGER_CAPTIVE_CORE_CONFIG", "")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut all = Vec::new();
        std::io::Read::read_to_end(&mut out, &mut all).unwrap();
        all
    });
    Running {
        child,
        reader: Some(reader),
    }
}

/// Waits (at most 30 s) until `done` holds.
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let started = std::time::Instant::now();
    while !done() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "waited for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn run_serves_the_ports_of_its_conf_file_on_localhost_as_of_the_ledgers_written() {
    use crate::captive_http::{http, post};
    let pki = Pki::new();
    let mut plan = Plan::new(testnet_ledgers(8));
    plan.core = Some(crate::support::fake_relay::CoreFake::echo("relay"));
    let relay = FakeRelay::start(plan, pki.path(), pki.path());
    let dir = tempfile::tempdir().unwrap();
    let (http_port, query_port) = (free_port(), free_port());
    let conf = sdk_conf(http_port, query_port, "");
    let mut standin = start_run(&pki, &relay, dir.path(), &conf);
    let last = FIRST_SEQ + 7;
    let state = dir.path().join("ledger-captive-core.state");
    let pid = standin.child.id();
    until("all 8 ledgers written", || {
        std::fs::read_to_string(&state).is_ok_and(|s| s.starts_with(&last.to_string()))
    })
    .await;
    let mut want = vec![
        ("0100007F".to_owned(), http_port),
        ("0100007F".to_owned(), query_port),
    ];
    want.sort();
    assert_eq!(listening(pid), want, "both ports, 127.0.0.1 only");
    let query = SocketAddr::from(([127, 0, 0, 1], query_port));
    let command = SocketAddr::from(([127, 0, 0, 1], http_port));
    // No ledgerSeq: the ledger last written on the pipe.
    let (head, body) = post("/getledgerentry", "key=AAAA");
    let r = within(10, http(query, &head, &body)).await;
    assert_eq!(r.status, 200);
    let echo: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(echo["body"], format!("key=AAAA&ledgerSeq={last}"));
    // A ledger the pipe has not carried: core's 404 once query_wait (200 ms) is over.
    let (head, body) = post(
        "/getledgerentry",
        &format!("key=AAAA&ledgerSeq={}", last + 1),
    );
    let r = within(10, http(query, &head, &body)).await;
    assert_eq!(
        (r.status, r.body.as_slice()),
        (404, &b"Ledger not found\n"[..])
    );
    let r = within(10, http(command, "GET /info HTTP/1.1", b"")).await;
    let echo: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(
        (echo["target"].as_str(), echo["port"].as_str()),
        (Some("/info"), Some("http"))
    );
    // The state records the ledgers' protocol (the testnet sample is protocol 19).
    let text = std::fs::read_to_string(&state).unwrap();
    assert!(text.trim_end().ends_with(" protocol=19"), "{text}");
    let (code, out) = standin.interrupt();
    assert_eq!(code, 0);
    assert!(!out.is_empty(), "ledgers went down the pipe");
}

#[tokio::test]
async fn public_http_port_listens_on_every_interface_and_port_0_is_not_served() {
    let pki = Pki::new();
    let mut plan = Plan::new(testnet_ledgers(2));
    plan.core = Some(crate::support::fake_relay::CoreFake::echo("relay"));
    let relay = FakeRelay::start(plan, pki.path(), pki.path());
    let dir = tempfile::tempdir().unwrap();
    let http_port = free_port();
    let conf = sdk_conf(http_port, 0, "PUBLIC_HTTP_PORT = true");
    let mut standin = start_run(&pki, &relay, dir.path(), &conf);
    let pid = standin.child.id();
    until("the command port", || !listening(pid).is_empty()).await;
    // Only the command port (HTTP_QUERY_PORT = 0), on every interface.
    assert_eq!(listening(pid), [("00000000".to_owned(), http_port)]);
    assert_eq!(standin.interrupt().0, 0);
}

#[test]
fn version_reports_the_protocol_recorded_by_the_last_run() {
    let dir = tempfile::tempdir().unwrap();
    let (code, out, err) = standin(dir.path(), &[], &["version"]);
    assert_eq!(code, 0, "{err}");
    let out = String::from_utf8(out).unwrap();
    assert!(
        out.contains("ledger protocol version: 23\n"),
        "nothing known: {out}"
    );
    // The SDK runs `version` in the service's directory; core's state is in captive-core/.
    let sdk = dir.path().join("captive-core");
    std::fs::create_dir(&sdk).unwrap();
    std::fs::write(
        sdk.join("ledger-captive-core.state"),
        format!("9 {} protocol=25\n", "ab".repeat(32)),
    )
    .unwrap();
    let (code, out, _) = standin(dir.path(), &[], &["version"]);
    assert_eq!(code, 0);
    let out = String::from_utf8(out).unwrap();
    assert!(out.starts_with("v25.0.0-"), "{out}");
    assert!(out.contains("ledger protocol version: 25\n"), "{out}");
    // offline-info reports the same protocol.
    let (code, out, _) = standin(&sdk, &[], &["offline-info"]);
    assert_eq!(code, 0);
    let info: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(info["info"]["protocol_version"], 25);
    // new-db moves to ledger 1 and keeps what is known of the network.
    let (code, _, _) = standin(&sdk, &[], &["new-db"]);
    assert_eq!(code, 0);
    let (_, out, _) = standin(dir.path(), &[], &["version"]);
    assert!(String::from_utf8(out).unwrap().contains("version: 25\n"));
}

/// The stand-in's settings for `relay`, as the SDK's environment would give them.
fn settings_env(relay: &FakeRelay, pki: &Pki) -> Vec<(&'static str, String)> {
    vec![
        ("LEDGER_CAPTIVE_CORE_RELAY", relay.addr.to_string()),
        (
            "LEDGER_CAPTIVE_CORE_CERTS",
            pki.path().display().to_string(),
        ),
        ("LEDGER_CAPTIVE_CORE_NAME", "rpc-1".to_owned()),
        // A checkpoint per ledger: a catch-up streams exactly the range asked for.
        ("LEDGER_CAPTIVE_CORE_CHECKPOINT_FREQUENCY", "1".to_owned()),
    ]
}

/// `anchor = SEQ:HASH`: a catch-up (which has no hash of its own to start from) is checked
/// against the trusted ledger. The right hash: the ledgers between the anchor and the start are
/// verified and not written, the range asked for is. A wrong one: exit 2, nothing written. An
/// anchor after the start: exit 2 before anything is fetched.
#[tokio::test]
async fn a_catchup_is_checked_against_the_anchor_setting() {
    let pki = Pki::new();
    let ledgers = testnet_ledgers(8);
    let relay = FakeRelay::start(Plan::new(ledgers.clone()), pki.path(), pki.path());
    let hash = |i: usize| {
        let info = ledger_relay_wire::header::peek_header(&ledgers[i])
            .unwrap()
            .unwrap();
        ledger_relay_wire::Hex(&info.hash).to_string()
    };
    let to = (FIRST_SEQ + 5).to_string();
    // Ledgers FIRST+4 and FIRST+5; the anchor FIRST+1.
    let catchup = |anchor: String| {
        let dir = tempfile::tempdir().unwrap();
        let mut env = settings_env(&relay, &pki);
        env.push(("LEDGER_CAPTIVE_CORE_ANCHOR", anchor));
        let range = format!("{to}/2");
        let d = dir.path().to_owned();
        let run = tokio::task::spawn_blocking(move || {
            standin(
                &d,
                &env,
                &["catchup", &range, "--metadata-output-stream", "fd:1"],
            )
        });
        async move {
            let out = tokio::time::timeout(Duration::from_secs(30), run)
                .await
                .expect("the stand-in timed out")
                .unwrap();
            (out, dir)
        }
    };
    let ((code, out, err), dir) = catchup(format!("{}:{}", FIRST_SEQ + 1, hash(1))).await;
    assert_eq!(code, 0, "{err}");
    let mut want = Vec::new();
    for l in &ledgers[4..6] {
        ledger_relay_wire::record::write_record_to(&mut want, l).unwrap();
    }
    assert!(
        out == want,
        "ledgers FIRST+4 and FIRST+5 only, byte for byte"
    );
    let state = std::fs::read_to_string(dir.path().join("ledger-captive-core.state")).unwrap();
    assert_eq!(state.trim(), format!("{to} {} protocol=19", hash(5)));

    let ((code, out, err), _) = catchup(format!("{}:{}", FIRST_SEQ + 1, hash(2))).await;
    assert_eq!(code, 2, "{err}");
    assert!(out.is_empty(), "nothing written");
    assert!(err.contains("does not match the anchor"), "{err}");

    let ((code, out, err), _) = catchup(format!("{}:{}", FIRST_SEQ + 6, hash(6))).await;
    assert_eq!(code, 2, "{err}");
    assert!(out.is_empty());
    assert!(err.contains("before the anchor"), "{err}");
}
