//! What a subscription needs: relays, credentials, start, lanes, limits and timeouts.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use ledger_relay_wire::frame::Start;
use ledger_relay_wire::{Codec, Limits};
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer, ServerName};

use crate::backoff::BackoffConfig;
use crate::error::SubscribeError;
use ledger_relay_transport::TransportSettings;

/// Most lanes a session may have (`SessionOpen.lanes`, counting lane 0).
pub const MAX_LANES: u8 = 64;

/// A relay's address as configured: a host (DNS name or IP literal) and a port.
///
/// The host is resolved at each connection attempt, so a relay behind a DNS name that moves is
/// followed, and it is the default TLS server name checked against the relay's certificate.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RelayAddr {
    host: String,
    port: u16,
}

impl RelayAddr {
    /// A relay at `host` (a DNS name or an IP literal, IPv6 without brackets) and `port`.
    pub fn new(host: impl Into<String>, port: u16) -> RelayAddr {
        RelayAddr {
            host: host.into(),
            port,
        }
    }

    /// The host part: the default server name.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The address, if the host is an IP literal.
    pub fn socket_addr(&self) -> Option<SocketAddr> {
        self.host
            .parse::<IpAddr>()
            .ok()
            .map(|ip| SocketAddr::new(ip, self.port))
    }

    /// Resolves the host (no lookup for an IP literal); the first address wins.
    pub async fn resolve(&self) -> std::io::Result<SocketAddr> {
        if let Some(addr) = self.socket_addr() {
            return Ok(addr);
        }
        tokio::net::lookup_host((self.host.as_str(), self.port))
            .await?
            .next()
            .ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!("{} has no address", self.host),
                )
            })
    }
}

impl fmt::Display for RelayAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

impl From<SocketAddr> for RelayAddr {
    fn from(addr: SocketAddr) -> Self {
        RelayAddr::new(addr.ip().to_string(), addr.port())
    }
}

/// A relay address or a start that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} {input:?}: {reason}")]
pub struct ParseError {
    /// What was being parsed (`relay address`, `start`).
    pub what: &'static str,
    /// The text given.
    pub input: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl FromStr for RelayAddr {
    type Err = ParseError;

    /// Parses `host:port`, `1.2.3.4:port` or `[v6]:port`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let err = |reason| ParseError {
            what: "relay address",
            input: s.to_owned(),
            reason,
        };
        if let Ok(addr) = s.parse::<SocketAddr>() {
            return Ok(addr.into());
        }
        let (host, port) = s
            .rsplit_once(':')
            .ok_or_else(|| err("no port (expected HOST:PORT)"))?;
        let port: u16 = port.parse().map_err(|_| err("invalid port"))?;
        if host.contains(':') {
            // Bracketed IPv6 literals parsed as a SocketAddr above; anything else with a
            // colon is ambiguous.
            return Err(err("write an IPv6 address as [ADDR]:PORT"));
        }
        if host.is_empty() {
            return Err(err("no host"));
        }
        if ServerName::try_from(host).is_err() {
            return Err(err("the host is not a valid DNS name or IP address"));
        }
        Ok(RelayAddr::new(host, port))
    }
}

/// Parses a comma-separated list of relay addresses, in order of preference.
pub fn parse_relay_list(s: &str) -> Result<Vec<RelayAddr>, ParseError> {
    let relays = s
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(RelayAddr::from_str)
        .collect::<Result<Vec<_>, _>>()?;
    if relays.is_empty() {
        return Err(ParseError {
            what: "relay list",
            input: s.to_owned(),
            reason: "no relay address",
        });
    }
    Ok(relays)
}

/// Parses a start: `tip` or a ledger sequence (non-zero).
pub fn parse_start(s: &str) -> Result<Start, ParseError> {
    let err = |reason| ParseError {
        what: "start",
        input: s.to_owned(),
        reason,
    };
    if s.eq_ignore_ascii_case("tip") {
        return Ok(Start::Tip);
    }
    match s.parse::<u32>() {
        Ok(0) => Err(err("ledger sequence 0 names no ledger")),
        Ok(seq) => Ok(Start::Seq(seq)),
        Err(_) => Err(err("neither `tip` nor a ledger sequence")),
    }
}

/// A trusted ledger: its sequence and header hash, from a history archive or a previous run.
///
/// It makes the subscription's first ledger verified too, not only the ones after it
/// (`docs/protocol.md` section 4, layer 5): the subscription must start at `seq` or `seq + 1`.
/// Starting at `seq`, the first ledger must be ledger `seq` and hash to `hash`; starting at
/// `seq + 1`, the first ledger must link to `hash` (the resume after a previous run). Any other
/// start is refused by [`SubscribeConfig::validate`]: hashes link each ledger to the one before,
/// so a ledger before `seq` could only be checked once `seq` arrived, after it had been
/// delivered, and a start after `seq + 1` leaves ledgers between the anchor and the start that
/// would have to be fetched to link them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Anchor {
    /// The ledger's sequence.
    pub seq: u32,
    /// Its header hash (`LedgerHeaderHistoryEntry.hash`, the sha256 of its `LedgerHeader`).
    pub hash: [u8; 32],
}

impl fmt::Display for Anchor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.seq, ledger_relay_wire::Hex(&self.hash))
    }
}

impl FromStr for Anchor {
    type Err = ParseError;

    /// Parses `SEQ:HASH`, HASH the 64 hex digits of the ledger's header hash (the grammar is
    /// [`ledger_relay_wire::header::parse_anchor`]'s, shared with the relay's
    /// `--upstream-anchor`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (seq, hash) =
            ledger_relay_wire::header::parse_anchor(s).map_err(|reason| ParseError {
                what: "anchor",
                input: s.to_owned(),
                reason,
            })?;
        Ok(Anchor { seq, hash })
    }
}

/// The subscriber's TLS identity and trust anchors.
pub struct Credentials {
    /// CA certificates the relay's certificate must chain to.
    pub ca: Vec<CertificateDer<'static>>,
    /// Certificate revocation lists the relay's certificate is checked against (empty: none):
    /// a relay whose certificate they revoke is refused ([`crate::AuthReason::RelayRevoked`]).
    pub crls: Vec<CertificateRevocationListDer<'static>>,
    /// Our certificate chain, leaf first.
    pub cert_chain: Vec<CertificateDer<'static>>,
    /// Our private key.
    pub key: PrivateKeyDer<'static>,
}

impl Credentials {
    /// Loads the CA certificates, our certificate chain and our key from PEM files (no CRL).
    pub fn load(ca: &Path, cert: &Path, key: &Path) -> Result<Credentials, SubscribeError> {
        Ok(Credentials {
            ca: ledger_relay_certs::load_certs(ca)?,
            crls: Vec::new(),
            cert_chain: ledger_relay_certs::load_certs(cert)?,
            key: ledger_relay_certs::load_key(key)?,
        })
    }

    /// Loads `DIR/ca.pem`, `DIR/NAME.pem`, `DIR/NAME.key` and, when present, `DIR/crl.pem`
    /// (the layout `ledger-certs` writes). A `crl.pem` that is there but cannot be read or is
    /// not a PEM CRL is an error, not "no revocations".
    pub fn from_cert_dir(dir: &Path, name: &str) -> Result<Credentials, SubscribeError> {
        let mut c = Credentials::load(
            &dir.join("ca.pem"),
            &dir.join(format!("{name}.pem")),
            &dir.join(format!("{name}.key")),
        )?;
        let crl = dir.join("crl.pem");
        match std::fs::symlink_metadata(&crl) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            _ => c.crls = ledger_relay_certs::load_crls(&crl)?,
        }
        Ok(c)
    }
}

impl Clone for Credentials {
    fn clone(&self) -> Self {
        Credentials {
            ca: self.ca.clone(),
            crls: self.crls.clone(),
            cert_chain: self.cert_chain.clone(),
            key: self.key.clone_key(),
        }
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("ca", &self.ca.len())
            .field("crls", &self.crls.len())
            .field("cert_chain", &self.cert_chain.len())
            .field("key", &"<redacted>")
            .finish()
    }
}

/// Everything a subscription needs. [`SubscribeConfig::new`] fills in the defaults.
#[derive(Debug, Clone)]
pub struct SubscribeConfig {
    /// Relays in order of preference. The first is tried first; on each failure the next one
    /// is (round robin), with the hash chain checked across the switch.
    pub relays: Vec<RelayAddr>,
    /// CA, certificate and key.
    pub credentials: Credentials,
    /// TLS server name the relays' certificates must be valid for. `None` (default): the host
    /// part of each relay's address, a DNS name or an IP literal.
    pub server_name: Option<String>,
    /// Where to start (default: the tip). On a resume the subscriber asks for the last
    /// delivered ledger + 1 instead.
    pub start: Start,
    /// A trusted ledger the subscription starts from (default none): see [`Anchor`]. With an
    /// anchor, `start` must be `Start::Seq(anchor.seq)` or `Start::Seq(anchor.seq + 1)`.
    pub anchor: Option<Anchor>,
    /// Check every ledger's transaction set and results against its header's `txSetHash` and
    /// `txSetResultHash` (default true). It costs about 3 to 5 ms of CPU per 14.5 MiB ledger
    /// (`bench/RESULTS.md`, "Content check"); off, a relay can alter transactions and results
    /// without the subscriber noticing, and only the header chain is checked.
    pub content_check: bool,
    /// Receive-only, a bench mode that does **not** verify content (default false): chunks
    /// are not decompressed, and neither the checksum, the hash chain nor the content hashes
    /// are checked; framing, bounds, declared lengths, chunk count and order still are. Each
    /// [`crate::Ledger`] then has empty `data` (its size is in `raw_len`). Not with `hedge` or
    /// `anchor`.
    pub receive_only: bool,
    /// Lanes to open, counting lane 0 (default 4, at most 64). The relay may grant fewer.
    pub lanes: u8,
    /// Local UDP ports for the lanes, an inclusive range: lane k binds `first + k`. `None`
    /// (default): each lane binds an ephemeral port. Either way each lane has its own socket,
    /// so its own source port and its own flow.
    pub lane_ports: Option<(u16, u16)>,
    /// Codecs accepted for chunk payloads (default all; uncompressed is always accepted).
    pub codecs: Vec<Codec>,
    /// Bounds on what the relay can make us hold. `max_ledgers_in_flight` is the window asked
    /// for in `SessionOpen`.
    pub limits: Limits,
    /// How long a ledger may go without progress before its missing chunks are asked for again
    /// (default 500 ms).
    pub stall_timeout: Duration,
    /// How long without hearing from the relay (a heartbeat or data) before the session is
    /// dropped. `None` (default): three times the relay's heartbeat interval.
    pub heartbeat_timeout: Option<Duration>,
    /// How long the relay may announce ledgers newer than the last delivered without one
    /// arriving before the session is dropped. `None` (default): `stall_timeout * 4 + 2 s`.
    pub progress_timeout: Option<Duration>,
    /// How long to wait for the relay's `SessionAccept` or `LaneAccept` (default 30 s). A
    /// relay that holds no ledger yet answers only when its first ledger arrives.
    pub accept_timeout: Duration,
    /// Reconnect backoff (default 100 ms to 10 s, reset after a delivered ledger).
    pub backoff: BackoffConfig,
    /// Give up with [`SubscribeError::Unreachable`] if no relay has been reached (a QUIC and
    /// TLS handshake completed) this long after [`crate::connect`]. `None` (default): retry
    /// forever. Once a relay was reached, failures are retried forever either way.
    pub first_connect_timeout: Option<Duration>,
    /// Verified ledgers buffered for the consumer (default 4). When they are not taken, the
    /// subscriber stops reading its lanes, QUIC flow control stops the relay, and the relay
    /// moves this subscriber to reading from its ring: memory does not grow.
    pub channel_capacity: usize,
    /// Subscribe to every relay of `relays` at once and hand on each ledger from whichever
    /// relay first delivers a verified copy (default false: one relay at a time, failing over
    /// in order). Each relay's copy is verified on its own, the merged output is checked as one
    /// chain, exactly once and in order; a relay that dies or falls behind is resumed in the
    /// background. It costs each relay's bandwidth and the subscriber's CPU once per relay.
    /// See [`crate::hedge`].
    pub hedge: bool,
    /// QUIC transport settings of each lane.
    pub transport: TransportSettings,
}

impl SubscribeConfig {
    /// A configuration with the defaults documented on each field.
    pub fn new(relays: Vec<RelayAddr>, credentials: Credentials) -> SubscribeConfig {
        SubscribeConfig {
            relays,
            credentials,
            server_name: None,
            start: Start::Tip,
            anchor: None,
            content_check: true,
            receive_only: false,
            lanes: 4,
            lane_ports: None,
            codecs: Codec::ALL.to_vec(),
            limits: Limits::default(),
            stall_timeout: Duration::from_millis(500),
            heartbeat_timeout: None,
            progress_timeout: None,
            accept_timeout: Duration::from_secs(30),
            backoff: BackoffConfig::default(),
            first_connect_timeout: None,
            channel_capacity: 4,
            hedge: false,
            transport: TransportSettings::default(),
        }
    }

    /// The TLS server name used for `relay`.
    pub fn server_name_for<'a>(&'a self, relay: &'a RelayAddr) -> &'a str {
        self.server_name.as_deref().unwrap_or(relay.host())
    }

    /// The no-progress timeout in force.
    pub fn effective_progress_timeout(&self) -> Duration {
        self.progress_timeout
            .unwrap_or(self.stall_timeout * 4 + Duration::from_secs(2))
    }

    /// The accepted-codecs mask of `SessionOpen`.
    pub fn codec_mask(&self) -> u8 {
        self.codecs
            .iter()
            .fold(Codec::None.bit(), |mask, c| mask | c.bit())
    }

    /// The local port of lane `lane`, if ports are fixed.
    pub fn lane_port(&self, lane: u8) -> Option<u16> {
        self.lane_ports
            .map(|(first, _)| first.saturating_add(u16::from(lane)))
    }

    /// Checks that the configuration can work.
    pub fn validate(&self) -> Result<(), SubscribeError> {
        let invalid = |field, reason: String| Err(SubscribeError::InvalidConfig { field, reason });
        if self.relays.is_empty() {
            return invalid("relays", "no relay given".into());
        }
        for relay in &self.relays {
            let name = self.server_name_for(relay);
            if ServerName::try_from(name).is_err() {
                return invalid(
                    "server_name",
                    format!("{name:?} is not a valid DNS name or IP address"),
                );
            }
        }
        if self.receive_only && (self.hedge || self.anchor.is_some()) {
            return invalid(
                "receive_only",
                "verifies no content, so it cannot pick among relays (hedge) or check an anchor"
                    .into(),
            );
        }
        if self.lanes == 0 || self.lanes > MAX_LANES {
            return invalid("lanes", format!("{} is not in 1..={MAX_LANES}", self.lanes));
        }
        if let Some((first, last)) = self.lane_ports {
            if first == 0 || last < first {
                return invalid(
                    "lane_ports",
                    format!("{first}..={last} is not a port range"),
                );
            }
            if u32::from(last - first) + 1 < u32::from(self.lanes) {
                return invalid(
                    "lane_ports",
                    format!(
                        "{first}..={last} has fewer ports than the {} lanes",
                        self.lanes
                    ),
                );
            }
        }
        if let Start::Seq(0) = self.start {
            return invalid("start", "ledger sequence 0 names no ledger".into());
        }
        if let Some(anchor) = self.anchor {
            let next = anchor.seq.checked_add(1);
            match self.start {
                Start::Seq(seq) if seq == anchor.seq || Some(seq) == next => {}
                Start::Seq(seq) if seq < anchor.seq => {
                    return invalid(
                        "anchor",
                        format!(
                            "start {seq} is below the anchor {}: a ledger can only be checked \
                             against ledgers before it, so start at {} or {}",
                            anchor.seq,
                            anchor.seq,
                            anchor.seq as u64 + 1
                        ),
                    )
                }
                start => {
                    let start = match start {
                        Start::Seq(seq) => seq.to_string(),
                        Start::Tip => "tip".to_owned(),
                    };
                    return invalid(
                        "anchor",
                        format!(
                            "start {start} does not follow the anchor {}: start at {} or {}",
                            anchor.seq,
                            anchor.seq,
                            anchor.seq as u64 + 1
                        ),
                    );
                }
            }
        }
        let window = self.limits.max_ledgers_in_flight;
        if window == 0 || window > u32::from(u16::MAX) {
            return invalid(
                "limits.max_ledgers_in_flight",
                format!("{window} is not in 1..=65535"),
            );
        }
        if self.channel_capacity == 0 {
            return invalid("channel_capacity", "must be at least 1".into());
        }
        if self.first_connect_timeout.is_some_and(|t| t.is_zero()) {
            return invalid("first_connect_timeout", "must be positive".into());
        }
        if self.stall_timeout.is_zero() {
            return invalid("stall_timeout", "must be positive".into());
        }
        if self.heartbeat_timeout.is_some_and(|t| t.is_zero()) {
            return invalid("heartbeat_timeout", "must be positive".into());
        }
        if self.progress_timeout.is_some_and(|t| t.is_zero()) {
            return invalid("progress_timeout", "must be positive".into());
        }
        if self.credentials.ca.is_empty() {
            return invalid("credentials.ca", "no CA certificate".into());
        }
        if self.credentials.cert_chain.is_empty() {
            return invalid("credentials.cert_chain", "no client certificate".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relay_addresses_parse() {
        let r: RelayAddr = "relay.example.com:7000".parse().unwrap();
        assert_eq!((r.host(), r.port()), ("relay.example.com", 7000));
        assert_eq!(r.socket_addr(), None);
        let r: RelayAddr = "127.0.0.1:9".parse().unwrap();
        assert_eq!(r.host(), "127.0.0.1");
        assert_eq!(r.socket_addr(), Some("127.0.0.1:9".parse().unwrap()));
        let r: RelayAddr = "[::1]:7000".parse().unwrap();
        assert_eq!(r.host(), "::1");
        assert_eq!(r.to_string(), "[::1]:7000");
        assert_eq!(r.socket_addr(), Some("[::1]:7000".parse().unwrap()));
        let r: RelayAddr = "localhost:1".parse().unwrap();
        assert_eq!(r.to_string(), "localhost:1");
        for bad in [
            "relay",
            "relay:",
            ":7000",
            "relay:70000",
            "::1:7000",
            "bad host:1",
            "[]:1",
        ] {
            assert!(bad.parse::<RelayAddr>().is_err(), "{bad} parsed");
        }
    }

    #[test]
    fn relay_lists_keep_their_order() {
        let list = parse_relay_list("a.example:1, 10.0.0.2:2,[::1]:3").unwrap();
        let shown: Vec<String> = list.iter().map(|r| r.to_string()).collect();
        assert_eq!(shown, ["a.example:1", "10.0.0.2:2", "[::1]:3"]);
        assert!(parse_relay_list("").is_err());
        assert!(parse_relay_list(" , ").is_err());
        assert!(parse_relay_list("a.example:1,nope").is_err());
    }

    #[test]
    fn anchors_parse() {
        let hex = "ab".repeat(31) + "0F";
        let a: Anchor = format!("1410048:{hex}").parse().unwrap();
        assert_eq!(a.seq, 1_410_048);
        assert_eq!(a.hash[..31], [0xab; 31]);
        assert_eq!(a.hash[31], 0x0f);
        assert_eq!(a.to_string(), format!("1410048:{}0f", "ab".repeat(31)));
        for (bad, reason) in [
            ("1410048", "expected SEQ:HASH"),
            (&format!("0:{hex}")[..], "ledger sequence 0 names no ledger"),
            (&format!("x:{hex}")[..], "SEQ is not a ledger sequence"),
            (&format!("-1:{hex}")[..], "SEQ is not a ledger sequence"),
            ("5:abcd", "HASH must be 64 hex digits"),
            (&format!("5:{hex}00")[..], "HASH must be 64 hex digits"),
            (&format!("5:{}", "zz".repeat(32))[..], "HASH is not hex"),
            (&format!("5:+{}", "a".repeat(63))[..], "HASH is not hex"),
        ] {
            let e = bad.parse::<Anchor>().unwrap_err();
            assert_eq!(e.reason, reason, "{bad}");
        }
    }

    #[test]
    fn starts_parse() {
        assert_eq!(parse_start("tip"), Ok(Start::Tip));
        assert_eq!(parse_start("TIP"), Ok(Start::Tip));
        assert_eq!(parse_start("1410048"), Ok(Start::Seq(1_410_048)));
        assert!(parse_start("0").is_err());
        assert!(parse_start("-1").is_err());
        assert!(parse_start("latest").is_err());
    }

    fn credentials() -> Credentials {
        Credentials {
            ca: vec![CertificateDer::from(vec![1u8])],
            crls: Vec::new(),
            cert_chain: vec![CertificateDer::from(vec![2u8])],
            key: PrivateKeyDer::Pkcs8(vec![3u8].into()),
        }
    }

    #[test]
    fn server_name_defaults_to_the_host_part() {
        let relays = parse_relay_list("relay-a.internal:7000,127.0.0.1:7001,[::1]:7002").unwrap();
        let mut config = SubscribeConfig::new(relays.clone(), credentials());
        assert_eq!(config.server_name_for(&relays[0]), "relay-a.internal");
        assert_eq!(config.server_name_for(&relays[1]), "127.0.0.1");
        assert_eq!(config.server_name_for(&relays[2]), "::1");
        config.validate().unwrap();
        config.server_name = Some("relay".into());
        assert_eq!(config.server_name_for(&relays[1]), "relay");
        config.server_name = Some("not a name".into());
        assert!(config.validate().is_err());
    }

    #[test]
    fn validation_catches_unworkable_settings() {
        let relays = parse_relay_list("127.0.0.1:7000").unwrap();
        let base = SubscribeConfig::new(relays, credentials());
        base.validate().unwrap();
        assert_eq!(base.codec_mask(), 0b111);
        assert_eq!(
            base.effective_progress_timeout(),
            Duration::from_millis(4000)
        );
        let check = |f: &dyn Fn(&mut SubscribeConfig), field: &str| {
            let mut c = base.clone();
            f(&mut c);
            match c.validate() {
                Err(SubscribeError::InvalidConfig { field: got, .. }) => assert_eq!(got, field),
                other => panic!("{field}: {other:?}"),
            }
        };
        check(&|c| c.relays.clear(), "relays");
        check(&|c| c.lanes = 0, "lanes");
        check(&|c| c.lanes = 65, "lanes");
        check(&|c| c.lane_ports = Some((9000, 9002)), "lane_ports");
        check(&|c| c.lane_ports = Some((0, 10)), "lane_ports");
        check(&|c| c.start = Start::Seq(0), "start");
        check(&|c| c.channel_capacity = 0, "channel_capacity");
        check(
            &|c| c.heartbeat_timeout = Some(Duration::ZERO),
            "heartbeat_timeout",
        );
        check(
            &|c| c.progress_timeout = Some(Duration::ZERO),
            "progress_timeout",
        );
        let anchor = Some(Anchor {
            seq: 100,
            hash: [1; 32],
        });
        check(&|c| c.anchor = anchor, "anchor"); // start: tip
        check(
            &|c| {
                c.anchor = anchor;
                c.start = Start::Seq(99);
            },
            "anchor",
        );
        check(
            &|c| {
                c.anchor = anchor;
                c.start = Start::Seq(102);
            },
            "anchor",
        );
        for start in [100, 101] {
            let mut ok = base.clone();
            ok.anchor = anchor;
            ok.start = Start::Seq(start);
            ok.validate().unwrap();
        }
        check(
            &|c| c.limits.max_ledgers_in_flight = 0,
            "limits.max_ledgers_in_flight",
        );
        let mut ok = base.clone();
        ok.lane_ports = Some((9000, 9003));
        ok.validate().unwrap();
        assert_eq!(ok.lane_port(0), Some(9000));
        assert_eq!(ok.lane_port(3), Some(9003));
    }
}
