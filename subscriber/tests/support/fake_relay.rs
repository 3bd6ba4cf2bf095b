//! A tiny relay for tests: real QUIC and mutual TLS on loopback, the protocol of
//! `docs/protocol.md`, and knobs to misbehave (close mid-stream, drop chunks, tamper, refuse).

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use ledger_relay_subscriber::frame::{
    Chunk, ChunkHeader, ErrorCode, ErrorFrame, Frame, Heartbeat, LedgerEnd, Resend, SessionAccept,
    SessionOpen, Start,
};
use ledger_relay_transport::{self as transport, FrameIo, TransportSettings};
use ledger_relay_wire::compress::{Codec, Compressor};
use ledger_relay_wire::core_http::{CoreRequest, CoreResponse, Origin};
use ledger_relay_wire::Limits;
use quinn::VarInt;
use rustls::server::WebPkiClientVerifier;
use tokio::sync::watch;

/// What the fake relay serves and how it misbehaves.
#[derive(Clone)]
pub struct Plan {
    /// Consecutive ledgers; the first one's sequence is read from its header.
    pub ledgers: Vec<Bytes>,
    /// Lanes granted at most.
    pub max_lanes: u8,
    /// Raw bytes per chunk.
    pub chunk_size: usize,
    /// Heartbeat interval.
    pub heartbeat_ms: u32,
    /// Window (ledgers in flight).
    pub window: u16,
    /// Compress chunks with zstd (else raw).
    pub zstd: bool,
    /// Answer every SessionOpen with Error BelowRetention.
    pub below_retention: bool,
    /// First session only: answer SessionOpen with an Error of this code and message (a
    /// relay's text, which a hostile relay chooses).
    pub refuse_first: Option<(ErrorCode, String)>,
    /// First session only: after this many ledgers are acknowledged, send this Error (code,
    /// oldest, newest; by default ShuttingDown) and close.
    pub close_after: Option<usize>,
    /// The Error `close_after` sends.
    pub close_with: (ErrorCode, u32, u32),
    /// First session only: after this many ledgers are sent, close lane 1's connection.
    pub kill_lane1_after: Option<usize>,
    /// Chunks (seq, index) not sent the first time (only a Resend brings them).
    pub drop_chunks: Vec<(u32, u32)>,
    /// Flip a byte of chunk 0 of this ledger (sent raw).
    pub tamper: Option<u32>,
    /// Lie about every ledger: send it as one raw chunk with this byte flipped, and the true
    /// ledger's end record.
    pub forge: Option<usize>,
    /// Send no end records: a ledger never completes (heartbeats go on).
    pub no_ends: bool,
    /// Declare chunk 1 of this ledger one byte further on than it is (its framing is wrong).
    pub misplace: Option<u32>,
    /// Accept sessions, then say nothing at all (no heartbeats, no data).
    pub silent: bool,
    /// Send no heartbeats (data only).
    pub no_heartbeats: bool,
    /// Wait this long before sending each ledger.
    pub pace: Option<Duration>,
    /// Never read a session's control stream after its `SessionOpen`: acks and resends pile up
    /// in flow control, and no more than the first window of ledgers is sent.
    pub deaf: bool,
    /// Flow-control credit, in bytes, the relay gives each stream and each connection of a
    /// subscriber (what a deaf relay lets the subscriber write before its writes block).
    pub control_credit: Option<u64>,
    /// How `CoreRequest`s are answered; `None`: a request connection is closed with
    /// `ProtocolViolation`, as by a relay that forwards nothing to stellar-core.
    pub core: Option<CoreFake>,
    /// Accept the first session, then hoard: open data streams and never finish one.
    pub hoard: Option<Hoard>,
}

/// A relay that makes a subscriber hold partial frames: once `start` is notified, it opens
/// `streams` data streams on lane 0 at once, each a `Chunk` frame of the largest size
/// (`max_chunk_raw`, raw), writes `bytes_each` bytes of it and never the rest; heartbeats go
/// on, announcing no ledger, so the session stays up.
#[derive(Clone)]
pub struct Hoard {
    pub streams: usize,
    pub bytes_each: usize,
    pub start: Arc<tokio::sync::Notify>,
}

/// How the fake relay answers requests for stellar-core (in place of the relay's forwarding).
#[derive(Clone)]
pub struct CoreFake {
    /// The answer to each request.
    pub answer: Arc<dyn Fn(&CoreRequest) -> CoreResponse + Send + Sync>,
    /// Wait this long before answering each request.
    pub delay: Duration,
    /// Answer every request with this many zero bytes instead of a frame.
    pub oversize: Option<usize>,
    /// Close each request connection (code `ShuttingDown`) after answering this many requests
    /// on it.
    pub close_after: Option<usize>,
}

impl CoreFake {
    /// Answers every request with 200 `application/json` and a JSON echo of it: `relay` (the
    /// tag), `port`, `method`, `target`, `content_type`, `timeout_ms` and `body` (as text).
    pub fn echo(tag: &str) -> CoreFake {
        let tag = tag.to_owned();
        CoreFake::answering(move |r| CoreResponse {
            status: 200,
            origin: Origin::Core,
            content_type: "application/json".into(),
            body: Bytes::from(echo_json(&tag, r).to_string()),
        })
    }

    /// Answers every request with `answer`.
    pub fn answering(
        answer: impl Fn(&CoreRequest) -> CoreResponse + Send + Sync + 'static,
    ) -> CoreFake {
        CoreFake {
            answer: Arc::new(answer),
            delay: Duration::ZERO,
            oversize: None,
            close_after: None,
        }
    }
}

/// The JSON [`CoreFake::echo`] answers `r` with.
pub fn echo_json(tag: &str, r: &CoreRequest) -> serde_json::Value {
    serde_json::json!({
        "relay": tag,
        "port": r.port.name(),
        "method": r.method.as_str(),
        "target": r.target,
        "content_type": r.content_type,
        "timeout_ms": r.timeout_ms,
        "body": String::from_utf8_lossy(&r.body),
    })
}

impl Plan {
    pub fn new(ledgers: Vec<Bytes>) -> Plan {
        Plan {
            ledgers,
            max_lanes: 4,
            chunk_size: 1024,
            heartbeat_ms: 100,
            window: 8,
            zstd: true,
            below_retention: false,
            refuse_first: None,
            close_after: None,
            close_with: (ErrorCode::ShuttingDown, 0, 0),
            kill_lane1_after: None,
            drop_chunks: Vec::new(),
            tamper: None,
            forge: None,
            no_ends: false,
            misplace: None,
            silent: false,
            no_heartbeats: false,
            pace: None,
            deaf: false,
            control_credit: None,
            core: None,
            hoard: None,
        }
    }
}

/// What the fake relay saw.
#[derive(Debug, Default, Clone)]
pub struct Record {
    /// Connections that reached the relay (including ones whose TLS handshake failed).
    pub incoming: usize,
    /// Connections whose handshake failed.
    pub handshake_failures: usize,
    /// SessionOpen frames received.
    pub opens: Vec<SessionOpen>,
    /// LaneJoin frames received: lane and the connection's remote address.
    pub joins: Vec<(u8, SocketAddr)>,
    /// Remote addresses of lane 0 connections.
    pub lane0_peers: Vec<SocketAddr>,
    /// Resend frames received.
    pub resends: Vec<Resend>,
    /// Highest Ack received.
    pub acked: u32,
    /// Request connections (first stream a `CoreRequest`).
    pub core_connections: usize,
    /// `CoreRequest`s received, in the order they arrived.
    pub core_requests: Vec<CoreRequest>,
    /// Most requests being answered at once.
    pub core_peak: usize,
    /// Bytes a hoarding relay has written to its streams (taken by its QUIC stack).
    pub hoarded: u64,
}

/// A ledger cut and encoded as the relay sends it.
struct Prepared {
    seq: u32,
    chunks: Vec<Frame>,
    end: Frame,
}

fn prepare(plan: &Plan) -> Vec<Prepared> {
    let mut compressor = Compressor::new(if plan.zstd { Codec::Zstd } else { Codec::None }, 1);
    plan.ledgers
        .iter()
        .map(|data| {
            let info = ledger_relay_wire::header::peek_header(data)
                .unwrap()
                .unwrap();
            let seq = info.ledger_seq;
            let chunk_size = match plan.forge {
                Some(_) => data.len(),
                None => plan.chunk_size,
            };
            let (raw_chunks, summary) = ledger_relay_wire::chunker::chunk_ledger(data, chunk_size);
            let chunks = raw_chunks
                .iter()
                .map(|c| {
                    let (codec, payload) = if let Some(at) = plan.forge {
                        let mut bad = c.data.to_vec();
                        bad[at] ^= 0x01;
                        (Codec::None, Bytes::from(bad))
                    } else if plan.tamper == Some(seq) && c.index == 0 {
                        let mut bad = c.data.to_vec();
                        let mid = bad.len() / 2;
                        bad[mid] ^= 0x55;
                        (Codec::None, Bytes::from(bad))
                    } else {
                        compressor.compress(&c.data)
                    };
                    Frame::Chunk(Chunk {
                        header: ChunkHeader {
                            seq,
                            index: c.index,
                            raw_offset: c.offset
                                + u64::from(plan.misplace == Some(seq) && c.index == 1),
                            raw_len: c.data.len() as u32,
                            codec,
                        },
                        payload,
                    })
                })
                .collect();
            let now = now_ns();
            let end = Frame::LedgerEnd(LedgerEnd {
                seq,
                chunk_count: summary.chunk_count,
                raw_len: summary.raw_len,
                checksum: summary.checksum,
                header_hash: info.hash,
                previous_hash: info.previous_hash,
                first_byte_ns: now,
                last_byte_ns: now,
            });
            Prepared { seq, chunks, end }
        })
        .collect()
}

use ledger_relay_transport::now_ns;

/// A running fake relay; dropped, it stops.
pub struct FakeRelay {
    pub addr: SocketAddr,
    record: Arc<Mutex<Record>>,
    endpoint: quinn::Endpoint,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeRelay {
    fn drop(&mut self) {
        self.endpoint.close(VarInt::from_u32(0), b"test over");
        self.task.abort();
    }
}

struct Shared {
    plan: Plan,
    prepared: Vec<Prepared>,
    record: Arc<Mutex<Record>>,
    /// Lanes of each session, by session id (index = lane number).
    sessions: Mutex<HashMap<u64, Vec<Option<quinn::Connection>>>>,
    /// Sessions opened so far (misbehaviour applies to the first).
    opened: Mutex<u64>,
    /// Requests being answered now.
    core_in_flight: AtomicUsize,
}

impl FakeRelay {
    /// Starts a relay with the server certificate `relay` from `server_pki`, trusting client
    /// certificates issued by the CA in `client_ca_dir`.
    pub fn start(plan: Plan, server_pki: &Path, client_ca_dir: &Path) -> FakeRelay {
        let provider = transport::crypto_provider();
        let mut roots = rustls::RootCertStore::empty();
        for cert in ledger_relay_certs::load_certs(&client_ca_dir.join("ca.pem")).unwrap() {
            roots.add(cert).unwrap();
        }
        let crls = ledger_relay_certs::load_crls(&client_ca_dir.join("crl.pem")).unwrap();
        let verifier =
            WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                .with_crls(crls)
                .build()
                .unwrap();
        let mut tls = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_client_cert_verifier(verifier)
            .with_single_cert(
                ledger_relay_certs::load_certs(&server_pki.join("relay.pem")).unwrap(),
                ledger_relay_certs::load_key(&server_pki.join("relay.key")).unwrap(),
            )
            .unwrap();
        tls.alpn_protocols = vec![ledger_relay_wire::ALPN.to_vec()];
        let mut server = quinn::ServerConfig::with_crypto(Arc::new(
            quinn::crypto::rustls::QuicServerConfig::try_from(tls).unwrap(),
        ));
        let settings = TransportSettings::default();
        let mut server_settings = settings.clone();
        if let Some(credit) = plan.control_credit {
            server_settings.stream_receive_window = credit;
            server_settings.receive_window = credit;
        }
        server.transport_config(Arc::new(transport::transport_config(&server_settings)));
        let socket = transport::udp_socket("127.0.0.1:0".parse().unwrap(), &settings).unwrap();
        let endpoint = transport::endpoint(socket, Some(server), &settings).unwrap();
        let addr = endpoint.local_addr().unwrap();
        let record = Arc::new(Mutex::new(Record::default()));
        let shared = Arc::new(Shared {
            prepared: prepare(&plan),
            plan,
            record: record.clone(),
            sessions: Mutex::new(HashMap::new()),
            opened: Mutex::new(0),
            core_in_flight: AtomicUsize::new(0),
        });
        let ep = endpoint.clone();
        let task = tokio::spawn(async move {
            while let Some(incoming) = ep.accept().await {
                shared.record.lock().unwrap().incoming += 1;
                let shared = shared.clone();
                tokio::spawn(async move {
                    let conn = match incoming.await {
                        Ok(c) => c,
                        Err(_) => {
                            shared.record.lock().unwrap().handshake_failures += 1;
                            return;
                        }
                    };
                    let _ = handle(shared, conn).await;
                });
            }
        });
        FakeRelay {
            addr,
            record,
            endpoint,
            task,
        }
    }

    pub fn record(&self) -> Record {
        self.record.lock().unwrap().clone()
    }
}

type Res = Result<(), Box<dyn std::error::Error + Send + Sync>>;

async fn handle(shared: Arc<Shared>, conn: quinn::Connection) -> Res {
    let (send, recv) = match conn.accept_bi().await {
        Ok(s) => s,
        Err(_) => {
            // TLS 1.3: a client certificate the verifier refused fails here on the server.
            shared.record.lock().unwrap().handshake_failures += 1;
            return Ok(());
        }
    };
    let mut io = FrameIo::new(send, recv, Limits::default());
    match io.reader.next().await? {
        Some(Frame::SessionOpen(open)) => serve(shared, conn, io, open).await,
        Some(Frame::CoreRequest(first)) => serve_core(shared, conn, io, first).await,
        Some(Frame::LaneJoin(join)) => {
            shared
                .record
                .lock()
                .unwrap()
                .joins
                .push((join.lane, conn.remote_address()));
            {
                let mut sessions = shared.sessions.lock().unwrap();
                let lanes = sessions
                    .get_mut(&join.session_id)
                    .ok_or("unknown session")?;
                let slot = lanes.get_mut(usize::from(join.lane)).ok_or("bad lane")?;
                *slot = Some(conn.clone());
            }
            io.writer.write(&Frame::LaneAccept(join.lane)).await?;
            // Keep the lane's control stream open for the life of the connection.
            conn.closed().await;
            drop(io);
            Ok(())
        }
        _ => Err("unexpected first frame".into()),
    }
}

async fn serve(
    shared: Arc<Shared>,
    conn: quinn::Connection,
    mut io: FrameIo,
    open: SessionOpen,
) -> Res {
    let plan = &shared.plan;
    let session_no = {
        let mut opened = shared.opened.lock().unwrap();
        *opened += 1;
        *opened
    };
    let first_session = session_no == 1;
    {
        let mut r = shared.record.lock().unwrap();
        r.opens.push(open.clone());
        r.lane0_peers.push(conn.remote_address());
    }
    let oldest = shared.prepared[0].seq;
    let newest = shared.prepared.last().unwrap().seq;
    let refusal = match &plan.refuse_first {
        Some((code, message)) if first_session => Some((*code, message.clone())),
        _ if plan.below_retention => {
            Some((ErrorCode::BelowRetention, "start is below the ring".into()))
        }
        _ => None,
    };
    if let Some((code, message)) = refusal {
        let error = ErrorFrame {
            code,
            oldest,
            newest,
            message,
        };
        transport::close_with_error(
            &conn,
            io.writer.stream_mut(),
            &error,
            Duration::from_secs(1),
        )
        .await;
        return Ok(());
    }
    let first_seq = match open.start {
        Start::Tip => oldest,
        Start::Seq(s) => s,
    };
    if let Some(hoard) = plan.hoard.clone().filter(|_| first_session) {
        return hoard_streams(shared.clone(), conn, io, first_seq, hoard).await;
    }
    let lanes = open.lanes.min(plan.max_lanes);
    let session_id = 1000 + session_no;
    shared.sessions.lock().unwrap().insert(session_id, {
        let mut v = vec![None; usize::from(lanes)];
        v[0] = Some(conn.clone());
        v
    });
    io.writer
        .write(&Frame::SessionAccept(SessionAccept {
            version: 1,
            session_id,
            token: [7; 16],
            lanes,
            first_seq,
            oldest,
            newest,
            chunk_size: plan.chunk_size as u32,
            window: plan.window.min(open.window),
            heartbeat_ms: plan.heartbeat_ms,
            max_chunk_raw: 4 << 20,
            max_ledger_raw: 256 << 20,
        }))
        .await?;
    if plan.silent {
        conn.closed().await;
        return Ok(());
    }

    // Give the other lanes a moment to join, so data is striped across them.
    for _ in 0..50 {
        let joined = shared.sessions.lock().unwrap()[&session_id]
            .iter()
            .filter(|l| l.is_some())
            .count();
        if joined == usize::from(lanes) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let FrameIo { mut reader, writer } = io;
    let writer = Arc::new(tokio::sync::Mutex::new(writer));
    let (acked_tx, mut acked_rx) = watch::channel(first_seq - 1);
    let (resend_tx, mut resend_rx) = tokio::sync::mpsc::unbounded_channel::<Resend>();

    // Control: acks and resends (a deaf relay holds the stream and reads nothing).
    let record = shared.record.clone();
    let deaf = plan.deaf;
    let control = tokio::spawn(async move {
        if deaf {
            std::future::pending::<()>().await;
        }
        while let Ok(Some(frame)) = reader.next().await {
            match frame {
                Frame::Ack(seq) => {
                    record.lock().unwrap().acked = seq;
                    let _ = acked_tx.send(seq);
                }
                Frame::Resend(r) => {
                    record.lock().unwrap().resends.push(r.clone());
                    let _ = resend_tx.send(r);
                }
                _ => {}
            }
        }
    });
    // Heartbeats.
    let hb_writer = writer.clone();
    let heartbeat_ms = plan.heartbeat_ms;
    let no_heartbeats = plan.no_heartbeats;
    let heartbeats = tokio::spawn(async move {
        if no_heartbeats {
            return;
        }
        loop {
            let hb = Frame::Heartbeat(Heartbeat {
                newest,
                oldest,
                time_ns: now_ns(),
            });
            if hb_writer.lock().await.write(&hb).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(u64::from(heartbeat_ms))).await;
        }
    });
    // Resends, on lane 0.
    let resend_shared = shared.clone();
    let resend_conn = conn.clone();
    let resends = tokio::spawn(async move {
        while let Some(r) = resend_rx.recv().await {
            let Some(p) = resend_shared.prepared.iter().find(|p| p.seq == r.seq) else {
                continue;
            };
            let end = (!resend_shared.plan.no_ends).then_some(&p.end);
            let frames: Vec<&Frame> = if r.whole {
                p.chunks.iter().chain(end).collect()
            } else {
                r.indices
                    .iter()
                    .filter_map(|&i| p.chunks.get(i as usize))
                    .collect()
            };
            for f in frames {
                if send_frame(&resend_conn, f).await.is_err() {
                    return;
                }
            }
        }
    });

    let start_index = shared
        .prepared
        .iter()
        .position(|p| p.seq == first_seq)
        .unwrap_or(shared.prepared.len());
    let dropped: HashSet<(u32, u32)> = plan.drop_chunks.iter().copied().collect();
    let mut next_lane = 0usize;
    let mut sent = 0usize;
    let result: Res = async {
        for p in &shared.prepared[start_index..] {
            // The window: never send s before s - window is acknowledged.
            let window = u32::from(plan.window.min(open.window));
            while *acked_rx.borrow() + window < p.seq {
                acked_rx.changed().await?;
            }
            if let Some(pace) = plan.pace {
                tokio::time::sleep(pace).await;
            }
            let lanes_now: Vec<quinn::Connection> = shared.sessions.lock().unwrap()[&session_id]
                .iter()
                .flatten()
                .filter(|c| c.close_reason().is_none())
                .cloned()
                .collect();
            for (i, chunk) in p.chunks.iter().enumerate() {
                if first_session && dropped.contains(&(p.seq, i as u32)) {
                    continue;
                }
                let lane = &lanes_now[next_lane % lanes_now.len()];
                next_lane += 1;
                send_frame(lane, chunk).await?;
            }
            if !plan.no_ends {
                send_frame(&lanes_now[next_lane % lanes_now.len()], &p.end).await?;
                next_lane += 1;
            }
            sent += 1;
            if first_session && plan.kill_lane1_after == Some(sent) {
                if let Some(Some(lane1)) = shared.sessions.lock().unwrap()[&session_id].get(1) {
                    lane1.close(VarInt::from_u32(0), b"lane killed by test");
                }
            }
            if first_session && plan.close_after == Some(sent) {
                while *acked_rx.borrow() < p.seq {
                    acked_rx.changed().await?;
                }
                let (code, oldest, newest) = plan.close_with;
                let error = ErrorFrame {
                    code,
                    oldest,
                    newest,
                    message: "test relay stopping".into(),
                };
                let mut writer = writer.lock().await;
                transport::close_with_error(
                    &conn,
                    writer.stream_mut(),
                    &error,
                    Duration::from_secs(1),
                )
                .await;
                return Ok(());
            }
        }
        conn.closed().await;
        Ok(())
    }
    .await;
    control.abort();
    heartbeats.abort();
    resends.abort();
    result
}

/// A request connection: answers the first request on its stream, then every stream the
/// client opens, each concurrently.
async fn serve_core(
    shared: Arc<Shared>,
    conn: quinn::Connection,
    io: FrameIo,
    first: CoreRequest,
) -> Res {
    let Some(fake) = shared.plan.core.clone() else {
        conn.close(
            VarInt::from_u32(ErrorCode::ProtocolViolation.close_code()),
            b"no core requests here",
        );
        return Ok(());
    };
    shared.record.lock().unwrap().core_connections += 1;
    let answered = Arc::new(AtomicUsize::new(0));
    let FrameIo { reader, mut writer } = io;
    drop(reader);
    let (s, f, c, a) = (shared.clone(), fake.clone(), conn.clone(), answered.clone());
    tokio::spawn(async move { answer_core(&s, &f, &c, &a, first, writer.stream_mut()).await });
    let limits = Limits::default();
    while let Ok((mut send, mut recv)) = conn.accept_bi().await {
        let (s, f, c, a) = (shared.clone(), fake.clone(), conn.clone(), answered.clone());
        let limits = limits.clone();
        tokio::spawn(async move {
            let bytes = recv.read_to_end(limits.max_core_frame_len()).await.ok()?;
            match ledger_relay_wire::frame::decode_exact(bytes.into(), &limits) {
                Ok(Frame::CoreRequest(req)) => answer_core(&s, &f, &c, &a, req, &mut send).await,
                _ => c.close(
                    VarInt::from_u32(ErrorCode::ProtocolViolation.close_code()),
                    b"not a core request",
                ),
            }
            Some(())
        });
    }
    Ok(())
}

async fn answer_core(
    shared: &Shared,
    fake: &CoreFake,
    conn: &quinn::Connection,
    answered: &AtomicUsize,
    req: CoreRequest,
    send: &mut quinn::SendStream,
) {
    let now = shared.core_in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    {
        let mut r = shared.record.lock().unwrap();
        r.core_requests.push(req.clone());
        r.core_peak = r.core_peak.max(now);
    }
    tokio::time::sleep(fake.delay).await;
    shared.core_in_flight.fetch_sub(1, Ordering::SeqCst);
    let wrote = match fake.oversize {
        Some(n) => send.write_all(&vec![0u8; n]).await.is_ok() && send.finish().is_ok(),
        None => {
            let frame = Frame::CoreResponse((fake.answer)(&req));
            transport::write_single_frame(send, &frame).await.is_ok()
        }
    };
    let n = answered.fetch_add(1, Ordering::SeqCst) + 1;
    if wrote && fake.close_after == Some(n) {
        // Let the answer reach the client before the connection goes.
        let _ = tokio::time::timeout(Duration::from_secs(1), send.stopped()).await;
        conn.close(
            VarInt::from_u32(ErrorCode::ShuttingDown.close_code()),
            b"test relay stopping",
        );
    }
}

async fn send_frame(conn: &quinn::Connection, frame: &Frame) -> Res {
    let mut stream = conn.open_uni().await?;
    transport::write_single_frame(&mut stream, frame).await?;
    Ok(())
}

/// Serves a session as [`Hoard`] says.
async fn hoard_streams(
    shared: Arc<Shared>,
    conn: quinn::Connection,
    mut io: FrameIo,
    first_seq: u32,
    hoard: Hoard,
) -> Res {
    let max_chunk_raw: u32 = 4 << 20;
    io.writer
        .write(&Frame::SessionAccept(SessionAccept {
            version: 1,
            session_id: 1,
            token: [7; 16],
            lanes: 1,
            first_seq,
            oldest: first_seq - 1,
            newest: first_seq - 1,
            chunk_size: max_chunk_raw,
            window: 8,
            heartbeat_ms: shared.plan.heartbeat_ms,
            max_chunk_raw,
            max_ledger_raw: 256 << 20,
        }))
        .await?;
    let heartbeats = async {
        loop {
            let hb = Frame::Heartbeat(Heartbeat {
                newest: first_seq - 1,
                oldest: first_seq - 1,
                time_ns: now_ns(),
            });
            io.writer.write(&hb).await?;
            tokio::time::sleep(Duration::from_millis(u64::from(shared.plan.heartbeat_ms))).await;
        }
    };
    let streams = async {
        hoard.start.notified().await;
        let writers = (0..hoard.streams).map(|i| {
            let (conn, shared) = (conn.clone(), shared.clone());
            async move {
                let mut stream = conn.open_uni().await?;
                let header = ChunkHeader {
                    seq: first_seq,
                    index: i as u32,
                    raw_offset: u64::from(max_chunk_raw) * i as u64,
                    raw_len: max_chunk_raw,
                    codec: Codec::None,
                };
                stream
                    .write_all(&header.frame_prefix(max_chunk_raw as usize))
                    .await?;
                let piece = vec![0x5a; 64 << 10];
                let mut left = hoard.bytes_each;
                while left > 0 {
                    let n = left.min(piece.len());
                    stream.write_all(&piece[..n]).await?;
                    shared.record.lock().unwrap().hoarded += n as u64;
                    left -= n;
                }
                // Never finished: the stream stays open with its frame cut short.
                std::future::pending::<()>().await;
                Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
            }
        });
        futures::future::join_all(writers).await;
        Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
    };
    tokio::select! {
        r = heartbeats => r,
        r = streams => r,
        _ = conn.closed() => Ok(()),
    }
}
