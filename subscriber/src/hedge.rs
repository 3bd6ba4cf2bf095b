//! Hedged subscriptions (`SubscribeConfig::hedge`, `ledger-subscribe --hedge`): one plain
//! subscription per relay of `relays`, all at once, merged into one Stream.
//!
//! Each relay's subscription verifies what it receives as a plain one does (reassembly,
//! checksum, header, chain, content) and resumes by itself after a failure, in the background.
//! The merge takes each ledger from whichever relay first delivers a verified copy and drops
//! the others' copies; every ledger it hands on must also be the next link of the one chain it
//! follows across relays ([`ChainVerifier`]), so the output is exactly once, in order and
//! checked across sources. A copy that repeats an already delivered sequence with another hash
//! (a relay on another chain) ends that relay's part.
//!
//! A relay's subscription is restarted from the next ledger to hand on (with the last one
//! handed on as its anchor) when it delivers past that ledger (a gap: it started at a later
//! tip, for example) or when it is more than [`BEHIND_LEDGERS`] behind and has delivered
//! nothing for [`BEHIND_FOR`] (its relay died or stalled and is not catching up by itself).
//! A terminal error on one relay (an authorization failure, a start below its retention, data
//! that does not verify) ends that relay's part, logged; the Stream yields an error only when
//! no relay is left, with the last relay's error.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use futures::StreamExt;
use ledger_relay_wire::frame::Start;
use ledger_relay_wire::header::{ChainError, ChainLink, ChainVerifier};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::{Anchor, RelayAddr, SubscribeConfig};
use crate::error::{ErrorChain, SubscribeError, VerifyError};
use crate::first_look::Tally;
use crate::ledger::{Item, Ledger, Shared};
use crate::subscription::{spawn, Subscription};

/// A relay this many ledgers behind the last one handed on ...
pub const BEHIND_LEDGERS: u32 = 16;
/// ... that has delivered nothing for this long is restarted from the next ledger.
pub const BEHIND_FOR: Duration = Duration::from_secs(30);
/// How often the relays' states are looked at (status, the behind check, the first-connect
/// deadline).
const TICK: Duration = Duration::from_millis(200);
/// The last ledgers handed on (hash and when), to check the copies that lose against them and
/// time them for the first look ([`crate::first_look`]).
const RECENT: usize = 256;

/// One relay of a hedged subscription.
struct Source {
    relay: RelayAddr,
    /// `None` once the relay's part ended (a terminal error).
    sub: Option<Subscription>,
    /// The last sequence it delivered (a copy or a winner), 0 before any.
    last_seq: u32,
    /// When it last delivered anything (or was started).
    last_at: Instant,
}

/// Starts a hedged subscription: one plain subscription per relay of `config`, merged.
pub(crate) fn start(config: SubscribeConfig) -> Result<Subscription, SubscribeError> {
    spawn(config, crate::LaneMonitor::default(), None, supervise)
}

/// What wakes the merge: a relay's next item, or the tick.
enum Event {
    Item(usize, Option<Item>),
    Tick,
}

/// The merge behind a hedged [`Subscription`]: runs until the consumer goes away or no relay is
/// left.
pub(crate) async fn supervise(
    shared: Arc<Shared>,
    tx: mpsc::Sender<Item>,
    cancel: CancellationToken,
) {
    let mut merge = match Merge::start(shared) {
        Ok(merge) => merge,
        Err(e) => {
            let _ = tx.send(Err(e)).await;
            return;
        }
    };
    let mut turn = 0usize;
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        if merge.sources.iter().all(|s| s.sub.is_none()) {
            if let Some(e) = merge.last_error.take() {
                merge.shared.status().last_error = Some(ErrorChain(&e).to_string());
                let _ = tx.send(Err(e)).await;
            }
            return;
        }
        turn = turn.wrapping_add(1);
        let sources = &mut merge.sources;
        let next = poll_fn(|cx| poll_sources(sources, turn, cx));
        let event = tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tx.closed() => return,
            (i, item) = next => Event::Item(i, item),
            _ = tick.tick() => Event::Tick,
        };
        let ledger = match event {
            Event::Tick => match merge.on_tick() {
                Some(e) => {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
                None => continue,
            },
            Event::Item(i, item) => match merge.accept(i, item) {
                Some(ledger) => ledger,
                None => continue,
            },
        };
        let (seq, relay) = (ledger.seq, ledger.relay);
        tokio::select! {
            sent = tx.send(Ok(ledger)) => if sent.is_err() { return },
            _ = cancel.cancelled() => return,
        }
        let mut status = merge.shared.status();
        status.last_delivered = seq;
        status.delivered += 1;
        status.relay = Some(relay);
    }
}

/// The next item of any relay, taking them in turn from `turn` so that none starves the others.
fn poll_sources(
    sources: &mut [Source],
    turn: usize,
    cx: &mut std::task::Context<'_>,
) -> Poll<(usize, Option<Item>)> {
    let n = sources.len();
    for k in 0..n {
        let i = (turn + k) % n;
        if let Some(sub) = sources[i].sub.as_mut() {
            if let Poll::Ready(item) = sub.poll_next_unpin(cx) {
                return Poll::Ready((i, item));
            }
        }
    }
    Poll::Pending
}

/// The state of a hedged subscription's merge: the one chain it follows, the relays, and the
/// last ledgers handed on: sequence, header hash, when.
struct Merge {
    shared: Arc<Shared>,
    chain: ChainVerifier,
    recent: VecDeque<(u32, [u8; 32], Instant)>,
    sources: Vec<Source>,
    last_error: Option<SubscribeError>,
    /// When the merge gives up if no relay was reached.
    give_up_at: Option<Instant>,
}

impl Merge {
    /// Starts one plain subscription per relay.
    fn start(shared: Arc<Shared>) -> Result<Merge, SubscribeError> {
        let config = &shared.config;
        let chain = match (config.anchor, config.start) {
            (Some(anchor), Start::Seq(start)) if start == anchor.seq.wrapping_add(1) => {
                ChainVerifier::after(anchor.seq, anchor.hash)
            }
            (_, Start::Seq(start)) => ChainVerifier::starting_at(start),
            (_, Start::Tip) => ChainVerifier::new(),
        };
        *shared.first_look() = Tally::new(config.relays.iter().map(ToString::to_string));
        let mut sources = Vec::new();
        for relay in &config.relays {
            sources.push(Source {
                relay: relay.clone(),
                sub: Some(start_one(&shared, relay, chain.last())?),
                last_seq: 0,
                last_at: Instant::now(),
            });
        }
        Ok(Merge {
            give_up_at: config.first_connect_timeout.map(|t| Instant::now() + t),
            shared,
            chain,
            recent: VecDeque::with_capacity(RECENT),
            sources,
            last_error: None,
        })
    }

    /// The periodic look at the relays; the error to end with when no relay was reached in
    /// time.
    fn on_tick(&mut self) -> Option<SubscribeError> {
        refresh_status(&self.shared, &self.sources);
        restart_behind(&self.shared, &mut self.sources, self.chain.last());
        let at = self.give_up_at?;
        let status = self.shared.status().clone();
        if status.reached || Instant::now() < at {
            return None;
        }
        let config = &self.shared.config;
        Some(SubscribeError::Unreachable {
            relays: config
                .relays
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(","),
            waited: config.first_connect_timeout.unwrap_or_default(),
            last_error: status.last_error,
        })
    }

    /// Ends relay `i`'s part with `e`.
    fn end(&mut self, i: usize, e: SubscribeError, why: &'static str) {
        tracing::warn!(relay = %self.sources[i].relay, error = %ErrorChain(&e), "{why}");
        self.sources[i].sub = None;
        self.last_error = Some(e);
    }

    /// Relay `i`'s item: the ledger to hand on if it is the next link of the chain; `None` for
    /// a losing copy, a relay restarted or ended.
    fn accept(&mut self, i: usize, item: Option<Item>) -> Option<Ledger> {
        let ledger = match item {
            Some(Ok(ledger)) => ledger,
            Some(Err(e)) => {
                self.shared.status().last_error = Some(ErrorChain(&e).to_string());
                self.end(i, e, "hedged relay failed; going on with the others");
                return None;
            }
            None => {
                self.sources[i].sub = None;
                return None;
            }
        };
        self.sources[i].last_seq = ledger.seq;
        self.sources[i].last_at = Instant::now();
        if let Some((last, _)) = self.chain.last() {
            if ledger.seq <= last {
                // A losing copy: it must be the ledger that was handed on.
                let winner = self.recent.iter().find(|r| r.0 == ledger.seq);
                if let Some(&(_, _, at)) = winner.filter(|w| w.1 == ledger.header_hash) {
                    self.shared.first_look().later(i, at.elapsed());
                }
                if winner.is_some_and(|w| w.1 != ledger.header_hash) {
                    let e = fork(&ledger, &self.recent);
                    self.end(i, e, "hedged relay serves another chain; dropped");
                }
                return None;
            }
        }
        let link = ChainLink {
            seq: ledger.seq,
            hash: ledger.header_hash,
            previous_hash: ledger.previous_hash,
        };
        match self.chain.check_link(link) {
            Ok(()) => {}
            Err(ChainError::UnexpectedSequence { expected, got }) if got > expected => {
                // This relay is past the next ledger (it started at a later tip, or resumed
                // after a gap): start it again from the next ledger.
                tracing::debug!(relay = %self.sources[i].relay, expected, got, "hedged relay ahead of the next ledger; restarting it there");
                restart(&self.shared, &mut self.sources[i], self.chain.last());
                return None;
            }
            Err(e) => {
                let e = SubscribeError::Verify {
                    relay: ledger.relay,
                    source: VerifyError::Chain(e),
                };
                self.end(i, e, "hedged relay's ledger does not link; dropped");
                return None;
            }
        }
        if self.recent.len() == RECENT {
            self.recent.pop_front();
        }
        self.recent
            .push_back((ledger.seq, ledger.header_hash, Instant::now()));
        self.shared.first_look().first(i);
        Some(ledger)
    }
}

/// The error for a copy of a delivered sequence with another hash.
fn fork(ledger: &Ledger, recent: &VecDeque<(u32, [u8; 32], Instant)>) -> SubscribeError {
    let handed_on = recent.iter().find(|r| r.0 == ledger.seq);
    let expected = handed_on.map_or([0; 32], |r| r.1);
    SubscribeError::Verify {
        relay: ledger.relay,
        source: VerifyError::HashMismatch {
            seq: ledger.seq,
            header: ledger.header_hash,
            end: expected,
        },
    }
}

/// A plain subscription to `relay` alone, from the ledger after `last` (anchored to it), or
/// from the configured start before anything was handed on.
fn start_one(
    shared: &Shared,
    relay: &RelayAddr,
    last: Option<(u32, [u8; 32])>,
) -> Result<Subscription, SubscribeError> {
    let mut one = shared.config.clone();
    one.relays = vec![relay.clone()];
    one.hedge = false;
    // The merge keeps the first-connect deadline for all relays together.
    one.first_connect_timeout = None;
    if let Some((seq, hash)) = last {
        one.start = Start::Seq(seq.saturating_add(1));
        one.anchor = Some(Anchor { seq, hash });
    }
    // Every relay's lanes show in the hedged subscription's lane figures.
    crate::resume::start(one, shared.lanes.clone(), None)
}

/// Starts `source`'s subscription again from the ledger after `last`.
fn restart(shared: &Shared, source: &mut Source, last: Option<(u32, [u8; 32])>) {
    source.sub = None;
    match start_one(shared, &source.relay, last) {
        Ok(sub) => source.sub = Some(sub),
        // The configuration was valid for the first start; a resume point cannot make it
        // invalid, short of the sequence space running out.
        Err(e) => {
            tracing::warn!(relay = %source.relay, error = %ErrorChain(&e), "cannot restart hedged relay")
        }
    }
    source.last_at = Instant::now();
}

/// Restarts the relays more than [`BEHIND_LEDGERS`] behind that delivered nothing for
/// [`BEHIND_FOR`].
fn restart_behind(shared: &Shared, sources: &mut [Source], last: Option<(u32, [u8; 32])>) {
    let Some((last_seq, _)) = last else { return };
    for source in sources.iter_mut().filter(|s| s.sub.is_some()) {
        if source.last_seq.saturating_add(BEHIND_LEDGERS) < last_seq
            && source.last_at.elapsed() >= BEHIND_FOR
        {
            tracing::info!(relay = %source.relay, behind = last_seq - source.last_seq, "hedged relay behind and silent; restarting it from the next ledger");
            restart(shared, source, last);
        }
    }
}

/// The merged status: lanes, sessions and reachability summed over the relays, the newest
/// ledger any relay announced, the last error any relay saw.
fn refresh_status(shared: &Shared, sources: &[Source]) {
    let mut lanes_up = 0u8;
    let mut lanes_granted = 0u8;
    let mut newest = 0;
    let mut sessions = 0;
    let mut reached = false;
    let mut last_error = None;
    for status in sources
        .iter()
        .filter_map(|s| s.sub.as_ref())
        .map(Subscription::status)
    {
        lanes_up = lanes_up.saturating_add(status.lanes_up);
        lanes_granted = lanes_granted.saturating_add(status.lanes_granted);
        newest = newest.max(status.newest);
        sessions += status.sessions;
        reached |= status.reached;
        if status.last_error.is_some() {
            last_error = status.last_error;
        }
    }
    let mut status = shared.status();
    status.lanes_up = lanes_up;
    status.lanes_granted = lanes_granted;
    status.newest = newest;
    status.sessions = sessions;
    status.reached |= reached;
    if last_error.is_some() {
        status.last_error = last_error;
    }
}
