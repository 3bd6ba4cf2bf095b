//! A scenario is one row of a run, as data. A preset file (`bench/scenarios/*.toml`, built in)
//! holds `about`, `[defaults]`, `[sweep]` (fields whose values multiply the rows) and `[[row]]`
//! tables, each with a `name`. Fields are flat, so `--set` and `--sweep` reach any of them.
//! Durations are `600ms`-style strings or milliseconds; sizes `594KiB`-style strings or bytes.

use anyhow::{bail, Context};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize};

use crate::netem::Shape;

/// The fields every row starts from, as data.
pub const DEFAULTS: &str = include_str!("../scenarios/defaults.toml");

/// The built-in presets: name and text.
pub const PRESETS: &[(&str, &str)] = &[
    ("table", include_str!("../scenarios/table.toml")),
    ("quick", include_str!("../scenarios/quick.toml")),
    ("lanes", include_str!("../scenarios/lanes.toml")),
    ("fanout", include_str!("../scenarios/fanout.toml")),
    ("tiers", include_str!("../scenarios/tiers.toml")),
    ("hedge", include_str!("../scenarios/hedge.toml")),
    (
        "lake-delivery",
        include_str!("../scenarios/lake-delivery.toml"),
    ),
];

/// Which network a row runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NetKind {
    /// This host's loopback.
    Loopback,
    /// Two network namespaces with per-flow caps (root).
    Emulated,
    /// A relay on another host (`relay`, and `tcp` for the yardstick).
    Remote,
}

/// How the relays of a row are arranged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TopoKind {
    /// One relay, every subscriber on it.
    Direct,
    /// A root relay with the source and `edges` relays fed by it (`--source relay:ROOT`); the
    /// subscribers spread over the edges.
    Tier,
    /// Relays A and B with the same source; B's path `degrade` times narrower.
    Hedge,
}

/// What carries the ledgers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Carrier {
    /// `ledger-relay run` and `ledger-subscribe`.
    Relay,
    /// The TCP yardstick: the same ledgers over one TLS-over-TCP flow, each sent once whole.
    Tcp,
    /// A local pipe read in this process (where core and ingest share a box).
    Pipe,
}

/// How subscribers meet the source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Connected before their first ledger is published; chunks streamed as the source writes.
    Live,
    /// Started once the source finished: every ledger from the ring, back to back (the relay
    /// keeps one ledger in flight, `--window 1`), so the row measures sustained goodput.
    CatchUp,
    /// Live, the relay sending a ledger only once it holds all of it (`--store-and-forward`).
    StoreAndForward,
}

/// Where the relay exports its ledgers as a SEP-54 data lake, if anywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Export {
    /// No export.
    None,
    /// To a directory (`file://`).
    File,
    /// To an S3-protocol server on loopback (`moto_server`, started by the runner).
    S3,
}

/// Which relays a subscriber of a hedge row takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HedgeTo {
    /// Both, hedged (`ledger-subscribe --hedge`).
    Both,
    /// The healthy relay alone.
    A,
    /// The degraded relay alone.
    B,
}

/// One row of a run. Every field has a default ([`DEFAULTS`]), so a preset row says only what
/// it changes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// The row's name.
    #[serde(default)]
    pub name: String,
    /// `loopback`, `emulated` or `remote`.
    pub network: NetKind,
    /// Emulated: per-flow cap, Mbit/s.
    pub flow_mbit: f64,
    /// Emulated: aggregate cap, Mbit/s [default: 8 x the per-flow cap].
    pub aggregate_mbit: Option<f64>,
    /// Emulated: MTU of the link (EC2's jumbo frames: 9001) [default: 1500].
    pub link_mtu: Option<u32>,
    /// Emulated: lane 0 of each subscriber capped at half the others.
    pub half_cap: bool,
    /// Remote: the relay's QUIC address.
    pub relay: Option<String>,
    /// Remote: the TCP yardstick's address.
    pub tcp: Option<String>,
    /// `direct`, `tier` or `hedge`.
    pub topology: TopoKind,
    /// Tier: edge relays.
    pub edges: u16,
    /// Tier: edges pass a ledger on as its chunks arrive (`--cut-through`).
    pub cut_through: bool,
    /// Tier: one more subscriber on the root, the reference the edges' delivery is compared
    /// with ledger by ledger.
    pub root_subscriber: bool,
    /// Hedge: relay B's path is this many times narrower than A's.
    pub degrade: f64,
    /// Hedge: `both`, `a` or `b`.
    pub hedge_to: HedgeTo,
    /// `relay`, `tcp` (the yardstick) or `pipe`.
    pub carrier: Carrier,
    /// `synthetic`, or `file:PATH` (a record-marked dump; a relative path is under the
    /// testdata directory).
    pub source: String,
    /// Synthetic ledger size.
    #[serde(deserialize_with = "bytes")]
    pub size: u64,
    /// zstd-1 ratio of the synthetic ledgers at the chunk size (1: incompressible).
    pub ratio: f64,
    /// `zstd`, `lz4` or `none`.
    pub codec: String,
    /// Raw bytes per chunk.
    #[serde(deserialize_with = "bytes")]
    pub chunk: u64,
    /// Lanes per subscriber.
    pub lanes: u8,
    /// Subscriptions (sessions).
    pub subscribers: u16,
    /// Sessions per `ledger-subscribe` process (`--sessions K`).
    pub sessions_per_process: u16,
    /// Subscribers check framing, lengths and order only (`--receive-only`, a bench mode).
    pub receive_only: bool,
    /// `live`, `catch-up` or `store-and-forward`.
    pub mode: Mode,
    /// Ledgers measured per subscriber, after the warm-up.
    pub ledgers: u32,
    /// Ledgers left out at the start of each subscriber.
    pub warmup: u32,
    /// Time between ledgers, ms.
    #[serde(deserialize_with = "millis")]
    pub cadence: f64,
    /// The cadence grows to this many ms per subscriber when that is longer (the machine
    /// runs every subscriber too).
    #[serde(deserialize_with = "millis")]
    pub cadence_per_subscriber: f64,
    /// The source's emit window, ms.
    #[serde(deserialize_with = "millis")]
    pub emit: f64,
    /// Largest UDP payload of the lanes, both ends [default: the transport's].
    pub max_mtu: Option<u16>,
    /// UDP payload the lanes take the path to carry, both ends.
    pub min_mtu: Option<u16>,
    /// `none`, `file` or `s3`.
    pub export: Export,
    /// zstd level of exported objects.
    pub export_level: i32,
    /// Ledgers published before any subscriber: the relay's CPU and memory with none.
    pub baseline_ledgers: u32,
    /// After the measured ledgers, this long with as many idle sessions at the tip: memory and
    /// CPU per idle session, ms (0: not measured).
    #[serde(deserialize_with = "millis")]
    pub idle: f64,
    /// More flags for every relay of the row.
    #[serde(default)]
    pub relay_args: Vec<String>,
    /// More `KEY = VALUE` lines of every relay's `[transport]` table.
    #[serde(default)]
    pub relay_transport: Vec<String>,
}

impl Default for Scenario {
    fn default() -> Self {
        toml::from_str(DEFAULTS).expect("bench/scenarios/defaults.toml holds every field")
    }
}

impl Scenario {
    /// The emulated network's shape, on an emulated row.
    pub fn shape(&self) -> Option<Shape> {
        let flow_bps = (self.flow_mbit * 1e6) as u64;
        (self.network == NetKind::Emulated).then_some(Shape {
            flow_bps,
            aggregate_bps: self
                .aggregate_mbit
                .map_or(flow_bps * 8, |a| (a * 1e6) as u64),
            link_mtu: self.link_mtu,
        })
    }

    /// Time between ledgers with this many subscribers, ms.
    pub fn cadence_ms(&self) -> f64 {
        self.cadence
            .max(f64::from(self.subscribers) * self.cadence_per_subscriber)
    }

    /// `ledger-subscribe` processes of the row.
    pub fn processes(&self) -> u16 {
        self.subscribers.div_ceil(self.sessions_per_process.max(1))
    }

    /// Fails, saying why, unless the fields make a row that can run.
    pub fn check(&self) -> anyhow::Result<()> {
        let s = self;
        let fail = |why: &str| Err(anyhow::anyhow!("row {:?}: {why}", s.name));
        if s.name.is_empty() {
            return fail("every row needs a name");
        }
        if s.ledgers == 0 || s.lanes == 0 || s.lanes > 16 || s.subscribers == 0 {
            return fail("ledgers and subscribers must be at least 1, lanes 1 to 16");
        }
        if !(s.emit >= 0.0 && s.emit <= s.cadence_ms() && s.cadence > 0.0) {
            return fail("the cadence must be positive and at least the emit window");
        }
        if s.chunk < 4096 || !["zstd", "lz4", "none"].contains(&s.codec.as_str()) {
            return fail("the chunk must be at least 4096 bytes, the codec zstd, lz4 or none");
        }
        if s.source != "synthetic" && !s.source.starts_with("file:") {
            return fail("the source is synthetic or file:PATH");
        }
        let emulated = s.network == NetKind::Emulated;
        match (s.network, s.topology) {
            (NetKind::Remote, _) if s.relay.is_none() && s.carrier == Carrier::Relay => {
                fail("a remote row needs the relay's address")
            }
            (NetKind::Remote, _) if s.tcp.is_none() && s.carrier == Carrier::Tcp => {
                fail("a remote tcp row needs the yardstick's address")
            }
            (_, TopoKind::Hedge) if !emulated => fail("a hedge row needs the emulated network"),
            (_, TopoKind::Tier) if s.edges == 0 => fail("a tier needs at least one edge"),
            (NetKind::Emulated, TopoKind::Direct) if s.sessions_per_process > 1 => {
                fail("on the emulated network each subscriber is its own process (its lanes' ports are capped)")
            }
            _ => Ok(()),
        }
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum NumOrText {
    Num(f64),
    Text(String),
}

fn bytes<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    match NumOrText::deserialize(d)? {
        NumOrText::Num(n) if n >= 1.0 => Ok(n as u64),
        NumOrText::Num(n) => Err(D::Error::custom(format!("a size of {n} bytes"))),
        NumOrText::Text(t) => ledger_relay_transport::parse_size(&t).map_err(D::Error::custom),
    }
}

fn millis<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    match NumOrText::deserialize(d)? {
        NumOrText::Num(n) if n >= 0.0 => Ok(n),
        NumOrText::Num(n) => Err(D::Error::custom(format!("a duration of {n} ms"))),
        NumOrText::Text(t) => ms(&t).map_err(D::Error::custom),
    }
}

/// A duration in the grammar of every command (`600ms`, `1.5s`), in milliseconds.
pub fn ms(text: &str) -> Result<f64, String> {
    let d = ledger_relay_transport::parse_duration(text).map_err(|e| e.to_string())?;
    Ok(d.as_secs_f64() * 1e3)
}

/// A preset: rows of scenarios and the fields they share.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Preset {
    /// What it measures, one line.
    #[serde(default)]
    pub about: String,
    /// Fields every row starts from.
    #[serde(default)]
    pub defaults: toml::Table,
    /// Fields whose values multiply the rows.
    #[serde(default)]
    pub sweep: toml::Table,
    /// The rows.
    #[serde(default)]
    pub row: Vec<toml::Table>,
}

/// A value as a flag gives it: a TOML value (`4`, `true`, `1.5`) or else a string (`600ms`).
pub fn value(text: &str) -> toml::Value {
    let v = toml::from_str::<toml::Table>(&format!("v = {text}")).ok();
    v.and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(text.to_owned()))
}

/// `KEY=VALUE` (`--set`).
pub fn assignment(text: &str) -> Result<(String, toml::Value), String> {
    let (k, v) = text.split_once('=').ok_or("expected KEY=VALUE")?;
    Ok((k.trim().to_owned(), value(v.trim())))
}

/// `KEY=V1,V2,...` (`--sweep`).
pub fn sweep(text: &str) -> Result<(String, Vec<toml::Value>), String> {
    let (k, v) = text.split_once('=').ok_or("expected KEY=V1,V2,...")?;
    let values = v.split(',').map(|x| value(x.trim())).collect();
    Ok((k.trim().to_owned(), values))
}

impl Preset {
    /// A built-in preset by name, or a preset file.
    pub fn load(name: &str) -> anyhow::Result<Preset> {
        let text = match PRESETS.iter().find(|p| p.0 == name) {
            Some(p) => p.1.to_owned(),
            None => std::fs::read_to_string(name).with_context(|| {
                let names: Vec<&str> = PRESETS.iter().map(|p| p.0).collect();
                format!(
                    "{name:?} is neither a preset ({}) nor a readable file",
                    names.join(", ")
                )
            })?,
        };
        toml::from_str(&text).with_context(|| format!("preset {name}"))
    }

    /// The rows `only` selects (all when empty; each entry a row's name, or `FIELD=VALUE` for
    /// the rows whose field has that value in the preset), each with `set` applied and multiplied by
    /// the sweeps (the preset's, then `sweeps`, a key given twice taking the later values): a
    /// swept row is named `ROW/KEY=VALUE`.
    pub fn expand(
        &self,
        set: &[(String, toml::Value)],
        sweeps: &[(String, Vec<toml::Value>)],
        only: &[String],
    ) -> anyhow::Result<Vec<Scenario>> {
        let mut axes: Vec<(String, Vec<toml::Value>)> = Vec::new();
        let preset_sweeps = self.sweep.iter().map(|(k, v)| match v {
            toml::Value::Array(a) => (k.clone(), a.clone()),
            one => (k.clone(), vec![one.clone()]),
        });
        for (k, vals) in preset_sweeps.chain(sweeps.iter().cloned()) {
            axes.retain(|a| a.0 != k);
            axes.push((k, vals));
        }
        let mut out = Vec::new();
        for row in &self.row {
            let mut base: toml::Table = toml::from_str(DEFAULTS)?;
            base.extend(self.defaults.clone());
            base.extend(row.clone());
            let name = base.get("name").and_then(toml::Value::as_str);
            let name = name.unwrap_or_default().to_owned();
            let selects = |o: &String| match assignment(o) {
                Ok((k, v)) if o != &name => base.get(&k) == Some(&v),
                _ => o == &name,
            };
            if !only.is_empty() && !only.iter().any(selects) {
                continue;
            }
            base.extend(set.iter().cloned());
            let mut combos = vec![(base, name)];
            for (k, vals) in &axes {
                let shown = |v: &toml::Value| v.as_str().map_or(v.to_string(), str::to_owned);
                combos = (combos.into_iter())
                    .flat_map(|(t, n)| {
                        vals.iter().map(move |v| {
                            let mut t = t.clone();
                            t.insert(k.clone(), v.clone());
                            (t, format!("{n}/{k}={}", shown(v)))
                        })
                    })
                    .collect();
            }
            for (mut t, n) in combos {
                t.insert("name".into(), toml::Value::String(n.clone()));
                let sc: Scenario = t.try_into().with_context(|| format!("row {n:?}"))?;
                sc.check()?;
                out.push(sc);
            }
        }
        if out.is_empty() {
            bail!("no row selected");
        }
        Ok(out)
    }
}
