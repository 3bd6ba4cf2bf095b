//! Source and disk faults (issue 7, items 3 and 7): a core that hangs mid-ledger, emits garbage,
//! a gap, a re-emitted ledger or a conflicting one, and a ring directory that fills up. Nothing
//! partial or wrong reaches a subscriber, each fault shows in the metrics, and live streaming
//! survives a failing disk. (A core dying mid-ledger is covered in `e2e.rs`.)

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::StreamExt;
use ledger_relay::metrics::Metrics;
use ledger_relay::source::{synthetic_ledgers, SyntheticSpec};
use ledger_relay_subscriber::{connect, Ledger, SubscribeConfig};
use ledger_relay_wire::frame::Start;
use ledger_relay_wire::record::write_record;

use crate::e2e::{
    assert_identical, certs, relay_config, sub_config, take, testnet_ledgers, Running, FIRST,
    TESTNET,
};

/// The first `n` testnet records, each with its record mark.
fn records(n: usize) -> Vec<Vec<u8>> {
    let bytes = std::fs::read(TESTNET).unwrap();
    let mut off = 0;
    (0..n)
        .map(|_| {
            let mark = u32::from_be_bytes(bytes[off..off + 4].try_into().unwrap());
            let len = (mark & 0x7fff_ffff) as usize;
            let rec = bytes[off..off + 4 + len].to_vec();
            off += 4 + len;
            rec
        })
        .collect()
}

/// Deterministic filler bytes (splitmix64).
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// A `pipe:` source whose child writes `stream` to fd 3 in one go and then hangs (so the pipe
/// never reaches EOF and the child is never restarted).
fn pipe_source(dir: &Path, stream: &[u8]) -> String {
    let path = dir.join("core-output");
    std::fs::write(&path, stream).unwrap();
    format!("pipe:cat {} >&3; exec sleep 30", path.display())
}

/// Takes `n` ledgers, then asserts that nothing more arrives within `quiet`.
async fn take_then_quiet(config: SubscribeConfig, n: usize, quiet: Duration) -> Vec<Ledger> {
    let mut sub = connect(config).unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), async {
        while out.len() < n {
            match sub.next().await {
                Some(Ok(l)) => out.push(l),
                Some(Err(e)) => panic!("subscription failed after {} ledgers: {e}", out.len()),
                None => panic!("subscription ended after {} ledgers", out.len()),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("only {} of {n} ledgers within 10 s", out.len()));
    match tokio::time::timeout(quiet, sub.next()).await {
        Err(_) => {}
        Ok(Some(Ok(l))) => panic!("ledger {} delivered after the fault", l.seq),
        Ok(Some(Err(e))) => panic!("subscription failed after the fault: {e}"),
        Ok(None) => panic!("subscription ended after the fault"),
    }
    sub.close().await;
    out
}

/// Waits (up to 5 s) until `cond` holds on the metrics.
async fn until(m: &Metrics, what: &str, cond: impl Fn(&Metrics) -> bool) {
    tokio::time::timeout(Duration::from_secs(5), async {
        while !cond(m) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out waiting for: {what}"));
}

fn load(c: &std::sync::atomic::AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

/// Runs a relay on a `pipe:` source writing `stream`, expects exactly the first `valid` testnet
/// ledgers and then silence, and returns the relay for further checks.
async fn run_stream(dir: &Path, stream: &[u8], valid: usize) -> Running {
    let certs = certs(dir);
    let config = relay_config(certs.path(), &dir.join("data"), &pipe_source(dir, stream));
    let relay = Running::start(config).await;
    let got = take_then_quiet(
        sub_config(
            vec![relay.addr()],
            certs.path(),
            "rpc-1",
            2,
            Start::Seq(FIRST),
        ),
        valid,
        Duration::from_secs(1),
    )
    .await;
    assert_identical(&got, &testnet_ledgers(), FIRST);
    assert_eq!(got.len(), valid);
    relay
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_core_forwards_every_complete_ledger_and_nothing_partial() {
    let dir = tempfile::tempdir().unwrap();
    let recs = records(4);
    let mut stream = recs[..3].concat();
    stream.extend_from_slice(&recs[3][..recs[3].len() / 2]);
    let relay = run_stream(dir.path(), &stream, 3).await;
    let m = &relay.relay.metrics;
    assert_eq!(
        load(&m.ledgers_in_total),
        3,
        "the half ledger is not counted"
    );
    assert_eq!(load(&m.source_newest), u64::from(FIRST + 2));
    assert_eq!(load(&m.source_errors_total), 0, "a hang is not an error");
    assert_eq!(relay.relay.ring.range(), Some((FIRST, FIRST + 2)));
    relay.stop().await;
}

/// Two valid ledgers, `garbage`, then a third valid ledger that must never be delivered.
async fn garbage_stops_the_source(garbage: &[u8]) {
    let dir = tempfile::tempdir().unwrap();
    let recs = records(3);
    let stream = [&recs[0][..], &recs[1], garbage, &recs[2]].concat();
    let relay = run_stream(dir.path(), &stream, 2).await;
    let m = &relay.relay.metrics;
    until(m, "source_errors_total >= 1", |m| {
        load(&m.source_errors_total) >= 1
    })
    .await;
    assert_eq!(load(&m.ledgers_in_total), 2);
    assert_eq!(relay.relay.ring.range(), Some((FIRST, FIRST + 1)));
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_random_bytes_stop_the_source() {
    // Read as a record mark, 0xff.. has the last-fragment bit and a length far over the limit.
    let mut garbage = noise(1, 4096);
    garbage[0] = 0xff;
    garbage_stops_the_source(&garbage).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_record_mark_without_last_fragment_stops_the_source() {
    let mut garbage = 4096u32.to_be_bytes().to_vec();
    garbage.extend(noise(2, 4096));
    garbage_stops_the_source(&garbage).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_record_that_is_not_ledger_close_meta_stops_the_source() {
    // Well framed, but the body starts with an unknown LedgerCloseMeta version.
    let mut body = vec![0xde, 0xad, 0xbe, 0xef];
    body.extend(noise(3, 64 << 10));
    let mut garbage = Vec::new();
    write_record(&mut garbage, &body).unwrap();
    garbage_stops_the_source(&garbage).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gap_stops_the_source_after_the_ledgers_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let recs = records(4);
    let stream = [&recs[0][..], &recs[1], &recs[3]].concat();
    let relay = run_stream(dir.path(), &stream, 2).await;
    let m = &relay.relay.metrics;
    until(m, "source_errors_total >= 1", |m| {
        load(&m.source_errors_total) >= 1
    })
    .await;
    assert_eq!(load(&m.ledgers_in_total), 2);
    assert_eq!(load(&m.source_newest), u64::from(FIRST + 1));
    assert_eq!(relay.relay.ring.range(), Some((FIRST, FIRST + 1)));
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_re_emitted_ledger_is_delivered_once() {
    let dir = tempfile::tempdir().unwrap();
    let recs = records(3);
    let stream = [&recs[0][..], &recs[1], &recs[1], &recs[2]].concat();
    let relay = run_stream(dir.path(), &stream, 3).await;
    let m = &relay.relay.metrics;
    assert_eq!(load(&m.ledgers_in_total), 3);
    assert_eq!(load(&m.duplicates_dropped_total), 1);
    assert_eq!(load(&m.source_errors_total), 0);
    assert_eq!(relay.relay.ring.range(), Some((FIRST, FIRST + 2)));
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_ledger_with_a_published_sequence_stops_the_source() {
    let dir = tempfile::tempdir().unwrap();
    let recs = records(3);
    // A well-formed ledger (its header hash checks out) with the sequence of the second
    // testnet ledger, but another network's content.
    let other = synthetic_ledgers(&SyntheticSpec {
        start: FIRST + 1,
        size: 4096,
        ratio: 1.0,
        count: Some(1),
        ..SyntheticSpec::default()
    })
    .next()
    .unwrap();
    let mut conflicting = Vec::new();
    write_record(&mut conflicting, &other).unwrap();
    let stream = [&recs[0][..], &recs[1], &conflicting, &recs[2]].concat();
    let relay = run_stream(dir.path(), &stream, 2).await;
    let m = &relay.relay.metrics;
    until(m, "source_errors_total >= 1", |m| {
        load(&m.source_errors_total) >= 1
    })
    .await;
    assert_eq!(load(&m.ledgers_in_total), 2);
    assert_eq!(load(&m.duplicates_dropped_total), 0);
    assert_eq!(relay.relay.ring.range(), Some((FIRST, FIRST + 1)));
    relay.stop().await;
}

// ---- Disk faults ----

/// A tmpfs mounted for one test, unmounted on drop.
struct Tmpfs {
    path: PathBuf,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size` at `path`, or says why not (not root, no `mount`) and returns
    /// `None` for the test to skip.
    fn mount(path: &Path, size: &str) -> Option<Tmpfs> {
        if !is_root() {
            eprintln!("skipped: mounting a tmpfs needs root");
            return None;
        }
        std::fs::create_dir_all(path).unwrap();
        let out = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0755"),
                "tmpfs",
            ])
            .arg(path)
            .output();
        match out {
            Ok(o) if o.status.success() => Some(Tmpfs {
                path: path.to_path_buf(),
            }),
            Ok(o) => {
                eprintln!(
                    "skipped: mount -t tmpfs failed: {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                );
                None
            }
            Err(e) => {
                eprintln!("skipped: cannot run mount: {e}");
                None
            }
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let ok = Command::new("umount")
            .arg(&self.path)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            // Something (sled's closing threads) still holds a file: detach it now, the kernel
            // frees it when the last file closes.
            let _ = Command::new("umount").arg("-l").arg(&self.path).status();
        }
    }
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|euid| euid == "0"))
        })
        .unwrap_or(false)
}

/// Fills the filesystem of `dir` with a file until the write fails (ENOSPC).
fn fill(dir: &Path) -> PathBuf {
    let path = dir.join("filler");
    let mut f = std::fs::File::create(&path).unwrap();
    let block = vec![0x5au8; 64 << 10];
    loop {
        if let Err(e) = f.write_all(&block) {
            assert_eq!(e.raw_os_error(), Some(28), "filling stops with ENOSPC: {e}");
            break;
        }
    }
    path
}

fn http_get(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    // One write: the request must not reach the server in pieces.
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

async fn get(addr: SocketAddr, path: &'static str) -> String {
    tokio::task::spawn_blocking(move || http_get(addr, path))
        .await
        .unwrap()
}

/// The data directory cannot be written mid-run (it fills up: a read-only remount is refused
/// by the kernel while the ring holds its store open for writing, for root too, so filling is
/// how a test makes writes fail), then can again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unwritable_data_directory_degrades_the_ring_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let Some(_mount) = Tmpfs::mount(&data, "16m") else {
        return;
    };
    let certs = certs(dir.path());
    let want = testnet_ledgers();
    let mut config = relay_config(certs.path(), &data, &format!("file:{TESTNET}"));
    config.source_options.cadence = Duration::from_millis(15);
    config.metrics = Some("127.0.0.1:0".parse().unwrap());
    let relay = Running::start(config).await;
    let maddr = relay.relay.metrics_addr.unwrap();
    let sub = tokio::spawn(take(
        sub_config(
            vec![relay.addr()],
            certs.path(),
            "rpc-1",
            2,
            Start::Seq(FIRST),
        ),
        want.len(),
        30,
    ));
    relay.wait_for(FIRST + 30).await;
    let m = relay.relay.metrics.clone();
    assert!(get(maddr, "/healthz").await.contains("\"ring\":\"ok\""));

    let filler = fill(&data);
    until(&m, "ring_degraded", |m| {
        m.ring_degraded.load(Ordering::Relaxed)
    })
    .await;
    let health = get(maddr, "/healthz").await;
    assert!(health.contains("\"status\":\"degraded\""), "{health}");
    assert!(health.contains("\"ring\":\"degraded\""), "{health}");
    let text = get(maddr, "/metrics").await;
    assert!(text.contains("\nledger_relay_ring_degraded 1\n"), "{text}");
    assert!(load(&m.ring_write_errors_total) >= 1);
    // Live ledgers keep coming while the ring cannot write.
    let at = load(&m.source_newest);
    until(&m, "live ledgers while degraded", |m| {
        load(&m.source_newest) >= at + 10
    })
    .await;

    std::fs::remove_file(filler).unwrap();
    until(&m, "the ring writes again", |m| {
        !m.ring_degraded.load(Ordering::Relaxed)
            && load(&m.ring_resets_total) >= 1
            && load(&m.ring_newest) > at + 10
    })
    .await;
    let health = get(maddr, "/healthz").await;
    assert!(health.contains("\"ring\":\"ok\""), "{health}");
    let text = get(maddr, "/metrics").await;
    assert!(text.contains("\nledger_relay_ring_degraded 0\n"), "{text}");

    // Every ledger reached the subscriber, in order, byte for byte.
    let got = sub.await.unwrap().unwrap();
    assert_eq!(got.len(), want.len());
    assert_identical(&got, &want, FIRST);
    // The ring holds a new run that starts after the gap and continues to the end.
    let (oldest, newest) = relay.relay.ring.range().unwrap();
    assert!(oldest > FIRST + 30, "a new run: {oldest}..{newest}");
    relay.stop().await;
}

/// A data directory too small for the ring: every ledger is still delivered live, and the ring
/// reports degraded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_degrades_the_ring_and_streaming_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let Some(_mount) = Tmpfs::mount(&data, "8m") else {
        return;
    };
    let certs = certs(dir.path());
    let mut config = relay_config(certs.path(), &data, "synthetic:size=1MiB,ratio=1,count=40");
    config.source_options.cadence = Duration::from_millis(50);
    config.metrics = Some("127.0.0.1:0".parse().unwrap());
    let relay = Running::start(config).await;
    let maddr = relay.relay.metrics_addr.unwrap();
    let got = take(
        sub_config(vec![relay.addr()], certs.path(), "rpc-1", 2, Start::Seq(2)),
        40,
        20,
    )
    .await
    .unwrap();
    for (i, l) in got.iter().enumerate() {
        assert_eq!(l.seq, 2 + i as u32, "order");
        assert_eq!(l.data.len(), 1 << 20);
    }
    let m = relay.relay.metrics.clone();
    until(&m, "ring_degraded", |m| {
        m.ring_degraded.load(Ordering::Relaxed)
    })
    .await;
    assert!(load(&m.ring_write_errors_total) >= 1);
    assert_eq!(load(&m.ledgers_in_total), 40);
    let health = get(maddr, "/healthz").await;
    assert!(health.contains("\"ring\":\"degraded\""), "{health}");
    tokio::time::timeout(Duration::from_secs(15), relay.stop())
        .await
        .expect("the relay stops with a full disk");
}
