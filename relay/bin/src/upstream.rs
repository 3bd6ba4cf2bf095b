//! The `relay:ADDR[,ADDR...]` source: this relay is a tier of a fan-out tree and subscribes to
//! upstream relays with the subscriber library (which the relay library does not depend on, so
//! the source lives here and is handed to it as an [`ExternalSource`]).
//!
//! Every ledger is verified as any subscriber verifies it (checksums, header, hash chain from
//! the ring's newest ledger, transaction set and results: the content check is the library's,
//! `SubscribeConfig::content_check`, kept on, and the relay does not run it a second time on
//! these ledgers) and then fed to the relay's pipeline
//! as a source's events, whole: the pipeline chunks it again, keeps it in this relay's ring and
//! serves it live and from the ring. The first and last byte stamps are the upstream's (the
//! root's), so a subscriber of this relay measures its delivery from the root's source.
//!
//! It resumes after the ring's newest ledger (anchored to its hash) at every start; with an
//! empty ring it starts at `--upstream-anchor SEQ:HASH` (ledger SEQ must hash to HASH), or
//! without one at the upstream's tip, trusting its first ledger. It fails over between
//! upstreams as a subscriber does (round robin, from the last ledger read + 1), and reports the
//! upstream's newest ledger and its lag in the metrics. While no upstream can be reached it
//! tells the pipeline the source is down, which `/healthz` shows with the reason. A terminal
//! error of the subscription (an upstream refusing our certificate, a start below every
//! upstream's retention) is logged and the subscription is started again after
//! [`RETRY_AFTER`], from the next upstream.
//!
//! An upstream whose bytes fail any check, the subscriber library's (framing, checksum,
//! header, chain, content, anchor) or the pipeline's (with `--cut-through` the pipeline reads
//! a ledger's header before the library has it whole, and refuses it when it does not hash,
//! link or follow: see [`Refused`]), is set aside for [`SET_ASIDE`] (doubling each time it
//! does it again, up to [`SET_ASIDE_MAX`]) and the tier goes on at once from the next
//! upstream, from the ledger after the newest the pipeline holds. While every upstream is set
//! aside the source waits, down, for the first to come back.
//!
//! Store-and-forward per tier by default: a ledger goes on only once it is complete and
//! verified here. With `--cut-through` each ledger's bytes go on as they arrive, in order
//! (the subscriber library's prefixes, see `connect_cut_through`), and the pipeline streams
//! them to this relay's subscribers at once; the ledger's end follows when the verified ledger
//! arrives and the bytes passed on are checked to be its own. A ledger that fails verification
//! (or whose session ends first) is taken back with `Abort`: the pipeline discards it, sessions
//! given some of its chunks end with `SourceReset` and resume, and the ring, which keeps only
//! complete ledgers, never sees it. See [`Forward`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use ledger_relay::config::UpstreamConfig;
use ledger_relay::metrics::Metrics;
use ledger_relay::source::{
    ExternalSource, ExternalStart, Refetch, Refused, SourceEvent, SourceSpec,
};
use ledger_relay_subscriber::frame::Start;
use ledger_relay_subscriber::{
    connect, connect_cut_through, Anchor, Credentials, Ledger, RelayAddr, SubscribeConfig,
    Subscription,
};
use ledger_relay_wire::Prefix;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use tokio_util::sync::CancellationToken;

/// How long after a terminal error of the upstream subscription it is started again, when the
/// error set no upstream aside (after one that did, the next starts at once).
pub const RETRY_AFTER: Duration = Duration::from_secs(2);
/// How long no upstream session may be up before the source is reported down.
const DOWN_AFTER: Duration = Duration::from_secs(1);
/// How often the upstream's state is copied into the metrics.
const TICK: Duration = Duration::from_millis(250);
/// Largest `Data` piece handed to the pipeline.
const PIECE: usize = 256 << 10;

/// The external source for a relay whose certificates are in `certs`.
pub fn external(certs: PathBuf, upstream: UpstreamConfig) -> ExternalSource {
    ExternalSource(std::sync::Arc::new(move |start: ExternalStart| {
        let (certs, upstream) = (certs.clone(), upstream.clone());
        std::thread::Builder::new()
            .name("source-relay".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = start
                            .events
                            .send(SourceEvent::Failed(format!("cannot start a runtime: {e}")));
                        return;
                    }
                };
                runtime.block_on(run(start, certs, upstream));
            })
            // As for the relay's other sources: no thread, no relay.
            .expect("cannot create the source thread")
    }))
}

/// How long fetching one ledger again from the upstreams may take.
const REFETCH_WITHIN: Duration = Duration::from_secs(30);

/// Fetching a damaged ring ledger again from the upstream relays `upstreams` (the addresses of
/// the `relay:` source), as client `upstream.name` with the certificates in `certs`: a
/// subscription of one lane from that ledger, verified as any subscriber verifies, closed after
/// the first ledger; it must be the one the ring recorded (same sequence and header hash).
pub fn refetch(certs: PathBuf, upstream: UpstreamConfig, upstreams: Vec<String>) -> Refetch {
    Refetch(std::sync::Arc::new(move |seq, hash| {
        let (certs, name, upstreams) = (certs.clone(), upstream.name.clone(), upstreams.clone());
        Box::pin(async move {
            let relays = upstreams
                .iter()
                .map(|a| a.parse::<RelayAddr>().map_err(|e| e.to_string()))
                .collect::<Result<Vec<_>, _>>()?;
            let credentials = Credentials::from_cert_dir(&certs, &name)
                .map_err(|e| format!("upstream certificate {name}: {e}"))?;
            let mut config = SubscribeConfig::new(relays, credentials);
            config.lanes = 1;
            config.start = Start::Seq(seq);
            let mut sub = connect(config).map_err(|e| format!("upstream subscription: {e}"))?;
            let got = tokio::time::timeout(REFETCH_WITHIN, sub.next()).await;
            sub.close().await;
            let ledger = match got {
                Err(_) => {
                    return Err(format!(
                        "no upstream gave ledger {seq} within {REFETCH_WITHIN:?}"
                    ))
                }
                Ok(None) => return Err("the upstream subscription ended".into()),
                Ok(Some(Err(e))) => return Err(e.to_string()),
                Ok(Some(Ok(l))) => l,
            };
            if ledger.seq != seq || ledger.header_hash != hash {
                return Err(format!(
                    "the upstreams' ledger {} is not the one the ring recorded as {seq}",
                    ledger.seq
                ));
            }
            tracing::info!(seq, "damaged ledger fetched again from the upstream relays");
            Ok(ledger.data)
        })
    }))
}

async fn run(start: ExternalStart, certs: PathBuf, upstream: UpstreamConfig) {
    let Some(mut tier) = Tier::new(start, &certs, upstream) else {
        return;
    };
    loop {
        let Some(order) = tier.next_order().await else {
            return;
        };
        let failure = match tier.subscribe(&order).await {
            Ended::Stop => return,
            Ended::Fatal(reason) => return tier.fail(reason),
            Ended::Failed(f) => f,
        };
        if !tier.after(failure).await {
            return;
        }
    }
}

/// How a subscription ended.
enum Ended {
    /// Shutdown, or the pipeline is gone: the source returns.
    Stop,
    /// The subscription cannot be made at all: the source fails.
    Fatal(String),
    /// It failed: another is started.
    Failed(Failure),
}

/// Why a subscription ended, and what that says of its upstreams.
struct Failure {
    error: String,
    /// The upstream that sent bytes which failed a check: set aside.
    culprit: Option<SocketAddr>,
    /// Where to resume, when the pipeline said (it refused what followed).
    resume_after: Option<Option<(u32, [u8; 32])>>,
    /// Start the next subscription at once rather than after [`RETRY_AFTER`].
    at_once: bool,
}

impl Failure {
    fn plain(error: impl Into<String>) -> Failure {
        Failure {
            error: error.into(),
            culprit: None,
            resume_after: None,
            at_once: false,
        }
    }

    /// The subscription's terminal error: a ledger that failed the subscriber's checks
    /// (framing, checksum, header, chain, content, anchor) names the upstream that sent it.
    fn of(e: &ledger_relay_subscriber::SubscribeError) -> Failure {
        use ledger_relay_subscriber::SubscribeError as E;
        let culprit = match e {
            E::Integrity { relay, .. } | E::Verify { relay, .. } => Some(*relay),
            _ => None,
        };
        Failure {
            culprit,
            ..Failure::plain(one_line(e))
        }
    }
}

/// An error and its causes on one line, `a: b: c`, peer text escaped (a cause can hold an
/// upstream's words).
fn one_line(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    ledger_relay_wire::text::escape(&out).into_owned()
}

/// Whether a session with an upstream has been missing, and since when.
#[derive(Default)]
struct Down {
    since: Option<std::time::Instant>,
    told: bool,
}

/// The `relay:` source's state across its subscriptions.
struct Tier {
    events: UnboundedSender<SourceEvent>,
    refused: UnboundedReceiver<Refused>,
    shutdown: CancellationToken,
    metrics: Arc<Metrics>,
    relays: Vec<RelayAddr>,
    credentials: Credentials,
    upstream: UpstreamConfig,
    /// The ledger to resume after (the last passed on whole, or what the pipeline holds).
    last: Option<(u32, [u8; 32])>,
    aside: SetAside,
    /// Rotation: the upstream tried first by the next subscription.
    first: usize,
    sessions_before: u64,
    /// `Abort` events sent: the epoch of the pipeline's refusals that concern what is being
    /// passed on now (see [`Refused::epoch`]).
    aborts: u64,
    /// Why the last upstream was set aside.
    set_aside_for: String,
}

impl Tier {
    /// The source's state, or `None` (the failure sent) when its settings cannot work.
    fn new(
        start: ExternalStart,
        certs: &std::path::Path,
        upstream: UpstreamConfig,
    ) -> Option<Tier> {
        let (relays, credentials) = match Tier::settings(&start.spec, certs, &upstream) {
            Ok(s) => s,
            Err(reason) => {
                tracing::error!(%reason, "relay source failed");
                let _ = start.events.send(SourceEvent::Failed(reason));
                return None;
            }
        };
        Some(Tier {
            aside: SetAside::new(relays.len()),
            relays,
            credentials,
            upstream,
            events: start.events,
            refused: start.refused,
            shutdown: start.shutdown,
            metrics: start.metrics,
            last: start.newest,
            first: 0,
            sessions_before: 0,
            aborts: 0,
            set_aside_for: String::new(),
        })
    }

    /// The upstreams' addresses and this relay's client certificate.
    fn settings(
        spec: &SourceSpec,
        certs: &std::path::Path,
        upstream: &UpstreamConfig,
    ) -> Result<(Vec<RelayAddr>, Credentials), String> {
        let SourceSpec::Relay { upstreams } = spec else {
            return Err(format!("{spec} is not a relay: source"));
        };
        let relays = upstreams
            .iter()
            .map(|a| a.parse::<RelayAddr>().map_err(|e| e.to_string()))
            .collect::<Result<Vec<_>, _>>()?;
        let credentials = Credentials::from_cert_dir(certs, &upstream.name)
            .map_err(|e| format!("upstream certificate {}: {e}", upstream.name))?;
        Ok((relays, credentials))
    }

    fn fail(&self, reason: String) {
        tracing::error!(%reason, "relay source failed");
        let _ = self.events.send(SourceEvent::Failed(reason));
    }

    /// The configured upstreams, comma-separated.
    fn names(&self) -> String {
        self.relays
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The upstreams of the next subscription, in order of preference; while every one is set
    /// aside it waits for the first to come back. `None` at shutdown.
    async fn next_order(&mut self) -> Option<Vec<usize>> {
        loop {
            let until = match self.aside.order(self.first, std::time::Instant::now()) {
                Ok(order) => return Some(order),
                Err(until) => until,
            };
            let reason = format!(
                "every upstream relay ({}) is set aside for sending ledgers that failed a check \
                 (the last: {})",
                self.names(),
                self.set_aside_for
            );
            tracing::warn!(%reason, wait_s = until.saturating_duration_since(std::time::Instant::now()).as_secs(), "relay source waits");
            self.events.send(SourceEvent::Down { reason }).ok()?;
            tokio::select! {
                _ = self.shutdown.cancelled() => return None,
                _ = tokio::time::sleep_until(until.into()) => {}
            }
        }
    }

    /// The subscription to upstreams `order`, from where the tier is.
    fn config(&self, order: &[usize]) -> SubscribeConfig {
        let relays = order.iter().map(|&i| self.relays[i].clone()).collect();
        let mut config = SubscribeConfig::new(relays, self.credentials.clone());
        config.lanes = self.upstream.lanes;
        // The only content check these ledgers get (see the module docs).
        config.content_check = true;
        (config.start, config.anchor) = start_of(self.last, self.upstream.anchor);
        config
    }

    /// Runs one subscription to upstreams `order` until it ends.
    async fn subscribe(&mut self, order: &[usize]) -> Ended {
        let config = self.config(order);
        let names: Vec<String> = config.relays.iter().map(ToString::to_string).collect();
        tracing::info!(upstreams = %names.join(","), start = ?config.start, "subscribing to the upstream relays");
        let connected = if self.upstream.cut_through {
            connect_cut_through(config).map(|(s, p)| (s, Some(p)))
        } else {
            connect(config).map(|s| (s, None))
        };
        let (mut sub, mut prefixes) = match connected {
            Ok(s) => s,
            Err(e) => return Ended::Fatal(format!("upstream subscription: {e}")),
        };
        let mut forward = Forward::default();
        let ended = self
            .pass_on(&mut sub, &mut prefixes, &mut forward, order)
            .await;
        // Whatever was in progress is taken back, and the Abort starts a new epoch: a refusal
        // of what this subscription passed on no longer concerns the next one.
        let mut out = Vec::new();
        forward.end("the upstream subscription ended", &mut out);
        forward.count(&self.metrics);
        self.sessions_before += sub.status().sessions;
        sub.close().await;
        match self.send(&mut out) {
            Ok(()) => ended,
            Err(()) => Ended::Stop,
        }
    }

    /// Passes on what the subscription yields until it ends.
    async fn pass_on(
        &mut self,
        sub: &mut Subscription,
        prefixes: &mut Option<tokio::sync::mpsc::Receiver<Prefix>>,
        forward: &mut Forward,
        order: &[usize],
    ) -> Ended {
        let mut out = Vec::new();
        let mut tick = tokio::time::interval(TICK);
        let mut down = Down::default();
        loop {
            tokio::select! {
                _ = self.shutdown.cancelled() => return Ended::Stop,
                _ = tick.tick() => {
                    if let Some(ended) = self.tick(sub, &mut down, order) {
                        return ended;
                    }
                }
                item = sub.next() => match item {
                    Some(Ok(ledger)) => {
                        self.last = Some((ledger.seq, ledger.header_hash));
                        forward.ledger(&ledger, &mut out);
                    }
                    Some(Err(e)) => return Ended::Failed(Failure::of(&e)),
                    None => return Ended::Failed(Failure::plain("the upstream subscription ended")),
                },
                Some(p) = recv_prefix(prefixes) => {
                    let next = self.last.map_or(0, |(seq, _)| seq.wrapping_add(1));
                    forward.prefix(next, p, sub.status().relay, &mut out);
                }
                Some(r) = self.refused.recv() => {
                    if r.epoch == self.aborts {
                        return Ended::Failed(Failure {
                            error: format!("this relay refused what the upstream sent: {}", r.reason),
                            culprit: forward.from,
                            resume_after: Some(r.resume_after),
                            at_once: false,
                        });
                    }
                }
            }
            forward.count(&self.metrics);
            if self.send(&mut out).is_err() {
                return Ended::Stop;
            }
        }
    }

    /// The upstream's state into the metrics; tells the pipeline when no upstream session has
    /// been up for [`DOWN_AFTER`], and then ends the subscription if an upstream it left out
    /// has come back from being set aside (the next one includes it).
    fn tick(&mut self, sub: &Subscription, down: &mut Down, order: &[usize]) -> Option<Ended> {
        let status = sub.status();
        report(&self.metrics, &status, self.sessions_before);
        if status.relay.is_some() {
            *down = Down::default();
            return None;
        }
        let since = *down.since.get_or_insert_with(std::time::Instant::now);
        if since.elapsed() < DOWN_AFTER {
            return None;
        }
        if !down.told {
            down.told = true;
            let cause = status.last_error.unwrap_or_else(|| "no answer yet".into());
            let reason = format!("upstream relays {} unreachable: {cause}", self.names());
            tracing::warn!(%reason, "relay source down");
            if self.events.send(SourceEvent::Down { reason }).is_err() {
                return Some(Ended::Stop);
            }
        }
        let now = std::time::Instant::now();
        let back =
            (0..self.relays.len()).any(|i| !order.contains(&i) && !self.aside.is_aside(i, now));
        back.then(|| {
            Ended::Failed(Failure {
                at_once: true,
                ..Failure::plain("upstreams set aside before are back")
            })
        })
    }

    /// Sends `out`'s events in order, emptying it, counting the `Abort`s; `Err` once the
    /// pipeline is gone.
    fn send(&mut self, out: &mut Vec<SourceEvent>) -> Result<(), ()> {
        for e in out.drain(..) {
            if matches!(e, SourceEvent::Abort { .. }) {
                self.aborts += 1;
            }
            self.events.send(e).map_err(|_| ())?;
        }
        Ok(())
    }

    /// After a subscription failed: its culprit set aside, the pipeline told, and the wait
    /// before the next one. `false` at shutdown or once the pipeline is gone.
    async fn after(&mut self, f: Failure) -> bool {
        Metrics::set(&self.metrics.upstream_connected, 0);
        if let Some(resume_after) = f.resume_after {
            self.last = resume_after;
        }
        let set_aside = match f.culprit {
            Some(addr) => self.set_aside(addr, &f.error).await,
            None => false,
        };
        self.first = self.first.wrapping_add(1);
        if f.at_once {
            // Not a failure: the subscription is started again to include upstreams back
            // from being set aside (the source was reported down already).
            tracing::info!(why = %f.error, "starting the upstream subscription again");
            return true;
        }
        let delay = if set_aside {
            Duration::ZERO
        } else {
            RETRY_AFTER
        };
        tracing::error!(error = %f.error, retry_in_ms = delay.as_millis() as u64, "upstream subscription failed; starting it again from the next upstream");
        let reason = format!("upstream subscription failed: {}", f.error);
        if self.events.send(SourceEvent::Down { reason }).is_err() {
            return false;
        }
        tokio::select! {
            _ = self.shutdown.cancelled() => false,
            _ = tokio::time::sleep(delay) => true,
        }
    }

    /// Sets aside the configured upstream at `addr` (bytes it sent failed a check). Whether
    /// one was.
    async fn set_aside(&mut self, addr: SocketAddr, why: &str) -> bool {
        let Some(i) = index_of(&self.relays, addr).await else {
            return false;
        };
        let period = self.aside.mark(i, std::time::Instant::now());
        self.set_aside_for = format!("{}: {why}", self.relays[i]);
        Metrics::add(&self.metrics.upstream_set_aside_total, 1);
        tracing::warn!(upstream = %self.relays[i], for_s = period.as_secs(), why, "upstream set aside: what it sent failed a check");
        true
    }
}

/// The configured upstream whose address is `addr` (a name resolved again).
async fn index_of(relays: &[RelayAddr], addr: SocketAddr) -> Option<usize> {
    for (i, r) in relays.iter().enumerate() {
        let resolved = match r.socket_addr() {
            Some(a) => Some(a),
            None => r.resolve().await.ok(),
        };
        if resolved == Some(addr) {
            return Some(i);
        }
    }
    None
}

/// Where a subscription starts: after `last` (the ring's newest or the last ledger passed
/// on), anchored to it; with nothing yet, at the anchor `--upstream-anchor` names (its
/// ledger must have its hash); without one, at the upstream's tip, trusting its first ledger.
fn start_of(
    last: Option<(u32, [u8; 32])>,
    anchor: Option<(u32, [u8; 32])>,
) -> (Start, Option<Anchor>) {
    match (last, anchor) {
        (Some((seq, hash)), _) => (
            Start::Seq(seq.saturating_add(1)),
            Some(Anchor { seq, hash }),
        ),
        (None, Some((seq, hash))) => (Start::Seq(seq), Some(Anchor { seq, hash })),
        (None, None) => (Start::Tip, None),
    }
}

/// How long an upstream is left out the first time bytes it sent fail a check; each time
/// again doubles it, up to [`SET_ASIDE_MAX`].
pub const SET_ASIDE: Duration = Duration::from_secs(30);
/// The longest an upstream is left out.
pub const SET_ASIDE_MAX: Duration = Duration::from_secs(600);

/// Upstreams left out of the subscription for a while because bytes they sent failed a
/// check, by index in the configured order.
#[derive(Debug)]
struct SetAside {
    until: Vec<Option<std::time::Instant>>,
    times: Vec<u32>,
}

impl SetAside {
    fn new(upstreams: usize) -> SetAside {
        SetAside {
            until: vec![None; upstreams],
            times: vec![0; upstreams],
        }
    }

    /// Sets upstream `i` aside from `now`; returns for how long.
    fn mark(&mut self, i: usize, now: std::time::Instant) -> Duration {
        self.times[i] = self.times[i].saturating_add(1);
        let doublings = self.times[i].saturating_sub(1).min(8);
        let period = SET_ASIDE.saturating_mul(1 << doublings).min(SET_ASIDE_MAX);
        self.until[i] = Some(now + period);
        period
    }

    fn is_aside(&self, i: usize, now: std::time::Instant) -> bool {
        self.until[i].is_some_and(|u| u > now)
    }

    /// The upstreams not set aside at `now`, in turn from `first`; or, when every one is,
    /// when the first comes back.
    fn order(
        &self,
        first: usize,
        now: std::time::Instant,
    ) -> Result<Vec<usize>, std::time::Instant> {
        let n = self.until.len();
        let order: Vec<usize> = (0..n)
            .map(|k| (first + k) % n)
            .filter(|&i| !self.is_aside(i, now))
            .collect();
        if !order.is_empty() {
            return Ok(order);
        }
        Err(self.until.iter().flatten().min().copied().unwrap_or(now))
    }
}

/// The next prefix, or never without a cut-through subscription.
async fn recv_prefix(rx: &mut Option<tokio::sync::mpsc::Receiver<Prefix>>) -> Option<Prefix> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// What the source has passed on to the pipeline: verified ledgers whole, and with
/// cut-through the ledger in progress piece by piece, before it is verified.
#[derive(Debug, Default)]
struct Forward {
    /// The ledger passed on piece by piece and not ended yet.
    current: Option<InProgress>,
    /// The upstream the last ledger passed on (whole, or its first piece) came from.
    from: Option<SocketAddr>,
    /// Bytes passed on as prefixes, and ledgers taken back, not yet counted in the metrics.
    early_bytes: u64,
    taken_back: u64,
}

/// A ledger passed on piece by piece: its sequence, the pieces passed on and their length.
#[derive(Debug)]
struct InProgress {
    seq: u32,
    pieces: Vec<bytes::Bytes>,
    passed: u64,
}

impl Forward {
    /// Adds what happened since the last call to the metrics.
    fn count(&mut self, metrics: &Metrics) {
        Metrics::add(
            &metrics.upstream_cut_through_bytes_total,
            std::mem::take(&mut self.early_bytes),
        );
        Metrics::add(
            &metrics.upstream_taken_back_total,
            std::mem::take(&mut self.taken_back),
        );
    }

    /// A prefix of ledger `p.seq`, when `next` is the ledger after the last verified one (0
    /// before any): passed on if it continues the ledger in progress or starts ledger `next`.
    /// A new session starting the ledger in progress again (offset 0) takes back what was
    /// passed on and starts over; any other prefix (a later ledger, a jump in the offsets
    /// where prefixes were dropped) is left for the verified ledger to complete.
    /// `relay`: the upstream of the session the prefix came from.
    fn prefix(
        &mut self,
        next: u32,
        p: Prefix,
        relay: Option<SocketAddr>,
        out: &mut Vec<SourceEvent>,
    ) {
        if let Some(c) = self
            .current
            .as_mut()
            .filter(|c| c.seq == p.seq && c.passed == p.offset)
        {
            self.early_bytes += p.data.len() as u64;
            out.push(SourceEvent::Data(p.data.clone()));
            c.passed += p.data.len() as u64;
            c.pieces.push(p.data);
            return;
        }
        if p.offset != 0 {
            return;
        }
        let restart = self.current.as_ref().is_some_and(|c| c.seq == p.seq);
        if restart {
            self.take_back("the upstream session started the ledger again", out);
        }
        if self.current.is_none() && (p.seq == next || next == 0) {
            self.from = relay;
            out.push(SourceEvent::Begin {
                len: 0,
                at_ns: ledger_relay::source::now_ns(),
            });
            self.early_bytes += p.data.len() as u64;
            out.push(SourceEvent::Data(p.data.clone()));
            self.current = Some(InProgress {
                seq: p.seq,
                passed: p.data.len() as u64,
                pieces: vec![p.data],
            });
        }
    }

    /// A verified ledger: the end of the one in progress if that is its beginning (the bytes
    /// passed on are compared with it), else, after taking back whatever was in progress, the
    /// whole ledger. The upstream's stamps go with it either way.
    fn ledger(&mut self, ledger: &Ledger, out: &mut Vec<SourceEvent>) {
        self.from = Some(ledger.relay);
        let len = ledger.data.len() as u64;
        let passed = self.current.as_ref().map_or(0, |c| c.passed);
        let matches = self.current.as_ref().is_some_and(|c| {
            c.seq == ledger.seq && c.passed <= len && {
                let mut at = 0usize;
                c.pieces.iter().all(|b| {
                    let same = ledger.data[at..at + b.len()] == b[..];
                    at += b.len();
                    same
                })
            }
        });
        let from = if matches {
            self.current = None;
            // The root's stamp, which the `Begin` could not carry.
            out.push(SourceEvent::FirstByte {
                at_ns: ledger.relay_first_byte_ns,
            });
            passed as usize
        } else {
            self.take_back(
                "the bytes passed on are not the verified ledger's beginning",
                out,
            );
            out.push(SourceEvent::Begin {
                len: u32::try_from(len).unwrap_or(0),
                at_ns: ledger.relay_first_byte_ns,
            });
            0
        };
        let mut offset = from;
        while offset < ledger.data.len() {
            let end = (offset + PIECE).min(ledger.data.len());
            out.push(SourceEvent::Data(ledger.data.slice(offset..end)));
            offset = end;
        }
        out.push(SourceEvent::End {
            at_ns: ledger.relay_last_byte_ns,
        });
    }

    /// The end of what a subscription passed on: the ledger in progress taken back, and in
    /// any case one `Abort`, which tells the pipeline the source starts again.
    fn end(&mut self, why: &str, out: &mut Vec<SourceEvent>) {
        if self.current.is_some() {
            self.take_back(why, out);
        } else {
            out.push(SourceEvent::Abort {
                reason: why.to_owned(),
            });
        }
    }

    /// Takes back the ledger in progress, if any: the pipeline discards it.
    fn take_back(&mut self, why: &str, out: &mut Vec<SourceEvent>) {
        if let Some(InProgress { seq, .. }) = self.current.take() {
            self.taken_back += 1;
            tracing::warn!(seq, why, "ledger passed on before verification taken back");
            out.push(SourceEvent::Abort {
                reason: format!("ledger {seq} taken back: {why}"),
            });
        }
    }
}

/// The upstream's state in the metrics: its newest ledger, the lag behind it, whether a
/// session is up, sessions so far.
fn report(metrics: &Metrics, status: &ledger_relay_subscriber::Status, sessions_before: u64) {
    let ours = metrics.source_newest.load(Ordering::Relaxed);
    let newest = u64::from(status.newest);
    if newest > 0 {
        Metrics::set(&metrics.upstream_newest, newest);
        Metrics::set(&metrics.upstream_lag_ledgers, newest.saturating_sub(ours));
    }
    Metrics::set(
        &metrics.upstream_connected,
        u64::from(status.relay.is_some()),
    );
    Metrics::set(
        &metrics.upstream_sessions_total,
        sessions_before + status.sessions,
    );
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn ledger(seq: u32, data: &Bytes) -> Ledger {
        Ledger {
            seq,
            data: data.clone(),
            raw_len: data.len() as u64,
            header_hash: [seq as u8; 32],
            previous_hash: [0; 32],
            relay_first_byte_ns: 111,
            relay_last_byte_ns: 222,
            received_ns: 0,
            wire_bytes: 0,
            relay: "127.0.0.1:1".parse().unwrap(),
        }
    }

    fn prefix(seq: u32, data: &Bytes, from: usize, to: usize) -> Prefix {
        Prefix {
            seq,
            offset: from as u64,
            data: data.slice(from..to),
        }
    }

    /// The events as short names, and the bytes they pass on.
    fn summary(out: &mut Vec<SourceEvent>) -> (Vec<&'static str>, Vec<u8>) {
        let mut names = Vec::new();
        let mut bytes = Vec::new();
        for e in out.drain(..) {
            names.push(match e {
                SourceEvent::Begin { .. } => "begin",
                SourceEvent::Data(d) => {
                    bytes.extend_from_slice(&d);
                    "data"
                }
                SourceEvent::FirstByte { at_ns } => {
                    assert_eq!(at_ns, 111, "the upstream's stamp");
                    "first"
                }
                SourceEvent::End { at_ns } => {
                    assert_eq!(at_ns, 222, "the upstream's stamp");
                    "end"
                }
                SourceEvent::Abort { .. } => "abort",
                _ => "other",
            });
        }
        (names, bytes)
    }

    fn data(n: usize, seed: u8) -> Bytes {
        Bytes::from(
            (0..n)
                .map(|i| (i as u8).wrapping_mul(seed))
                .collect::<Vec<u8>>(),
        )
    }

    /// Prefixes go on as they come and the verified ledger adds the rest and the end: the
    /// pipeline is given exactly the ledger's bytes, once.
    #[test]
    fn prefixes_then_the_verified_ledger_pass_the_ledger_on_once() {
        let mut f = Forward::default();
        let mut out = Vec::new();
        let d = data(1000, 7);
        f.prefix(5, prefix(5, &d, 0, 300), None, &mut out);
        f.prefix(5, prefix(5, &d, 300, 600), None, &mut out);
        let (names, bytes) = summary(&mut out);
        assert_eq!(names, ["begin", "data", "data"]);
        assert_eq!(bytes, d[..600]);
        f.ledger(&ledger(5, &d), &mut out);
        let (names, bytes) = summary(&mut out);
        assert_eq!(names, ["first", "data", "end"]);
        assert_eq!(bytes, d[600..]);
        // Without prefixes: the whole ledger.
        let d6 = data(500, 3);
        f.ledger(&ledger(6, &d6), &mut out);
        let (names, bytes) = summary(&mut out);
        assert_eq!(names, ["begin", "data", "end"]);
        assert_eq!(bytes, d6[..]);
    }

    /// A prefix of a ledger that is not next, or after a jump (dropped prefixes), is not
    /// passed on; a new session starting the ledger again takes back what went on.
    #[test]
    fn out_of_turn_prefixes_are_left_and_a_restart_takes_back() {
        let mut f = Forward::default();
        let mut out = Vec::new();
        let d = data(1000, 9);
        f.prefix(5, prefix(6, &d, 0, 100), None, &mut out);
        assert!(out.is_empty(), "ledger 6 is not next");
        f.prefix(5, prefix(5, &d, 0, 100), None, &mut out);
        f.prefix(5, prefix(5, &d, 200, 300), None, &mut out);
        let (names, _) = summary(&mut out);
        assert_eq!(names, ["begin", "data"], "the jump is not passed on");
        // Another session starts ledger 5 again.
        f.prefix(5, prefix(5, &d, 0, 400), None, &mut out);
        let (names, bytes) = summary(&mut out);
        assert_eq!(names, ["abort", "begin", "data"]);
        assert_eq!(bytes, d[..400]);
        f.ledger(&ledger(5, &d), &mut out);
        let (names, bytes) = summary(&mut out);
        assert_eq!(names, ["first", "data", "end"]);
        assert_eq!(bytes, d[400..]);
    }

    /// Bytes passed on that are not the verified ledger's (a lying upstream whose session then
    /// failed, and prefixes of the next session dropped) are taken back and the verified
    /// ledger goes on whole; a subscription that fails takes back the ledger in progress.
    #[test]
    fn bytes_that_are_not_the_verified_ledger_s_are_taken_back() {
        let mut f = Forward::default();
        let mut out = Vec::new();
        let d = data(1000, 11);
        let mut forged = d.to_vec();
        forged[10] ^= 1;
        let forged = Bytes::from(forged);
        f.prefix(5, prefix(5, &forged, 0, 300), None, &mut out);
        summary(&mut out);
        f.ledger(&ledger(5, &d), &mut out);
        let (names, bytes) = summary(&mut out);
        assert_eq!(names, ["abort", "begin", "data", "end"]);
        assert_eq!(bytes, d[..]);
        f.prefix(6, prefix(6, &d, 0, 300), None, &mut out);
        summary(&mut out);
        f.take_back("failed", &mut out);
        assert_eq!(summary(&mut out).0, ["abort"]);
        f.take_back("failed", &mut out);
        assert!(out.is_empty(), "nothing in progress");
    }

    /// An upstream is left out for its period, which doubles each time up to the maximum;
    /// the others keep their turn; with every one left out, the wait is for the first back.
    #[test]
    fn an_upstream_set_aside_is_left_out_for_a_doubling_period() {
        let t0 = std::time::Instant::now();
        let mut aside = SetAside::new(3);
        assert_eq!(aside.order(1, t0), Ok(vec![1, 2, 0]));
        assert_eq!(aside.mark(0, t0), SET_ASIDE);
        assert_eq!(aside.order(0, t0), Ok(vec![1, 2]));
        assert_eq!(aside.order(2, t0), Ok(vec![2, 1]));
        let back = t0 + SET_ASIDE;
        assert_eq!(
            aside.order(0, back),
            Ok(vec![0, 1, 2]),
            "back after its period"
        );
        assert_eq!(aside.mark(0, back), SET_ASIDE * 2, "again: twice as long");
        for _ in 0..10 {
            aside.mark(0, back);
        }
        assert_eq!(aside.mark(0, back), SET_ASIDE_MAX);
        aside.mark(1, t0);
        aside.mark(2, t0 + Duration::from_secs(1));
        let before = back - Duration::from_secs(1);
        assert_eq!(aside.order(0, before), Err(back), "1 comes back first");
        assert_eq!(aside.order(0, back), Ok(vec![1]));
        assert!(aside.is_aside(0, back) && aside.is_aside(2, back) && !aside.is_aside(1, back));
    }

    /// After the ring's newest (or the last ledger passed on), anchored to it; with nothing,
    /// at the configured anchor, which the first ledger must match; else the tip.
    #[test]
    fn a_subscription_starts_after_what_is_held_else_at_the_anchor() {
        let held = Some((9, [9; 32]));
        let anchor = Some((5, [5; 32]));
        let (start, a) = start_of(held, anchor);
        assert_eq!(
            (start, a),
            (
                Start::Seq(10),
                Some(Anchor {
                    seq: 9,
                    hash: [9; 32]
                })
            )
        );
        let (start, a) = start_of(None, anchor);
        assert_eq!(
            (start, a),
            (
                Start::Seq(5),
                Some(Anchor {
                    seq: 5,
                    hash: [5; 32]
                })
            )
        );
        assert_eq!(start_of(None, None), (Start::Tip, None));
    }

    /// Every subscription ends with one `Abort` (the pipeline's epoch moves on), taking back
    /// the ledger in progress if there is one; the upstream of the last ledger is known.
    #[test]
    fn a_subscription_s_end_is_one_abort() {
        let mut f = Forward::default();
        let mut out = Vec::new();
        f.end("ended", &mut out);
        assert_eq!(summary(&mut out).0, ["abort"]);
        let d = data(1000, 5);
        let relay: SocketAddr = "127.0.0.1:7".parse().unwrap();
        f.prefix(5, prefix(5, &d, 0, 300), Some(relay), &mut out);
        assert_eq!(f.from, Some(relay));
        summary(&mut out);
        f.end("ended", &mut out);
        assert_eq!(
            summary(&mut out).0,
            ["abort"],
            "one, taking the ledger back"
        );
        f.ledger(&ledger(5, &d), &mut out);
        assert_eq!(f.from, Some("127.0.0.1:1".parse().unwrap()));
    }
}
