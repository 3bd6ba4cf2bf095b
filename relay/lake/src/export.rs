//! Writing a stream of ledgers into a lake the way Galexie does: whole batches, in order, each
//! object written once, resuming after the newest ledger the lake holds.
//!
//! [`BatchAssembler`] is the rule book, without IO: it knows the lake's newest ledger (its
//! *tail*), skips what the lake already holds, checks that each new ledger links to the tail,
//! and hands out a batch once its last ledger has arrived. A batch begins where its key's
//! range begins, except the first one after an empty lake or a gap, which begins at the first
//! ledger the writer has (as Galexie's first batch begins at ledger 2). The caller uploads
//! batches with [`crate::Lake::put_batch`] and retries with [`Backoff`].

use std::time::Duration;

use ledger_relay_wire::header::{ChainError, ChainVerifier};
use ledger_relay_wire::lake::{BatchLedger, Schema};
use ledger_relay_wire::Hex;
use rand::Rng;

use crate::error::LakeError;

/// What [`BatchAssembler::offer`] did with a ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offer {
    /// The lake already holds it (at or before the tail): not written again.
    AlreadyHeld,
    /// Taken into the batch being assembled.
    Taken,
    /// Taken, but ledgers `expected..got` never arrived: the batch in progress (if any) was
    /// dropped, since it can never be complete, and a new one begins at `got`.
    AfterGap {
        /// The ledger that was due.
        expected: u32,
        /// The ledger that came.
        got: u32,
        /// Ledgers of the dropped, incomplete batch.
        dropped: usize,
    },
}

/// Batches ledgers for a lake. See the [module docs](self).
#[derive(Debug)]
pub struct BatchAssembler {
    schema: Schema,
    tail: Option<(u32, [u8; 32])>,
    pending: Vec<BatchLedger>,
}

impl BatchAssembler {
    /// An assembler for a lake of `schema` whose newest ledger is `tail` (`None`: empty).
    pub fn new(schema: Schema, tail: Option<(u32, [u8; 32])>) -> BatchAssembler {
        BatchAssembler {
            schema,
            tail,
            pending: Vec::new(),
        }
    }

    /// The ledger the lake needs next (`None` for an empty lake: any).
    pub fn wanted(&self) -> Option<u32> {
        self.tail.map(|(seq, _)| seq.saturating_add(1))
    }

    /// Ledgers taken but not yet handed out in a batch.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Offers the next ledger. A ledger at the tail must have the tail's hash, and the one
    /// after it must link to it: otherwise the lake holds another history (another network,
    /// or another run of a standalone network) and nothing more is written
    /// ([`LakeError::BrokenChain`] or [`LakeError::Conflict`]).
    pub fn offer(&mut self, ledger: BatchLedger) -> Result<Offer, LakeError> {
        let info = ledger.info;
        let seq = info.ledger_seq;
        let key = || self.schema.object_key(seq);
        let mut offer = Offer::Taken;
        if let Some((tseq, thash)) = self.tail {
            if seq == tseq && info.hash != thash {
                return Err(LakeError::Conflict {
                    key: key(),
                    reason: format!(
                        "the lake holds ledger {seq} with hash {}, this relay has {}",
                        Hex(&thash),
                        Hex(&info.hash)
                    ),
                });
            }
            if seq <= tseq {
                return Ok(Offer::AlreadyHeld);
            }
            match ChainVerifier::after(tseq, thash).check(&info) {
                Ok(()) => {}
                Err(ChainError::BrokenChain { .. }) => {
                    return Err(LakeError::broken_chain(
                        key(),
                        tseq,
                        &thash,
                        &(&info).into(),
                    ));
                }
                // Past tseq + 1 (an older or the same ledger returned above): a gap.
                Err(_) => {
                    offer = Offer::AfterGap {
                        expected: tseq + 1,
                        got: seq,
                        dropped: self.pending.len(),
                    };
                    self.pending.clear();
                }
            }
        }
        self.tail = Some((seq, info.hash));
        self.pending.push(ledger);
        Ok(offer)
    }

    /// The batch whose last ledger has arrived, if any: ledgers in order, to write at the key
    /// of its first.
    pub fn take_ready(&mut self) -> Option<Vec<BatchLedger>> {
        let first = self.pending.first()?.info.ledger_seq;
        let last = self.pending.last()?.info.ledger_seq;
        (last == self.schema.batch_range(first).1).then(|| std::mem::take(&mut self.pending))
    }
}

/// Exponential backoff with jitter, for retrying uploads: `min`, doubling to `max`, each wait
/// drawn between half and all of its step, reset on success.
#[derive(Debug, Clone)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// Backoff from `min` to `max`.
    pub fn new(min: Duration, max: Duration) -> Backoff {
        Backoff {
            min,
            max: max.max(min),
            next: min,
        }
    }

    /// The next wait.
    pub fn next_wait(&mut self) -> Duration {
        let step = self.next;
        self.next = (self.next * 2).min(self.max);
        let half = step / 2;
        half + rand::thread_rng().gen_range(Duration::ZERO..=half)
    }

    /// Back to the shortest wait.
    pub fn reset(&mut self) {
        self.next = self.min;
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use ledger_relay_wire::header::LedgerHeaderInfo;

    use super::*;

    /// A ledger `seq` whose hash is `[seq; 32]` and which links to `seq - 1`'s.
    fn ledger(seq: u32) -> BatchLedger {
        let h = |s: u32| [s as u8; 32];
        BatchLedger {
            info: LedgerHeaderInfo {
                lcm_version: 0,
                ledger_seq: seq,
                hash: h(seq),
                previous_hash: h(seq - 1),
                protocol_version: 19,
                close_time: 0,
                header_end: 0,
                tx_set_hash: [0; 32],
                tx_set_result_hash: [0; 32],
            },
            raw: Bytes::from(vec![seq as u8]),
        }
    }

    fn seqs(batch: Option<Vec<BatchLedger>>) -> Vec<u32> {
        batch
            .unwrap_or_default()
            .iter()
            .map(|l| l.info.ledger_seq)
            .collect()
    }

    #[test]
    fn batches_follow_their_ranges_and_a_gap_drops_the_incomplete_one() {
        let mut a = BatchAssembler::new(Schema::new(4, 8).unwrap(), None);
        assert_eq!(a.wanted(), None);
        // An empty lake: the first batch starts at the first ledger, inside 8-11.
        assert_eq!(a.offer(ledger(10)).unwrap(), Offer::Taken);
        assert!(a.take_ready().is_none());
        a.offer(ledger(11)).unwrap();
        assert_eq!(seqs(a.take_ready()), [10, 11]);
        assert_eq!(a.wanted(), Some(12));
        // 12 never comes: the batch 12-15 starts again at 13.
        assert_eq!(
            a.offer(ledger(13)).unwrap(),
            Offer::AfterGap {
                expected: 12,
                got: 13,
                dropped: 0
            }
        );
        a.offer(ledger(14)).unwrap();
        a.offer(ledger(15)).unwrap();
        assert_eq!(seqs(a.take_ready()), [13, 14, 15]);
        // 16 and 17 are taken, 18 never comes: they can never be a whole batch.
        a.offer(ledger(16)).unwrap();
        a.offer(ledger(17)).unwrap();
        assert_eq!(a.pending(), 2);
        assert_eq!(
            a.offer(ledger(19)).unwrap(),
            Offer::AfterGap {
                expected: 18,
                got: 19,
                dropped: 2
            }
        );
        assert_eq!(seqs(a.take_ready()), [19]);
        // What the lake holds is not taken again.
        assert_eq!(a.offer(ledger(19)).unwrap(), Offer::AlreadyHeld);
        assert_eq!(a.offer(ledger(3)).unwrap(), Offer::AlreadyHeld);
    }

    #[test]
    fn the_tail_must_match_and_the_next_ledger_must_link() {
        let mut a = BatchAssembler::new(Schema::new(1, 1).unwrap(), Some((9, [9; 32])));
        assert_eq!(a.wanted(), Some(10));
        let mut other = ledger(9);
        other.info.hash = [1; 32];
        assert!(matches!(a.offer(other), Err(LakeError::Conflict { .. })));
        let mut unlinked = ledger(10);
        unlinked.info.previous_hash = [1; 32];
        assert!(matches!(
            a.offer(unlinked),
            Err(LakeError::BrokenChain {
                seq: 10,
                prev: 9,
                ..
            })
        ));
        assert_eq!(a.offer(ledger(10)).unwrap(), Offer::Taken);
        assert_eq!(seqs(a.take_ready()), [10]);
    }

    #[test]
    fn backoff_doubles_to_its_cap_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(400));
        let waits: Vec<Duration> = (0..5).map(|_| b.next_wait()).collect();
        for (w, step) in waits.iter().zip([100, 200, 400, 400, 400]) {
            let step = Duration::from_millis(step);
            assert!(*w >= step / 2 && *w <= step, "{w:?} for {step:?}");
        }
        b.reset();
        assert!(b.next_wait() <= Duration::from_millis(100));
    }
}
