//! `datalake:URL[,from=SEQ][,to=SEQ]`: replays a SEP-54 data lake (what Galexie writes), paced
//! like a file: ledger k at `t0 + k * cadence`, each emitted over the `emit` window.
//!
//! Ledgers come from a [`LakeCursor`] (bounded parallel prefetch, every batch checked whole,
//! the chain checked across batches) on a runtime of its own, so fetching runs ahead while the
//! source waits for the next slot. Without `from` the replay starts at the oldest ledger the
//! lake holds. Without `to` it follows the lake: past the newest ledger it waits (polling the
//! next object once per cadence, at least a second apart) for a writer to add more. With `to`
//! it ends after that ledger.
//!
//! Any other lake error (a gap, a damaged object, a wrong network, an unreachable store after
//! the client's retries) fails the source with the error's one-line message; nothing of a
//! damaged batch is emitted.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

use ledger_relay_lake::{Lake, LakeCursor, LakeError, LakeUrl, PrefetchOptions};

use super::{Out, Pacer, ParseSourceError, SourceOptions, Stop};

/// `datalake:URL[,from=SEQ][,to=SEQ]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatalakeSpec {
    /// The lake.
    pub url: LakeUrl,
    /// First ledger to replay (default: the oldest the lake holds).
    pub from: Option<u32>,
    /// Last ledger to replay (default: follow the lake).
    pub to: Option<u32>,
}

impl FromStr for DatalakeSpec {
    type Err = ParseSourceError;

    /// The URL may itself hold commas; only trailing `,from=` and `,to=` settings are taken.
    fn from_str(arg: &str) -> Result<Self, Self::Err> {
        let bad = |reason: String| ParseSourceError::BadDatalake { reason };
        let mut rest = arg;
        let (mut from, mut to) = (None, None);
        while let Some((head, setting)) = rest.rsplit_once(',') {
            let (slot, value) = if let Some(v) = setting.strip_prefix("from=") {
                (&mut from, v)
            } else if let Some(v) = setting.strip_prefix("to=") {
                (&mut to, v)
            } else {
                break;
            };
            if slot.is_some() {
                return Err(bad(format!("{setting:?} given twice")));
            }
            let seq: u32 = value
                .parse()
                .map_err(|_| bad(format!("{setting:?}: expected a ledger sequence")))?;
            *slot = Some(seq);
            rest = head;
        }
        if let (Some(f), Some(t)) = (from, to) {
            if t < f {
                return Err(bad(format!("to={t} is before from={f}")));
            }
        }
        let url = rest.parse::<LakeUrl>().map_err(|e| bad(e.to_string()))?;
        Ok(DatalakeSpec { url, from, to })
    }
}

impl fmt::Display for DatalakeSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.url)?;
        if let Some(from) = self.from {
            write!(f, ",from={from}")?;
        }
        if let Some(to) = self.to {
            write!(f, ",to={to}")?;
        }
        Ok(())
    }
}

pub(super) fn run(spec: &DatalakeSpec, opts: &SourceOptions, out: &Out) -> Result<(), Stop> {
    // One worker: fetches and decodes proceed while this thread sleeps between slots.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("source-datalake-io")
        .enable_all()
        .build()
        .map_err(|e| Stop::Failed(format!("cannot start the lake runtime: {e}")))?;
    let failed = |e: LakeError| Stop::Failed(format!("{}: {e}", spec.url));
    let lake = block(
        &rt,
        out,
        Lake::open(
            &spec.url,
            &opts.lake,
            opts.network_passphrase.as_deref(),
            opts.lake_stats.0.clone(),
        ),
    )?
    .map_err(failed)?;
    let lake = std::sync::Arc::new(lake);
    let start = match spec.from {
        Some(from) => from,
        None => match block(&rt, out, lake.range())?.map_err(failed)? {
            Some((oldest, _)) => oldest,
            None => {
                return Err(Stop::Failed(format!(
                    "{}: the lake holds no ledgers",
                    spec.url
                )))
            }
        },
    };
    let stop = spec.to.unwrap_or(u32::MAX);
    tracing::info!(lake = %spec.url, start, to = ?spec.to, "replaying a data lake");
    let mut cursor = LakeCursor::new(lake.clone(), start, stop, PrefetchOptions::default());
    let mut pacer = Pacer::new(opts.cadence, opts.emit);
    let poll = opts.cadence.max(Duration::from_secs(1));
    loop {
        match block(&rt, out, cursor.next())? {
            Ok(Some(ledger)) => pacer.emit(out, ledger.raw)?,
            Ok(None) => return Ok(()),
            // Past the lake's newest ledger: wait for its writer.
            Err(LakeError::Lacks { seq, newest, .. }) if newest.is_none_or(|n| seq > n) => {
                let key = lake.key(seq);
                loop {
                    out.sleep_until(Instant::now() + poll)?;
                    match block(&rt, out, lake.holds(seq))? {
                        Ok(true) => break,
                        Ok(false) => {}
                        Err(e) => {
                            tracing::warn!(%key, error = %e, "polling the lake for the next ledger")
                        }
                    }
                }
            }
            Err(e) => return Err(failed(e)),
        }
    }
}

/// Runs `fut` on `rt`, giving up when the relay shuts down.
fn block<T>(
    rt: &tokio::runtime::Runtime,
    out: &Out,
    fut: impl std::future::Future<Output = T>,
) -> Result<T, Stop> {
    let shutdown = out.shutdown.clone();
    rt.block_on(async {
        tokio::select! {
            v = fut => Ok(v),
            _ = shutdown.cancelled() => Err(Stop::Shutdown),
        }
    })
}
