//! The live state every session reads from: the ledger being published now, the last few
//! complete ledgers in memory, and a broadcast channel of chunks and end records.
//!
//! Chunks are compressed once and shared by reference (their payload is `Bytes`): every
//! subscriber's streams carry the same bytes. A session that falls behind the broadcast channel (it lags by more than
//! the channel's capacity) leaves live mode and reads complete ledgers from memory or the ring at
//! its own pace, so a slow subscriber never slows the source or another subscriber and never
//! grows the relay's memory beyond the channel's capacity.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use ledger_relay_wire::frame::{Chunk, ChunkHeader, LedgerEnd};
use tokio::sync::{broadcast, watch};

use crate::ring::StoredChunk;

pub use ledger_relay_wire::sender::CompleteLedger;

/// A ledger's chunks as the ring stores them: the one conversion the other way.
pub fn stored_chunks(ledger: &CompleteLedger) -> Vec<StoredChunk> {
    ledger
        .chunks
        .iter()
        .map(|c| StoredChunk {
            index: c.header.index,
            raw_offset: c.header.raw_offset,
            raw_len: c.header.raw_len,
            codec: c.header.codec,
            payload: c.payload.clone(),
        })
        .collect()
}

/// A ledger as the ring returns it, in the form every session sends: the one conversion from
/// stored chunks (which carry no sequence of their own) to chunk frames.
pub fn stored_ledger(end: LedgerEnd, chunks: Vec<StoredChunk>) -> CompleteLedger {
    let seq = end.seq;
    CompleteLedger {
        end,
        chunks: chunks
            .into_iter()
            .map(|c| Chunk {
                header: ChunkHeader {
                    seq,
                    index: c.index,
                    raw_offset: c.raw_offset,
                    raw_len: c.raw_len,
                    codec: c.codec,
                },
                payload: c.payload,
            })
            .collect(),
    }
}

/// What the broadcast channel carries.
#[derive(Debug, Clone)]
pub enum Item {
    /// A chunk of the ledger being published.
    Chunk(Chunk),
    /// The end record of a ledger, with all its chunks. They were published before it, one by
    /// one, unless the relay stores and forwards (`--store-and-forward`): then this is the
    /// first a session hears of them, and it sends them from here.
    End(Arc<CompleteLedger>),
    /// The ledger `seq` was cut off by its source; its published chunks are void.
    Abort(u32),
}

/// The ledger being published.
#[derive(Debug, Default, Clone)]
pub struct InProgress {
    /// Its sequence.
    pub seq: u32,
    /// Chunks published so far, in publication order.
    pub chunks: Vec<Chunk>,
}

#[derive(Debug, Default)]
struct State {
    current: Option<InProgress>,
    recent: VecDeque<Arc<CompleteLedger>>,
    /// Newest ledger the ring writer has dealt with (written, or failed to write).
    persisted: u32,
}

/// Complete ledgers the relay's hub keeps in memory (beyond those the ring has not written).
pub const RECENT_LEDGERS: usize = 4;

/// Sequences the hub knows about, for sessions waiting on a start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tip {
    /// Newest complete ledger published (0: none).
    pub newest: u32,
    /// Ledger being published now (0: none).
    pub current: u32,
}

/// The live state. See the module documentation.
#[derive(Debug)]
pub struct Hub {
    state: Mutex<State>,
    tx: broadcast::Sender<Item>,
    tip: watch::Sender<Tip>,
    recent_cap: usize,
}

/// What a session gets when it joins the live stream: the chunks of the ledger in progress
/// published before it joined, and a receiver for everything after, with no gap and no overlap.
#[derive(Debug)]
pub struct LiveJoin {
    /// The ledger in progress at the moment of joining, if any.
    pub current: Option<InProgress>,
    /// Everything published from that moment on.
    pub rx: broadcast::Receiver<Item>,
}

impl Hub {
    /// A hub whose broadcast channel holds `capacity` items (chunks and end records) and which
    /// keeps the last `recent` complete ledgers in memory.
    pub fn new(capacity: usize, recent: usize) -> Hub {
        let (tx, _) = broadcast::channel(capacity.max(16));
        let (tip, _) = watch::channel(Tip::default());
        Hub {
            state: Mutex::new(State::default()),
            tx,
            tip,
            recent_cap: recent.max(1),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave State half-updated in a way that matters
        // (each field is replaced whole), so recover from poisoning.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Publishes a chunk of ledger `header.seq`, starting that ledger if it is new.
    pub fn publish_chunk(&self, item: Chunk) {
        let mut st = self.lock();
        let seq = item.header.seq;
        match &mut st.current {
            Some(cur) if cur.seq == seq => cur.chunks.push(item.clone()),
            _ => {
                st.current = Some(InProgress {
                    seq,
                    chunks: vec![item.clone()],
                });
                self.tip.send_modify(|t| t.current = seq);
            }
        }
        let _ = self.tx.send(Item::Chunk(item));
    }

    /// Announces that ledger `seq` is being published (before its first chunk is compressed),
    /// so sessions waiting for the tip learn its sequence early.
    pub fn begin(&self, seq: u32) {
        let mut st = self.lock();
        if st.current.as_ref().map(|c| c.seq) != Some(seq) {
            st.current = Some(InProgress {
                seq,
                chunks: Vec::new(),
            });
        }
        self.tip.send_modify(|t| t.current = seq);
    }

    /// Publishes a ledger's end record, which carries all its chunks: the ones not published
    /// before (all of them, in store-and-forward mode) reach sessions with it.
    pub fn complete(&self, ledger: Arc<CompleteLedger>) {
        let mut st = self.lock();
        let seq = ledger.end.seq;
        if st.current.as_ref().is_some_and(|c| c.seq == seq) {
            st.current = None;
        }
        st.recent.push_back(ledger.clone());
        Self::prune(&mut st, self.recent_cap);
        self.tip.send_modify(|t| {
            t.newest = seq;
            if t.current == seq {
                t.current = 0;
            }
        });
        let _ = self.tx.send(Item::End(ledger));
    }

    /// Keeps the newest `cap` ledgers, and older ones until the ring writer has dealt with
    /// them: a session that misses a ledger in memory must find it in the ring. How many
    /// that can be is the ring queue's bound (`PipelineConfig::ring_queue_bytes`): the
    /// writer, or the queue when it is full, reports every ledger it is done with.
    fn prune(st: &mut State, cap: usize) {
        while st.recent.len() > cap {
            let front = st.recent.front().map_or(0, |l| l.end.seq);
            if front > st.persisted {
                break;
            }
            st.recent.pop_front();
        }
    }

    /// The ring writer has written (or given up on) every ledger up to `seq`.
    pub fn persisted(&self, seq: u32) {
        let mut st = self.lock();
        st.persisted = st.persisted.max(seq);
        Self::prune(&mut st, self.recent_cap);
    }

    /// Newest ledger the ring writer has dealt with (written, or given up on); every ledger
    /// after it that the hub completed is on its way to the ring.
    pub fn persisted_through(&self) -> u32 {
        self.lock().persisted
    }

    /// Voids the ledger in progress (its source was cut off mid-ledger).
    pub fn abort(&self, seq: u32) {
        let mut st = self.lock();
        if st.current.as_ref().is_some_and(|c| c.seq == seq) {
            st.current = None;
        }
        self.tip.send_modify(|t| {
            if t.current == seq {
                t.current = 0;
            }
        });
        let _ = self.tx.send(Item::Abort(seq));
    }

    /// Joins the live stream (see [`LiveJoin`]).
    pub fn join(&self) -> LiveJoin {
        let st = self.lock();
        LiveJoin {
            current: st.current.clone(),
            rx: self.tx.subscribe(),
        }
    }

    /// The chunks published so far of ledger `seq`, if it is the one in progress.
    pub fn in_progress(&self, seq: u32) -> Option<Vec<Chunk>> {
        let st = self.lock();
        st.current
            .as_ref()
            .filter(|c| c.seq == seq)
            .map(|c| c.chunks.clone())
    }

    /// A complete ledger still held in memory.
    pub fn recent(&self, seq: u32) -> Option<Arc<CompleteLedger>> {
        let st = self.lock();
        st.recent.iter().find(|l| l.end.seq == seq).cloned()
    }

    /// The oldest ledger held in memory.
    pub fn oldest_recent(&self) -> Option<u32> {
        self.lock().recent.front().map(|l| l.end.seq)
    }

    /// The current tip.
    pub fn tip(&self) -> Tip {
        *self.tip.borrow()
    }

    /// Watches the tip.
    pub fn watch_tip(&self) -> watch::Receiver<Tip> {
        self.tip.subscribe()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use bytes::Bytes;
    use ledger_relay_wire::compress::Codec;

    pub(crate) fn chunk(seq: u32, index: u32) -> Chunk {
        Chunk {
            header: ChunkHeader {
                seq,
                index,
                raw_offset: u64::from(index),
                raw_len: 1,
                codec: Codec::None,
            },
            payload: Bytes::from_static(b"x"),
        }
    }

    pub(crate) fn complete(seq: u32, n: u32) -> Arc<CompleteLedger> {
        Arc::new(CompleteLedger {
            end: LedgerEnd {
                seq,
                chunk_count: n,
                raw_len: u64::from(n),
                checksum: 0,
                header_hash: [0; 32],
                previous_hash: [0; 32],
                first_byte_ns: 0,
                last_byte_ns: 0,
            },
            chunks: (0..n).map(|i| chunk(seq, i)).collect(),
        })
    }

    #[test]
    fn joining_mid_ledger_sees_every_chunk_exactly_once() {
        let hub = Hub::new(64, 2);
        hub.publish_chunk(chunk(5, 0));
        hub.publish_chunk(chunk(5, 1));
        let mut join = hub.join();
        hub.publish_chunk(chunk(5, 2));
        hub.complete(complete(5, 3));
        let before: Vec<u32> = join
            .current
            .take()
            .unwrap()
            .chunks
            .iter()
            .map(|c| c.header.index)
            .collect();
        assert_eq!(before, vec![0, 1]);
        let Ok(Item::Chunk(c)) = join.rx.try_recv() else {
            panic!()
        };
        assert_eq!(c.header.index, 2);
        assert!(matches!(join.rx.try_recv(), Ok(Item::End(l)) if l.end.seq == 5));
        assert_eq!(
            hub.tip(),
            Tip {
                newest: 5,
                current: 0
            }
        );
    }

    #[test]
    fn recent_ledgers_are_kept_until_persisted() {
        let hub = Hub::new(16, 2);
        for s in 1..=4 {
            hub.complete(complete(s, 1));
        }
        assert_eq!(hub.oldest_recent(), Some(1), "not in the ring yet");
        hub.persisted(2);
        assert_eq!(hub.oldest_recent(), Some(3));
        // However many wait for the ring (the ring queue bounds them), none is dropped.
        for s in 5..=100 {
            hub.complete(complete(s, 1));
        }
        assert_eq!(
            hub.oldest_recent(),
            Some(3),
            "every unwritten ledger is kept"
        );
        hub.persisted(90);
        assert_eq!(
            hub.oldest_recent(),
            Some(91),
            "then the unwritten ones only"
        );
    }

    #[test]
    fn recent_ledgers_are_bounded() {
        let hub = Hub::new(16, 2);
        hub.persisted(u32::MAX);
        for s in 1..=4 {
            hub.complete(complete(s, 1));
        }
        assert!(hub.recent(2).is_none());
        assert_eq!(hub.recent(4).unwrap().end.seq, 4);
        assert_eq!(hub.oldest_recent(), Some(3));
    }

    #[test]
    fn a_slow_receiver_lags_instead_of_growing_memory() {
        let hub = Hub::new(16, 2);
        let mut join = hub.join();
        for i in 0..100 {
            hub.publish_chunk(chunk(1, i));
        }
        assert!(matches!(
            join.rx.try_recv(),
            Err(broadcast::error::TryRecvError::Lagged(_))
        ));
    }

    /// A chunk is compressed once and every session reads the same bytes: the hub hands each
    /// receiver, a late joiner, the ledger in progress, the complete ledger in memory and the
    /// conversions to and from the ring's form the published `Bytes` (one allocation), never
    /// a copy per subscriber.
    #[test]
    fn every_session_gets_the_published_chunk_bytes_not_a_copy() {
        let payload = |i: u32| Bytes::from(vec![i as u8; 4096]);
        let chunks: Vec<Chunk> = (0..3)
            .map(|i| Chunk {
                payload: payload(i),
                ..chunk(7, i)
            })
            .collect();
        let ptrs = |cs: &[Chunk]| -> Vec<(*const u8, usize)> {
            cs.iter()
                .map(|c| (c.payload.as_ptr(), c.payload.len()))
                .collect()
        };
        let want = ptrs(&chunks);
        let hub = Hub::new(64, 2);
        let mut early = [hub.join(), hub.join()];
        hub.publish_chunk(chunks[0].clone());
        hub.publish_chunk(chunks[1].clone());
        let late = hub.join();
        hub.publish_chunk(chunks[2].clone());
        let ledger = Arc::new(CompleteLedger {
            chunks: chunks.clone(),
            ..(*complete(7, 3)).clone()
        });
        assert_eq!(ptrs(&hub.in_progress(7).unwrap()), want);
        hub.complete(ledger);

        for (n, join) in early.iter_mut().enumerate() {
            let mut got = Vec::new();
            while let Ok(Item::Chunk(c)) = join.rx.try_recv() {
                got.push(c);
            }
            assert_eq!(ptrs(&got), want, "session {n} got a copy");
        }
        assert_eq!(ptrs(&late.current.unwrap().chunks), want[..2]);
        let recent = hub.recent(7).unwrap();
        assert_eq!(ptrs(&recent.chunks), want);
        let round = stored_ledger(recent.end, stored_chunks(&recent));
        assert_eq!(ptrs(&round.chunks), want, "the ring's form copied");
    }
}
