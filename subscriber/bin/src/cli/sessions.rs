//! `ledger-subscribe --sessions N`, a bench mode: N independent subscriptions in one process,
//! so that a benchmark of the relay's cost per subscriber does not need N processes sharing
//! the relay's cores. Each is the normal run ([`super::run_one`]): its own session and lanes,
//! every ledger verified as usual (or not, with `--receive-only`), then counted and written
//! nowhere; `--stats FILE` gives session `k` the file `FILE.k` (one session: `FILE`).

use std::future::Future;
use std::path::{Path, PathBuf};

use futures::stream::{FuturesUnordered, StreamExt as _};
use tokio_util::sync::CancellationToken;

use super::{CliConfig, Output, Progress, RunError, RunSummary};

/// Runs `config.sessions` subscriptions until each has written `count` ledgers, `shutdown`
/// completes, or one fails (which stops the others; its error is returned). The summary adds
/// up the ledgers of all of them; `last_seq` is the newest any of them wrote.
pub(super) async fn run(
    config: CliConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<RunSummary, RunError> {
    let stop = CancellationToken::new();
    let mut runs: FuturesUnordered<_> = (0..config.sessions)
        .map(|k| {
            let one = session_config(&config, k);
            let stop = stop.clone();
            async move { super::run_one(one, stop.cancelled_owned()).await }
        })
        .collect();
    let mut total = RunSummary {
        ledgers: 0,
        last_seq: 0,
        interrupted: false,
    };
    let mut failure = None;
    tokio::pin!(shutdown);
    let mut stopping = false;
    loop {
        tokio::select! {
            next = runs.next() => match next {
                None => break,
                Some(Ok(s)) => {
                    total.ledgers += s.ledgers;
                    total.last_seq = total.last_seq.max(s.last_seq);
                    total.interrupted |= s.interrupted;
                }
                Some(Err(e)) => {
                    failure.get_or_insert(e);
                    stop.cancel();
                }
            },
            () = &mut shutdown, if !stopping => {
                stopping = true;
                stop.cancel();
            }
        }
    }
    match failure {
        Some(e) => Err(e),
        None => Ok(total),
    }
}

/// The configuration of session `k`: one subscription, written nowhere, its stats in
/// `FILE.k` (`FILE` when it is the only one), no status line.
fn session_config(config: &CliConfig, k: u16) -> CliConfig {
    let mut one = config.clone();
    one.sessions = 1;
    one.out = Output::Path(PathBuf::from("/dev/null"));
    one.stats = match config.stats.as_deref() {
        Some(p) if config.sessions > 1 => Some(stats_path(p, k)),
        other => other.map(Path::to_path_buf),
    };
    one.progress = Progress::Quiet;
    one
}

/// `FILE.k`: the stats file of session `k`.
pub(super) fn stats_path(path: &Path, k: u16) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".{k}"));
    PathBuf::from(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_session_has_its_own_stats_file() {
        assert_eq!(
            stats_path(Path::new("/tmp/s.csv"), 0),
            PathBuf::from("/tmp/s.csv.0")
        );
        assert_eq!(stats_path(Path::new("s"), 255), PathBuf::from("s.255"));
    }
}
