//! `--tcp-baseline ADDR`: the relay's ledgers over one TLS-over-TCP flow, so a benchmark can
//! put a single flow beside the lanes on the same network (`ledger-bench remote --tcp`). It is
//! a yardstick, not a way to subscribe: no acknowledgements, resends, failover or verification
//! on the client's side.
//!
//! Mutual TLS 1.3 with the relay's certificate, CA, CRL and allow-list, as in force for new
//! QUIC handshakes (a renewed certificate or a new CRL applies to the next connection). A
//! client may probe the relay's clock ([`Request::Clock`], answered at once) and then asks for
//! `count` ledgers from a start ([`Request::Stream`]); the relay sends each as soon as it holds
//! all of it (the lanes, by contrast, stream chunks while the source writes), in core's record
//! marking preceded by its sequence and the relay's first- and last-byte times, then closes.
//! Messages: [`ledger_relay_wire::baseline`] and `docs/protocol.md` section 6.
//!
//! At most [`MAX_CONNECTIONS`] connections at once; more are closed at accept.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ledger_relay_wire::baseline::{self, encode_clock_reply, encode_error, ledger_head, Request};
use ledger_relay_wire::compress::{decompress, Codec};
use ledger_relay_wire::frame::Start;
use ledger_relay_wire::{CompleteLedger, Limits};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

use crate::auth::Auth;
use crate::hub::stored_ledger;
use crate::session::{held_range, resolve_start, Shared};

/// Most TCP baseline connections at once: a handful of benchmark clients.
pub const MAX_CONNECTIONS: usize = 16;

/// Time allowed for the TLS handshake, and for a request to arrive.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a stream waits for the first ledger of a relay that holds none yet.
const START_WAIT: Duration = Duration::from_secs(60);

/// Bytes of requests a client may send before it has asked for a stream (probes are 9 bytes
/// each and answered one by one).
const MAX_PENDING_REQUEST: usize = 64;

/// Binds `addr` and serves the TCP baseline until `shutdown`; returns the bound address.
pub async fn spawn(
    addr: SocketAddr,
    auth: Arc<Auth>,
    shared: Shared,
    shutdown: CancellationToken,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    tokio::spawn(async move {
        loop {
            let (stream, remote) = tokio::select! {
                r = listener.accept() => match r {
                    Ok(c) => c,
                    Err(e) => {
                        // Out of file descriptors, or a connection reset while queued.
                        debug!(error = %e, "tcp baseline accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
                _ = shutdown.cancelled() => return,
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                debug!(%remote, "tcp baseline: connection limit reached, closing");
                continue;
            };
            let (auth, shared, stop) = (auth.clone(), shared.clone(), shutdown.child_token());
            tokio::spawn(async move {
                match serve(stream, &auth, &shared, &stop).await {
                    Ok(Some(summary)) => info!(%remote, %summary, "tcp baseline connection done"),
                    Ok(None) => {}
                    Err(e) => info!(%remote, error = %e, "tcp baseline connection ended"),
                }
                drop(slot);
            });
        }
    });
    Ok(bound)
}

/// One connection: handshake, identity, clock probes, then at most one stream.
async fn serve(
    stream: TcpStream,
    auth: &Auth,
    shared: &Shared,
    stop: &CancellationToken,
) -> Result<Option<String>, String> {
    let _ = stream.set_nodelay(true);
    let tls = auth.tls_config(baseline::ALPN).map_err(|e| e.to_string())?;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let mut tls = match tokio::time::timeout(REQUEST_TIMEOUT, acceptor.accept(stream)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Err(format!("handshake failed: {e}")),
        Err(_) => return Err("handshake timed out".into()),
    };
    let client = auth.identify_certs(tls.get_ref().1.peer_certificates().unwrap_or(&[]));
    let client = match client {
        Ok(c) => c,
        Err(refusal) => {
            let msg = refusal.to_string();
            let _ = send_error(&mut tls, &msg).await;
            return Err(format!("refused: {msg}"));
        }
    };
    let mut buf = Vec::new();
    loop {
        let request = match read_request(&mut tls, &mut buf, stop).await {
            Ok(Some(r)) => r,
            Ok(None) => return Ok(None),
            Err(e) => {
                let _ = send_error(&mut tls, &e).await;
                return Err(e);
            }
        };
        match request {
            Request::Clock { t0_ns } => {
                let t1 = crate::source::now_ns();
                let mut out = Vec::with_capacity(25);
                encode_clock_reply(t0_ns, t1, crate::source::now_ns(), &mut out);
                tls.write_all(&out).await.map_err(|e| e.to_string())?;
                tls.flush().await.map_err(|e| e.to_string())?;
            }
            Request::Stream { from, count } => {
                let sent = stream_ledgers(&mut tls, shared, from, count, stop).await;
                let summary = match &sent {
                    Ok(n) => format!("{n} ledgers to {}", client.name),
                    Err(e) => {
                        let _ = send_error(&mut tls, e).await;
                        return Err(format!("{} after a stream to {}", e, client.name));
                    }
                };
                let _ = tls.shutdown().await;
                return Ok(Some(summary));
            }
        }
    }
}

/// Reads until one request is whole; `None` when the client closed between requests.
async fn read_request<S: AsyncRead + Unpin>(
    s: &mut S,
    buf: &mut Vec<u8>,
    stop: &CancellationToken,
) -> Result<Option<Request>, String> {
    let mut piece = [0u8; MAX_PENDING_REQUEST];
    loop {
        if let Some((r, used)) = Request::decode(buf).map_err(|e| e.to_string())? {
            buf.drain(..used);
            return Ok(Some(r));
        }
        let n = tokio::select! {
            r = tokio::time::timeout(REQUEST_TIMEOUT, s.read(&mut piece[..MAX_PENDING_REQUEST - buf.len()])) => match r {
                Ok(Ok(n)) => n,
                Ok(Err(e)) => return Err(e.to_string()),
                Err(_) => return Err("no request in time".into()),
            },
            _ = stop.cancelled() => return Err("relay shutting down".into()),
        };
        if n == 0 {
            return if buf.is_empty() {
                Ok(None)
            } else {
                Err("connection closed inside a request".into())
            };
        }
        buf.extend_from_slice(&piece[..n]);
    }
}

async fn send_error<S: AsyncWrite + Unpin>(s: &mut S, msg: &str) -> std::io::Result<()> {
    let mut out = Vec::new();
    encode_error(msg, &mut out);
    s.write_all(&out).await?;
    s.shutdown().await
}

/// Sends `count` ledgers from `from`; the number sent, or why it stopped.
async fn stream_ledgers<S: AsyncWrite + Unpin>(
    s: &mut S,
    shared: &Shared,
    from: Start,
    count: u32,
    stop: &CancellationToken,
) -> Result<u32, String> {
    let first = resolve_start(shared, from, stop, Some(START_WAIT))
        .await
        .map_err(|r| r.to_string())?;
    for (n, seq) in (first..first.saturating_add(count)).enumerate() {
        let ledger = complete_ledger(shared, seq, stop).await?;
        write_ledger(s, &ledger).await?;
        debug!(seq, sent = n + 1, "tcp baseline: ledger sent");
    }
    Ok(count)
}

/// Ledger `seq` once the relay holds all of it: from memory, else the ring, else once the
/// source has completed it.
async fn complete_ledger(
    shared: &Shared,
    seq: u32,
    stop: &CancellationToken,
) -> Result<Arc<CompleteLedger>, String> {
    let mut tip = shared.hub.watch_tip();
    // A ledger moves from memory to the ring while this looks; the hub keeps it until the ring
    // has it, so a look that misses both is repeated a few times before giving up.
    let mut misses = 0;
    loop {
        tip.borrow_and_update();
        if let Some(l) = shared.hub.recent(seq) {
            return Ok(l);
        }
        if let Some(ring) = shared.ring.clone() {
            if ring.holds(seq) {
                let got = tokio::task::spawn_blocking(move || ring.get(seq))
                    .await
                    .map_err(|e| format!("ring read task: {e}"))?
                    .map_err(|e| format!("ledger {seq}: {e}"))?;
                if let Some((end, chunks)) = got {
                    return Ok(Arc::new(stored_ledger(end, chunks)));
                }
            }
        }
        let (oldest, newest) = held_range(shared);
        if seq <= newest {
            misses += 1;
            if misses > 100 || (oldest != 0 && seq < oldest) {
                return Err(format!(
                    "ledger {seq} is no longer held (oldest {oldest}, newest {newest})"
                ));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        }
        tokio::select! {
            r = tip.changed() => if r.is_err() {
                return Err("relay shutting down".into());
            },
            _ = stop.cancelled() => return Err("relay shutting down".into()),
        }
    }
}

/// Writes one `Ledger` message: the head, then the raw bytes of every chunk in order.
async fn write_ledger<S: AsyncWrite + Unpin>(
    s: &mut S,
    ledger: &Arc<CompleteLedger>,
) -> Result<(), String> {
    let end = &ledger.end;
    let len = usize::try_from(end.raw_len).map_err(|e| e.to_string())?;
    let head = ledger_head(end.seq, end.first_byte_ns, end.last_byte_ns, len)
        .map_err(|e| e.to_string())?;
    let pieces = raw_pieces(ledger).await?;
    let total: usize = pieces.iter().map(Bytes::len).sum();
    if total != len {
        return Err(format!(
            "ledger {}: chunks hold {total} bytes, its end record says {len}",
            end.seq
        ));
    }
    let io = |e: std::io::Error| e.to_string();
    s.write_all(&head).await.map_err(io)?;
    for p in &pieces {
        s.write_all(p).await.map_err(io)?;
    }
    s.flush().await.map_err(io)
}

/// The ledger's raw bytes in chunk order: the payloads themselves when uncompressed, else
/// decompressed on a blocking thread (several milliseconds for a large ledger).
async fn raw_pieces(ledger: &Arc<CompleteLedger>) -> Result<Vec<Bytes>, String> {
    let mut offset = 0u64;
    for c in &ledger.chunks {
        if c.header.raw_offset != offset {
            return Err(format!(
                "ledger {}: chunk {} at {} where {offset} was due",
                ledger.end.seq, c.header.index, c.header.raw_offset
            ));
        }
        offset += u64::from(c.header.raw_len);
    }
    if ledger.chunks.iter().all(|c| c.header.codec == Codec::None) {
        return Ok(ledger.chunks.iter().map(|c| c.payload.clone()).collect());
    }
    let ledger = ledger.clone();
    tokio::task::spawn_blocking(move || {
        let limits = Limits::default();
        ledger
            .chunks
            .iter()
            .map(|c| match c.header.codec {
                Codec::None => Ok(c.payload.clone()),
                codec => decompress(codec, &c.payload, c.header.raw_len, &limits)
                    .map(Bytes::from)
                    .map_err(|e| format!("ledger {} chunk {}: {e}", c.header.seq, c.header.index)),
            })
            .collect()
    })
    .await
    .map_err(|e| format!("decompression task: {e}"))?
}
