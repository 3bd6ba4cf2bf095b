//! One session with one relay: lane 0 opens it, lanes 1..N join it, data from every lane goes
//! through the reassembler and the verifier to the consumer, acks and resends go back on lane
//! 0's control stream (`docs/protocol.md` sections 2 to 4).
//!
//! Tasks: one per lane for its data streams (and, for lanes 1..N, its join and control
//! stream), one for lane 0's control stream. They feed the session loop over two channels:
//! data frames (bounded, paused when the consumer is slow) and control events (always read).

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use ledger_relay_wire::compress::{self, Codec};
use ledger_relay_wire::frame::{
    ErrorCode, ErrorFrame, Frame, LaneJoin, Resend, SessionAccept, SessionOpen, Start,
};
use ledger_relay_wire::{AssembledLedger, AssemblyError, Limits, Reassembler, PROTOCOL_VERSION};
use quinn::VarInt;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::client::{Item, Ledger, Shared};
use crate::config::RelayAddr;
use crate::error::{
    classify_connection, classify_error_frame, classify_frame_io, ErrorChain, Failure,
    SubscribeError, Transient,
};
use crate::verify::Verifier;
use ledger_relay_transport::{
    self as transport, read_single_frame, FrameIo, FrameIoError, FrameReader, FrameWriter,
};

/// Data streams read but not yet taken by the session loop, across all lanes. Each holds at
/// most one chunk (256 KiB by default), so this bounds what sits between QUIC's buffers and
/// the reassembler (64 MiB at the default chunk size); when the loop pauses, readers stop
/// accepting streams and QUIC flow control pushes back on the relay.
const STREAM_PERMITS: usize = 256;

/// Control events buffered from the lanes' control streams and lane tasks.
const CONTROL_QUEUE: usize = 64;

/// How long teardown waits for the relay to acknowledge our `Error` frame.
const ERROR_LINGER: Duration = Duration::from_millis(100);

/// How long teardown waits for the lanes' close frames to go out.
const CLOSE_LINGER: Duration = Duration::from_millis(500);

/// How a session ended.
#[derive(Debug)]
pub(crate) enum End {
    /// The consumer went away or the subscription was closed.
    Stopped,
    /// Reconnect after backoff.
    Retry(Transient),
    /// Return to the consumer and stop.
    Fatal(SubscribeError),
}

impl From<Failure> for End {
    fn from(f: Failure) -> Self {
        match f {
            Failure::Fatal(e) => End::Fatal(e),
            Failure::Transient(t) => End::Retry(t),
        }
    }
}

/// What a session did.
#[derive(Debug)]
pub(crate) struct Outcome {
    pub(crate) end: End,
    /// Ledgers handed to the consumer in this session.
    pub(crate) delivered: u64,
}

/// A connected lane.
#[derive(Debug, Clone)]
struct LaneConn {
    endpoint: quinn::Endpoint,
    conn: quinn::Connection,
}

/// A data frame from a lane, with the permit that bounds how many are held.
struct DataFrame {
    /// The frame, with a chunk's payload already decompressed (codec `None`); or why its
    /// payload does not decompress.
    frame: Result<Frame, AssemblyError>,
    /// The chunk payload's size on the wire (compressed), for `Ledger::wire_bytes`.
    wire_len: u64,
    _permit: OwnedSemaphorePermit,
}

/// Events from lane tasks and lane 0's control stream.
enum Ctl {
    /// A frame on lane 0's control stream.
    Control(Frame),
    /// Lane 0's control stream ended or failed.
    ControlEnded(Failure),
    /// Lane `lane` joined.
    LaneUp { lane: u8, conn: LaneConn },
    /// Lane `lane` failed. Lane 0's failure ends the session, as does a protocol violation or
    /// a terminal failure on any lane; other lanes rejoin by themselves.
    LaneDown { lane: u8, failure: Failure },
}

/// Who the session talks to, for lane tasks and error classification.
#[derive(Clone)]
struct Peer {
    shared: Arc<Shared>,
    /// The relay as configured.
    name: String,
    /// The TLS server name.
    server_name: String,
    /// The resolved address.
    addr: SocketAddr,
    /// The ledger needed next, for `BelowRetention`: the start asked for (0 for the tip), then
    /// the ledger after the last one delivered.
    requested: u32,
}

impl Peer {
    fn classify(&self, e: &quinn::ConnectionError) -> Failure {
        classify_connection(&self.name, self.addr, self.requested, e)
    }

    fn classify_io(&self, e: FrameIoError) -> Failure {
        classify_frame_io(&self.name, self.addr, self.requested, e)
    }

    fn violation(&self, detail: impl Into<String>) -> Failure {
        Transient::Protocol {
            relay: self.addr,
            detail: detail.into(),
        }
        .into()
    }

    fn timeout(&self, what: impl Into<String>) -> Failure {
        Transient::Timeout {
            relay: self.addr,
            what: what.into(),
        }
        .into()
    }

    /// Binds lane `lane`'s own socket and endpoint and completes the QUIC handshake.
    async fn connect_lane(&self, lane: u8) -> Result<LaneConn, Failure> {
        let config = &self.shared.config;
        let ip: std::net::IpAddr = if self.addr.is_ipv4() {
            std::net::Ipv4Addr::UNSPECIFIED.into()
        } else {
            std::net::Ipv6Addr::UNSPECIFIED.into()
        };
        let local = SocketAddr::new(ip, config.lane_port(lane).unwrap_or(0));
        let bind = |source| Transient::Bind {
            addr: local,
            source,
        };
        let socket = transport::udp_socket(local, &config.transport).map_err(bind)?;
        let endpoint = transport::endpoint(socket, None).map_err(bind)?;
        let connecting = endpoint
            .connect_with(self.shared.client.clone(), self.addr, &self.server_name)
            .map_err(|source| Transient::Connect {
                relay: self.addr,
                source,
            })?;
        let conn = connecting.await.map_err(|e| self.classify(&e))?;
        tracing::debug!(lane, relay = %self.addr, local = ?endpoint.local_addr().ok(), "lane connected");
        Ok(LaneConn { endpoint, conn })
    }

    /// Opens the lane's control stream. In TLS 1.3 a relay that rejects our certificate does so
    /// after our handshake completed: the failure shows here or on the first read.
    async fn open_control(&self, lane: &LaneConn) -> Result<FrameIo, Failure> {
        let (send, recv) = lane.conn.open_bi().await.map_err(|e| self.classify(&e))?;
        Ok(FrameIo::new(send, recv, self.shared.config.limits.clone()))
    }

    /// Waits for the relay's answer on a control stream, bounded by `accept_timeout`.
    async fn answer(&self, reader: &mut FrameReader, what: &str) -> Result<Frame, Failure> {
        match tokio::time::timeout(self.shared.config.accept_timeout, reader.next()).await {
            Err(_) => Err(self.timeout(format!("no answer to {what}"))),
            Ok(Err(e)) => Err(self.classify_io(e)),
            Ok(Ok(None)) => Err(Transient::Closed { relay: self.addr }.into()),
            Ok(Ok(Some(Frame::Error(e)))) => Err(classify_error_frame(
                &self.name,
                self.addr,
                self.requested,
                &e,
            )),
            Ok(Ok(Some(frame))) => Ok(frame),
        }
    }
}

/// Runs one session with `relay` from `start`, delivering verified ledgers to `tx`.
pub(crate) async fn run(
    shared: &Arc<Shared>,
    relay: &RelayAddr,
    start: Start,
    verifier: &mut Verifier,
    tx: &mpsc::Sender<Item>,
    cancel: &CancellationToken,
) -> Outcome {
    let opened = tokio::select! {
        r = open(shared, relay, start) => r,
        _ = cancel.cancelled() => return Outcome { end: End::Stopped, delivered: 0 },
    };
    let (peer, lane0, io, accept) = match opened {
        Ok(x) => x,
        Err(failure) => {
            return Outcome {
                end: failure.into(),
                delivered: 0,
            }
        }
    };
    tracing::info!(
        relay = %peer.addr,
        session = accept.session_id,
        first = accept.first_seq,
        newest = accept.newest,
        lanes = accept.lanes,
        "session open"
    );
    // Nothing delivered yet: the first ledger must be the one the relay starts at (or the
    // anchor's).
    verifier.expect_first(accept.first_seq);
    let mut session = Session::new(peer, lane0, io, &accept, verifier, tx, cancel);
    let end = session.run().await;
    session.finish(end).await
}

/// Resolves the relay, connects lane 0 and exchanges `SessionOpen` / `SessionAccept`.
async fn open(
    shared: &Arc<Shared>,
    relay: &RelayAddr,
    start: Start,
) -> Result<(Peer, LaneConn, FrameIo, SessionAccept), Failure> {
    let config = &shared.config;
    let addr = relay.resolve().await.map_err(|source| Transient::Resolve {
        relay: relay.to_string(),
        source,
    })?;
    let peer = Peer {
        shared: shared.clone(),
        name: relay.to_string(),
        server_name: config.server_name_for(relay).to_owned(),
        addr,
        requested: match start {
            Start::Tip => 0,
            Start::Seq(s) => s,
        },
    };
    let lane0 = peer.connect_lane(0).await?;
    shared.lane0_connected(&peer.name, &lane0.conn);
    let result = async {
        let mut io = peer.open_control(&lane0).await?;
        let window = u16::try_from(config.limits.max_ledgers_in_flight).unwrap_or(u16::MAX);
        let open = Frame::SessionOpen(SessionOpen {
            version: PROTOCOL_VERSION,
            start,
            lanes: config.lanes,
            codecs: config.codec_mask(),
            window,
        });
        io.writer
            .write(&open)
            .await
            .map_err(|e| peer.classify_io(e))?;
        let accept = match peer.answer(&mut io.reader, "SessionOpen").await? {
            Frame::SessionAccept(a) => a,
            other => {
                return Err(peer.violation(format!(
                    "{} frame in answer to SessionOpen",
                    other.frame_type().name()
                )))
            }
        };
        check_accept(&accept, config.lanes, start, &config.limits)
            .map_err(|detail| peer.violation(detail))?;
        Ok((io, accept))
    }
    .await;
    match result {
        Ok((io, accept)) => Ok((peer, lane0, io, accept)),
        Err(failure) => {
            let code = match &failure {
                Failure::Transient(Transient::Protocol { .. }) => {
                    ErrorCode::ProtocolViolation.close_code()
                }
                _ => 0,
            };
            lane0
                .conn
                .close(VarInt::from_u32(code), b"session not opened");
            Err(failure)
        }
    }
}

/// Checks a `SessionAccept` against what was asked.
fn check_accept(a: &SessionAccept, lanes: u8, start: Start, limits: &Limits) -> Result<(), String> {
    if a.version != PROTOCOL_VERSION {
        return Err(format!("relay speaks protocol version {}", a.version));
    }
    if a.lanes == 0 || a.lanes > lanes {
        return Err(format!("relay granted {} lanes of {lanes} asked", a.lanes));
    }
    if a.first_seq == 0 {
        return Err("relay would start at ledger 0".into());
    }
    if let Start::Seq(s) = start {
        if a.first_seq != s {
            return Err(format!(
                "relay would start at ledger {} instead of {s}",
                a.first_seq
            ));
        }
    }
    if a.window == 0 || u32::from(a.window) > limits.max_ledgers_in_flight {
        return Err(format!(
            "relay window {} exceeds ours ({})",
            a.window, limits.max_ledgers_in_flight
        ));
    }
    if a.chunk_size == 0 || a.chunk_size > limits.max_chunk_raw.min(a.max_chunk_raw) {
        return Err(format!(
            "relay chunk size {} exceeds the limit ({})",
            a.chunk_size,
            limits.max_chunk_raw.min(a.max_chunk_raw)
        ));
    }
    if a.max_ledger_raw == 0 {
        return Err("relay declares a largest ledger of 0 bytes".into());
    }
    Ok(())
}

/// The session loop's state.
struct Session<'a> {
    peer: Peer,
    /// Lane 0's control stream, for `Ack`, `Resend` and `Error`.
    writer: FrameWriter,
    reasm: Reassembler,
    verifier: &'a mut Verifier,
    tx: &'a mpsc::Sender<Item>,
    cancel: &'a CancellationToken,
    /// Verified ledgers not yet taken by the consumer's channel.
    pending: VecDeque<Ledger>,
    /// At most this many pending before data reading pauses.
    pending_cap: usize,
    lanes: Vec<Option<LaneConn>>,
    tasks: JoinSet<()>,
    ctl_rx: mpsc::Receiver<Ctl>,
    data_rx: mpsc::Receiver<DataFrame>,
    start: Instant,
    heartbeat_timeout: Duration,
    last_heartbeat: Instant,
    progress_timeout: Duration,
    last_progress: Instant,
    behind_since: Option<Instant>,
    newest: u32,
    delivered: u64,
    /// Compressed payload bytes of the chunks taken so far, per open ledger (chunks are
    /// decompressed before the reassembler sees them, so it counts raw bytes).
    wire_bytes: HashMap<u32, u64>,
}

impl<'a> Session<'a> {
    fn new(
        peer: Peer,
        lane0: LaneConn,
        io: FrameIo,
        accept: &SessionAccept,
        verifier: &'a mut Verifier,
        tx: &'a mpsc::Sender<Item>,
        cancel: &'a CancellationToken,
    ) -> Session<'a> {
        let config = &peer.shared.config;
        // The relay declared the largest chunk and ledger it sends: hold it to that.
        let mut limits = config.limits.clone();
        limits.max_chunk_raw = limits.max_chunk_raw.min(accept.max_chunk_raw);
        limits.max_ledger_raw = limits.max_ledger_raw.min(accept.max_ledger_raw);
        let now = Instant::now();
        let heartbeat_timeout = config.heartbeat_timeout.unwrap_or_else(|| {
            Duration::from_millis(u64::from(accept.heartbeat_ms)).max(Duration::from_millis(100))
                * 3
        });
        let (ctl_tx, ctl_rx) = mpsc::channel(CONTROL_QUEUE);
        let (data_tx, data_rx) = mpsc::channel(STREAM_PERMITS);
        let permits = Arc::new(Semaphore::new(STREAM_PERMITS));
        let mut tasks = JoinSet::new();
        let FrameIo { reader, writer } = io;
        tasks.spawn(read_control(peer.clone(), reader, ctl_tx.clone()));
        {
            let (peer, conn, data_tx, permits, ctl_tx, limits) = (
                peer.clone(),
                lane0.conn.clone(),
                data_tx.clone(),
                permits.clone(),
                ctl_tx.clone(),
                limits.clone(),
            );
            tasks.spawn(async move {
                let failure = read_data(&peer, 0, &conn, &data_tx, &permits, &limits).await;
                let _ = ctl_tx.send(Ctl::LaneDown { lane: 0, failure }).await;
            });
        }
        let join = LaneJoin {
            version: PROTOCOL_VERSION,
            session_id: accept.session_id,
            token: accept.token,
            lane: 0,
        };
        for lane in 1..accept.lanes {
            tasks.spawn(run_lane(
                peer.clone(),
                LaneJoin {
                    lane,
                    ..join.clone()
                },
                ctl_tx.clone(),
                data_tx.clone(),
                permits.clone(),
                limits.clone(),
            ));
        }
        let mut lanes = vec![None; usize::from(accept.lanes)];
        lanes[0] = Some(lane0);
        {
            let mut status = peer.shared.status();
            status.relay = Some(peer.addr);
            status.lanes_granted = accept.lanes;
            status.lanes_up = 1;
            status.newest = accept.newest;
        }
        let window = limits.max_ledgers_in_flight;
        let reasm = Reassembler::new(limits, accept.first_seq, config.stall_timeout);
        Session {
            writer,
            reasm,
            verifier,
            tx,
            cancel,
            pending: VecDeque::new(),
            pending_cap: window as usize,
            lanes,
            tasks,
            ctl_rx,
            data_rx,
            start: now,
            heartbeat_timeout,
            last_heartbeat: now,
            progress_timeout: config.effective_progress_timeout(),
            last_progress: now,
            behind_since: (accept.newest >= accept.first_seq).then_some(now),
            newest: accept.newest,
            delivered: 0,
            wire_bytes: HashMap::new(),
            peer,
        }
    }
}

/// A step of the session loop: on `Err`, the loop stops (boxed: it is rare and large).
type Step<T = ()> = Result<T, Box<Exit>>;

/// Why the session loop stopped, and what to tell the relay.
struct Exit {
    end: End,
    /// Sent as an `Error` frame and as the close code (`docs/protocol.md` section 2, Closing).
    tell: Option<(ErrorCode, String)>,
}

impl Exit {
    fn stopped() -> Box<Exit> {
        Box::new(Exit {
            end: End::Stopped,
            tell: None,
        })
    }

    /// A protocol violation by the relay is told to it; other failures are the relay's own
    /// doing (it closed, it sent an `Error`) or the network's.
    fn failure(f: Failure) -> Box<Exit> {
        let tell = match &f {
            Failure::Transient(Transient::Protocol { detail, .. }) => {
                Some((ErrorCode::ProtocolViolation, detail.clone()))
            }
            _ => None,
        };
        Box::new(Exit {
            end: f.into(),
            tell,
        })
    }

    /// A terminal integrity failure: the relay sent data that does not check out.
    fn integrity(e: SubscribeError) -> Box<Exit> {
        let message = ErrorChain(&e).to_string();
        Box::new(Exit {
            end: End::Fatal(e),
            tell: Some((ErrorCode::ProtocolViolation, message)),
        })
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Wall clock, ns since the Unix epoch (0 if the clock is before it).
fn wall_clock_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

impl Session<'_> {
    fn now(&self) -> Duration {
        self.start.elapsed()
    }

    /// The loop: control events first (heartbeats, lane changes, errors), then timers, then
    /// handing ledgers to the consumer, then data (a steady flow of data must not starve the
    /// watchdogs, and delivering before reading keeps memory flat).
    async fn run(&mut self) -> Box<Exit> {
        let tx = self.tx;
        let cancel = self.cancel;
        loop {
            if let Err(exit) = self.drain_reassembler().await {
                return exit;
            }
            // With `pending_cap` verified ledgers waiting for the consumer, stop taking data:
            // the stream readers stop, QUIC flow control stops the relay.
            let reading = self.pending.len() < self.pending_cap;
            let stall_at = if reading {
                self.reasm.poll_timeout().map(|d| self.start + d)
            } else {
                None
            };
            let heartbeat_at = self.last_heartbeat + self.heartbeat_timeout;
            let progress_at = self.progress_deadline();
            tokio::select! {
                biased;
                _ = cancel.cancelled() => return Exit::stopped(),
                event = self.ctl_rx.recv() => {
                    let Some(event) = event else {
                        return Exit::failure(Transient::Closed { relay: self.peer.addr }.into());
                    };
                    if let Err(exit) = self.on_control(event).await {
                        return exit;
                    }
                }
                _ = sleep_until_opt(stall_at) => {
                    let now = self.now();
                    self.reasm.handle_timeout(now);
                }
                _ = tokio::time::sleep_until(heartbeat_at) => {
                    return Exit::failure(self.peer.timeout(format!(
                        "no heartbeat for {} ms",
                        self.heartbeat_timeout.as_millis()
                    )));
                }
                _ = sleep_until_opt(progress_at) => {
                    return Exit::failure(self.peer.timeout(format!(
                        "relay announced ledger {} but ledger {} has not arrived for {} ms",
                        self.newest,
                        self.reasm.next_seq(),
                        self.progress_timeout.as_millis()
                    )));
                }
                permit = tx.reserve(), if !self.pending.is_empty() => {
                    let Ok(permit) = permit else { return Exit::stopped() };
                    if let Err(exit) = self.deliver(permit).await {
                        return exit;
                    }
                }
                data = self.data_rx.recv(), if reading => {
                    // Lane 0's data task holds a sender until it reports through `ctl_rx`.
                    let Some(data) = data else {
                        return Exit::failure(Transient::Closed { relay: self.peer.addr }.into());
                    };
                    if let Err(exit) = self.on_data(data.frame, data.wire_len) {
                        return exit;
                    }
                }
            }
        }
    }

    /// When the stall watchdog fires: the relay has announced ledgers we do not have and none
    /// has completed for `progress_timeout`. Not armed while ledgers wait for the consumer (a
    /// slow consumer is not a stalled relay).
    fn progress_deadline(&self) -> Option<Instant> {
        if !self.pending.is_empty() {
            return None;
        }
        let since = self.behind_since?;
        Some(since.max(self.last_progress) + self.progress_timeout)
    }

    /// Moves completed ledgers through verification into `pending`, and asks for stalled
    /// chunks again.
    async fn drain_reassembler(&mut self) -> Step {
        while let Some(assembled) = self.reasm.poll_ledger() {
            let ledger = self.verify(assembled)?;
            self.last_progress = Instant::now();
            self.pending.push_back(ledger);
        }
        if self.reasm.next_seq() > self.newest {
            self.behind_since = None;
        }
        while let Some(missing) = self.reasm.poll_missing() {
            tracing::debug!(
                seq = missing.seq,
                whole = missing.whole,
                chunks = missing.indices.len(),
                "ledger stalled; asking again"
            );
            let resend = Frame::Resend(Resend {
                seq: missing.seq,
                whole: missing.whole,
                indices: missing.indices,
            });
            self.write_control(&resend).await?;
        }
        Ok(())
    }

    fn verify(&mut self, a: AssembledLedger) -> Step<Ledger> {
        let info = self
            .verifier
            .verify(a.seq, &a.data, &a.end)
            .map_err(|source| {
                Exit::integrity(SubscribeError::Verify {
                    relay: self.peer.addr,
                    source,
                })
            })?;
        Ok(Ledger {
            seq: a.seq,
            data: a.data,
            header_hash: info.hash,
            previous_hash: info.previous_hash,
            relay_first_byte_ns: a.end.first_byte_ns,
            relay_last_byte_ns: a.end.last_byte_ns,
            received_ns: wall_clock_ns(),
            wire_bytes: self.wire_bytes.remove(&a.seq).unwrap_or(a.wire_bytes),
            relay: self.peer.addr,
        })
    }

    async fn write_control(&mut self, frame: &Frame) -> Step {
        match self.writer.write(frame).await {
            Ok(()) => Ok(()),
            Err(e) => Err(Exit::failure(self.peer.classify_io(e))),
        }
    }

    /// Hands the oldest pending ledger to the consumer's channel and acknowledges it.
    async fn deliver(&mut self, permit: mpsc::Permit<'_, Item>) -> Step {
        let Some(ledger) = self.pending.pop_front() else {
            return Ok(());
        };
        let seq = ledger.seq;
        permit.send(Ok(ledger));
        self.delivered += 1;
        // From now on a below-retention end is about the ledger after this one, not the
        // session's start.
        self.peer.requested = seq.saturating_add(1);
        self.last_progress = Instant::now();
        {
            let mut status = self.peer.shared.status();
            status.last_delivered = seq;
            status.delivered += 1;
        }
        self.write_control(&Frame::Ack(seq)).await
    }

    fn on_data(&mut self, frame: Result<Frame, AssemblyError>, wire_len: u64) -> Step {
        let now = self.now();
        let result = frame.and_then(|frame| match &frame {
            Frame::Chunk(chunk) => {
                let before = self.reasm.stats().chunks;
                let r = self.reasm.handle_chunk(chunk, now);
                if self.reasm.stats().chunks > before {
                    // A first copy: count its wire size once.
                    *self.wire_bytes.entry(chunk.header.seq).or_default() += wire_len;
                }
                r
            }
            Frame::LedgerEnd(end) => self.reasm.handle_end(end, now),
            // `read_data` forwards nothing else.
            _ => Ok(()),
        });
        let Err(source) = result else { return Ok(()) };
        // The frame that fails a ledger can first complete the one before it (its last chunk
        // arrived after the failing ledger's): that ledger was complete before the failure, so
        // verify it and hand it over first. What is delivered before the error then does not
        // depend on the order the lanes delivered chunks in.
        while let Some(assembled) = self.reasm.poll_ledger() {
            let ledger = self.verify(assembled)?;
            self.pending.push_back(ledger);
        }
        Err(Exit::integrity(SubscribeError::Integrity {
            relay: self.peer.addr,
            source,
        }))
    }

    async fn on_control(&mut self, event: Ctl) -> Step {
        match event {
            Ctl::Control(Frame::Heartbeat(h)) => {
                let now = Instant::now();
                self.last_heartbeat = now;
                self.newest = h.newest;
                let next = self.reasm.next_seq();
                if h.newest >= next {
                    self.behind_since.get_or_insert(now);
                } else {
                    self.behind_since = None;
                }
                let at = self.now();
                self.reasm.handle_heartbeat(h.newest, at);
                self.peer.shared.status().newest = h.newest;
                Ok(())
            }
            Ctl::Control(Frame::Error(e)) => Err(Exit::failure(classify_error_frame(
                &self.peer.name,
                self.peer.addr,
                self.peer.requested,
                &e,
            ))),
            Ctl::Control(other) => Err(Exit::failure(self.peer.violation(format!(
                "{} frame on the session's control stream",
                other.frame_type().name()
            )))),
            Ctl::ControlEnded(failure) => Err(Exit::failure(failure)),
            Ctl::LaneUp { lane, conn } => {
                if let Some(slot) = self.lanes.get_mut(usize::from(lane)) {
                    tracing::debug!(lane, "lane up");
                    *slot = Some(conn);
                    self.peer.shared.status().lanes_up = self.lanes_up();
                }
                Ok(())
            }
            Ctl::LaneDown { lane: 0, failure } => {
                let failure = self.prefer_error_frame(failure).await;
                Err(Exit::failure(failure))
            }
            Ctl::LaneDown { lane, failure } => match failure {
                Failure::Fatal(_) | Failure::Transient(Transient::Protocol { .. }) => {
                    Err(Exit::failure(failure))
                }
                Failure::Transient(t) => {
                    tracing::warn!(
                        lane,
                        error = %ErrorChain(&t),
                        "lane lost; the session goes on with the others and the lane rejoins"
                    );
                    if let Some(slot) = self.lanes.get_mut(usize::from(lane)) {
                        *slot = None;
                    }
                    self.peer.shared.status().lanes_up = self.lanes_up();
                    Ok(())
                }
            },
        }
    }

    fn lanes_up(&self) -> u8 {
        self.lanes.iter().filter(|l| l.is_some()).count() as u8
    }

    /// Lane 0's connection closed: if the relay sent an `Error` frame just before (it does
    /// when it can), its reason (with `BelowRetention`'s bounds) beats the bare close code.
    async fn prefer_error_frame(&mut self, failure: Failure) -> Failure {
        let deadline = Instant::now() + Duration::from_millis(50);
        while let Ok(Some(event)) = tokio::time::timeout_at(deadline, self.ctl_rx.recv()).await {
            match event {
                Ctl::Control(Frame::Error(e)) => {
                    return classify_error_frame(
                        &self.peer.name,
                        self.peer.addr,
                        self.peer.requested,
                        &e,
                    )
                }
                Ctl::ControlEnded(_) => break,
                _ => {}
            }
        }
        failure
    }

    /// Tells the relay why (if it is our doing), closes every lane, lets the close frames go
    /// out, then hands the consumer the ledgers verified before the end.
    async fn finish(mut self, exit: Box<Exit>) -> Outcome {
        let limits = &self.peer.shared.config.limits;
        let (code, reason) = match &exit.tell {
            Some((code, message)) => {
                let message =
                    ledger_relay_wire::frame::truncate_utf8(message, limits.max_message_len.into())
                        .to_owned();
                let error = ErrorFrame {
                    code: *code,
                    oldest: 0,
                    newest: 0,
                    message,
                };
                if let Some(lane0) = &self.lanes[0] {
                    transport::close_with_error(
                        &lane0.conn,
                        self.writer.stream_mut(),
                        &error,
                        ERROR_LINGER,
                    )
                    .await;
                }
                (code.close_code(), error.message)
            }
            None => (0, "session ended".to_owned()),
        };
        let reason = ledger_relay_wire::frame::truncate_utf8(&reason, 200);
        for lane in self.lanes.iter().flatten() {
            lane.conn.close(VarInt::from_u32(code), reason.as_bytes());
        }
        self.tasks.abort_all();
        let endpoints: Vec<quinn::Endpoint> = self
            .lanes
            .iter()
            .flatten()
            .map(|l| l.endpoint.clone())
            .collect();
        // Draining lets the close frames out and frees fixed lane ports for the next session.
        let linger = futures::future::join_all(endpoints.iter().map(|e| e.wait_idle()));
        let _ = tokio::time::timeout(CLOSE_LINGER, linger).await;

        let mut end = exit.end;
        if !matches!(end, End::Stopped) {
            // These ledgers are verified and the chain has moved past them: hand them over,
            // so that the resume point (last delivered + 1) and the chain agree.
            while let Some(ledger) = self.pending.pop_front() {
                let seq = ledger.seq;
                if self.tx.send(Ok(ledger)).await.is_err() {
                    end = End::Stopped;
                    break;
                }
                self.delivered += 1;
                let mut status = self.peer.shared.status();
                status.last_delivered = seq;
                status.delivered += 1;
            }
        }
        Outcome {
            end,
            delivered: self.delivered,
        }
    }
}

/// Forwards lane 0's control frames to the session loop.
async fn read_control(peer: Peer, mut reader: FrameReader, ctl: mpsc::Sender<Ctl>) {
    loop {
        let (event, last) = match reader.next().await {
            Ok(Some(frame)) => (Ctl::Control(frame), false),
            Ok(None) => (
                Ctl::ControlEnded(Transient::Closed { relay: peer.addr }.into()),
                true,
            ),
            Err(e) => (Ctl::ControlEnded(peer.classify_io(e)), true),
        };
        if ctl.send(event).await.is_err() || last {
            return;
        }
    }
}

/// Accepts the relay's data streams on one lane and forwards their frames, reading many
/// streams at once so that a lost packet stalls only its own chunk. Returns when the lane
/// fails or the relay breaks the protocol.
async fn read_data(
    peer: &Peer,
    lane: u8,
    conn: &quinn::Connection,
    data_tx: &mpsc::Sender<DataFrame>,
    permits: &Arc<Semaphore>,
    limits: &Limits,
) -> Failure {
    let mut reads = FuturesUnordered::new();
    loop {
        tokio::select! {
            Some(result) = reads.next(), if !reads.is_empty() => {
                if let Err(failure) = result {
                    return failure;
                }
            }
            accepted = accept_stream(peer, conn, permits) => {
                let (stream, permit) = match accepted {
                    Ok(x) => x,
                    Err(failure) => return failure,
                };
                reads.push(read_data_stream(peer, lane, stream, permit, data_tx, limits));
            }
        }
    }
}

/// A permit, then the next data stream. Both steps are cancel-safe.
async fn accept_stream(
    peer: &Peer,
    conn: &quinn::Connection,
    permits: &Arc<Semaphore>,
) -> Result<(quinn::RecvStream, OwnedSemaphorePermit), Failure> {
    let Ok(permit) = permits.clone().acquire_owned().await else {
        // The semaphore is never closed; treat it as the session ending.
        return Err(Transient::Closed { relay: peer.addr }.into());
    };
    let stream = conn.accept_uni().await.map_err(|e| peer.classify(&e))?;
    Ok((stream, permit))
}

/// Reads one data stream: exactly one `Chunk` or `LedgerEnd` frame.
async fn read_data_stream(
    peer: &Peer,
    lane: u8,
    mut stream: quinn::RecvStream,
    permit: OwnedSemaphorePermit,
    data_tx: &mpsc::Sender<DataFrame>,
    limits: &Limits,
) -> Result<(), Failure> {
    match read_single_frame(&mut stream, limits).await {
        Ok(frame @ (Frame::Chunk(_) | Frame::LedgerEnd(_))) => {
            let wire_len = match &frame {
                Frame::Chunk(c) => c.payload.len() as u64,
                _ => 0,
            };
            let frame = decompress_chunk(frame, limits);
            // A closed channel means the session is ending; the frame is not needed.
            let _ = data_tx
                .send(DataFrame {
                    frame,
                    wire_len,
                    _permit: permit,
                })
                .await;
            Ok(())
        }
        Ok(other) => Err(peer.violation(format!(
            "{} frame on a data stream of lane {lane}",
            other.frame_type().name()
        ))),
        Err(e) if e.is_protocol_violation() => {
            Err(peer.violation(format!("data stream on lane {lane}: {}", ErrorChain(&e))))
        }
        Err(e) => {
            // A reset stream or a lost connection: the chunk is missing, and the reassembler
            // asks for it again after the stall timeout; the lane's loss shows on accept.
            tracing::debug!(lane, error = %ErrorChain(&e), "data stream lost");
            Ok(())
        }
    }
}

/// Decompresses a chunk's payload here, in the lane's task, so that decompression runs on as
/// many cores as there are lanes instead of in the single session loop (a 14.5 MiB ledger is
/// about 10 ms of zstd on one core). The reassembler then takes the raw bytes without a copy.
/// Bounded like the reassembler's own decoding: never more than the declared raw length, and
/// a raw length beyond the limit is left for the reassembler to refuse.
fn decompress_chunk(frame: Frame, limits: &Limits) -> Result<Frame, AssemblyError> {
    let Frame::Chunk(mut chunk) = frame else {
        return Ok(frame);
    };
    let h = chunk.header;
    if h.codec == Codec::None || h.raw_len == 0 || h.raw_len > limits.max_chunk_raw {
        return Ok(Frame::Chunk(chunk));
    }
    let raw =
        compress::decompress(h.codec, &chunk.payload, h.raw_len, limits).map_err(|source| {
            AssemblyError::Codec {
                seq: h.seq,
                index: h.index,
                source,
            }
        })?;
    chunk.payload = Bytes::from(raw);
    chunk.header.codec = Codec::None;
    Ok(Frame::Chunk(chunk))
}

/// Lane `join.lane` (1..N): joins the session, reads its data until it fails, rejoins with
/// backoff. Ends on a terminal failure or a protocol violation (reported to the session), or
/// when the session aborts it.
async fn run_lane(
    peer: Peer,
    join: LaneJoin,
    ctl: mpsc::Sender<Ctl>,
    data_tx: mpsc::Sender<DataFrame>,
    permits: Arc<Semaphore>,
    limits: Limits,
) {
    let lane = join.lane;
    let mut backoff = Backoff::new(peer.shared.config.backoff);
    loop {
        let (was_up, failure) = match join_lane(&peer, &join).await {
            Ok((conn, io)) => {
                backoff.reset();
                if ctl
                    .send(Ctl::LaneUp {
                        lane,
                        conn: conn.clone(),
                    })
                    .await
                    .is_err()
                {
                    return;
                }
                // The writer stays alive with the lane: dropping it would finish the lane's
                // control stream, which the relay may take as the lane leaving.
                let FrameIo {
                    mut reader,
                    writer: _writer,
                } = io;
                let failure = tokio::select! {
                    f = read_data(&peer, lane, &conn.conn, &data_tx, &permits, &limits) => f,
                    f = lane_control(&peer, &mut reader) => f,
                };
                let code = match &failure {
                    Failure::Transient(Transient::Protocol { .. }) => {
                        ErrorCode::ProtocolViolation.close_code()
                    }
                    _ => 0,
                };
                conn.conn.close(VarInt::from_u32(code), b"lane closed");
                (true, failure)
            }
            Err(failure) => (false, failure),
        };
        let terminal = matches!(
            failure,
            Failure::Fatal(_) | Failure::Transient(Transient::Protocol { .. })
        );
        if was_up || terminal {
            if ctl.send(Ctl::LaneDown { lane, failure }).await.is_err() {
                return;
            }
        } else if let Failure::Transient(t) = &failure {
            tracing::debug!(lane, error = %ErrorChain(t), "lane join failed; retrying");
        }
        if terminal {
            return;
        }
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

/// Connects lane `join.lane` and joins it to the session.
async fn join_lane(peer: &Peer, join: &LaneJoin) -> Result<(LaneConn, FrameIo), Failure> {
    let conn = peer.connect_lane(join.lane).await?;
    let joined = async {
        let mut io = peer.open_control(&conn).await?;
        io.writer
            .write(&Frame::LaneJoin(join.clone()))
            .await
            .map_err(|e| peer.classify_io(e))?;
        match peer.answer(&mut io.reader, "LaneJoin").await? {
            Frame::LaneAccept(n) if n == join.lane => Ok(io),
            other => Err(peer.violation(format!(
                "{} frame in answer to LaneJoin for lane {}",
                other.frame_type().name(),
                join.lane
            ))),
        }
    }
    .await;
    match joined {
        Ok(io) => Ok((conn, io)),
        Err(failure) => {
            conn.conn.close(VarInt::from_u32(0), b"lane not joined");
            Err(failure)
        }
    }
}

/// Reads a lane's (1..N) control stream: only an `Error` is expected, before the relay closes
/// the lane.
async fn lane_control(peer: &Peer, reader: &mut FrameReader) -> Failure {
    loop {
        match reader.next().await {
            Ok(Some(Frame::Error(e))) => {
                return classify_error_frame(&peer.name, peer.addr, peer.requested, &e)
            }
            // Harmless liveness on a lane's control stream; the session's watchdog uses lane 0's.
            Ok(Some(Frame::Heartbeat(_))) => {}
            Ok(Some(other)) => {
                return peer.violation(format!(
                    "{} frame on a lane control stream",
                    other.frame_type().name()
                ))
            }
            Ok(None) => return Transient::Closed { relay: peer.addr }.into(),
            Err(e) => return peer.classify_io(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ledger_relay_wire::frame::TOKEN_LEN;

    fn accept() -> SessionAccept {
        SessionAccept {
            version: PROTOCOL_VERSION,
            session_id: 1,
            token: [0; TOKEN_LEN],
            lanes: 2,
            first_seq: 100,
            oldest: 50,
            newest: 120,
            chunk_size: 256 << 10,
            window: 8,
            heartbeat_ms: 500,
            max_chunk_raw: 4 << 20,
            max_ledger_raw: 256 << 20,
        }
    }

    #[test]
    fn accepts_are_checked_against_what_was_asked() {
        let limits = Limits::default();
        check_accept(&accept(), 4, Start::Seq(100), &limits).unwrap();
        check_accept(&accept(), 4, Start::Tip, &limits).unwrap();
        let bad = |f: &dyn Fn(&mut SessionAccept), lanes, start| {
            let mut a = accept();
            f(&mut a);
            check_accept(&a, lanes, start, &limits).unwrap_err()
        };
        assert!(bad(&|_| {}, 4, Start::Seq(99)).contains("instead of 99"));
        assert!(bad(&|_| {}, 1, Start::Tip).contains("lanes"));
        assert!(bad(&|a| a.version = 2, 4, Start::Tip).contains("version"));
        assert!(bad(&|a| a.first_seq = 0, 4, Start::Tip).contains("ledger 0"));
        assert!(bad(&|a| a.window = 9, 4, Start::Tip).contains("window"));
        assert!(bad(&|a| a.chunk_size = 8 << 20, 4, Start::Tip).contains("chunk size"));
        assert!(bad(&|a| a.max_chunk_raw = 1024, 4, Start::Tip).contains("chunk size"));
        assert!(bad(&|a| a.max_ledger_raw = 0, 4, Start::Tip).contains("largest ledger"));
    }
}
