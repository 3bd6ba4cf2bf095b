//! The hedge part of `ledger-bench tiers`: relays A and B on the emulated network, B's path
//! degraded, and a subscriber on A, on B, then hedged on both.

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};

use super::{row, settings, wire_mb, Delivery, Part, TierRow, TiersArgs};
use crate::fanout::Payload;
use crate::harness::{read_stats_lenient, RelaySettings};
use crate::netem::{Netem, Shape, RELAY_ADDR};
use crate::proc::{kill_all, sibling_binary, stop};
use crate::stats::Record;

/// A relay inside `ns` on RELAY_ADDR:`port` with an endless synthetic source.
fn relay_in(
    ns: &str,
    bin: &Path,
    certs: &Path,
    dir: &Path,
    s: &RelaySettings,
    port: u16,
) -> anyhow::Result<Child> {
    std::fs::create_dir_all(dir)?;
    let log = dir.join("relay.log");
    let mut child = Netem::exec_in(ns, bin)
        .arg("run")
        .args(["--listen", &format!("{RELAY_ADDR}:{port}"), "--certs"])
        .arg(certs)
        .args(["--name", "relay", "--data-dir"])
        .arg(dir.join("data"))
        .args(["--source", &s.synthetic_source()])
        .args(["--cadence", &format!("{}ms", s.cadence_ms)])
        .args(["--emit", &format!("{}ms", s.emit_ms)])
        .args(["--codec", &s.codec, "--chunk-size", &s.chunk.to_string()])
        .args(["--retention", &s.retention.to_string()])
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .spawn()
        .context("starting ledger-relay")?;
    crate::proc::track(&child);
    if let Err(e) = crate::scenario::wait_listening(&log, &mut child, Duration::from_secs(30)) {
        kill_all(std::slice::from_mut(&mut child));
        return Err(e);
    }
    Ok(child)
}

/// The hedge part: rows `A`, `B` (degraded) and `hedged`.
pub(super) fn hedge(a: &TiersArgs, work: &Path, payload: Payload) -> anyhow::Result<Vec<TierRow>> {
    let (relay_bin, sub_bin) = (
        sibling_binary("ledger-relay")?,
        sibling_binary("ledger-subscribe")?,
    );
    let certs = work.join("certs");
    let dir = work.join("hedge");
    let healthy = f64::from(a.lanes) * a.flow_mbit * 1e6;
    let mut netem = Netem::create(
        "tiers",
        Shape {
            flow_bps: (a.flow_mbit * 1e6) as u64,
            aggregate_bps: (4.0 * healthy) as u64,
        },
    )?;
    let (port_a, port_b) = (7101u16, 7102u16);
    netem.cap_source_port(port_a, healthy as u64)?;
    netem.cap_source_port(port_b, (healthy / a.degrade) as u64)?;
    let mut s = settings(a, payload, a.cadence_ms, 2);
    s.count = None;
    let mut relays = Vec::new();
    let r = (|| -> anyhow::Result<Vec<TierRow>> {
        relays.push(relay_in(
            &netem.relay_ns,
            &relay_bin,
            &certs,
            &dir.join("a"),
            &s,
            port_a,
        )?);
        relays.push(relay_in(
            &netem.relay_ns,
            &relay_bin,
            &certs,
            &dir.join("b"),
            &s,
            port_b,
        )?);
        let mut rows = Vec::new();
        for (name, relays, hedged) in [
            ("A", vec![port_a], false),
            ("B", vec![port_b], false),
            ("hedged", vec![port_a, port_b], true),
        ] {
            let addrs: Vec<String> = relays.iter().map(|p| format!("{RELAY_ADDR}:{p}")).collect();
            let stats = dir.join(format!("{name}.csv"));
            let mut cmd = Netem::exec_in(&netem.sub_ns, &sub_bin);
            cmd.args(["--relay", &addrs.join(","), "--certs"])
                .arg(&certs)
                .args([
                    "--name",
                    "sub-0",
                    "--from",
                    "tip",
                    "--lanes",
                    &a.lanes.to_string(),
                ])
                .args([
                    "--count",
                    &(a.warmup + a.ledgers).to_string(),
                    "--out",
                    "/dev/null",
                ])
                .arg("--stats")
                .arg(&stats);
            if hedged {
                cmd.arg("--hedge");
            }
            let mut child = cmd
                .env("RUST_LOG", "warn")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(dir.join(format!("{name}.log")))?)
                .spawn()
                .context("starting ledger-subscribe")?;
            crate::proc::track(&child);
            let limit = Duration::from_secs_f64(
                a.cadence_ms / 1e3 * f64::from(a.warmup + a.ledgers) * 3.0 + 60.0,
            );
            let st = crate::harness::wait_child(&mut child, limit)?;
            if !st.success() {
                bail!("the {name} subscriber exited with {st}");
            }
            let recs = read_stats_lenient(&stats)?;
            let seqs: Vec<u32> = recs.iter().map(|r| r.seq).collect();
            if seqs.len() != (a.warmup + a.ledgers) as usize
                || seqs.windows(2).any(|w| w[1] != w[0] + 1)
            {
                bail!(
                    "the {name} subscriber wrote {seqs:?}, not {} consecutive ledgers",
                    a.warmup + a.ledgers
                );
            }
            let measured: Vec<Record> = recs.into_iter().skip(a.warmup as usize).collect();
            let mut r = row(Part::Hedge, name, payload, 1, a.cadence_ms);
            r.ledgers = a.ledgers;
            r.wire_mb = wire_mb(std::slice::from_ref(&measured));
            r.delivery = Delivery::of(measured.iter().map(|r| (r.seq, r.delivery_ms)).collect());
            rows.push(r);
        }
        Ok(rows)
    })();
    for c in relays.iter_mut() {
        stop(c, Duration::from_secs(10));
    }
    drop(netem);
    r
}
