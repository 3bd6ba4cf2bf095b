//! Each part of the relay's configuration built from the merged flags ([`RunArgs::over`]):
//! checked, with its defaults, in a function of its own.

use ledger_relay_wire::compress::Codec;

use super::*;

/// A setting no default stands for: the flag's value or the config file's key, or an error
/// naming both.
pub(super) fn required<T>(v: Option<T>, key: &str) -> anyhow::Result<T> {
    v.with_context(|| {
        format!(
            "--{} is required (or `{key}` in --config)",
            key.replace('_', "-")
        )
    })
}

/// The source's pacing and when `/healthz` calls it stale.
pub(super) fn source_settings(
    f: &RunArgs,
    source: &SourceSpec,
) -> anyhow::Result<(SourceOptions, Duration)> {
    let mut options = SourceOptions::default();
    if let Some(c) = &f.cadence {
        options.cadence = parse_duration(c).context("--cadence")?;
    }
    if let Some(e) = &f.emit {
        options.emit = parse_duration(e).context("--emit")?;
    }
    if options.emit > options.cadence {
        bail!("--emit must not exceed --cadence");
    }
    let stale_after = match &f.stale_after {
        Some(s) => {
            let d = parse_duration(s).context("--stale-after")?;
            if d.is_zero() {
                bail!("--stale-after must be more than 0");
            }
            d
        }
        None => match source {
            SourceSpec::File { .. } | SourceSpec::Synthetic(_) => {
                DEFAULTS.paced_stale_after(options.cadence)
            }
            // A lake that is followed gets new ledgers only as its writer adds them.
            SourceSpec::Pipe { .. }
            | SourceSpec::Fifo { .. }
            | SourceSpec::Stdin
            | SourceSpec::Datalake(_)
            | SourceSpec::Relay { .. } => DEFAULTS.stale_after,
        },
    };
    Ok((options, stale_after))
}

/// Chunking and compression.
pub(super) fn pipeline_settings(f: &RunArgs, limits: &Limits) -> anyhow::Result<PipelineConfig> {
    let mut pipeline = PipelineConfig::default();
    if let Some(c) = &f.codec {
        pipeline.codec = Codec::from_name(c)
            .with_context(|| format!("--codec {c:?}: expected zstd, lz4 or none"))?;
    }
    if let Some(l) = f.zstd_level {
        if !(-7..=22).contains(&l) {
            bail!("--zstd-level {l}: expected -7..=22");
        }
        pipeline.zstd_level = l;
    }
    if let Some(c) = &f.chunk_size {
        let size = parse_size(c).context("--chunk-size")?;
        if size < 4096 || size > u64::from(limits.max_chunk_raw) {
            bail!(
                "--chunk-size {c}: expected 4KiB..={}MiB",
                limits.max_chunk_raw >> 20
            );
        }
        pipeline.chunk_size = size as usize;
    }
    if let Some(t) = f.compress_threads {
        pipeline.compress_threads = t.clamp(1, 256);
    }
    pipeline.store_and_forward = f.store_and_forward;
    Ok(pipeline)
}

/// `--network-passphrase`, or the passphrase of a known `--network`.
pub(super) fn passphrase(f: &RunArgs) -> anyhow::Result<Option<String>> {
    let passphrase = f.network_passphrase.clone().or_else(|| {
        f.network
            .as_deref()
            .and_then(ledger_relay_lake::passphrase_of)
            .map(str::to_owned)
    });
    if passphrase.as_deref().is_some_and(|p| p.trim().is_empty()) {
        bail!("--network-passphrase must not be empty");
    }
    Ok(passphrase)
}

/// `--export` and its layout; the layout flags without it are a mistake.
pub(super) fn export_settings(
    f: &RunArgs,
    passphrase: Option<&str>,
) -> anyhow::Result<Option<ExportConfig>> {
    let Some(url) = &f.export else {
        for (set, flag) in [
            (
                f.export_ledgers_per_file.is_some(),
                "--export-ledgers-per-file",
            ),
            (
                f.export_files_per_partition.is_some(),
                "--export-files-per-partition",
            ),
            (f.export_zstd_level.is_some(), "--export-zstd-level"),
        ] {
            if set {
                bail!("{flag} needs --export URL");
            }
        }
        return Ok(None);
    };
    let url = url.parse().map_err(|e| anyhow::anyhow!("--export: {e}"))?;
    let network = passphrase.map(str::to_owned).with_context(|| {
        "--export needs the network's passphrase for the lake's manifest: give \
         --network-passphrase, or --network pubnet, testnet or futurenet"
    })?;
    let mut cfg = ExportConfig::new(url, network);
    cfg.layout.ledgers_per_batch = f.export_ledgers_per_file;
    cfg.layout.batches_per_partition = f.export_files_per_partition;
    ledger_relay_wire::lake::Schema::new(
        cfg.layout
            .ledgers_per_batch
            .unwrap_or(DEFAULTS.export_ledgers_per_file),
        cfg.layout
            .batches_per_partition
            .unwrap_or(DEFAULTS.export_files_per_partition),
    )
    .map_err(|e| anyhow::anyhow!("--export-ledgers-per-file/--export-files-per-partition: {e}"))?;
    if let Some(l) = f.export_zstd_level {
        if !(1..=22).contains(&l) {
            bail!("--export-zstd-level {l}: expected 1..=22");
        }
        cfg.zstd_level = l;
    }
    Ok(Some(cfg))
}

/// Sessions, lanes, the caps on connections and sessions, and the handshake pool.
pub(super) fn server_settings(
    f: &RunArgs,
    pipeline: &PipelineConfig,
    transport: &TransportSettings,
    limits: Limits,
) -> anyhow::Result<ServerConfig> {
    let window = f.window.unwrap_or(DEFAULTS.window);
    if window == 0 || u32::from(window) > limits.max_ledgers_in_flight {
        bail!(
            "--window {window}: expected 1..={}",
            limits.max_ledgers_in_flight
        );
    }
    let heartbeat = match &f.heartbeat {
        Some(h) => parse_duration(h).context("--heartbeat")?,
        None => DEFAULTS.heartbeat,
    };
    if heartbeat < Duration::from_millis(10) {
        bail!("--heartbeat must be at least 10ms");
    }
    let streams_per_lane = match f.streams_per_lane {
        Some(n) if (1..=MAX_STREAMS_PER_LANE).contains(&n) => Some(n),
        Some(n) => bail!("--streams-per-lane {n}: expected 1..={MAX_STREAMS_PER_LANE}"),
        None => None,
    };
    let start_wait = match &f.start_wait {
        Some(w) => parse_duration(w).context("--start-wait")?,
        None => DEFAULTS.start_wait,
    };
    let at_least_one = |flag: &str, v: Option<usize>, default: usize| match v {
        Some(0) => bail!("--{flag} must be at least 1"),
        Some(n) => Ok(n),
        None => Ok(default),
    };
    let handshakes = handshake_flags(
        f.handshake_pool,
        f.handshake_pool_per_source,
        f.handshake_timeout.clone(),
    )?;
    Ok(ServerConfig {
        session: SessionConfig {
            limits,
            chunk_size: pipeline.chunk_size as u32,
            window,
            heartbeat,
            lane_budget: transport.send_window,
            streams_per_lane,
            start_wait: Some(start_wait),
        },
        max_connections: f.max_connections.unwrap_or(DEFAULTS.max_connections),
        max_sessions: f.max_sessions.unwrap_or(DEFAULTS.max_sessions),
        max_lanes: f.max_lanes.unwrap_or(DEFAULTS.max_lanes).clamp(1, 64),
        max_connections_per_address: at_least_one(
            "max-connections-per-address",
            f.max_connections_per_address,
            DEFAULTS.max_connections_per_address,
        )?,
        max_connections_per_identity: at_least_one(
            "max-connections-per-identity",
            f.max_connections_per_identity,
            DEFAULTS.max_connections_per_identity,
        )?,
        max_sessions_per_identity: at_least_one(
            "max-sessions-per-identity",
            f.max_sessions_per_identity,
            DEFAULTS.max_sessions_per_identity,
        )?,
        retry_threshold: f.retry_threshold.unwrap_or(DEFAULTS.retry_threshold),
        handshake_pool: handshakes.pool,
        handshake_pool_per_source: handshakes.per_source,
        handshake_timeout: handshakes.timeout,
        first_frame_timeout: FIRST_FRAME_TIMEOUT,
        codec: pipeline.codec,
    })
}

/// How a relay with a `relay:` source subscribes to its upstreams; the upstream flags without
/// such a source are a mistake.
pub(super) fn upstream_config(
    source: &SourceSpec,
    name: Option<String>,
    lanes: Option<u8>,
    anchor: Option<String>,
    cut_through: bool,
) -> anyhow::Result<Option<UpstreamConfig>> {
    if !matches!(source, SourceSpec::Relay { .. }) {
        if name.is_some() || lanes.is_some() || anchor.is_some() || cut_through {
            bail!("--upstream-name, --upstream-lanes, --upstream-anchor and --cut-through go with --source relay:ADDR[,ADDR...]");
        }
        return Ok(None);
    }
    let name = name.context(
        "--source relay:... needs --upstream-name NAME (a client certificate in --certs)",
    )?;
    ledger_relay_certs::validate_name(&name).with_context(|| format!("--upstream-name {name}"))?;
    let lanes = lanes.unwrap_or(DEFAULTS.upstream_lanes);
    if !(1..=64).contains(&lanes) {
        bail!("--upstream-lanes {lanes}: expected 1..=64");
    }
    let anchor = anchor
        .map(|a| {
            ledger_relay_wire::header::parse_anchor(&a)
                .map_err(|reason| anyhow::anyhow!("--upstream-anchor {a}: {reason}"))
        })
        .transpose()?;
    Ok(Some(UpstreamConfig {
        name,
        lanes,
        cut_through,
        anchor,
    }))
}

/// The `--core-*` flags, as given.
pub(super) struct CoreFlags {
    http: Option<String>,
    query: Option<String>,
    http_allow: Option<Vec<String>>,
    query_allow: Option<Vec<String>>,
    timeout: Option<String>,
    max_request: Option<String>,
    concurrency: Option<u32>,
}

impl CoreFlags {
    /// The `--core-*` flags of `f` (flags over the config file's keys).
    pub(super) fn of(f: &RunArgs) -> CoreFlags {
        let list = |l: &Vec<String>| (!l.is_empty()).then(|| l.clone());
        CoreFlags {
            http: f.core_http.clone(),
            query: f.core_query.clone(),
            http_allow: list(&f.core_http_allow),
            query_allow: list(&f.core_query_allow),
            timeout: f.core_timeout.clone(),
            max_request: f.core_max_request.clone(),
            concurrency: f.core_concurrency,
        }
    }
}

/// The longest `--core-timeout`: a request is an RPC's call waiting (stellar-rpc gives core
/// 2 s); beyond a minute it is a typo.
const MAX_CORE_TIMEOUT: Duration = Duration::from_secs(60);
/// The most `--core-concurrency` accepts.
const MAX_CORE_CONCURRENCY: u32 = 1024;

/// Checks the `--core-*` flags: http URLs with a host and a port, valid identity names, and
/// bounds within what the protocol (`limits`) allows.
pub(super) fn core_settings(flags: CoreFlags, limits: &Limits) -> anyhow::Result<CoreSettings> {
    let url = |flag: &str, v: Option<String>| -> anyhow::Result<Option<CoreUrl>> {
        v.map(|u| u.parse().map_err(|e| anyhow::anyhow!("--{flag} {u}: {e}")))
            .transpose()
    };
    let names = |flag: &str, v: &Option<Vec<String>>| -> anyhow::Result<()> {
        for name in v.iter().flatten() {
            ledger_relay_certs::validate_name(name).with_context(|| format!("--{flag} {name}"))?;
        }
        Ok(())
    };
    names("core-http-allow", &flags.http_allow)?;
    names("core-query-allow", &flags.query_allow)?;
    let mut core = CoreSettings {
        http: url("core-http", flags.http)?,
        query: url("core-query", flags.query)?,
        http_allow: flags.http_allow,
        query_allow: flags.query_allow,
        ..CoreSettings::default()
    };
    if let Some(t) = flags.timeout {
        core.timeout = parse_duration(&t).context("--core-timeout")?;
        if core.timeout.is_zero() || core.timeout > MAX_CORE_TIMEOUT {
            bail!("--core-timeout {t}: expected 1ms..=60s");
        }
    }
    if let Some(m) = flags.max_request {
        let max = parse_size(&m).context("--core-max-request")?;
        let limit = limits.max_core_request;
        if max == 0 || max > u64::from(limit) {
            bail!("--core-max-request {m}: expected 1..={limit} bytes (the protocol's limit)");
        }
        core.max_request = max as u32;
    }
    if let Some(n) = flags.concurrency {
        if !(1..=MAX_CORE_CONCURRENCY).contains(&n) {
            bail!("--core-concurrency {n}: expected 1..={MAX_CORE_CONCURRENCY}");
        }
        core.concurrency = n;
    }
    Ok(core)
}

/// The pending pool's settings (`--handshake-pool`, `--handshake-pool-per-source`,
/// `--handshake-timeout`).
pub(super) struct HandshakeFlags {
    pool: usize,
    per_source: usize,
    timeout: Duration,
}

pub(super) fn handshake_flags(
    pool: Option<usize>,
    per_source: Option<usize>,
    timeout: Option<String>,
) -> anyhow::Result<HandshakeFlags> {
    let pool = pool.unwrap_or(DEFAULTS.handshake_pool);
    if !(1..=65536).contains(&pool) {
        bail!("--handshake-pool {pool}: expected 1..=65536");
    }
    let per_source = per_source.unwrap_or(DEFAULTS.handshake_pool_per_source.min(pool));
    if !(1..=pool).contains(&per_source) {
        bail!("--handshake-pool-per-source {per_source}: expected 1..=--handshake-pool ({pool})");
    }
    let timeout = match timeout {
        Some(t) => parse_duration(&t).context("--handshake-timeout")?,
        None => DEFAULTS.handshake_timeout,
    };
    if !(Duration::from_millis(100)..=Duration::from_secs(60)).contains(&timeout) {
        bail!("--handshake-timeout {timeout:?}: expected 100ms..=60s");
    }
    Ok(HandshakeFlags {
        pool,
        per_source,
        timeout,
    })
}

/// The `--backfill-*` flags other than the lake itself.
pub(super) struct BackfillFlags {
    pub(super) sessions: Option<usize>,
    pub(super) per_identity: Option<usize>,
    pub(super) prefetch: Option<usize>,
}

/// `--backfill URL` and its settings; the settings without the lake are a mistake.
pub(super) fn backfill_config(
    url: Option<String>,
    flags: BackfillFlags,
    network: Option<String>,
) -> anyhow::Result<Option<BackfillConfig>> {
    let Some(url) = url else {
        for (set, flag) in [
            (flags.sessions.is_some(), "--backfill-sessions"),
            (
                flags.per_identity.is_some(),
                "--backfill-sessions-per-identity",
            ),
            (flags.prefetch.is_some(), "--backfill-prefetch"),
        ] {
            if set {
                bail!("{flag} needs --backfill URL");
            }
        }
        return Ok(None);
    };
    let url = url
        .parse()
        .map_err(|e| anyhow::anyhow!("--backfill: {e}"))?;
    let mut b = BackfillConfig::new(url, network);
    if let Some(n) = flags.sessions {
        if !(1..=1024).contains(&n) {
            bail!("--backfill-sessions {n}: expected 1..=1024");
        }
        b.sessions = n;
    }
    b.sessions_per_identity = match flags.per_identity {
        Some(n) if (1..=b.sessions).contains(&n) => n,
        Some(n) => bail!(
            "--backfill-sessions-per-identity {n}: expected 1..=--backfill-sessions ({})",
            b.sessions
        ),
        None => default_per_identity(b.sessions),
    };
    if let Some(n) = flags.prefetch {
        if !(1..=256).contains(&n) {
            bail!("--backfill-prefetch {n}: expected 1..=256");
        }
        b.prefetch.depth = n;
    }
    Ok(Some(b))
}
