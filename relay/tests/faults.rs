//! Source and disk faults: a core that hangs mid-ledger, emits garbage,
//! a gap, a re-emitted ledger or a conflicting one, and a ring directory that fills up or turns
//! read-only. Nothing partial or wrong reaches a subscriber, each fault shows in the metrics,
//! and live streaming survives a failing disk. (A core dying mid-ledger is covered in
//! `e2e.rs`.) The disk tests need root (they mount filesystems) and skip, saying why, without.

use std::ffi::OsStr;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use ledger_relay::metrics::Metrics;
use ledger_relay::source::{now_ns, synthetic_ledgers, SyntheticSpec};
use ledger_relay_subscriber::{connect, Ledger, SubscribeConfig};
use ledger_relay_wire::frame::Start;
use ledger_relay_wire::record::write_record;

use crate::support::{
    assert_identical, eventually, http_get, load, take, testnet_ledgers, testnet_records,
    Collector, GatedSource, Running, TestDir, FIRST, LAST,
};

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

/// Runs a relay on a `pipe:` source writing `stream`, expects exactly the first `valid` testnet
/// ledgers and then silence, and returns the relay for further checks.
async fn run_stream(dir: &TestDir, stream: &[u8], valid: usize) -> Running {
    let relay = dir.start(&pipe_source(dir.path(), stream)).await;
    let got = take_then_quiet(
        dir.sub(&relay, "rpc-1", 2, Start::Seq(FIRST)),
        valid,
        Duration::from_secs(1),
    )
    .await;
    assert_identical(&got, &testnet_ledgers(), FIRST);
    assert_eq!(got.len(), valid);
    relay
}

/// The source stopped with an error after the first `valid` ledgers: the error is counted
/// and exactly those ledgers were published and stored.
async fn expect_source_stopped(relay: &Running, valid: u32) {
    let m = &relay.relay.metrics;
    eventually(5, "source_errors_total >= 1", || {
        load(&m.source_errors_total) >= 1
    })
    .await;
    assert_eq!(load(&m.ledgers_in_total), u64::from(valid));
    assert_eq!(relay.relay.ring.range(), Some((FIRST, FIRST + valid - 1)));
    // /healthz: no new ledgers will come, and why.
    eventually(5, "/healthz: source failed", || {
        m.health().1.contains("\"source\":\"failed\"")
    })
    .await;
    let (code, body) = m.health();
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("\"source_failed\""), "{body}");
    assert!(body.contains("source stopped: "), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_core_forwards_every_complete_ledger_and_nothing_partial() {
    let dir = TestDir::new();
    let recs = testnet_records(4);
    let mut stream = recs[..3].concat();
    stream.extend_from_slice(&recs[3][..recs[3].len() / 2]);
    let relay = run_stream(&dir, &stream, 3).await;
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
    let dir = TestDir::new();
    let recs = testnet_records(3);
    let stream = [&recs[0][..], &recs[1], garbage, &recs[2]].concat();
    let relay = run_stream(&dir, &stream, 2).await;
    expect_source_stopped(&relay, 2).await;
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
    let dir = TestDir::new();
    let recs = testnet_records(4);
    let stream = [&recs[0][..], &recs[1], &recs[3]].concat();
    let relay = run_stream(&dir, &stream, 2).await;
    expect_source_stopped(&relay, 2).await;
    assert_eq!(
        load(&relay.relay.metrics.source_newest),
        u64::from(FIRST + 1)
    );
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_re_emitted_ledger_is_delivered_once() {
    let dir = TestDir::new();
    let recs = testnet_records(3);
    let stream = [&recs[0][..], &recs[1], &recs[1], &recs[2]].concat();
    let relay = run_stream(&dir, &stream, 3).await;
    let m = &relay.relay.metrics;
    assert_eq!(load(&m.ledgers_in_total), 3);
    assert_eq!(load(&m.duplicates_dropped_total), 1);
    assert_eq!(load(&m.source_errors_total), 0);
    assert_eq!(relay.relay.ring.range(), Some((FIRST, FIRST + 2)));
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_ledger_with_a_published_sequence_stops_the_source() {
    let dir = TestDir::new();
    let recs = testnet_records(3);
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
    let relay = run_stream(&dir, &stream, 2).await;
    expect_source_stopped(&relay, 2).await;
    assert_eq!(load(&relay.relay.metrics.duplicates_dropped_total), 0);
    relay.stop().await;
}

// ---- Disk faults ----

/// A tmpfs mounted for one test, unmounted on drop.
struct Tmpfs {
    path: PathBuf,
}

impl Tmpfs {
    /// Mounts a tmpfs with `options` at `path`, or says why not (not root, no `mount`) and
    /// returns `None` for the test to skip.
    fn mount(path: &Path, options: &str) -> Option<Tmpfs> {
        if !is_root() {
            eprintln!("skipped: mounting a tmpfs needs root");
            return None;
        }
        std::fs::create_dir_all(path).unwrap();
        let path = path.canonicalize().unwrap();
        let args = ["-t", "tmpfs", "-o", options, "tmpfs"].map(OsStr::new);
        match run("mount", &[&args[..], &[path.as_os_str()]].concat()) {
            Ok(_) => Some(Tmpfs { path }),
            Err(e) => {
                eprintln!("skipped: {e}");
                None
            }
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        if mounts_at(&self.path) > 0 {
            unmount(&self.path);
        }
    }
}

/// Unmounts what is mounted on top at `path`. If something (sled's closing threads, or a relay
/// left running by a failed test) still holds a file there, detaches it now: the kernel frees
/// it when the last file closes.
fn unmount(path: &Path) {
    if run("umount", &[path.as_os_str()]).is_err() {
        let _ = run("umount", &["-l".as_ref(), path.as_os_str()]);
    }
}

/// How many filesystems are mounted at `path` (a canonical path), one over the other.
fn mounts_at(path: &Path) -> usize {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines()
        .filter(|l| l.split(' ').nth(4) == Some(path.to_string_lossy().as_ref()))
        .count()
}

/// Runs `program` with `args`: its stdout, or what went wrong (its stderr).
fn run(program: &str, args: &[&OsStr]) -> Result<String, String> {
    match Command::new(program).args(args).output() {
        Ok(o) if o.status.success() => Ok(String::from_utf8_lossy(&o.stdout).into_owned()),
        Ok(o) => Err(format!(
            "{program} failed ({}): {}",
            o.status,
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Err(format!("cannot run {program}: {e}")),
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

/// A relay with metrics on the testnet file behind a [`GatedSource`], and a subscriber taking
/// every ledger from the first in the background, for the disk fault tests. The test releases
/// ledgers as it needs them: a write to fail on, live ledgers while the ring is degraded, a
/// write to recover with, then the rest.
struct Streaming {
    relay: Running,
    metrics: Arc<Metrics>,
    metrics_addr: SocketAddr,
    source: GatedSource,
    /// The newest ledger released.
    released: u32,
    sub: Collector,
}

impl Streaming {
    /// Starts them with the data directory in `dir`, and returns once the ring holds 30
    /// ledgers and reports healthy.
    async fn start(dir: &TestDir) -> Streaming {
        let source = GatedSource::new(dir.path());
        let mut config = dir.relay_config(&source.spec);
        config.metrics = Some("127.0.0.1:0".parse().unwrap());
        let relay = Running::start(config).await;
        let sub = Collector::start(dir.sub(&relay, "rpc-1", 2, Start::Seq(FIRST)), LAST);
        let released = FIRST + 30;
        source.release_to(released);
        relay.wait_for(released).await;
        let s = Streaming {
            metrics: relay.relay.metrics.clone(),
            metrics_addr: relay.relay.metrics_addr.unwrap(),
            relay,
            source,
            released,
            sub,
        };
        let health = http_get(s.metrics_addr, "/healthz").await;
        assert!(health.contains("\"ring\":\"ok\""), "{health}");
        s
    }

    /// Lets the source read one more ledger (none past the last).
    fn release_one(&mut self) {
        self.released = (self.released + 1).min(LAST);
        self.source.release_to(self.released);
    }

    /// Releases a ledger every 10 ms until `cond` holds, or fails after `secs`.
    async fn release_until(&mut self, secs: u64, what: &str, mut cond: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while !cond() {
            assert!(Instant::now() < deadline, "{what}: not within {secs} s");
            self.release_one();
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// After a disk fault: releases ledgers until the ring reports degraded (the flag,
    /// `/healthz`, `/metrics`, a write error counted), then 10 more, which are published and
    /// delivered live while it stays degraded. Returns the newest ledger published.
    async fn expect_degraded(&mut self) -> u32 {
        let m = self.metrics.clone();
        self.release_until(5, "ring_degraded", || {
            m.ring_degraded.load(Ordering::Relaxed)
        })
        .await;
        let health = http_get(self.metrics_addr, "/healthz").await;
        // Degraded, but live ledgers still flow: 200, and the reason names the ring.
        assert!(health.starts_with("HTTP/1.1 200"), "{health}");
        assert!(health.contains("\"status\":\"degraded\""), "{health}");
        assert!(health.contains("\"ring\":\"degraded\""), "{health}");
        assert!(
            health.contains("\"reasons\":[\"ring degraded: "),
            "{health}"
        );
        assert!(
            health.contains("\"reason_codes\":[\"ring_degraded\"]"),
            "{health}"
        );
        let text = http_get(self.metrics_addr, "/metrics").await;
        assert!(text.contains("\nledger_relay_ring_degraded 1\n"), "{text}");
        assert!(load(&m.ring_write_errors_total) >= 1);
        // Live ledgers keep coming while the ring cannot write.
        let at = load(&m.source_newest);
        for _ in 0..10 {
            self.release_one();
        }
        eventually(5, "live ledgers while degraded", || {
            load(&m.source_newest) >= at + 10
        })
        .await;
        self.sub
            .wait_for((self.released - FIRST + 1) as usize, 5)
            .await;
        assert!(m.ring_degraded.load(Ordering::Relaxed), "still degraded");
        load(&m.source_newest) as u32
    }

    /// Once the disk is writable again: releases ledgers until the ring has written past
    /// ledger `after` and reports healthy (`/healthz`, `/metrics`), having kept its run: no
    /// reset, nothing given up, and the ring still starts at the first ledger it held before
    /// the fault.
    async fn expect_recovered(&mut self, after: u32) {
        let m = self.metrics.clone();
        self.release_until(5, "the ring writes again", || {
            !m.ring_degraded.load(Ordering::Relaxed) && load(&m.ring_newest) > u64::from(after)
        })
        .await;
        assert_eq!(load(&m.ring_resets_total), 0, "the ring kept its run");
        assert_eq!(load(&m.ring_given_up_total), 0, "no ledger was given up");
        assert_eq!(load(&m.ring_oldest), u64::from(FIRST), "retention kept");
        let health = http_get(self.metrics_addr, "/healthz").await;
        assert!(health.starts_with("HTTP/1.1 200"), "{health}");
        assert!(health.contains("\"status\":\"ok\""), "{health}");
        assert!(health.contains("\"ring\":\"ok\""), "{health}");
        assert!(health.contains("\"reasons\":[]"), "{health}");
        let text = http_get(self.metrics_addr, "/metrics").await;
        assert!(text.contains("\nledger_relay_ring_degraded 0\n"), "{text}");
    }

    /// Releases the rest of the file; what the subscriber got: every ledger of the file, in
    /// order, byte for byte.
    async fn delivered(self) -> (Running, Arc<Metrics>, Vec<Ledger>) {
        self.source.release_to(LAST);
        let out = self.sub.finish(30).await;
        out.assert_complete(&testnet_ledgers());
        (self.relay, self.metrics, out.got)
    }
}

/// Once the disk is back, the ring holds every ledger of the file, none missing, and a
/// subscriber starting at the first is served all of it byte for byte.
async fn expect_whole_ring(dir: &TestDir, relay: &Running) {
    relay.wait_for(LAST).await;
    eventually(10, "the ring holds every ledger", || {
        relay.relay.ring.range() == Some((FIRST, LAST))
    })
    .await;
    let replay = take(
        dir.sub(relay, "rpc-1", 2, Start::Seq(FIRST)),
        (LAST - FIRST + 1) as usize,
        20,
    )
    .await
    .unwrap();
    assert_identical(&replay, &testnet_ledgers(), FIRST);
}

/// The data directory cannot be written mid-run (it fills up), then can
/// again. The ledgers that failed to write wait in memory and are written once the disk is
/// back, so the ring keeps its run (no reset, nothing missing); meanwhile a subscriber that
/// starts at the ring's oldest ledger is made to wait, never told it is below retention.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unwritable_data_directory_degrades_the_ring_and_recovers() {
    let dir = TestDir::new();
    let data = dir.data();
    let Some(_mount) = Tmpfs::mount(&data, "size=16m,mode=0755") else {
        return;
    };
    let mut s = Streaming::start(&dir).await;
    let filler = fill(&data);
    let degraded_until = s.expect_degraded().await;
    // A subscriber starting at the oldest ledger while the store is degraded (and, past
    // `REOPEN_EVERY`, closed): it waits for the disk, then gets every ledger.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(
        s.metrics.ring_degraded.load(Ordering::Relaxed),
        "still degraded"
    );
    let late = tokio::spawn(take(
        dir.sub(&s.relay, "rpc-1", 2, Start::Seq(FIRST)),
        (LAST - FIRST + 1) as usize,
        30,
    ));
    tokio::time::sleep(Duration::from_millis(500)).await;
    std::fs::remove_file(filler).unwrap();
    s.expect_recovered(degraded_until).await;
    let (relay, metrics, _) = s.delivered().await;
    let late = late
        .await
        .unwrap()
        .expect("no below-retention end while degraded");
    assert_identical(&late, &testnet_ledgers(), FIRST);
    expect_whole_ring(&dir, &relay).await;
    assert_eq!(load(&metrics.ring_resets_total), 0);
    relay.stop().await;
}

/// A data directory too small for the ring: every ledger is still delivered live, and the ring
/// reports degraded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_degrades_the_ring_and_streaming_goes_on() {
    let dir = TestDir::new();
    let data = dir.data();
    let Some(_mount) = Tmpfs::mount(&data, "size=8m,mode=0755") else {
        return;
    };
    let mut config = dir.relay_config("synthetic:size=1MiB,ratio=1,count=40");
    config.source_options.cadence = Duration::from_millis(50);
    config.metrics = Some("127.0.0.1:0".parse().unwrap());
    let relay = Running::start(config).await;
    let maddr = relay.relay.metrics_addr.unwrap();
    let got = take(dir.sub(&relay, "rpc-1", 2, Start::Seq(2)), 40, 20)
        .await
        .unwrap();
    for (i, l) in got.iter().enumerate() {
        assert_eq!(l.seq, 2 + i as u32, "order");
        assert_eq!(l.data.len(), 1 << 20);
    }
    let m = relay.relay.metrics.clone();
    eventually(5, "ring_degraded", || {
        m.ring_degraded.load(Ordering::Relaxed)
    })
    .await;
    assert!(load(&m.ring_write_errors_total) >= 1);
    assert_eq!(load(&m.ledgers_in_total), 40);
    let health = http_get(maddr, "/healthz").await;
    assert!(health.contains("\"ring\":\"degraded\""), "{health}");
    tokio::time::timeout(Duration::from_secs(15), relay.stop())
        .await
        .expect("the relay stops with a full disk");
}

/// The mount options of an ext4 data directory: an error takes it read-only.
const EXT4_OPTIONS: &str = "errors=remount-ro";

/// An ext4 filesystem without a journal in a file-backed loop device, mounted at `path` with
/// `errors=remount-ro` over a read-only tmpfs, the guard: while the ext4 is unmounted for its
/// repair, `path` is a read-only directory (not a writable one of the test's, where the relay
/// would start a new store). Everything is unmounted and the loop device detached on drop.
struct Ext4Disk {
    path: PathBuf,
    device: String,
    /// Dropped after the ext4 is unmounted.
    _guard: Tmpfs,
}

impl Ext4Disk {
    /// Makes a 64 MiB ext4 in `dir` and mounts it at `path`, or says why not (not root, no
    /// loop device, no `mkfs.ext4` or `e2fsck`, a kernel without the ext4 error trigger) and
    /// returns `None` for the test to skip.
    fn mount(dir: &Path, path: &Path) -> Option<Ext4Disk> {
        if !is_root() {
            eprintln!("skipped: a loop device and mounts need root");
            return None;
        }
        let guard = Tmpfs::mount(path, "ro,size=64k")?;
        let skip = |e: String| eprintln!("skipped: {e}");
        run("e2fsck", &["-V".as_ref()]).map_err(skip).ok()?;
        let image = dir.join("disk.img");
        std::fs::File::create(&image)
            .and_then(|f| f.set_len(64 << 20))
            .unwrap();
        let mkfs = ["-q", "-F", "-O", "^has_journal"].map(OsStr::new);
        run("mkfs.ext4", &[&mkfs[..], &[image.as_os_str()]].concat())
            .map_err(skip)
            .ok()?;
        let found = ["--find".as_ref(), "--show".as_ref(), image.as_os_str()];
        let device = run("losetup", &found).map_err(skip).ok()?;
        // From here on, drop undoes what was done.
        let disk = Ext4Disk {
            path: guard.path.clone(),
            device: device.trim().to_owned(),
            _guard: guard,
        };
        mount_ext4(&disk.device, &disk.path).map_err(skip).ok()?;
        if !disk.trigger().exists() {
            skip(format!("no {}", disk.trigger().display()));
            return None;
        }
        Some(disk)
    }

    /// The kernel's switch that reports a filesystem error, as a failing disk would.
    fn trigger(&self) -> PathBuf {
        let name = Path::new(&self.device).file_name().unwrap();
        Path::new("/sys/fs/ext4")
            .join(name)
            .join("trigger_fs_error")
    }

    /// Takes the filesystem read-only as after an error (`errors=remount-ro`): from now on
    /// every write fails with EROFS, through files already open for writing too.
    fn fail(&self) {
        std::fs::write(self.trigger(), "1\n").unwrap();
    }

    /// Makes the filesystem writable again as an operator would: unmount it (retrying while
    /// the relay still holds its store open: it closes it at its first attempt to open it
    /// again, a second after the failed write), check it with `e2fsck` and mount it again.
    /// Recent kernels (6.18 here) keep an ext4 that went read-only after an error read-only
    /// until it is unmounted: `mount -o remount,rw` succeeds, but writes still fail.
    async fn repair(&self) {
        let (path, device) = (self.path.clone(), self.device.clone());
        tokio::task::spawn_blocking(move || {
            let deadline = Instant::now() + Duration::from_secs(10);
            while let Err(e) = run("umount", &[path.as_os_str()]) {
                assert!(
                    Instant::now() < deadline,
                    "unmounting the data directory: {e}"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            // 0: clean; 1: errors corrected (the error the trigger recorded).
            let fsck = Command::new("e2fsck")
                .args(["-f", "-y", &device])
                .output()
                .expect("e2fsck");
            assert!(
                matches!(fsck.status.code(), Some(0 | 1)),
                "e2fsck {device}: {}\n{}",
                fsck.status,
                String::from_utf8_lossy(&fsck.stdout)
            );
            mount_ext4(&device, &path).unwrap();
        })
        .await
        .unwrap();
    }
}

fn mount_ext4(device: &str, path: &Path) -> Result<String, String> {
    let args = ["-t", "ext4", "-o", EXT4_OPTIONS, device].map(OsStr::new);
    run("mount", &[&args[..], &[path.as_os_str()]].concat())
}

impl Drop for Ext4Disk {
    fn drop(&mut self) {
        // The ext4, if mounted over the guard.
        if mounts_at(&self.path) > 1 {
            unmount(&self.path);
        }
        // Detached at once, or (still in use) as soon as the last user lets go.
        let _ = run("losetup", &["-d", &self.device].map(OsStr::new));
    }
}

/// The data directory turns read-only mid-stream (the kernel takes the
/// filesystem read-only after an error, with the ring's store open for writing), then is
/// repaired. Live ledgers keep reaching a subscriber byte for byte, `/healthz` and the metrics
/// say the ring is degraded, and once the disk is writable the ring reopens, reports healthy,
/// writes the ledgers that waited (no new run, no retention lost) and serves
/// them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_directory_turned_read_only_degrades_the_ring_and_recovers() {
    let dir = TestDir::new();
    let data = dir.data();
    let Some(disk) = Ext4Disk::mount(dir.path(), &data) else {
        return;
    };
    let mut s = Streaming::start(&dir).await;
    disk.fail();
    let failed_ns = now_ns();
    let probe = std::fs::write(data.join("probe"), b"x").unwrap_err();
    assert_eq!(probe.raw_os_error(), Some(30), "EROFS: {probe}");
    let degraded_until = s.expect_degraded().await;
    let repair_ns = now_ns();
    disk.repair().await;
    s.expect_recovered(degraded_until).await;

    // The ledgers published while the disk was read-only arrived live, during that time.
    let (relay, metrics, got) = s.delivered().await;
    let during = got
        .iter()
        .filter(|l| l.received_ns > failed_ns && l.received_ns < repair_ns)
        .count();
    assert!(during >= 10, "{during} ledgers arrived while read-only");

    // The ring kept its run and, with the ledgers that waited written after the repair,
    // holds the whole file; a subscriber starting at its first ledger is served it from the
    // ring, byte for byte.
    let reads = load(&metrics.ring_reads_total);
    expect_whole_ring(&dir, &relay).await;
    // All but the few newest (kept in memory too) came from the ring.
    assert!(
        load(&metrics.ring_reads_total) - reads + 4 >= u64::from(LAST - FIRST + 1),
        "read from the ring"
    );
    assert_eq!(load(&metrics.ring_resets_total), 0);
    relay.stop().await;
}
