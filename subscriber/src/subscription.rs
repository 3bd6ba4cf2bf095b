//! The [`Subscription`] Stream of verified ledgers, and how one is started: the configuration
//! checked, the TLS client built, and a supervisor (one relay at a time, [`crate::resume`], or
//! several at once, [`crate::hedge`]) spawned behind it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::SubscribeConfig;
use crate::error::SubscribeError;
use crate::ledger::{Item, Shared, Status};
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

    /// A hedged subscription's first look: per relay, the share of ledgers it delivered first
    /// and what the hedge gained over it ([`crate::FirstLook`]); empty for a plain one.
    pub fn first_look(&self) -> Vec<crate::FirstLook> {
        self.shared.first_look().summary()
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

/// Checks `config`, builds its TLS client and spawns `supervisor` on the current runtime, which
/// sends the ledgers (and a terminal error) on the Subscription's channel until cancelled.
pub(crate) fn spawn<F, Fut>(
    config: SubscribeConfig,
    lanes: crate::LaneMonitor,
    prefixes: Option<mpsc::Sender<ledger_relay_wire::Prefix>>,
    supervisor: F,
) -> Result<Subscription, SubscribeError>
where
    F: FnOnce(Arc<Shared>, mpsc::Sender<Item>, CancellationToken) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
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
    let task = runtime.spawn(supervisor(shared.clone(), tx, cancel.clone()));
    Ok(Subscription {
        rx,
        shared,
        cancel,
        task: Some(task),
    })
}
