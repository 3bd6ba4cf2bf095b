//! The signals that stop a long-running command: SIGINT (Ctrl-C) and SIGTERM (systemd, `kill`),
//! listened to together, so every tool stops on the same two.

use tokio::signal::unix::{signal, Signal, SignalKind};

/// SIGINT and SIGTERM, installed once and awaited as often as needed (a first signal to stop
/// gracefully, a second to exit at once).
#[derive(Debug)]
pub struct StopSignals {
    int: Signal,
    term: Signal,
}

impl StopSignals {
    /// Installs handlers for both. Needs a Tokio runtime with IO enabled.
    pub fn new() -> std::io::Result<StopSignals> {
        Ok(StopSignals {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
        })
    }

    /// Waits for the next SIGINT or SIGTERM.
    pub async fn recv(&mut self) {
        tokio::select! {
            _ = self.int.recv() => {}
            _ = self.term.recv() => {}
        }
    }
}
