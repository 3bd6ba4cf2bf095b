//! The captive-core configuration file the SDK writes and passes with `--conf`: the keys of
//! stellar-core's two HTTP ports, read the way core reads them, every other key ignored.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;

use ledger_relay_wire::core_http::CorePort;

use super::CaptiveError;

/// stellar-core's command port when the file names none (`HTTP_PORT`; the SDK writes it
/// always, 11626 unless told otherwise).
pub const DEFAULT_HTTP_PORT: u16 = 11626;

/// What the `--conf` file says about core's HTTP ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoreConf {
    /// `HTTP_PORT`: the command port (`/tx`, `/info`); 0: not served. Default 11626.
    pub http_port: u16,
    /// `HTTP_QUERY_PORT`: the query server (`/getledgerentry`); 0 (core's default): not served.
    pub query_port: u16,
    /// `PUBLIC_HTTP_PORT`: listen on every interface (0.0.0.0) instead of 127.0.0.1.
    pub public: bool,
    /// `QUERY_SNAPSHOT_LEDGERS`: how many ledgers before the newest the RPC expects its core
    /// to answer for (logged with the advice for the source core; nothing is refused by it).
    pub query_snapshot_ledgers: Option<u32>,
}

impl Default for CoreConf {
    /// Core's defaults: the command port on 11626, no query server, localhost.
    fn default() -> Self {
        CoreConf {
            http_port: DEFAULT_HTTP_PORT,
            query_port: 0,
            public: false,
            query_snapshot_ledgers: None,
        }
    }
}

impl CoreConf {
    /// No port served: what a stand-in started without `--conf` does.
    pub fn off() -> CoreConf {
        CoreConf {
            http_port: 0,
            ..CoreConf::default()
        }
    }

    /// Reads `path`.
    pub fn load(path: &Path) -> Result<CoreConf, CaptiveError> {
        let text = std::fs::read_to_string(path).map_err(|source| CaptiveError::Io {
            what: format!("cannot read the core config {}", path.display()),
            source,
        })?;
        CoreConf::parse(&text)
            .map_err(|e| CaptiveError::Settings(format!("core config {}: {e}", path.display())))
    }

    /// Parses the file's text: TOML, as the SDK writes it; keys other than the HTTP ones
    /// (quorum set, validators, history, ...) are not looked at.
    pub fn parse(text: &str) -> Result<CoreConf, String> {
        let table: toml::Table = toml::from_str(text).map_err(|e| format!("not TOML: {e}"))?;
        let mut conf = CoreConf::default();
        if let Some(v) = port(&table, "HTTP_PORT")? {
            conf.http_port = v;
        }
        if let Some(v) = port(&table, "HTTP_QUERY_PORT")? {
            conf.query_port = v;
        }
        match table.get("PUBLIC_HTTP_PORT") {
            None => {}
            Some(toml::Value::Boolean(b)) => conf.public = *b,
            Some(other) => return Err(format!("PUBLIC_HTTP_PORT = {other} is not true or false")),
        }
        conf.query_snapshot_ledgers = match table.get("QUERY_SNAPSHOT_LEDGERS") {
            None => None,
            Some(v) => Some(
                v.as_integer()
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| format!("QUERY_SNAPSHOT_LEDGERS = {v} is not a count"))?,
            ),
        };
        if conf.http_port != 0 && conf.http_port == conf.query_port {
            return Err(format!(
                "HTTP_PORT and HTTP_QUERY_PORT are both {} (core needs two ports)",
                conf.http_port
            ));
        }
        Ok(conf)
    }

    /// Where to listen: each non-zero port, on 127.0.0.1, or on 0.0.0.0 with
    /// `PUBLIC_HTTP_PORT = true` (as core binds both).
    pub fn listen_addrs(&self) -> Vec<(CorePort, SocketAddr)> {
        let ip: IpAddr = if self.public {
            Ipv4Addr::UNSPECIFIED.into()
        } else {
            Ipv4Addr::LOCALHOST.into()
        };
        [
            (CorePort::Command, self.http_port),
            (CorePort::Query, self.query_port),
        ]
        .into_iter()
        .filter(|(_, p)| *p != 0)
        .map(|(which, p)| (which, SocketAddr::new(ip, p)))
        .collect()
    }
}

fn port(table: &toml::Table, key: &str) -> Result<Option<u16>, String> {
    match table.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_integer()
            .and_then(|n| u16::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| format!("{key} = {v} is not a port")),
    }
}
