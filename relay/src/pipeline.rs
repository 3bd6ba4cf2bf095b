//! From source events to published chunks: header peek, sequence rules, chunking, the
//! compress-once pool, publication to the hub and hand-off to the ring writer.
//!
//! ```text
//! source thread --events--> cutter thread --jobs (bounded)--> compress workers --+
//!                                  |  (pool full: raw)                           v
//!                                  +----------------------------------------> publisher --> hub (live)
//!                                                                                  \-> ring writer thread --> sled
//!                                                                                  \-> lake exporter (`--export`)
//! ```
//!
//! Nothing upstream waits on anything downstream: the source's channel is unbounded, a full
//! compression queue makes the cutter send the chunk raw (counted), and the ring writer has its
//! own thread and queue, so a slow disk never delays the source or the live stream.
//!
//! With `--store-and-forward` ([`PipelineConfig::store_and_forward`]) the publisher hands the
//! hub no chunk of a ledger until the source has written all of it; the end record then carries
//! them all.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use bytes::Bytes;
use ledger_relay_wire::chunker::{Chunker, RawChunk};
use ledger_relay_wire::compress::{Codec, Compressor};
use ledger_relay_wire::frame::{Chunk, ChunkHeader, LedgerEnd};
use ledger_relay_wire::header::{peek_header, LedgerHeaderInfo, MAX_HEADER_PEEK};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::health::{self, Reason};
use crate::hub::{CompleteLedger, Hub};
use crate::metrics::Metrics;
use crate::ring::{Ring, RingError, StoredChunk};
use crate::source::SourceEvent;

/// How ledgers are cut and compressed.
#[derive(Debug, Clone)]
pub struct PipelineConfig {
    /// Raw bytes per chunk.
    pub chunk_size: usize,
    /// Codec for chunks.
    pub codec: Codec,
    /// zstd level.
    pub zstd_level: i32,
    /// Compression worker threads.
    pub compress_threads: usize,
    /// Chunks that may wait for a compression worker before the cutter sends them raw.
    pub compress_queue: usize,
    /// Store-and-forward: publish a ledger only once the source has written all of it (its
    /// chunks travel in its end record, [`crate::hub::Item::End`]), instead of publishing each
    /// chunk as soon as it is cut and compressed. The publisher holds the chunks of the ledger
    /// in progress in either mode (for the end record and the ring), so this costs no memory:
    /// a ledger is bounded by the source's longest record (`SourceOptions::max_record_len`).
    pub store_and_forward: bool,
    /// Where the publisher also offers each complete ledger for export to a data lake
    /// (`--export`; set by `Relay::start`). Offering never waits.
    pub export: Option<crate::lake::export::ExportTap>,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        PipelineConfig {
            chunk_size: ledger_relay_wire::chunker::DEFAULT_CHUNK_SIZE,
            codec: Codec::Zstd,
            zstd_level: 1,
            compress_threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
            // 64 chunks of 256 KiB: a whole 14.5 MiB ledger may queue.
            compress_queue: 64,
            store_and_forward: false,
            export: None,
        }
    }
}

/// What the ring holds when the relay starts, for deduplication and contiguity.
#[derive(Debug, Clone, Copy, Default)]
pub struct StartState {
    /// Newest ledger in the ring and its hash.
    pub newest: Option<(u32, [u8; 32])>,
}

enum ToPublisher {
    Begin { emission: u64, seq: u32 },
    Chunk { emission: u64, item: Chunk },
    Done { emission: u64, end: LedgerEnd },
    Abort { emission: u64, seq: u32 },
}

struct Job {
    emission: u64,
    seq: u32,
    chunk: RawChunk,
}

/// Handles of the pipeline's threads.
#[derive(Debug)]
pub struct PipelineHandle {
    threads: Vec<JoinHandle<()>>,
}

impl PipelineHandle {
    /// Waits for every pipeline thread to finish (after the source ends).
    pub fn join(self) {
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// Starts the pipeline. `source_stop` is cancelled when the pipeline refuses the source's
/// output (garbage, a gap, a conflicting hash), which stops the source.
pub fn spawn(
    mut config: PipelineConfig,
    events: UnboundedReceiver<SourceEvent>,
    hub: Arc<Hub>,
    ring: Option<Arc<Ring>>,
    start: StartState,
    metrics: Arc<Metrics>,
    source_stop: CancellationToken,
) -> std::io::Result<PipelineHandle> {
    let (pub_tx, pub_rx) = mpsc::channel::<ToPublisher>();
    let (job_tx, job_rx) = mpsc::sync_channel::<Job>(config.compress_queue);
    let job_rx = Arc::new(Mutex::new(job_rx));
    let mut threads = Vec::new();
    for i in 0..config.compress_threads.max(1) {
        let rx = job_rx.clone();
        let tx = pub_tx.clone();
        let (codec, level) = (config.codec, config.zstd_level);
        let metrics = metrics.clone();
        threads.push(
            std::thread::Builder::new()
                .name(format!("compress-{i}"))
                .spawn(move || compress_worker(rx, tx, codec, level, metrics))?,
        );
    }
    let (ring_tx, ring_rx) = mpsc::channel::<Arc<CompleteLedger>>();
    let ring_tx = ring.is_some().then_some(ring_tx);
    // The publisher holds the only tap, so the exporter sees the end of the stream.
    let export = config.export.take();
    {
        let hub = hub.clone();
        let live = if config.store_and_forward {
            Publish::WholeLedgers
        } else {
            Publish::Chunks
        };
        threads.push(
            std::thread::Builder::new()
                .name("publisher".into())
                .spawn(move || publisher(pub_rx, hub, ring_tx, live, export))?,
        );
    }
    let cutter_ring = ring.clone();
    if let Some(ring) = ring {
        let metrics = metrics.clone();
        threads.push(
            std::thread::Builder::new()
                .name("ring-writer".into())
                .spawn(move || ring_writer(ring_rx, ring, hub, metrics))?,
        );
    }
    threads.push(
        std::thread::Builder::new()
            .name("cutter".into())
            .spawn(move || {
                let mut cutter = Cutter::new(config, start, job_tx, pub_tx, metrics, cutter_ring);
                cutter.run(events, &source_stop);
            })?,
    );
    Ok(PipelineHandle { threads })
}

/// Why the cutter refused the source's output.
#[derive(Debug, thiserror::Error)]
enum SourceRefused {
    #[error("ledger header unreadable: {0}")]
    Header(#[from] ledger_relay_wire::header::HeaderError),
    #[error("ledger {seq} arrived with hash {got} but {held} was already published for it")]
    ConflictingHash { seq: u32, held: String, got: String },
    #[error("sequence gap: ledger {got} follows {last}")]
    Gap { last: u32, got: u32 },
    #[error(
        "ledger {seq} does not link to ledger {prev}: previous hash {got}, expected {expected}"
    )]
    BrokenChain {
        seq: u32,
        prev: u32,
        got: String,
        expected: String,
    },
    #[error("ledger {seq} regresses behind {last}")]
    Regression { seq: u32, last: u32 },
    #[error("no ledger header in the first {MAX_HEADER_PEEK} bytes")]
    NoHeader,
}

fn hex(h: &[u8; 32]) -> String {
    h.iter().map(|b| format!("{b:02x}")).collect()
}

enum Ledger {
    /// No ledger in progress.
    Idle,
    /// A ledger started; its header is not yet readable.
    Peeking { first_ns: u64, head: Vec<u8> },
    /// Streaming the ledger `info` out as chunks.
    Streaming {
        first_ns: u64,
        info: LedgerHeaderInfo,
    },
    /// A duplicate being skipped until its end.
    Skipping,
}

struct Cutter {
    config: PipelineConfig,
    chunker: Chunker,
    state: Ledger,
    emission: u64,
    /// The last ledger published in this run.
    last: Option<(u32, [u8; 32])>,
    /// Hashes of recent ledgers, for deduplication of re-emitted ones.
    recent: BTreeMap<u32, [u8; 32]>,
    jobs: SyncSender<Job>,
    publisher: mpsc::Sender<ToPublisher>,
    metrics: Arc<Metrics>,
    out: Vec<RawChunk>,
    ring: Option<Arc<Ring>>,
}

const RECENT_HASHES: usize = 256;

impl Cutter {
    fn new(
        config: PipelineConfig,
        start: StartState,
        jobs: SyncSender<Job>,
        publisher: mpsc::Sender<ToPublisher>,
        metrics: Arc<Metrics>,
        ring: Option<Arc<Ring>>,
    ) -> Cutter {
        let mut recent = BTreeMap::new();
        if let Some((seq, hash)) = start.newest {
            recent.insert(seq, hash);
        }
        Cutter {
            chunker: Chunker::new(config.chunk_size),
            config,
            state: Ledger::Idle,
            emission: 0,
            last: None,
            recent,
            jobs,
            publisher,
            metrics,
            out: Vec::new(),
            ring,
        }
    }

    fn run(&mut self, mut events: UnboundedReceiver<SourceEvent>, stop: &CancellationToken) {
        while let Some(ev) = events.blocking_recv() {
            let r = match ev {
                SourceEvent::Begin { at_ns, .. } => {
                    self.metrics.health.source_bytes();
                    self.abort("a new record began before the previous ended");
                    self.state = Ledger::Peeking {
                        first_ns: at_ns,
                        head: Vec::new(),
                    };
                    Ok(())
                }
                SourceEvent::Data(piece) => {
                    self.metrics.health.source_bytes();
                    self.data(piece)
                }
                SourceEvent::End { at_ns } => {
                    self.end(at_ns);
                    Ok(())
                }
                SourceEvent::Abort { reason } => {
                    self.abort(&reason);
                    Ok(())
                }
                SourceEvent::Down { reason } => {
                    let restarts = self.metrics.source_restarts_total.load(Ordering::Relaxed);
                    self.metrics.health.raise(
                        health::SOURCE,
                        Reason::SourceDown {
                            restarts: u32::try_from(restarts).unwrap_or(u32::MAX),
                            cause: reason,
                        },
                    );
                    Ok(())
                }
                SourceEvent::Restarted { attempt, reason } => {
                    Metrics::add(&self.metrics.source_restarts_total, 1);
                    warn!(attempt, %reason, "source restarted");
                    self.metrics.health.raise(
                        health::SOURCE,
                        Reason::SourceRestarted {
                            restarts: attempt,
                            cause: reason,
                        },
                    );
                    Ok(())
                }
                SourceEvent::Finished => {
                    info!("source finished");
                    self.metrics
                        .health
                        .raise(health::SOURCE, Reason::SourceFinished);
                    Ok(())
                }
                SourceEvent::Failed(reason) => {
                    Metrics::add(&self.metrics.source_errors_total, 1);
                    error!(%reason, "source failed");
                    self.abort(&reason);
                    self.metrics
                        .health
                        .raise(health::SOURCE, Reason::SourceFailed { cause: reason });
                    Ok(())
                }
            };
            if let Err(e) = r {
                Metrics::add(&self.metrics.source_errors_total, 1);
                error!(error = %e, "source stopped: its output is refused");
                self.metrics.health.raise(
                    health::SOURCE,
                    Reason::SourceFailed {
                        cause: format!("its output is refused: {e}"),
                    },
                );
                self.abort("refused");
                stop.cancel();
                return;
            }
        }
    }

    fn data(&mut self, piece: Bytes) -> Result<(), SourceRefused> {
        match &mut self.state {
            Ledger::Idle | Ledger::Skipping => Ok(()),
            Ledger::Streaming { .. } => {
                self.chunker.push(&piece, &mut self.out);
                self.dispatch();
                Ok(())
            }
            Ledger::Peeking { first_ns, head } => {
                let first_ns = *first_ns;
                let take = piece.len().min(MAX_HEADER_PEEK.saturating_sub(head.len()));
                head.extend_from_slice(&piece[..take]);
                let Some(info) = peek_header(head)? else {
                    if head.len() >= MAX_HEADER_PEEK {
                        // peek_header always answers given MAX_HEADER_PEEK bytes; defensive.
                        return Err(SourceRefused::NoHeader);
                    }
                    return Ok(());
                };
                let head = std::mem::take(head);
                if !self.admit(&info)? {
                    Metrics::add(&self.metrics.duplicates_dropped_total, 1);
                    info!(seq = info.ledger_seq, "dropping a re-emitted ledger");
                    self.state = Ledger::Skipping;
                    return Ok(());
                }
                self.emission += 1;
                let _ = self.publisher.send(ToPublisher::Begin {
                    emission: self.emission,
                    seq: info.ledger_seq,
                });
                self.chunker.reset();
                self.chunker.push(&head, &mut self.out);
                self.chunker.push(&piece[take..], &mut self.out);
                self.state = Ledger::Streaming { first_ns, info };
                self.dispatch();
                Ok(())
            }
        }
    }

    /// The hash of ledger `seq` if this relay already holds it: recently published, or in the
    /// ring from before a restart (core re-emits ledgers it had not committed).
    fn held_hash(&self, seq: u32) -> Option<[u8; 32]> {
        if let Some(h) = self.recent.get(&seq) {
            return Some(*h);
        }
        let ring = self.ring.as_ref()?;
        let (oldest, newest) = ring.range()?;
        if !(oldest..=newest).contains(&seq) {
            return None;
        }
        // Rare (a restart of core or of the relay), and off the pipe-reading thread.
        ring.get(seq).ok().flatten().map(|(end, _)| end.header_hash)
    }

    /// Applies the sequence rules: `Ok(false)` for a duplicate to drop.
    fn admit(&mut self, info: &LedgerHeaderInfo) -> Result<bool, SourceRefused> {
        let seq = info.ledger_seq;
        if let Some(held) = self.held_hash(seq) {
            if held == info.hash {
                // Later ledgers must continue from this one.
                self.last = Some((seq, held));
                return Ok(false);
            }
            if self.last.is_some() || self.recent.contains_key(&seq) {
                return Err(SourceRefused::ConflictingHash {
                    seq,
                    held: hex(&held),
                    got: hex(&info.hash),
                });
            }
            // The first ledger of this run differs from what an earlier run left in the ring:
            // a new run, which the ring writer starts afresh.
        }
        if let Some((last, last_hash)) = self.last {
            if seq <= last {
                return Err(SourceRefused::Regression { seq, last });
            }
            if seq != last + 1 {
                return Err(SourceRefused::Gap { last, got: seq });
            }
            if info.previous_hash != last_hash {
                return Err(SourceRefused::BrokenChain {
                    seq,
                    prev: last,
                    got: hex(&info.previous_hash),
                    expected: hex(&last_hash),
                });
            }
        }
        Ok(true)
    }

    fn dispatch(&mut self) {
        let Ledger::Streaming { info, .. } = &self.state else {
            return;
        };
        let seq = info.ledger_seq;
        for chunk in self.out.drain(..) {
            Metrics::add(&self.metrics.chunks_total, 1);
            if self.config.codec == Codec::None {
                let item = raw_item(seq, &chunk);
                Metrics::add(&self.metrics.wire_bytes_total, chunk.data.len() as u64);
                let _ = self.publisher.send(ToPublisher::Chunk {
                    emission: self.emission,
                    item,
                });
                continue;
            }
            let job = Job {
                emission: self.emission,
                seq,
                chunk,
            };
            match self.jobs.try_send(job) {
                Ok(()) => {}
                Err(TrySendError::Full(job)) | Err(TrySendError::Disconnected(job)) => {
                    Metrics::add(&self.metrics.pool_saturated_total, 1);
                    Metrics::add(&self.metrics.wire_bytes_total, job.chunk.data.len() as u64);
                    let _ = self.publisher.send(ToPublisher::Chunk {
                        emission: self.emission,
                        item: raw_item(seq, &job.chunk),
                    });
                }
            }
        }
    }

    fn end(&mut self, last_ns: u64) {
        match std::mem::replace(&mut self.state, Ledger::Idle) {
            Ledger::Streaming { first_ns, info } => {
                let (last, summary) = self.chunker.finish();
                self.out.extend(last);
                self.state = Ledger::Streaming { first_ns, info };
                self.dispatch();
                self.state = Ledger::Idle;
                let seq = info.ledger_seq;
                let end = summary.end(seq, info.hash, info.previous_hash, first_ns, last_ns);
                Metrics::add(&self.metrics.ledgers_in_total, 1);
                Metrics::add(&self.metrics.bytes_in_total, summary.raw_len);
                Metrics::set(&self.metrics.source_newest, u64::from(seq));
                self.metrics.health.ledger();
                self.last = Some((seq, info.hash));
                self.recent.insert(seq, info.hash);
                while self.recent.len() > RECENT_HASHES {
                    self.recent.pop_first();
                }
                let _ = self.publisher.send(ToPublisher::Done {
                    emission: self.emission,
                    end,
                });
            }
            Ledger::Peeking { .. } => {
                // A record too short to hold a ledger header.
                Metrics::add(&self.metrics.source_errors_total, 1);
                warn!("a record ended before its ledger header: discarded");
            }
            Ledger::Idle | Ledger::Skipping => {}
        }
    }

    fn abort(&mut self, reason: &str) {
        match std::mem::replace(&mut self.state, Ledger::Idle) {
            Ledger::Streaming { info, .. } => {
                Metrics::add(&self.metrics.source_aborts_total, 1);
                warn!(seq = info.ledger_seq, %reason, "ledger cut off by its source: discarded");
                self.chunker.reset();
                self.out.clear();
                let _ = self.publisher.send(ToPublisher::Abort {
                    emission: self.emission,
                    seq: info.ledger_seq,
                });
            }
            Ledger::Peeking { .. } => {
                Metrics::add(&self.metrics.source_aborts_total, 1);
            }
            Ledger::Idle | Ledger::Skipping => {}
        }
    }
}

/// A ledger that arrives whole (from a data lake) in the relay's chunked form: cut into
/// `config.chunk_size` chunks and each compressed with `comp` exactly as the live pipeline cuts
/// and compresses (`ledger_chunks` is the whole-ledger form of the [`Chunker`]), with the end
/// record built from its checked header.
pub fn complete_ledger(
    raw: &Bytes,
    info: &LedgerHeaderInfo,
    config: &PipelineConfig,
    comp: &mut Compressor,
    first_byte_ns: u64,
    last_byte_ns: u64,
) -> CompleteLedger {
    let seq = info.ledger_seq;
    let (chunks, summary) =
        ledger_relay_wire::chunker::ledger_chunks(seq, raw, config.chunk_size, comp);
    CompleteLedger {
        end: summary.end(
            seq,
            info.hash,
            info.previous_hash,
            first_byte_ns,
            last_byte_ns,
        ),
        chunks: chunks.into_iter().collect(),
    }
}

fn raw_item(seq: u32, chunk: &RawChunk) -> Chunk {
    Chunk {
        header: ChunkHeader {
            seq,
            index: chunk.index,
            raw_offset: chunk.offset,
            raw_len: chunk.data.len() as u32,
            codec: Codec::None,
        },
        payload: chunk.data.clone(),
    }
}

fn compress_worker(
    jobs: Arc<Mutex<Receiver<Job>>>,
    out: mpsc::Sender<ToPublisher>,
    codec: Codec,
    level: i32,
    metrics: Arc<Metrics>,
) {
    let mut comp = Compressor::new(codec, level);
    loop {
        let job = {
            let rx = jobs.lock().unwrap_or_else(|e| e.into_inner());
            match rx.recv() {
                Ok(j) => j,
                Err(_) => return,
            }
        };
        let (used, payload) = comp.compress(&job.chunk.data);
        if used != codec {
            Metrics::add(&metrics.raw_fallback_total, 1);
        }
        Metrics::add(&metrics.wire_bytes_total, payload.len() as u64);
        let item = Chunk {
            header: ChunkHeader {
                seq: job.seq,
                index: job.chunk.index,
                raw_offset: job.chunk.offset,
                raw_len: job.chunk.data.len() as u32,
                codec: used,
            },
            payload,
        };
        if out
            .send(ToPublisher::Chunk {
                emission: job.emission,
                item,
            })
            .is_err()
        {
            return;
        }
    }
}

struct Pending {
    emission: u64,
    seq: u32,
    /// Chunks by index: published ones for the head of the queue, buffered ones behind it.
    chunks: HashMap<u32, Chunk>,
    end: Option<LedgerEnd>,
}

impl Pending {
    fn complete(&self) -> bool {
        self.end
            .is_some_and(|e| self.chunks.len() as u64 == u64::from(e.chunk_count))
    }
}

/// When the hub learns of a ledger's chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Publish {
    /// Each chunk as soon as it is compressed, while the source still writes the ledger.
    Chunks,
    /// All of them at once, in the end record, once the source has written the whole ledger
    /// (store-and-forward).
    WholeLedgers,
}

/// Publishes ledgers strictly one after another: the cutter may already cut ledger N+1 while
/// the pool still compresses the end of ledger N, and N+1's chunks wait here until N is
/// complete, so the hub (and every session) sees one ledger in progress at a time.
///
/// With [`Publish::WholeLedgers`] the head's chunks wait here too, until its end record: a
/// ledger's `Done` is sent by the cutter only after the source's `End`, so no chunk reaches a
/// session before the source's last byte of that ledger was read.
fn publisher(
    rx: Receiver<ToPublisher>,
    hub: Arc<Hub>,
    ring: Option<mpsc::Sender<Arc<CompleteLedger>>>,
    live: Publish,
    export: Option<crate::lake::export::ExportTap>,
) {
    let mut queue: std::collections::VecDeque<Pending> = std::collections::VecDeque::new();
    while let Ok(msg) = rx.recv() {
        match msg {
            ToPublisher::Begin { emission, seq } => {
                if queue.is_empty() {
                    hub.begin(seq);
                }
                queue.push_back(Pending {
                    emission,
                    seq,
                    chunks: HashMap::new(),
                    end: None,
                });
            }
            ToPublisher::Chunk { emission, item } => {
                // Output of an aborted emission still leaving the pool finds no entry: void.
                let head = queue.front().map(|p| p.emission);
                if let Some(p) = queue.iter_mut().find(|p| p.emission == emission) {
                    p.chunks.insert(item.header.index, item.clone());
                    if head == Some(emission) && live == Publish::Chunks {
                        hub.publish_chunk(item);
                    }
                }
            }
            ToPublisher::Done { emission, end } => {
                if let Some(p) = queue.iter_mut().find(|p| p.emission == emission) {
                    p.end = Some(end);
                }
            }
            ToPublisher::Abort { emission, seq } => {
                if let Some(i) = queue.iter().position(|p| p.emission == emission) {
                    queue.remove(i);
                    if i == 0 {
                        hub.abort(seq);
                        start_head(&queue, &hub, live);
                    }
                }
            }
        }
        // Publish end records of the head ledgers that are complete, in order.
        while queue.front().is_some_and(Pending::complete) {
            let Some(p) = queue.pop_front() else { break };
            let Some(end) = p.end else { break };
            let mut chunks: Vec<Chunk> = p.chunks.into_values().collect();
            chunks.sort_by_key(|c| c.header.index);
            debug_assert_eq!(p.seq, end.seq);
            let ledger = Arc::new(CompleteLedger { end, chunks });
            // Store-and-forward: the end record carries every chunk, published here at once.
            hub.complete(ledger.clone());
            if let Some(export) = &export {
                export.offer(&ledger);
            }
            match &ring {
                Some(ring) => {
                    let _ = ring.send(ledger);
                }
                None => hub.persisted(end.seq),
            }
            start_head(&queue, &hub, live);
        }
    }
}

/// Starts publishing the new head of the queue: its sequence and (unless store-and-forward)
/// the chunks it buffered.
fn start_head(queue: &std::collections::VecDeque<Pending>, hub: &Hub, live: Publish) {
    if let Some(next) = queue.front() {
        hub.begin(next.seq);
        if live == Publish::WholeLedgers {
            return;
        }
        let mut buffered: Vec<&Chunk> = next.chunks.values().collect();
        buffered.sort_by_key(|c| c.header.index);
        for c in buffered {
            hub.publish_chunk(c.clone());
        }
    }
}

fn ring_writer(
    rx: Receiver<Arc<CompleteLedger>>,
    ring: Arc<Ring>,
    hub: Arc<Hub>,
    metrics: Arc<Metrics>,
) {
    while let Ok(ledger) = rx.recv() {
        let chunks: Vec<StoredChunk> = ledger
            .chunks
            .iter()
            .map(|c| StoredChunk {
                index: c.header.index,
                raw_offset: c.header.raw_offset,
                raw_len: c.header.raw_len,
                codec: c.header.codec,
                payload: c.payload.clone(),
            })
            .collect();
        let mut r = ring.append(&ledger.end, &chunks);
        if let Err(RingError::Discontinuity { newest, seq, .. }) = &r {
            // The source started a new run (or the ring missed ledgers while the disk was
            // failing): a ring must never splice two runs, so it starts over.
            warn!(
                newest,
                seq, "ring does not continue into this ledger: starting a new run"
            );
            r = ring.reset().and_then(|_| {
                Metrics::add(&metrics.ring_resets_total, 1);
                ring.append(&ledger.end, &chunks)
            });
        }
        match r {
            // The health condition changes before the flag, so that whoever sees the flag
            // change finds /healthz already saying the same (this thread is the only writer).
            Ok(()) => {
                if metrics.ring_degraded.load(Ordering::Relaxed) {
                    metrics.health.clear(health::RING);
                    metrics.ring_degraded.store(false, Ordering::Relaxed);
                    info!("ring writes succeed again");
                }
            }
            Err(e) => {
                Metrics::add(&metrics.ring_write_errors_total, 1);
                metrics.health.raise(
                    health::RING,
                    Reason::RingDegraded {
                        error: e.to_string(),
                    },
                );
                if !metrics.ring_degraded.swap(true, Ordering::Relaxed) {
                    error!(error = %e, seq = ledger.end.seq, "ring write failed: ring degraded, live streaming continues");
                }
            }
        }
        // Written or not, the hub may now let go of it (a failed write leaves the ring
        // degraded; sessions then get the below-retention error rather than unbounded memory).
        hub.persisted(ledger.end.seq);
        update_ring_metrics(&ring, &metrics);
    }
}

/// Copies the ring's state into the metrics.
pub fn update_ring_metrics(ring: &Ring, metrics: &Metrics) {
    let stats = ring.stats();
    Metrics::set(&metrics.ring_oldest, u64::from(stats.oldest.unwrap_or(0)));
    Metrics::set(&metrics.ring_newest, u64::from(stats.newest.unwrap_or(0)));
    Metrics::set(&metrics.ring_ledgers, stats.ledgers);
    Metrics::set(&metrics.ring_bytes, stats.live_bytes);
    Metrics::set(&metrics.ring_disk_bytes, stats.disk_bytes);
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use ledger_relay_wire::compress::decompress;
    use ledger_relay_wire::Limits;
    use tokio::sync::broadcast::error::TryRecvError;

    use super::*;
    use crate::hub::Item;
    use crate::source::{now_ns, synthetic_ledgers, SyntheticSpec};

    /// Three 600 KiB ledgers: ten 64 KiB chunks each.
    fn ledgers() -> Vec<Bytes> {
        let spec = SyntheticSpec {
            size: 600 << 10,
            ratio: 2.0,
            count: Some(3),
            start: 2,
            emit: None,
            ..SyntheticSpec::default()
        };
        synthetic_ledgers(&spec).map(Bytes::from).collect()
    }

    fn start(
        store_and_forward: bool,
    ) -> (
        tokio::sync::mpsc::UnboundedSender<SourceEvent>,
        Arc<Hub>,
        PipelineHandle,
    ) {
        let config = PipelineConfig {
            chunk_size: 64 << 10,
            compress_threads: 2,
            store_and_forward,
            ..PipelineConfig::default()
        };
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let hub = Arc::new(Hub::new(512, 4));
        let handle = spawn(
            config,
            rx,
            hub.clone(),
            None,
            StartState::default(),
            Metrics::new(),
            CancellationToken::new(),
        )
        .unwrap();
        (tx, hub, handle)
    }

    /// Sends everything of `ledger` but its end, in 100 KiB pieces.
    fn send_body(tx: &tokio::sync::mpsc::UnboundedSender<SourceEvent>, ledger: &Bytes) {
        tx.send(SourceEvent::Begin {
            len: ledger.len() as u32,
            at_ns: now_ns(),
        })
        .unwrap();
        for piece in ledger.chunks(100 << 10) {
            tx.send(SourceEvent::Data(Bytes::copy_from_slice(piece)))
                .unwrap();
        }
    }

    /// The next broadcast item, waiting up to 5 s.
    fn next_item(rx: &mut tokio::sync::broadcast::Receiver<Item>) -> Item {
        for _ in 0..500 {
            match rx.try_recv() {
                Ok(item) => return item,
                Err(TryRecvError::Empty) => std::thread::sleep(Duration::from_millis(10)),
                Err(e) => panic!("broadcast: {e}"),
            }
        }
        panic!("no item within 5 s")
    }

    fn raw(ledger: &CompleteLedger) -> Vec<u8> {
        let mut out = Vec::new();
        for c in &ledger.chunks {
            let h = &c.header;
            out.extend(decompress(h.codec, &c.payload, h.raw_len, &Limits::default()).unwrap());
        }
        out
    }

    #[test]
    fn store_and_forward_publishes_nothing_of_a_ledger_before_its_end() {
        let want = ledgers();
        let (tx, hub, handle) = start(true);
        let mut rx = hub.join().rx;
        for ledger in &want {
            send_body(&tx, ledger);
            // Far longer than compressing ten chunks takes: in chunked mode they are out by now
            // (see the test below).
            std::thread::sleep(Duration::from_millis(300));
            assert!(
                matches!(rx.try_recv(), Err(TryRecvError::Empty)),
                "nothing is published before the source's end"
            );
            let before = now_ns();
            tx.send(SourceEvent::End { at_ns: before }).unwrap();
            let Item::End(got) = next_item(&mut rx) else {
                panic!("store-and-forward publishes the ledger whole, in its end record")
            };
            assert_eq!(got.end.last_byte_ns, before);
            assert_eq!(got.chunks.len(), 10);
            assert_eq!(got.end.chunk_count, 10);
            assert!(raw(&got) == ledger[..], "ledger {} intact", got.end.seq);
            assert!(hub.join().current.is_none_or(|c| c.chunks.is_empty()));
        }
        drop(tx);
        handle.join();
    }

    #[test]
    fn a_whole_ledger_is_chunked_exactly_as_the_live_pipeline_does() {
        let want = ledgers();
        let (tx, hub, handle) = start(false);
        let mut rx = hub.join().rx;
        let config = PipelineConfig {
            chunk_size: 64 << 10,
            ..PipelineConfig::default()
        };
        for ledger in &want {
            send_body(&tx, ledger);
            tx.send(SourceEvent::End { at_ns: now_ns() }).unwrap();
            let live = loop {
                if let Item::End(l) = next_item(&mut rx) {
                    break l;
                }
            };
            let info = peek_header(ledger).unwrap().unwrap();
            let mut comp = Compressor::new(config.codec, config.zstd_level);
            let whole = complete_ledger(ledger, &info, &config, &mut comp, 1, 2);
            let (mut a, mut b) = (live.end, whole.end);
            (
                a.first_byte_ns,
                a.last_byte_ns,
                b.first_byte_ns,
                b.last_byte_ns,
            ) = (0, 0, 0, 0);
            assert_eq!(a, b, "the same end record");
            assert_eq!(live.chunks.len(), whole.chunks.len());
            for (x, y) in live.chunks.iter().zip(&whole.chunks) {
                assert_eq!(x.header, y.header);
                assert!(
                    x.payload == y.payload,
                    "chunk {} compressed the same",
                    x.header.index
                );
            }
        }
        drop(tx);
        handle.join();
    }

    #[test]
    fn chunked_mode_publishes_chunks_before_the_end() {
        let want = ledgers();
        let (tx, hub, handle) = start(false);
        let mut rx = hub.join().rx;
        send_body(&tx, &want[0]);
        // Nine full chunks are cut before the end (the tenth is the remainder).
        for i in 0..9 {
            match next_item(&mut rx) {
                Item::Chunk(c) => assert_eq!(c.header.seq, 2, "chunk {i}"),
                other => panic!("expected a chunk before the end, got {other:?}"),
            }
        }
        tx.send(SourceEvent::End { at_ns: now_ns() }).unwrap();
        assert!(matches!(next_item(&mut rx), Item::Chunk(_)));
        let Item::End(got) = next_item(&mut rx) else {
            panic!("end record last")
        };
        assert!(raw(&got) == want[0][..]);
        drop(tx);
        handle.join();
    }
}
