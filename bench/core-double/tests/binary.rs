//! `ledger-core-double` as a relay runs a `pipe:` source: `sh -c COMMAND` with fd 3 the meta
//! output. Each ledger is closed before it is written, so a query for the newest ledger on
//! the pipe always finds it.

use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ledger_relay_core_double::Ledger;
use ledger_relay_wire::record::Records;

use crate::support::{testnet_path, FIRST};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The sequences of the whole records written to `path` so far.
fn written(path: &std::path::Path) -> Vec<u32> {
    let bytes = std::fs::read(path).unwrap_or_default();
    Records::new(&bytes[..], 64 << 20)
        .map_while(Result::ok)
        .map(|r| Ledger::decode(Bytes::from(r)).unwrap().seq)
        .collect()
}

/// `POST /getledgerentry` without ledgerSeq: the `ledgerSeq` the double answers for (its
/// LCL), or `None` while it has none.
fn lcl_by_query(addr: SocketAddr) -> Option<u64> {
    use std::io::{Read, Write};
    let body = crate::support::form(&[&crate::support::account(&"ab".repeat(32))], None);
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    write!(
        s,
        "POST /getledgerentry HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let json = out.split_once("\r\n\r\n")?.1;
    serde_json::from_str::<serde_json::Value>(json).ok()?["ledgerSeq"].as_u64()
}

#[test]
fn as_a_pipe_source_it_closes_each_ledger_before_writing_it_to_fd_3() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("meta.xdr");
    let query: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let command = format!(
        "exec {} --ledgers {} --cadence 50ms --http-port 0 --query-port {} 3>{}",
        env!("CARGO_BIN_EXE_ledger-core-double"),
        testnet_path().display(),
        query.port(),
        out.display()
    );
    let _child = Killed(
        Command::new("sh")
            .args(["-c", &command])
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut checked = 0;
    while checked < 20 {
        assert!(Instant::now() < deadline, "only {checked} ledgers checked");
        let seqs = written(&out);
        if let Some(&newest) = seqs.last() {
            let lcl = lcl_by_query(query).expect("the double answers once it wrote a ledger");
            assert!(
                lcl >= u64::from(newest),
                "LCL {lcl} behind the pipe's {newest}"
            );
            let want: Vec<u32> = (FIRST..FIRST + seqs.len() as u32).collect();
            assert_eq!(seqs, want, "every ledger once, in order");
            checked += 1;
        }
        std::thread::sleep(Duration::from_millis(15));
    }
}

#[test]
fn bad_arguments_and_a_missing_file_exit_2() {
    let bin = env!("CARGO_BIN_EXE_ledger-core-double");
    let no_file = Command::new(bin)
        .args([
            "--ledgers",
            "/nonexistent/ledgers.xdr",
            "--output",
            "/dev/null",
        ])
        .output()
        .unwrap();
    assert_eq!(no_file.status.code(), Some(2));
    let text = String::from_utf8_lossy(&no_file.stderr);
    assert!(text.contains("/nonexistent/ledgers.xdr"), "{text}");
    let bad = Command::new(bin)
        .args(["--cadence", "soon"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
}
