//! The emulated cloud network: two network namespaces joined by a veth pair, addresses from
//! 198.18.0.0/15 (RFC 2544's benchmarking range), and on the relay's side an HTB qdisc with one
//! class per subscriber lane, keyed by the lane's destination port, so the rate cap is per
//! 5-tuple as EC2's per-flow limit is.
//!
//! `fq`, `netem` and `sfq` are not available in this kernel; HTB, TBF and u32 filters are.
//! Everything is done with the `ip` and `tc` commands. [`Netem`] removes its namespaces when
//! dropped, and [`cleanup_registered`] (called by the SIGINT/SIGTERM handler)
//! removes every namespace this process created, so an error or Ctrl-C never leaves one behind.

use std::process::{Command, Stdio};
use std::sync::Mutex;

use anyhow::{bail, Context};

/// Relay-side address (inside the relay namespace).
pub const RELAY_ADDR: &str = "198.18.0.1";
/// Subscriber-side address.
pub const SUB_ADDR: &str = "198.18.0.2";

/// Namespaces this process created and has not removed yet.
static CREATED: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Whether we run as root (needed for namespaces and qdiscs).
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Why the emulated network cannot be used here, or `None` when it can.
pub fn unavailable_reason() -> Option<String> {
    if !is_root() {
        return Some("not root: network namespaces and tc qdiscs need root".into());
    }
    for tool in ["ip", "tc"] {
        let found = Command::new(tool)
            .arg("-V")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok();
        if !found {
            return Some(format!("`{tool}` not found (install iproute2)"));
        }
    }
    None
}

/// Shape of the emulated path.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Shape {
    /// Per-flow cap in bit/s (every lane and the TCP baseline flow its own HTB class).
    pub flow_bps: u64,
    /// Aggregate cap in bit/s over all flows (the parent class).
    pub aggregate_bps: u64,
}

/// Two namespaces joined by a veth pair. Dropping it deletes both namespaces (which deletes the
/// veth pair and its qdiscs with them).
#[derive(Debug)]
pub struct Netem {
    /// The relay's namespace.
    pub relay_ns: String,
    /// The subscribers' namespace.
    pub sub_ns: String,
    relay_dev: String,
    sub_dev: String,
    next_class: u32,
}

fn run(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {}", args[0]))?;
    if !out.status.success() {
        bail!(
            "`{}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

fn delete_ns(name: &str) {
    let _ = Command::new("ip")
        .args(["netns", "del", name])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// Removes every namespace this process created (for the signal handler).
pub fn cleanup_registered() {
    let names = match CREATED.lock() {
        Ok(mut v) => std::mem::take(&mut *v),
        Err(p) => std::mem::take(&mut *p.into_inner()),
    };
    for n in names {
        delete_ns(&n);
    }
}

impl Netem {
    /// Creates the namespaces (named after our pid and `tag`, so parallel runs do not collide),
    /// the veth pair and an HTB root with the aggregate class; lanes get their classes with
    /// [`Netem::cap_port`].
    pub fn create(tag: &str, shape: Shape) -> anyhow::Result<Netem> {
        if let Some(reason) = unavailable_reason() {
            bail!("emulated network unavailable: {reason}");
        }
        let pid = std::process::id();
        let relay_ns = format!("lrb-{pid}-{tag}-r");
        let sub_ns = format!("lrb-{pid}-{tag}-s");
        // Interface names are limited to 15 bytes.
        let relay_dev = format!("lr{}{}", pid % 1_000_000, &tag[..tag.len().min(3)]);
        let sub_dev = format!("ls{}{}", pid % 1_000_000, &tag[..tag.len().min(3)]);
        // Built before the first command so that a failure half-way still removes what exists.
        let netem = Netem {
            relay_ns: relay_ns.clone(),
            sub_ns: sub_ns.clone(),
            relay_dev: relay_dev.clone(),
            sub_dev: sub_dev.clone(),
            next_class: 0x10,
        };
        for ns in [&relay_ns, &sub_ns] {
            run(&["ip", "netns", "add", ns])?;
            if let Ok(mut v) = CREATED.lock() {
                v.push(ns.clone());
            }
        }
        let rate = |bps: u64| format!("{bps}bit");
        run(&[
            "ip", "link", "add", &relay_dev, "type", "veth", "peer", "name", &sub_dev,
        ])?;
        run(&["ip", "link", "set", &relay_dev, "netns", &relay_ns])?;
        run(&["ip", "link", "set", &sub_dev, "netns", &sub_ns])?;
        run(&[
            "ip",
            "-n",
            &relay_ns,
            "addr",
            "add",
            &format!("{RELAY_ADDR}/30"),
            "dev",
            &relay_dev,
        ])?;
        run(&[
            "ip",
            "-n",
            &sub_ns,
            "addr",
            "add",
            &format!("{SUB_ADDR}/30"),
            "dev",
            &sub_dev,
        ])?;
        for (ns, dev) in [(&relay_ns, &relay_dev), (&sub_ns, &sub_dev)] {
            run(&["ip", "-n", ns, "link", "set", dev, "up"])?;
            run(&["ip", "-n", ns, "link", "set", "lo", "up"])?;
        }
        // Unclassified traffic (handshakes before a port is capped, anything else) is not
        // limited: HTB sends packets of a missing default class directly.
        run(&[
            "tc", "-n", &relay_ns, "qdisc", "add", "dev", &relay_dev, "root", "handle", "1:",
            "htb", "default", "9999", "r2q", "1000",
        ])?;
        run(&[
            "tc",
            "-n",
            &relay_ns,
            "class",
            "add",
            "dev",
            &relay_dev,
            "parent",
            "1:",
            "classid",
            "1:1",
            "htb",
            "rate",
            &rate(shape.aggregate_bps),
            "ceil",
            &rate(shape.aggregate_bps),
        ])?;
        Ok(netem)
    }

    /// Sets the MTU of both ends of the veth pair (default 1500), e.g. 9001 as in an EC2 VPC.
    pub fn set_mtu(&self, mtu: u32) -> anyhow::Result<()> {
        let mtu = mtu.to_string();
        for (ns, dev) in [
            (&self.relay_ns, &self.relay_dev),
            (&self.sub_ns, &self.sub_dev),
        ] {
            run(&["ip", "-n", ns, "link", "set", "dev", dev, "mtu", &mtu])?;
        }
        Ok(())
    }

    /// Gives destination port `port` (UDP lanes and the TCP baseline alike) its own HTB class
    /// capped at `flow_bps`.
    pub fn cap_port(&mut self, port: u16, flow_bps: u64) -> anyhow::Result<()> {
        self.cap_match("dport", port, flow_bps)
    }

    /// Gives what a relay listening on `port` sends (every connection it serves, all sharing
    /// the class) its own HTB class capped at `bps`.
    pub fn cap_source_port(&mut self, port: u16, bps: u64) -> anyhow::Result<()> {
        self.cap_match("sport", port, bps)
    }

    /// An HTB class capped at `flow_bps` for the packets whose UDP/TCP `field` (`dport` or
    /// `sport`) is `port`.
    fn cap_match(&mut self, field: &str, port: u16, flow_bps: u64) -> anyhow::Result<()> {
        let class = format!("1:{:x}", self.next_class);
        self.next_class += 1;
        let rate = format!("{flow_bps}bit");
        run(&[
            "tc",
            "-n",
            &self.relay_ns,
            "class",
            "add",
            "dev",
            &self.relay_dev,
            "parent",
            "1:1",
            "classid",
            &class,
            "htb",
            "rate",
            &rate,
            "ceil",
            &rate,
            "burst",
            "15k",
            "cburst",
            "15k",
        ])?;
        run(&[
            "tc",
            "-n",
            &self.relay_ns,
            "filter",
            "add",
            "dev",
            &self.relay_dev,
            "parent",
            "1:",
            "protocol",
            "ip",
            "prio",
            "1",
            "u32",
            "match",
            "ip",
            field,
            &port.to_string(),
            "0xffff",
            "flowid",
            &class,
        ])
    }

    /// A command that runs `program` inside namespace `ns` when given, else on the host.
    pub fn exec_in(ns: Option<&str>, program: &std::path::Path) -> Command {
        let Some(ns) = ns else {
            return Command::new(program);
        };
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns]).arg(program);
        c
    }
}

impl Drop for Netem {
    fn drop(&mut self) {
        for ns in [&self.relay_ns, &self.sub_ns] {
            delete_ns(ns);
        }
        if let Ok(mut v) = CREATED.lock() {
            v.retain(|n| n != &self.relay_ns && n != &self.sub_ns);
        }
    }
}
