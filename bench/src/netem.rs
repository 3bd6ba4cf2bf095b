//! The emulated cloud network: two namespaces joined by a veth pair (198.18.0.0/15), on the
//! relay's side an HTB class per flow keyed by a port, so a cap is per 5-tuple as EC2's is.
//! [`Netem`] removes its namespaces when dropped, [`cleanup_registered`] on Ctrl-C.

use std::os::fd::AsFd;
use std::process::{Command, Stdio};
use std::sync::Mutex;

use anyhow::{bail, Context};

/// Relay-side address (inside the relay namespace).
pub const RELAY_ADDR: &str = "198.18.0.1";
/// Subscriber-side address.
pub const SUB_ADDR: &str = "198.18.0.2";

/// Namespaces this process created and has not removed yet.
static CREATED: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Why the emulated network cannot be used here, or `None` when it can.
pub fn unavailable_reason() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("not root: network namespaces and tc qdiscs need root".into());
    }
    for tool in ["ip", "tc"] {
        let mut cmd = Command::new(tool);
        if (cmd.arg("-V").stdout(Stdio::null()).stderr(Stdio::null()))
            .status()
            .is_err()
        {
            return Some(format!("`{tool}` not found (install iproute2)"));
        }
    }
    None
}

/// Shape of the emulated path.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Shape {
    /// Per-flow cap, bit/s.
    pub flow_bps: u64,
    /// Aggregate cap over every flow, bit/s (the parent class).
    pub aggregate_bps: u64,
    /// MTU of both ends of the link (EC2's jumbo frames: 9001) [default: 1500].
    pub link_mtu: Option<u32>,
}

/// Two namespaces joined by a veth pair; dropping it deletes both (and the pair with them).
#[derive(Debug)]
pub struct Netem {
    /// The relays' namespace.
    pub relay_ns: String,
    /// The subscribers' namespace.
    pub sub_ns: String,
    relay_dev: String,
    next_class: u32,
}

/// Runs a command line (words separated by spaces; no word of ours holds one).
fn run(line: &str) -> anyhow::Result<()> {
    let args: Vec<&str> = line.split_whitespace().collect();
    let out = Command::new(args[0])
        .args(&args[1..])
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {}", args[0]))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        bail!("`{line}` failed: {}", err.trim());
    }
    Ok(())
}

fn delete_ns(name: &str) {
    let _ = (Command::new("ip")
        .args(["netns", "del", name])
        .stderr(Stdio::null()))
    .status();
}

/// Removes every namespace this process created (for the Ctrl-C handler).
pub fn cleanup_registered() {
    let names = match CREATED.lock() {
        Ok(mut v) => std::mem::take(&mut *v),
        Err(p) => std::mem::take(&mut *p.into_inner()),
    };
    names.iter().for_each(|n| delete_ns(n));
}

impl Netem {
    /// Creates the namespaces (named after our pid and `tag`), the veth pair and an HTB root with
    /// the aggregate class; [`Netem::cap_port`] and [`Netem::cap_source_port`] add the flows.
    pub fn create(tag: &str, shape: Shape) -> anyhow::Result<Netem> {
        if let Some(reason) = unavailable_reason() {
            bail!("emulated network unavailable: {reason}");
        }
        let pid = std::process::id();
        // Interface names are limited to 15 bytes.
        let short = format!("{}{}", pid % 1_000_000, &tag[..tag.len().min(3)]);
        let (relay_dev, sub_dev) = (format!("lr{short}"), format!("ls{short}"));
        // Built before the first command, so that a failure half-way still removes what exists.
        let netem = Netem {
            relay_ns: format!("lrb-{pid}-{tag}-r"),
            sub_ns: format!("lrb-{pid}-{tag}-s"),
            relay_dev: relay_dev.clone(),
            next_class: 0x10,
        };
        let (rns, sns) = (netem.relay_ns.as_str(), netem.sub_ns.as_str());
        for ns in [rns, sns] {
            run(&format!("ip netns add {ns}"))?;
            if let Ok(mut v) = CREATED.lock() {
                v.push(ns.to_owned());
            }
        }
        run(&format!(
            "ip link add {relay_dev} type veth peer name {sub_dev}"
        ))?;
        let mtu = shape.link_mtu.unwrap_or(1500);
        for (ns, dev, addr) in [(rns, &relay_dev, RELAY_ADDR), (sns, &sub_dev, SUB_ADDR)] {
            run(&format!("ip link set {dev} netns {ns}"))?;
            run(&format!("ip -n {ns} addr add {addr}/30 dev {dev}"))?;
            run(&format!("ip -n {ns} link set dev {dev} mtu {mtu}"))?;
            run(&format!("ip -n {ns} link set {dev} up"))?;
            run(&format!("ip -n {ns} link set lo up"))?;
        }
        // Unclassified traffic (handshakes before a port is capped, anything else) is not
        // limited: HTB sends packets of a missing default class directly.
        let root = format!("tc -n {rns} qdisc add dev {relay_dev} root handle 1: htb");
        run(&format!("{root} default 9999 r2q 1000"))?;
        let rate = shape.aggregate_bps;
        let class = format!("tc -n {rns} class add dev {relay_dev} parent 1: classid 1:1");
        run(&format!("{class} htb rate {rate}bit ceil {rate}bit"))?;
        Ok(netem)
    }

    /// Caps what is sent to destination port `port` (a lane's pinned port) at `bps`.
    pub fn cap_port(&mut self, port: u16, bps: u64) -> anyhow::Result<()> {
        self.cap_match("dport", port, bps)
    }

    /// Caps what a server listening on `port` sends (every connection it serves shares the
    /// class) at `bps`.
    pub fn cap_source_port(&mut self, port: u16, bps: u64) -> anyhow::Result<()> {
        self.cap_match("sport", port, bps)
    }

    fn cap_match(&mut self, field: &str, port: u16, bps: u64) -> anyhow::Result<()> {
        let class = format!("1:{:x}", self.next_class);
        self.next_class += 1;
        let (ns, dev) = (&self.relay_ns, &self.relay_dev);
        let htb = format!("htb rate {bps}bit ceil {bps}bit burst 15k cburst 15k");
        run(&format!(
            "tc -n {ns} class add dev {dev} parent 1:1 classid {class} {htb}"
        ))?;
        let u32 = format!("u32 match ip {field} {port} 0xffff flowid {class}");
        run(&format!(
            "tc -n {ns} filter add dev {dev} parent 1: protocol ip prio 1 {u32}"
        ))
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

/// Runs `f` on a new thread inside network namespace `ns` (named by `ip netns`) when given,
/// else on this host's network; a network namespace is per thread, so only that thread's
/// sockets are in it.
pub fn in_ns<T: Send + 'static>(
    ns: Option<&str>,
    f: impl FnOnce() -> anyhow::Result<T> + Send + 'static,
) -> anyhow::Result<T> {
    let path = ns.map(|n| format!("/run/netns/{n}"));
    let thread = std::thread::spawn(move || {
        if let Some(path) = path {
            let file = std::fs::File::open(&path).with_context(|| format!("opening {path}"))?;
            nix::sched::setns(file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)
                .with_context(|| format!("joining the network namespace {path}"))?;
        }
        f()
    });
    thread
        .join()
        .map_err(|_| anyhow::anyhow!("a thread in a namespace panicked"))?
}
