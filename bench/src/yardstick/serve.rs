//! `ledger-bench yardstick`: the TCP yardstick's server, on a relay's host beside `ledger-relay
//! run --source synthetic:...`: the same ledgers, paced alike, each sent once whole, in order,
//! over mutual TLS 1.3 over TCP with the relay's certificate to at most [`MAX_CONNECTIONS`].

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use ledger_relay::source::{synthetic_ledgers, SourceSpec, SyntheticSpec};
use ledger_relay_certs::{load_certs, load_key};
use ledger_relay_transport::{now_ns, tls};

use super::message::{clock_reply, error_message, ledger_head, Request, ALPN, REQUEST_LEN};

/// Most connections at once: a handful of benchmark clients.
pub const MAX_CONNECTIONS: usize = 16;

/// Time allowed for the handshake and for each request; the longest wait for a ledger.
const TIMEOUT: Duration = Duration::from_secs(60);

/// `ledger-bench yardstick` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// TCP address to listen on.
    #[arg(long, value_name = "ADDR")]
    pub listen: SocketAddr,
    /// Certificate directory: DIR/ca.pem (clients must hold a certificate of it) and
    /// DIR/NAME.pem with DIR/NAME.key.
    #[arg(long, value_name = "DIR")]
    pub certs: PathBuf,
    /// The server certificate's name in DIR (the relay's).
    #[arg(long, value_name = "NAME", default_value = "relay")]
    pub name: String,
    /// The relay's `--source` (a synthetic one): the same ledgers, byte for byte.
    #[arg(
        long,
        value_name = "SOURCE",
        default_value = "synthetic:size=14.5MiB,ratio=1"
    )]
    pub source: String,
    /// The relay's `--cadence`.
    #[arg(long, value_name = "DURATION", default_value = "600ms", value_parser = ledger_relay_transport::parse_duration)]
    pub cadence: Duration,
    /// The relay's `--emit` (a source's own `emit=` takes precedence): a ledger is whole this
    /// long after it starts.
    #[arg(long, value_name = "DURATION", default_value = "8ms", value_parser = ledger_relay_transport::parse_duration)]
    pub emit: Duration,
    /// Ledgers kept for clients that ask for an older one.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub keep: u32,
}

/// A whole ledger and when its source began and finished it.
struct Ledger {
    seq: u32,
    first_ns: u64,
    last_ns: u64,
    body: Vec<u8>,
}

/// The ledgers held, and whether the source has ended.
#[derive(Default)]
struct Held {
    ledgers: VecDeque<Arc<Ledger>>,
    ended: bool,
}

type Shared = Arc<(Mutex<Held>, Condvar)>;

/// Serves until killed.
pub fn main(a: &ServeArgs) -> anyhow::Result<()> {
    let spec = match a.source.parse::<SourceSpec>() {
        Ok(SourceSpec::Synthetic(spec)) => spec,
        Ok(other) => bail!("--source {other}: the yardstick serves synthetic ledgers only"),
        Err(e) => bail!("--source: {e}"),
    };
    let config = Arc::new(server_config(&a.certs, &a.name)?);
    let listener = TcpListener::bind(a.listen).with_context(|| format!("binding {}", a.listen))?;
    let addr = listener.local_addr()?;
    eprintln!("ledger-bench yardstick: listening on {addr}");
    let shared = Shared::default();
    let source = shared.clone();
    let (cadence, emit, keep) = (a.cadence, spec.emit.unwrap_or(a.emit), a.keep as usize);
    std::thread::spawn(move || generate(&spec, cadence, emit, keep, &source));
    let active = Arc::new(AtomicUsize::new(0));
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        if active.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            active.fetch_sub(1, Ordering::SeqCst);
            continue;
        }
        let (config, shared, active) = (config.clone(), shared.clone(), active.clone());
        std::thread::spawn(move || {
            let peer = stream.peer_addr().map_or("?".into(), |a| a.to_string());
            match serve(stream, config, &shared) {
                Ok(n) => eprintln!("ledger-bench yardstick: {peer}: {n} ledgers sent"),
                Err(e) => eprintln!("ledger-bench yardstick: {peer}: {e:#}"),
            }
            active.fetch_sub(1, Ordering::SeqCst);
        });
    }
    Ok(())
}

/// Client certificates of the CA in `certs`, verified as the relay does (without its allow-list).
pub fn verifier(
    certs: &Path,
) -> anyhow::Result<Arc<dyn rustls::server::danger::ClientCertVerifier>> {
    let mut roots = rustls::RootCertStore::empty();
    for ca in load_certs(&certs.join("ca.pem"))? {
        roots.add(ca)?;
    }
    let provider = tls::crypto_provider();
    let builder = rustls::server::WebPkiClientVerifier::builder_with_provider;
    Ok(builder(Arc::new(roots), provider).build()?)
}

/// The yardstick's server TLS: certificate `name` of `certs`, clients of its CA.
pub fn server_config(certs: &Path, name: &str) -> anyhow::Result<rustls::ServerConfig> {
    let chain = load_certs(&certs.join(format!("{name}.pem")))?;
    let key = load_key(&certs.join(format!("{name}.key")))?;
    Ok(tls::server_tls(chain, key, verifier(certs)?, ALPN)?)
}

/// Builds each ledger ahead of its time, holds it from its start + emit window, keeps `keep`.
fn generate(spec: &SyntheticSpec, cadence: Duration, emit: Duration, keep: usize, shared: &Shared) {
    let t0 = Instant::now();
    for (k, body) in synthetic_ledgers(spec).enumerate() {
        let start = t0 + cadence * k as u32;
        std::thread::sleep(start.saturating_duration_since(Instant::now()));
        let first_ns = now_ns();
        std::thread::sleep((start + emit).saturating_duration_since(Instant::now()));
        let seq = spec.start + k as u32;
        let ledger = Arc::new(Ledger {
            seq,
            first_ns,
            last_ns: now_ns(),
            body,
        });
        let (lock, ready) = &**shared;
        let mut held = lock.lock().unwrap_or_else(|e| e.into_inner());
        held.ledgers.push_back(ledger);
        if held.ledgers.len() > keep {
            held.ledgers.pop_front();
        }
        ready.notify_all();
    }
    let (lock, ready) = &**shared;
    lock.lock().unwrap_or_else(|e| e.into_inner()).ended = true;
    ready.notify_all();
}

/// Ledger `seq` (0: the newest) once it is held.
fn ledger(shared: &Shared, seq: u32) -> anyhow::Result<Arc<Ledger>> {
    let (lock, ready) = &**shared;
    let deadline = Instant::now() + TIMEOUT;
    let mut held = lock.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let oldest = held.ledgers.front().map_or(0, |l| l.seq);
        let want = if seq == 0 {
            held.ledgers.back()
        } else {
            seq.checked_sub(oldest)
                .and_then(|i| held.ledgers.get(i as usize))
        };
        match want {
            Some(l) => return Ok(l.clone()),
            None if seq != 0 && seq < oldest => {
                bail!("ledger {seq} is no longer held (oldest {oldest})")
            }
            None if held.ended => bail!("the source ended before ledger {seq}"),
            None => {}
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            bail!("no ledger {seq} within {TIMEOUT:?}");
        }
        held = (ready.wait_timeout(held, left))
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

/// One connection: the handshake, clock probes, then at most one stream; the ledgers sent.
fn serve(
    stream: TcpStream,
    config: Arc<rustls::ServerConfig>,
    shared: &Shared,
) -> anyhow::Result<u32> {
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(TIMEOUT))?;
    let mut tls = rustls::StreamOwned::new(rustls::ServerConnection::new(config)?, stream);
    while tls.conn.is_handshaking() {
        tls.conn.complete_io(&mut tls.sock).context("handshake")?;
    }
    loop {
        let mut req = [0u8; REQUEST_LEN];
        match tls.read_exact(&mut req) {
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(0),
            r => r.context("reading a request")?,
        }
        let t1 = now_ns();
        let sent = match Request::decode(&req) {
            Ok(Request::Clock { t0_ns }) => {
                tls.write_all(&clock_reply(t0_ns, t1, now_ns()))?;
                tls.flush()?;
                continue;
            }
            Ok(Request::Stream { from, count }) => stream_ledgers(&mut tls, shared, from, count),
            Err(e) => Err(e.into()),
        };
        if let Err(e) = &sent {
            let _ = tls.write_all(&error_message(&format!("{e:#}")));
        }
        tls.conn.send_close_notify();
        let _ = tls.flush();
        return sent;
    }
}

/// Sends `count` ledgers from `from` (0: the newest).
fn stream_ledgers(
    out: &mut impl Write,
    shared: &Shared,
    from: u32,
    count: u32,
) -> anyhow::Result<u32> {
    let first = ledger(shared, from)?.seq;
    for seq in first..first.saturating_add(count) {
        let l = ledger(shared, seq)?;
        out.write_all(&ledger_head(l.seq, l.first_ns, l.last_ns, l.body.len())?)?;
        out.write_all(&l.body)?;
        out.flush()?;
    }
    Ok(count)
}
