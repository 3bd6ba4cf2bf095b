//! Who a session talks to ([`Peer`]: the relay's name, address and TLS name, and how its
//! failures are classified), and how a session starts: lane 0 connected, `SessionOpen` sent and
//! the relay's `SessionAccept` checked against what was asked.

#[allow(clippy::wildcard_imports)]
use super::*;

/// Who the session talks to, for lane tasks and error classification.
#[derive(Clone)]
pub(super) struct Peer {
    pub(super) shared: Arc<Shared>,
    /// The relay as configured.
    pub(super) name: String,
    /// The TLS server name.
    pub(super) server_name: String,
    /// The resolved address.
    pub(super) addr: SocketAddr,
    /// The ledger needed next, for `BelowRetention`: the start asked for (0 for the tip), then
    /// the ledger after the last one delivered.
    pub(super) requested: u32,
}

impl Peer {
    pub(super) fn classify(&self, e: &quinn::ConnectionError) -> Failure {
        classify_connection(&self.name, self.addr, self.requested, e)
    }

    pub(super) fn classify_io(&self, e: FrameIoError) -> Failure {
        classify_frame_io(&self.name, self.addr, self.requested, e)
    }

    pub(super) fn violation(&self, detail: impl Into<String>) -> Failure {
        Transient::Protocol {
            relay: self.addr,
            detail: detail.into(),
        }
        .into()
    }

    pub(super) fn timeout(&self, what: impl Into<String>) -> Failure {
        Transient::Timeout {
            relay: self.addr,
            what: what.into(),
        }
        .into()
    }

    /// Binds lane `lane`'s own socket and endpoint and completes the QUIC handshake.
    pub(super) async fn connect_lane(&self, lane: u8) -> Result<LaneConn, Failure> {
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
        let endpoint = transport::endpoint(socket, None, &config.transport).map_err(bind)?;
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

    /// Writes `frame` on a control stream, giving up after `limit`: a relay that stops reading
    /// its control stream (QUIC flow control then holds our writes) is a relay that does not
    /// answer, and the session must be free to time out and fail over.
    pub(super) async fn write(
        &self,
        writer: &mut FrameWriter,
        frame: &Frame,
        limit: Duration,
    ) -> Result<(), Failure> {
        match tokio::time::timeout(limit, writer.write(frame)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(self.classify_io(e)),
            Err(_) => Err(self.timeout(format!(
                "the relay took no {} frame for {} ms (it does not read its control stream)",
                frame.frame_type().name(),
                limit.as_millis()
            ))),
        }
    }

    /// Opens the lane's control stream. In TLS 1.3 a relay that rejects our certificate does so
    /// after our handshake completed: the failure shows here or on the first read.
    pub(super) async fn open_control(&self, lane: &LaneConn) -> Result<FrameIo, Failure> {
        let (send, recv) = lane.conn.open_bi().await.map_err(|e| self.classify(&e))?;
        Ok(FrameIo::new(send, recv, self.shared.config.limits.clone()))
    }

    /// Waits for the relay's answer on a control stream, bounded by `accept_timeout`.
    pub(super) async fn answer(
        &self,
        reader: &mut FrameReader,
        what: &str,
    ) -> Result<Frame, Failure> {
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

/// Resolves the relay, connects lane 0 and exchanges `SessionOpen` / `SessionAccept`.
pub(super) async fn open(
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
        peer.write(&mut io.writer, &open, config.accept_timeout)
            .await?;
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
            super::close::close_for(&lane0.conn, &failure, b"session not opened");
            Err(failure)
        }
    }
}

/// Checks a `SessionAccept` against what was asked.
pub(super) fn check_accept(
    a: &SessionAccept,
    lanes: u8,
    start: Start,
    limits: &Limits,
) -> Result<(), String> {
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
