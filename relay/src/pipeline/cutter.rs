//! The cutter: source events in, ledgers out as chunks: the header peek, the sequence rules
//! (duplicates dropped; a gap, a conflicting hash, a broken chain or garbage is refused, which
//! stops a source with one origin and makes a `relay:` source fail over, see [`OnRefusal`]),
//! chunking, and the hand-off of chunks to the compression pool or, when it is full, raw.

#[allow(clippy::wildcard_imports)]
use super::*;
use ledger_relay_wire::header::{ChainError, ChainVerifier};
use ledger_relay_wire::Hex;

/// Why the cutter refused the source's output.
#[derive(Debug, thiserror::Error)]
pub(super) enum SourceRefused {
    #[error("ledger header unreadable: {0}")]
    Header(#[from] ledger_relay_wire::header::HeaderError),
    #[error("{0}")]
    Chain(ChainError),
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

impl SourceRefused {
    /// The refused ledger's sequence, when its header was read.
    fn seq(&self) -> Option<u32> {
        match self {
            SourceRefused::Header(_) | SourceRefused::NoHeader | SourceRefused::Chain(_) => None,
            SourceRefused::ConflictingHash { seq, .. }
            | SourceRefused::BrokenChain { seq, .. }
            | SourceRefused::Regression { seq, .. } => Some(*seq),
            SourceRefused::Gap { got, .. } => Some(*got),
        }
    }
}

pub(super) enum Ledger {
    /// No ledger in progress.
    Idle,
    /// A ledger started; its header is not yet readable.
    Peeking { first_ns: u64, head: Vec<u8> },
    /// Streaming the ledger `info` out as chunks (`repair`: to the ring only, over its
    /// damaged copy).
    Streaming {
        first_ns: u64,
        info: LedgerHeaderInfo,
        repair: bool,
    },
    /// A duplicate being skipped until its end.
    Skipping,
    /// The source's output was refused and it was told (`OnRefusal::Tell`): its ledger events
    /// are ignored until its next `Abort`.
    Refused,
}

pub(super) struct Cutter {
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
    /// `Abort` events received: the epoch of a [`Refused`].
    aborts: u64,
}

pub(super) const RECENT_HASHES: usize = 256;

/// What the relay already holds of a ledger the source emits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum HeldHash {
    /// Nothing (or nothing that can be read: the ring's store is unavailable).
    Absent,
    /// The ledger with this hash, intact.
    Intact([u8; 32]),
    /// The ring recorded this hash for it, but its stored copy failed verification.
    Damaged([u8; 32]),
}

/// What to do with a ledger the source emits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Admit {
    /// Publish it.
    New,
    /// Drop it: the relay holds it intact.
    Duplicate,
    /// Write it to the ring over its damaged copy, and publish nothing.
    Repair,
}

impl Cutter {
    pub(super) fn new(
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
            aborts: 0,
        }
    }

    pub(super) fn run(
        &mut self,
        mut events: UnboundedReceiver<SourceEvent>,
        on_refusal: &OnRefusal,
    ) {
        while let Some(ev) = events.blocking_recv() {
            if let Err(e) = self.handle(ev) {
                if self.refuse(e, on_refusal) {
                    return;
                }
            }
        }
    }

    fn handle(&mut self, ev: SourceEvent) -> Result<(), SourceRefused> {
        let ledger_part = matches!(
            ev,
            SourceEvent::Begin { .. }
                | SourceEvent::Data(_)
                | SourceEvent::FirstByte { .. }
                | SourceEvent::End { .. }
        );
        if ledger_part && matches!(self.state, Ledger::Refused) {
            // Output the source had passed on before it heard of the refusal.
            return Ok(());
        }
        match ev {
            SourceEvent::Begin { at_ns, .. } => {
                self.metrics.health.source_bytes();
                self.abort("a new record began before the previous ended");
                self.state = Ledger::Peeking {
                    first_ns: at_ns,
                    head: Vec::new(),
                };
            }
            SourceEvent::Data(piece) => {
                self.metrics.health.source_bytes();
                return self.data(piece);
            }
            SourceEvent::FirstByte { at_ns } => match &mut self.state {
                Ledger::Peeking { first_ns, .. } | Ledger::Streaming { first_ns, .. } => {
                    *first_ns = at_ns;
                }
                Ledger::Idle | Ledger::Skipping | Ledger::Refused => {}
            },
            SourceEvent::End { at_ns } => self.end(at_ns),
            SourceEvent::Abort { reason } => {
                self.aborts += 1;
                self.abort(&reason);
            }
            other => self.source_state(other),
        }
        Ok(())
    }

    /// The events about the source itself rather than a ledger.
    fn source_state(&mut self, ev: SourceEvent) {
        let health = &self.metrics.health;
        match ev {
            SourceEvent::Down { reason } => {
                let restarts = self.metrics.source_restarts_total.load(Ordering::Relaxed);
                health.raise(
                    health::SOURCE,
                    Reason::SourceDown {
                        restarts: u32::try_from(restarts).unwrap_or(u32::MAX),
                        cause: reason,
                    },
                );
            }
            SourceEvent::Restarted { attempt, reason } => {
                Metrics::add(&self.metrics.source_restarts_total, 1);
                warn!(attempt, %reason, "source restarted");
                health.raise(
                    health::SOURCE,
                    Reason::SourceRestarted {
                        restarts: attempt,
                        cause: reason,
                    },
                );
            }
            SourceEvent::Finished => {
                info!("source finished");
                health.raise(health::SOURCE, Reason::SourceFinished);
            }
            SourceEvent::Failed(reason) => {
                Metrics::add(&self.metrics.source_errors_total, 1);
                error!(%reason, "source failed");
                self.abort(&reason);
                self.metrics
                    .health
                    .raise(health::SOURCE, Reason::SourceFailed { cause: reason });
            }
            // Ledger events are handled by `handle`.
            _ => {}
        }
    }

    /// Refuses the source's output: the ledger in progress is discarded (sessions given some
    /// of it end with `SourceReset`, the ring never sees it). A source with one origin is
    /// stopped; a source that can go elsewhere is told, and its ledger events are ignored
    /// until it says with an `Abort` that it starts again. Returns whether to stop reading.
    fn refuse(&mut self, e: SourceRefused, on_refusal: &OnRefusal) -> bool {
        let tell = match on_refusal {
            OnRefusal::Tell(tell) => tell,
            OnRefusal::Stop(stop) => {
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
                return true;
            }
        };
        warn!(error = %e, "ledger refused: discarded, and the source told to go on elsewhere");
        self.abort("refused");
        self.state = Ledger::Refused;
        let refused = Refused {
            reason: e.to_string(),
            seq: e.seq(),
            resume_after: self.held(),
            epoch: self.aborts,
        };
        // A source that is gone has nothing more to send either.
        let _ = tell.send(refused);
        false
    }

    /// The newest ledger this relay holds: the last published in this run, else the ring's
    /// newest at start.
    fn held(&self) -> Option<(u32, [u8; 32])> {
        self.last
            .or_else(|| self.recent.last_key_value().map(|(s, h)| (*s, *h)))
    }

    fn data(&mut self, piece: Bytes) -> Result<(), SourceRefused> {
        match &mut self.state {
            Ledger::Idle | Ledger::Skipping | Ledger::Refused => Ok(()),
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
                let admit = self.admit(&info)?;
                if admit == Admit::Duplicate {
                    Metrics::add(&self.metrics.duplicates_dropped_total, 1);
                    info!(seq = info.ledger_seq, "dropping a re-emitted ledger");
                    self.state = Ledger::Skipping;
                    return Ok(());
                }
                let repair = admit == Admit::Repair;
                if repair {
                    info!(
                        seq = info.ledger_seq,
                        "the source emitted again a ledger whose stored copy is damaged: repairing it"
                    );
                }
                self.emission += 1;
                let _ = self.publisher.send(ToPublisher::Begin {
                    emission: self.emission,
                    seq: info.ledger_seq,
                    repair,
                });
                self.chunker.reset();
                self.chunker.push(&head, &mut self.out);
                self.chunker.push(&piece[take..], &mut self.out);
                self.state = Ledger::Streaming {
                    first_ns,
                    info,
                    repair,
                };
                self.dispatch();
                Ok(())
            }
        }
    }

    /// What this relay already holds of ledger `seq`: recently published, or in the ring from
    /// before a restart (core re-emits ledgers it had not committed). A stored copy that fails
    /// verification is told apart from an absent one: it is the same ledger if the hash the
    /// ring recorded for it matches, and it must not be taken for the start of a new run.
    fn held_hash(&self, seq: u32) -> HeldHash {
        if let Some(h) = self.recent.get(&seq) {
            return HeldHash::Intact(*h);
        }
        let Some(ring) = self.ring.as_ref() else {
            return HeldHash::Absent;
        };
        if !ring.holds(seq) {
            return HeldHash::Absent;
        }
        // Rare (a restart of core or of the relay), and off the pipe-reading thread.
        match ring.get(seq) {
            Ok(Some((end, _))) => HeldHash::Intact(end.header_hash),
            Ok(None) => HeldHash::Absent,
            Err(RingError::Corrupt { seq, detail }) => {
                Metrics::add(&self.metrics.ring_corrupt_total, 1);
                warn!(seq, %detail, "stored ledger failed verification");
                match ring.stored_hash(seq) {
                    Ok(Some(h)) => HeldHash::Damaged(h),
                    _ => HeldHash::Absent,
                }
            }
            Err(e) => {
                warn!(seq, error = %e, "cannot read the ring to tell a re-emitted ledger");
                HeldHash::Absent
            }
        }
    }

    /// Applies the sequence rules.
    fn admit(&mut self, info: &LedgerHeaderInfo) -> Result<Admit, SourceRefused> {
        let seq = info.ledger_seq;
        let held = match self.held_hash(seq) {
            HeldHash::Absent => None,
            HeldHash::Intact(h) => Some((h, Admit::Duplicate)),
            HeldHash::Damaged(h) => Some((h, Admit::Repair)),
        };
        if let Some((held, admit)) = held {
            if held == info.hash {
                // Later ledgers must continue from this one.
                self.last = Some((seq, held));
                return Ok(admit);
            }
            if self.last.is_some() || self.recent.contains_key(&seq) {
                return Err(SourceRefused::ConflictingHash {
                    seq,
                    held: Hex(&held).to_string(),
                    got: Hex(&info.hash).to_string(),
                });
            }
            // The first ledger of this run differs from what an earlier run left in the ring:
            // a new run, which the ring writer starts afresh.
        }
        if let Some((last, last_hash)) = self.last {
            // The chain rule has one owner: the verifier the subscriber uses too.
            match ChainVerifier::after(last, last_hash).check(info) {
                Ok(()) => {}
                // After ledger 2^32 - 1 every sequence is a regression.
                Err(ChainError::UnexpectedSequence { got, .. }) if got <= last => {
                    return Err(SourceRefused::Regression { seq, last });
                }
                Err(ChainError::SequenceExhausted { .. }) => {
                    return Err(SourceRefused::Regression { seq, last });
                }
                Err(ChainError::UnexpectedSequence { got, .. }) => {
                    return Err(SourceRefused::Gap { last, got });
                }
                Err(ChainError::BrokenChain {
                    expected_previous,
                    got_previous,
                    ..
                }) => {
                    return Err(SourceRefused::BrokenChain {
                        seq,
                        prev: last,
                        got: Hex(&got_previous).to_string(),
                        expected: Hex(&expected_previous).to_string(),
                    });
                }
                Err(other) => return Err(SourceRefused::Chain(other)),
            }
        }
        Ok(Admit::New)
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
            Ledger::Streaming {
                first_ns,
                info,
                repair,
            } => {
                let (last, summary) = self.chunker.finish();
                self.out.extend(last);
                self.state = Ledger::Streaming {
                    first_ns,
                    info,
                    repair,
                };
                self.dispatch();
                self.state = Ledger::Idle;
                let seq = info.ledger_seq;
                let end = summary.end(seq, info.hash, info.previous_hash, first_ns, last_ns);
                if !repair {
                    Metrics::add(&self.metrics.ledgers_in_total, 1);
                    Metrics::add(&self.metrics.bytes_in_total, summary.raw_len);
                    Metrics::set(&self.metrics.source_newest, u64::from(seq));
                    self.metrics.health.ledger();
                }
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
            Ledger::Idle | Ledger::Skipping | Ledger::Refused => {}
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
            Ledger::Idle | Ledger::Skipping | Ledger::Refused => {}
        }
    }
}
