//! The Go client (`clients/go`) against the real binaries: `go test ./...` there starts
//! `ledger-relay` on loopback and reads through the Go `LedgerStream`/`LedgerBackend` and
//! through the Go SDK's own `CaptiveStellarCore` running `ledger-captive-core` (docs/rpc.md),
//! and stellar-rpc's core client (the SDK's `stellarcore.Client`) on the stand-in's ports with
//! a relay and the test double of stellar-core behind them.
//! Run here so that the README's one test command covers the Go suite too.

use std::path::Path;
use std::process::Command;

/// The binaries the Go suite runs, beside this crate's `ledger-relay` (`cargo test --workspace`
/// builds every binary of the workspace before the tests); `ledger-core-double` is the test
/// double of stellar-core its core-port tests put behind a relay.
const SIBLINGS: [&str; 4] = [
    "ledger-certs",
    "ledger-subscribe",
    "ledger-captive-core",
    "ledger-core-double",
];

#[test]
fn the_go_client_and_the_captive_core_stand_in_pass_their_go_suite() {
    let relay = Path::new(env!("CARGO_BIN_EXE_ledger-relay"));
    let dir = relay.parent().expect("the binary is in a directory");
    for name in SIBLINGS {
        assert!(
            dir.join(name).exists(),
            "{} is missing: run the workspace's tests (`cargo test --workspace`) or `cargo build --bins` first",
            dir.join(name).display()
        );
    }
    let module = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../clients/go");
    let output = match Command::new("go")
        .args(["test", "-count=1", "./..."])
        .current_dir(&module)
        .env("LEDGER_RELAY_BIN_DIR", dir)
        .output()
    {
        Ok(output) => output,
        Err(e) => panic!(
            "cannot run `go` ({e}): the Go client's tests need Go 1.25 or newer on PATH (README, Requirements)"
        ),
    };
    assert!(
        output.status.success(),
        "`go test ./...` in clients/go failed ({}):\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
