//! What a hostile relay can make a subscriber hold: a relay that opens every data stream it
//! may and finishes none makes `ledger-subscribe` hold no more than the bound
//! `docs/protocol.md` section 5 states for frames not yet reassembled
//! (`Limits::max_unassembled_bytes`) plus what QUIC buffers for a lane (its receive window).

use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ledger_relay_transport::TransportSettings;
use ledger_relay_wire::Limits;

use crate::support::fake_relay::{FakeRelay, Hoard, Plan};
use crate::support::{subscribe_args, testnet_ledgers, Pki};

/// A figure of `/proc/PID/status` (`VmRSS:`, `VmHWM:`), in bytes.
fn status_bytes(pid: u32, key: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key} in /proc/{pid}/status"));
    kib << 10
}

/// Waits until the hoarding relay's writes have stopped growing for a second and a half
/// (flow control holds it back) or all of them went through; at most 40 s.
async fn until_the_relay_stalls(relay: &FakeRelay, planned: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(40);
    let (mut last, mut since) = (0, Instant::now());
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = relay.record().hoarded;
        if now != last {
            (last, since) = (now, Instant::now());
        }
        if now >= planned || since.elapsed() > Duration::from_millis(1500) {
            return now;
        }
        assert!(
            Instant::now() < deadline,
            "the relay kept writing: {now} bytes"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_that_finishes_no_stream_makes_the_subscriber_hold_no_more_than_the_bound() {
    let pki = Pki::new();
    let start = Arc::new(tokio::sync::Notify::new());
    // 200 streams of 2 MiB each: 400 MiB of frames cut short, far beyond the bound.
    let hoard = Hoard {
        streams: 200,
        bytes_each: 2 << 20,
        start: start.clone(),
    };
    let planned = (hoard.streams * hoard.bytes_each) as u64;
    let mut plan = Plan::new(testnet_ledgers(1));
    plan.hoard = Some(hoard);
    // Heartbeats every second: the session's watchdog (three of them) is not what is tested.
    plan.heartbeat_ms = 1000;
    let relay = FakeRelay::start(plan, pki.path(), pki.path());
    let args = subscribe_args(
        &relay.addr.to_string(),
        &pki,
        &["--lanes", "1", "--quiet", "--out", "/dev/null"],
    );
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_ledger-subscribe"))
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = child.id().unwrap();
    let opened = Instant::now();
    while relay.record().opens.is_empty() {
        assert!(opened.elapsed() < Duration::from_secs(20), "no session");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = status_bytes(pid, "VmRSS:");
    start.notify_one();
    let offered = until_the_relay_stalls(&relay, planned).await;
    let peak = status_bytes(pid, "VmHWM:");
    let running = child.try_wait().unwrap().is_none();
    let sessions = relay.record().opens.len();
    child.kill().await.unwrap();

    let receive_window = TransportSettings::default().receive_window;
    let bound = Limits::default().max_unassembled_bytes + receive_window;
    // Allocator and QUIC bookkeeping beyond the bytes themselves.
    let slack = 32 << 20;
    let growth = peak.saturating_sub(before);
    eprintln!(
        "hoarding relay: {} MiB written of {} MiB; subscriber resident {} MiB before, peak {} MiB \
         (growth {} MiB, bound {} MiB + {} MiB slack)",
        offered >> 20,
        planned >> 20,
        before >> 20,
        peak >> 20,
        growth >> 20,
        bound >> 20,
        slack >> 20
    );
    assert!(
        growth <= bound + slack,
        "the subscriber grew by {} MiB holding partial frames; bound {} MiB",
        growth >> 20,
        bound >> 20
    );
    assert!(running, "the subscriber exited");
    assert_eq!(sessions, 1, "the session stayed open");
}
