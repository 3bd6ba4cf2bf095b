//! `/healthz` against the real `ledger-relay` binary: each transition an operator's probe or
//! alert acts on.
//!
//! - no ledger yet (the `pipe:sleep 1000` of the issue): 503 from the start;
//! - a pipe source that stalls and resumes: 200, then 503 "no ledger for ..." once the limit
//!   passes, then 200 again when ledgers flow, with the ages in the JSON and the metrics;
//! - a pipe source that exits and is restarted: 503 "source restarting" naming the exit, until
//!   the new child delivers; then 200;
//! - the answer stays within 10 ms (95th percentile of a bounded loop) while the relay streams
//!   to a subscriber.
//!
//! The relay runs as a child process with its log in the test's directory; the addresses it
//! bound come from that log.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use ledger_relay_subscriber::{connect, RelayAddr};
use ledger_relay_wire::frame::Start;
use serde_json::Value;

use crate::support::{sub_config, testnet_records, TestDir, FIRST};

/// A `ledger-relay run` child process. Dropping it sends SIGTERM (so it stops its pipe
/// source's process group) and waits; SIGKILL after 15 s.
struct Bin {
    child: Child,
    log: PathBuf,
    metrics: SocketAddr,
    listen: SocketAddr,
}

impl Bin {
    fn start(dir: &TestDir, source: &str, extra: &[&str]) -> Bin {
        let log = dir.path().join("relay.log");
        let child = Command::new(env!("CARGO_BIN_EXE_ledger-relay"))
            .args(["run", "--listen", "127.0.0.1:0", "--certs"])
            .arg(dir.certs.path())
            .arg("--data-dir")
            .arg(dir.data())
            .args(["--source", source, "--metrics", "127.0.0.1:0"])
            .args(extra)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut bin = Bin {
            child,
            log,
            metrics: "0.0.0.0:0".parse().unwrap(),
            listen: "0.0.0.0:0".parse().unwrap(),
        };
        bin.metrics = bin.logged_addr("metrics listening");
        bin.listen = bin.logged_addr("relay listening");
        bin
    }

    /// The `addr=` of the first log line that contains `what`.
    fn logged_addr(&mut self, what: &str) -> SocketAddr {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let text = strip_ansi(&std::fs::read_to_string(&self.log).unwrap_or_default());
            if let Some(line) = text.lines().find(|l| l.contains(what)) {
                let addr = line
                    .split_whitespace()
                    .find_map(|w| w.strip_prefix("addr="))
                    .unwrap_or_else(|| panic!("no addr= in {line:?}"));
                return addr.parse().unwrap();
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("the relay exited ({status}):\n{text}");
            }
            assert!(Instant::now() < deadline, "no {what:?} in the log:\n{text}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `GET path`: the status code and the body.
    fn get(&self, path: &str) -> (u16, String) {
        get(self.metrics, path)
    }

    /// `/healthz`: the status code and the parsed body.
    fn health(&self) -> (u16, Value) {
        let (code, body) = self.get("/healthz");
        let v = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body:?}"));
        (code, v)
    }

    /// Polls `/healthz` every 50 ms until `want` holds (or fails after `secs`, with the last
    /// answer and the log); returns that answer.
    fn health_until(&self, secs: u64, what: &str, want: impl Fn(u16, &Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let (code, v) = self.health();
            if want(code, &v) {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not within {secs} s; last /healthz: {code} {v}\nlog:\n{}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The value of the unlabelled series `name` in `/metrics`.
    fn metric(&self, name: &str) -> f64 {
        let (code, text) = self.get("/metrics");
        assert_eq!(code, 200);
        let prefix = format!("{name} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("no {name} in /metrics"))
            .parse()
            .unwrap()
    }
}

impl Drop for Bin {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ ... final byte in @..~
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) && c != '[' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").expect("a whole answer");
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("bad status line: {head:?}"));
    (code, body.to_owned())
}

fn codes(v: &Value) -> Vec<&str> {
    v["reason_codes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect()
}

fn reasons(v: &Value) -> Vec<&str> {
    v["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect()
}

fn ok(code: u16, v: &Value) -> bool {
    code == 200 && v["status"] == "ok"
}

/// Testnet records `range` (with their marks) written to `path`.
fn records_file(path: &Path, range: std::ops::Range<usize>) {
    let all = testnet_records(range.end);
    std::fs::write(path, all[range].concat()).unwrap();
}

/// A `pipe:` source running the shell script `body` (with `$D` the test's directory).
fn script_source(dir: &TestDir, name: &str, body: &str) -> String {
    let path = dir.path().join(name);
    std::fs::write(&path, format!("D='{}'\n{body}", dir.path().display())).unwrap();
    format!("pipe:sh '{}'", path.display())
}

#[test]
fn a_relay_without_any_ledger_is_unavailable_from_the_start() {
    let dir = TestDir::new();
    let bin = Bin::start(&dir, "pipe:sleep 1000", &[]);
    let (code, v) = bin.health();
    assert_eq!(code, 503, "{v}");
    assert_eq!(v["status"], "degraded");
    assert_eq!(v["delivering"], false);
    assert_eq!(codes(&v), ["no_ledger"]);
    assert!(reasons(&v)[0].starts_with("no ledger yet, "), "{v}");
    assert_eq!(v["source"], "running");
    assert_eq!(v["ledgers_in"], 0);
    assert_eq!(v["stale_after_seconds"], 30.0, "the default for a pipe");
    // Still so a second later, with the ages counted from the start.
    std::thread::sleep(Duration::from_secs(1));
    let (code, v) = bin.health();
    assert_eq!(code, 503, "{v}");
    let age = v["source_last_ledger_age_seconds"].as_f64().unwrap();
    assert!(age >= 1.0, "{v}");
    assert!(v["source_last_byte_age_seconds"].as_f64().unwrap() >= 1.0);
    assert!(bin.metric("ledger_relay_source_last_ledger_age_seconds") >= 1.0);
    assert_eq!(bin.metric("ledger_relay_healthy"), 0.0);
    assert_eq!(bin.metric("ledger_relay_delivering"), 0.0);
    assert_eq!(bin.metric("ledger_relay_stale_after_seconds"), 30.0);
    let (_, text) = bin.get("/metrics");
    assert!(text.contains("ledger_relay_health_reason{reason=\"no_ledger\"} 1\n"));
}

#[test]
fn a_pipe_that_stalls_is_degraded_after_the_limit_and_recovers_when_it_resumes() {
    let dir = TestDir::new();
    records_file(&dir.path().join("a.xdr"), 0..5);
    records_file(&dir.path().join("b.xdr"), 5..10);
    let source = script_source(
        &dir,
        "stall.sh",
        "cat \"$D/a.xdr\" >&3\n\
         while [ ! -e \"$D/go\" ]; do sleep 0.05; done\n\
         cat \"$D/b.xdr\" >&3\n\
         exec sleep 1000\n",
    );
    // 2 s: long enough that the 200 between the first ledgers and the stall is seen even on a
    // loaded machine.
    let bin = Bin::start(&dir, &source, &["--stale-after", "2s"]);

    // Ledgers flow: ok.
    let v = bin.health_until(20, "ok after the first ledgers", |code, v| {
        ok(code, v) && v["ledgers_in"] == 5
    });
    assert_eq!(v["delivering"], true);
    assert_eq!(codes(&v), Vec::<&str>::new());
    assert_eq!(v["source_newest"], FIRST + 4);
    assert_eq!(v["stale_after_seconds"], 2.0);
    assert!(v["source_last_ledger_age_seconds"].as_f64().unwrap() < 2.0);

    // The source stalls: degraded once the limit has passed.
    let t = Instant::now();
    let v = bin.health_until(20, "degraded after the stall", |code, _| code == 503);
    assert_eq!(v["status"], "degraded");
    assert_eq!(codes(&v), ["no_ledger"], "{v}");
    assert!(reasons(&v)[0].starts_with("no ledger for "), "{v}");
    assert!(reasons(&v)[0].ends_with("(limit 2 s)"), "{v}");
    assert!(v["source_last_ledger_age_seconds"].as_f64().unwrap() >= 2.0);
    assert!(v["source_last_byte_age_seconds"].as_f64().unwrap() >= 2.0);
    assert_eq!(v["source"], "running", "a stalled child is still running");
    assert!(t.elapsed() < Duration::from_secs(10));
    assert!(bin.metric("ledger_relay_source_last_ledger_age_seconds") >= 2.0);
    assert_eq!(bin.metric("ledger_relay_delivering"), 0.0);

    // It resumes: ok again.
    std::fs::write(dir.path().join("go"), b"").unwrap();
    let v = bin.health_until(20, "ok after the source resumed", |code, v| {
        ok(code, v) && v["ledgers_in"] == 10
    });
    assert_eq!(v["source_newest"], FIRST + 9);
    assert_eq!(bin.metric("ledger_relay_healthy"), 1.0);
    assert!(bin.metric("ledger_relay_source_last_ledger_age_seconds") < 2.0);

    // And stalls again for good.
    bin.health_until(20, "degraded again", |code, v| {
        code == 503 && codes(v) == ["no_ledger"]
    });
}

#[test]
fn a_pipe_that_exits_is_restarting_until_its_new_run_delivers() {
    let dir = TestDir::new();
    records_file(&dir.path().join("a.xdr"), 0..5);
    records_file(&dir.path().join("b.xdr"), 5..10);
    // The first run writes five ledgers and exits 1; the second waits for `go`, then goes on
    // from the sixth.
    let source = script_source(
        &dir,
        "restart.sh",
        "n=$(cat \"$D/runs\" 2>/dev/null || echo 0)\n\
         echo $((n + 1)) > \"$D/runs\"\n\
         if [ \"$n\" = 0 ]; then cat \"$D/a.xdr\" >&3; exit 1; fi\n\
         while [ ! -e \"$D/go\" ]; do sleep 0.05; done\n\
         cat \"$D/b.xdr\" >&3\n\
         exec sleep 1000\n",
    );
    let bin = Bin::start(&dir, &source, &[]);

    let v = bin.health_until(20, "restarting after the exit", |code, v| {
        code == 503 && v["source"] == "restarting" && v["ledgers_in"] == 5
    });
    assert_eq!(v["status"], "degraded");
    assert_eq!(
        codes(&v),
        ["source_restarting"],
        "the ledger age is within 30 s: {v}"
    );
    let why = reasons(&v)[0];
    assert!(why.starts_with("source "), "{why}");
    assert!(why.contains("exit status: 1"), "{why}");
    // The new child is running but has delivered nothing: still restarting.
    bin.health_until(20, "restarted, waiting for a ledger", |code, v| {
        code == 503 && v["source_restarts"] == 1 && v["source"] == "restarting"
    });
    std::thread::sleep(Duration::from_millis(300));
    let (code, v) = bin.health();
    assert_eq!(
        (code, &v["source"]),
        (503, &Value::from("restarting")),
        "{v}"
    );
    assert!(
        reasons(&v)[0].starts_with("source restarted (restart 1)"),
        "{v}"
    );
    let (_, text) = bin.get("/metrics");
    assert!(text.contains("ledger_relay_health_reason{reason=\"source_restarting\"} 1\n"));

    std::fs::write(dir.path().join("go"), b"").unwrap();
    let v = bin.health_until(20, "ok once the new run delivers", |code, v| {
        ok(code, v) && v["ledgers_in"] == 10
    });
    assert_eq!(v["source"], "running");
    assert_eq!(v["source_restarts"], 1);
    let (_, text) = bin.get("/metrics");
    assert!(text.contains("ledger_relay_health_reason{reason=\"source_restarting\"} 0\n"));
}

/// How many `/healthz` requests a round of the load test times.
const TIMED_REQUESTS: usize = 100;
/// Rounds the load test may try.
const ROUNDS: usize = 5;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_answers_within_10_ms_while_the_relay_streams() {
    let dir = TestDir::new();
    // 1 MiB ledgers every 50 ms (20 MiB/s cut, compressed, sent and verified) to a 4-lane
    // subscriber: what this debug build keeps up with on two shared cores, so that the relay
    // is busy rather than starved.
    let bin = Bin::start(
        &dir,
        "synthetic:size=1MiB,ratio=2",
        &["--cadence", "50ms", "--emit", "8ms"],
    );
    let port = bin.listen.port();
    let delivered = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let sub = {
        let config = sub_config(
            vec![RelayAddr::new("127.0.0.1", port)],
            dir.certs.path(),
            "rpc-1",
            4,
            Start::Tip,
        );
        let (delivered, done) = (delivered.clone(), done.clone());
        tokio::spawn(async move {
            let mut s = connect(config).unwrap();
            // Bounded: the test ends it within its time, or after 2,000 ledgers at most.
            for _ in 0..2_000 {
                if done.load(Ordering::Relaxed) {
                    break;
                }
                match tokio::time::timeout(Duration::from_secs(20), s.next()).await {
                    Ok(Some(Ok(_))) => {
                        delivered.fetch_add(1, Ordering::Relaxed);
                    }
                    other => panic!("subscription: {other:?}"),
                }
            }
            s.close().await;
        })
    };
    // Streaming before timing.
    let d = delivered.clone();
    crate::support::eventually(30, "ledgers reach the subscriber", move || {
        d.load(Ordering::Relaxed) >= 5
    })
    .await;
    let addr = bin.metrics;
    // Rounds of timed requests; the bound must hold over a whole round. A round may meet a
    // burst of other work on this shared machine, so up to ROUNDS are tried, and every
    // request of every round must still answer 200 within 1 s (nothing ever waits on the
    // pipeline or a lock held across IO).
    let mut rounds = Vec::new();
    let mut met = false;
    for _ in 0..ROUNDS {
        let before = delivered.load(Ordering::Relaxed);
        let mut times = tokio::task::spawn_blocking(move || {
            let mut times = Vec::with_capacity(TIMED_REQUESTS);
            for _ in 0..TIMED_REQUESTS {
                let t = Instant::now();
                let (code, body) = get(addr, "/healthz");
                times.push(t.elapsed());
                assert_eq!(code, 200, "healthy while streaming: {body}");
                std::thread::sleep(Duration::from_millis(10));
            }
            times
        })
        .await
        .unwrap();
        let during = delivered.load(Ordering::Relaxed) - before;
        assert!(
            during >= 5,
            "the relay streamed while timed: {during} ledgers"
        );
        times.sort();
        let p50 = times[TIMED_REQUESTS / 2];
        let p95 = times[TIMED_REQUESTS * 95 / 100];
        let max = times[TIMED_REQUESTS - 1];
        let round = format!("{during} ledgers: p50 {p50:?}, p95 {p95:?}, max {max:?}");
        println!("/healthz while streaming, {round}");
        assert!(max < Duration::from_secs(1), "{round}");
        rounds.push(round);
        if p95 <= Duration::from_millis(10) {
            met = true;
            break;
        }
    }
    done.store(true, Ordering::Relaxed);
    crate::support::within(30, "subscriber ends", sub)
        .await
        .unwrap();
    assert!(
        met,
        "95th percentile above 10 ms in every round: {rounds:?}"
    );
    drop(bin);
}
