//! The one table of `ledger-relay run`'s defaults: what a setting is when neither its flag nor
//! its key in the config file gives it.
//!
//! The settings code ([`crate::config`]) and the parts' own `Default`s take their values from
//! [`DEFAULTS`]; `--help` shows them ([`show_in_help`], applied to every flag of
//! [`crate::config::RunArgs`]); and a test checks the "All flags" table of
//! `docs/operations.md` against [`Defaults::shown`], so code, help and docs cannot disagree.
//! Defaults that are worked out from other settings (`--compress-threads`:
//! the number of cores; `--backfill-sessions-per-identity`: half of `--backfill-sessions`) are
//! the settings code's, and their help says so in words.
//!
//! The module uses nothing of the relay, so every part reads its defaults here without
//! importing the configuration code (which imports them).

use std::time::Duration;

use ledger_relay_transport::{default_tag, format_duration, format_size};
use ledger_relay_wire::compress::Codec;

/// Every default of `ledger-relay run` that is one value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Defaults {
    /// `--name`: this relay's certificate name.
    pub name: &'static str,
    /// `--cadence`: time between ledgers of file, synthetic and lake sources.
    pub cadence: Duration,
    /// `--emit`: window over which file and synthetic sources write a ledger.
    pub emit: Duration,
    /// `--retention`: ledgers kept in the ring.
    pub retention: u32,
    /// `--retention-bytes`: bytes kept in the ring.
    pub retention_bytes: u64,
    /// `--scrub-rate`: bytes per second the ring's scrub reads: a full ring of 10,000
    /// compressed Phase 3 ledgers (about 20 GB) in about ten minutes, a small share of a
    /// disk's bandwidth.
    pub scrub_rate: u64,
    /// `--stale-after` for sources that are not paced by the relay (pipe, FIFO, stdin, lake,
    /// upstream relays): about five pubnet ledgers (one every 5-6 s). Sources paced by
    /// `--cadence` (file, synthetic) take [`Defaults::paced_stale_after`].
    pub stale_after: Duration,
    /// For sources paced by `--cadence`: this many cadences without a ledger.
    pub stale_cadences: u32,
    /// The least default `--stale-after` of a paced source: scheduling noise on a loaded
    /// machine can delay a fast cadence's ledger by tens of milliseconds without anything
    /// being wrong.
    pub min_paced_stale_after: Duration,
    /// `--codec`: how chunks are compressed.
    pub codec: Codec,
    /// `--zstd-level`.
    pub zstd_level: i32,
    /// `--chunk-size`: raw bytes per chunk (the wire's own default).
    pub chunk_size: u32,
    /// `--window`: ledgers in flight per subscriber.
    pub window: u16,
    /// `--heartbeat`: interval on each session's control stream.
    pub heartbeat: Duration,
    /// `--max-connections`.
    pub max_connections: usize,
    /// `--max-sessions`.
    pub max_sessions: usize,
    /// `--max-lanes`: lanes per session.
    pub max_lanes: u8,
    /// `--max-connections-per-address`.
    pub max_connections_per_address: usize,
    /// `--max-connections-per-identity`.
    pub max_connections_per_identity: usize,
    /// `--max-sessions-per-identity`.
    pub max_sessions_per_identity: usize,
    /// `--retry-threshold`.
    pub retry_threshold: usize,
    /// `--handshake-pool`: handshakes without a verified client certificate held at once.
    pub handshake_pool: usize,
    /// `--handshake-pool-per-source`: of those, from one address (an IPv6 /64): two
    /// subscribers opening 16 lanes each at once from one address; at most the pool.
    pub handshake_pool_per_source: usize,
    /// `--handshake-timeout`: a few round trips and a lost packet's retransmission (quinn's
    /// first probe timeout is about 1 s) over the longest path.
    pub handshake_timeout: Duration,
    /// `--start-wait`: less than a subscriber's default wait for `SessionAccept` (30 s), so that
    /// it hears why rather than timing out.
    pub start_wait: Duration,
    /// `--export-ledgers-per-file` of a new lake (Galexie's default).
    pub export_ledgers_per_file: u32,
    /// `--export-files-per-partition` of a new lake (Galexie's default).
    pub export_files_per_partition: u32,
    /// `--export-zstd-level`.
    pub export_zstd_level: i32,
    /// `--backfill-sessions`: sessions reading the backfill lake at once.
    pub backfill_sessions: usize,
    /// `--backfill-prefetch`: eight requests in flight hide a cloud store's ~50 ms first-byte
    /// latency at several hundred ledgers per second.
    pub backfill_prefetch: usize,
    /// `--upstream-lanes`: lanes of the subscription to an upstream relay.
    pub upstream_lanes: u8,
    /// `--core-timeout`: how long the relay waits for core's answer.
    pub core_timeout: Duration,
    /// `--core-max-request`: the protocol's limit
    /// ([`ledger_relay_wire::Limits::max_core_request`]).
    pub core_max_request: u32,
    /// `--core-concurrency`: requests of one client in flight at once.
    pub core_concurrency: u32,
}

/// The defaults of `ledger-relay run`.
pub const DEFAULTS: Defaults = Defaults {
    name: "relay",
    cadence: Duration::from_millis(600),
    emit: Duration::from_millis(8),
    retention: 10_000,
    retention_bytes: 64 << 30,
    scrub_rate: 32 << 20,
    stale_after: Duration::from_secs(30),
    stale_cadences: 5,
    min_paced_stale_after: Duration::from_secs(1),
    codec: Codec::Zstd,
    zstd_level: 1,
    chunk_size: ledger_relay_wire::chunker::DEFAULT_CHUNK_SIZE as u32,
    window: 8,
    heartbeat: Duration::from_millis(250),
    max_connections: 1024,
    max_sessions: 256,
    max_lanes: 16,
    max_connections_per_address: 256,
    max_connections_per_identity: 256,
    max_sessions_per_identity: 64,
    retry_threshold: 64,
    handshake_pool: 128,
    handshake_pool_per_source: 32,
    handshake_timeout: Duration::from_secs(2),
    start_wait: Duration::from_secs(20),
    export_ledgers_per_file: 1,
    export_files_per_partition: 64_000,
    export_zstd_level: 1,
    backfill_sessions: 4,
    backfill_prefetch: 8,
    upstream_lanes: 4,
    core_timeout: Duration::from_secs(5),
    core_max_request: 1 << 20,
    core_concurrency: 16,
};

// A pool's share of one source fits in the pool.
const _: () = assert!(DEFAULTS.handshake_pool_per_source <= DEFAULTS.handshake_pool);

/// How one default is shown in `--help` and in the docs' flag table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shown {
    /// The flag, without its dashes (`cadence`).
    pub flag: &'static str,
    /// The value in the flag's own grammar (`600ms`, `64GiB`, `zstd`, `10000`).
    pub value: String,
    /// What qualifies it, if anything (when the default is not this value).
    pub note: Option<String>,
}

impl Defaults {
    /// The default `--stale-after` for a source paced at `cadence`: `stale_cadences` of them,
    /// at least `min_paced_stale_after`.
    pub fn paced_stale_after(&self, cadence: Duration) -> Duration {
        cadence
            .saturating_mul(self.stale_cadences)
            .max(self.min_paced_stale_after)
    }

    /// Every default, flag by flag, as `--help` and the docs show it.
    pub fn shown(&self) -> Vec<Shown> {
        // No `..`: a default added to the table does not compile until it is shown.
        let Defaults {
            name,
            cadence,
            emit,
            retention,
            retention_bytes,
            scrub_rate,
            stale_after,
            stale_cadences,
            min_paced_stale_after,
            codec,
            zstd_level,
            chunk_size,
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
            export_ledgers_per_file,
            export_files_per_partition,
            export_zstd_level,
            backfill_sessions,
            backfill_prefetch,
            upstream_lanes,
            core_timeout,
            core_max_request,
            core_concurrency,
        } = *self;
        let lake_own = || Some("an existing lake's own".to_owned());
        let paced = format!(
            "file and synthetic sources: {stale_cadences} cadences, at least {}",
            format_duration(min_paced_stale_after)
        );
        vec![
            shown("name", name),
            shown("cadence", format_duration(cadence)),
            shown("emit", format_duration(emit)),
            shown("retention", retention),
            shown("retention-bytes", format_size(retention_bytes)),
            shown("scrub-rate", format_size(scrub_rate)),
            Shown {
                note: Some(paced),
                ..shown("stale-after", format_duration(stale_after))
            },
            shown("codec", codec.name()),
            shown("zstd-level", zstd_level),
            shown("chunk-size", format_size(u64::from(chunk_size))),
            shown("window", window),
            shown("heartbeat", format_duration(heartbeat)),
            shown("max-connections", max_connections),
            shown("max-sessions", max_sessions),
            shown("max-lanes", max_lanes),
            shown("max-connections-per-address", max_connections_per_address),
            shown("max-connections-per-identity", max_connections_per_identity),
            shown("max-sessions-per-identity", max_sessions_per_identity),
            shown("retry-threshold", retry_threshold),
            shown("handshake-pool", handshake_pool),
            shown("handshake-pool-per-source", handshake_pool_per_source),
            shown("handshake-timeout", format_duration(handshake_timeout)),
            shown("start-wait", format_duration(start_wait)),
            Shown {
                note: lake_own(),
                ..shown("export-ledgers-per-file", export_ledgers_per_file)
            },
            Shown {
                note: lake_own(),
                ..shown("export-files-per-partition", export_files_per_partition)
            },
            shown("export-zstd-level", export_zstd_level),
            shown("backfill-sessions", backfill_sessions),
            shown("backfill-prefetch", backfill_prefetch),
            shown("upstream-lanes", upstream_lanes),
            shown("core-timeout", format_duration(core_timeout)),
            shown("core-max-request", format_size(u64::from(core_max_request))),
            shown("core-concurrency", core_concurrency),
        ]
    }
}

fn shown(flag: &'static str, value: impl ToString) -> Shown {
    Shown {
        flag,
        value: value.to_string(),
        note: None,
    }
}

/// What appends [`default_tag`] to the help of each flag that has a default in [`DEFAULTS`]
/// (other flags are returned as they are); the table is shown once, not once per flag.
pub fn show_in_help() -> impl FnMut(clap::Arg) -> clap::Arg {
    let shown = DEFAULTS.shown();
    move |arg| {
        let Some(long) = arg.get_long() else {
            return arg;
        };
        let Some(d) = shown.iter().find(|d| d.flag == long) else {
            return arg;
        };
        let tag = default_tag(&d.value, d.note.as_deref());
        let with_tag = |help: &clap::builder::StyledStr| format!("{help} {tag}");
        let help = arg.get_help().map(with_tag).unwrap_or_else(|| tag.clone());
        let long_help = arg.get_long_help().map(with_tag);
        let arg = arg.help(help);
        match long_help {
            Some(long_help) => arg.long_help(long_help),
            None => arg,
        }
    }
}

#[cfg(test)]
mod tests;
