//! The one runner: a [`Scenario`] in, what it measured ([`Taken`]) out.
//!
//! Subscribers ask for `first..=last`: live, `first` is far enough ahead for every process to
//! connect first (`--start-wait`); from the ring, they start once the source finished. The
//! measured window runs from when every subscriber holds its last warm-up ledger to when every
//! one holds `last`: CPU over it, the first relay's memory every 100 ms; `baseline_ledgers` and
//! `idle` add the relay alone and with idle sessions. Every stats file must hold its ledgers.

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use ledger_relay_lake::testing::{unique_bucket, S3Server};
use ledger_relay_wire::record::{Records, DEFAULT_MAX_RECORD_LEN};

use crate::cluster::{make_certs, Cluster, RelayProc, RelaySettings, Scrape, SubSpec};
use crate::netem::{in_ns, Netem, RELAY_ADDR};
use crate::procs::{
    cpu_seconds, kill_all, status_kib, thread_cpu_seconds, wait_with_cpu, RssSampler,
};
use crate::row::{Cpu, Lane, Memory, Taken};
use crate::scenario::{Carrier, Export, HedgeTo, Mode, NetKind, Scenario, TopoKind};
use crate::stats::{read_lenient, Record};
use crate::yardstick::client::Yardstick;

/// Relay threads whose CPU is not on the delivery path (by name prefix).
const OFF_PATH_THREADS: &[&str] = &["ring-writer", "source-", "lake-export", "metrics"];

/// What a run shares: scratch space, the CA and the names in it, and the S3 server.
pub struct Env {
    tmp: tempfile::TempDir,
    /// The CA directory.
    pub certs: PathBuf,
    /// Where `file:` sources are (relative paths).
    pub testdata: PathBuf,
    /// Our client certificate against relays elsewhere (else `sub-N` of the ephemeral CA).
    pub client: Option<String>,
    /// The name a relay elsewhere must have in its certificate.
    pub server_name: Option<String>,
    /// Longest a row against relays elsewhere may take.
    pub row_timeout: Duration,
    s3: Option<S3Server>,
    index: u32,
}

impl Env {
    /// A run of `rows` here: an ephemeral CA, and the loopback S3 server when a row exports there.
    pub fn local(rows: &[Scenario], testdata: PathBuf) -> anyhow::Result<Env> {
        let mut env = Env::remote(PathBuf::new(), None, None, Duration::from_secs(600))?;
        env.certs = env.tmp.path().join("certs");
        let n = rows.iter().map(|s| s.processes() + s.edges).max();
        make_certs(&env.certs, usize::from(n.unwrap_or(1)) + 2)?;
        env.testdata = testdata;
        if rows.iter().any(|s| s.export == Export::S3) {
            env.s3 = Some(
                S3Server::start().context("the loopback S3 server (pip install 'moto[server]')")?,
            );
        }
        Ok(env)
    }

    /// A run against relays elsewhere, with client certificate `client` of `certs`.
    pub fn remote(
        certs: PathBuf,
        client: Option<String>,
        server_name: Option<String>,
        row_timeout: Duration,
    ) -> anyhow::Result<Env> {
        let tmp = tempfile::Builder::new().prefix("ledger-bench").tempdir()?;
        Ok(Env {
            tmp,
            certs,
            testdata: PathBuf::new(),
            client,
            server_name,
            row_timeout,
            s3: None,
            index: 0,
        })
    }
}

/// Ledgers of a row: subscribers take `first..=last`; the window runs from `mark` to `last`.
#[derive(Debug, Clone, Copy)]
struct Span {
    start: u32,
    first: u32,
    mark: u32,
    last: u32,
}

impl Span {
    /// Live, `first` is the source's `start` plus the baseline ledgers and enough ledgers for
    /// the subscribers (and edges) to connect (at most 32, and within the 25 s a subscriber
    /// waits for a session); from the ring it is `start`.
    fn of(sc: &Scenario, start: u32) -> Span {
        let cadence = sc.cadence_ms();
        let lead = match sc.mode {
            Mode::CatchUp => 0,
            _ => {
                let tier = sc.topology == TopoKind::Tier;
                let connect_s =
                    2.0 + 0.1 * f64::from(sc.processes() + sc.edges) + if tier { 3.0 } else { 0.0 };
                let k = ((connect_s * 1e3 / cadence).ceil() as u32 + 1).min(32);
                sc.baseline_ledgers + k.min(((25e3 / cadence) as u32).saturating_sub(1)).max(1)
            }
        };
        let first = start + lead;
        let measured = first + sc.warmup;
        Span {
            start,
            first,
            mark: measured.max(first + 1) - 1,
            last: measured + sc.ledgers - 1,
        }
    }
}

/// A row's relays, subscriber processes (stopped when dropped) and emulated network.
#[derive(Default)]
struct Procs {
    relays: Vec<RelayProc>,
    subs: Vec<Child>,
    netem: Option<Netem>,
}

impl Drop for Procs {
    fn drop(&mut self) {
        kill_all(&mut self.subs);
        for r in self.relays.drain(..) {
            r.stop();
        }
    }
}

/// Measures `sc`.
pub fn take(env: &mut Env, sc: &Scenario) -> anyhow::Result<Taken> {
    env.index += 1;
    let name = sc.name.replace(|c: char| !c.is_ascii_alphanumeric(), "-");
    let dir = env.tmp.path().join(format!("{}-{name}", env.index));
    std::fs::create_dir_all(&dir)?;
    if let (NetKind::Emulated, Some(why)) = (sc.network, crate::netem::unavailable_reason()) {
        bail!("skipped: {why}");
    }
    let sp = Span::of(sc, 2);
    let count = sp.last - sp.first + 1;
    let limit = Duration::from_secs_f64(sc.cadence_ms() / 1e3 * f64::from(sp.last) * 3.0 + 60.0);
    match (sc.carrier, sc.network) {
        (Carrier::Pipe, _) => {
            let records = crate::pipe::run(sc.size as usize, count, sc.cadence_ms(), sc.emit)?;
            Ok(Taken::of(records))
        }
        (Carrier::Tcp, _) => tcp(env, sc, &dir, sp, limit),
        (Carrier::Relay, NetKind::Remote) => {
            let relay = sc.relay.clone().unwrap_or_default();
            let name = env.client.clone().unwrap_or_else(|| "sub-0".into());
            let mut spec = SubSpec::new(&name, "tip", Some(count), sc.lanes, &dir, "sub");
            spec.extra = vec!["--quiet".into()];
            if let Some(s) = &env.server_name {
                spec.extra.extend(["--server-name".into(), s.clone()]);
            }
            let c = cluster(env, sc);
            Ok(Taken::of(
                c.run_subscriber(None, &relay, &spec, env.row_timeout)?.0,
            ))
        }
        (Carrier::Relay, _) => relays(env, sc, &dir),
    }
}

fn cluster(env: &Env, sc: &Scenario) -> Cluster {
    Cluster {
        certs: env.certs.clone(),
        max_mtu: sc.max_mtu,
        min_mtu: sc.min_mtu,
        transport: sc.relay_transport.clone(),
        ..Cluster::default()
    }
}

/// The TCP yardstick: its server in the relays' namespace, capped per flow; or one elsewhere.
fn tcp(env: &Env, sc: &Scenario, dir: &Path, sp: Span, limit: Duration) -> anyhow::Result<Taken> {
    let count = sp.last - sp.first + 1;
    let (certs, server_name) = (env.certs.clone(), env.server_name.clone());
    let client = env.client.clone().unwrap_or_else(|| "sub-0".into());
    let read = move |addr: String, from: u32| {
        let host = crate::yardstick::client::host_of(&addr)?;
        Yardstick::new(&addr, &certs, &client, &server_name.unwrap_or(host))?
            .stream(from, count, limit)
    };
    if let (NetKind::Remote, Some(addr)) = (sc.network, &sc.tcp) {
        return Ok(Taken::of(read(addr.clone(), 0)?));
    }
    let mut netem = sc.shape().map(|s| Netem::create("t", s)).transpose()?;
    let ip = netem.as_ref().map_or("127.0.0.1", |_| RELAY_ADDR);
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    if let (Some(n), Some(shape)) = (&mut netem, sc.shape()) {
        n.cap_source_port(port, shape.flow_bps)?;
    }
    let s = settings(sc, sp.start, sp.last - sp.start + 1);
    let bench = crate::procs::sibling_binary("ledger-bench")
        .or_else(|_| std::env::current_exe().context("locating ledger-bench"))?;
    let log = dir.join("yardstick.log");
    let (source, cadence, emit) = (s.synthetic_source(), s.cadence_ms, s.emit_ms);
    let words = format!(
        "yardstick --listen {ip}:{port} --source {source} --cadence {cadence}ms --emit {emit}ms"
    );
    let mut server = Netem::exec_in(netem.as_ref().map(|n| n.relay_ns.as_str()), &bench)
        .args(words.split_whitespace())
        .arg("--certs")
        .arg(&env.certs)
        .stdin(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .spawn()
        .context("starting ledger-bench yardstick")?;
    crate::procs::track(&server);
    let got = (|| {
        let started =
            crate::procs::wait_log(&mut server, &log, "listening", Duration::from_secs(30));
        started.context("the yardstick")?;
        let first = sp.first;
        in_ns(netem.as_ref().map(|n| n.sub_ns.as_str()), move || {
            read(format!("{ip}:{port}"), first)
        })
    })();
    kill_all(std::slice::from_mut(&mut server));
    Ok(Taken::of(got?))
}

/// The relay settings of `sc` for `count` ledgers from `start`.
fn settings(sc: &Scenario, start: u32, count: u32) -> RelaySettings {
    RelaySettings {
        count: Some(count),
        start,
        emit_ms: sc.emit,
        codec: sc.codec.clone(),
        chunk: sc.chunk,
        retention: count + 10,
        ..RelaySettings::endless(sc.size, sc.ratio, sc.cadence_ms())
    }
}

/// The first sequence and the number of ledgers of a record-marked dump.
fn file_span(path: &Path) -> anyhow::Result<(u32, u32)> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut records = Records::new(file, DEFAULT_MAX_RECORD_LEN);
    let first = records.next().context("an empty dump")??;
    let header = ledger_relay_wire::header::peek_header(&first)?.context("no ledger header")?;
    Ok((header.ledger_seq, 1 + records.count() as u32))
}

/// The flags of every relay of `sc`: its delivery mode, caps raised for its subscribers (one
/// address, perhaps one certificate for many sessions; the bench measures fan-out, not
/// admission), a long `--start-wait`, the export, and the scenario's own.
fn relay_flags(env: &Env, sc: &Scenario, dir: &Path) -> anyhow::Result<Vec<String>> {
    let (n, lanes) = (usize::from(sc.subscribers) + 2, usize::from(sc.lanes));
    let connections = (n * lanes + 16).max(256);
    let per_identity = usize::from(sc.sessions_per_process);
    let identity_connections = (per_identity * lanes + 16).max(256);
    let mut f: Vec<String> = [
        ("--handshake-pool", connections),
        ("--handshake-pool-per-source", connections),
        ("--max-sessions", n.max(256)),
        ("--max-connections-per-address", connections),
        ("--max-connections-per-identity", identity_connections),
        ("--max-sessions-per-identity", per_identity.max(64)),
    ]
    .iter()
    .flat_map(|(flag, v)| [flag.to_string(), v.to_string()])
    .collect();
    f.extend(["--handshake-timeout", "10s", "--start-wait", "300s"].map(String::from));
    match sc.mode {
        Mode::StoreAndForward => f.push("--store-and-forward".into()),
        // One ledger in flight: several interleave on QUIC and complete in bursts, which
        // inter-arrival times cannot measure.
        Mode::CatchUp => f.extend(["--window".into(), "1".into()]),
        Mode::Live => {}
    }
    let url = match (sc.export, &env.s3) {
        (Export::None, _) => None,
        (Export::File, _) => Some(format!("file://{}/lake", dir.display())),
        (Export::S3, Some(s3)) => {
            let bucket = unique_bucket(&format!("export-{}", env.index));
            s3.create_bucket(&bucket)?;
            Some(format!("s3://{bucket}/testnet"))
        }
        (Export::S3, None) => bail!("no S3 server"),
    };
    if let Some(url) = url {
        f.extend(["--network".into(), "testnet".into(), "--export".into(), url]);
        f.extend(["--export-zstd-level".into(), sc.export_level.to_string()]);
    }
    f.extend(sc.relay_args.iter().cloned());
    Ok(f)
}

/// A relay row (see the module documentation).
fn relays(env: &Env, sc: &Scenario, dir: &Path) -> anyhow::Result<Taken> {
    let (start, source, count_max) = match sc.source.strip_prefix("file:") {
        Some(p) => {
            let p = env.testdata.join(p);
            let (first, n) = file_span(&p)?;
            (first, Some(format!("file:{}", p.display())), n)
        }
        None => (2, None, u32::MAX),
    };
    let sp = Span::of(sc, start);
    let needs = sp.last - start + 1;
    if needs > count_max {
        bail!("the source holds {count_max} ledgers, the row needs {needs}");
    }
    let s = settings(sc, start, needs);
    let source = source.unwrap_or_else(|| s.synthetic_source());
    let mut c = cluster(env, sc);
    c.relay_extra = relay_flags(env, sc, dir)?;
    if let Some(s3) = &env.s3 {
        c.relay_env = s3.env();
    }
    let mut p = Procs::default();
    p.netem = sc.shape().map(|s| Netem::create("r", s)).transpose()?;
    start_relays(sc, &c, dir, &s, &source, &mut p)?;
    let mut t = Taken {
        cpu: Some(Cpu::default()),
        memory: Some(Memory::default()),
        ..Taken::default()
    };
    if sc.baseline_ledgers > 0 {
        alone(sc, &mut p.relays[0], sp, &mut t)?;
    }
    if sc.mode == Mode::CatchUp {
        let within =
            Duration::from_secs_f64(f64::from(sp.last) * sc.cadence_ms() / 1e3 * 2.0 + 60.0);
        p.relays[0].wait_log("source finished", within)?;
    }
    let count = Some(sp.last - sp.first + 1);
    let (kids, stats, reference) = subscribers(sc, &c, dir, &p, sp.first, count, "sub")?;
    p.subs = kids;
    window(sc, sp, &mut p, &stats, reference.as_deref(), &mut t)?;
    t.lanes = lanes(sc, &p.relays[0].scrape()?);
    if sc.export != Export::None {
        // The export writes the last ledger after it was delivered.
        std::thread::sleep(Duration::from_millis(1500));
        let m = p.relays[0].scrape()?;
        t.export = Some((
            m.get("lake_export_newest") as u64,
            m.get("lake_export_degraded") > 0.0,
        ));
    }
    if sc.idle > 0.0 {
        idle(sc, &c, dir, sp.last, &mut p, &mut t)?;
    }
    t.records = read_exact(&stats, sp.first..=sp.last)?;
    let look = |p: &PathBuf| std::fs::read_to_string(format!("{}.first-look", p.display()));
    t.first_look = stats.first().and_then(|p| look(p).ok());
    if let Some(r) = reference {
        t.reference = read_exact(&[r], sp.first..=sp.last)?.pop();
    }
    Ok(t)
}

/// Starts the row's relays (direct, tier or hedge) and, emulated, caps their flows.
fn start_relays(
    sc: &Scenario,
    c: &Cluster,
    dir: &Path,
    s: &RelaySettings,
    source: &str,
    p: &mut Procs,
) -> anyhow::Result<()> {
    let relay_ns = p.netem.as_ref().map(|n| (n.relay_ns.clone(), RELAY_ADDR));
    let ns = relay_ns.as_ref().map(|(n, ip)| (n.as_str(), *ip));
    let shape = sc.shape();
    match sc.topology {
        TopoKind::Direct => {
            p.relays
                .push(c.relay_in(ns, &dir.join("relay"), s, source, &[])?);
            if let (Some(n), Some(shape)) = (&mut p.netem, shape) {
                for k in 0..sc.processes() * u16::from(sc.lanes) {
                    let half = sc.half_cap && k % u16::from(sc.lanes) == 0;
                    n.cap_port(LANE_PORTS + k, shape.flow_bps >> u8::from(half))?;
                }
            }
        }
        TopoKind::Tier => {
            let root = c.relay_in(ns, &dir.join("root"), s, source, &[])?;
            if let (Some(n), Some(shape)) = (&mut p.netem, shape) {
                n.cap_source_port(root.addr.port(), shape.aggregate_bps)?;
            }
            let edge_ns = p.netem.as_ref().map(|n| (n.sub_ns.clone(), "127.0.0.1"));
            let upstream = format!("relay:{}", root.addr);
            p.relays.push(root);
            for e in 0..sc.edges {
                let name = format!("sub-{}", sc.processes() + 1 + e);
                let words = format!("--upstream-name {name} --upstream-lanes {}", sc.lanes);
                let mut extra: Vec<String> = words.split_whitespace().map(String::from).collect();
                if sc.cut_through {
                    extra.push("--cut-through".into());
                }
                let ns = edge_ns.as_ref().map(|(n, ip)| (n.as_str(), *ip));
                let edge = c.relay_in(ns, &dir.join(format!("edge-{e}")), s, &upstream, &extra)?;
                p.relays.push(edge);
            }
        }
        TopoKind::Hedge => {
            let healthy = f64::from(sc.lanes) * shape.map_or(0, |s| s.flow_bps) as f64;
            for (name, bps) in [("a", healthy), ("b", healthy / sc.degrade)] {
                let relay = c.relay_in(ns, &dir.join(name), s, source, &[])?;
                if let Some(n) = &mut p.netem {
                    n.cap_source_port(relay.addr.port(), bps as u64)?;
                }
                p.relays.push(relay);
            }
        }
    }
    Ok(())
}

/// The first lane port on the emulated network (process i's lane k: this + i x lanes + k).
const LANE_PORTS: u16 = 20_000;

/// Starts the row's subscribers: the processes, every session's stats, a tier's reference's.
#[allow(clippy::type_complexity)]
fn subscribers(
    sc: &Scenario,
    c: &Cluster,
    dir: &Path,
    p: &Procs,
    from: u32,
    count: Option<u32>,
    tag: &str,
) -> anyhow::Result<(Vec<Child>, Vec<PathBuf>, Option<PathBuf>)> {
    let (mut kids, mut stats) = (Vec::new(), Vec::new());
    let addr = |i: usize| p.relays[i].addr.to_string();
    let per = sc.sessions_per_process.max(1);
    let ms = |v: f64| format!("{}ms", v.ceil() as u64);
    // A subscriber gives a relay up after half a cadence without a heartbeat or data and two
    // without a ledger, never sooner than its defaults: a loaded 2-core machine takes longer.
    let watchdogs = [
        "--heartbeat-timeout".into(),
        ms((sc.cadence_ms() / 2.0).max(750.0)),
        "--progress-timeout".into(),
        ms((sc.cadence_ms() * 2.0).max(4000.0)),
    ];
    let spawn =
        |i: u16, relays: String, sessions: u16, extra: Vec<String>, kids: &mut Vec<Child>| {
            let (name, tag) = (format!("sub-{i}"), format!("{tag}-{i}"));
            let mut spec = SubSpec::new(&name, from, count, sc.lanes, dir, &tag);
            spec.sessions = sessions;
            spec.extra = watchdogs.iter().cloned().chain(extra).collect();
            if sc.receive_only {
                spec.extra.push("--receive-only".into());
            }
            let ns = p.netem.as_ref().map(|n| n.sub_ns.as_str());
            kids.push(c.subscriber(ns, &relays, &spec)?);
            anyhow::Ok(spec)
        };
    let started = (|| {
        for i in 0..sc.processes() {
            let sessions = per.min(sc.subscribers - i * per);
            let (relays, extra) = match (sc.topology, sc.hedge_to) {
                (TopoKind::Direct, _) if p.netem.is_some() => (
                    addr(0),
                    vec![
                        "--lane-ports".into(),
                        (LANE_PORTS + i * u16::from(sc.lanes)).to_string(),
                    ],
                ),
                (TopoKind::Direct, _) | (TopoKind::Hedge, HedgeTo::A) => (addr(0), vec![]),
                (TopoKind::Tier, _) => (addr(1 + usize::from(i % sc.edges)), vec![]),
                (TopoKind::Hedge, HedgeTo::B) => (addr(1), vec![]),
                (TopoKind::Hedge, HedgeTo::Both) => {
                    (format!("{},{}", addr(0), addr(1)), vec!["--hedge".into()])
                }
            };
            stats.extend(spawn(i, relays, sessions, extra, &mut kids)?.stats_files());
        }
        if sc.topology == TopoKind::Tier && sc.root_subscriber {
            return Ok(Some(
                spawn(sc.processes(), addr(0), 1, vec![], &mut kids)?.stats,
            ));
        }
        Ok(None)
    })();
    match started {
        Ok(reference) => Ok((kids, stats, reference)),
        Err(e) => {
            kill_all(&mut kids);
            Err(e)
        }
    }
}

/// Waits until every stats file holds ledger `seq`; fails after `limit` or if a subscriber fails.
pub fn wait_all(
    stats: &[PathBuf],
    subs: &[Child],
    seq: u32,
    limit: Duration,
) -> anyhow::Result<()> {
    let start = Instant::now();
    let has = |p: &PathBuf| read_lenient(p).is_ok_and(|r| r.last().is_some_and(|r| r.seq >= seq));
    while !stats.iter().all(has) {
        for (i, c) in subs.iter().enumerate() {
            // Looked at without reaping: its CPU is read when it is reaped.
            if let Some(code) = crate::procs::peek_exit(c)?.filter(|c| *c != 0) {
                bail!("subscriber process {i} exited with {code} before ledger {seq}");
            }
        }
        if start.elapsed() > limit {
            let len = |p: &PathBuf| read_lenient(p).map_or(0, |r| r.len());
            let have: Vec<usize> = stats.iter().map(len).collect();
            bail!("not every subscriber reached ledger {seq} within {limit:?} (ledgers each: {have:?})");
        }
        // Not faster: reading 64 stats files takes CPU from the relay and the subscribers.
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Each stats file, checked to hold exactly the ledgers `want`, in order.
fn read_exact(
    stats: &[PathBuf],
    want: std::ops::RangeInclusive<u32>,
) -> anyhow::Result<Vec<Vec<Record>>> {
    let read = |p: &PathBuf| {
        let r = read_lenient(p)?;
        if !r.iter().map(|r| r.seq).eq(want.clone()) {
            let (a, b) = (r.first().map(|r| r.seq), r.last().map(|r| r.seq));
            bail!(
                "{}: {} ledgers {a:?}..{b:?}, not {want:?}",
                p.display(),
                r.len()
            );
        }
        Ok(r)
    };
    stats.iter().map(read).collect()
}

/// The measured window (see the module documentation), then every subscriber's exit.
fn window(
    sc: &Scenario,
    sp: Span,
    p: &mut Procs,
    stats: &[PathBuf],
    reference: Option<&Path>,
    t: &mut Taken,
) -> anyhow::Result<()> {
    let secs = sc.cadence_ms() / 1e3 * f64::from(sp.last - sp.start + 3) + 60.0;
    let limit = Duration::from_secs_f64(secs + 0.5 * f64::from(sc.processes()));
    let mut all: Vec<PathBuf> = stats.to_vec();
    all.extend(reference.map(Path::to_path_buf));
    wait_all(&all, &p.subs, sp.mark, limit)?;
    let marks = |p: &Procs| {
        let cpu = |r: &RelayProc| cpu_seconds(r.pid).unwrap_or(f64::NAN);
        let relays: Vec<f64> = p.relays.iter().map(cpu).collect();
        let subs: Vec<Option<f64>> = p.subs.iter().map(|c| cpu_seconds(c.id())).collect();
        (relays, thread_cpu_seconds(p.relays[0].pid), subs)
    };
    let before = marks(p);
    let sampler = RssSampler::start(p.relays[0].pid, Duration::from_millis(100), 1_000_000);
    let reached = wait_all(&all, &p.subs, sp.last, limit);
    let after = marks(p);
    let rss = sampler.finish();
    reached?;
    for (i, c) in p.subs.iter_mut().enumerate() {
        match wait_with_cpu(c, Instant::now() + Duration::from_secs(60))? {
            Some((st, _)) if st.success() => {}
            other => bail!(
                "subscriber process {i} did not exit cleanly after its last ledger: {other:?}"
            ),
        }
    }
    let per = |secs: f64| secs * 1e3 / f64::from(sp.last - sp.mark);
    let off_path: f64 = (after.1.iter())
        .filter(|(name, _)| OFF_PATH_THREADS.iter().any(|o| name.starts_with(o)))
        .map(|(name, c)| (c - before.1.get(name).copied().unwrap_or(0.0)).max(0.0))
        .sum();
    let relay = after.0[0] - before.0[0];
    let others: f64 = (1..after.0.len()).map(|i| after.0[i] - before.0[i]).sum();
    let subs: Vec<f64> = (before.2.iter().zip(&after.2))
        .filter_map(|(b, a)| Some(a.as_ref()? - b.as_ref()?))
        .collect();
    let cpu = t.cpu.get_or_insert_with(Cpu::default);
    cpu.relay_ms = per(relay);
    cpu.path_ms = per((relay - off_path).max(0.0));
    cpu.others_ms = (after.0.len() > 1).then(|| per(others));
    cpu.sub_ms =
        (subs.len() == after.2.len()).then(|| per(subs.iter().sum::<f64>() / subs.len() as f64));
    let mem = t.memory.get_or_insert_with(Memory::default);
    let peak = rss.iter().map(|s| crate::procs::mib(s.rss_kib));
    mem.peak_mib = peak.fold(0.0, f64::max);
    mem.per_session_mib = mem
        .alone_mib
        .map(|a| (mem.peak_mib - a) / f64::from(sc.subscribers));
    Ok(())
}

/// The relay's CPU per ledger and memory with no subscriber, over the baseline ledgers.
fn alone(sc: &Scenario, relay: &mut RelayProc, sp: Span, t: &mut Taken) -> anyhow::Result<()> {
    let limit =
        Duration::from_secs_f64(sc.cadence_ms() / 1e3 * f64::from(sc.baseline_ledgers + 3) + 60.0);
    let wait = |r: &mut RelayProc, seq: u32| -> anyhow::Result<(f64, u32)> {
        let newest = r.wait_newest(seq, limit)?;
        Ok((cpu_seconds(r.pid).context("the relay's CPU")?, newest))
    };
    let (c0, n0) = wait(relay, sp.start + 1)?;
    let (c1, n1) = wait(relay, sp.start + sc.baseline_ledgers.max(3) - 1)?;
    t.cpu.get_or_insert_with(Cpu::default).alone_ms =
        Some((c1 - c0) * 1e3 / f64::from(n1.saturating_sub(n0).max(1)));
    t.memory.get_or_insert_with(Memory::default).alone_mib =
        status_kib(relay.pid, "VmRSS").map(crate::procs::mib);
    Ok(())
}

/// The relay's memory and CPU per idle session, as many as the row's at the tip.
fn idle(
    sc: &Scenario,
    c: &Cluster,
    dir: &Path,
    last: u32,
    p: &mut Procs,
    t: &mut Taken,
) -> anyhow::Result<()> {
    let pid = p.relays[0].pid;
    std::thread::sleep(Duration::from_millis(500));
    let before = status_kib(pid, "VmRSS").context("the relay's memory")?;
    let (kids, stats, _) = subscribers(sc, c, dir, p, last, None, "idle")?;
    p.subs = kids;
    let limit = Duration::from_secs(60) + Duration::from_millis(500) * u32::from(sc.processes());
    wait_all(&stats, &p.subs, last, limit)?;
    let lanes = f64::from(sc.lanes);
    let up = |m: &Scrape| (m.labelled("subscriber_lanes").filter(|(_, v)| *v == lanes)).count();
    let all_up = |r: &RelayProc| (r.scrape()).is_ok_and(|m| up(&m) >= usize::from(sc.subscribers));
    let what = "every idle session's lanes up";
    p.relays[0].wait_until(what, Duration::from_secs(30), all_up)?;
    std::thread::sleep(Duration::from_secs(1));
    let (c0, t0) = (cpu_seconds(pid), Instant::now());
    std::thread::sleep(Duration::from_secs_f64(sc.idle / 1e3));
    let (c1, secs) = (cpu_seconds(pid), t0.elapsed().as_secs_f64());
    let with = status_kib(pid, "VmRSS").context("the relay's memory")?;
    for c in p.subs.iter_mut() {
        crate::procs::stop(c, Duration::from_secs(5));
    }
    let n = f64::from(sc.subscribers);
    t.cpu.get_or_insert_with(Cpu::default).idle_ms_per_s =
        c0.zip(c1).map(|(a, b)| (b - a) * 1e3 / secs / n);
    let mem = t.memory.get_or_insert_with(Memory::default);
    mem.idle_per_session_mib = Some(crate::procs::mib(with.saturating_sub(before)) / n);
    Ok(())
}

/// The relay's per-lane counters, with each lane's cap on a direct emulated row.
fn lanes(sc: &Scenario, m: &Scrape) -> Vec<Lane> {
    let direct = sc.topology == TopoKind::Direct;
    let cap = sc
        .shape()
        .filter(|_| direct)
        .map(|s| s.flow_bps as f64 / 1e6);
    (0..sc.lanes)
        .map(|lane| {
            let v = |name: &str| m.get(&format!("lane_{name}{{lane=\"{lane}\"}}"));
            Lane {
                lane,
                cap_mbit: cap.map(|c| if sc.half_cap && lane == 0 { c / 2.0 } else { c }),
                sent_bytes: v("bytes_sent_total"),
                delivered_bytes: v("delivered_bytes_total"),
                lost_packets: v("lost_packets_total"),
                busy_s: v("busy_seconds_total"),
                rtt_ms: v("rtt_seconds") * 1e3,
                cwnd_bytes: v("cwnd_bytes"),
                mtu_bytes: v("mtu_bytes"),
            }
        })
        .collect()
}
