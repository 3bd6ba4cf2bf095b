//! Sources run outside this crate (the `relay:` source, whose client is the subscriber
//! library) and the hook that fetches a ledger again from the same upstreams.

use std::fmt;
use std::thread::JoinHandle;

use bytes::Bytes;
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

use super::{SourceEvent, SourceSpec};

/// What an [`ExternalSource`] is started with.
#[derive(Debug)]
pub struct ExternalStart {
    /// The source (a [`SourceSpec::Relay`]).
    pub spec: SourceSpec,
    /// The ring's newest ledger and its hash: the source resumes after it, and must link to it.
    pub newest: Option<(u32, [u8; 32])>,
    /// Where its events go, in the grammar of the [module docs](self).
    pub events: UnboundedSender<SourceEvent>,
    /// Cancelled at shutdown: the source then stops (sending `Abort` for a ledger in progress).
    pub shutdown: CancellationToken,
    /// The relay's metrics, for what the source reports of itself (upstream lag).
    pub metrics: std::sync::Arc<crate::metrics::Metrics>,
}

/// A source run outside this crate: the `relay:` source, whose upstream client is the
/// subscriber library (which this crate must not depend on). [`crate::Relay::start`] calls it
/// with an [`ExternalStart`] instead of [`spawn`]; it runs on threads of its own and returns
/// the handle the relay joins at shutdown.
#[derive(Clone)]
pub struct ExternalSource(
    pub std::sync::Arc<dyn Fn(ExternalStart) -> JoinHandle<()> + Send + Sync>,
);

impl fmt::Debug for ExternalSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ExternalSource")
    }
}

/// Fetches one ledger again from where a `relay:` source reads it (its upstream relays), to
/// repair the ring: called with the ledger's sequence and the header hash the ring recorded for
/// it, it returns the raw `LedgerCloseMeta`, verified by the fetcher as any subscriber verifies
/// a ledger, or why it could not. The caller checks the sequence and the hash again.
#[derive(Clone)]
pub struct Refetch(pub std::sync::Arc<RefetchFn>);

/// What a [`Refetch`] calls: (sequence, header hash) to the raw ledger, or why not.
pub type RefetchFn = dyn Fn(u32, [u8; 32]) -> futures::future::BoxFuture<'static, Result<Bytes, String>>
    + Send
    + Sync;

impl fmt::Debug for Refetch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Refetch")
    }
}
