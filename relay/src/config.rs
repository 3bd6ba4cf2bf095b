//! The relay's configuration: command-line flags over an optional TOML file over defaults.
//!
//! Every flag of `ledger-relay run` has a key of the same name (dashes as underscores) in the
//! file given by `--config`; a flag given on the command line wins. Transport settings live in a
//! `[transport]` table. See `docs/operations.md` for an annotated example. What a setting is
//! when neither gives it is in one table, [`DEFAULTS`], which the settings code, `--help` and
//! a test of `docs/operations.md`'s flag table read.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use ledger_relay_transport::TransportSettings;
use ledger_relay_wire::Limits;
use serde::Deserialize;

use crate::core_http::{CoreBackend, CoreSettings, CoreUrl};
use crate::lake::backfill::{default_per_identity, BackfillConfig};
use crate::lake::export::ExportConfig;
use crate::pipeline::PipelineConfig;
use crate::server::{ServerConfig, FIRST_FRAME_TIMEOUT};
use crate::session::SessionConfig;
use crate::source::{SourceOptions, SourceSpec};

pub use crate::defaults::{Defaults, Shown, DEFAULTS};

mod settings;
use settings::{
    backfill_config, core_settings, export_settings, passphrase, pipeline_settings, required,
    server_settings, source_settings, upstream_config, BackfillFlags, CoreFlags,
};

/// Flags of `ledger-relay run` (`docs/operations.md`, "The command contract"), all optional
/// here so a config file can supply them; `--help` shows each default of [`DEFAULTS`].
#[derive(Debug, Default, Clone, clap::Args)]
#[command(mut_args = crate::defaults::show_in_help())]
pub struct RunArgs {
    /// UDP address to listen on, e.g. 0.0.0.0:7400.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Certificate directory (ca.pem, NAME.pem, NAME.key, crl.pem).
    #[arg(long)]
    pub certs: Option<PathBuf>,
    /// Name of this relay's certificate in the certificate directory.
    #[arg(long)]
    pub name: Option<String>,
    /// Directory for the retention ring.
    #[arg(long = "data-dir")]
    pub data_dir: Option<PathBuf>,
    /// Ledger source: file:PATH, pipe:COMMAND, fifo:PATH, stdin, synthetic[:KEY=VALUE,...],
    /// datalake:URL[,from=SEQ][,to=SEQ] or relay:ADDR[,ADDR...] (upstream relays: this relay is
    /// a tier of a fan-out tree; needs --upstream-name).
    #[arg(long)]
    pub source: Option<String>,
    /// Time between ledgers for file and synthetic sources.
    #[arg(long)]
    pub cadence: Option<String>,
    /// Window over which file and synthetic sources emit each ledger.
    #[arg(long)]
    pub emit: Option<String>,
    /// Ledgers kept in the retention ring.
    #[arg(long)]
    pub retention: Option<u32>,
    /// Bytes the retention ring may hold, e.g. 64GiB.
    #[arg(long = "retention-bytes")]
    pub retention_bytes: Option<String>,
    /// Read rate of the ring's scrub, which verifies every stored ledger in the background after
    /// the relay starts and then every hour, e.g. 32MiB (per second); 0 turns it off.
    #[arg(long = "scrub-rate", value_name = "BYTES")]
    pub scrub_rate: Option<String>,
    /// Client identity allowed to connect (repeatable); without it any certificate from the CA.
    #[arg(long)]
    pub allow: Vec<String>,
    /// Address for Prometheus /metrics and /healthz, e.g. 127.0.0.1:9100.
    #[arg(long)]
    pub metrics: Option<SocketAddr>,
    /// /healthz reports degraded (HTTP 503) after this long without a new ledger.
    #[arg(long = "stale-after", value_name = "DURATION")]
    pub stale_after: Option<String>,
    /// TOML file with the same settings; flags override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Network name recorded in the ring; a ring of another network is refused.
    #[arg(long)]
    pub network: Option<String>,
    /// Chunk codec: zstd, lz4 or none.
    #[arg(long)]
    pub codec: Option<String>,
    /// zstd level.
    #[arg(long = "zstd-level")]
    pub zstd_level: Option<i32>,
    /// Raw bytes per chunk, e.g. 256KiB.
    #[arg(long = "chunk-size")]
    pub chunk_size: Option<String>,
    /// Compression threads [default: the number of cores].
    #[arg(long = "compress-threads")]
    pub compress_threads: Option<usize>,
    /// Ledgers in flight per subscriber.
    #[arg(long)]
    pub window: Option<u16>,
    /// Heartbeat interval.
    #[arg(long)]
    pub heartbeat: Option<String>,
    /// Most QUIC connections at once.
    #[arg(long = "max-connections")]
    pub max_connections: Option<usize>,
    /// Most sessions at once.
    #[arg(long = "max-sessions")]
    pub max_sessions: Option<usize>,
    /// Most lanes per session.
    #[arg(long = "max-lanes")]
    pub max_lanes: Option<u8>,
    /// Most QUIC connections from one IP address at once, counted once the address is validated.
    #[arg(long = "max-connections-per-address", value_name = "N")]
    pub max_connections_per_address: Option<usize>,
    /// Most QUIC connections of one client identity at once.
    #[arg(long = "max-connections-per-identity", value_name = "N")]
    pub max_connections_per_identity: Option<usize>,
    /// Most sessions of one client identity at once.
    #[arg(long = "max-sessions-per-identity", value_name = "N")]
    pub max_sessions_per_identity: Option<usize>,
    /// Handshakes from addresses not validated yet beyond which a new connection attempt must first
    /// prove its address with a QUIC Retry (one round trip more), as every attempt must once the
    /// pending pool is half full; 0: always.
    #[arg(long = "retry-threshold", value_name = "N")]
    pub retry_threshold: Option<usize>,
    /// Handshakes without a verified client certificate yet that the relay holds at once (the
    /// pending pool); when it is full, an attempt from an address holding fewer displaces the
    /// heaviest address's oldest.
    #[arg(long = "handshake-pool", value_name = "N")]
    pub handshake_pool: Option<usize>,
    /// Of the pending pool, most handshakes from one address (an IPv6 /64).
    #[arg(long = "handshake-pool-per-source", value_name = "N")]
    pub handshake_pool_per_source: Option<usize>,
    /// Time a QUIC/TLS handshake may take, client certificate included, before it leaves the
    /// pending pool, 100ms..=60s.
    #[arg(long = "handshake-timeout", value_name = "DURATION")]
    pub handshake_timeout: Option<String>,
    /// How long a session whose start is ahead of the relay (or, for the tip, a relay that holds no
    /// ledger yet) waits for it before it is refused with Overloaded.
    #[arg(long = "start-wait", value_name = "DURATION")]
    pub start_wait: Option<String>,
    /// Send a ledger to subscribers only once the source has written all of it, instead of
    /// streaming its chunks while the source still writes (catch-up from the ring is the same
    /// either way).
    #[arg(long = "store-and-forward")]
    pub store_and_forward: bool,
    /// Most chunk streams open at once on one lane, 1..=1024; a stream counts from its opening
    /// until the subscriber has acknowledged all of it [default: unlimited].
    #[arg(long = "streams-per-lane", value_name = "N")]
    pub streams_per_lane: Option<u32>,
    /// Write every ledger to a SEP-54 data lake: file:///PATH, s3://BUCKET/PREFIX,
    /// gs://BUCKET/PREFIX or az://CONTAINER/PREFIX (credentials from the environment).
    #[arg(long, value_name = "URL")]
    pub export: Option<String>,
    /// Ledgers per object of a new export lake.
    #[arg(long = "export-ledgers-per-file", value_name = "N")]
    pub export_ledgers_per_file: Option<u32>,
    /// Objects per partition of a new export lake.
    #[arg(long = "export-files-per-partition", value_name = "N")]
    pub export_files_per_partition: Option<u32>,
    /// zstd level of exported objects, 1..=22.
    #[arg(long = "export-zstd-level", value_name = "L")]
    pub export_zstd_level: Option<i32>,
    /// Serve history below the ring from this SEP-54 data lake (same URL forms as --export).
    #[arg(long, value_name = "URL")]
    pub backfill: Option<String>,
    /// Sessions that may read the backfill lake at once, 1..=1024; more wait for a slot.
    #[arg(long = "backfill-sessions", value_name = "N")]
    pub backfill_sessions: Option<usize>,
    /// Of those, sessions of one client identity at once, 1..=--backfill-sessions [default:
    /// half of --backfill-sessions, rounded up].
    #[arg(long = "backfill-sessions-per-identity", value_name = "N")]
    pub backfill_sessions_per_identity: Option<usize>,
    /// Objects each backfilling session reads ahead, in parallel, 1..=256.
    #[arg(long = "backfill-prefetch", value_name = "N")]
    pub backfill_prefetch: Option<usize>,
    /// The network's passphrase, written into and checked against lake manifests [default:
    /// from --network pubnet, testnet or futurenet].
    #[arg(long = "network-passphrase", value_name = "PASSPHRASE")]
    pub network_passphrase: Option<String>,
    /// With --source relay:...: the client certificate (DIR/NAME.pem, DIR/NAME.key of --certs)
    /// this relay subscribes to its upstreams with.
    #[arg(long = "upstream-name", value_name = "NAME")]
    pub upstream_name: Option<String>,
    /// With --source relay:...: lanes of the subscription to the upstream, 1..=64.
    #[arg(long = "upstream-lanes", value_name = "N")]
    pub upstream_lanes: Option<u8>,
    /// With --source relay:...: pass each ledger on chunk by chunk as it arrives from the
    /// upstream (cut-through), instead of once it is complete and verified; a ledger that then
    /// fails verification is taken back (its subscribers' sessions end with SourceReset and
    /// resume). The ring keeps only verified ledgers either way.
    #[arg(long = "cut-through")]
    pub cut_through: bool,
    /// stellar-core's command port, e.g. http://127.0.0.1:11626: subscribers' stand-ins send
    /// the /tx and /info requests of stellar-rpc, Horizon and Galexie here. A relay with a
    /// relay: source and neither --core-http nor --core-query forwards them to its upstreams.
    #[arg(long = "core-http", value_name = "URL")]
    pub core_http: Option<String>,
    /// stellar-core's query server, e.g. http://127.0.0.1:11628: /getledgerentry and
    /// /getledgerentryraw are forwarded here.
    #[arg(long = "core-query", value_name = "URL")]
    pub core_query: Option<String>,
    /// Client identity that may send requests for the command port (repeatable) [default:
    /// every client --allow admits].
    #[arg(long = "core-http-allow", value_name = "NAME")]
    pub core_http_allow: Vec<String>,
    /// Client identity that may send requests for the query server (repeatable) [default:
    /// every client --allow admits].
    #[arg(long = "core-query-allow", value_name = "NAME")]
    pub core_query_allow: Vec<String>,
    /// Longest a forwarded request is given, or the request's own timeout when shorter; 1ms..=60s.
    #[arg(long = "core-timeout", value_name = "DURATION")]
    pub core_timeout: Option<String>,
    /// Largest request forwarded (target, content type and body), at most 1MiB.
    #[arg(long = "core-max-request", value_name = "SIZE")]
    pub core_max_request: Option<String>,
    /// Requests of one client identity in flight at once, 1..=1024; more are answered 429 at once.
    #[arg(long = "core-concurrency", value_name = "N")]
    pub core_concurrency: Option<u32>,
    /// With --source relay:...: a trusted ledger, SEQ:HASH (its header hash, 64 hex digits),
    /// that a relay with an empty ring starts at: the upstream's ledger SEQ must have this hash
    /// (without it, an empty ring trusts the upstream's first ledger).
    #[arg(long = "upstream-anchor", value_name = "SEQ:HASH")]
    pub upstream_anchor: Option<String>,
}

/// The TOML file: the same keys as the flags, plus `[transport]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    listen: Option<SocketAddr>,
    certs: Option<PathBuf>,
    name: Option<String>,
    data_dir: Option<PathBuf>,
    source: Option<String>,
    cadence: Option<String>,
    emit: Option<String>,
    retention: Option<u32>,
    retention_bytes: Option<String>,
    scrub_rate: Option<String>,
    #[serde(default)]
    allow: Vec<String>,
    metrics: Option<SocketAddr>,
    stale_after: Option<String>,
    network: Option<String>,
    codec: Option<String>,
    zstd_level: Option<i32>,
    chunk_size: Option<String>,
    compress_threads: Option<usize>,
    window: Option<u16>,
    heartbeat: Option<String>,
    max_connections: Option<usize>,
    max_sessions: Option<usize>,
    max_lanes: Option<u8>,
    max_connections_per_address: Option<usize>,
    max_connections_per_identity: Option<usize>,
    max_sessions_per_identity: Option<usize>,
    retry_threshold: Option<usize>,
    handshake_pool: Option<usize>,
    handshake_pool_per_source: Option<usize>,
    handshake_timeout: Option<String>,
    start_wait: Option<String>,
    store_and_forward: Option<bool>,
    streams_per_lane: Option<u32>,
    export: Option<String>,
    export_ledgers_per_file: Option<u32>,
    export_files_per_partition: Option<u32>,
    export_zstd_level: Option<i32>,
    backfill: Option<String>,
    backfill_sessions: Option<usize>,
    backfill_sessions_per_identity: Option<usize>,
    backfill_prefetch: Option<usize>,
    network_passphrase: Option<String>,
    upstream_name: Option<String>,
    upstream_lanes: Option<u8>,
    cut_through: Option<bool>,
    core_http: Option<String>,
    core_query: Option<String>,
    core_http_allow: Option<Vec<String>>,
    core_query_allow: Option<Vec<String>>,
    core_timeout: Option<String>,
    core_max_request: Option<String>,
    core_concurrency: Option<u32>,
    upstream_anchor: Option<String>,
    transport: Option<TransportSettings>,
}

/// A validated relay configuration.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// UDP listen address.
    pub listen: SocketAddr,
    /// Certificate directory.
    pub certs: PathBuf,
    /// This relay's certificate name.
    pub name: String,
    /// Retention ring directory (`DATA_DIR/ring`).
    pub data_dir: PathBuf,
    /// The ledger source.
    pub source: SourceSpec,
    /// Source pacing and limits.
    pub source_options: SourceOptions,
    /// Ledgers kept.
    pub retention: u32,
    /// Bytes kept.
    pub retention_bytes: u64,
    /// The ring's scrub: bytes read per second (0: no scrub).
    pub scrub_rate: u64,
    /// Allowed identities (empty: any from the CA).
    pub allow: Vec<String>,
    /// Metrics address.
    pub metrics: Option<SocketAddr>,
    /// Time without a new ledger after which `/healthz` reports degraded.
    pub stale_after: Duration,
    /// Network name for the ring.
    pub network: Option<String>,
    /// Chunking and compression.
    pub pipeline: PipelineConfig,
    /// Sessions, lanes and limits.
    pub server: ServerConfig,
    /// QUIC and UDP settings.
    pub transport: TransportSettings,
    /// Items (chunks and end records) the live broadcast channel holds before a subscriber
    /// that has not read them is moved to ring reading.
    pub live_capacity: usize,
    /// The network passphrase (`--network-passphrase`, or the passphrase of `--network`).
    pub network_passphrase: Option<String>,
    /// `--export`: the data lake every ledger is written to.
    pub export: Option<ExportConfig>,
    /// `--backfill`: the data lake history below the ring is served from.
    pub backfill: Option<BackfillConfig>,
    /// With a `relay:` source: how it subscribes to its upstreams.
    pub upstream: Option<UpstreamConfig>,
    /// Runs a `relay:` source (set by the `ledger-relay` binary; without it such a source is
    /// refused at start).
    pub external_source: Option<crate::source::ExternalSource>,
    /// Where a damaged ring ledger can be fetched again besides the backfill lake: the
    /// upstream relays of a `relay:` source (set by the `ledger-relay` binary, like
    /// `external_source`).
    pub refetch: Option<crate::source::Refetch>,
    /// Requests for stellar-core's HTTP ports (`--core-*`).
    pub core: CoreSettings,
    /// Where a relay without `--core-http` and `--core-query` forwards requests for
    /// stellar-core: a tier relay's upstream relays (set by the `ledger-relay` binary, like
    /// `external_source`). `None`: such requests are refused.
    pub core_upstream: Option<std::sync::Arc<dyn CoreBackend>>,
}

/// How a relay with a `relay:` source subscribes to its upstreams.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamConfig {
    /// Its client certificate's name in `--certs` (`--upstream-name`).
    pub name: String,
    /// Lanes (`--upstream-lanes`).
    pub lanes: u8,
    /// Pass ledgers on as their chunks arrive (`--cut-through`).
    pub cut_through: bool,
    /// The trusted ledger (sequence, header hash) an empty ring starts at
    /// (`--upstream-anchor SEQ:HASH`).
    pub anchor: Option<(u32, [u8; 32])>,
}

/// Ledgers in flight per subscriber without `--window` ([`DEFAULTS`]'s `window`).
pub const DEFAULT_WINDOW: u16 = DEFAULTS.window;

/// Items (chunks and end records) the live broadcast channel holds before a subscriber that
/// has not read them is moved to ring reading.
pub const LIVE_CAPACITY: usize = 512;

/// The most `--streams-per-lane` accepts: far above what helps (quinn's default is 100
/// concurrent streams per connection), low enough to catch a typo.
pub const MAX_STREAMS_PER_LANE: u32 = 1024;

/// Parses a duration such as `600ms`, `2s` or `1m` (the grammar of every command:
/// [`ledger_relay_transport::units`]).
pub fn parse_duration(s: &str) -> anyhow::Result<Duration> {
    Ok(ledger_relay_transport::parse_duration(s)?)
}

/// Parses a byte size such as `14.5MiB`, `256KiB`, `64GiB`, `1MB` or `1000`.
pub fn parse_size(s: &str) -> anyhow::Result<u64> {
    Ok(ledger_relay_transport::parse_size(s)?)
}

impl RunArgs {
    /// These flags over the keys of `file`: a flag given wins, a key fills what no flag gives;
    /// and the file's `[transport]` table.
    fn over(mut self, file: FileConfig) -> (RunArgs, Option<TransportSettings>) {
        macro_rules! fill {
            ($($f:ident),* $(,)?) => { $( self.$f = self.$f.take().or(file.$f); )* };
        }
        fill!(
            listen,
            certs,
            name,
            data_dir,
            source,
            cadence,
            emit,
            retention,
            retention_bytes,
            scrub_rate,
            metrics,
            stale_after,
            network,
            codec,
            zstd_level,
            chunk_size,
            compress_threads,
            window,
            heartbeat,
            max_connections,
            max_sessions,
            max_lanes,
            max_connections_per_address,
            max_connections_per_identity,
            max_sessions_per_identity,
            retry_threshold,
            handshake_pool,
            handshake_pool_per_source,
            handshake_timeout,
            start_wait,
            streams_per_lane,
            export,
            export_ledgers_per_file,
            export_files_per_partition,
            export_zstd_level,
            backfill,
            backfill_sessions,
            backfill_sessions_per_identity,
            backfill_prefetch,
            network_passphrase,
            upstream_name,
            upstream_lanes,
            core_http,
            core_query,
            core_timeout,
            core_max_request,
            core_concurrency,
            upstream_anchor,
        );
        self.store_and_forward |= file.store_and_forward.unwrap_or(false);
        self.cut_through |= file.cut_through.unwrap_or(false);
        if self.allow.is_empty() {
            self.allow = file.allow;
        }
        if self.core_http_allow.is_empty() {
            self.core_http_allow = file.core_http_allow.unwrap_or_default();
        }
        if self.core_query_allow.is_empty() {
            self.core_query_allow = file.core_query_allow.unwrap_or_default();
        }
        (self, file.transport)
    }
}

impl RelayConfig {
    /// Builds the configuration from flags over the file named by `--config` over defaults.
    pub fn from_args(args: RunArgs) -> anyhow::Result<RelayConfig> {
        let file = match &args.config {
            Some(path) => read_file(path)?,
            None => FileConfig::default(),
        };
        let (f, transport) = args.over(file);
        let transport = transport.unwrap_or_default();
        let listen = required(f.listen, "listen")?;
        let certs = required(f.certs.clone(), "certs")?;
        let data_dir = required(f.data_dir.clone(), "data_dir")?;
        let source: SourceSpec = required(f.source.clone(), "source")?
            .parse()
            .map_err(|e| anyhow::anyhow!("--source: {e}"))?;
        let (mut source_options, stale_after) = source_settings(&f, &source)?;
        let retention = f.retention.unwrap_or(DEFAULTS.retention);
        if retention == 0 {
            bail!("--retention must be at least 1");
        }
        for name in &f.allow {
            ledger_relay_certs::validate_name(name).with_context(|| format!("--allow {name}"))?;
        }
        let limits = Limits::default();
        let pipeline = pipeline_settings(&f, &limits)?;
        let network_passphrase = passphrase(&f)?;
        let export = export_settings(&f, network_passphrase.as_deref())?;
        let backfill = backfill_config(
            f.backfill.clone(),
            BackfillFlags {
                sessions: f.backfill_sessions,
                per_identity: f.backfill_sessions_per_identity,
                prefetch: f.backfill_prefetch,
            },
            network_passphrase.clone(),
        )?;
        source_options.network_passphrase = network_passphrase.clone();
        let server = server_settings(&f, &pipeline, &transport, limits)?;
        let upstream = upstream_config(
            &source,
            f.upstream_name.clone(),
            f.upstream_lanes,
            f.upstream_anchor.clone(),
            f.cut_through,
        )?;
        let core = core_settings(CoreFlags::of(&f), &server.session.limits)?;
        Ok(RelayConfig {
            listen,
            certs,
            name: f.name.clone().unwrap_or_else(|| DEFAULTS.name.into()),
            data_dir,
            source,
            source_options,
            retention,
            retention_bytes: match &f.retention_bytes {
                Some(s) => parse_size(s).context("--retention-bytes")?,
                None => DEFAULTS.retention_bytes,
            },
            scrub_rate: match &f.scrub_rate {
                Some(s) => parse_size(s).context("--scrub-rate")?,
                None => DEFAULTS.scrub_rate,
            },
            allow: f.allow.clone(),
            metrics: f.metrics,
            stale_after,
            network: f.network.clone(),
            pipeline,
            server,
            transport,
            live_capacity: LIVE_CAPACITY,
            network_passphrase,
            export,
            backfill,
            upstream,
            external_source: None,
            refetch: None,
            core,
            core_upstream: None,
        })
    }
}

fn read_file(path: &Path) -> anyhow::Result<FileConfig> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    toml::from_str(&text).map_err(|e| {
        // toml's own message spans several lines (a source excerpt); the reason is one.
        let at = e.span().and_then(|span| {
            // `get`: a span off a character boundary gives no location rather than a panic.
            let start = span.start.min(text.len());
            let before = text.get(..start)?;
            let line_start = before.rfind('\n').map_or(0, |i| i + 1);
            let line = before.matches('\n').count() + 1;
            let column = start - line_start + 1;
            // The line itself names the key, which toml's message alone does not.
            let source: String = text
                .get(line_start..)?
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .chars()
                .take(80)
                .collect();
            Some(format!("line {line}, column {column} (`{source}`): "))
        });
        let at = at.unwrap_or_default();
        anyhow::anyhow!(
            "parsing {}: {at}{}",
            path.display(),
            e.message().trim().replace('\n', " ")
        )
    })
}

#[cfg(test)]
mod tests;
