//! Sources: file (plain and zstd) replay, FIFO, supervised pipe (restart, abort, process-group
//! shutdown) and the synthetic generator (valid XDR, hash chain, size, compressibility).
//!
//! These check content and event grammar, not timing: cadences are 1 ms, and the only timing
//! checks are lower bounds that sleeps guarantee.

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ledger_relay::source::{
    spawn, synthetic_ledgers, SourceEvent, SourceOptions, SourceSpec, SyntheticSpec,
};
use ledger_relay_wire::header::{peek_header, ChainVerifier};
use ledger_relay_wire::record::{write_record, Records, DEFAULT_MAX_RECORD_LEN};
use sha2::{Digest, Sha256};
use stellar_xdr::{LedgerCloseMeta, Limits, ReadXdr, ScpStatementPledges, WriteXdr};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use tokio_util::sync::CancellationToken;

use crate::support::TESTNET;

/// How long any test waits for an event before failing instead of hanging.
const PATIENCE: Duration = Duration::from_secs(60);

fn fast_opts() -> SourceOptions {
    SourceOptions {
        cadence: Duration::from_millis(1),
        emit: Duration::from_millis(1),
        max_record_len: DEFAULT_MAX_RECORD_LEN,
        pipe_restart_backoff: (Duration::from_millis(10), Duration::from_millis(40)),
        ..SourceOptions::default()
    }
}

fn testnet_records() -> Vec<Vec<u8>> {
    let file = fs::File::open(TESTNET).unwrap();
    Records::new(file, DEFAULT_MAX_RECORD_LEN)
        .collect::<Result<_, _>>()
        .unwrap()
}

fn framed(bodies: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for body in bodies {
        write_record(&mut out, body).unwrap();
    }
    out
}

/// A running source and its events.
struct Running {
    rx: UnboundedReceiver<SourceEvent>,
    shutdown: CancellationToken,
    thread: Option<JoinHandle<()>>,
}

impl Running {
    fn start(spec: SourceSpec, opts: SourceOptions) -> Self {
        let (tx, rx) = unbounded_channel();
        let shutdown = CancellationToken::new();
        let thread = spawn(spec, opts, tx, shutdown.clone());
        Self {
            rx,
            shutdown,
            thread: Some(thread),
        }
    }

    /// Next event, failing the test after PATIENCE; None when the source's channel closed.
    fn next(&mut self) -> Option<SourceEvent> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            match self.rx.try_recv() {
                Ok(event) => return Some(event),
                Err(tokio::sync::mpsc::error::TryRecvError::Disconnected) => return None,
                Err(tokio::sync::mpsc::error::TryRecvError::Empty) => {
                    assert!(Instant::now() < deadline, "no event for {PATIENCE:?}");
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
    }

    /// Events up to and including the first one `stop` accepts.
    fn until(&mut self, mut stop: impl FnMut(&SourceEvent) -> bool) -> Vec<SourceEvent> {
        let mut events = Vec::new();
        loop {
            let event = self.next().expect("the source ended early");
            let done = stop(&event);
            events.push(event);
            if done {
                return events;
            }
        }
    }

    /// Cancels, joins (returning how long that took) and returns the events left.
    fn stop(&mut self) -> (Duration, Vec<SourceEvent>) {
        let started = Instant::now();
        self.shutdown.cancel();
        self.thread.take().unwrap().join().unwrap();
        let took = started.elapsed();
        let mut rest = Vec::new();
        while let Ok(event) = self.rx.try_recv() {
            rest.push(event);
        }
        (took, rest)
    }

    /// Joins a source that ended by itself.
    fn join(&mut self) {
        self.thread.take().unwrap().join().unwrap();
        assert!(self.next().is_none(), "events after the end");
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.shutdown.cancel();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// What a sequence of events says, checked against the event grammar.
#[derive(Debug, Default)]
struct Parsed {
    /// Ledgers delivered whole, in order.
    ledgers: Vec<Vec<u8>>,
    /// Piece sizes of each whole ledger.
    pieces: Vec<Vec<usize>>,
    /// (Begin at_ns, End at_ns) of each whole ledger.
    stamps: Vec<(u64, u64)>,
    aborts: Vec<String>,
    restarts: Vec<(u32, String)>,
    finished: bool,
    failed: Option<String>,
    /// Ledgers, Aborts, Downs and Restarts in order, as letters: "L", "A", "D", "R".
    trail: String,
}

fn parse(events: &[SourceEvent]) -> Parsed {
    let mut p = Parsed::default();
    let mut current: Option<(u32, u64, Vec<u8>, Vec<usize>)> = None;
    for (i, event) in events.iter().enumerate() {
        assert!(
            !p.finished && p.failed.is_none(),
            "event {i} after the end: {event:?}"
        );
        match event {
            SourceEvent::Begin { len, at_ns } => {
                assert!(current.is_none(), "event {i}: Begin inside a ledger");
                current = Some((*len, *at_ns, Vec::new(), Vec::new()));
            }
            SourceEvent::Data(data) => {
                let (len, _, body, pieces) = current.as_mut().expect("Data outside a ledger");
                assert!(!data.is_empty());
                body.extend_from_slice(data);
                pieces.push(data.len());
                assert!(body.len() <= *len as usize, "event {i}: ledger overflows");
            }
            SourceEvent::End { at_ns } => {
                let (len, begin, body, pieces) = current.take().expect("End outside a ledger");
                assert_eq!(body.len(), len as usize, "event {i}: short ledger");
                assert!(*at_ns >= begin);
                p.ledgers.push(body);
                p.pieces.push(pieces);
                p.stamps.push((begin, *at_ns));
                p.trail.push('L');
            }
            SourceEvent::Abort { reason } => {
                assert!(
                    current.take().is_some(),
                    "event {i}: Abort outside a ledger"
                );
                p.aborts.push(reason.clone());
                p.trail.push('A');
            }
            SourceEvent::Down { reason } => {
                assert!(current.is_none(), "event {i}: Down inside a ledger");
                assert!(!reason.is_empty());
                p.trail.push('D');
            }
            SourceEvent::Restarted { attempt, reason } => {
                assert!(current.is_none(), "event {i}: Restarted inside a ledger");
                assert!(p.trail.ends_with('D'), "event {i}: Restarted without Down");
                p.restarts.push((*attempt, reason.clone()));
                p.trail.push('R');
            }
            SourceEvent::FirstByte { .. } => {
                panic!("event {i}: FirstByte comes only from a relay: source passing ledgers on")
            }
            SourceEvent::Finished => {
                assert!(current.is_none(), "event {i}: Finished inside a ledger");
                p.finished = true;
            }
            SourceEvent::Failed(reason) => {
                assert!(current.is_none(), "event {i}: Failed inside a ledger");
                p.failed = Some(reason.clone());
            }
        }
    }
    p
}

fn is_end(event: &SourceEvent) -> bool {
    matches!(event, SourceEvent::Finished | SourceEvent::Failed(_))
}

/// Checks the paced sources' piece sizes: one piece, or all 64-256 KiB.
fn assert_paced_pieces(p: &Parsed) {
    for (i, pieces) in p.pieces.iter().enumerate() {
        let len: usize = pieces.iter().sum();
        if len <= 64 << 10 {
            assert_eq!(pieces.len(), 1, "ledger {i}");
        }
        for &piece in pieces {
            assert!(piece <= 256 << 10, "ledger {i}: piece of {piece}");
            assert!(
                pieces.len() == 1 || piece >= 64 << 10,
                "ledger {i}: piece of {piece}"
            );
        }
    }
}

fn assert_begins_increase(p: &Parsed) {
    for w in p.stamps.windows(2) {
        assert!(w[1].0 > w[0].1, "ledger began before the previous ended");
    }
}

// ---------------------------------------------------------------------------------- file --

fn replay_file(path: &Path) -> Parsed {
    let mut source = Running::start(
        SourceSpec::File {
            path: path.to_owned(),
        },
        fast_opts(),
    );
    let events = source.until(is_end);
    source.join();
    parse(&events)
}

#[test]
fn file_replays_testnet_byte_identical() {
    let expected = testnet_records();
    assert_eq!(expected.len(), 320);
    let p = replay_file(Path::new(TESTNET));
    assert!(p.finished, "{:?}", p.failed);
    assert!(p.aborts.is_empty());
    assert_eq!(p.ledgers.len(), 320);
    assert!(p.ledgers == expected, "ledgers differ");
    assert_paced_pieces(&p);
    assert_begins_increase(&p);
    // Consecutive testnet ledgers, in order.
    let mut chain = ChainVerifier::new();
    for ledger in &p.ledgers {
        let info = peek_header(ledger).unwrap().unwrap();
        chain.check(&info).unwrap();
    }
    assert_eq!(chain.last().unwrap().0, 1_410_367);
}

#[test]
fn file_replays_zstd() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("testnet.xdr.zst");
    let raw = fs::read(TESTNET).unwrap();
    fs::write(&path, zstd::encode_all(&raw[..], 3).unwrap()).unwrap();
    let p = replay_file(&path);
    assert!(p.finished, "{:?}", p.failed);
    assert!(p.ledgers == testnet_records(), "ledgers differ");
    assert_paced_pieces(&p);
    assert_begins_increase(&p);
}

#[test]
fn file_paces_large_ledgers_in_pieces_over_the_window() {
    let spec = SyntheticSpec {
        size: (1 << 20) + 12_345,
        ratio: 1.0,
        count: Some(3),
        ..SyntheticSpec::default()
    };
    let bodies: Vec<Vec<u8>> = synthetic_ledgers(&spec).collect();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.xdr");
    fs::write(&path, framed(&bodies)).unwrap();
    let emit = Duration::from_millis(5);
    let cadence = Duration::from_millis(20);
    let mut source = Running::start(
        SourceSpec::File { path },
        SourceOptions {
            cadence,
            emit,
            ..fast_opts()
        },
    );
    let events = source.until(is_end);
    source.join();
    let p = parse(&events);
    assert!(p.finished);
    assert!(p.ledgers == bodies);
    assert_paced_pieces(&p);
    for pieces in &p.pieces {
        assert!(pieces.len() >= 5, "{pieces:?}");
    }
    // Sleeps make these lower bounds hold on any machine.
    for (begin, end) in &p.stamps {
        assert!(
            end - begin >= emit.as_nanos() as u64,
            "window {}",
            end - begin
        );
    }
    // Ledger k starts no earlier than t0 + k * cadence (its stamp is taken a few µs after
    // the start, hence the slack for the first).
    let t0 = p.stamps[0].0;
    for (k, (begin, _)) in p.stamps.iter().enumerate() {
        let slot = k as u64 * cadence.as_nanos() as u64;
        assert!(begin - t0 + 1_000_000 >= slot, "ledger {k}");
    }
}

#[test]
fn file_truncated_or_missing_fails() {
    let records = testnet_records();
    let mut stream = framed(&records[..3]);
    stream.truncate(stream.len() - 10);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cut.xdr");
    fs::write(&path, &stream).unwrap();
    let p = replay_file(&path);
    assert_eq!(p.ledgers, records[..2]);
    assert!(p.aborts.is_empty(), "the cut record is never begun");
    let failed = p.failed.expect("a cut file fails");
    assert!(failed.contains("stream ended inside a record"), "{failed}");

    let p = replay_file(&dir.path().join("missing.xdr"));
    assert!(p.ledgers.is_empty());
    let failed = p.failed.expect("a missing file fails");
    assert!(failed.contains("cannot open"), "{failed}");

    // No last-fragment bit.
    fs::write(&path, [0, 0, 0, 4, 1, 2, 3, 4]).unwrap();
    let failed = replay_file(&path).failed.unwrap();
    assert!(failed.contains("lacks the last-fragment bit"), "{failed}");
}

// ---------------------------------------------------------------------------------- fifo --

fn make_fifo(dir: &Path) -> PathBuf {
    let path = dir.join("meta.fifo");
    nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    path
}

/// Writes `bytes` to the FIFO in uneven writes from a thread, then closes it.
fn write_fifo(path: PathBuf, bytes: Vec<u8>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        // Blocks until the source opens the FIFO.
        let mut fifo = fs::OpenOptions::new().write(true).open(path).unwrap();
        let mut rest = &bytes[..];
        let mut size = 1;
        while !rest.is_empty() {
            let n = size.min(rest.len());
            fifo.write_all(&rest[..n]).unwrap();
            rest = &rest[n..];
            size = size * 7 % 100_003 + 1;
        }
    })
}

#[test]
fn fifo_reads_records_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = make_fifo(dir.path());
    let records = testnet_records()[..40].to_vec();
    // The source opens the FIFO first; the writer comes later.
    let mut source = Running::start(SourceSpec::Fifo { path: path.clone() }, fast_opts());
    std::thread::sleep(Duration::from_millis(100));
    let writer = write_fifo(path, framed(&records));
    let events = source.until(is_end);
    writer.join().unwrap();
    source.join();
    let p = parse(&events);
    assert!(p.finished, "{:?}", p.failed);
    assert!(p.aborts.is_empty());
    assert!(p.ledgers == records, "ledgers differ");
    for pieces in &p.pieces {
        assert!(pieces.iter().all(|&n| n <= 256 << 10));
    }
}

#[test]
fn fifo_eof_inside_a_record_aborts_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = make_fifo(dir.path());
    let records = testnet_records()[..3].to_vec();
    let mut stream = framed(&records);
    stream.truncate(stream.len() - 100);
    let writer = write_fifo(path.clone(), stream);
    let mut source = Running::start(SourceSpec::Fifo { path }, fast_opts());
    let events = source.until(is_end);
    writer.join().unwrap();
    source.join();
    let p = parse(&events);
    assert_eq!(p.ledgers, records[..2]);
    assert_eq!(p.aborts.len(), 1);
    assert!(
        p.aborts[0].contains("stream ended inside a record"),
        "{}",
        p.aborts[0]
    );
    assert!(p.finished, "EOF inside a record: Abort, then Finished");
}

#[test]
fn fifo_bad_mark_fails_and_shutdown_without_writer_is_prompt() {
    let dir = tempfile::tempdir().unwrap();
    let path = make_fifo(dir.path());
    let mut stream = framed(&testnet_records()[..1]);
    stream.extend_from_slice(&[0x80, 0, 0, 0]);
    let writer = write_fifo(path.clone(), stream);
    let mut source = Running::start(SourceSpec::Fifo { path: path.clone() }, fast_opts());
    let events = source.until(is_end);
    writer.join().unwrap();
    source.join();
    let p = parse(&events);
    assert_eq!(p.ledgers.len(), 1);
    assert!(p.failed.unwrap().contains("empty record"));

    // No writer ever comes: the source waits, and stops promptly on shutdown.
    let mut source = Running::start(SourceSpec::Fifo { path }, fast_opts());
    std::thread::sleep(Duration::from_millis(150));
    let (took, rest) = source.stop();
    assert!(rest.is_empty(), "{rest:?}");
    assert!(took < Duration::from_secs(1), "{took:?}");

    let mut source = Running::start(
        SourceSpec::Fifo {
            path: dir.path().join("missing"),
        },
        fast_opts(),
    );
    let p = parse(&source.until(is_end));
    assert!(p.failed.unwrap().contains("cannot open"));
}

/// Set in the child process of [`stdin_reads_records_until_eof`].
const STDIN_CHILD: &str = "LEDGER_RELAY_TEST_STDIN_CHILD";

/// The stdin source, in a child process (this test binary again, running only this test)
/// whose stdin the parent writes.
#[test]
fn stdin_reads_records_until_eof() {
    if std::env::var_os(STDIN_CHILD).is_some() {
        let mut source = Running::start(SourceSpec::Stdin, fast_opts());
        let events = source.until(is_end);
        source.join();
        let p = parse(&events);
        println!(
            "STDIN-RESULT ledgers={} aborts={} finished={} digest={:x}",
            p.ledgers.len(),
            p.aborts.len(),
            p.finished,
            Sha256::digest(p.ledgers.concat())
        );
        return;
    }
    let records = testnet_records()[..30].to_vec();
    let mut stream = framed(&records);
    // A 31st record cut short: aborted, then Finished.
    let cut = framed(&testnet_records()[30..31]);
    stream.extend_from_slice(&cut[..cut.len() / 2]);
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "source::stdin_reads_records_until_eof",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(STDIN_CHILD, "1")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || stdin.write_all(&stream).unwrap());
    let output = child.wait_with_output().unwrap();
    writer.join().unwrap();
    assert!(output.status.success());
    let stdout = String::from_utf8(output.stdout).unwrap();
    // libtest may print the test's name on the same line first.
    let line = stdout
        .lines()
        .find_map(|l| l.find("STDIN-RESULT").map(|at| &l[at..]))
        .unwrap_or_else(|| panic!("no result from the child: {stdout}"));
    let want = format!(
        "STDIN-RESULT ledgers=30 aborts=1 finished=true digest={:x}",
        Sha256::digest(records.concat())
    );
    assert_eq!(line, want);
}

// ---------------------------------------------------------------------------------- pipe --

fn pipe(command: String) -> Running {
    Running::start(SourceSpec::Pipe { command }, fast_opts())
}

fn process_gone(pid: i32) -> bool {
    // Gone, or a zombie waiting for init (not ours: the source reaps its own child).
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

/// Waits (briefly: a signalled process needs a moment to die) until `pid` is gone.
fn wait_gone(pid: i32) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !process_gone(pid) {
        assert!(Instant::now() < deadline, "process {pid} survived");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn wait_for_file(path: &Path) -> i32 {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Ok(text) = fs::read_to_string(path) {
            if text.ends_with('\n') {
                return text.trim().parse().unwrap();
            }
        }
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn pipe_restarts_the_child_and_delivers_each_run() {
    let dir = tempfile::tempdir().unwrap();
    let records = testnet_records()[10..12].to_vec();
    let file = dir.path().join("two.xdr");
    fs::write(&file, framed(&records)).unwrap();
    let mut source = pipe(format!("cat '{}' >&3", file.display()));
    let mut restarts = 0;
    let events = source.until(|e| {
        restarts += u32::from(matches!(e, SourceEvent::Restarted { .. }));
        restarts == 2
    });
    let (_, rest) = source.stop();
    let p = parse(&events);
    assert!(p.aborts.is_empty(), "{:?}", p.aborts);
    assert!(p.failed.is_none() && !p.finished);
    assert_eq!(p.trail, "LLDRLLDR");
    assert_eq!(p.ledgers.len(), 4);
    for pair in p.ledgers.chunks(2) {
        assert!(pair == records, "ledgers differ");
    }
    assert_eq!(p.restarts[0].0, 1);
    assert_eq!(p.restarts[1].0, 2);
    assert!(
        p.restarts[0].1.contains("exit status: 0"),
        "{}",
        p.restarts[0].1
    );
    // Whatever came after the second restart still follows the grammar.
    let mut all = events;
    all.extend(rest);
    parse(&all);
}

#[test]
fn pipe_child_dying_mid_record_is_aborted_never_ended() {
    let dir = tempfile::tempdir().unwrap();
    let record = &testnet_records()[0];
    let mut stream = framed(std::slice::from_ref(record));
    stream.truncate(stream.len() / 2);
    let file = dir.path().join("half.xdr");
    fs::write(&file, &stream).unwrap();
    let mut source = pipe(format!("cat '{}' >&3; exit 3", file.display()));
    let mut restarts = 0;
    let events = source.until(|e| {
        restarts += u32::from(matches!(e, SourceEvent::Restarted { .. }));
        restarts == 3
    });
    source.stop();
    let p = parse(&events);
    assert!(p.ledgers.is_empty(), "a partial ledger was ended");
    assert_eq!(p.trail, "ADRADRADR");
    for reason in &p.aborts {
        assert!(reason.contains("exit status: 3"), "{reason}");
        assert!(reason.contains("stream ended inside a record"), "{reason}");
    }
}

#[test]
fn pipe_shutdown_stops_the_whole_process_group() {
    let dir = tempfile::tempdir().unwrap();
    let (child_file, grandchild_file) = (dir.path().join("child"), dir.path().join("grandchild"));
    let record = &testnet_records()[5];
    let file = dir.path().join("one.xdr");
    fs::write(&file, framed(std::slice::from_ref(record))).unwrap();
    // The child writes a ledger, starts a grandchild that holds fd 3 too, and waits.
    let mut source = pipe(format!(
        "cat '{}' >&3; sleep 1000 & echo $! > '{}'; echo $$ > '{}'; wait",
        file.display(),
        grandchild_file.display(),
        child_file.display()
    ));
    let events = source.until(|e| matches!(e, SourceEvent::End { .. }));
    let grandchild = wait_for_file(&grandchild_file);
    let child = wait_for_file(&child_file);
    assert!(!process_gone(child) && !process_gone(grandchild));
    let (took, rest) = source.stop();
    assert!(rest.is_empty(), "{rest:?}");
    assert_eq!(parse(&events).ledgers, std::slice::from_ref(record));
    // SIGTERM sufficed: well under the 2 s grace.
    assert!(took < Duration::from_millis(1500), "{took:?}");
    // The child is reaped (not even a zombie) and the grandchild is dead.
    assert!(!Path::new(&format!("/proc/{child}")).exists(), "child left");
    wait_gone(grandchild);
}

#[test]
fn pipe_child_ignoring_sigterm_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let child_file = dir.path().join("child");
    let mut source = pipe(format!(
        "trap '' TERM; echo $$ > '{}'; while :; do sleep 0.05; done",
        child_file.display()
    ));
    let child = wait_for_file(&child_file);
    let (took, rest) = source.stop();
    assert!(rest.is_empty(), "{rest:?}");
    assert!(
        took >= Duration::from_millis(1900),
        "SIGKILL came early: {took:?}"
    );
    assert!(!Path::new(&format!("/proc/{child}")).exists(), "child left");
}

#[test]
fn pipe_grandchild_holding_the_pipe_does_not_stall_restart() {
    let dir = tempfile::tempdir().unwrap();
    let record = &testnet_records()[7];
    let file = dir.path().join("one.xdr");
    fs::write(&file, framed(std::slice::from_ref(record))).unwrap();
    let grandchild_file = dir.path().join("grandchild");
    // The child exits while a grandchild keeps fd 3 open: no EOF, but the run is over.
    let mut source = pipe(format!(
        "cat '{}' >&3; sleep 1000 & echo $! > '{}'",
        file.display(),
        grandchild_file.display()
    ));
    let events = source.until(|e| matches!(e, SourceEvent::Restarted { .. }));
    let first_grandchild = wait_for_file(&grandchild_file);
    source.stop();
    let p = parse(&events);
    assert_eq!(p.trail, "LDR");
    assert!(p.ledgers[0] == *record);
    wait_gone(first_grandchild);
}

#[test]
fn pipe_malformed_stream_fails_and_stops_the_child() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("bad.sh");
    let child_file = dir.path().join("child");
    // A mark without the last-fragment bit, then the child lingers.
    fs::write(
        &script,
        format!(
            "echo $$ > '{}'\nprintf '\\000\\000\\000\\004abcd' >&3\nexec sleep 1000\n",
            child_file.display()
        ),
    )
    .unwrap();
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
    let mut source = pipe(format!("'{}'", script.display()));
    let events = source.until(is_end);
    source.join();
    let failed = parse(&events).failed.unwrap();
    assert!(failed.contains("lacks the last-fragment bit"), "{failed}");
    let child = wait_for_file(&child_file);
    // The source's child is `sh -c`, which ran the script (and exec'd sleep) as its own
    // child or in its place; either way the whole group is gone.
    wait_gone(child);
}

#[test]
fn pipe_child_exiting_at_once_is_restarted_with_backoff() {
    let started = Instant::now();
    let mut source = pipe("exit 0".into());
    // Backoff 10, 20, 40, 40 ms: runs that deliver nothing back off.
    let events = source.until(|e| matches!(e, SourceEvent::Restarted { attempt: 4, .. }));
    source.stop();
    assert_eq!(parse(&events).trail, "DRDRDRDR");
    assert!(started.elapsed() >= Duration::from_millis(110));
}

// ----------------------------------------------------------------------------- synthetic --

/// zstd level 1 over 256 KiB chunks, as the relay compresses.
fn zstd1_ratio(ledgers: &[Vec<u8>]) -> f64 {
    let (mut raw, mut packed) = (0usize, 0usize);
    for ledger in ledgers {
        for chunk in ledger.chunks(256 << 10) {
            raw += chunk.len();
            packed += zstd::bulk::compress(chunk, 1).unwrap().len();
        }
    }
    raw as f64 / packed as f64
}

fn check_synthetic_chain(ledgers: &[Vec<u8>], spec: &SyntheticSpec) {
    let mut chain = ChainVerifier::starting_at(spec.start);
    let mut previous: Option<[u8; 32]> = None;
    for (i, ledger) in ledgers.iter().enumerate() {
        let size = spec.size as f64;
        assert!(
            (ledger.len() as f64 - size).abs() <= size * 0.01,
            "ledger {i}: {} bytes for {}",
            ledger.len(),
            spec.size
        );
        let lcm = LedgerCloseMeta::from_xdr(ledger, Limits::none()).unwrap();
        let LedgerCloseMeta::V2(v2) = &lcm else {
            panic!("not v2")
        };
        let entry = &v2.ledger_header;
        assert_eq!(entry.header.ledger_seq, spec.start + i as u32);
        assert_eq!(entry.header.ledger_version, 23);
        let header_xdr = entry.header.to_xdr(Limits::none()).unwrap();
        let hash: [u8; 32] = Sha256::digest(&header_xdr).into();
        assert_eq!(entry.hash.0, hash, "ledger {i}: hash is not sha256(header)");
        if let Some(previous) = previous {
            assert_eq!(entry.header.previous_ledger_hash.0, previous);
        }
        previous = Some(hash);
        // The filler sits where the schema allows any length: an SCP value.
        let messages = &v2.scp_info[0];
        let stellar_xdr::ScpHistoryEntry::V0(entry0) = messages;
        let ScpStatementPledges::Externalize(ext) =
            &entry0.ledger_messages.messages[0].statement.pledges
        else {
            panic!("not externalize")
        };
        assert!(ext.commit.value.0.len() + 2048 > ledger.len());
        // The relay's own view of it.
        let info = peek_header(ledger).unwrap().unwrap();
        assert_eq!(info.hash, hash);
        assert_eq!(info.lcm_version, 2);
        chain.check(&info).unwrap();
        // Its transaction set and (empty) results hash to what the header says, as a
        // subscriber checks.
        let content = ledger_relay_wire::content::check_content(ledger, &info)
            .unwrap_or_else(|e| panic!("ledger {i}: {e}"));
        assert_eq!(content.transactions, 0);
    }
}

#[test]
fn synthetic_ledgers_are_valid_chained_and_calibrated() {
    let spec = SyntheticSpec {
        size: 4 << 20,
        count: Some(3),
        ..SyntheticSpec::default()
    };
    let ledgers: Vec<Vec<u8>> = synthetic_ledgers(&spec).collect();
    assert_eq!(ledgers.len(), 3);
    check_synthetic_chain(&ledgers, &spec);
    // Distinct bodies, not only distinct headers.
    assert_ne!(ledgers[0][1024..], ledgers[1][1024..]);
    let ratio = zstd1_ratio(&ledgers);
    eprintln!("ratio=7.6: measured {ratio:.3}");
    assert!((ratio / 7.6 - 1.0).abs() <= 0.10, "measured {ratio}");
    // Deterministic.
    assert!(synthetic_ledgers(&spec).collect::<Vec<_>>() == ledgers);

    let spec = SyntheticSpec {
        ratio: 1.0,
        start: 1000,
        ..spec
    };
    let ledgers: Vec<Vec<u8>> = synthetic_ledgers(&spec).collect();
    check_synthetic_chain(&ledgers, &spec);
    let ratio = zstd1_ratio(&ledgers);
    eprintln!("ratio=1: measured {ratio:.4}");
    assert!((0.98..=1.02).contains(&ratio), "measured {ratio}");
}

#[test]
fn synthetic_ratio_is_within_ten_percent_across_the_range() {
    for target in [1.5, 2.0, 3.0, 5.0, 10.0] {
        let spec = SyntheticSpec {
            size: 1 << 20,
            ratio: target,
            count: Some(2),
            ..SyntheticSpec::default()
        };
        let ledgers: Vec<Vec<u8>> = synthetic_ledgers(&spec).collect();
        let ratio = zstd1_ratio(&ledgers);
        eprintln!("ratio={target}: measured {ratio:.3}");
        assert!(
            (ratio / target - 1.0).abs() <= 0.10,
            "{target}: measured {ratio}"
        );
    }
}

#[test]
fn synthetic_source_emits_the_generated_ledgers_paced() {
    let spec = SyntheticSpec {
        size: 1 << 20,
        count: Some(4),
        start: 77,
        emit: Some(Duration::from_millis(3)),
        ..SyntheticSpec::default()
    };
    let expected: Vec<Vec<u8>> = synthetic_ledgers(&spec).collect();
    let mut source = Running::start(SourceSpec::Synthetic(spec), fast_opts());
    let events = source.until(is_end);
    source.join();
    let p = parse(&events);
    assert!(p.finished, "{:?}", p.failed);
    assert!(p.ledgers == expected, "ledgers differ");
    assert_paced_pieces(&p);
    assert_begins_increase(&p);
    for (begin, end) in &p.stamps {
        assert!(
            end - begin >= 3_000_000,
            "the spec's emit window overrides the options'"
        );
    }
}

#[test]
fn synthetic_endless_source_keeps_the_chain_until_shutdown() {
    let spec: SourceSpec = "synthetic:size=64KiB,ratio=3,start=5".parse().unwrap();
    let mut source = Running::start(spec, fast_opts());
    let mut ended = 0;
    let events = source.until(|e| {
        ended += usize::from(matches!(e, SourceEvent::End { .. }));
        ended == 10
    });
    let (took, rest) = source.stop();
    assert!(took < Duration::from_secs(1), "{took:?}");
    let mut all = events;
    all.extend(rest);
    let p = parse(&all);
    assert!(!p.finished && p.failed.is_none());
    assert!(p.ledgers.len() >= 10);
    let mut chain = ChainVerifier::starting_at(5);
    for ledger in &p.ledgers {
        chain.check(&peek_header(ledger).unwrap().unwrap()).unwrap();
    }
    // Pool bodies repeat, headers never do.
    let distinct: std::collections::HashSet<&Vec<u8>> = p.ledgers.iter().collect();
    assert_eq!(distinct.len(), p.ledgers.len());
}

#[test]
fn synthetic_too_long_for_the_record_limit_fails() {
    let mut source = Running::start(
        SourceSpec::Synthetic(SyntheticSpec {
            size: 1 << 20,
            count: Some(1),
            ..SyntheticSpec::default()
        }),
        SourceOptions {
            max_record_len: 1 << 19,
            ..fast_opts()
        },
    );
    let p = parse(&source.until(is_end));
    assert!(p.failed.unwrap().contains("exceed the record limit"));
}

#[test]
fn dropping_the_receiver_stops_a_source() {
    let (tx, rx) = unbounded_channel();
    let shutdown = CancellationToken::new();
    let thread = spawn(
        "synthetic:size=4KiB,ratio=1".parse().unwrap(),
        fast_opts(),
        tx,
        shutdown,
    );
    std::thread::sleep(Duration::from_millis(50));
    drop(rx);
    let started = Instant::now();
    thread.join().unwrap();
    assert!(started.elapsed() < Duration::from_secs(1));
}
