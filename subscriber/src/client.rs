//! The public face of the library: [`connect`] (one relay at a time, or hedged across several)
//! and [`connect_cut_through`].

use tokio::sync::mpsc;

use crate::config::SubscribeConfig;
use crate::error::SubscribeError;
use crate::subscription::Subscription;

/// Starts a subscription: validates `config`, then connects in the background (lane 0 first,
/// then the other lanes) and returns at once. Must be called inside a tokio runtime.
///
/// Fails only for a configuration that cannot work (no relay, bad credentials, out-of-range
/// settings); connection problems show up on the Stream (terminal ones) or in the logs and
/// [`Subscription::status`] (transient ones, retried).
pub fn connect(config: SubscribeConfig) -> Result<Subscription, SubscribeError> {
    if config.hedge && config.relays.len() > 1 {
        crate::hedge::start(config)
    } else {
        crate::resume::start(config, crate::LaneMonitor::default(), None)
    }
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
    let sub = crate::resume::start(config, crate::LaneMonitor::default(), Some(tx))?;
    Ok((sub, rx))
}
