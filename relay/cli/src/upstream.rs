//! The `relay:ADDR[,ADDR...]` source: this relay is a tier of a fan-out tree and subscribes to
//! upstream relays with the subscriber library (which the relay library does not depend on, so
//! the source lives here and is handed to it as an [`ExternalSource`]).
//!
//! Every ledger is verified as any subscriber verifies it (checksums, header, hash chain from
//! the ring's newest ledger, transaction set and results) and then fed to the relay's pipeline
//! as a source's events, whole: the pipeline chunks it again, keeps it in this relay's ring and
//! serves it live and from the ring. The first and last byte stamps are the upstream's (the
//! root's), so a subscriber of this relay measures its delivery from the root's source.
//!
//! It resumes after the ring's newest ledger (anchored to its hash) at every start, fails over
//! between upstreams as a subscriber does (round robin, from the last ledger read + 1), and
//! reports the upstream's newest ledger and its lag in the metrics. While no upstream can be
//! reached it tells the pipeline the source is down, which `/healthz` shows with the reason. A
//! terminal error of the subscription (an upstream refusing our certificate, data that does not
//! verify, a start below every upstream's retention) is logged and the subscription is started
//! again after [`RETRY_AFTER`], from the next upstream.
//!
//! Store-and-forward per tier by default: a ledger goes on only once it is complete and
//! verified here. With `--cut-through` each ledger's bytes go on as they arrive, in order
//! (the subscriber library's prefixes, see `connect_cut_through`), and the pipeline streams
//! them to this relay's subscribers at once; the ledger's end follows when the verified ledger
//! arrives and the bytes passed on are checked to be its own. A ledger that fails verification
//! (or whose session ends first) is taken back with `Abort`: the pipeline discards it, sessions
//! given some of its chunks end with `SourceReset` and resume, and the ring, which keeps only
//! complete ledgers, never sees it. See [`Forward`].

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::StreamExt;
use ledger_relay::config::UpstreamConfig;
use ledger_relay::metrics::Metrics;
use ledger_relay::source::{ExternalSource, ExternalStart, Refetch, SourceEvent, SourceSpec};
use ledger_relay_subscriber::frame::Start;
use ledger_relay_subscriber::{
    connect, connect_cut_through, Anchor, Credentials, Ledger, RelayAddr, SubscribeConfig,
};
use ledger_relay_wire::Prefix;

/// How long after a terminal error of the upstream subscription it is started again.
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
    let events = &start.events;
    let fail = |reason: String| {
        tracing::error!(%reason, "relay source failed");
        let _ = events.send(SourceEvent::Failed(reason));
    };
    let SourceSpec::Relay { upstreams } = &start.spec else {
        return fail(format!("{} is not a relay: source", start.spec));
    };
    let mut relays = Vec::new();
    for a in upstreams {
        match a.parse::<RelayAddr>() {
            Ok(r) => relays.push(r),
            Err(e) => return fail(e.to_string()),
        }
    }
    let credentials = match Credentials::from_cert_dir(&certs, &upstream.name) {
        Ok(c) => c,
        Err(e) => return fail(format!("upstream certificate {}: {e}", upstream.name)),
    };
    let metrics = &start.metrics;
    let mut last = start.newest;
    let mut first = 0usize;
    let mut sessions_before = 0u64;
    loop {
        let mut order = relays.clone();
        order.rotate_left(first % relays.len());
        let mut config = SubscribeConfig::new(order, credentials.clone());
        config.lanes = upstream.lanes;
        match last {
            Some((seq, hash)) => {
                config.start = Start::Seq(seq.saturating_add(1));
                config.anchor = Some(Anchor { seq, hash });
            }
            None => config.start = Start::Tip,
        }
        tracing::info!(upstreams = %upstreams.join(","), start = ?config.start, "subscribing to the upstream relays");
        let connected = if upstream.cut_through {
            connect_cut_through(config).map(|(s, p)| (s, Some(p)))
        } else {
            connect(config).map(|s| (s, None))
        };
        let (mut sub, mut prefixes) = match connected {
            Ok(s) => s,
            Err(e) => return fail(format!("upstream subscription: {e}")),
        };
        let mut forward = Forward::default();
        let mut out = Vec::new();
        let mut tick = tokio::time::interval(TICK);
        let mut down_since: Option<tokio::time::Instant> = None;
        let mut down_told = false;
        let error = loop {
            tokio::select! {
                _ = start.shutdown.cancelled() => {
                    sub.close().await;
                    return;
                }
                _ = tick.tick() => {
                    let status = sub.status();
                    report(metrics, &status, sessions_before);
                    if status.relay.is_some() {
                        down_since = None;
                        down_told = false;
                    } else {
                        let since = *down_since.get_or_insert_with(tokio::time::Instant::now);
                        if !down_told && since.elapsed() >= DOWN_AFTER {
                            down_told = true;
                            let cause = status.last_error.unwrap_or_else(|| "no answer yet".into());
                            let reason = format!("upstream relays {} unreachable: {cause}", upstreams.join(","));
                            tracing::warn!(%reason, "relay source down");
                            if events.send(SourceEvent::Down { reason }).is_err() {
                                return;
                            }
                        }
                    }
                }
                item = sub.next() => match item {
                    Some(Ok(ledger)) => {
                        last = Some((ledger.seq, ledger.header_hash));
                        forward.ledger(&ledger, &mut out);
                        forward.count(metrics);
                        if send_all(events, &mut out).is_err() {
                            return;
                        }
                    }
                    Some(Err(e)) => break e.to_string(),
                    None => break "the upstream subscription ended".to_owned(),
                },
                Some(p) = recv_prefix(&mut prefixes) => {
                    let next = last.map_or(0, |(seq, _)| seq.wrapping_add(1));
                    forward.prefix(next, p, &mut out);
                    forward.count(metrics);
                    if send_all(events, &mut out).is_err() {
                        return;
                    }
                }
            }
        };
        forward.take_back("the upstream subscription failed", &mut out);
        forward.count(metrics);
        if send_all(events, &mut out).is_err() {
            return;
        }
        sessions_before += sub.status().sessions;
        Metrics::set(&metrics.upstream_connected, 0);
        tracing::error!(error = %error, retry_in_s = RETRY_AFTER.as_secs(), "upstream subscription failed; starting it again from the next upstream");
        if events
            .send(SourceEvent::Down {
                reason: format!("upstream subscription failed: {error}"),
            })
            .is_err()
        {
            return;
        }
        first = first.wrapping_add(1);
        tokio::select! {
            _ = start.shutdown.cancelled() => return,
            _ = tokio::time::sleep(RETRY_AFTER) => {}
        }
    }
}

/// The next prefix, or never without a cut-through subscription.
async fn recv_prefix(rx: &mut Option<tokio::sync::mpsc::Receiver<Prefix>>) -> Option<Prefix> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// Sends `out`'s events in order, emptying it; `Err` once the pipeline is gone.
fn send_all(
    events: &tokio::sync::mpsc::UnboundedSender<SourceEvent>,
    out: &mut Vec<SourceEvent>,
) -> Result<(), ()> {
    for e in out.drain(..) {
        events.send(e).map_err(|_| ())?;
    }
    Ok(())
}

/// What the source has passed on to the pipeline: verified ledgers whole, and with
/// cut-through the ledger in progress piece by piece, before it is verified.
#[derive(Debug, Default)]
struct Forward {
    /// The ledger passed on piece by piece and not ended yet.
    current: Option<InProgress>,
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
    fn prefix(&mut self, next: u32, p: Prefix, out: &mut Vec<SourceEvent>) {
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
        f.prefix(5, prefix(5, &d, 0, 300), &mut out);
        f.prefix(5, prefix(5, &d, 300, 600), &mut out);
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
        f.prefix(5, prefix(6, &d, 0, 100), &mut out);
        assert!(out.is_empty(), "ledger 6 is not next");
        f.prefix(5, prefix(5, &d, 0, 100), &mut out);
        f.prefix(5, prefix(5, &d, 200, 300), &mut out);
        let (names, _) = summary(&mut out);
        assert_eq!(names, ["begin", "data"], "the jump is not passed on");
        // Another session starts ledger 5 again.
        f.prefix(5, prefix(5, &d, 0, 400), &mut out);
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
        f.prefix(5, prefix(5, &forged, 0, 300), &mut out);
        summary(&mut out);
        f.ledger(&ledger(5, &d), &mut out);
        let (names, bytes) = summary(&mut out);
        assert_eq!(names, ["abort", "begin", "data", "end"]);
        assert_eq!(bytes, d[..]);
        f.prefix(6, prefix(6, &d, 0, 300), &mut out);
        summary(&mut out);
        f.take_back("failed", &mut out);
        assert_eq!(summary(&mut out).0, ["abort"]);
        f.take_back("failed", &mut out);
        assert!(out.is_empty(), "nothing in progress");
    }
}
