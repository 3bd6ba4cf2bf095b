//! A session's lanes: each lane's data streams read and decoded (chunks decompressed in the
//! lane's own task), lanes 1..N joined and rejoined with backoff, and lane 0's control stream
//! forwarded to the session loop.

#[allow(clippy::wildcard_imports)]
use super::*;

/// Forwards lane 0's control frames to the session loop.
pub(super) async fn read_control(peer: Peer, mut reader: FrameReader, ctl: mpsc::Sender<Ctl>) {
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
pub(super) async fn read_data(
    peer: &Peer,
    lane: u8,
    conn: &quinn::Connection,
    data_tx: &mpsc::Sender<DataFrame>,
    intake: &Intake,
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
            accepted = accept_stream(peer, conn, &intake.streams) => {
                let (stream, permit) = match accepted {
                    Ok(x) => x,
                    Err(failure) => return failure,
                };
                let read = read_data_stream(peer, lane, stream, permit, data_tx, intake, limits);
                reads.push(read);
            }
        }
    }
}

/// A permit, then the next data stream. Both steps are cancel-safe.
pub(super) async fn accept_stream(
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

/// Reads one data stream: exactly one `Chunk` or `LedgerEnd` frame, within the intake's
/// byte budget.
pub(super) async fn read_data_stream(
    peer: &Peer,
    lane: u8,
    mut stream: quinn::RecvStream,
    permit: OwnedSemaphorePermit,
    data_tx: &mpsc::Sender<DataFrame>,
    intake: &Intake,
    limits: &Limits,
) -> Result<(), Failure> {
    match read_data_frame(&mut stream, limits, &intake.bytes).await {
        Ok((frame @ (Frame::Chunk(_) | Frame::LedgerEnd(_)), bytes)) => {
            let wire_len = match &frame {
                Frame::Chunk(c) => c.payload.len() as u64,
                _ => 0,
            };
            // Receive-only (a bench mode) keeps chunks as they came; the reassembler checks
            // their bounds and declared lengths.
            let frame = if peer.shared.config.receive_only {
                Ok(frame)
            } else {
                decompress_chunk(frame, limits)
            };
            // A closed channel means the session is ending; the frame is not needed.
            let _ = data_tx
                .send(DataFrame {
                    frame,
                    wire_len,
                    _held: (permit, bytes),
                })
                .await;
            Ok(())
        }
        Ok((other, _)) => Err(peer.violation(format!(
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
pub(super) fn decompress_chunk(frame: Frame, limits: &Limits) -> Result<Frame, AssemblyError> {
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
pub(super) async fn run_lane(
    peer: Peer,
    join: LaneJoin,
    ctl: mpsc::Sender<Ctl>,
    data_tx: mpsc::Sender<DataFrame>,
    intake: Intake,
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
                    f = read_data(&peer, lane, &conn.conn, &data_tx, &intake, &limits) => f,
                    f = lane_control(&peer, &mut reader) => f,
                };
                super::close::close_for(&conn.conn, &failure, b"lane closed");
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
pub(super) async fn join_lane(
    peer: &Peer,
    join: &LaneJoin,
) -> Result<(LaneConn, FrameIo), Failure> {
    let conn = peer.connect_lane(join.lane).await?;
    let joined = async {
        let mut io = peer.open_control(&conn).await?;
        let frame = Frame::LaneJoin(join.clone());
        peer.write(&mut io.writer, &frame, peer.shared.config.accept_timeout)
            .await?;
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
            super::close::close_for(&conn.conn, &failure, b"lane not joined");
            Err(failure)
        }
    }
}

/// Reads a lane's (1..N) control stream: only an `Error` is expected, before the relay closes
/// the lane.
pub(super) async fn lane_control(peer: &Peer, reader: &mut FrameReader) -> Failure {
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
