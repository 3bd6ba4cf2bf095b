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
//! own thread and queue, so a slow disk never delays the source or the live stream. The ring's
//! queue is bounded in bytes ([`PipelineConfig::ring_queue_bytes`]); the ledgers in it stay in
//! the hub's memory, reachable to sessions, and a ledger that failed to write stays in it until
//! the store is back (see [`ring_queue`]).
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
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::defaults::DEFAULTS;
use crate::health::{self, Reason};
use crate::hub::{CompleteLedger, Hub};
use crate::metrics::Metrics;
use crate::ring::{Ring, RingError};
use crate::source::{Refused, SourceEvent};

mod cutter;
pub mod ring_queue;
use cutter::Cutter;
use ring_queue::{ring_writer, RingQueue};

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
    pub export: Option<ExportTap>,
    /// Most payload bytes of complete ledgers waiting for the ring writer (a slow disk, or one
    /// that failed and waits to be writable again). They stay in the hub's memory until
    /// written, so this also bounds it; beyond it the oldest is given up for the ring, which
    /// then starts a new run (see [`ring_queue`]).
    pub ring_queue_bytes: u64,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        PipelineConfig {
            chunk_size: DEFAULTS.chunk_size as usize,
            codec: DEFAULTS.codec,
            zstd_level: DEFAULTS.zstd_level,
            compress_threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
            // 64 chunks of 256 KiB: a whole 14.5 MiB ledger may queue.
            compress_queue: 64,
            store_and_forward: false,
            export: None,
            ring_queue_bytes: ring_queue::DEFAULT_RING_QUEUE_BYTES,
        }
    }
}

/// The publisher's side of the export queue to a data lake (`--export`, whose exporter is
/// `lake::export`): offering a ledger never waits.
#[derive(Debug, Clone)]
pub struct ExportTap {
    tx: SyncSender<Arc<CompleteLedger>>,
    metrics: Arc<Metrics>,
}

impl ExportTap {
    /// The tap of the queue `tx` feeds; a full queue counts into `metrics`.
    pub(crate) fn new(tx: SyncSender<Arc<CompleteLedger>>, metrics: Arc<Metrics>) -> ExportTap {
        ExportTap { tx, metrics }
    }

    /// Queues a complete ledger for export, or counts it as left for the ring when the queue
    /// is full.
    pub fn offer(&self, ledger: &Arc<CompleteLedger>) {
        match self.tx.try_send(ledger.clone()) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                Metrics::add(&self.metrics.lake.export_queue_full_total, 1);
            }
            // The exporter stopped for good (it says why in the log).
            Err(TrySendError::Disconnected(_)) => {}
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
    /// A ledger starts. `repair`: a held ledger whose stored copy is damaged, emitted again by
    /// the source: it goes to the ring only, to be written over the damaged copy.
    Begin {
        emission: u64,
        seq: u32,
        repair: bool,
    },
    Chunk {
        emission: u64,
        item: Chunk,
    },
    Done {
        emission: u64,
        end: LedgerEnd,
    },
    Abort {
        emission: u64,
        seq: u32,
    },
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

/// What the pipeline does when it refuses the source's output (garbage, a gap, a conflicting
/// hash, a broken chain).
#[derive(Debug)]
pub enum OnRefusal {
    /// Stop the source (this token is cancelled): a source with one origin (core's pipe, a
    /// file, a lake) has nothing else to give.
    Stop(CancellationToken),
    /// Discard the ledger and tell the source, which goes on from another origin: a `relay:`
    /// source sets the upstream that sent it aside and fails over (see [`Refused`]).
    Tell(UnboundedSender<Refused>),
}

/// Starts the pipeline; `on_refusal` says what refusing the source's output does.
pub fn spawn(
    mut config: PipelineConfig,
    events: UnboundedReceiver<SourceEvent>,
    hub: Arc<Hub>,
    ring: Option<Arc<Ring>>,
    start: StartState,
    metrics: Arc<Metrics>,
    on_refusal: OnRefusal,
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
    let queue = ring.is_some().then(|| {
        Arc::new(RingQueue::new(
            config.ring_queue_bytes,
            hub.clone(),
            metrics.clone(),
        ))
    });
    let writer_queue = queue.clone();
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
                .spawn(move || publisher(pub_rx, hub, queue, live, export))?,
        );
    }
    let cutter_ring = ring.clone();
    if let (Some(ring), Some(queue)) = (ring, writer_queue) {
        threads.push(
            std::thread::Builder::new()
                .name("ring-writer".into())
                .spawn(move || ring_writer(queue, ring))?,
        );
    }
    threads.push(
        std::thread::Builder::new()
            .name("cutter".into())
            .spawn(move || {
                let mut cutter = Cutter::new(config, start, job_tx, pub_tx, metrics, cutter_ring);
                cutter.run(events, &on_refusal);
            })?,
    );
    Ok(PipelineHandle { threads })
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
    repair: bool,
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
    ring: Option<Arc<RingQueue>>,
    live: Publish,
    export: Option<ExportTap>,
) {
    let mut queue: std::collections::VecDeque<Pending> = std::collections::VecDeque::new();
    while let Ok(msg) = rx.recv() {
        match msg {
            ToPublisher::Begin {
                emission,
                seq,
                repair,
            } => {
                if queue.is_empty() && !repair {
                    hub.begin(seq);
                }
                queue.push_back(Pending {
                    emission,
                    seq,
                    repair,
                    chunks: HashMap::new(),
                    end: None,
                });
            }
            ToPublisher::Chunk { emission, item } => {
                // Output of an aborted emission still leaving the pool finds no entry: void.
                let head = queue.front().map(|p| p.emission);
                if let Some(p) = queue.iter_mut().find(|p| p.emission == emission) {
                    p.chunks.insert(item.header.index, item.clone());
                    if head == Some(emission) && live == Publish::Chunks && !p.repair {
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
                    let removed = queue.remove(i);
                    if i == 0 {
                        if !removed.is_some_and(|p| p.repair) {
                            hub.abort(seq);
                        }
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
            if p.repair {
                if let Some(ring) = &ring {
                    ring.push(ledger, true);
                }
                start_head(&queue, &hub, live);
                continue;
            }
            // Store-and-forward: the end record carries every chunk, published here at once.
            hub.complete(ledger.clone());
            if let Some(export) = &export {
                export.offer(&ledger);
            }
            match &ring {
                Some(ring) => ring.push(ledger, false),
                None => hub.persisted(end.seq),
            }
            start_head(&queue, &hub, live);
        }
    }
    if let Some(ring) = ring {
        ring.close();
    }
}

/// Starts publishing the new head of the queue: its sequence and (unless store-and-forward)
/// the chunks it buffered.
fn start_head(queue: &std::collections::VecDeque<Pending>, hub: &Hub, live: Publish) {
    if let Some(next) = queue.front().filter(|p| !p.repair) {
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

/// Copies the ring's state into the metrics.
pub fn update_ring_metrics(ring: &Ring, metrics: &Metrics) {
    let stats = ring.stats();
    Metrics::set(&metrics.ring_oldest, u64::from(stats.oldest.unwrap_or(0)));
    Metrics::set(&metrics.ring_newest, u64::from(stats.newest.unwrap_or(0)));
    Metrics::set(&metrics.ring_ledgers, stats.ledgers);
    Metrics::set(&metrics.ring_runs, stats.runs);
    Metrics::set(&metrics.ring_bytes, stats.live_bytes);
    Metrics::set(&metrics.ring_disk_bytes, stats.disk_bytes);
}

#[cfg(test)]
mod tests;
