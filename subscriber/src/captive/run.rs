//! Streaming verified ledgers to core's metadata file descriptor, recording each as the last
//! closed ledger.

use std::fs::{File, OpenOptions};
use std::future::Future;
use std::io::{BufWriter, Write};
use std::path::Path;

use futures::StreamExt;

use super::{CaptiveError, State};
use crate::client::connect;
use crate::config::SubscribeConfig;

/// How a stream ended without an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamEnd {
    /// The requested count was written (a bounded catch-up).
    Done,
    /// SIGINT or SIGTERM (how the SDK stops `run`).
    Stopped,
}

/// Subscribes with `config`, writes each ledger from `write_from` on record-marked to file
/// descriptor `fd` (opened as `/dev/fd/N`), flushed, then records it in `state_dir` as the
/// last closed ledger; stops after `count` ledgers written or when `shutdown` completes.
/// Ledgers before `write_from` (between an anchor and the start, see
/// [`super::anchored_start`]) are verified by the subscription and not written. Returns the
/// ledgers written and why it stopped.
pub async fn stream(
    config: SubscribeConfig,
    count: Option<u64>,
    fd: i32,
    state_dir: &Path,
    write_from: u32,
    shutdown: impl Future<Output = ()>,
) -> Result<(u64, StreamEnd), CaptiveError> {
    let path = format!("/dev/fd/{fd}");
    let file = OpenOptions::new()
        .write(true)
        .open(&path)
        .map_err(|source| CaptiveError::Io {
            what: format!("cannot open the metadata stream {path}"),
            source,
        })?;
    let mut out = BufWriter::with_capacity(1 << 20, file);
    let mut sub = connect(config)?;
    tokio::pin!(shutdown);
    let mut written = 0u64;
    let result = loop {
        if count.is_some_and(|n| written >= n) {
            break Ok(StreamEnd::Done);
        }
        tokio::select! {
            item = sub.next() => match item {
                Some(Ok(ledger)) if ledger.seq < write_from => {}
                Some(Ok(ledger)) => {
                    let state = State { ledger: ledger.seq, hash: Some(ledger.header_hash) };
                    // A pipe's reader decides the pace (as it does core's): block this worker.
                    let wrote = tokio::task::block_in_place(|| write_one(&mut out, &ledger.data, &path));
                    if let Err(e) = wrote.and_then(|()| state.save(state_dir)) {
                        break Err(e);
                    }
                    written += 1;
                }
                Some(Err(e)) => break Err(e.into()),
                None => break Err(CaptiveError::Io {
                    what: "the subscription ended unexpectedly".into(),
                    source: std::io::Error::other("stream ended"),
                }),
            },
            _ = &mut shutdown => break Ok(StreamEnd::Stopped),
        }
    };
    sub.close().await;
    result.map(|end| (written, end))
}

fn write_one(out: &mut BufWriter<File>, data: &[u8], path: &str) -> Result<(), CaptiveError> {
    ledger_relay_wire::record::write_record_to(out, data)
        .and_then(|()| out.flush())
        .map_err(|source| CaptiveError::Io {
            what: format!("cannot write ledgers to {path}"),
            source,
        })
}
