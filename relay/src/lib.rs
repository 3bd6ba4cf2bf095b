//! The Ledger Relay server.
//!
//! Reads the `LedgerCloseMeta` stream stellar-core writes (its metadata pipe, a dump file, a FIFO,
//! a synthetic generator or a SEP-54 data lake), cuts each ledger into chunks as it arrives,
//! compresses each chunk once, keeps the last N ledgers in a sled retention ring, and streams
//! every ledger to every subscriber over several QUIC lanes with mutual TLS. It can write every
//! ledger to a data lake as Galexie does (`--export`), and holds a lake to serve history below
//! the ring from (`--backfill`, [`lake::backfill`]). It forwards the requests RPC boxes make
//! of stellar-core's HTTP ports to the core beside it, or to its upstream relays
//! ([`core_http`]).
//!
//! It does not decode ledgers beyond their header, and it does not speak any protocol but its
//! own (`docs/protocol.md`); the protocol logic itself lives in `ledger-relay-wire`.
//!
//! [`Relay::start`] runs everything from a [`config::RelayConfig`] until a shutdown token is
//! cancelled; the `ledger-relay` binary is a thin wrapper around it.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod admission;
mod auth;
mod certinfo;
mod closing;
pub mod config;
pub mod core_http;
mod defaults;
mod exposition;
mod health;
pub mod hub;
pub mod lake;
pub mod metrics;
mod pipeline;
mod reload;
pub mod ring;
mod scrub;
mod server;
mod session;
pub mod source;

// The interior (sessions, the accept loop, admission, authorization, reloading, the pipeline's
// threads, health, scrub) is private: users start a [`Relay`] from a
// [`config::RelayConfig`] and read its metrics, ring, hub and lakes. What the bench and the
// binary's tests also build ledgers with:
pub use pipeline::{complete_ledger, PipelineConfig};
/// A limit a subscriber meets: the other certificates one session's lanes may join with.
pub use session::MAX_LANE_CERTIFICATES;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::auth::{Auth, AuthConfig};
use crate::config::RelayConfig;
use crate::health::Health;
use crate::hub::Hub;
use crate::metrics::Metrics;
use crate::pipeline::StartState;
use crate::ring::{Ring, RingConfig};
use crate::session::Shared;

/// A running relay.
#[derive(Debug)]
pub struct Relay {
    /// The UDP address the relay listens on (the real port when configured with port 0).
    pub addr: SocketAddr,
    /// The metrics address, if serving metrics.
    pub metrics_addr: Option<SocketAddr>,
    /// Live metrics.
    pub metrics: Arc<Metrics>,
    /// Live state.
    pub hub: Arc<Hub>,
    /// The retention ring.
    pub ring: Arc<Ring>,
    /// The backfill lake (`--backfill`), for sessions whose start is below the ring.
    pub backfill: Option<Arc<lake::backfill::Backfill>>,
    task: JoinHandle<()>,
}

/// A tier's `--upstream-anchor` against its ring: a ring that holds the anchor's ledger with
/// another hash holds another history than the one the operator trusts, and the relay does not
/// start on it. (An empty ring starts at the anchor; a ring that does not hold its ledger
/// resumes after its newest, as at every start.)
fn check_upstream_anchor(ring: &Ring, config: &RelayConfig) -> anyhow::Result<()> {
    let Some((seq, hash)) = config.upstream.as_ref().and_then(|u| u.anchor) else {
        return Ok(());
    };
    match ring.stored_hash(seq) {
        Ok(Some(held)) if held != hash => anyhow::bail!(
            "--upstream-anchor {seq}:{}: the ring in {} holds ledger {seq} with hash {}; \
             a ring of another history is not resumed (move it away, or correct the anchor)",
            ledger_relay_wire::Hex(&hash),
            config.data_dir.display(),
            ledger_relay_wire::Hex(&held)
        ),
        _ => Ok(()),
    }
}

impl Relay {
    /// Opens the ring, loads certificates, binds the endpoint and starts the source, the
    /// pipeline and the accept loop. Everything stops when `shutdown` is cancelled.
    pub async fn start(config: RelayConfig, shutdown: CancellationToken) -> anyhow::Result<Relay> {
        if matches!(config.source, source::SourceSpec::Relay { .. })
            && config.external_source.is_none()
        {
            anyhow::bail!(
                "--source {}: relay sources are run by the ledger-relay binary",
                config.source
            );
        }
        let metrics = Metrics::with_health(Health::new(config.stale_after));
        let ring = open_ring(&config)?;
        check_upstream_anchor(&ring, &config)?;
        pipeline::update_ring_metrics(&ring, &metrics);
        record_sizing(&config, &metrics);
        let forwarder = core_forwarder(&config, &metrics)?;
        let hub = Arc::new(Hub::new(config.live_capacity, hub::RECENT_LEDGERS));
        let auth = Arc::new(
            Auth::load(auth_config(&config), config.transport.clone())
                .context("loading certificates")?,
        );
        certinfo::record_certificate(&auth_config(&config).cert, &metrics);
        let endpoint = bind(&config, &auth)?;
        let addr = endpoint.local_addr()?;

        let metrics_addr = serve_metrics(config.metrics, &metrics, &shutdown)?;

        tokio::spawn(certinfo::watch_crl(
            auth_config(&config).crl,
            metrics.clone(),
            shutdown.clone(),
        ));
        let mut pipeline_config = config.pipeline.clone();
        let (exporter, backfill) = start_lakes(&config, &ring, &metrics, &shutdown)?;
        let exporter = exporter.map(|(tap, exporter)| {
            pipeline_config.export = Some(tap);
            exporter
        });
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let source_stop = shutdown.child_token();
        let (source_thread, on_refusal) = spawn_source(&config, &ring, &metrics, tx, &source_stop);
        let pipeline = pipeline::spawn(
            pipeline_config,
            rx,
            hub.clone(),
            Some(ring.clone()),
            StartState {
                newest: ring.newest(),
            },
            metrics.clone(),
            on_refusal,
        )?;
        let shared = Shared {
            hub: hub.clone(),
            ring: Some(ring.clone()),
            backfill: backfill.clone(),
            refetch: config.refetch.clone(),
            pipeline: config.pipeline.clone(),
            metrics: metrics.clone(),
            ring_reads: Default::default(),
        };
        tokio::spawn(scrub::run(
            shared.clone(),
            ring.clone(),
            config.scrub_rate,
            shutdown.clone(),
        ));
        info!(%addr, source = ?config.source, "relay listening");
        let server_cfg = config.server.clone();
        let ring2 = ring.clone();
        let task = tokio::spawn(async move {
            server::serve(endpoint, auth, shared, server_cfg, forwarder, shutdown).await;
            // The source stops with the shutdown token; the pipeline drains and the ring
            // writer flushes the ledgers it was given.
            let _ = tokio::task::spawn_blocking(move || {
                let _ = source_thread.join();
                pipeline.join();
                // The publisher's tap is gone: the exporter writes what is complete and ends.
                if let Some(exporter) = exporter {
                    exporter.join();
                }
                let _ = ring2.flush();
            })
            .await;
        });
        Ok(Relay {
            addr,
            metrics_addr,
            metrics,
            hub,
            ring,
            backfill,
            task,
        })
    }

    /// Waits until the relay has stopped (after its shutdown token was cancelled).
    pub async fn wait(self) {
        let _ = self.task.await;
    }
}

/// Opens the retention ring in `DATA_DIR/ring`.
fn open_ring(config: &RelayConfig) -> anyhow::Result<Arc<Ring>> {
    let ring = Ring::open(&RingConfig {
        dir: config.data_dir.join("ring"),
        max_ledgers: config.retention,
        max_bytes: config.retention_bytes,
        network: config.network.clone(),
    })
    .with_context(|| format!("opening the ring in {}", config.data_dir.display()))?;
    Ok(Arc::new(ring))
}

/// Binds the UDP socket of `--listen` and makes it a QUIC endpoint with the relay's TLS.
fn bind(config: &RelayConfig, auth: &Auth) -> anyhow::Result<quinn::Endpoint> {
    let server_config = auth.server_config().context("tls configuration")?;
    let socket = ledger_relay_transport::udp_socket(config.listen, &config.transport)
        .with_context(|| format!("binding {}", config.listen))?;
    ledger_relay_transport::endpoint(socket, Some(server_config), &config.transport)
        .context("creating the QUIC endpoint")
}

/// The lake exporter (its tap for the pipeline, and its thread) and the backfill lake, each
/// when configured.
#[allow(clippy::type_complexity)]
fn start_lakes(
    config: &RelayConfig,
    ring: &Arc<Ring>,
    metrics: &Arc<Metrics>,
    shutdown: &CancellationToken,
) -> anyhow::Result<(
    Option<(pipeline::ExportTap, lake::export::Exporter)>,
    Option<Arc<lake::backfill::Backfill>>,
)> {
    let exporter = match &config.export {
        Some(export) => Some(lake::export::spawn(
            export.clone(),
            Some(ring.clone()),
            metrics.clone(),
            shutdown.clone(),
        )?),
        None => None,
    };
    let backfill = config.backfill.clone().map(|b| {
        Arc::new(lake::backfill::Backfill::new(
            b,
            &config.pipeline,
            metrics.lake.backfill.clone(),
        ))
    });
    if let Some(b) = backfill.clone() {
        // Tell the operator at once whether the lake can be read (the relay runs either way).
        tokio::spawn(async move {
            match b.range().await {
                Ok(range) => info!(?range, "backfill lake opened"),
                Err(e) => tracing::warn!(error = %e, "backfill lake cannot be read yet"),
            }
        });
    }
    Ok((exporter, backfill))
}

/// Starts the source on its thread, sending to `tx`: the relay's own, or the binary's for a
/// `relay:` source. Also says what the pipeline does when it refuses the source's output.
fn spawn_source(
    config: &RelayConfig,
    ring: &Ring,
    metrics: &Arc<Metrics>,
    tx: tokio::sync::mpsc::UnboundedSender<source::SourceEvent>,
    source_stop: &CancellationToken,
) -> (std::thread::JoinHandle<()>, pipeline::OnRefusal) {
    let mut source_options = config.source_options.clone();
    source_options.lake_stats = source::LakeStatsHandle(metrics.lake.source.clone());
    match (&config.source, &config.external_source) {
        (source::SourceSpec::Relay { .. }, Some(external)) => {
            let (tell, refused) = tokio::sync::mpsc::unbounded_channel();
            let thread = (external.0)(source::ExternalStart {
                spec: config.source.clone(),
                newest: ring.newest(),
                events: tx,
                shutdown: source_stop.clone(),
                metrics: metrics.clone(),
                refused,
            });
            (thread, pipeline::OnRefusal::Tell(tell))
        }
        (source::SourceSpec::Relay { .. }, None) => unreachable!("checked at the start"),
        _ => (
            source::spawn(
                config.source.clone(),
                source_options,
                tx,
                source_stop.clone(),
            ),
            pipeline::OnRefusal::Stop(source_stop.clone()),
        ),
    }
}

/// Publishes what the relay's memory depends on as `ledger_relay_sizing_*` gauges, so that an
/// operator (or a benchmark bounding the relay's memory) reads them from the relay it runs
/// rather than from this crate's constants.
fn record_sizing(config: &RelayConfig, metrics: &Metrics) {
    let set = |gauge: &std::sync::atomic::AtomicU64, v: u64| Metrics::set(gauge, v);
    set(
        &metrics.sizing_live_capacity_items,
        config.live_capacity as u64,
    );
    set(&metrics.sizing_recent_ledgers, hub::RECENT_LEDGERS as u64);
    set(
        &metrics.sizing_window_ledgers,
        u64::from(config.server.session.window),
    );
    set(
        &metrics.sizing_compress_queue_chunks,
        config.pipeline.compress_queue as u64,
    );
    set(&metrics.sizing_ring_cache_bytes, ring::CACHE_BYTES);
    set(
        &metrics.sizing_ring_segment_bytes,
        ring::segment_size() as u64,
    );
    if matches!(config.source, source::SourceSpec::Synthetic(_)) {
        set(&metrics.sizing_source_ahead_ledgers, source::AHEAD as u64);
        set(&metrics.sizing_source_pool_ledgers, source::POOL as u64);
        set(&metrics.sizing_source_upfront_bytes, source::UPFRONT_BYTES);
    }
}

/// Serves `/metrics` and `/healthz` on `addr` (`--metrics`), if given; the address bound.
fn serve_metrics(
    addr: Option<SocketAddr>,
    metrics: &Arc<Metrics>,
    shutdown: &CancellationToken,
) -> anyhow::Result<Option<SocketAddr>> {
    let Some(a) = addr else { return Ok(None) };
    let bound = metrics::spawn(a, metrics.clone(), shutdown.clone())
        .with_context(|| format!("binding metrics on {a}"))?;
    info!(addr = %bound, "metrics listening");
    Ok(Some(bound))
}

/// Where requests for stellar-core go: `--core-http` and `--core-query`, or a tier relay's
/// upstream relays.
fn core_forwarder(
    config: &RelayConfig,
    metrics: &Arc<Metrics>,
) -> anyhow::Result<Arc<core_http::forward::Forwarder>> {
    let core = &config.core;
    let upstream = config.core_upstream.clone();
    let forwarder = core_http::forward::Forwarder::new(
        core,
        upstream.clone(),
        &config.server.session.limits,
        metrics.clone(),
    )
    .map_err(|e| anyhow::anyhow!("the HTTP client of --core-http/--core-query: {e}"))?;
    match (&core.http, &core.query) {
        (None, None) if upstream.is_some() => {
            info!("requests for stellar-core go to the upstream relays");
        }
        (None, None) => {}
        (http, query) => info!(
            http = http.as_ref().map_or("off".to_owned(), |u| u.to_string()),
            query = query.as_ref().map_or("off".to_owned(), |u| u.to_string()),
            "requests for stellar-core go to its ports"
        ),
    }
    Ok(Arc::new(forwarder))
}

/// Where the relay's certificates are: `--certs DIR --name NAME`.
fn auth_config(config: &RelayConfig) -> AuthConfig {
    AuthConfig {
        ca: config.certs.join("ca.pem"),
        cert: config.certs.join(format!("{}.pem", config.name)),
        key: config.certs.join(format!("{}.key", config.name)),
        crl: config.certs.join("crl.pem"),
        allow: config.allow.clone(),
    }
}

/// `ledger-relay check-config --config FILE`: everything `run` would refuse at start, without
/// binding, opening the ring or starting the source. Checks every key and value of the file
/// (as `run` reads it, with no flags), that the certificates load and make a TLS configuration
/// (CA, this relay's certificate and key, the CRL when present), and that a `file:` or
/// `fifo:` source exists. Returns a one-line summary.
pub fn check_config(path: &std::path::Path) -> anyhow::Result<String> {
    let config = RelayConfig::from_args(config::RunArgs {
        config: Some(path.to_path_buf()),
        ..config::RunArgs::default()
    })?;
    let auth = Auth::load(auth_config(&config), config.transport.clone())
        .with_context(|| format!("loading certificates from {}", config.certs.display()))?;
    auth.server_config().context("tls configuration")?;
    match &config.source {
        source::SourceSpec::File { path } | source::SourceSpec::Fifo { path } => {
            std::fs::metadata(path).with_context(|| format!("source {}", config.source))?;
        }
        _ => {}
    }
    let cert = auth_config(&config).cert;
    let expiry = ledger_relay_certs::load_certs(&cert)
        .ok()
        .and_then(|c| {
            c.first()
                .and_then(|c| ledger_relay_certs::cert_not_after(c).ok())
        })
        .map(|t| {
            format!(
                ", certificate expires {}",
                humantime::format_rfc3339_seconds(t)
            )
        })
        .unwrap_or_default();
    Ok(format!(
        "{}: ok (listen {}, source {}, data {}, metrics {}{expiry})",
        path.display(),
        config.listen,
        config.source,
        config.data_dir.display(),
        config
            .metrics
            .map_or_else(|| "off".to_owned(), |m| m.to_string()),
    ))
}
