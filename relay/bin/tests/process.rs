//! The relay as a process of its own, the real `ledger-relay` binary: killed with SIGKILL
//! mid-stream and restarted on the same data directory; a slow consumer whose memory is
//! measured apart from the relay's; and the crash rounds.
//!
//! Every test is bounded by timeouts and asserts outcomes that do not depend on timing; the
//! slow consumer's memory bound has ample headroom (about 30-40 MiB measured against 100 MiB),
//! and its subscriber and relay run as processes of their own so that neither this process nor
//! the tests beside it skew the figure.

use std::net::SocketAddr;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use ledger_relay_subscriber::{connect, Ledger, SubscribeError, Subscription};
use ledger_relay_wire::frame::Start;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::support::{
    file_source, free_port, from_first, http_get, load, local, start_on, sub_config,
    testnet_ledgers, testnet_relay, Collector, TestDir, COUNT, LAST,
};

/// A relay run as the real `ledger-relay` binary, killed with SIGKILL when dropped.
pub(crate) struct RelayProcess {
    pub(crate) child: tokio::process::Child,
    log: Arc<Mutex<Vec<String>>>,
}

impl RelayProcess {
    /// `ledger-relay run` listening on `port` with `args` (the source and its pacing) and 50 ms
    /// heartbeats; returns once it logs that it listens.
    pub(crate) async fn start(certs: &Path, data: &Path, port: u16, args: &[&str]) -> RelayProcess {
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_ledger-relay"))
            .arg("run")
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .arg("--certs")
            .arg(certs)
            .arg("--data-dir")
            .arg(data)
            .args(["--emit", "500us", "--heartbeat", "50ms"])
            .args(args)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("ledger-relay binary");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (ready_tx, ready) = oneshot::channel();
        let sink = log.clone();
        tokio::spawn(async move {
            let mut ready_tx = Some(ready_tx);
            while let Ok(Some(line)) = lines.next_line().await {
                if line.contains("relay listening") {
                    if let Some(tx) = ready_tx.take() {
                        let _ = tx.send(());
                    }
                }
                sink.lock().unwrap().push(line);
            }
        });
        let mut process = RelayProcess { child, log };
        if tokio::time::timeout(Duration::from_secs(15), ready)
            .await
            .map_or(true, |r| r.is_err())
        {
            let status = process.child.try_wait();
            panic!(
                "ledger-relay did not start listening ({status:?}):\n{}",
                process.log()
            );
        }
        process
    }

    /// A relay on `count` synthetic ledgers of 1 MiB from `first`, as fast as a debug build on
    /// two cores goes (about 100 ledgers/s alone), with its metrics on a free port: the relay,
    /// its port and its metrics address.
    pub(crate) async fn synthetic_mib(
        dir: &TestDir,
        first: u32,
        count: u32,
    ) -> (RelayProcess, u16, SocketAddr) {
        let (port, metrics_addr) = (free_port(), {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        });
        let source = format!("synthetic:size=1MiB,ratio=4,start={first},count={count}");
        let metrics_flag = metrics_addr.to_string();
        let args = [
            "--source",
            &source,
            "--cadence",
            "5ms",
            "--metrics",
            &metrics_flag,
        ];
        let relay = RelayProcess::start(dir.certs.path(), &dir.data(), port, &args).await;
        (relay, port, metrics_addr)
    }

    pub(crate) fn log(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// SIGTERM, and waits for a clean exit (sessions closed, the ring flushed).
    pub(crate) async fn sigterm(mut self) {
        let status = sigterm_and_wait(&mut self.child).await;
        assert!(status.success(), "{status:?}:\n{}", self.log());
    }

    /// SIGKILL: no shutdown, no session closed, no flush.
    pub(crate) async fn kill_9(mut self) {
        self.child.start_kill().unwrap();
        let status = self.child.wait().await.unwrap();
        assert_eq!(status.signal(), Some(9), "killed by SIGKILL: {status:?}");
    }
}

/// Sends a relay process SIGTERM and waits (30 s at most) for it to exit.
pub(crate) async fn sigterm_and_wait(
    child: &mut tokio::process::Child,
) -> std::process::ExitStatus {
    let pid = nix::unistd::Pid::from_raw(child.id().expect("the relay runs") as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("the relay stops on SIGTERM")
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "process tier (real relays killed, failed over or flooded): .ci/run runs it"]
async fn a_relay_killed_with_sigkill_and_restarted_mid_stream_loses_and_repeats_nothing() {
    let dir = TestDir::new();
    let want = testnet_ledgers();
    let data = dir.data();
    let port = free_port();
    let source = file_source();
    let args = ["--source", &source, "--cadence", "10ms"];
    let a = RelayProcess::start(dir.certs.path(), &data, port, &args).await;
    let sub = Collector::start(from_first(&dir, vec![local(port)]), LAST);
    sub.wait_for(100, 30).await;
    a.kill_9().await;
    let at_kill = sub.len();
    // The subscriber notices through its heartbeat watchdog; the new relay repairs the ring if
    // the kill tore its last ledger, and may hold fewer ledgers than were delivered (the ring
    // is written behind the live stream): the resume point is then served live.
    let b = start_on(testnet_relay(dir.certs.path(), &data), port).await;
    let b_started = ledger_relay::source::now_ns();
    let out = sub.finish(60).await;
    out.assert_complete(&want);
    assert!(at_kill < COUNT, "killed mid-stream");
    assert!(out.sub.status().sessions >= 2, "{:?}", out.sub.status());
    assert!(
        out.got.last().unwrap().received_ns > b_started,
        "the last ledger came from the restarted relay"
    );
    assert!(load(&b.relay.metrics.ledgers_out_total) >= 1);
    out.sub.close().await;
    b.stop().await;
}

/// Makes [`slow_consumer_child`] run: `PORT CERT_DIR FIRST`.
const SLOW_CHILD_ENV: &str = "LEDGER_RELAY_TEST_SLOW_CONSUMER";
/// How long the slow consumer takes over each ledger.
const SLOW_PER_LEDGER: Duration = Duration::from_millis(100);
/// Ledgers of 1 MiB the slow consumer's relay publishes at most: enough to get `SLOW_BEHIND`
/// ahead even at a tenth of its speed alone (the test ends long before the source does).
const SLOW_LEDGERS: u32 = 1000;
/// The synthetic source's first sequence.
const SLOW_FIRST: u32 = 2;
/// Ledgers published but not taken (MiB) before the consumer speeds up: what a subscriber that
/// buffered instead of pushing back would hold.
const SLOW_BEHIND: u64 = 200;
/// Most the subscriber process may grow while that many MiB wait at the relay. It holds at most
/// its channel (4 ledgers), the verified ledgers not yet handed over and the relay's window (8)
/// in flight: about 20 MiB of ledgers; about 30-45 MiB of growth was measured.
const SLOW_RSS_BOUND_MIB: u64 = 100;

/// A field of /proc/self/status in KiB (`VmRSS`: resident now; `VmHWM`: the peak).
fn vm_kib(field: &str) -> u64 {
    status_kib("self", field).unwrap_or_else(|| panic!("no {field} in /proc/self/status"))
}

/// A field of `/proc/PID/status` in KiB (`PID` a number or `self`); `None` once the process
/// is gone.
pub(crate) fn status_kib(pid: &str, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| {
        l.strip_prefix(field)?
            .strip_prefix(':')?
            .trim()
            .strip_suffix("kB")?
            .trim()
            .parse()
            .ok()
    })
}

/// The next ledger; any error, end or 30 s without one fails the child.
async fn take_one(sub: &mut Subscription) -> Ledger {
    match tokio::time::timeout(Duration::from_secs(30), sub.next()).await {
        Ok(Some(Ok(ledger))) => ledger,
        other => panic!("{:?}", other.map(|o| o.map(|r| r.map(|l| l.seq)))),
    }
}

/// Child of `a_slow_consumer_keeps_memory_bounded_and_misses_nothing`, in its own process so
/// that its RSS is the subscriber's alone (not the relay's, nor that of tests running
/// alongside): takes a ledger every `SLOW_PER_LEDGER` until a line `fast LAST` on stdin says to
/// speed up, reports its memory, then takes every ledger up to LAST as fast as it can, checking
/// that each follows the one before. Does nothing when run by hand.
#[test]
#[ignore = "child process of a_slow_consumer_keeps_memory_bounded_and_misses_nothing"]
fn slow_consumer_child() {
    let Ok(args) = std::env::var(SLOW_CHILD_ENV) else {
        return;
    };
    let args: Vec<&str> = args.split(' ').collect();
    let [port, certs, first] = args[..] else {
        panic!("{SLOW_CHILD_ENV}={args:?}");
    };
    let (port, certs): (u16, PathBuf) = (port.parse().unwrap(), certs.into());
    let first: u32 = first.parse().unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let rss_start = vm_kib("VmRSS");
        let speed_up = CancellationToken::new();
        let told = speed_up.clone();
        let last = Arc::new(Mutex::new(None));
        let target = last.clone();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = std::io::stdin().read_line(&mut line);
            let last = line.trim().strip_prefix("fast ").map(|l| l.parse::<u32>());
            *target.lock().unwrap() = Some(last.expect("fast LAST").unwrap());
            told.cancel();
        });
        let mut config = sub_config(vec![local(port)], &certs, "rpc-1", 4, Start::Seq(first));
        // One session throughout, on a loaded machine too (the relay sends 50 ms heartbeats).
        config.heartbeat_timeout = Some(Duration::from_secs(3));
        let capacity = config.channel_capacity;
        let mut sub = connect(config).unwrap();
        let mut next = first;
        while !speed_up.is_cancelled() {
            let ledger = take_one(&mut sub).await;
            assert_eq!(ledger.seq, next, "in order, no gap, no duplicate");
            next += 1;
            tokio::time::sleep(SLOW_PER_LEDGER).await;
        }
        let status = sub.status();
        println!(
            "\nslow-end taken={} delivered={} last_delivered={} newest={} capacity={capacity} \
             rss_start_kib={rss_start} rss_kib={} hwm_kib={}",
            next - first,
            status.delivered,
            status.last_delivered,
            status.newest,
            vm_kib("VmRSS"),
            vm_kib("VmHWM"),
        );
        let last = last.lock().unwrap().expect("told when to speed up");
        let fast = Instant::now();
        while next <= last {
            let ledger = take_one(&mut sub).await;
            assert_eq!(ledger.seq, next, "in order, no gap, no duplicate");
            next += 1;
        }
        println!(
            "\ndone taken={} fast_ms={} hwm_kib={}",
            next - first,
            fast.elapsed().as_millis(),
            vm_kib("VmHWM"),
        );
        sub.close().await;
    });
}

/// The value of `key=` in a line the child printed.
fn field(line: &str, key: &str) -> u64 {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {line:?}"))
}

/// A free TCP address for a relay's metrics.
pub(crate) fn metrics_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// The relay's metrics: `/metrics` from a relay process, as (name with labels, value).
pub(crate) async fn scrape(addr: SocketAddr) -> Vec<(String, u64)> {
    let text = http_get(addr, "/metrics").await;
    text.lines()
        .filter(|l| l.starts_with("ledger_relay_"))
        .filter_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            Some((name.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// A metric by name (for a labelled one, the least value over its series).
pub(crate) fn metric(metrics: &[(String, u64)], name: &str) -> Option<u64> {
    metrics
        .iter()
        .filter(|(n, _)| n == name || n.strip_prefix(name).is_some_and(|r| r.starts_with('{')))
        .map(|(_, v)| *v)
        .min()
}

/// A metric by name (as [`metric`]) from the relay's metrics at `addr`.
pub(crate) async fn metric_at(addr: SocketAddr, name: &str) -> Option<u64> {
    metric(&scrape(addr).await, name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_consumer_keeps_memory_bounded_and_misses_nothing() {
    let dir = TestDir::new();
    // The relay runs as a process of its own too: its memory (1 MiB ledgers in its hub, ring
    // cache and send buffers) must not show in this test process, where other tests measure
    // their own growth.
    let (relay, port, metrics_addr) =
        RelayProcess::synthetic_mib(&dir, SLOW_FIRST, SLOW_LEDGERS).await;
    let started = Instant::now();
    let mut child = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "process::slow_consumer_child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(
            SLOW_CHILD_ENV,
            format!("{port} {} {SLOW_FIRST}", dir.certs.path().display()),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let stderr = tokio::spawn(async move {
        let mut s = String::new();
        let _ = tokio::io::AsyncReadExt::read_to_string(&mut stderr, &mut s).await;
        s
    });
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let stdout = tokio::spawn(async move {
        let mut out = Vec::new();
        while let Ok(Some(line)) = lines.next_line().await {
            out.push(line);
        }
        out
    });

    // Slow phase: until SLOW_BEHIND MiB of ledgers wait at the relay for this subscriber (the
    // source is 1 MiB per ledger; the lag is the source's newest minus the subscriber's last
    // acknowledged) and the relay reads its ledgers from the ring, off the live stream.
    let deadline = Instant::now() + Duration::from_secs(60);
    let at_switch = loop {
        let m = scrape(metrics_addr).await;
        let behind = metric(&m, "ledger_relay_subscriber_lag_ledgers").unwrap_or(0);
        let catching_up = m.iter().any(|(name, _)| {
            name.starts_with("ledger_relay_subscriber_lanes{")
                && name.contains("catching_up=\"true\"")
        });
        if behind >= SLOW_BEHIND && catching_up {
            break m;
        }
        assert!(
            Instant::now() < deadline,
            "the relay did not get {SLOW_BEHIND} ledgers ahead of the slow consumer: {m:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // Fast phase: everything published so far (and more is published meanwhile).
    let get = |name: &str| metric(&at_switch, name).unwrap_or(0);
    let last = get("ledger_relay_source_newest");
    tokio::io::AsyncWriteExt::write_all(&mut stdin, format!("fast {last}\n").as_bytes())
        .await
        .unwrap();

    let status = tokio::time::timeout(Duration::from_secs(60), child.wait()).await;
    let (out, err) = (stdout.await.unwrap(), stderr.await.unwrap());
    let out = out.join("\n");
    let status = status
        .unwrap_or_else(|_| panic!("the child did not finish in 60 s:\n{out}"))
        .unwrap();
    assert!(status.success(), "child failed ({status}):\n{out}\n{err}");
    let find = |prefix: &str| {
        out.lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix:?} line:\n{out}"))
            .to_owned()
    };
    let (slow, done) = (find("slow-end "), find("done "));
    let (published, behind, lagged) = (
        get("ledger_relay_bytes_in_total") >> 20,
        get("ledger_relay_subscriber_lag_ledgers"),
        get("ledger_relay_lagged_total"),
    );
    let end = scrape(metrics_addr).await;
    eprintln!(
        "slow consumer: relay published {published} MiB, {behind} MiB not taken, lagged \
         {lagged}; {slow}; {done}; ring reads {:?}; {:?}",
        metric(&end, "ledger_relay_ring_reads_total"),
        started.elapsed()
    );
    let rss_start = field(&slow, "rss_start_kib");
    let grown_slow = field(&slow, "hwm_kib").saturating_sub(rss_start) >> 10;
    let grown_all = field(&done, "hwm_kib").saturating_sub(rss_start) >> 10;
    assert!(
        grown_slow < SLOW_RSS_BOUND_MIB,
        "the subscriber grew {grown_slow} MiB while {behind} MiB waited at the relay"
    );
    assert!(
        grown_all < SLOW_RSS_BOUND_MIB,
        "the subscriber grew {grown_all} MiB catching up"
    );
    // Verified ledgers handed over but not taken: at most the channel's capacity.
    let (taken, delivered) = (field(&slow, "taken"), field(&slow, "delivered"));
    assert!(
        delivered >= taken && delivered - taken <= field(&slow, "capacity"),
        "{slow}"
    );
    assert_eq!(field(&done, "taken"), last - u64::from(SLOW_FIRST) + 1);
    // The one session fell behind the live stream and was moved to ring reading. (A session
    // opened again would start reading from the ring, with no lag to count.)
    if get("ledger_relay_sessions_total") == 1 {
        assert!(
            lagged >= 1,
            "the relay moved the session off the live stream"
        );
    }
    assert!(
        metric(&end, "ledger_relay_ring_reads_total").unwrap_or(0) >= 100,
        "the slow subscriber was served from the ring"
    );
    drop(relay);
}

/// The relay is SIGKILLed at random moments while a subscriber streams a file
/// source, and restarted on the same data directory, `CRASH_ROUNDS` times (default 20; `.ci/run`
/// runs 3). The subscriber's output equals the source: no gap, no duplicate.
/// `CRASH_ROUNDS=20 cargo test -p ledger-relay-cli --test tests -- --ignored --exact process::sigkill_rounds`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a longer tier: run with --ignored (CRASH_ROUNDS rounds, default 20)"]
async fn sigkill_rounds() {
    use rand::Rng;
    let rounds: usize = std::env::var("CRASH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let dir = TestDir::new();
    let want = testnet_ledgers();
    let data = dir.data();
    let port = free_port();
    let source = file_source();
    // Each restart replays the file from its start; what the ring holds is dropped as
    // duplicates at 3 ms per ledger before new ledgers flow.
    let args = ["--source", &source, "--cadence", "3ms"];
    let mut relay = RelayProcess::start(dir.certs.path(), &data, port, &args).await;
    let mut config = from_first(&dir, vec![local(port)]);
    config.heartbeat_timeout = Some(Duration::from_millis(500));
    let sub = Collector::start(config, LAST);
    let mut rng = rand::thread_rng();
    let step = (COUNT - 10) / rounds.max(1);
    let mut mid_stream = 0;
    for round in 0..rounds {
        // Kill points spread over the stream, each at a random ledger within its stretch and a
        // random moment within that ledger's time.
        let target = round * step + rng.gen_range(1..=step.max(1));
        sub.wait_for(target.min(COUNT), 60).await;
        tokio::time::sleep(Duration::from_micros(rng.gen_range(0..2000))).await;
        relay.kill_9().await;
        let at = sub.len();
        mid_stream += usize::from(at < COUNT);
        eprintln!("round {round}: killed after {at} ledgers delivered");
        relay = RelayProcess::start(dir.certs.path(), &data, port, &args).await;
    }
    let out = sub.finish(120).await;
    out.assert_complete(&want);
    eprintln!("{mid_stream} of {rounds} kills happened while the subscriber was mid-stream");
    assert!(mid_stream * 4 >= rounds * 3, "most kills land mid-stream");
    out.sub.close().await;
    drop(relay);
}

/// A relay whose ring keeps 5 ledgers of a fast synthetic
/// source; returns it, its metrics address and the ring's bounds as `/metrics` shows them.
async fn short_ring(dir: &TestDir) -> (RelayProcess, SocketAddr, u16) {
    let port = free_port();
    let metrics_addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let metrics_flag = metrics_addr.to_string();
    let args = [
        "--source",
        "synthetic:size=4KiB,ratio=2,start=2",
        "--cadence",
        "20ms",
        "--retention",
        "5",
        "--metrics",
        &metrics_flag,
    ];
    let relay = RelayProcess::start(dir.certs.path(), &dir.data(), port, &args).await;
    // Past the first few ledgers, so the ring has moved on from ledger 2.
    let deadline = Instant::now() + Duration::from_secs(30);
    while metric_at(metrics_addr, "ledger_relay_ring_oldest")
        .await
        .unwrap_or(0)
        < 20
    {
        assert!(
            Instant::now() < deadline,
            "the ring did not move past ledger 20"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (relay, metrics_addr, port)
}

/// The ring's (oldest, newest) as `/metrics` says now.
async fn ring_bounds(addr: SocketAddr) -> (u32, u32) {
    let m = scrape(addr).await;
    let get = |n: &str| metric(&m, n).unwrap_or(0) as u32;
    (
        get("ledger_relay_ring_oldest"),
        get("ledger_relay_ring_newest"),
    )
}

/// The ring's bounds a moment after an answer was read. The relay answers with what it holds,
/// which counts a ledger the hub has published before the ring writer stores it and updates
/// `/metrics`: the metrics catch up within one write, so they are read 100 ms later (five
/// ledgers of this source), which widens the window by those ledgers and no more.
async fn ring_bounds_after(addr: SocketAddr) -> (u32, u32) {
    tokio::time::sleep(Duration::from_millis(100)).await;
    ring_bounds(addr).await
}

/// Asserts that `got` lies between the bounds scraped just before and just after.
fn between(what: &str, got: (u32, u32), before: (u32, u32), after: (u32, u32)) {
    assert!(
        before.0 <= got.0 && got.0 <= after.0 && before.1 <= got.1 && got.1 <= after.1,
        "{what}: the error says oldest {}, newest {}; /metrics said {before:?} before and {after:?} after",
        got.0,
        got.1
    );
    assert!(got.0 != 0 && got.1 >= got.0, "{what}: {got:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_below_the_ring_is_refused_with_the_relays_real_bounds() {
    let dir = TestDir::new();
    let (relay, metrics_addr, port) = short_ring(&dir).await;
    let before = ring_bounds(metrics_addr).await;
    let config = sub_config(
        vec![local(port)],
        dir.certs.path(),
        "rpc-1",
        2,
        Start::Seq(2),
    );
    let mut sub = connect(config).unwrap();
    let err = match tokio::time::timeout(Duration::from_secs(30), sub.next()).await {
        Ok(Some(Err(e))) => e,
        other => panic!("{:?}", other.map(|o| o.map(|r| r.map(|l| l.seq)))),
    };
    let after = ring_bounds_after(metrics_addr).await;
    let SubscribeError::BelowRetention {
        requested,
        oldest,
        newest,
        ..
    } = err
    else {
        panic!("{err:?}")
    };
    assert_eq!(requested, 2);
    between("refused at open", (oldest, newest), before, after);
    drop(relay);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_overtaken_by_the_ring_is_told_the_relays_real_bounds() {
    let dir = TestDir::new();
    let (relay, metrics_addr, port) = short_ring(&dir).await;
    // Overtaken before its first ledger (a loaded machine can take longer than the ring's
    // 100 ms to finish a handshake), a subscriber is refused at open, which the test above
    // covers: this one needs a session that delivered first, so it tries again, a bounded
    // number of times.
    for attempt in 1..=3 {
        if overtaken_mid_stream(&dir, metrics_addr, port).await {
            drop(relay);
            return;
        }
        eprintln!("attempt {attempt}: overtaken before the first ledger; again");
    }
    panic!("three subscribers were overtaken before their first ledger");
}

/// A subscriber from the tip that takes a ledger every 200 ms while the source makes one
/// every 20 ms, so a ring of 5 overtakes it. Asserts what its error says; `false` if it was
/// overtaken before it delivered anything.
async fn overtaken_mid_stream(dir: &TestDir, metrics_addr: SocketAddr, port: u16) -> bool {
    let mut config = sub_config(vec![local(port)], dir.certs.path(), "rpc-1", 2, Start::Tip);
    config.channel_capacity = 1;
    let start = ring_bounds(metrics_addr).await;
    let mut sub = connect(config).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let (err, delivered) = loop {
        assert!(Instant::now() < deadline, "never overtaken");
        let next = tokio::time::timeout(Duration::from_millis(200), sub.next()).await;
        match next {
            Ok(Some(Ok(l))) => {
                let _ = l;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Ok(Some(Err(e))) => break (e, sub.status().last_delivered),
            Ok(None) => panic!("ended without an error"),
            Err(_) => {}
        }
    };
    let after = ring_bounds_after(metrics_addr).await;
    let SubscribeError::BelowRetention {
        requested,
        oldest,
        newest,
        ..
    } = err
    else {
        panic!("{err:?}")
    };
    if delivered == 0 {
        return false;
    }
    assert_eq!(
        requested,
        delivered + 1,
        "the ledger needed is the next one"
    );
    // The relay ended the session some time before the consumer, reading slowly, reached the
    // error (the ledgers verified before it come first): its bounds are those of a moment in
    // between, a full ring of 5 (and the ledger the hub holds before the ring writer stores
    // it), not zeros.
    let (first, _) = start;
    between("ended mid-stream", (oldest, newest), (first, first), after);
    assert!(
        (5..=6).contains(&(newest - oldest + 1)),
        "a full ring: {oldest}..={newest}"
    );
    assert!(
        requested < oldest,
        "the ring had overtaken ledger {requested}"
    );
    true
}

/// The numbers in a below-retention message: `oldest ledger held is A, newest B`.
fn held_bounds(message: &str) -> (u32, u32) {
    let after = |key: &str| -> u32 {
        let at = message
            .find(key)
            .unwrap_or_else(|| panic!("no {key:?} in {message:?}"));
        message[at + key.len()..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse()
            .unwrap_or_else(|e| panic!("{key:?} in {message:?}: {e}"))
    };
    (after("oldest ledger held is "), after(", newest "))
}

/// What an operator reads: `ledger-subscribe`'s own code path (arguments, run, exit code and the
/// one-line message its `main` prints), against the real relay binary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_subscribe_command_exits_4_naming_the_relays_real_bounds() {
    use clap::Parser as _;
    use ledger_relay_subscriber_bin::cli::{run, Args};

    let dir = TestDir::new();
    let (relay, metrics_addr, port) = short_ring(&dir).await;
    let before = ring_bounds(metrics_addr).await;
    let relay_flag = format!("127.0.0.1:{port}");
    let certs = dir.certs.path().display().to_string();
    let args = Args::try_parse_from([
        "ledger-subscribe",
        "--relay",
        &relay_flag,
        "--certs",
        &certs,
        "--name",
        "rpc-1",
        "--from",
        "2",
        "--count",
        "1",
        "--out",
        "/dev/null",
        "--quiet",
    ])
    .unwrap();
    let config = args.into_config().unwrap();
    let err = tokio::time::timeout(Duration::from_secs(60), run(config, std::future::pending()))
        .await
        .expect("the subscription neither ended nor failed")
        .expect_err("ledger 2 is long gone from a ring of 5");
    let after = ring_bounds_after(metrics_addr).await;
    assert_eq!(err.exit_code(), 4, "{err:#}");
    // `main` prints the error with its causes, as anyhow's alternate form does.
    let message = format!("{:#}", anyhow::Error::new(err));
    assert!(
        message.contains(&format!(
            "ledger 2 is below the retention of relay {relay_flag}"
        )),
        "{message}"
    );
    between(
        "the command's message",
        held_bounds(&message),
        before,
        after,
    );
    drop(relay);
}
