//! The TCP yardstick's client: clock probes and one stream of ledgers over one TLS-over-TCP
//! flow, blocking, on the calling thread (the timestamps are taken as bytes are read).

use std::io::Write;
use std::net::{TcpStream, ToSocketAddrs};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use ledger_relay_transport::now_ns;
use ledger_relay_wire::record::DEFAULT_MAX_RECORD_LEN;
use rustls::pki_types::ServerName;

use super::message::{best_sample, read_reply, ClockSample, Reply, Request, ALPN};
use crate::stats::Record;

/// Time allowed to connect and for the handshake, and the longest wait for a message.
const TIMEOUT: Duration = Duration::from_secs(60);

/// The server's clock minus this host's, from a series of probes.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct ClockEstimate {
    /// The estimate, ms (positive: the server's clock is ahead).
    pub offset_ms: f64,
    /// Round trip of the probe it comes from, ms; the estimate is within half of it.
    pub rtt_ms: f64,
    /// Probes answered.
    pub probes: u32,
}

/// A yardstick server and the TLS client configuration to reach it.
#[derive(Debug, Clone)]
pub struct Yardstick {
    addr: String,
    server_name: ServerName<'static>,
    config: Arc<rustls::ClientConfig>,
}

/// A connection.
struct Conn(rustls::StreamOwned<rustls::ClientConnection, TcpStream>);

impl Conn {
    fn send(&mut self, r: Request) -> anyhow::Result<()> {
        self.0.write_all(&r.encode())?;
        Ok(self.0.flush()?)
    }

    fn next_reply(&mut self) -> anyhow::Result<Reply> {
        Ok(read_reply(&mut self.0, DEFAULT_MAX_RECORD_LEN)?)
    }
}

impl Yardstick {
    /// The server at `addr`, reached as `name` of `certs`, its certificate valid for `server_name`.
    pub fn new(
        addr: &str,
        certs: &Path,
        name: &str,
        server_name: &str,
    ) -> anyhow::Result<Yardstick> {
        let config = client_config(certs, name)?;
        let server_name = ServerName::try_from(server_name.to_owned())
            .with_context(|| format!("{server_name:?} is not a DNS name or an IP address"))?;
        Ok(Yardstick {
            addr: addr.to_owned(),
            server_name,
            config: Arc::new(config),
        })
    }

    fn connect(&self) -> anyhow::Result<Conn> {
        let addr = (self.addr.to_socket_addrs())
            .with_context(|| format!("resolving {}", self.addr))?
            .next()
            .with_context(|| format!("{} resolves to no address", self.addr))?;
        let sock = TcpStream::connect_timeout(&addr, TIMEOUT)?;
        sock.set_nodelay(true)?;
        sock.set_read_timeout(Some(TIMEOUT))?;
        let conn = rustls::ClientConnection::new(self.config.clone(), self.server_name.clone())?;
        let mut tls = rustls::StreamOwned::new(conn, sock);
        while tls.conn.is_handshaking() {
            tls.conn
                .complete_io(&mut tls.sock)
                .context("TLS handshake")?;
        }
        Ok(Conn(tls))
    }

    /// Sends `probes` clock probes; keeps the one with the shortest round trip.
    pub fn clock(&self, probes: u32) -> anyhow::Result<ClockEstimate> {
        let at = || format!("clock probes to the yardstick at {}", self.addr);
        let mut conn = self.connect().with_context(at)?;
        let mut samples = Vec::new();
        for _ in 0..probes.max(1) {
            let t0_ns = now_ns();
            conn.send(Request::Clock { t0_ns })?;
            match conn.next_reply().with_context(at)? {
                Reply::Clock(s) if s.t0_ns == t0_ns => samples.push(ClockSample {
                    t3_ns: now_ns(),
                    ..s
                }),
                other => bail!("{}: expected a clock answer, got {}", at(), what(&other)),
            }
        }
        let best = best_sample(&samples).context("no clock sample")?;
        let probes = samples.len() as u32;
        Ok(ClockEstimate {
            offset_ms: best.offset_ns() as f64 / 1e6,
            rtt_ms: best.rtt_ns() as f64 / 1e6,
            probes,
        })
    }

    /// Takes `count` ledgers from `from` (0: the newest), delivery by each host's clock as it is.
    pub fn stream(&self, from: u32, count: u32, within: Duration) -> anyhow::Result<Vec<Record>> {
        let at = || format!("the yardstick at {}", self.addr);
        let deadline = Instant::now() + within;
        let mut conn = self.connect().with_context(at)?;
        conn.send(Request::Stream { from, count })?;
        let mut records: Vec<Record> = Vec::new();
        while records.len() < count as usize {
            let got = records.len();
            if Instant::now() > deadline {
                bail!("{}: {got} of {count} ledgers within {within:?}", at());
            }
            let (seq, last_byte_ns, body) = match conn.next_reply().with_context(at)? {
                Reply::Ledger {
                    seq,
                    last_byte_ns,
                    body,
                    ..
                } => (seq, last_byte_ns, body),
                other => bail!("{}: expected a ledger, got {}", at(), what(&other)),
            };
            let received = now_ns();
            let prev = records.last();
            if prev.is_some_and(|p| seq != p.seq + 1) {
                bail!("{}: ledger {seq} after {:?}", at(), prev.map(|p| p.seq));
            }
            records.push(Record {
                seq,
                raw_bytes: body.len() as u64,
                wire_bytes: body.len() as u64,
                delivery_ms: (received as f64 - last_byte_ns as f64) / 1e6,
                inter_arrival_ms: prev.map(|p| received as f64 / 1e6 - p.received_unix_ms),
                received_unix_ms: received as f64 / 1e6,
            });
        }
        Ok(records)
    }
}

/// The host part of HOST:PORT (`[v6]:port` without its brackets).
pub fn host_of(addr: &str) -> anyhow::Result<String> {
    if let Ok(sa) = addr.parse::<std::net::SocketAddr>() {
        return Ok(sa.ip().to_string());
    }
    match addr.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {
            Ok(host.to_owned())
        }
        _ => bail!("{addr:?}: expected HOST:PORT"),
    }
}

/// The yardstick's client TLS: certificate `name` of `certs`, trusting its CA.
pub fn client_config(certs: &Path, name: &str) -> anyhow::Result<rustls::ClientConfig> {
    let ca = ledger_relay_certs::load_certs(&certs.join("ca.pem"))?;
    let chain = ledger_relay_certs::load_certs(&certs.join(format!("{name}.pem")))?;
    let key = ledger_relay_certs::load_key(&certs.join(format!("{name}.key")))?;
    let tls = ledger_relay_transport::tls::client_tls(&ca, &[], chain, key, ALPN)?;
    Ok(tls)
}

fn what(r: &Reply) -> String {
    match r {
        Reply::Clock(_) => "a clock answer".into(),
        Reply::Ledger { seq, .. } => format!("ledger {seq}"),
        Reply::Error(e) => format!("an error: {}", e.escape_debug()),
    }
}
