//! `ledger-captive-core` as a process, as the Go SDK's runner runs it (the Go suite in
//! clients/go drives it through the SDK itself).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::fake_relay::{FakeRelay, Plan};
use crate::support::{testnet_ledgers, Pki, FIRST_SEQ, TESTNET};

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
    // The last ledger streamed is now the last closed one, with its hash.
    let state = std::fs::read_to_string(dir.path().join("ledger-captive-core.state")).unwrap();
    assert!(state.starts_with(&format!("{to} ")), "{state}");
    assert_eq!(state.trim().len(), to.len() + 1 + 64, "{state}");
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
    assert_eq!(state.trim(), format!("{to} {}", hash(5)));

    let ((code, out, err), _) = catchup(format!("{}:{}", FIRST_SEQ + 1, hash(2))).await;
    assert_eq!(code, 2, "{err}");
    assert!(out.is_empty(), "nothing written");
    assert!(err.contains("does not match the anchor"), "{err}");

    let ((code, out, err), _) = catchup(format!("{}:{}", FIRST_SEQ + 6, hash(6))).await;
    assert_eq!(code, 2, "{err}");
    assert!(out.is_empty());
    assert!(err.contains("before the anchor"), "{err}");
}
