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
use crate::config::RelayAddr;
use crate::error::{
    classify_connection, classify_error_frame, classify_frame_io, ErrorChain, Failure,
    SubscribeError, Transient,
};
use crate::ledger::{Item, Ledger, Shared};
use crate::verify::Verifier;
use ledger_relay_transport::{
    self as transport, read_data_frame, DataBudget, DataPermit, FrameIo, FrameIoError, FrameReader,
    FrameWriter,
};

mod lanes;
use lanes::{read_control, read_data, run_lane};

mod peer;
use peer::{open, Peer};

mod close;
use close::{close_code, verdict, Cause};

/// Data streams being read or not yet taken by the session loop, across all lanes. What they
/// hold is bounded apart, in bytes ([`Intake`]); when the loop pauses, readers stop accepting
/// streams and QUIC flow control pushes back on the relay.
const STREAM_PERMITS: usize = 256;

/// What bounds the data frames between QUIC's buffers and the reassembler, across a session's
/// lanes: how many streams ([`STREAM_PERMITS`]) and how many bytes
/// ([`Limits::max_unassembled_bytes`], taken whole from each frame's header before its body is
/// read), so that a relay that opens every stream it may and finishes none makes the session
/// hold no more than that.
#[derive(Debug, Clone)]
struct Intake {
    streams: Arc<Semaphore>,
    bytes: DataBudget,
}

impl Intake {
    fn new(limits: &Limits) -> Intake {
        Intake {
            streams: Arc::new(Semaphore::new(STREAM_PERMITS)),
            bytes: DataBudget::new(limits.max_unassembled_bytes),
        }
    }
}

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
    _held: (OwnedSemaphorePermit, DataPermit),
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
    /// When the relay was last heard from: a heartbeat or data (the heartbeat watchdog's mark).
    last_heard: Instant,
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
        let intake = Intake::new(&limits);
        let mut tasks = JoinSet::new();
        let FrameIo { reader, writer } = io;
        tasks.spawn(read_control(peer.clone(), reader, ctl_tx.clone()));
        {
            let (peer, conn, data_tx, intake, ctl_tx, limits) = (
                peer.clone(),
                lane0.conn.clone(),
                data_tx.clone(),
                intake.clone(),
                ctl_tx.clone(),
                limits.clone(),
            );
            tasks.spawn(async move {
                let failure = read_data(&peer, 0, &conn, &data_tx, &intake, &limits).await;
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
                intake.clone(),
                limits.clone(),
            ));
        }
        peer.shared.lanes.0.up(peer.addr, 0, &lane0.conn);
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
        let mut reasm = Reassembler::new(limits, accept.first_seq, config.stall_timeout);
        if config.receive_only {
            reasm = reasm.receive_only();
        }
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
            last_heard: now,
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
            tell: verdict(Cause::Stopped),
        })
    }

    /// A protocol violation by the relay is told to it; other failures are the relay's own
    /// doing (it closed, it sent an `Error`) or the network's ([`close::verdict`]).
    fn failure(f: Failure) -> Box<Exit> {
        let tell = verdict(Cause::Failure(&f));
        Box::new(Exit {
            end: f.into(),
            tell,
        })
    }

    /// A terminal integrity failure: the relay sent data that does not check out.
    fn integrity(e: SubscribeError) -> Box<Exit> {
        let tell = verdict(Cause::Integrity(&e));
        Box::new(Exit {
            end: End::Fatal(e),
            tell,
        })
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
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
            let silent_at = self.last_heard + self.heartbeat_timeout;
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
                _ = tokio::time::sleep_until(silent_at) => {
                    return Exit::failure(self.peer.timeout(format!(
                        "no heartbeat or data for {} ms",
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
        if self.peer.shared.config.receive_only {
            // A bench mode: nothing here to verify (`data` is empty); the header hashes are
            // the end record's, unchecked, and only mark where a reconnect resumes.
            *self.verifier = Verifier::after(a.seq, a.end.header_hash);
            let hashes = (a.end.header_hash, a.end.previous_hash);
            return Ok(self.ledger(a, hashes));
        }
        let info = self
            .verifier
            .verify(a.seq, &a.data, &a.end)
            .map_err(|source| {
                Exit::integrity(SubscribeError::Verify {
                    relay: self.peer.addr,
                    source,
                })
            })?;
        Ok(self.ledger(a, (info.hash, info.previous_hash)))
    }

    /// The consumer's [`Ledger`] of `a`, with its header's hash and previous hash.
    fn ledger(&mut self, a: AssembledLedger, (hash, previous): ([u8; 32], [u8; 32])) -> Ledger {
        Ledger {
            seq: a.seq,
            raw_len: a.end.raw_len,
            data: a.data,
            header_hash: hash,
            previous_hash: previous,
            relay_first_byte_ns: a.end.first_byte_ns,
            relay_last_byte_ns: a.end.last_byte_ns,
            received_ns: transport::now_ns(),
            wire_bytes: self.wire_bytes.remove(&a.seq).unwrap_or(a.wire_bytes),
            relay: self.peer.addr,
        }
    }

    /// Writes an `Ack` or a `Resend` on lane 0's control stream, within the heartbeat timeout:
    /// the session loop waits here, so a relay that stops reading its control stream would
    /// otherwise hold it where no watchdog can fire.
    async fn write_control(&mut self, frame: &Frame) -> Step {
        self.peer
            .write(&mut self.writer, frame, self.heartbeat_timeout)
            .await
            .map_err(Exit::failure)
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
        // Data from the relay proves it alive as well as a heartbeat does: under load a
        // heartbeat can wait behind chunks in the relay's or this process's queues.
        self.last_heard = Instant::now();
        let now = self.now();
        let result = frame.and_then(|frame| match &frame {
            Frame::Chunk(chunk) => {
                let before = self.reasm.stats().chunks;
                let r = self.reasm.handle_chunk(chunk, now);
                if self.reasm.stats().chunks > before {
                    // A first copy: count its wire size once.
                    *self.wire_bytes.entry(chunk.header.seq).or_default() += wire_len;
                }
                if let Some(prefixes) = &self.peer.shared.prefixes {
                    // Cut-through: never waits; a consumer that falls behind sees a jump in
                    // the offsets and takes the ledger whole.
                    while let Some(p) = self.reasm.poll_prefix() {
                        let _ = prefixes.try_send(p);
                    }
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
                self.last_heard = now;
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
                    self.peer
                        .shared
                        .lanes
                        .0
                        .up(self.peer.addr, lane, &conn.conn);
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
                // The relay ends a session that fell out of its retention on every lane, but
                // tells why (with its bounds) only on lane 0's control stream; another lane sees
                // just the close code, with no bounds and the session's first ledger as the one
                // needed. Lane 0's verdict follows.
                Failure::Fatal(SubscribeError::BelowRetention { .. }) => {
                    tracing::debug!(lane, "lane closed below retention; lane 0 says why");
                    self.lane_gone(lane);
                    self.peer.shared.status().lanes_up = self.lanes_up();
                    Ok(())
                }
                Failure::Fatal(_) | Failure::Transient(Transient::Protocol { .. }) => {
                    Err(Exit::failure(failure))
                }
                Failure::Transient(t) => {
                    tracing::warn!(
                        lane,
                        error = %ErrorChain(&t),
                        "lane lost; the session goes on with the others and the lane rejoins"
                    );
                    self.lane_gone(lane);
                    self.peer.shared.status().lanes_up = self.lanes_up();
                    Ok(())
                }
            },
        }
    }

    /// Lane `lane` is down: its slot is emptied and its figures kept.
    fn lane_gone(&mut self, lane: u8) {
        if let Some(slot) = self.lanes.get_mut(usize::from(lane)) {
            *slot = None;
            self.peer.shared.lanes.0.down(self.peer.addr, lane);
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
        let code = close_code(exit.tell.as_ref());
        let reason = match &exit.tell {
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
                error.message
            }
            None => "session ended".to_owned(),
        };
        let reason = ledger_relay_wire::frame::truncate_utf8(&reason, 200);
        for lane in self.lanes.iter().flatten() {
            lane.conn.close(code, reason.as_bytes());
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
        for lane in 0..self.lanes.len() {
            // Every lane the session opened, including lane 0, whose slot stays filled.
            self.peer.shared.lanes.0.down(self.peer.addr, lane as u8);
        }

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

#[cfg(test)]
mod tests;
