//! Ledger sources: where the relay's ledgers come from.
//!
//! A source turns one of the inputs an operator can name (see [`SourceSpec`]) into a stream of
//! [`SourceEvent`]s: a ledger is a `Begin`, its bytes as `Data` pieces, and an `End`, or an
//! `Abort` when it is cut short. [`spawn`] runs a source on its own OS thread and sends its
//! events through an unbounded channel, so reading core's pipe never waits on the consumer.
//!
//! | Source | Module | Pieces | Timing |
//! |---|---|---|---|
//! | `file:PATH` | `file` | [`piece_sizes`] | paced: ledger k at `t0 + k * cadence`, over `emit` |
//! | `fifo:PATH`, `stdin` | `stream` | as read (reads of up to 256 KiB) | as the writer writes |
//! | `pipe:COMMAND` | `pipe` | as read (reads of up to 256 KiB) | as the child writes |
//! | `synthetic[:...]` | `synthetic` | [`piece_sizes`] | paced like `file` |
//! | `datalake:URL[,from=SEQ][,to=SEQ]` | `datalake` | [`piece_sizes`] | paced like `file` |
//!
//! Every record is parsed by `ledger_relay_wire::record` (core's record marking); sources
//! deliver the record bodies byte for byte. They do not look inside a ledger: ordering,
//! deduplication and chain checks belong to the pipeline.
//!
//! Event grammar, per source:
//! `(Begin Data* (End | Abort) | Down | Restarted)* (Finished | Failed)?`; only the pipe source
//! sends `Down` (its child's run ended) and `Restarted` (a new child runs).
//! Every `Begin` is closed by `End` or `Abort` before anything else but `Data` (an `Abort` also
//! precedes a `Failed` that cuts a ledger short). After `Finished` or `Failed` nothing follows.
//! On shutdown the source stops without `Finished`: the paced sources (file, synthetic) first
//! finish a ledger they are emitting; the stream sources (pipe, FIFO, stdin) send `Abort` if a
//! ledger was in progress (core is being stopped too); then the thread returns and the channel
//! closes.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ledger_relay_wire::record::DEFAULT_MAX_RECORD_LEN;
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

use crate::defaults::DEFAULTS;

mod datalake;
mod external;
mod file;
mod pipe;
mod stream;
mod synthetic;

pub use datalake::DatalakeSpec;
pub use external::{ExternalSource, ExternalStart, Refetch, RefetchFn, Refused};
pub use synthetic::{synthetic_ledgers, SyntheticLedgers, SyntheticSpec};
/// The synthetic source's memory: ledgers built up front when they fit in [`UPFRONT_BYTES`],
/// else [`AHEAD`] kept ready, over [`POOL`] filler bodies.
pub use synthetic::{AHEAD, POOL, UPFRONT_BYTES};

/// The wall clock in ns that `LedgerEnd`'s stamps carry (defined once, in the transport crate).
pub use ledger_relay_transport::now_ns;

/// Where the relay's ledgers come from: the `SOURCE` argument of `ledger-relay run`.
///
/// Parsed from `file:PATH`, `pipe:COMMAND`, `fifo:PATH`, `stdin`,
/// `synthetic[:KEY=VALUE,...]` (see [`SyntheticSpec`] for the keys) or
/// `datalake:URL[,from=SEQ][,to=SEQ]` (see [`DatalakeSpec`]); [`Display`](fmt::Display) writes
/// the same syntax back.
#[derive(Debug, Clone, PartialEq)]
pub enum SourceSpec {
    /// A record-marked dump of core's stream, plain or zstd-compressed, replayed once at the
    /// cadence.
    File {
        /// The dump.
        path: PathBuf,
    },
    /// A command run with `sh -c` whose fd 3 is the write end of the relay's pipe, such as
    /// `stellar-core run --metadata-output-stream fd:3`; supervised and restarted.
    Pipe {
        /// The shell command.
        command: String,
    },
    /// An existing FIFO (or any readable path) carrying core's stream, read until EOF.
    Fifo {
        /// The FIFO.
        path: PathBuf,
    },
    /// The relay's standard input, carrying core's stream, read until EOF.
    Stdin,
    /// Generated ledgers with valid headers and hash chain.
    Synthetic(SyntheticSpec),
    /// A SEP-54 data lake, replayed at the cadence.
    Datalake(DatalakeSpec),
    /// Upstream relays (a tier of a fan-out tree), `relay:ADDR[,ADDR...]`: run by an
    /// [`ExternalSource`], since subscribing needs the subscriber library, which this crate
    /// does not depend on.
    Relay {
        /// The upstream relays' addresses, HOST:PORT, in order of preference.
        upstreams: Vec<String>,
    },
}

/// Why a `SOURCE` argument was rejected. Every message is one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ParseSourceError {
    /// The part before the first `:` is not a known kind.
    #[error(
        "unknown source kind {kind:?}: expected file:PATH, pipe:COMMAND, fifo:PATH, stdin, \
         synthetic[:KEY=VALUE,...], datalake:URL[,from=SEQ][,to=SEQ] or relay:ADDR[,ADDR...]"
    )]
    UnknownKind {
        /// The kind given.
        kind: String,
    },
    /// A kind that needs an argument has none.
    #[error("source `{kind}:` needs a {what}")]
    MissingArgument {
        /// The kind: `file`, `pipe` or `fifo`.
        kind: &'static str,
        /// What is missing: `path` or `command`.
        what: &'static str,
    },
    /// `stdin` was given an argument.
    #[error("source `stdin` takes no argument, got {arg:?}")]
    UnexpectedArgument {
        /// The argument given.
        arg: String,
    },
    /// A synthetic key that does not exist.
    #[error("unknown synthetic key {key:?}: expected size, ratio, count, start or emit")]
    UnknownKey {
        /// The key given.
        key: String,
    },
    /// A synthetic key given twice.
    #[error("synthetic key {key:?} given twice")]
    DuplicateKey {
        /// The key.
        key: String,
    },
    /// A synthetic setting without `=`.
    #[error("synthetic setting {item:?} is not KEY=VALUE")]
    NotKeyValue {
        /// The setting as given.
        item: String,
    },
    /// A synthetic value that does not parse or is out of range.
    #[error("bad synthetic {key} {value:?}: {reason}")]
    BadValue {
        /// The key.
        key: &'static str,
        /// The value as given.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A `relay:` source address without a port.
    #[error("bad relay source address {address:?}: expected HOST:PORT")]
    BadRelay {
        /// The address as given.
        address: String,
    },
    /// A `datalake:` source whose URL or settings do not parse.
    #[error("bad datalake source: {reason}")]
    BadDatalake {
        /// What is wrong.
        reason: String,
    },
}

impl FromStr for SourceSpec {
    type Err = ParseSourceError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (kind, arg) = match s.split_once(':') {
            Some((kind, arg)) => (kind, Some(arg)),
            None => (s, None),
        };
        let needs = |kind: &'static str, what: &'static str| {
            arg.filter(|a| !a.is_empty())
                .ok_or(ParseSourceError::MissingArgument { kind, what })
        };
        match kind {
            "file" => Ok(SourceSpec::File {
                path: needs("file", "path")?.into(),
            }),
            "fifo" => Ok(SourceSpec::Fifo {
                path: needs("fifo", "path")?.into(),
            }),
            "pipe" => {
                let command = needs("pipe", "command")?;
                if command.trim().is_empty() {
                    return Err(ParseSourceError::MissingArgument {
                        kind: "pipe",
                        what: "command",
                    });
                }
                Ok(SourceSpec::Pipe {
                    command: command.to_owned(),
                })
            }
            "stdin" => match arg {
                None => Ok(SourceSpec::Stdin),
                Some(arg) => Err(ParseSourceError::UnexpectedArgument {
                    arg: arg.to_owned(),
                }),
            },
            "synthetic" => SyntheticSpec::parse_settings(arg.unwrap_or("")).map(Self::Synthetic),
            "datalake" => needs("datalake", "lake url")?.parse().map(Self::Datalake),
            "relay" => {
                let upstreams: Vec<String> = needs("relay", "relay address")?
                    .split(',')
                    .map(str::trim)
                    .filter(|a| !a.is_empty())
                    .map(str::to_owned)
                    .collect();
                if upstreams.is_empty() {
                    return Err(ParseSourceError::MissingArgument {
                        kind: "relay",
                        what: "relay address",
                    });
                }
                if let Some(bad) = upstreams.iter().find(|a| !a.contains(':')) {
                    return Err(ParseSourceError::BadRelay {
                        address: bad.clone(),
                    });
                }
                Ok(Self::Relay { upstreams })
            }
            _ => Err(ParseSourceError::UnknownKind {
                kind: kind.to_owned(),
            }),
        }
    }
}

impl fmt::Display for SourceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SourceSpec::File { path } => write!(f, "file:{}", path.display()),
            SourceSpec::Pipe { command } => write!(f, "pipe:{command}"),
            SourceSpec::Fifo { path } => write!(f, "fifo:{}", path.display()),
            SourceSpec::Stdin => f.write_str("stdin"),
            SourceSpec::Synthetic(spec) => write!(f, "synthetic:{spec}"),
            SourceSpec::Datalake(spec) => write!(f, "datalake:{spec}"),
            SourceSpec::Relay { upstreams } => write!(f, "relay:{}", upstreams.join(",")),
        }
    }
}

/// How sources behave, beyond what [`SourceSpec`] says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceOptions {
    /// Time between the starts of two ledgers of the paced sources (file and synthetic).
    /// Default 600 ms, the Phase 3 stress profile.
    pub cadence: Duration,
    /// Time the paced sources take to emit one ledger, first piece to last. Default 8 ms: how
    /// long core takes to write a 14.5 MiB ledger to its pipe.
    pub emit: Duration,
    /// Longest record body accepted (and generated), in bytes.
    pub max_record_len: u32,
    /// Least and greatest delay before restarting a pipe source's child (exponential in
    /// between). Default 100 ms .. 10 s.
    pub pipe_restart_backoff: (Duration, Duration),
    /// The network passphrase a `datalake:` source's manifest must name (`None`: unchecked).
    pub network_passphrase: Option<String>,
    /// Store client settings of a `datalake:` source.
    pub lake: ledger_relay_lake::LakeOptions,
    /// Where a `datalake:` source counts its lake's traffic and errors.
    pub lake_stats: LakeStatsHandle,
}

/// A shared [`ledger_relay_lake::LakeStats`], equal only to itself (so options stay comparable).
#[derive(Debug, Clone, Default)]
pub struct LakeStatsHandle(pub std::sync::Arc<ledger_relay_lake::LakeStats>);

impl PartialEq for LakeStatsHandle {
    fn eq(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for LakeStatsHandle {}

impl Default for SourceOptions {
    fn default() -> Self {
        Self {
            cadence: DEFAULTS.cadence,
            emit: DEFAULTS.emit,
            max_record_len: DEFAULT_MAX_RECORD_LEN,
            pipe_restart_backoff: (Duration::from_millis(100), Duration::from_secs(10)),
            network_passphrase: None,
            lake: ledger_relay_lake::LakeOptions::default(),
            lake_stats: LakeStatsHandle::default(),
        }
    }
}

/// Events of one source, in order. Bytes of a ledger arrive as pieces between `Begin` and
/// `End`. See the [module docs](self) for the grammar.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceEvent {
    /// A record mark was read: a ledger of `len` bytes starts.
    Begin {
        /// The ledger's length in bytes (the record body, without its mark); 0 when not known
        /// yet (a `relay:` source passing a ledger on as it arrives, see `--cut-through`).
        len: u32,
        /// When its first byte was read (paced sources: emitted), from [`now_ns`].
        at_ns: u64,
    },
    /// The next piece of the current ledger, as read (paced sources: 64-256 KiB pieces, see
    /// [`piece_sizes`]). Never empty.
    Data(Bytes),
    /// When the current ledger's first byte was read after all: a `relay:` source passing a
    /// ledger on as it arrives learns the root's stamp only from its end record. Replaces the
    /// `Begin`'s.
    FirstByte {
        /// From [`now_ns`], or the upstream's stamp.
        at_ns: u64,
    },
    /// The current ledger is complete.
    End {
        /// When its last byte was read (paced sources: emitted), from [`now_ns`].
        at_ns: u64,
    },
    /// The ledger in progress is cut short (the child died mid-ledger, the stream ended inside
    /// a record, shutdown): the consumer must discard it.
    Abort {
        /// Why, for logs.
        reason: String,
    },
    /// Pipe source: the child's run ended (it exited, or closed its stream), or starting its
    /// replacement failed; a new child is started after a backoff, then `Restarted` follows.
    Down {
        /// Why, for logs and `/healthz`.
        reason: String,
    },
    /// Pipe source: the child exited and was restarted.
    Restarted {
        /// How many restarts so far, from 1.
        attempt: u32,
        /// Why the previous child ended, for logs.
        reason: String,
    },
    /// The source ended cleanly: the file was replayed once, the synthetic count was reached,
    /// or the FIFO or stdin reached EOF (a record cut short by EOF is aborted first).
    Finished,
    /// An unrecoverable error (a malformed record stream, a record too long, an IO error);
    /// nothing more follows.
    Failed(String),
}

/// Runs the source on its own OS thread(s) until it ends or `shutdown` is cancelled.
///
/// Reading core's pipe must never wait on the consumer, so `events` is unbounded. The source
/// also stops, silently, when the receiver of `events` is dropped. On shutdown, pipe sources
/// stop the child's whole process group (SIGTERM, then SIGKILL after a grace period) and reap
/// it before the thread returns.
pub fn spawn(
    spec: SourceSpec,
    opts: SourceOptions,
    events: UnboundedSender<SourceEvent>,
    shutdown: CancellationToken,
) -> JoinHandle<()> {
    let name = match &spec {
        SourceSpec::File { .. } => "source-file",
        SourceSpec::Pipe { .. } => "source-pipe",
        SourceSpec::Fifo { .. } => "source-fifo",
        SourceSpec::Stdin => "source-stdin",
        SourceSpec::Synthetic(_) => "source-synthetic",
        SourceSpec::Datalake(_) => "source-datalake",
        SourceSpec::Relay { .. } => "source-relay",
    };
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || run(spec, opts, Out { events, shutdown }))
        // Creating a thread fails only when the OS is out of threads or memory, where
        // `std::thread::spawn` panics too; the relay cannot run without its source.
        .expect("cannot create the source thread")
}

fn run(spec: SourceSpec, opts: SourceOptions, out: Out) {
    tracing::info!(source = %spec, "source starting");
    let result = match spec {
        SourceSpec::File { path } => file::run(&path, &opts, &out),
        SourceSpec::Pipe { command } => pipe::run(&command, &opts, &out),
        SourceSpec::Fifo { path } => stream::run_fifo(&path, &opts, &out),
        SourceSpec::Stdin => stream::run_stdin(&opts, &out),
        SourceSpec::Synthetic(spec) => synthetic::run(&spec, &opts, &out),
        SourceSpec::Datalake(spec) => datalake::run(&spec, &opts, &out),
        // `Relay::start` hands it to its `ExternalSource` instead.
        SourceSpec::Relay { .. } => Err(Stop::Failed(
            "a relay: source runs only through an external source (the ledger-relay binary)".into(),
        )),
    };
    match result {
        Ok(()) => {
            tracing::info!("source finished");
            let _ = out.send(SourceEvent::Finished);
        }
        Err(Stop::Failed(reason)) => {
            tracing::error!(%reason, "source failed");
            let _ = out.send(SourceEvent::Failed(reason));
        }
        Err(Stop::Shutdown) => tracing::info!("source stopped: shutdown"),
        Err(Stop::ConsumerGone) => tracing::info!("source stopped: its consumer is gone"),
    }
}

/// Why a source stopped early.
#[derive(Debug)]
enum Stop {
    /// The shutdown token was cancelled.
    Shutdown,
    /// The events receiver was dropped.
    ConsumerGone,
    /// An unrecoverable error, sent as [`SourceEvent::Failed`].
    Failed(String),
}

/// A source's outlet: the events channel and the shutdown token.
struct Out {
    events: UnboundedSender<SourceEvent>,
    shutdown: CancellationToken,
}

/// Longest single sleep while waiting for a deadline: bounds how late a shutdown is noticed.
const SLEEP_SLICE: Duration = Duration::from_millis(20);

impl Out {
    fn send(&self, event: SourceEvent) -> Result<(), Stop> {
        self.events.send(event).map_err(|_| Stop::ConsumerGone)
    }

    /// Returns why the source should stop now, if it should.
    fn check(&self) -> Result<(), Stop> {
        if self.shutdown.is_cancelled() {
            Err(Stop::Shutdown)
        } else if self.events.is_closed() {
            Err(Stop::ConsumerGone)
        } else {
            Ok(())
        }
    }

    /// Sleeps until `deadline`, waking early to stop on shutdown.
    fn sleep_until(&self, deadline: Instant) -> Result<(), Stop> {
        loop {
            self.check()?;
            let now = Instant::now();
            if now >= deadline {
                return Ok(());
            }
            std::thread::sleep((deadline - now).min(SLEEP_SLICE));
        }
    }

    /// Sleeps until `deadline` whatever the shutdown token says (a ledger being emitted is
    /// finished on shutdown: the emit window is short), stopping only if the consumer is gone.
    fn sleep_finishing(&self, deadline: Instant) -> Result<(), Stop> {
        loop {
            if self.events.is_closed() {
                return Err(Stop::ConsumerGone);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(());
            }
            std::thread::sleep((deadline - now).min(SLEEP_SLICE));
        }
    }

    /// Waits for the next item from a thread working ahead of the source, checking for
    /// shutdown meanwhile; `None` when that thread is done.
    fn recv<T>(&self, rx: &std::sync::mpsc::Receiver<T>) -> Result<Option<T>, Stop> {
        loop {
            match rx.recv_timeout(SLEEP_SLICE) {
                Ok(item) => return Ok(Some(item)),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => self.check()?,
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return Ok(None),
            }
        }
    }

    /// Sends an `Abort` for a ledger cut short by `stop` and passes `stop` on.
    fn abort(&self, stop: Stop) -> Stop {
        let reason = match &stop {
            Stop::Shutdown => "shutdown".to_owned(),
            Stop::ConsumerGone => return stop,
            Stop::Failed(reason) => reason.clone(),
        };
        match self.send(SourceEvent::Abort { reason }) {
            Ok(()) => stop,
            Err(gone) => gone,
        }
    }
}

/// Target size of a paced piece: 192 KiB.
///
/// Core writes a ledger to its pipe in 64-256 KiB writes; 192 KiB sits in that range and is
/// deliberately not a divisor of the pipeline's 256 KiB chunk, so chunks straddle pieces the
/// way they do with a real pipe.
pub const PIECE_TARGET: usize = 192 << 10;

/// How the paced sources (file, synthetic) cut a ledger of `len` bytes into pieces.
///
/// `n = ceil(len / PIECE_TARGET)` pieces of equal size (the first `len % n` one byte longer):
/// a ledger of up to 192 KiB is one piece, a larger one is cut into pieces of 96-192 KiB
/// (a 14.5 MiB ledger: 78 pieces of about 190 KiB). So every piece is at most 256 KiB and, but
/// for a ledger that is one piece, at least 64 KiB.
pub fn piece_sizes(len: usize) -> impl Iterator<Item = usize> {
    let n = len.div_ceil(PIECE_TARGET).max(1);
    let (base, extra) = (len / n, len % n);
    (0..n)
        .map(move |i| base + usize::from(i < extra))
        .filter(|&size| size > 0)
}

/// Paces ledgers on a cadence: ledger k starts at `t0 + k * cadence`, `t0` being the first
/// ledger's start. A ledger more than a whole cadence late (a slow reader or generator, an emit
/// window longer than the cadence) starts at once and moves the grid: the source never bursts
/// to catch up.
struct Pacer {
    cadence: Duration,
    emit: Duration,
    next: Option<Instant>,
}

impl Pacer {
    fn new(cadence: Duration, emit: Duration) -> Self {
        Self {
            cadence,
            emit,
            next: None,
        }
    }

    /// Waits for the ledger's slot, then emits `body` over the emit window: `Begin`, its
    /// pieces evenly spaced so that the first goes out at the slot and the last `emit` later,
    /// then `End`. The stamps are the times the first and last pieces were sent. A shutdown
    /// during the window lets the ledger finish; one before the slot stops at once.
    fn emit(&mut self, out: &Out, body: Bytes) -> Result<(), Stop> {
        let len = u32::try_from(body.len())
            .map_err(|_| Stop::Failed(format!("ledger of {} bytes is too long", body.len())))?;
        let slot = self.next;
        if let Some(slot) = slot {
            out.sleep_until(slot)?;
        }
        out.check()?;
        let start = Instant::now();
        // Stay on the grid (t0 + k * cadence) so that oversleeping does not accumulate; a
        // ledger later than a whole cadence moves the grid instead of causing a burst.
        self.next = Some(match slot {
            Some(slot) if start < slot + self.cadence => slot + self.cadence,
            _ => start + self.cadence,
        });

        let sizes: Vec<usize> = piece_sizes(body.len()).collect();
        let gaps = u32::try_from(sizes.len().saturating_sub(1)).unwrap_or(u32::MAX);
        out.send(SourceEvent::Begin {
            len,
            at_ns: now_ns(),
        })?;
        let mut offset = 0;
        for (i, size) in sizes.into_iter().enumerate() {
            if i > 0 {
                // `i <= gaps`, both u32 (a ledger is under 2^31 bytes), so no overflow.
                let due = start + self.emit.mul_f64(i as f64 / f64::from(gaps));
                // Graceful shutdown finishes the ledger in flight rather than cutting it off.
                out.sleep_finishing(due).map_err(|stop| out.abort(stop))?;
            }
            out.send(SourceEvent::Data(body.slice(offset..offset + size)))?;
            offset += size;
        }
        out.send(SourceEvent::End { at_ns: now_ns() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_form() {
        assert_eq!(
            "file:/tmp/x.xdr.zst".parse::<SourceSpec>().unwrap(),
            SourceSpec::File {
                path: "/tmp/x.xdr.zst".into()
            }
        );
        assert_eq!(
            "pipe:stellar-core run --metadata-output-stream fd:3"
                .parse::<SourceSpec>()
                .unwrap(),
            SourceSpec::Pipe {
                command: "stellar-core run --metadata-output-stream fd:3".into()
            }
        );
        assert_eq!(
            "fifo:/run/meta.fifo".parse::<SourceSpec>().unwrap(),
            SourceSpec::Fifo {
                path: "/run/meta.fifo".into()
            }
        );
        assert_eq!("stdin".parse::<SourceSpec>().unwrap(), SourceSpec::Stdin);
        assert_eq!(
            "synthetic".parse::<SourceSpec>().unwrap(),
            SourceSpec::Synthetic(SyntheticSpec::default())
        );
        assert_eq!(
            "synthetic:".parse::<SourceSpec>().unwrap(),
            SourceSpec::Synthetic(SyntheticSpec::default())
        );
        let spec: SourceSpec = "synthetic:size=14.5MiB,ratio=7.6,count=100,start=2,emit=8ms"
            .parse()
            .unwrap();
        assert_eq!(
            spec,
            SourceSpec::Synthetic(SyntheticSpec {
                size: 15_204_352,
                ratio: 7.6,
                count: Some(100),
                start: 2,
                emit: Some(Duration::from_millis(8)),
                ..SyntheticSpec::default()
            })
        );
        let spec: SourceSpec = "synthetic:size=4096,ratio=1,emit=1.5ms,start=7"
            .parse()
            .unwrap();
        assert_eq!(
            spec,
            SourceSpec::Synthetic(SyntheticSpec {
                size: 4096,
                ratio: 1.0,
                count: None,
                start: 7,
                emit: Some(Duration::from_micros(1500)),
                ..SyntheticSpec::default()
            })
        );
        // A path may hold colons and commas; a command anything.
        assert_eq!(
            "file:a:b,c".parse::<SourceSpec>().unwrap(),
            SourceSpec::File {
                path: "a:b,c".into()
            }
        );
    }

    #[test]
    fn display_round_trips() {
        for s in [
            "file:/tmp/x",
            "pipe:cat f >&3",
            "fifo:/tmp/f",
            "stdin",
            "synthetic",
            "synthetic:size=1MiB,ratio=2.5,count=3,start=9,emit=250us",
            "synthetic:size=2000,ratio=1",
            "datalake:file:///var/lake",
            "datalake:s3://aws-public-blockchain/v1.1/stellar/ledgers/pubnet,from=2,to=100",
            "datalake:gs://b/p,to=7",
            "datalake:az://c,from=7",
            "relay:10.0.0.1:7400",
            "relay:root-a.internal:7400,[::1]:7400",
        ] {
            let spec: SourceSpec = s.parse().unwrap();
            let shown = spec.to_string();
            assert_eq!(shown.parse::<SourceSpec>().unwrap(), spec, "{s} -> {shown}");
        }
    }

    #[test]
    fn bad_specs_give_one_line_errors() {
        for (s, want) in [
            ("", "unknown source kind \"\""),
            ("tcp:1.2.3.4:5", "unknown source kind \"tcp\""),
            ("File:/x", "unknown source kind \"File\""),
            ("file", "source `file:` needs a path"),
            ("file:", "source `file:` needs a path"),
            ("fifo:", "source `fifo:` needs a path"),
            ("pipe:", "source `pipe:` needs a command"),
            ("pipe:   ", "source `pipe:` needs a command"),
            ("stdin:x", "source `stdin` takes no argument"),
            ("synthetic:bogus=1", "unknown synthetic key \"bogus\""),
            (
                "synthetic:size",
                "synthetic setting \"size\" is not KEY=VALUE",
            ),
            (
                "synthetic:size=1MiB,size=2MiB",
                "synthetic key \"size\" given twice",
            ),
            ("synthetic:size=lots", "bad synthetic size \"lots\""),
            ("synthetic:size=12XB", "bad synthetic size \"12XB\""),
            ("synthetic:size=-1MiB", "bad synthetic size \"-1MiB\""),
            ("synthetic:size=10", "bad synthetic size \"10\": at least"),
            (
                "synthetic:size=4GiB",
                "bad synthetic size \"4GiB\": at most",
            ),
            ("synthetic:ratio=0.5", "bad synthetic ratio \"0.5\""),
            ("synthetic:ratio=NaN", "bad synthetic ratio \"NaN\""),
            ("synthetic:count=0", "bad synthetic count \"0\""),
            ("synthetic:count=x", "bad synthetic count \"x\""),
            ("synthetic:start=0", "bad synthetic start \"0\""),
            (
                "synthetic:start=4294967295,count=2",
                "bad synthetic count \"2\"",
            ),
            ("synthetic:emit=8", "bad synthetic emit \"8\""),
            ("synthetic:emit=fast", "bad synthetic emit \"fast\""),
            ("synthetic:size=1MiB\nx", "bad synthetic size \"1MiB\\nx\""),
            ("datalake:", "source `datalake:` needs a lake url"),
            ("relay:", "source `relay:` needs a relay address"),
            ("relay:,", "source `relay:` needs a relay address"),
            ("relay:root-a", "bad relay source address \"root-a\""),
            ("datalake:/var/lake", "bad datalake source: bad lake url"),
            ("datalake:s3://b,from=x", "bad datalake source: \"from=x\""),
            (
                "datalake:s3://b,from=1,from=2",
                "bad datalake source: \"from=1\" given twice",
            ),
            ("datalake:s3://b,to=-1", "bad datalake source: \"to=-1\""),
        ] {
            let e = s.parse::<SourceSpec>().unwrap_err().to_string();
            assert!(e.starts_with(want), "{s:?}: {e}");
            assert!(!e.contains('\n'), "{s:?}: {e}");
        }
    }

    #[test]
    fn pieces_are_64_to_256_kib() {
        assert_eq!(piece_sizes(0).count(), 0);
        assert_eq!(piece_sizes(1).collect::<Vec<_>>(), [1]);
        assert_eq!(piece_sizes(60_000).collect::<Vec<_>>(), [60_000]);
        assert_eq!(
            piece_sizes(PIECE_TARGET).collect::<Vec<_>>(),
            [PIECE_TARGET]
        );
        assert_eq!(
            piece_sizes(PIECE_TARGET + 1).collect::<Vec<_>>(),
            [PIECE_TARGET / 2 + 1, PIECE_TARGET / 2]
        );
        assert_eq!(piece_sizes(15_204_352).count(), 78);
        for len in [
            PIECE_TARGET - 1,
            PIECE_TARGET + 1,
            300 << 10,
            1 << 20,
            (1 << 20) + 3,
            15_204_352,
            40 << 20,
        ] {
            let sizes: Vec<usize> = piece_sizes(len).collect();
            assert_eq!(sizes.iter().sum::<usize>(), len);
            for &size in &sizes {
                assert!(size <= 256 << 10, "{len}: {size}");
                assert!(sizes.len() == 1 || size >= 64 << 10, "{len}: {size}");
            }
        }
    }
}
