//! The client of the relay's TCP baseline (`ledger-relay run --tcp-baseline ADDR`): clock probes
//! and one stream of ledgers over one TLS-over-TCP flow, blocking, on the calling thread (the
//! timestamps are taken as bytes are read, with nothing else scheduled in between).

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use ledger_relay_wire::baseline::{self, best_sample, ClockSample, Reply, ReplyDecoder, Request};
use ledger_relay_wire::frame::Start;
use ledger_relay_wire::record::DEFAULT_MAX_RECORD_LEN;
use rustls::pki_types::ServerName;

use crate::baseline::now_ns;
use crate::stats::Record;

type Tls = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// A connection and what has been read of it.
struct Conn {
    tls: Tls,
    decoder: ReplyDecoder,
    buf: Vec<u8>,
    addr: String,
}

impl Conn {
    fn send(&mut self, r: Request) -> anyhow::Result<()> {
        let mut out = Vec::new();
        r.encode(&mut out);
        self.tls.write_all(&out)?;
        self.tls.flush()?;
        Ok(())
    }

    /// Reads until the decoder yields a message.
    fn next_reply(&mut self) -> anyhow::Result<Reply> {
        loop {
            if let Some(r) = self
                .decoder
                .next_reply()
                .with_context(|| format!("{}: bad message", self.addr))?
            {
                return Ok(r);
            }
            let n = self
                .tls
                .read(&mut self.buf)
                .with_context(|| format!("reading from {}", self.addr))?;
            if n == 0 {
                bail!("{} closed the connection", self.addr);
            }
            self.decoder.feed(&self.buf[..n]);
        }
    }
}

/// Time allowed to connect and for the handshake, and for a clock answer.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest wait for the next ledger: several pubnet ledger closes.
const LEDGER_TIMEOUT: Duration = Duration::from_secs(60);

/// The relay's clock minus this host's, from a series of probes.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct ClockEstimate {
    /// The estimate, ms (positive: the relay's clock is ahead).
    pub offset_ms: f64,
    /// Round trip of the probe it comes from, ms; the estimate is within half of it.
    pub rtt_ms: f64,
    /// Probes sent.
    pub probes: u32,
}

/// A TCP baseline endpoint and the TLS client configuration to reach it.
#[derive(Debug, Clone)]
pub struct TcpBaseline {
    addr: String,
    server_name: ServerName<'static>,
    config: Arc<rustls::ClientConfig>,
}

impl TcpBaseline {
    /// `addr` (HOST:PORT) with client certificate `name` of `certs`, checking the relay's
    /// certificate against `server_name`.
    pub fn new(
        addr: &str,
        certs: &Path,
        name: &str,
        server_name: &str,
    ) -> anyhow::Result<TcpBaseline> {
        let ca = ledger_relay_certs::load_certs(&certs.join("ca.pem"))?;
        let chain = ledger_relay_certs::load_certs(&certs.join(format!("{name}.pem")))?;
        let key = ledger_relay_certs::load_key(&certs.join(format!("{name}.key")))?;
        let config = ledger_relay_transport::client_tls(&ca, &[], chain, key, baseline::ALPN)
            .context("TLS configuration")?;
        let server_name = ServerName::try_from(server_name.to_owned())
            .with_context(|| format!("{server_name:?} is not a DNS name or an IP address"))?;
        Ok(TcpBaseline {
            addr: addr.to_owned(),
            server_name,
            config: Arc::new(config),
        })
    }

    fn connect(&self) -> anyhow::Result<Conn> {
        let addr = self
            .addr
            .to_socket_addrs()
            .with_context(|| format!("resolving {}", self.addr))?
            .next()
            .with_context(|| format!("{} resolves to no address", self.addr))?;
        let sock = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)
            .with_context(|| format!("connecting to the TCP baseline at {}", self.addr))?;
        sock.set_nodelay(true)?;
        sock.set_read_timeout(Some(CONNECT_TIMEOUT))?;
        let conn = rustls::ClientConnection::new(self.config.clone(), self.server_name.clone())?;
        let mut tls = rustls::StreamOwned::new(conn, sock);
        while tls.conn.is_handshaking() {
            tls.conn
                .complete_io(&mut tls.sock)
                .with_context(|| format!("TLS handshake with {}", self.addr))?;
        }
        Ok(Conn {
            tls,
            decoder: ReplyDecoder::new(DEFAULT_MAX_RECORD_LEN),
            buf: vec![0u8; 256 << 10],
            addr: self.addr.clone(),
        })
    }

    /// Sends `probes` clock probes one after another and keeps the one with the shortest round
    /// trip.
    pub fn clock(&self, probes: u32) -> anyhow::Result<ClockEstimate> {
        let mut conn = self.connect()?;
        let mut samples = Vec::new();
        for _ in 0..probes.max(1) {
            let t0_ns = now_ns();
            conn.send(Request::Clock { t0_ns })?;
            match conn.next_reply()? {
                Reply::Clock(s) if s.t0_ns == t0_ns => samples.push(ClockSample {
                    t3_ns: now_ns(),
                    ..s
                }),
                other => bail!(
                    "{}: expected a clock answer, got {}",
                    self.addr,
                    what(&other)
                ),
            }
        }
        let _ = conn.tls.sock.shutdown(std::net::Shutdown::Both);
        // At least one probe was answered, or the loop bailed.
        let best = best_sample(&samples).context("no clock sample")?;
        Ok(ClockEstimate {
            offset_ms: best.offset_ns() as f64 / 1e6,
            rtt_ms: best.rtt_ns() as f64 / 1e6,
            probes: samples.len() as u32,
        })
    }

    /// Takes `count` ledgers from the relay's tip over one flow; one record per ledger, its
    /// delivery by the two hosts' clocks as they are (uncorrected).
    pub fn stream(&self, count: u32, within: Duration) -> anyhow::Result<Vec<Record>> {
        let deadline = Instant::now() + within;
        let mut conn = self.connect()?;
        conn.tls.sock.set_read_timeout(Some(LEDGER_TIMEOUT))?;
        conn.send(Request::Stream {
            from: Start::Tip,
            count,
        })?;
        let mut records: Vec<Record> = Vec::new();
        let mut prev: Option<u64> = None;
        while records.len() < count as usize {
            if Instant::now() > deadline {
                bail!(
                    "{}: {} of {count} ledgers within {within:?}",
                    self.addr,
                    records.len()
                );
            }
            match conn.next_reply()? {
                Reply::Ledger {
                    seq,
                    last_byte_ns,
                    body,
                    ..
                } => {
                    let received = now_ns();
                    if let Some(last) = records.last() {
                        if seq != last.seq + 1 {
                            bail!("{}: ledger {seq} after {}", self.addr, last.seq);
                        }
                    }
                    records.push(Record {
                        seq,
                        raw_bytes: body.len() as u64,
                        wire_bytes: body.len() as u64,
                        delivery_ms: (received as f64 - last_byte_ns as f64) / 1e6,
                        inter_arrival_ms: prev.map(|p| (received as f64 - p as f64) / 1e6),
                        received_unix_ms: Some(received as f64 / 1e6),
                    });
                    prev = Some(received);
                }
                other => bail!("{}: expected a ledger, got {}", self.addr, what(&other)),
            }
        }
        Ok(records)
    }
}

fn what(r: &Reply) -> String {
    match r {
        Reply::Clock(_) => "a clock answer".into(),
        Reply::Ledger { seq, .. } => format!("ledger {seq}"),
        Reply::Error(e) => format!("an error from the relay: {e}"),
    }
}
