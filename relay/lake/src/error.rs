//! What can go wrong with a lake, as one typed error with the object key and the reason, and
//! per-kind counters for metrics.

use std::sync::atomic::{AtomicU64, Ordering};

use ledger_relay_wire::content::ContentError;
use ledger_relay_wire::header::ChainLink;
use ledger_relay_wire::lake::BatchError;

/// Why a lake operation failed. Every variant names the object key (relative to the lake's
/// root) it was about, or the sequence, and a one-line reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LakeError {
    /// The lake URL is not one of `file:///PATH`, `s3://BUCKET/PREFIX`, `gs://BUCKET/PREFIX` or
    /// `az://CONTAINER/PREFIX`, or the store could not be configured from it.
    #[error("bad lake url {url:?}: {reason}")]
    BadUrl {
        /// The URL as given.
        url: String,
        /// What is wrong.
        reason: String,
    },
    /// An object the lake should hold is not there (a gap in the lake).
    #[error("object {key} is missing from the lake")]
    Missing {
        /// The key.
        key: String,
    },
    /// The lake does not hold this ledger at all: it is outside the range the lake holds.
    #[error("{}", lacks_message(*seq, *oldest, *newest))]
    Lacks {
        /// The ledger asked for.
        seq: u32,
        /// Oldest ledger the lake holds (`None`: it holds none).
        oldest: Option<u32>,
        /// Newest ledger the lake holds.
        newest: Option<u32>,
    },
    /// An object ends early: an upload or a copy cut short.
    #[error("object {key} is truncated: {reason}")]
    Truncated {
        /// The key.
        key: String,
        /// Where it ends.
        reason: String,
    },
    /// An object is damaged or is not what its key says.
    #[error("object {key} is corrupt: {reason}")]
    Corrupt {
        /// The key.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// A ledger's transaction set or results do not hash to what its header commits to: the
    /// lake holds a ledger its network did not close (its object was altered, or written by
    /// someone who did), and it is refused like a damaged one.
    #[error("ledger {seq} in {key} does not hold what its header commits to: {error}")]
    Content {
        /// The key holding the ledger.
        key: String,
        /// The ledger.
        seq: u32,
        /// What is wrong.
        error: ContentError,
    },
    /// The lake belongs to another network.
    #[error("lake {key} is for network {got:?}, not {expected:?}")]
    WrongNetwork {
        /// The manifest's key.
        key: String,
        /// The network passphrase this relay serves.
        expected: String,
        /// The lake's.
        got: String,
    },
    /// The lake has no manifest (`.config.json`), so its layout is unknown.
    #[error("lake has no manifest at {key}: not a SEP-54 lake, or not written yet")]
    NoManifest {
        /// The manifest's key.
        key: String,
    },
    /// The manifest is unreadable, or its layout is not the one this writer was told to use.
    #[error("manifest {key}: {reason}")]
    Manifest {
        /// The manifest's key.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// The store cannot be reached (connection refused, DNS, timeout).
    #[error("lake unreachable at {key}: {reason}")]
    Unreachable {
        /// The key being read or written.
        key: String,
        /// The transport's message.
        reason: String,
    },
    /// The store refused the credentials (missing, wrong or without permission).
    #[error("lake refused access to {key}: {reason}")]
    Denied {
        /// The key.
        key: String,
        /// The store's message.
        reason: String,
    },
    /// Any other failure of the store.
    #[error("lake error on {key}: {reason}")]
    Store {
        /// The key.
        key: String,
        /// The store's message.
        reason: String,
    },
    /// A ledger does not link to the one before it (another network, another history, or a
    /// forged object).
    #[error("ledger {seq} in {key} does not link to ledger {prev}: previous hash {got}, expected {expected}")]
    BrokenChain {
        /// The key holding the ledger.
        key: String,
        /// The ledger.
        seq: u32,
        /// The ledger before it.
        prev: u32,
        /// Its `previousLedgerHash`, hex.
        got: String,
        /// The hash of the ledger before it, hex.
        expected: String,
    },
    /// The lake already holds a different object where this writer would put one.
    #[error("object {key} already holds different ledgers: {reason}")]
    Conflict {
        /// The key.
        key: String,
        /// How they differ.
        reason: String,
    },
}

fn lacks_message(seq: u32, oldest: Option<u32>, newest: Option<u32>) -> String {
    match (oldest, newest) {
        (Some(o), Some(n)) => format!("the lake does not hold ledger {seq}: it holds {o} to {n}"),
        _ => format!("the lake does not hold ledger {seq}: it holds no ledgers"),
    }
}

/// The kinds of [`LakeError`], for counting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// [`LakeError::BadUrl`].
    BadUrl,
    /// [`LakeError::Missing`].
    Missing,
    /// [`LakeError::Lacks`].
    Lacks,
    /// [`LakeError::Truncated`].
    Truncated,
    /// [`LakeError::Corrupt`].
    Corrupt,
    /// [`LakeError::Content`].
    Content,
    /// [`LakeError::WrongNetwork`].
    WrongNetwork,
    /// [`LakeError::NoManifest`] and [`LakeError::Manifest`].
    Manifest,
    /// [`LakeError::Unreachable`].
    Unreachable,
    /// [`LakeError::Denied`].
    Denied,
    /// [`LakeError::Store`].
    Store,
    /// [`LakeError::BrokenChain`].
    BrokenChain,
    /// [`LakeError::Conflict`].
    Conflict,
}

impl ErrorKind {
    /// Every kind, in a fixed order.
    pub const ALL: [ErrorKind; 13] = [
        ErrorKind::BadUrl,
        ErrorKind::Missing,
        ErrorKind::Lacks,
        ErrorKind::Truncated,
        ErrorKind::Corrupt,
        ErrorKind::Content,
        ErrorKind::WrongNetwork,
        ErrorKind::Manifest,
        ErrorKind::Unreachable,
        ErrorKind::Denied,
        ErrorKind::Store,
        ErrorKind::BrokenChain,
        ErrorKind::Conflict,
    ];

    /// The kind's name in metrics labels.
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::BadUrl => "bad_url",
            ErrorKind::Missing => "missing",
            ErrorKind::Lacks => "lacks",
            ErrorKind::Truncated => "truncated",
            ErrorKind::Corrupt => "corrupt",
            ErrorKind::Content => "content",
            ErrorKind::WrongNetwork => "wrong_network",
            ErrorKind::Manifest => "manifest",
            ErrorKind::Unreachable => "unreachable",
            ErrorKind::Denied => "denied",
            ErrorKind::Store => "store",
            ErrorKind::BrokenChain => "broken_chain",
            ErrorKind::Conflict => "conflict",
        }
    }

    fn index(self) -> usize {
        // ALL lists every variant once.
        ErrorKind::ALL.iter().position(|k| *k == self).unwrap_or(0)
    }
}

impl LakeError {
    /// [`LakeError::BrokenChain`] at `key` for ledger `next`, which does not follow ledger `prev`
    /// whose hash is `prev_hash`. Whether it follows is [`ChainVerifier`]'s to say (the chain
    /// rule has one owner); this only words the refusal.
    ///
    /// [`ChainVerifier`]: ledger_relay_wire::header::ChainVerifier
    pub fn broken_chain(
        key: String,
        prev: u32,
        prev_hash: &[u8; 32],
        next: &ChainLink,
    ) -> LakeError {
        LakeError::BrokenChain {
            key,
            seq: next.seq,
            prev,
            got: ledger_relay_wire::Hex(&next.previous_hash).to_string(),
            expected: ledger_relay_wire::Hex(prev_hash).to_string(),
        }
    }

    /// The error's kind.
    pub fn kind(&self) -> ErrorKind {
        match self {
            LakeError::BadUrl { .. } => ErrorKind::BadUrl,
            LakeError::Missing { .. } => ErrorKind::Missing,
            LakeError::Lacks { .. } => ErrorKind::Lacks,
            LakeError::Truncated { .. } => ErrorKind::Truncated,
            LakeError::Corrupt { .. } => ErrorKind::Corrupt,
            LakeError::Content { .. } => ErrorKind::Content,
            LakeError::WrongNetwork { .. } => ErrorKind::WrongNetwork,
            LakeError::NoManifest { .. } | LakeError::Manifest { .. } => ErrorKind::Manifest,
            LakeError::Unreachable { .. } => ErrorKind::Unreachable,
            LakeError::Denied { .. } => ErrorKind::Denied,
            LakeError::Store { .. } => ErrorKind::Store,
            LakeError::BrokenChain { .. } => ErrorKind::BrokenChain,
            LakeError::Conflict { .. } => ErrorKind::Conflict,
        }
    }

    /// Whether trying again later may succeed without anyone changing the lake: the store was
    /// unreachable, refused access (credentials may be renewed) or failed otherwise.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            LakeError::Unreachable { .. } | LakeError::Denied { .. } | LakeError::Store { .. }
        )
    }

    /// The error for a batch that failed to decode or check at `key`.
    pub fn from_batch(key: &str, e: BatchError) -> LakeError {
        if let BatchError::Content { seq, error, .. } = e {
            return LakeError::Content {
                key: key.to_owned(),
                seq,
                error,
            };
        }
        if e.is_truncated() {
            LakeError::Truncated {
                key: key.to_owned(),
                reason: e.to_string(),
            }
        } else {
            LakeError::Corrupt {
                key: key.to_owned(),
                reason: e.to_string(),
            }
        }
    }

    /// The error for a failed store operation on `key`.
    pub fn from_store(key: &str, e: object_store::Error) -> LakeError {
        let key = key.to_owned();
        let reason = one_line(&e);
        match e {
            object_store::Error::NotFound { .. } => LakeError::Missing { key },
            object_store::Error::PermissionDenied { .. }
            | object_store::Error::Unauthenticated { .. } => LakeError::Denied { key, reason },
            e if is_unreachable(&e) => LakeError::Unreachable { key, reason },
            _ => LakeError::Store { key, reason },
        }
    }
}

impl LakeError {
    /// The error for a failed put of `key`. A put that finds no container (no such bucket) is
    /// transient, unlike a read that finds no object ([`LakeError::Missing`]): a store that has
    /// just come back may not have its bucket yet, and a writer must not stop for good on it.
    pub fn from_put(key: &str, e: object_store::Error) -> LakeError {
        match e {
            object_store::Error::NotFound { .. } => LakeError::Store {
                key: key.to_owned(),
                reason: format!(
                    "the store has no bucket or container for it (yet): {}",
                    one_line(&e)
                ),
            },
            e => LakeError::from_store(key, e),
        }
    }
}

/// The error and its causes on one line.
fn one_line(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let s = c.to_string();
        if !out.contains(&s) {
            out.push_str(": ");
            out.push_str(&s);
        }
        cause = c.source();
    }
    out.replace('\n', " ")
}

/// Whether a store error comes from the transport: no connection, or no answer in time.
fn is_unreachable(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if let Some(h) = c.downcast_ref::<object_store::client::HttpError>() {
            use object_store::client::HttpErrorKind as K;
            if matches!(
                h.kind(),
                K::Connect | K::Timeout | K::Request | K::Interrupted
            ) {
                return true;
            }
        }
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind as K;
            if matches!(
                io.kind(),
                K::ConnectionRefused | K::ConnectionReset | K::TimedOut | K::NotConnected
            ) {
                return true;
            }
        }
        cause = c.source();
    }
    false
}

/// Counters of one lake's traffic and errors, shared with the metrics.
#[derive(Debug, Default)]
pub struct LakeStats {
    errors: [AtomicU64; ErrorKind::ALL.len()],
    /// Objects read.
    pub objects_read: AtomicU64,
    /// Bytes of objects read (compressed).
    pub bytes_read: AtomicU64,
    /// Objects written.
    pub objects_written: AtomicU64,
    /// Bytes of objects written (compressed).
    pub bytes_written: AtomicU64,
    /// Objects a writer found already present and identical, and left alone.
    pub objects_present: AtomicU64,
    /// Raw bytes of decoded batches held by prefetching readers right now.
    pub prefetch_held_bytes: AtomicU64,
    /// The most [`LakeStats::prefetch_held_bytes`] reached.
    pub prefetch_peak_bytes: AtomicU64,
}

impl LakeStats {
    /// Counts an error.
    pub fn count(&self, e: &LakeError) {
        self.errors[e.kind().index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Errors of `kind` so far.
    pub fn errors(&self, kind: ErrorKind) -> u64 {
        self.errors[kind.index()].load(Ordering::Relaxed)
    }

    /// Adds to a counter.
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn hold(&self, n: u64) {
        let now = self.prefetch_held_bytes.fetch_add(n, Ordering::Relaxed) + n;
        self.prefetch_peak_bytes.fetch_max(now, Ordering::Relaxed);
    }

    pub(crate) fn release(&self, n: u64) {
        self.prefetch_held_bytes.fetch_sub(n, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_one_line_and_carry_the_key() {
        let e = LakeError::Lacks {
            seq: 5,
            oldest: Some(10),
            newest: Some(20),
        };
        assert_eq!(
            e.to_string(),
            "the lake does not hold ledger 5: it holds 10 to 20"
        );
        let e = LakeError::from_store(
            "FFFFFFFA--5.xdr.zst",
            object_store::Error::NotFound {
                path: "x".into(),
                source: "gone".into(),
            },
        );
        assert_eq!(
            e,
            LakeError::Missing {
                key: "FFFFFFFA--5.xdr.zst".into()
            }
        );
        assert_eq!(e.kind(), ErrorKind::Missing);
        let stats = LakeStats::default();
        stats.count(&e);
        stats.count(&e);
        assert_eq!(stats.errors(ErrorKind::Missing), 2);
        assert_eq!(stats.errors(ErrorKind::Corrupt), 0);
    }
}
