//! What the metrics show of the relay's data lakes (the export lake, the backfill lake and a
//! `datalake:` source): [`LakeMetrics`] and its series.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use ledger_relay_lake::{ErrorKind, LakeStats};

use crate::exposition::family;

/// What the metrics show of the relay's lakes.
#[derive(Debug, Default)]
pub struct LakeMetrics {
    /// The export lake's traffic and errors.
    pub export: Arc<LakeStats>,
    /// The backfill lake's.
    pub backfill: Arc<LakeStats>,
    /// A `datalake:` source's.
    pub source: Arc<LakeStats>,
    /// `--export` is on.
    pub export_enabled: AtomicBool,
    /// The export lake is failing (unreachable, refusing, or holding another history); live
    /// streaming goes on.
    pub export_degraded: AtomicBool,
    /// Newest ledger in the export lake, as last written or found.
    pub export_newest: AtomicU64,
    /// Ledgers the exporter had no room to queue (it was waiting on the lake); it reads them
    /// back from the ring.
    pub export_queue_full_total: AtomicU64,
    /// Ledgers the exporter read from the ring.
    pub export_ring_reads_total: AtomicU64,
    /// Times ledgers were missing from both the queue and the ring, leaving a gap in the lake.
    pub export_gaps_total: AtomicU64,
    /// Upload attempts that failed and were retried.
    pub export_retries_total: AtomicU64,
    /// Ledgers read from the backfill lake for sessions (resends included).
    pub backfill_ledgers_total: AtomicU64,
    /// Sessions holding a backfill reader slot now.
    pub backfill_sessions: AtomicU64,
    /// Loads that found every backfill reader slot taken (the session asks again shortly).
    pub backfill_busy_total: AtomicU64,
}

impl LakeMetrics {
    /// `/healthz`'s word for the export: `off`, `ok` or `degraded`.
    pub fn export_health(&self) -> &'static str {
        if !self.export_enabled.load(Ordering::Relaxed) {
            "off"
        } else if self.export_degraded.load(Ordering::Relaxed) {
            "degraded"
        } else {
            "ok"
        }
    }

    /// Appends the Prometheus exposition; `source_newest` gives the export's lag.
    pub fn render(&self, out: &mut String, source_newest: u64) {
        for (name, help, v) in self.scalars(source_newest) {
            family(out, name, help);
            let _ = writeln!(out, "ledger_relay_{name} {v}");
        }
        self.render_per_lake(out);
    }

    /// The metrics that are one number each: name, help, value.
    fn scalars(&self, source_newest: u64) -> [(&'static str, &'static str, u64); 10] {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let newest = load(&self.export_newest);
        let lag = if self.export_enabled.load(Ordering::Relaxed) {
            source_newest.saturating_sub(newest)
        } else {
            0
        };
        [
            (
                "lake_export_degraded",
                "1 when the export lake is failing (live streaming goes on).",
                u64::from(self.export_degraded.load(Ordering::Relaxed)),
            ),
            (
                "lake_export_newest",
                "Newest ledger in the export lake.",
                newest,
            ),
            (
                "lake_export_lag_ledgers",
                "Ledgers read from the source but not yet in the export lake.",
                lag,
            ),
            (
                "lake_export_queue_full_total",
                "Ledgers the exporter had no room to queue; read back from the ring.",
                load(&self.export_queue_full_total),
            ),
            (
                "lake_export_ring_reads_total",
                "Ledgers the exporter read from the ring.",
                load(&self.export_ring_reads_total),
            ),
            (
                "lake_export_gaps_total",
                "Times ledgers were in neither the export queue nor the ring: a gap in the lake.",
                load(&self.export_gaps_total),
            ),
            (
                "lake_export_retries_total",
                "Failed export uploads, retried with backoff.",
                load(&self.export_retries_total),
            ),
            (
                "lake_backfill_ledgers_total",
                "Ledgers read from the backfill lake for sessions below the ring.",
                load(&self.backfill_ledgers_total),
            ),
            (
                "lake_backfill_sessions",
                "Sessions reading the backfill lake now (at most --backfill-sessions).",
                load(&self.backfill_sessions),
            ),
            (
                "lake_backfill_busy_total",
                "Backfill loads that waited for a reader slot.",
                load(&self.backfill_busy_total),
            ),
        ]
    }

    /// The metrics kept per lake (export, backfill, source), and the errors by lake and kind.
    fn render_per_lake(&self, out: &mut String) {
        let lakes = [
            ("export", &self.export),
            ("backfill", &self.backfill),
            ("source", &self.source),
        ];
        type Field = fn(&LakeStats) -> &AtomicU64;
        let per_lake: [(&str, &str, Field); 7] = [
            (
                "lake_objects_read_total",
                "Objects read from a lake.",
                |s| &s.objects_read,
            ),
            (
                "lake_bytes_read_total",
                "Bytes of objects read from a lake.",
                |s| &s.bytes_read,
            ),
            (
                "lake_objects_written_total",
                "Objects written to a lake.",
                |s| &s.objects_written,
            ),
            (
                "lake_bytes_written_total",
                "Bytes of objects written to a lake.",
                |s| &s.bytes_written,
            ),
            (
                "lake_objects_present_total",
                "Objects a writer found already in the lake, identical, and left alone.",
                |s| &s.objects_present,
            ),
            (
                "lake_prefetch_held_bytes",
                "Decoded bytes prefetched from a lake and not yet served.",
                |s| &s.prefetch_held_bytes,
            ),
            (
                "lake_prefetch_peak_bytes",
                "Most decoded bytes prefetched from a lake at once.",
                |s| &s.prefetch_peak_bytes,
            ),
        ];
        for (name, help, field) in per_lake {
            family(out, name, help);
            for (lake, stats) in lakes {
                let v = field(stats).load(Ordering::Relaxed);
                let _ = writeln!(out, "ledger_relay_{name}{{lake=\"{lake}\"}} {v}");
            }
        }
        family(
            out,
            "lake_errors_total",
            "Lake errors by lake and kind (missing, truncated, corrupt, wrong_network, unreachable, denied, ...).",
        );
        for (lake, stats) in lakes {
            for kind in ErrorKind::ALL {
                let _ = writeln!(
                    out,
                    "ledger_relay_lake_errors_total{{lake=\"{lake}\",kind=\"{}\"}} {}",
                    kind.name(),
                    stats.errors(kind)
                );
            }
        }
    }
}
