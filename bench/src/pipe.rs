//! The local pipe, what ingest reading core's pipe on the same box sees: a writer thread emits
//! each ledger in core's record marking over the emit window, in 192 KiB writes, stamped as the
//! last starts (a later stamp could follow the reader's); a reader reads whole ledgers, one clock.

use std::io::{Read, Write};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::Context;
use ledger_relay_transport::now_ns;

use crate::stats::Record;

/// Incompressible filler (xorshift).
pub fn filler(len: usize, seed: u64) -> Vec<u8> {
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

/// `count` ledgers of `size` bytes every `cadence_ms`, each written over `emit_ms`.
pub fn run(size: usize, count: u32, cadence_ms: f64, emit_ms: f64) -> anyhow::Result<Vec<Record>> {
    let (r, w) = nix::unistd::pipe().context("creating a pipe")?;
    let (mut reader, mut writer) = (std::fs::File::from(r), std::fs::File::from(w));
    let (stamps, stamped) = mpsc::channel::<u64>();
    let (body, pieces) = (filler(size, 0x9e37_79b9), size.div_ceil(192 << 10).max(1));
    let write = std::thread::spawn(move || -> std::io::Result<()> {
        let t0 = Instant::now();
        for k in 0..count {
            let start = t0 + Duration::from_secs_f64(f64::from(k) * cadence_ms / 1e3);
            writer.write_all(&(0x8000_0000u32 | size as u32).to_be_bytes())?;
            let mut last_write = 0;
            for (i, piece) in body.chunks(size.div_ceil(pieces)).enumerate() {
                let at = start + Duration::from_secs_f64(emit_ms / 1e3 * i as f64 / pieces as f64);
                std::thread::sleep(at.saturating_duration_since(Instant::now()));
                last_write = now_ns();
                writer.write_all(piece)?;
            }
            let _ = stamps.send(last_write);
        }
        Ok(())
    });
    let (mut out, mut buf) = (Vec::new(), Vec::new());
    let mut prev: Option<f64> = None;
    for seq in 0..count {
        let mut h = [0u8; 4];
        reader.read_exact(&mut h)?;
        buf.resize((u32::from_be_bytes(h) & 0x7fff_ffff) as usize, 0);
        reader.read_exact(&mut buf)?;
        let received = now_ns() as f64 / 1e6;
        let stamp = stamped
            .recv_timeout(Duration::from_secs(5))
            .context("the writer's stamp")?;
        let last = stamp as f64 / 1e6;
        out.push(Record {
            seq,
            raw_bytes: buf.len() as u64,
            wire_bytes: buf.len() as u64,
            delivery_ms: received - last,
            inter_arrival_ms: prev.map(|p| received - p),
            received_unix_ms: received,
        });
        prev = Some(received);
    }
    write
        .join()
        .map_err(|_| anyhow::anyhow!("the pipe's writer panicked"))??;
    Ok(out)
}
