//! Streaming verified ledgers to core's metadata file descriptor, recording each as the last
//! closed ledger, while core's HTTP ports are served.

use std::fs::{File, OpenOptions};
use std::future::Future;
use std::io::{BufWriter, Write};
use std::net::SocketAddr;
use std::path::Path;

use futures::StreamExt;
use ledger_relay_wire::core_http::CorePort;
use tokio::sync::watch;

use super::http::{HttpOptions, HttpServers};
use super::{CaptiveError, State};
use ledger_relay_subscriber::config::SubscribeConfig;
use ledger_relay_subscriber::connect;
use ledger_relay_subscriber::Ledger;

/// Core's HTTP ports to serve while streaming.
#[derive(Debug, Clone)]
pub struct Serve {
    /// Where (`CoreConf::listen_addrs`); empty: nothing served.
    pub listen: Vec<(CorePort, SocketAddr)>,
    /// How.
    pub options: HttpOptions,
}

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
/// last closed ledger (with its protocol); stops after `count` ledgers written or when
/// `shutdown` completes. Ledgers before `write_from` (between an anchor and the start, see
/// [`super::anchored_start`]) are verified by the subscription and not written. Meanwhile
/// serves `serve`'s ports, whose query port answers as of the last ledger written. Returns the
/// ledgers written and why it stopped.
pub async fn stream(
    config: SubscribeConfig,
    count: Option<u64>,
    fd: i32,
    state_dir: &Path,
    write_from: u32,
    serve: Option<Serve>,
    shutdown: impl Future<Output = ()>,
) -> Result<(u64, StreamEnd), CaptiveError> {
    let (written_tx, written) = watch::channel(0u32);
    let servers = match serve.filter(|s| !s.listen.is_empty()) {
        Some(s) => Some(HttpServers::start(&s.listen, s.options, written).await?),
        None => None,
    };
    let result = write_ledgers(
        config,
        count,
        fd,
        state_dir,
        write_from,
        &written_tx,
        shutdown,
    )
    .await;
    if let Some(servers) = servers {
        servers.stop().await;
    }
    result
}

async fn write_ledgers(
    config: SubscribeConfig,
    count: Option<u64>,
    fd: i32,
    state_dir: &Path,
    write_from: u32,
    written_tx: &watch::Sender<u32>,
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
                    // A pipe's reader decides the pace (as it does core's): block this worker.
                    let wrote = tokio::task::block_in_place(|| write_one(&mut out, &ledger.data, &path));
                    if let Err(e) = wrote {
                        break Err(e);
                    }
                    // Written: queries may now be answered as of this ledger.
                    written_tx.send_replace(ledger.seq);
                    if let Err(e) = state_of(&ledger).save(state_dir) {
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

/// The state after `ledger`: its sequence, hash and protocol (from its header).
fn state_of(ledger: &Ledger) -> State {
    let header = ledger_relay_wire::header::peek_header(&ledger.data);
    State {
        ledger: ledger.seq,
        hash: Some(ledger.header_hash),
        protocol: header.ok().flatten().map(|h| h.protocol_version),
    }
}

fn write_one(out: &mut BufWriter<File>, data: &[u8], path: &str) -> Result<(), CaptiveError> {
    ledger_relay_wire::record::write_record_to(out, data)
        .and_then(|()| out.flush())
        .map_err(|source| CaptiveError::Io {
            what: format!("cannot write ledgers to {path}"),
            source,
        })
}
