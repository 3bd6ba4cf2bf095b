//! The two baselines of the prototype, carrying ledgers of the same size at the same cadence:
//!
//! - one TCP connection (the prototype's transport: one flow), run as two hidden
//!   subcommands of `ledger-bench` (`tcp-send` in the relay's namespace, `tcp-recv` in the
//!   subscribers'), so the flow crosses the same emulated path and its per-flow cap;
//! - a local pipe read (the prototype's local baseline: ingest reading core's pipe on the same
//!   box), in-process.
//!
//! In both, a source thread emits each ledger over the emit window in pieces (as core writes),
//! timestamps its last byte, and never waits for the transport; delivery is the reader's clock
//! when it holds the whole ledger minus that timestamp (one machine, one clock).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::stats::{Record, CSV_HEADER};

/// Wall clock in ns since the epoch: the clock the relay and subscriber stamp ledgers with.
pub use ledger_relay_transport::now_ns;

/// Pacing of a baseline source.
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct Pacing {
    /// `--size`: bytes per ledger.
    #[command(flatten)]
    pub size: crate::cluster::Size,
    /// `--count`.
    #[command(flatten)]
    pub count: crate::cluster::Count,
    /// `--cadence`.
    #[command(flatten)]
    pub cadence: crate::cluster::Cadence,
    /// `--emit-ms`: the window over which a ledger is written.
    #[command(flatten)]
    pub emit: crate::cluster::Emit,
    /// Bytes per write.
    #[arg(long)]
    pub piece: usize,
}

/// Incompressible filler (xorshift; contents do not matter on an uncompressed transport).
pub(crate) fn filler(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

/// What the source thread hands the transport: a piece of ledger `seq`; `last_ns` is set on
/// the ledger's final piece.
struct Piece {
    seq: u32,
    first: bool,
    data: std::sync::Arc<Vec<u8>>,
    range: std::ops::Range<usize>,
    last_ns: Option<u64>,
}

/// Runs the paced source on its own thread; pieces go to the returned channel.
fn source(p: Pacing) -> mpsc::Receiver<Piece> {
    let (tx, rx) = mpsc::channel();
    let size = p.size.ledger_bytes as usize;
    std::thread::spawn(move || {
        let body = std::sync::Arc::new(filler(size, 0x9e37_79b9));
        let pieces = size.div_ceil(p.piece.max(1)).max(1);
        let t0 = Instant::now();
        for seq in 0..p.count.count {
            let start = t0 + Duration::from_secs_f64(f64::from(seq) * p.cadence.cadence_ms / 1e3);
            for k in 0..pieces {
                let at = start
                    + Duration::from_secs_f64(p.emit.emit_ms / 1e3 * k as f64 / pieces as f64);
                if let Some(wait) = at.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
                let range = k * p.piece..((k + 1) * p.piece).min(size);
                let last = k + 1 == pieces;
                let piece = Piece {
                    seq,
                    first: k == 0,
                    data: body.clone(),
                    range,
                    last_ns: last.then(now_ns),
                };
                if tx.send(piece).is_err() {
                    return;
                }
            }
        }
    });
    rx
}

/// `ledger-bench tcp-send`: connects to the receiver and sends `count` ledgers over one TCP
/// connection: per ledger `[u32 len][u32 seq]`, the body, then `[u64 last_byte_ns]`.
pub fn tcp_send(connect: SocketAddr, pacing: Pacing) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut sock = loop {
        match TcpStream::connect(connect) {
            Ok(s) => break s,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(e).with_context(|| format!("connecting to {connect}")),
        }
    };
    sock.set_nodelay(true)?;
    for piece in source(pacing) {
        if piece.first {
            let mut h = [0u8; 8];
            h[..4].copy_from_slice(&(pacing.size.ledger_bytes as u32).to_be_bytes());
            h[4..].copy_from_slice(&piece.seq.to_be_bytes());
            sock.write_all(&h)?;
        }
        sock.write_all(&piece.data[piece.range.clone()])?;
        if let Some(ns) = piece.last_ns {
            sock.write_all(&ns.to_be_bytes())?;
        }
    }
    sock.flush()?;
    Ok(())
}

/// `ledger-bench tcp-recv`: accepts one connection on `listen` and writes a stats CSV row per
/// ledger.
pub fn tcp_recv(listen: SocketAddr, count: u32, stats: PathBuf) -> anyhow::Result<()> {
    let listener = TcpListener::bind(listen).with_context(|| format!("binding {listen}"))?;
    let (mut sock, _) = listener.accept()?;
    let mut out = std::io::BufWriter::new(std::fs::File::create(&stats)?);
    out.write_all(CSV_HEADER.as_bytes())?;
    out.flush()?;
    let mut body = Vec::new();
    let mut prev: Option<u64> = None;
    for _ in 0..count {
        let mut h = [0u8; 8];
        sock.read_exact(&mut h)?;
        let len = u32::from_be_bytes([h[0], h[1], h[2], h[3]]) as usize;
        let seq = u32::from_be_bytes([h[4], h[5], h[6], h[7]]);
        body.resize(len.min(64 << 20), 0);
        sock.read_exact(&mut body)?;
        let received = now_ns();
        let mut t = [0u8; 8];
        sock.read_exact(&mut t)?;
        let last = u64::from_be_bytes(t);
        let r = record(seq, len, received, last, prev);
        prev = Some(received);
        out.write_all(crate::stats::csv_row(&r).as_bytes())?;
        out.flush()?;
    }
    Ok(())
}

/// The record of ledger `seq` of `len` bytes received at `received` (ns since the epoch), its
/// last byte sent at `last`, the ledger before it received at `prev`.
fn record(seq: u32, len: usize, received: u64, last: u64, prev: Option<u64>) -> Record {
    Record {
        seq,
        raw_bytes: len as u64,
        wire_bytes: len as u64,
        delivery_ms: (received as f64 - last as f64) / 1e6,
        inter_arrival_ms: prev.map(|p| (received as f64 - p as f64) / 1e6),
        received_unix_ms: None,
    }
}

/// The local pipe baseline: the paced source writes core's record-marked framing into a pipe,
/// a reader thread reads whole ledgers. Returns one record per ledger.
pub fn pipe(pacing: Pacing) -> anyhow::Result<Vec<Record>> {
    let (r, w) = nix::unistd::pipe().context("creating a pipe")?;
    let mut reader = std::fs::File::from(r);
    let mut writer = std::fs::File::from(w);
    let (ts_tx, ts_rx) = mpsc::channel::<u64>();
    let write = std::thread::spawn(move || -> std::io::Result<()> {
        for piece in source(pacing) {
            if piece.first {
                let mark = 0x8000_0000u32 | pacing.size.ledger_bytes as u32;
                writer.write_all(&mark.to_be_bytes())?;
            }
            writer.write_all(&piece.data[piece.range.clone()])?;
            if piece.last_ns.is_some() {
                // The last byte is in the pipe: that is the moment core finished the ledger.
                let _ = ts_tx.send(now_ns());
            }
        }
        Ok(())
    });
    let mut out = Vec::new();
    let mut body = Vec::new();
    let mut prev: Option<u64> = None;
    for seq in 0..pacing.count.count {
        let mut h = [0u8; 4];
        reader.read_exact(&mut h)?;
        let len = (u32::from_be_bytes(h) & 0x7fff_ffff) as usize;
        body.resize(len, 0);
        reader.read_exact(&mut body)?;
        let received = now_ns();
        let last = ts_rx
            .recv_timeout(Duration::from_secs(5))
            .context("writer timestamp")?;
        out.push(record(seq, len, received, last, prev));
        prev = Some(received);
    }
    write
        .join()
        .map_err(|_| anyhow::anyhow!("pipe writer panicked"))??;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::{Cadence, Count, Emit, Size};

    #[test]
    fn pipe_baseline_delivers_every_ledger() {
        let p = Pacing {
            size: Size {
                ledger_bytes: 100_000,
            },
            count: Count { count: 5 },
            cadence: Cadence { cadence_ms: 5.0 },
            emit: Emit { emit_ms: 1.0 },
            piece: 16_384,
        };
        let r = pipe(p).unwrap();
        assert_eq!(r.len(), 5);
        assert!(r.iter().all(|x| x.raw_bytes == 100_000));
        assert!(r.iter().all(|x| x.delivery_ms < 1000.0));
    }
}
