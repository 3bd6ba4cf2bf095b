//! A subscription to one relay at a time: sessions one after another, resuming from the last
//! delivered ledger and failing over along the relay list.

use std::sync::Arc;
use std::time::Duration;

use ledger_relay_wire::frame::Start;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::config::SubscribeConfig;
use crate::error::{ErrorChain, SubscribeError};
use crate::ledger::{Item, Shared};
use crate::session::{self, End};
use crate::subscription::{spawn, Subscription};
use crate::verify::Verifier;

/// Starts a subscription that follows one relay at a time, recording lane figures in `lanes`
/// and, for a cut-through consumer, the unverified prefixes on `prefixes`.
pub(crate) fn start(
    config: SubscribeConfig,
    lanes: crate::LaneMonitor,
    prefixes: Option<mpsc::Sender<ledger_relay_wire::Prefix>>,
) -> Result<Subscription, SubscribeError> {
    spawn(config, lanes, prefixes, supervise)
}

/// Runs sessions one after another until the consumer goes away or a terminal error:
/// resumes from the last delivered ledger + 1, moves to the next relay after each failure, and
/// backs off between attempts (reset once a session delivered a ledger).
///
/// A below-retention end is terminal only once every configured relay has said so for the
/// same ledger: another relay may keep a longer ring (or a lake) than the one that lacks it.
/// Until then the next relay is tried, with backoff.
async fn supervise(shared: Arc<Shared>, tx: mpsc::Sender<Item>, cancel: CancellationToken) {
    let config = &shared.config;
    let mut verifier = match (config.anchor, config.start) {
        // `validate` allows an anchor only with a start at its sequence or the next.
        (Some(anchor), Start::Seq(start)) => Verifier::anchored(anchor, start),
        _ => Verifier::new(),
    };
    verifier.set_content_check(config.content_check);
    let mut backoff = Backoff::new(config.backoff);
    let mut index = 0usize;
    let mut last_at_once = false;
    // Relays (by index) that said the ledger needed is below their retention, and that ledger.
    let mut below: (Option<Start>, std::collections::BTreeSet<usize>) = (None, Default::default());
    let give_up_at = config
        .first_connect_timeout
        .map(|t| tokio::time::Instant::now() + t);
    // Until a relay is reached: completes at `give_up_at` (never without one).
    let unreached_deadline = |shared: &Shared| {
        let deadline = give_up_at.filter(|_| !shared.status().reached);
        async move {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        }
    };
    let unreachable = |shared: &Shared| {
        let status = shared.status();
        SubscribeError::Unreachable {
            relays: shared
                .config
                .relays
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(","),
            waited: shared.config.first_connect_timeout.unwrap_or_default(),
            last_error: status.last_error.clone(),
        }
    };
    loop {
        let relay = &config.relays[index % config.relays.len()];
        let start = match verifier.last() {
            // Resume from the last ledger delivered, never the last one seen: ledgers that
            // arrived but were not handed over are fetched again.
            Some((seq, _)) => Start::Seq(seq.saturating_add(1)),
            None => config.start,
        };
        shared.status().sessions += 1;
        let deadline = unreached_deadline(&shared);
        let run = session::run(&shared, relay, start, &mut verifier, &tx, &cancel);
        tokio::pin!(run);
        let outcome = tokio::select! {
            outcome = &mut run => outcome,
            _ = deadline => {
                if shared.status().reached {
                    // Reached during this very attempt: it goes on, with no deadline now.
                    run.await
                } else {
                    let e = unreachable(&shared);
                    shared.status().last_error = Some(e.to_string());
                    let _ = tx.send(Err(e)).await;
                    return;
                }
            }
        };
        {
            let mut status = shared.status();
            status.relay = None;
            status.lanes_up = 0;
            status.lanes_granted = 0;
        }
        if outcome.delivered > 0 || below.0 != Some(start) {
            below = (Some(start), Default::default());
        }
        match outcome.end {
            End::Stopped => return,
            End::Fatal(e)
                if e.is_below_retention() && {
                    below.1.insert(index % config.relays.len());
                    below.1.len() < config.relays.len()
                } =>
            {
                let delay = backoff.next_delay();
                let message = ErrorChain(&e).to_string();
                tracing::warn!(
                    relay = %relay,
                    error = %message,
                    retry_in_ms = delay.as_millis() as u64,
                    "below this relay's retention; trying the next relay"
                );
                shared.status().last_error = Some(message);
                index = index.wrapping_add(1);
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = cancel.cancelled() => return,
                    _ = tx.closed() => return,
                }
            }
            End::Fatal(e) => {
                // The consumer gets the error itself; logging it too would print it twice.
                tracing::debug!(relay = %relay, error = %ErrorChain(&e), "subscription failed");
                shared.status().last_error = Some(ErrorChain(&e).to_string());
                let _ = tx.send(Err(e)).await;
                return;
            }
            End::Retry(t) => {
                if outcome.delivered > 0 {
                    backoff.reset();
                }
                // At once only if the last at-once reconnect made progress: a source that keeps
                // dying mid-ledger must not turn into a tight reconnect loop.
                let at_once = t.reconnect_at_once() && (outcome.delivered > 0 || !last_at_once);
                last_at_once = at_once;
                let delay = if at_once {
                    Duration::ZERO
                } else {
                    backoff.next_delay()
                };
                let message = ErrorChain(&t).to_string();
                tracing::warn!(
                    relay = %relay,
                    error = %message,
                    retry_in_ms = delay.as_millis() as u64,
                    "session ended; reconnecting"
                );
                shared.status().last_error = Some(message);
                if !at_once {
                    index = index.wrapping_add(1);
                }
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = cancel.cancelled() => return,
                    _ = tx.closed() => return,
                    _ = unreached_deadline(&shared) => {
                        let e = unreachable(&shared);
                        let _ = tx.send(Err(e)).await;
                        return;
                    }
                }
            }
        }
    }
}
