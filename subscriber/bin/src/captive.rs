//! `ledger-captive-core`: a stand-in for the stellar-core binary that the Go SDK's
//! `CaptiveStellarCore` (`ingest/ledgerbackend`, used by stellar-rpc, Horizon and Galexie)
//! starts. Set it as the SDK's core binary path and the SDK's ledgers come from relays instead
//! of a core replaying history: same commands, same record-marked stream on `fd:3`, every
//! ledger verified as `ledger-subscribe` verifies it.
//!
//! The commands the SDK (go-stellar-sdk v0.7.3) builds, and what this stand-in does with each
//! (docs/rpc.md has the table):
//! - `version`: a first line `vX.Y.Z-...` and `ledger protocol version: N`, N the protocol of
//!   the last ledger streamed (never below 23, the lowest the SDK accepts).
//! - `--conf FILE [--console]` before every other command: accepted. `run` and `catchup` with a
//!   stream read core's HTTP ports from FILE ([`CoreConf`]: `HTTP_PORT`, `HTTP_QUERY_PORT`,
//!   `PUBLIC_HTTP_PORT`) and serve them while they stream ([`http`]); the relay settings come
//!   from [`Settings`].
//! - `new-db`: forgets the last closed ledger (it becomes 1, as in a fresh core database).
//! - `offline-info`: core's info JSON with the last closed ledger; fails when there is none.
//! - `catchup TO/0`: records TO as the last closed ledger (the ledger after it is where `run`
//!   starts).
//! - `catchup TO/COUNT --metadata-output-stream fd:N`: streams from the first ledger of the
//!   checkpoint holding `TO-COUNT+1` (where core's replay starts, and where the SDK expects
//!   the stream to start) to TO, then exits 0.
//! - `run --metadata-output-stream fd:N [--start-at-ledger S --start-at-hash H]`: streams from
//!   the ledger after the last closed one (or S), anchored to its hash when known, until
//!   SIGINT or SIGTERM, recording each ledger as the last closed one.
//!
//! A stream with no hash to start from (a catch-up, or a `run` after `new-db` or `catchup
//! TO/0`) is anchored to the `anchor` setting (`SEQ:HASH`, a trusted ledger) when it is given,
//! see [`anchored_start`]; without it, the first ledger the relays send is trusted (every
//! ledger after it is checked against the one before).
//!
//! The state (the last closed ledger, its hash and its protocol) is a small file in the working
//! directory, which the SDK sets to its storage path, as core keeps its database there.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use ledger_relay_transport::parse_duration;

use ledger_relay_subscriber::config::{Anchor, Credentials, RelayAddr, SubscribeConfig};
use ledger_relay_subscriber::core_http::{CoreClient, CoreClientConfig, CoreClientError};
use ledger_relay_subscriber::error::SubscribeError;

mod conf;
pub mod http;
mod run;
pub use conf::{CoreConf, DEFAULT_HTTP_PORT};
pub use http::{HttpOptions, HttpServers};
pub use run::{stream, Serve, StreamEnd};

/// The environment variable naming the settings file.
pub const CONFIG_ENV: &str = "LEDGER_CAPTIVE_CORE_CONFIG";
/// The settings file read when [`CONFIG_ENV`] is not set.
pub const DEFAULT_CONFIG: &str = "/etc/ledger-relay/captive-core.toml";
/// Prefix of the environment variables that override single settings
/// (`LEDGER_CAPTIVE_CORE_RELAY`, `..._CERTS`, `..._NAME`, ...).
pub const ENV_PREFIX: &str = "LEDGER_CAPTIVE_CORE_";
/// The state file, in the working directory.
pub const STATE_FILE: &str = "ledger-captive-core.state";
/// The lowest ledger protocol the Go SDK accepts from `version` (go-stellar-sdk v0.7.3's
/// `minProtocolVersionSupported`): reported when no ledger was streamed yet, and the floor of
/// what is reported otherwise (unless `protocol_version` says otherwise).
pub const DEFAULT_PROTOCOL_VERSION: u32 = 23;
/// Where the SDK's runner keeps core's working directory under its storage path, which is
/// the service's own working directory unless configured: `version`, run from there, looks
/// for the state in this subdirectory too.
pub const SDK_WORKING_DIR: &str = "captive-core";

/// Why the stand-in failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CaptiveError {
    /// The command line is not one the stand-in answers.
    #[error("unsupported command line: {0}")]
    Usage(String),
    /// The settings are missing or wrong.
    #[error("settings: {0}")]
    Settings(String),
    /// `offline-info` or `run` without a database (core says the same before `new-db`).
    #[error("no database in {0}: run new-db first")]
    NoDatabase(PathBuf),
    /// Reading or writing the state file, or opening the metadata stream, failed.
    #[error("{what}")]
    Io {
        /// What was being done.
        what: String,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },
    /// The stream would start before the trusted ledger of the `anchor` setting: its first
    /// ledgers could only be checked once the anchor's arrived, after they were written.
    #[error(
        "ledger {start} is before the anchor {anchor}: ledgers are checked against the ones \
         before them, so the anchor must be at or below ledger {}",
        u64::from(*.start).saturating_sub(1)
    )]
    BeforeAnchor {
        /// The first ledger the stream would write.
        start: u32,
        /// The anchor's sequence.
        anchor: u32,
    },
    /// The subscription failed.
    #[error(transparent)]
    Subscribe(#[from] SubscribeError),
    /// The client for stellar-core's ports could not be set up.
    #[error("requests for stellar-core")]
    CoreClient(#[from] CoreClientError),
}

impl CaptiveError {
    /// Exit code, as `ledger-subscribe`'s: 3 authorization, 4 below retention, else 2 (core's
    /// runner only looks at non-zero).
    pub fn exit_code(&self) -> u8 {
        match self {
            CaptiveError::Subscribe(e) => e.exit_code(),
            _ => 2,
        }
    }
}

/// One command line, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// `version`.
    Version,
    /// `new-db`.
    NewDb,
    /// `offline-info`.
    OfflineInfo,
    /// `catchup TO/COUNT`, with the metadata stream's file descriptor when given.
    Catchup {
        /// The last ledger.
        to: u32,
        /// How many ledgers up to `to` (0: none, only set the last closed ledger).
        count: u32,
        /// `--metadata-output-stream fd:N`.
        stream: Option<i32>,
        /// `--conf FILE`: core's config, for its HTTP ports.
        conf: Option<PathBuf>,
    },
    /// `run`.
    Run {
        /// `--metadata-output-stream fd:N`.
        stream: Option<i32>,
        /// `--conf FILE`: core's config, for its HTTP ports.
        conf: Option<PathBuf>,
        /// `--start-at-ledger`.
        start_at: Option<u32>,
        /// `--start-at-hash`.
        start_hash: Option<[u8; 32]>,
    },
}

/// Parses the arguments after the program name. Options core takes are accepted anywhere;
/// `--conf FILE` matters to `run` and `catchup` (core's HTTP ports), `--console`,
/// `--in-memory` and `--ll LEVEL` change nothing here.
pub fn parse_args(args: &[String]) -> Result<Command, CaptiveError> {
    let usage = || CaptiveError::Usage(args.join(" "));
    let mut words = Vec::new();
    let mut flags: HashMap<&str, &str> = HashMap::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--console" | "--in-memory" => {}
            "--conf"
            | "--ll"
            | "--metadata-output-stream"
            | "--start-at-ledger"
            | "--start-at-hash" => {
                let value = it.next().ok_or_else(usage)?;
                flags.insert(arg.as_str(), value.as_str());
            }
            flag if flag.starts_with("--") => return Err(usage()),
            word => words.push(word),
        }
    }
    let stream = flags
        .get("--metadata-output-stream")
        .map(|s| parse_fd(s).ok_or_else(usage))
        .transpose()?;
    let conf = flags.get("--conf").map(PathBuf::from);
    match words.as_slice() {
        ["version"] => Ok(Command::Version),
        ["new-db"] => Ok(Command::NewDb),
        ["offline-info"] => Ok(Command::OfflineInfo),
        ["catchup", range] => {
            let (to, count) = range.split_once('/').ok_or_else(usage)?;
            Ok(Command::Catchup {
                to: to.parse().map_err(|_| usage())?,
                count: count.parse().map_err(|_| usage())?,
                stream,
                conf,
            })
        }
        ["run"] => {
            let start_at = flags
                .get("--start-at-ledger")
                .map(|s| s.parse().map_err(|_| usage()))
                .transpose()?;
            let start_hash = flags
                .get("--start-at-hash")
                .map(|s| parse_hash(s).ok_or_else(usage))
                .transpose()?;
            Ok(Command::Run {
                stream,
                conf,
                start_at,
                start_hash,
            })
        }
        _ => Err(usage()),
    }
}

fn parse_fd(s: &str) -> Option<i32> {
    s.strip_prefix("fd:")?.parse().ok().filter(|fd| *fd >= 0)
}

fn parse_hash(s: &str) -> Option<[u8; 32]> {
    Anchor::from_str(&format!("1:{s}")).ok().map(|a| a.hash)
}

/// The first ledger core's catch-up to `first` streams: the first ledger of the checkpoint
/// holding it (checkpoints end at multiples of `frequency`, minus one), and never ledger 1.
pub fn checkpoint_start(first: u32, frequency: u32) -> u32 {
    let frequency = frequency.max(1);
    ((first / frequency) * frequency).max(2)
}

/// What `catchup TO/COUNT` with a metadata stream streams: the first ledger (the checkpoint
/// start of `TO-COUNT+1`, see [`checkpoint_start`]) and how many ledgers up to TO.
pub fn catchup_range(to: u32, count: u32, frequency: u32) -> Result<(u32, u64), CaptiveError> {
    if to < 2 || count == 0 {
        return Err(CaptiveError::Usage(format!(
            "catchup {to}/{count}: nothing to stream (ledger 1 is never streamed)"
        )));
    }
    let first = to.saturating_sub(count - 1).max(2);
    let start = checkpoint_start(first, frequency);
    Ok((start, u64::from(to - start) + 1))
}

/// Where `run` starts, and the ledger it must link to: after `--start-at-ledger S` (anchored
/// to `--start-at-hash`), else after the last closed ledger (anchored to its hash when known).
pub fn run_start(
    state: State,
    start_at: Option<u32>,
    start_hash: Option<[u8; 32]>,
) -> Result<(u32, Option<Anchor>), CaptiveError> {
    let (seq, hash) = match start_at {
        Some(seq) => (seq, start_hash),
        None => (state.ledger, state.hash),
    };
    let from = seq
        .checked_add(1)
        .ok_or_else(|| CaptiveError::Usage(format!("no ledger after {seq}")))?;
    Ok((from.max(2), hash.map(|hash| Anchor { seq, hash })))
}

/// Where a stream subscribes from, the ledger it is anchored to, and the first ledger it
/// writes (the ones before it are verified and not written).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamStart {
    /// The subscription's start.
    pub from: u32,
    /// The trusted ledger the first one is checked against.
    pub anchor: Option<Anchor>,
    /// The first ledger written to the metadata stream.
    pub write_from: u32,
}

/// How a stream that writes from ledger `start` is anchored: to `own` (the hash of the last
/// closed ledger, or `--start-at-hash`) when it has one; else to `trusted` (the `anchor`
/// setting): directly when it is ledger `start` or the one before, by verifying the ledgers
/// between it and `start` without writing them when it is older; never when it is newer
/// ([`CaptiveError::BeforeAnchor`]). With neither, the relays' first ledger is trusted.
pub fn anchored_start(
    start: u32,
    own: Option<Anchor>,
    trusted: Option<Anchor>,
) -> Result<StreamStart, CaptiveError> {
    let plain = |anchor| StreamStart {
        from: start,
        anchor,
        write_from: start,
    };
    let Some(t) = trusted.filter(|_| own.is_none()) else {
        return Ok(plain(own));
    };
    if start < t.seq {
        return Err(CaptiveError::BeforeAnchor {
            start,
            anchor: t.seq,
        });
    }
    if u64::from(start) <= u64::from(t.seq) + 1 {
        return Ok(plain(Some(t)));
    }
    Ok(StreamStart {
        from: t.seq + 1,
        anchor: Some(t),
        write_from: start,
    })
}

/// Relay settings: the file [`CONFIG_ENV`] names (else [`DEFAULT_CONFIG`]), then the
/// environment ([`ENV_PREFIX`] + the upper-case key) over it.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// Relays in order of preference (`ledger-subscribe --relay`).
    #[serde(default)]
    pub relay: Vec<String>,
    /// Certificate directory (`--certs`).
    pub certs: Option<PathBuf>,
    /// Certificate name (`--name`).
    pub name: Option<String>,
    /// Subscribe to every relay at once (`--hedge`).
    pub hedge: Option<bool>,
    /// Lanes per relay (`--lanes`).
    pub lanes: Option<u8>,
    /// TLS name of the relays (`--server-name`).
    pub server_name: Option<String>,
    /// Give up when no relay answers for this long at the start (`--connect-timeout`).
    pub connect_timeout: Option<String>,
    /// Ledgers per history checkpoint (64 on every public network).
    pub checkpoint_frequency: Option<u32>,
    /// The protocol `version` reports; unset: the last streamed ledger's (at least 23).
    pub protocol_version: Option<u32>,
    /// How long a query for a ledger newer than the last one written waits for it (default
    /// [`DEFAULT_QUERY_WAIT`]).
    pub query_wait: Option<String>,
    /// How long a request to core's ports may take in all (default [`DEFAULT_CORE_TIMEOUT`]).
    pub core_timeout: Option<String>,
    /// A trusted ledger, `SEQ:HASH` (`ledger-subscribe --anchor`'s grammar), that a stream
    /// with no hash of its own to start from (after `new-db` or `catchup TO/0`, or `run
    /// --start-at-ledger` without `--start-at-hash`) is checked against: see
    /// [`anchored_start`]. Without it such a stream trusts the relays' first ledger.
    pub anchor: Option<String>,
}

/// Default of [`Settings::query_wait`]: well under stellar-rpc's 2 s client timeout.
pub const DEFAULT_QUERY_WAIT: std::time::Duration = std::time::Duration::from_secs(1);
/// Default of [`Settings::core_timeout`]: stellar-rpc's own client timeout
/// (`STELLAR_CORE_TIMEOUT`).
pub const DEFAULT_CORE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// How long the stand-in's answers may take ([`Settings::waits`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waits {
    /// Any request in all (`core_timeout`).
    pub core_timeout: std::time::Duration,
    /// A query for a ledger not written yet (`query_wait`).
    pub query_wait: std::time::Duration,
}

/// The settings with a default of their own, by key: what `docs/operations.md`'s table of the
/// stand-in's settings states (a test compares them).
pub const DEFAULTS: [(&str, std::time::Duration); 2] = [
    ("query_wait", DEFAULT_QUERY_WAIT),
    ("core_timeout", DEFAULT_CORE_TIMEOUT),
];

impl Settings {
    /// Reads the settings: the file, then the environment `env` over it.
    pub fn load(env: &HashMap<String, String>) -> Result<Settings, CaptiveError> {
        let explicit = env.get(CONFIG_ENV).filter(|p| !p.is_empty());
        let path = PathBuf::from(explicit.map_or(DEFAULT_CONFIG, String::as_str));
        let mut settings = match std::fs::read_to_string(&path) {
            Ok(text) => toml::from_str(&text)
                .map_err(|e| CaptiveError::Settings(format!("{}: {e}", path.display())))?,
            // No file is fine when the environment gives everything.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && explicit.is_none() => {
                Settings::default()
            }
            Err(source) => {
                return Err(CaptiveError::Io {
                    what: format!("cannot read settings {}", path.display()),
                    source,
                })
            }
        };
        settings.apply_env(env)?;
        Ok(settings)
    }

    fn apply_env(&mut self, env: &HashMap<String, String>) -> Result<(), CaptiveError> {
        for (key, value) in env {
            let Some(name) = key.strip_prefix(ENV_PREFIX) else {
                continue;
            };
            let bad = |what: &str| CaptiveError::Settings(format!("{key}={value}: {what}"));
            match name {
                "CONFIG" => {}
                _ if value.is_empty() => {}
                "RELAY" => self.relay = value.split(',').map(str::to_owned).collect(),
                "CERTS" => self.certs = Some(value.into()),
                "NAME" => self.name = Some(value.clone()),
                "HEDGE" => self.hedge = Some(value.parse().map_err(|_| bad("true or false"))?),
                "LANES" => self.lanes = Some(value.parse().map_err(|_| bad("1 to 64"))?),
                "SERVER_NAME" => self.server_name = Some(value.clone()),
                "CONNECT_TIMEOUT" => self.connect_timeout = Some(value.clone()),
                "CHECKPOINT_FREQUENCY" => {
                    self.checkpoint_frequency = Some(value.parse().map_err(|_| bad("a number"))?)
                }
                "PROTOCOL_VERSION" => {
                    self.protocol_version = Some(value.parse().map_err(|_| bad("a number"))?)
                }
                "QUERY_WAIT" => self.query_wait = Some(value.clone()),
                "CORE_TIMEOUT" => self.core_timeout = Some(value.clone()),
                "ANCHOR" => self.anchor = Some(value.clone()),
                _ => return Err(bad("unknown setting")),
            }
        }
        Ok(())
    }

    /// Ledgers per checkpoint.
    pub fn checkpoint_frequency(&self) -> u32 {
        self.checkpoint_frequency.unwrap_or(64)
    }

    /// The protocol `version` and `offline-info` report: the setting if given, else the
    /// protocol of the last ledger streamed (`state`), never below
    /// [`DEFAULT_PROTOCOL_VERSION`] (the SDK refuses a core below it).
    pub fn protocol_version(&self, state: Option<&State>) -> u32 {
        self.protocol_version.unwrap_or_else(|| {
            state
                .and_then(|s| s.protocol)
                .unwrap_or(DEFAULT_PROTOCOL_VERSION)
                .max(DEFAULT_PROTOCOL_VERSION)
        })
    }

    fn duration(
        value: &Option<String>,
        key: &str,
        default: std::time::Duration,
    ) -> Result<std::time::Duration, CaptiveError> {
        let Some(text) = value else {
            return Ok(default);
        };
        let d = parse_duration(text)
            .map_err(|e| CaptiveError::Settings(format!("{key} {text}: {e}")))?;
        if d.is_zero() {
            return Err(CaptiveError::Settings(format!(
                "{key} {text}: must be positive"
            )));
        }
        Ok(d)
    }

    /// `core_timeout` and `query_wait`, checked, or their defaults.
    pub fn waits(&self) -> Result<Waits, CaptiveError> {
        Ok(Waits {
            core_timeout: Self::duration(&self.core_timeout, "core_timeout", DEFAULT_CORE_TIMEOUT)?,
            query_wait: Self::duration(&self.query_wait, "query_wait", DEFAULT_QUERY_WAIT)?,
        })
    }

    /// How core's ports are answered: requests go to the relays of `config` (the
    /// subscription's), bounded by `core_timeout`, queries wait up to `query_wait`.
    pub fn http_options(&self, config: &SubscribeConfig) -> Result<HttpOptions, CaptiveError> {
        let Waits {
            core_timeout,
            query_wait,
        } = self.waits()?;
        let mut client = CoreClientConfig::from_subscription(config);
        client.timeout = core_timeout;
        Ok(HttpOptions {
            client: CoreClient::new(client)?,
            query_wait,
            core_timeout,
            max_request: config.limits.max_core_request,
        })
    }

    /// The trusted ledger of the `anchor` setting, if set.
    pub fn anchor(&self) -> Result<Option<Anchor>, CaptiveError> {
        self.anchor
            .as_deref()
            .map(|a| {
                a.parse::<Anchor>()
                    .map_err(|e| CaptiveError::Settings(format!("anchor: {e}")))
            })
            .transpose()
    }

    /// The subscription these settings describe, from `from`, anchored to `anchor`.
    pub fn subscription(
        &self,
        from: u32,
        anchor: Option<Anchor>,
    ) -> Result<SubscribeConfig, CaptiveError> {
        let missing = |what: &str| {
            CaptiveError::Settings(format!(
                "{what} not set (in {CONFIG_ENV}'s file or {ENV_PREFIX}{})",
                what.to_uppercase()
            ))
        };
        if self.relay.is_empty() {
            return Err(missing("relay"));
        }
        let relays = self
            .relay
            .iter()
            .map(|r| {
                r.trim()
                    .parse::<RelayAddr>()
                    .map_err(|e| CaptiveError::Settings(format!("relay {r}: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let certs = self.certs.as_deref().ok_or_else(|| missing("certs"))?;
        let name = self.name.as_deref().ok_or_else(|| missing("name"))?;
        let mut config = SubscribeConfig::new(relays, Credentials::from_cert_dir(certs, name)?);
        config.start = ledger_relay_wire::frame::Start::Seq(from);
        config.anchor = anchor;
        config.hedge = self.hedge.unwrap_or(false);
        config.lanes = self.lanes.unwrap_or(config.lanes);
        config.server_name.clone_from(&self.server_name);
        let timeout = match &self.connect_timeout {
            Some(t) => parse_duration(t)
                .map_err(|e| CaptiveError::Settings(format!("connect_timeout {t}: {e}")))?,
            None => crate::cli::DEFAULT_CONNECT_TIMEOUT,
        };
        config.first_connect_timeout = Some(timeout);
        config.validate()?;
        Ok(config)
    }
}

/// The last closed ledger, as the stand-in's "database" holds it.
///
/// On disk: one line, `LEDGER [HASH] [protocol=N]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct State {
    /// Its sequence (1 after `new-db`).
    pub ledger: u32,
    /// Its header hash, once a ledger was streamed.
    pub hash: Option<[u8; 32]>,
    /// The ledger protocol (`ledgerVersion`) of the last ledger streamed; kept across
    /// `new-db` and `catchup TO/0`, which move the position but not the network.
    pub protocol: Option<u32>,
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.ledger)?;
        if let Some(h) = self.hash {
            write!(f, " {}", ledger_relay_wire::Hex(&h))?;
        }
        if let Some(p) = self.protocol {
            write!(f, " protocol={p}")?;
        }
        Ok(())
    }
}

impl State {
    /// Reads `dir`'s state; `None` when there is no database.
    pub fn load(dir: &Path) -> Result<Option<State>, CaptiveError> {
        let path = dir.join(STATE_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(CaptiveError::Io {
                    what: format!("cannot read {}", path.display()),
                    source,
                })
            }
        };
        let damaged = || CaptiveError::Settings(format!("{} is damaged: {text:?}", path.display()));
        let mut parts = text.split_whitespace();
        let ledger = parts
            .next()
            .and_then(|s| s.parse().ok())
            .ok_or_else(damaged)?;
        let mut state = State {
            ledger,
            hash: None,
            protocol: None,
        };
        for part in parts {
            match part.strip_prefix("protocol=") {
                Some(p) if state.protocol.is_none() => {
                    state.protocol = Some(p.parse().map_err(|_| damaged())?)
                }
                None if state.hash.is_none() && state.protocol.is_none() => {
                    state.hash = Some(parse_hash(part).ok_or_else(damaged)?)
                }
                _ => return Err(damaged()),
            }
        }
        Ok(Some(state))
    }

    /// The state `version` reports from: in the working directory, else in the SDK's
    /// working directory under it ([`SDK_WORKING_DIR`]), where it is when the service runs
    /// from its captive-core storage path (stellar-rpc's default). `None` when neither has one
    /// or it cannot be read.
    pub fn find(dir: &Path) -> Option<State> {
        [dir.to_path_buf(), dir.join(SDK_WORKING_DIR)]
            .iter()
            .find_map(|d| State::load(d).ok().flatten())
    }

    /// This state at another position: `ledger`, with no hash (nothing streamed there),
    /// keeping the protocol (`new-db` and `catchup TO/0` move the position, not the network).
    pub fn moved_to(self, ledger: u32) -> State {
        State {
            ledger,
            hash: None,
            protocol: self.protocol,
        }
    }

    /// Records `ledger` as the last closed one in `dir` ([`State::moved_to`]; a missing or
    /// unreadable state is replaced).
    pub fn move_to(dir: &Path, ledger: u32) -> Result<(), CaptiveError> {
        let fresh = State {
            ledger,
            hash: None,
            protocol: None,
        };
        let old = State::load(dir).ok().flatten();
        old.map_or(fresh, |s| s.moved_to(ledger)).save(dir)
    }

    /// Writes it to `dir`, atomically (a temporary file renamed over the old one).
    pub fn save(&self, dir: &Path) -> Result<(), CaptiveError> {
        let path = dir.join(STATE_FILE);
        let tmp = dir.join(format!("{STATE_FILE}.tmp"));
        std::fs::write(&tmp, format!("{self}\n"))
            .and_then(|()| std::fs::rename(&tmp, &path))
            .map_err(|source| CaptiveError::Io {
                what: format!("cannot write {}", path.display()),
                source,
            })
    }

    /// Core's `offline-info` JSON for it (the fields the SDK reads: `info.ledger.num`).
    pub fn info_json(&self, build: &str, protocol: u32) -> String {
        let hash = self
            .hash
            .map(|h| ledger_relay_wire::Hex(&h).to_string())
            .unwrap_or_default();
        format!(
            "{{\"info\":{{\"build\":\"{build}\",\"protocol_version\":{protocol},\"state\":\"Catching up\",\"ledger\":{{\"num\":{},\"hash\":\"{hash}\",\"version\":{protocol}}}}}}}\n",
            self.ledger
        )
    }
}

/// `version`'s output: core's first line (`vX.Y.Z-...`) and the protocol line the SDK parses.
pub fn version_text(protocol: u32) -> String {
    format!(
        "v{protocol}.0.0-ledger-captive-core-{}\nledger protocol version: {protocol}\nrelayed by ledger-relay {}: ledgers are not applied here\n",
        env!("CARGO_PKG_VERSION"),
        env!("CARGO_PKG_VERSION")
    )
}

#[cfg(test)]
mod tests;
