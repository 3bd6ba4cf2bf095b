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
//! Store-and-forward per tier: a ledger goes on only once it is complete and verified here.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::StreamExt;
use ledger_relay::config::UpstreamConfig;
use ledger_relay::metrics::Metrics;
use ledger_relay::source::{ExternalSource, ExternalStart, Refetch, SourceEvent, SourceSpec};
use ledger_relay_subscriber::frame::Start;
use ledger_relay_subscriber::{connect, Anchor, Credentials, Ledger, RelayAddr, SubscribeConfig};

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
        let mut sub = match connect(config) {
            Ok(s) => s,
            Err(e) => return fail(format!("upstream subscription: {e}")),
        };
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
                        if emit(events, &ledger).is_err() {
                            return;
                        }
                    }
                    Some(Err(e)) => break e.to_string(),
                    None => break "the upstream subscription ended".to_owned(),
                },
            }
        };
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

/// A verified ledger as a source's events: `Begin`, its bytes in pieces, `End`, with the
/// upstream's stamps.
fn emit(
    events: &tokio::sync::mpsc::UnboundedSender<SourceEvent>,
    ledger: &Ledger,
) -> Result<(), ()> {
    let len = u32::try_from(ledger.data.len()).map_err(|_| ())?;
    let send = |e| events.send(e).map_err(|_| ());
    send(SourceEvent::Begin {
        len,
        at_ns: ledger.relay_first_byte_ns,
    })?;
    let mut offset = 0;
    while offset < ledger.data.len() {
        let end = (offset + PIECE).min(ledger.data.len());
        send(SourceEvent::Data(ledger.data.slice(offset..end)))?;
        offset = end;
    }
    send(SourceEvent::End {
        at_ns: ledger.relay_last_byte_ns,
    })
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
