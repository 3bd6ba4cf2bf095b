//! `--export URL`: every ledger the relay receives, written to a SEP-54 lake as Galexie writes
//! it, off the path that delivers ledgers.
//!
//! ```text
//! publisher --ExportTap (try_send, bounded)--> exporter thread --put-if-absent--> lake
//!                                                   ^
//!                              ring (ledgers the queue had no room for, and history
//!                              held before the lake's newest + 1)
//! ```
//!
//! The publisher hands each complete ledger to [`ExportTap::offer`], which never waits: when
//! the queue is full (the lake is slow or failing) the ledger is left out and counted, and the
//! exporter reads it back from the ring later. The exporter has its own thread and its own
//! tokio runtime, so neither an upload nor compressing a batch ever runs on a delivery path.
//!
//! On start the exporter finds the lake's newest ledger and resumes right after it, reading
//! from the ring what it needs (an empty lake starts at the oldest ledger the ring holds).
//! Objects are put only if absent, and one already there must hold the same ledgers, so a
//! crash at any moment leaves no gap (the ring still holds what was not written) and no
//! object written twice. Uploads are retried forever with backoff while the lake is
//! unreachable or refusing; the lake is then `degraded` in `/healthz` and the metrics, and
//! live streaming is untouched. A lake holding another history (another network, a conflicting
//! object) stops the export for good, with the reason in the log.

use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use ledger_relay_lake::{
    Backoff, BatchAssembler, BatchLedger, Lake, LakeError, LakeOptions, LakeUrl, Layout, Offer,
    PutOutcome,
};
use ledger_relay_wire::compress::{decompress, Codec};
use ledger_relay_wire::header::peek_header;
use ledger_relay_wire::Limits;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::defaults::DEFAULTS;
use crate::hub::CompleteLedger;
use crate::metrics::Metrics;
use crate::pipeline::ExportTap;
use crate::ring::Ring;

/// What `--export` was told.
#[derive(Debug, Clone)]
pub struct ExportConfig {
    /// The lake.
    pub url: LakeUrl,
    /// `--export-ledgers-per-file` and `--export-files-per-partition`, when given.
    pub layout: Layout,
    /// The network passphrase written into (and checked against) the manifest.
    pub network: String,
    /// zstd level of the objects (`--export-zstd-level`, default 1: on a 2-core relay level 3,
    /// about what Galexie's compressor uses, added 6-24% to delivery p50 and level 1 1-13%;
    /// see bench/RESULTS.md).
    pub zstd_level: i32,
    /// Ledgers the queue between the publisher and the exporter holds.
    pub queue: usize,
    /// Least and greatest wait between two attempts at a failing upload.
    pub backoff: (Duration, Duration),
    /// How long the exporter keeps retrying after shutdown began before giving up (what it
    /// did not write, the next run writes from the ring).
    pub shutdown_grace: Duration,
    /// Store client settings.
    pub options: LakeOptions,
}

impl ExportConfig {
    /// The defaults for `url` on `network`.
    pub fn new(url: LakeUrl, network: String) -> ExportConfig {
        ExportConfig {
            url,
            layout: Layout::default(),
            network,
            zstd_level: DEFAULTS.export_zstd_level,
            // Writing a Phase 3 ledger takes ~50 ms against a 600 ms cadence, so a healthy lake
            // keeps this near empty; a failing one fills it, and then it holds 4 ledgers' chunks
            // (shared with the hub and ring writer) while the rest wait in the ring.
            queue: 4,
            backoff: (Duration::from_millis(200), Duration::from_secs(30)),
            shutdown_grace: Duration::from_secs(10),
            options: LakeOptions::default(),
        }
    }
}

/// The running exporter.
#[derive(Debug)]
pub struct Exporter {
    thread: JoinHandle<()>,
}

impl Exporter {
    /// Waits for the exporter to finish (after the publisher dropped its tap, or `stop`).
    pub fn join(self) {
        let _ = self.thread.join();
    }
}

/// Starts the exporter thread. `stop` is the relay's shutdown: after it, the exporter drains
/// what the publisher still sends, writes what is complete (retrying for at most
/// [`ExportConfig::shutdown_grace`]) and ends when the publisher's tap is dropped.
pub fn spawn(
    cfg: ExportConfig,
    ring: Option<Arc<Ring>>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) -> std::io::Result<(ExportTap, Exporter)> {
    let (tx, rx) = mpsc::sync_channel(cfg.queue.max(1));
    metrics.lake.export_enabled.store(true, Ordering::Relaxed);
    let tap = ExportTap::new(tx, metrics.clone());
    let thread = std::thread::Builder::new()
        .name("lake-export".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    error!(error = %e, "lake export cannot start its runtime: export off");
                    set_degraded(&metrics, Some(format!("no runtime: {e}")));
                    return;
                }
            };
            let mut ex = Run {
                cfg,
                rx,
                ring,
                metrics,
                stop,
                rt,
                stopping_since: None,
                ring_wait_since: None,
            };
            if let Err(reason) = ex.run() {
                set_degraded(&ex.metrics, Some(format!("stopped: {reason}")));
                error!(%reason, "lake export stopped; live streaming goes on");
                // Keep the queue empty so the publisher's offers cost nothing.
                while ex.rx.recv().is_ok() {}
            }
        })?;
    Ok((tap, Exporter { thread }))
}

/// Why the exporter gave up: a reason for the log.
type Fatal = String;

struct Run {
    cfg: ExportConfig,
    rx: Receiver<Arc<CompleteLedger>>,
    ring: Option<Arc<Ring>>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
    rt: tokio::runtime::Runtime,
    stopping_since: Option<Instant>,
    /// While waiting for the ring to write a ledger the queue skipped: since when, and the
    /// ring's newest ledger then (see [`Run::ring_behind`]).
    ring_wait_since: Option<(Instant, u32)>,
}

/// How long the exporter waits for a ring that makes no progress before it leaves a gap.
const RING_WAIT: Duration = Duration::from_secs(5);

/// The next ledger the exporter handles.
enum Next {
    Ledger(BatchLedger),
    /// Nothing for now.
    Idle,
    /// The publisher is gone and everything has been handled.
    Done,
}

impl Run {
    fn run(&mut self) -> Result<(), Fatal> {
        let lake = self.open()?;
        let Some(lake) = lake else { return Ok(()) };
        let lake = Arc::new(lake);
        let tail = self.with_retry("finding the lake's newest ledger", |rt| {
            rt.block_on(lake.newest())
        })?;
        let Some(tail) = tail else { return Ok(()) };
        if let Some((seq, _)) = tail {
            Metrics::set(&self.metrics.lake.export_newest, u64::from(seq));
            info!(lake = %self.cfg.url, newest = seq, "lake export resumes after the lake's newest ledger");
        } else {
            info!(lake = %self.cfg.url, "lake export starts an empty lake");
        }
        let mut asm = BatchAssembler::new(lake.schema(), tail);
        // An empty lake starts with the history the relay already holds.
        let mut want = asm
            .wanted()
            .or_else(|| self.ring.as_ref().and_then(|r| r.range()).map(|r| r.0));
        let mut queued: Option<Arc<CompleteLedger>> = None;
        loop {
            let next = self.next(&mut want, &mut queued);
            match next {
                Next::Done => return Ok(()),
                Next::Idle => continue,
                Next::Ledger(l) => {
                    let seq = l.info.ledger_seq;
                    match asm.offer(l) {
                        Ok(Offer::AlreadyHeld) | Ok(Offer::Taken) => {}
                        Ok(Offer::AfterGap {
                            expected,
                            got,
                            dropped,
                        }) => {
                            Metrics::add(&self.metrics.lake.export_gaps_total, 1);
                            warn!(
                                expected,
                                got, dropped, "ledgers are in neither the export queue nor the ring: the lake has a gap"
                            );
                        }
                        Err(e) => {
                            lake.stats().count(&e);
                            return Err(format!("{e}"));
                        }
                    }
                    want = asm.wanted().or(Some(seq.saturating_add(1)));
                }
            }
            while let Some(batch) = asm.take_ready() {
                let last = batch.last().map_or(0, |l| l.info.ledger_seq);
                let level = self.cfg.zstd_level;
                let put = self.with_retry("writing a batch", |rt| {
                    rt.block_on(lake.put_batch(&batch, level))
                })?;
                match put {
                    Some(PutOutcome::Written { .. }) | Some(PutOutcome::AlreadyPresent) => {
                        Metrics::set(&self.metrics.lake.export_newest, u64::from(last));
                    }
                    None => {
                        warn!(
                            last,
                            "shutdown: a batch was left unwritten; the next run writes it from the ring"
                        );
                        return Ok(());
                    }
                }
            }
        }
    }

    /// Opens the lake, retrying while it is unreachable. `None`: shut down meanwhile.
    fn open(&mut self) -> Result<Option<Lake>, Fatal> {
        let cfg = self.cfg.clone();
        let stats = self.metrics.lake.export.clone();
        self.with_retry("opening the lake", |rt| {
            rt.block_on(Lake::open_for_writing(
                &cfg.url,
                &cfg.options,
                &cfg.network,
                cfg.layout,
                stats.clone(),
            ))
        })
    }

    /// Runs `op` until it succeeds or fails for good; waits with backoff in between while
    /// the failure is transient (the lake is then degraded). `Ok(None)`: the shutdown grace
    /// ran out first.
    fn with_retry<T>(
        &mut self,
        what: &str,
        mut op: impl FnMut(&tokio::runtime::Runtime) -> Result<T, LakeError>,
    ) -> Result<Option<T>, Fatal> {
        let mut backoff = Backoff::new(self.cfg.backoff.0, self.cfg.backoff.1);
        loop {
            match op(&self.rt) {
                Ok(v) => {
                    if set_degraded(&self.metrics, None) {
                        info!(lake = %self.cfg.url, "lake export works again");
                    }
                    return Ok(Some(v));
                }
                Err(e) if e.is_transient() => {
                    Metrics::add(&self.metrics.lake.export_retries_total, 1);
                    if !set_degraded(&self.metrics, Some(format!("{what}: {e}"))) {
                        warn!(lake = %self.cfg.url, error = %e, "{what} failed: lake export degraded, retrying; live streaming goes on");
                    }
                    let wait = backoff.next_wait();
                    if !self.pause(wait) {
                        return Ok(None);
                    }
                }
                Err(e) => return Err(format!("{what}: {e}")),
            }
        }
    }

    /// Sleeps `wait` unless the shutdown grace runs out first (`false`). The queue is not
    /// read meanwhile: the publisher's offers then find it full and leave the ledgers to the
    /// ring.
    fn pause(&mut self, wait: Duration) -> bool {
        let end = Instant::now() + wait;
        while Instant::now() < end {
            if self.stop.is_cancelled() {
                let since = *self.stopping_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= self.cfg.shutdown_grace {
                    return false;
                }
            }
            std::thread::sleep((end - Instant::now()).min(Duration::from_millis(50)));
        }
        true
    }

    /// The next ledger to hand to the assembler: `want` from the ring when the queue skipped
    /// it, else the next queued one.
    fn next(&mut self, want: &mut Option<u32>, queued: &mut Option<Arc<CompleteLedger>>) -> Next {
        if queued.is_none() {
            match self.rx.recv_timeout(Duration::from_millis(200)) {
                Ok(l) => *queued = Some(l),
                Err(RecvTimeoutError::Timeout) => {
                    // Nothing new: catch up from the ring if it holds what the lake wants.
                    return match want.and_then(|w| self.ring_ledger(w)) {
                        Some(l) => Next::Ledger(l),
                        None => Next::Idle,
                    };
                }
                Err(RecvTimeoutError::Disconnected) => {
                    // The publisher is gone: what the ring still holds beyond the lake.
                    if let Some(l) = want.and_then(|w| self.ring_ledger(w)) {
                        return Next::Ledger(l);
                    }
                    // The ledgers the queue skipped may still wait for the ring's writer (a
                    // file source ends, the publisher with it, while a slow disk is still
                    // writing the last ledgers): wait for them while the writer makes
                    // progress, rather than end with them missing from the lake (seen on a
                    // loaded machine: the export ended 8 ledgers short).
                    let writing = self.metrics.ring_queue_ledgers.load(Ordering::Relaxed) > 0;
                    if writing && want.is_some_and(|w| self.ring_behind(w)) {
                        std::thread::sleep(Duration::from_millis(10));
                        return Next::Idle;
                    }
                    return Next::Done;
                }
            }
        }
        let Some(l) = queued.as_ref() else {
            return Next::Idle;
        };
        let seq = l.end.seq;
        if let Some(w) = *want {
            if w < seq {
                if let Some(from_ring) = self.ring_ledger(w) {
                    self.ring_wait_since = None;
                    return Next::Ledger(from_ring);
                }
                if self.ring_behind(w) {
                    // The queue skipped `w` and the ring's writer has not written it yet (it
                    // is in the ring's queue): wait for it rather than leave a gap.
                    std::thread::sleep(Duration::from_millis(10));
                    return Next::Idle;
                }
            }
        }
        self.ring_wait_since = None;
        let l = queued.take().expect("checked above");
        match raw_ledger(&l) {
            Ok(bl) => Next::Ledger(bl),
            Err(reason) => {
                error!(seq, %reason, "a published ledger cannot be exported: skipped");
                Next::Idle
            }
        }
    }

    /// Whether the ring has not reached `seq` yet and may still write it: its newest ledger
    /// is below `seq` and it has written something within [`RING_WAIT`] of the wait's start.
    /// `false` when there is no ring, when the ring went past `seq` without it (it gave the
    /// ledger up), or when it made no progress for [`RING_WAIT`] (a failing disk): the lake
    /// then gets a gap, counted and logged, rather than the export stalling behind the ring.
    fn ring_behind(&mut self, seq: u32) -> bool {
        let Some(ring) = self.ring.as_ref() else {
            return false;
        };
        let newest = ring.range().map_or(0, |r| r.1);
        if newest >= seq {
            return false;
        }
        let now = Instant::now();
        match self.ring_wait_since {
            Some((since, seen)) if seen == newest => now.duration_since(since) < RING_WAIT,
            _ => {
                self.ring_wait_since = Some((now, newest));
                true
            }
        }
    }

    /// Ledger `seq` from the ring, if it holds it.
    fn ring_ledger(&self, seq: u32) -> Option<BatchLedger> {
        let ring = self.ring.as_ref()?;
        if !ring.holds(seq) {
            return None;
        }
        let (end, chunks) = match ring.get(seq) {
            Ok(Some(got)) => got,
            Ok(None) => return None,
            Err(e) => {
                warn!(seq, error = %e, "the exporter could not read a ledger from the ring");
                return None;
            }
        };
        Metrics::add(&self.metrics.lake.export_ring_reads_total, 1);
        let pieces: Vec<(Codec, Bytes, u32)> = chunks
            .into_iter()
            .map(|c| (c.codec, c.payload, c.raw_len))
            .collect();
        match assemble(end.seq, end.checksum, &pieces) {
            Ok(l) => Some(l),
            Err(reason) => {
                warn!(seq, %reason, "a ledger from the ring cannot be exported");
                None
            }
        }
    }
}

/// A published ledger's raw bytes and header.
fn raw_ledger(l: &CompleteLedger) -> Result<BatchLedger, String> {
    let pieces: Vec<(Codec, Bytes, u32)> = l
        .chunks
        .iter()
        .map(|c| (c.header.codec, c.payload.clone(), c.header.raw_len))
        .collect();
    assemble(l.end.seq, l.end.checksum, &pieces)
}

/// Decompresses a ledger's chunks, checks them against its checksum and reads its header.
fn assemble(
    seq: u32,
    checksum: u64,
    chunks: &[(Codec, Bytes, u32)],
) -> Result<BatchLedger, String> {
    let limits = Limits::default();
    let len: usize = chunks.iter().map(|c| c.2 as usize).sum();
    let mut raw = BytesMut::with_capacity(len);
    for (codec, payload, raw_len) in chunks {
        let piece = decompress(*codec, payload, *raw_len, &limits).map_err(|e| e.to_string())?;
        raw.extend_from_slice(&piece);
    }
    let raw = raw.freeze();
    if ledger_relay_wire::checksum(&raw) != checksum {
        return Err(format!("ledger {seq}: checksum mismatch"));
    }
    let info = peek_header(&raw)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("ledger {seq}: no header"))?;
    if info.ledger_seq != seq {
        return Err(format!("ledger {seq}: its header says {}", info.ledger_seq));
    }
    Ok(BatchLedger { info, raw })
}

/// Marks the export degraded with `error`, or healthy with `None`, in the metrics and in
/// `/healthz`'s reasons; returns whether it was degraded before.
pub(crate) fn set_degraded(metrics: &Metrics, error: Option<String>) -> bool {
    const KEY: &str = "lake_export";
    match error {
        Some(error) => {
            metrics
                .health
                .raise(KEY, crate::health::Reason::LakeExport { error });
            metrics.lake.export_degraded.swap(true, Ordering::Relaxed)
        }
        None => {
            metrics.health.clear(KEY);
            metrics.lake.export_degraded.swap(false, Ordering::Relaxed)
        }
    }
}
