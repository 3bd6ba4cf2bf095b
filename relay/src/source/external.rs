//! Sources run outside this crate (the `relay:` source, whose client is the subscriber
//! library) and the hook that fetches a ledger again from the same upstreams.

use std::fmt;
use std::thread::JoinHandle;

use bytes::Bytes;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
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
    /// What the pipeline refused of the source's output (see [`Refused`]): the source does not
    /// stop for it, it goes on from another upstream.
    pub refused: UnboundedReceiver<Refused>,
}

/// The pipeline refused a ledger an external source passed on (a header that does not hash
/// to its hash, a broken chain, a gap, a hash that conflicts with one held): it discarded
/// what it had of that ledger, and ignores the source's ledger events from then on until the
/// source sends an `Abort`, which says it dropped what it was passing on and starts again
/// from `resume_after`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// Why, one line.
    pub reason: String,
    /// The refused ledger's sequence, when its header could be read.
    pub seq: Option<u32>,
    /// The newest ledger the pipeline holds (published in this run, or the ring's newest at
    /// start) and its hash: where the source resumes, anchored.
    pub resume_after: Option<(u32, [u8; 32])>,
    /// How many `Abort` events the pipeline had received before the refused ledger's events.
    /// A source that has sent more since then had already started again: the refusal is
    /// about output it has dropped, and is ignored.
    pub epoch: u64,
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
