//! `--lane-stats FILE`: every `--lane-stats-interval`, one CSV row per lane of the
//! subscription ([`LaneStats::csv_row`]), and a last set of rows when the run ends.

use std::fs::File;
use std::io::{BufWriter, Write as _};
use std::path::PathBuf;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::Duration;

use super::RunError;
use ledger_relay_subscriber::lanestats::{LaneMonitor, LaneStats};

/// Default of `--lane-stats-interval`.
pub const DEFAULT_LANE_STATS_INTERVAL: Duration = Duration::from_secs(1);

/// The thread writing the lane file.
pub(super) struct LaneStatsWriter {
    stop: mpsc::Sender<()>,
    thread: JoinHandle<Result<(), RunError>>,
}

impl LaneStatsWriter {
    /// Creates `path` with its header and starts writing rows every `interval`.
    pub(super) fn start(
        path: PathBuf,
        interval: Duration,
        monitor: LaneMonitor,
    ) -> Result<LaneStatsWriter, RunError> {
        let err = |path: &PathBuf| {
            let path = path.clone();
            move |source| RunError::Stats { path, source }
        };
        let mut w = BufWriter::new(File::create(&path).map_err(err(&path))?);
        writeln!(w, "{}", LaneStats::CSV_HEADER)
            .and_then(|()| w.flush())
            .map_err(err(&path))?;
        let (stop, rx) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("lane-stats".into())
            .spawn(move || loop {
                let last = match rx.recv_timeout(interval) {
                    Err(RecvTimeoutError::Timeout) => false,
                    Ok(()) | Err(RecvTimeoutError::Disconnected) => true,
                };
                let now = ledger_relay_transport::now_ns() as f64 / 1e6;
                let rows: String = monitor.snapshot().iter().map(|l| l.csv_row(now)).collect();
                w.write_all(rows.as_bytes())
                    .and_then(|()| w.flush())
                    .map_err(err(&path))?;
                if last {
                    return Ok(());
                }
            })
            .map_err(|source| RunError::Stats {
                path: "lane-stats thread".into(),
                source,
            })?;
        Ok(LaneStatsWriter { stop, thread })
    }

    /// Writes the last rows and waits for the thread.
    pub(super) async fn finish(self) -> Result<(), RunError> {
        let _ = self.stop.send(());
        match tokio::task::spawn_blocking(move || self.thread.join()).await {
            Ok(Ok(result)) => result,
            _ => Err(RunError::Stats {
                path: "lane-stats thread".into(),
                source: std::io::Error::other("the lane-stats thread failed"),
            }),
        }
    }
}
