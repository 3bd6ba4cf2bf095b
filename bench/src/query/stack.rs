//! The processes of one network of `ledger-bench query`: on the core side a `ledger-relay run`
//! whose `pipe:` source is `ledger-core-double` (its ports forwarded with `--core-http` and
//! `--core-query`); on the RPC side `ledger-captive-core` (the stand-in) serving core's ports
//! through the relay. On the emulated network the core side is the relay namespace and the RPC
//! side the other one, with a [`crate::delay`] forwarder in front of the relay's port holding
//! each datagram half the round trip.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::cluster::{Cluster, RelayProc, RelaySettings};
use crate::netem::{Netem, RELAY_ADDR};
use crate::proc::{kill_all, sibling_binary, track};

/// Ports inside the namespaces (each namespace has its own, so fixed numbers do not clash).
const DOUBLE_HTTP: u16 = 21626;
const DOUBLE_QUERY: u16 = 21628;
const STAND_IN_HTTP: u16 = 11626;
const STAND_IN_QUERY: u16 = 11628;
const DELAY_PORT: u16 = 27400;

/// Where the two sides run: the host (loopback) or the emulated network's namespaces.
pub struct Sides<'a> {
    /// The emulated network, or `None` for loopback.
    pub netem: Option<&'a Netem>,
    /// Half the emulated round trip.
    pub one_way: Duration,
}

impl Sides<'_> {
    /// The core side's namespace.
    pub fn core_ns(&self) -> Option<&str> {
        self.netem.map(|n| n.relay_ns.as_str())
    }

    /// The RPC side's namespace.
    pub fn rpc_ns(&self) -> Option<&str> {
        self.netem.map(|n| n.sub_ns.as_str())
    }
}

/// The running processes; stopped when dropped.
pub struct Stack {
    /// The relay.
    pub relay: Option<RelayProc>,
    children: Vec<Child>,
    /// The relay address the RPC side uses (the delay forwarder's on the emulated network).
    pub rpc_relay: String,
    /// The double's query port, from the core side.
    pub direct: SocketAddr,
    /// The stand-in's query port, from the RPC side.
    pub through: SocketAddr,
}

impl Drop for Stack {
    fn drop(&mut self) {
        kill_all(&mut self.children);
        if let Some(r) = self.relay.take() {
            r.stop();
        }
    }
}

impl Stack {
    /// Starts the relay with the double, the delay forwarder if emulated, and the stand-in,
    /// and waits until the stand-in answers.
    pub fn start(
        c: &Cluster,
        sides: &Sides<'_>,
        dir: &Path,
        testnet: &Path,
        cadence: Duration,
    ) -> anyhow::Result<Stack> {
        let relay = start_relay(c, sides, dir, testnet, cadence)?;
        let mut stack = Stack {
            rpc_relay: relay.addr.to_string(),
            relay: Some(relay),
            children: Vec::new(),
            direct: SocketAddr::from(([127, 0, 0, 1], DOUBLE_QUERY)),
            through: SocketAddr::from(([127, 0, 0, 1], STAND_IN_QUERY)),
        };
        if sides.netem.is_some() {
            let to = stack.rpc_relay.clone();
            stack.rpc_relay = format!("{RELAY_ADDR}:{DELAY_PORT}");
            let delay = format!("{}us", sides.one_way.as_micros());
            let listen = stack.rpc_relay.clone();
            let args = [
                "udp-delay",
                "--listen",
                &listen,
                "--to",
                &to,
                "--delay",
                &delay,
            ];
            stack.spawn(
                sides.core_ns(),
                "ledger-bench",
                &args,
                &dir.join("delay.log"),
            )?;
        }
        let stand_in = stand_in_command(c, sides.rpc_ns(), &stack.rpc_relay, dir)?;
        stack.children.push(stand_in);
        track(stack.children.last().expect("just pushed"));
        stack.wait_stand_in(sides, dir)?;
        Ok(stack)
    }

    fn spawn(
        &mut self,
        ns: Option<&str>,
        bin: &str,
        args: &[&str],
        log: &Path,
    ) -> anyhow::Result<()> {
        let child = Netem::exec_in(ns, &sibling_binary(bin)?)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log)?)
            .spawn()
            .with_context(|| format!("starting {bin}"))?;
        track(&child);
        self.children.push(child);
        Ok(())
    }

    /// Waits until the stand-in's query port answers a query (any status) from its side.
    fn wait_stand_in(&mut self, sides: &Sides<'_>, dir: &Path) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let bodies = dir.join("probe.txt");
        std::fs::write(&bodies, "key=AAAA\n")?;
        loop {
            let out = dir.join("probe.csv");
            let ok = super::run_client(sides.rpc_ns(), self.through, &bodies, 1, 0.0, 1, &out)
                .and_then(|()| super::client::read(&out))
                .is_ok_and(|s| s.iter().all(|s| s.status != 0));
            if ok {
                return Ok(());
            }
            for c in &mut self.children {
                if let Some(st) = c.try_wait()? {
                    bail!(
                        "a process of the stack exited ({st}): see {}",
                        dir.display()
                    );
                }
            }
            if Instant::now() > deadline {
                bail!("the stand-in did not answer on its query port within 30 s");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// `ledger-relay run` with `ledger-core-double` as its `pipe:` source replaying `testnet` at
/// `cadence`, forwarding core requests to the double's ports.
fn start_relay(
    c: &Cluster,
    sides: &Sides<'_>,
    dir: &Path,
    testnet: &Path,
    cadence: Duration,
) -> anyhow::Result<RelayProc> {
    let double = sibling_binary("ledger-core-double")?;
    let source = format!(
        "pipe:{} --ledgers {} --cadence {}us --http-port {DOUBLE_HTTP} --query-port {DOUBLE_QUERY}",
        double.display(),
        testnet.display(),
        cadence.as_micros()
    );
    let extra: Vec<String> = [
        "--core-http".to_owned(),
        format!("http://127.0.0.1:{DOUBLE_HTTP}"),
        "--core-query".to_owned(),
        format!("http://127.0.0.1:{DOUBLE_QUERY}"),
    ]
    .into();
    let mut s = RelaySettings::endless(4096, 1.0, cadence.as_secs_f64() * 1e3);
    s.retention = 1000;
    let ns = sides.core_ns().map(|n| (n, RELAY_ADDR));
    c.relay_in(ns, &dir.join("relay"), &s, &source, &extra)
}

/// `ledger-captive-core` as stellar-rpc's SDK runs it for an unbounded range: `new-db`,
/// `catchup` to the ledger before the first, then `run` with its meta to /dev/null, its
/// ports from the config file, its relay from the environment.
fn stand_in_command(
    c: &Cluster,
    ns: Option<&str>,
    relay: &str,
    dir: &Path,
) -> anyhow::Result<Child> {
    let home = dir.join("stand-in");
    std::fs::create_dir_all(&home)?;
    let conf = home.join("stellar-core.conf");
    std::fs::write(
        &conf,
        format!("HTTP_PORT = {STAND_IN_HTTP}\nHTTP_QUERY_PORT = {STAND_IN_QUERY}\n"),
    )?;
    let bin = sibling_binary("ledger-captive-core")?;
    let (b, conf) = (bin.display(), conf.display());
    let first_but_one = crate::query::FIRST - 1;
    let script = format!(
        "{b} --conf {conf} new-db && {b} --conf {conf} catchup {first_but_one}/0 && \
         exec {b} --conf {conf} run --metadata-output-stream fd:3 3>/dev/null"
    );
    let log = std::fs::File::create(home.join("stand-in.log"))?;
    let child = Netem::exec_in(ns, Path::new("sh"))
        .args(["-c", &script])
        .current_dir(&home)
        .env("LEDGER_CAPTIVE_CORE_CONFIG", "")
        .env("LEDGER_CAPTIVE_CORE_RELAY", relay)
        .env("LEDGER_CAPTIVE_CORE_CERTS", &c.certs)
        .env("LEDGER_CAPTIVE_CORE_NAME", "sub-0")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .context("starting ledger-captive-core")?;
    Ok(child)
}

/// A command for the bench's own binary (a hidden helper) in `ns`.
pub fn bench_helper(ns: Option<&str>) -> anyhow::Result<Command> {
    let bin = match sibling_binary("ledger-bench") {
        Ok(b) => b,
        Err(_) => std::env::current_exe().context("locating ledger-bench")?,
    };
    let mut cmd = Netem::exec_in(ns, &bin);
    cmd.stdin(Stdio::null()).stdout(Stdio::null());
    Ok(cmd)
}
