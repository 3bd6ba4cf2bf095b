//! The relay's delivery settings the bench compares, against the real relay over
//! loopback QUIC:
//!
//! - `--store-and-forward`: no frame of a ledger reaches a subscriber before the relay has read
//!   that ledger's last byte from its source (the same test in chunked mode shows frames well
//!   before it, so the measurement can tell the two apart), and every ledger is intact;
//! - `--streams-per-lane 1`: one and four lanes deliver every multi-chunk ledger byte-identical,
//!   and a lane lost mid-stream costs nothing (its queued chunks go to the other lanes);
//! - both settings from flags, the config file and the binary's command line, bad values
//!   refused with exit 2 and a one-line reason.
//!
//! A raw client (quinn and the wire crate's reassembler) stamps each data stream when it
//! arrives, which the subscriber library does not expose.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use ledger_relay::config::{RelayConfig, RunArgs};
use ledger_relay::source::{now_ns, synthetic_ledgers, SyntheticSpec};
use ledger_relay_certs::CertDir;
use ledger_relay_subscriber::{connect, Credentials, RelayAddr, SubscribeConfig};
use ledger_relay_transport::{
    client_config, endpoint, read_single_frame, udp_socket, FrameIo, TransportSettings,
};
use ledger_relay_wire::compress::Codec;
use ledger_relay_wire::frame::{Frame, LaneJoin, Resend, SessionOpen, Start};
use ledger_relay_wire::{Limits, Reassembler, PROTOCOL_VERSION};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

async fn within<T>(secs: u64, what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(secs), f)
        .await
        .unwrap_or_else(|_| panic!("{what}: not within {secs} s"))
}

struct Running {
    relay: ledger_relay::Relay,
    stop: CancellationToken,
    certs: CertDir,
    _dir: tempfile::TempDir,
}

impl Running {
    /// A relay on `source` with a fresh CA (relay cert for 127.0.0.1, client `rpc-1`) and
    /// `flags` applied to its `run` arguments.
    async fn start(source: &str, flags: impl FnOnce(&mut RunArgs)) -> Running {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
            )
            .with_test_writer()
            .try_init();
        let dir = tempfile::tempdir().unwrap();
        let certs = CertDir::init(&dir.path().join("certs"), 365).unwrap();
        certs
            .issue_server("relay", &["127.0.0.1".into()], 30)
            .unwrap();
        certs.issue_client("rpc-1", 30).unwrap();
        let mut args = RunArgs {
            listen: Some("127.0.0.1:0".parse().unwrap()),
            certs: Some(certs.path().to_path_buf()),
            data_dir: Some(dir.path().join("data")),
            source: Some(source.into()),
            heartbeat: Some("50ms".into()),
            ..RunArgs::default()
        };
        flags(&mut args);
        let config = RelayConfig::from_args(args).unwrap();
        let stop = CancellationToken::new();
        let relay = ledger_relay::Relay::start(config, stop.clone())
            .await
            .unwrap();
        Running {
            relay,
            stop,
            certs,
            _dir: dir,
        }
    }

    fn subscriber(&self, lanes: u8, first: u32) -> SubscribeConfig {
        let addr = RelayAddr::new("127.0.0.1", self.relay.addr.port());
        let creds = Credentials::from_cert_dir(self.certs.path(), "rpc-1").unwrap();
        let mut c = SubscribeConfig::new(vec![addr], creds);
        c.lanes = lanes;
        c.start = Start::Seq(first);
        c
    }

    async fn stop(self) {
        self.stop.cancel();
        within(15, "relay stop", self.relay.wait()).await;
    }
}

/// The ledgers of `synthetic:size=SIZE,ratio=2,count=COUNT,start=2`, and that source string.
fn synthetic(size: u64, count: u64) -> (String, Vec<Bytes>) {
    let spec = SyntheticSpec {
        size,
        ratio: 2.0,
        count: Some(count),
        start: 2,
        ..SyntheticSpec::default()
    };
    let want = synthetic_ledgers(&spec).map(Bytes::from).collect();
    (
        format!("synthetic:size={size},ratio=2,count={count},start=2"),
        want,
    )
}

/// Takes `want.len()` ledgers from `first` with the subscriber library and checks each is
/// byte-identical to the source's.
async fn library_takes_all(config: SubscribeConfig, want: &[Bytes], first: u32) {
    let mut sub = connect(config).unwrap();
    for (i, w) in want.iter().enumerate() {
        let l = within(60, "library subscriber", sub.next())
            .await
            .expect("subscription goes on")
            .expect("no subscription error");
        assert_eq!(l.seq, first + i as u32, "order");
        assert!(l.data == *w, "ledger {} differs from the source", l.seq);
    }
    sub.close().await;
}

/// One ledger as the raw client got it.
struct Got {
    seq: u32,
    data: Bytes,
    /// When the first frame of it arrived (a data stream was accepted), ns since the epoch.
    first_frame_ns: u64,
    /// When the relay read its last byte from the source (its end record).
    last_byte_ns: u64,
}

/// A raw `lanes`-lane session from `first` that reassembles `n` ledgers, stamping each data
/// stream when it is accepted. With `lose`, lane 2 stalls once a third of the ledgers is in
/// (its new streams are left unread, and a 16 KiB stream window holds each of them open on the
/// relay, as a congested path would) and its connection is closed 300 ms later. Returns the
/// ledgers and the frames per lane.
async fn raw_session(
    relay: &Running,
    lanes: u8,
    first: u32,
    n: usize,
    lose: bool,
) -> (Vec<Got>, Vec<u64>) {
    let creds = Credentials::from_cert_dir(relay.certs.path(), "rpc-1").unwrap();
    let mut settings = TransportSettings::default();
    if lose {
        settings.stream_receive_window = 16 << 10;
    }
    let tls = client_config(
        &creds.ca,
        &creds.crls,
        creds.cert_chain,
        creds.key,
        &settings,
    )
    .unwrap();
    // Each lane from its own socket, as the subscriber does; the endpoints live as long as this.
    let mut lane_conns = Vec::new();
    for _ in 0..lanes {
        let socket = udp_socket("127.0.0.1:0".parse().unwrap(), &settings).unwrap();
        let ep = endpoint(socket, None, &settings).unwrap();
        let connecting = ep
            .connect_with(tls.clone(), relay.relay.addr, "127.0.0.1")
            .unwrap();
        let conn = within(5, "handshake", connecting).await.unwrap();
        lane_conns.push((ep, conn));
    }
    let open_control = |conn: quinn::Connection| async move {
        let (send, recv) = within(5, "control stream", conn.open_bi()).await.unwrap();
        FrameIo::new(send, recv, Limits::default())
    };
    let mut ctl = open_control(lane_conns[0].1.clone()).await;
    let open = Frame::SessionOpen(SessionOpen {
        version: PROTOCOL_VERSION,
        start: Start::Seq(first),
        lanes,
        codecs: Codec::ALL.iter().fold(0, |m, c| m | c.bit()),
        window: 8,
    });
    ctl.writer.write(&open).await.unwrap();
    let accept = match within(10, "session accept", ctl.reader.next()).await {
        Ok(Some(Frame::SessionAccept(a))) => a,
        other => panic!("expected SessionAccept, got {other:?}"),
    };
    assert_eq!(accept.lanes, lanes);
    let mut lane_ctls = Vec::new();
    for (lane, (_, conn)) in lane_conns.iter().enumerate().skip(1) {
        let mut io = open_control(conn.clone()).await;
        let join = Frame::LaneJoin(LaneJoin {
            version: PROTOCOL_VERSION,
            session_id: accept.session_id,
            token: accept.token,
            lane: lane as u8,
        });
        io.writer.write(&join).await.unwrap();
        match within(5, "lane accept", io.reader.next()).await {
            Ok(Some(Frame::LaneAccept(l))) if usize::from(l) == lane => {}
            other => panic!("expected LaneAccept({lane}), got {other:?}"),
        }
        lane_ctls.push(io);
    }
    const LOST: usize = 2;
    let stalled = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (tx, mut rx) = mpsc::unbounded_channel();
    for (lane, (_, conn)) in lane_conns.iter().enumerate() {
        let (conn, tx) = (conn.clone(), tx.clone());
        let stalled = stalled.clone();
        tokio::spawn(async move {
            let mut unread = Vec::new();
            while let Ok(mut recv) = conn.accept_uni().await {
                if lane == LOST && stalled.load(std::sync::atomic::Ordering::Relaxed) {
                    unread.push(recv);
                    continue;
                }
                let at = now_ns();
                let tx = tx.clone();
                tokio::spawn(async move {
                    if let Ok(f) = read_single_frame(&mut recv, &Limits::default()).await {
                        let _ = tx.send((lane, at, f));
                    }
                });
            }
        });
    }
    let ns = |t: u64| Duration::from_nanos(t);
    let mut r = Reassembler::new(Limits::default(), first, Duration::from_millis(300));
    let mut got = Vec::new();
    let mut per_lane = vec![0u64; usize::from(lanes)];
    let mut lost = false;
    let mut stall_since = None;
    within(60, "every ledger", async {
        while got.len() < n {
            let next = tokio::time::timeout(Duration::from_millis(50), rx.recv()).await;
            if let Ok(Some((lane, at, frame))) = next {
                per_lane[lane] += 1;
                match frame {
                    Frame::Chunk(c) => r.handle_chunk(&c, ns(at)).unwrap(),
                    Frame::LedgerEnd(e) => r.handle_end(&e, ns(at)).unwrap(),
                    other => panic!("unexpected data frame {other:?}"),
                }
            }
            r.handle_timeout(ns(now_ns()));
            while let Some(m) = r.poll_missing() {
                let f = Frame::Resend(Resend {
                    seq: m.seq,
                    whole: m.whole,
                    indices: m.indices,
                });
                ctl.writer.write(&f).await.unwrap();
            }
            while let Some(l) = r.poll_ledger() {
                ctl.writer.write(&Frame::Ack(l.seq)).await.unwrap();
                got.push(Got {
                    seq: l.seq,
                    data: l.data,
                    first_frame_ns: l.first_seen.as_nanos() as u64,
                    last_byte_ns: l.end.last_byte_ns,
                });
            }
            if lose && stall_since.is_none() && got.len() >= n / 3 {
                stalled.store(true, std::sync::atomic::Ordering::Relaxed);
                stall_since = Some(std::time::Instant::now());
            }
            if !lost && stall_since.is_some_and(|t| t.elapsed() >= Duration::from_millis(300)) {
                lane_conns[LOST].1.close(0u32.into(), b"lane lost");
                lost = true;
            }
        }
    })
    .await;
    assert_eq!(lose, lost, "the lane was lost mid-stream");
    for (_, conn) in &lane_conns {
        conn.close(0u32.into(), b"done");
    }
    drop(lane_ctls);
    (got, per_lane)
}

fn assert_identical(got: &[Got], want: &[Bytes], first: u32) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.seq, first + i as u32, "order");
        assert!(g.data == *w, "ledger {} differs from the source", g.seq);
    }
}

/// Six 1 MiB ledgers (16 chunks of 64 KiB), each written by the source over 300 ms: in chunked
/// mode most of a ledger is on its way before its last byte is read.
async fn paced_run(store_and_forward: bool) -> Vec<Got> {
    let (source, want) = synthetic(1 << 20, 6);
    let relay = Running::start(&source, |a| {
        a.store_and_forward = store_and_forward;
        a.cadence = Some("400ms".into());
        a.emit = Some("300ms".into());
        a.chunk_size = Some("64KiB".into());
    })
    .await;
    // The raw client (for arrival times) and the library (what an operator runs) at once.
    let library = library_takes_all(relay.subscriber(2, 2), &want, 2);
    let ((got, _), ()) = tokio::join!(raw_session(&relay, 1, 2, want.len(), false), library);
    assert_identical(&got, &want, 2);
    relay.stop().await;
    let ms: Vec<String> = got
        .iter()
        .map(|g| {
            format!(
                "{:+.1}",
                (g.first_frame_ns as f64 - g.last_byte_ns as f64) / 1e6
            )
        })
        .collect();
    eprintln!(
        "store_and_forward={store_and_forward}: first frame minus last source byte, ms: {}",
        ms.join(" ")
    );
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_and_forward_sends_nothing_of_a_ledger_before_its_last_source_byte() {
    let got = paced_run(true).await;
    for g in &got {
        assert!(
            g.first_frame_ns >= g.last_byte_ns,
            "ledger {}: a frame arrived {} ms before the relay read the ledger's last byte",
            g.seq,
            (g.last_byte_ns - g.first_frame_ns) as f64 / 1e6
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_mode_sends_a_ledger_while_the_source_writes_it() {
    let got = paced_run(false).await;
    // The first ledger may have been complete before the session joined (then it comes whole
    // from memory); the others arrive live, most of them while the source still writes them.
    let early: Vec<u32> = got
        .iter()
        .filter(|g| g.first_frame_ns + 100_000_000 < g.last_byte_ns)
        .map(|g| g.seq)
        .collect();
    assert!(
        early.len() + 1 >= got.len(),
        "ledgers whose first frame came over 100 ms before their last source byte: {early:?}"
    );
}

/// Forty 1 MiB ledgers of eight 128 KiB chunks, live.
fn multi_chunk_relay_flags(a: &mut RunArgs) {
    a.streams_per_lane = Some(1);
    a.cadence = Some("30ms".into());
    a.emit = Some("5ms".into());
    a.chunk_size = Some("128KiB".into());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_stream_per_lane_delivers_on_one_and_four_lanes() {
    let (source, want) = synthetic(1 << 20, 40);
    let relay = Running::start(&source, multi_chunk_relay_flags).await;
    tokio::join!(
        library_takes_all(relay.subscriber(1, 2), &want, 2),
        library_takes_all(relay.subscriber(4, 2), &want, 2),
    );
    relay.stop().await;
}

/// One stream per lane, and a lane stalls with its one stream open, then dies: that stream goes
/// to the other lanes. (Units are bound to a lane only when it has room, so nothing else waits
/// on the stalled lane: everything else went to the others meanwhile.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_stream_per_lane_survives_a_lost_lane() {
    let (source, want) = synthetic(1 << 20, 40);
    let relay = Running::start(&source, |a| {
        multi_chunk_relay_flags(a);
        a.cadence = Some("5ms".into());
    })
    .await;
    // Every ledger in the ring first: a replay racing the source can ask for a ledger that has
    // left memory before the ring writer appended it, which is not what this test is about.
    within(60, "the source's 40 ledgers in the ring", async {
        while relay.relay.ring.range().map(|r| r.1) < Some(41) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let (got, per_lane) = raw_session(&relay, 4, 2, want.len(), true).await;
    assert_identical(&got, &want, 2);
    assert!(
        per_lane.iter().all(|n| *n > 0),
        "every lane carried data: {per_lane:?}"
    );
    let resent = relay
        .relay
        .metrics
        .resent_chunks_total
        .load(std::sync::atomic::Ordering::Relaxed);
    eprintln!("frames per lane {per_lane:?}, relay resent {resent} items");
    assert!(resent >= 1, "the stalled lane's open stream was sent again");
    relay.stop().await;
}

fn base_args(dir: &Path) -> RunArgs {
    RunArgs {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        certs: Some(dir.join("certs")),
        data_dir: Some(dir.join("data")),
        source: Some("synthetic".into()),
        ..RunArgs::default()
    }
}

#[test]
fn settings_from_flags_and_the_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let c = RelayConfig::from_args(base_args(dir.path())).unwrap();
    assert!(!c.pipeline.store_and_forward, "chunked by default");
    assert_eq!(
        c.server.session.streams_per_lane, None,
        "unlimited by default"
    );

    let file = dir.path().join("relay.toml");
    let with_file = |text: &str| {
        std::fs::write(&file, text).unwrap();
        RelayConfig::from_args(RunArgs {
            config: Some(file.clone()),
            ..base_args(dir.path())
        })
    };
    let c = with_file("store_and_forward = true\nstreams_per_lane = 4\n").unwrap();
    assert!(c.pipeline.store_and_forward);
    assert_eq!(c.server.session.streams_per_lane, Some(4));
    let c = with_file("store_and_forward = false\n").unwrap();
    assert!(!c.pipeline.store_and_forward);
    // A flag wins over the file.
    std::fs::write(&file, "streams_per_lane = 4\n").unwrap();
    let c = RelayConfig::from_args(RunArgs {
        config: Some(file.clone()),
        streams_per_lane: Some(2),
        store_and_forward: true,
        ..base_args(dir.path())
    })
    .unwrap();
    assert_eq!(c.server.session.streams_per_lane, Some(2));
    assert!(c.pipeline.store_and_forward);

    for (text, expect) in [
        (
            "streams_per_lane = 0\n",
            "--streams-per-lane 0: expected 1..=1024",
        ),
        (
            "streams_per_lane = 1025\n",
            "--streams-per-lane 1025: expected 1..=1024",
        ),
        ("streams_per_lane = -1\n", "streams_per_lane"),
        ("streams_per_lane = \"many\"\n", "streams_per_lane"),
        ("store_and_forward = \"yes\"\n", "store_and_forward"),
        ("store_and_forward = 1\n", "store_and_forward"),
    ] {
        let e = format!("{:#}", with_file(text).unwrap_err());
        assert!(e.contains(expect), "{text:?}: {e}");
    }
}
