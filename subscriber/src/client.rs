//! The public face of the library: [`connect`] and the [`Subscription`] Stream of verified
//! ledgers, and the supervisor that resumes and fails over behind it.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use ledger_relay_wire::frame::Start;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::config::SubscribeConfig;
use crate::error::{ErrorChain, SubscribeError};
use crate::ledger::{Item, Shared, Status};
use crate::session::{self, End};
use crate::verify::Verifier;
use ledger_relay_transport as transport;

/// A running subscription: a [`futures::Stream`] of verified ledgers in sequence order.
///
/// The Stream yields each ledger exactly once, from the requested start, with no gap, across
/// reconnects and relay switches. A terminal error is yielded once, after which the Stream
/// ends; transient failures are retried behind it and never appear.
///
/// Dropping it (or [`Subscription::close`]) ends the session and closes its lanes.
pub struct Subscription {
    rx: mpsc::Receiver<Item>,
    shared: Arc<Shared>,
    cancel: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("status", &self.status())
            .finish_non_exhaustive()
    }
}

impl Subscription {
    /// The current state: relay, lanes up, the relay's newest ledger, the last delivered.
    pub fn status(&self) -> Status {
        self.shared.status().clone()
    }

    /// Every lane's figures now (bytes and packets received, round trip, congestion window,
    /// path MTU...), by relay and lane number: see [`crate::LaneStats`].
    pub fn lane_stats(&self) -> Vec<crate::LaneStats> {
        self.shared.lanes.snapshot()
    }

    /// A handle that reads [`Subscription::lane_stats`] from elsewhere (another task, a
    /// thread), also after the subscription ends.
    pub fn lane_monitor(&self) -> crate::LaneMonitor {
        self.shared.lanes.clone()
    }

    /// Ends the subscription: closes the session's lanes (telling the relay) and waits, at most
    /// about a second, for that to finish. Ledgers not yet taken are dropped.
    pub async fn close(mut self) {
        self.cancel.cancel();
        // Ledgers waiting in the channel would keep a blocked supervisor from seeing the
        // cancellation; closing the receiver unblocks it.
        self.rx.close();
        if let Some(task) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(2), task).await;
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

impl futures::Stream for Subscription {
    type Item = Item;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Item>> {
        self.rx.poll_recv(cx)
    }
}

/// Starts a subscription: validates `config`, then connects in the background (lane 0 first,
/// then the other lanes) and returns at once. Must be called inside a tokio runtime.
///
/// Fails only for a configuration that cannot work (no relay, bad credentials, out-of-range
/// settings); connection problems show up on the Stream (terminal ones) or in the logs and
/// [`Subscription::status`] (transient ones, retried).
pub fn connect(config: SubscribeConfig) -> Result<Subscription, SubscribeError> {
    connect_with(config, crate::LaneMonitor::default())
}

/// How many prefixes [`connect_cut_through`] queues for its consumer; beyond that they are
/// dropped (the consumer then waits for the verified ledger).
pub const PREFIX_QUEUE: usize = 1024;

/// [`connect`], and a channel on which the bytes of the next ledger come out as they arrive,
/// before the ledger is complete and verified: for a relay fed by relays that passes ledgers
/// on chunk by chunk (cut-through).
///
/// Each [`Prefix`](ledger_relay_wire::Prefix) is the next piece, in order, of the ledger after
/// the last one the Subscription yielded (or will yield: the channels are not ordered with
/// each other). **Its bytes are not verified**: the ledger is verified (checksum, header
/// chain, content hashes) only when it is complete, and it is yielded on the Subscription only
/// if it passes, so a consumer must treat what it passed on as provisional until then and
/// take it back otherwise. A new session (a reconnect, a failover) starts the ledger again
/// from offset 0. Prefixes are best effort: when the consumer does not keep up they are
/// dropped (it sees a jump in the offsets) and the ledger still comes whole. Not with
/// `hedge`: a hedged subscription has no single next ledger's stream to pass on.
pub fn connect_cut_through(
    config: SubscribeConfig,
) -> Result<(Subscription, mpsc::Receiver<ledger_relay_wire::Prefix>), SubscribeError> {
    if config.hedge && config.relays.len() > 1 {
        return Err(SubscribeError::InvalidConfig {
            field: "hedge",
            reason: "cut-through passes on one relay's ledgers; it cannot be hedged".into(),
        });
    }
    let (tx, rx) = mpsc::channel(PREFIX_QUEUE);
    let sub = connect_inner(config, crate::LaneMonitor::default(), Some(tx))?;
    Ok((sub, rx))
}

/// [`connect`], recording lane figures in `lanes` (a hedged subscription shares its table with
/// each relay's subscription).
pub(crate) fn connect_with(
    config: SubscribeConfig,
    lanes: crate::LaneMonitor,
) -> Result<Subscription, SubscribeError> {
    connect_inner(config, lanes, None)
}

fn connect_inner(
    config: SubscribeConfig,
    lanes: crate::LaneMonitor,
    prefixes: Option<mpsc::Sender<ledger_relay_wire::Prefix>>,
) -> Result<Subscription, SubscribeError> {
    config.validate()?;
    let runtime = tokio::runtime::Handle::try_current().map_err(|_| SubscribeError::NoRuntime)?;
    let creds = &config.credentials;
    let client = transport::client_config(
        &creds.ca,
        &creds.crls,
        creds.cert_chain.clone(),
        creds.key.clone_key(),
        &config.transport,
    )?;
    let (tx, rx) = mpsc::channel(config.channel_capacity);
    let mut shared = Shared::new(config, client, lanes);
    shared.prefixes = prefixes;
    let shared = Arc::new(shared);
    let cancel = CancellationToken::new();
    let task = if shared.config.hedge && shared.config.relays.len() > 1 {
        runtime.spawn(crate::hedge::supervise(shared.clone(), tx, cancel.clone()))
    } else {
        runtime.spawn(supervise(shared.clone(), tx, cancel.clone()))
    };
    Ok(Subscription {
        rx,
        shared,
        cancel,
        task: Some(task),
    })
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
