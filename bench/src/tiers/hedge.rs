//! The hedge part of `ledger-bench tiers`: relays A and B on the emulated network, B's path
//! degraded, and a subscriber on A, on B, then hedged on both.

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context};

use super::{row, settings, wire_mb, Delivery, Part, TierRow, TiersArgs};
use crate::cluster::{Cluster, RelayProc, SubSpec};
use crate::fanout::Payload;
use crate::netem::{Netem, Shape, RELAY_ADDR};
use crate::stats::Record;

/// The hedge part: rows `A`, `B` (degraded) and `hedged`.
pub(super) fn hedge(a: &TiersArgs, work: &Path, payload: Payload) -> anyhow::Result<Vec<TierRow>> {
    let c = Cluster::local(&work.join("certs"), Default::default())?;
    let dir = work.join("hedge");
    // Ledgers each subscriber takes, the warm-up's included.
    let total = a.series.warmup + a.series.count.ledgers;
    let healthy = f64::from(a.stream.lanes.lanes) * a.flow.flow_mbit * 1e6;
    let mut netem = Netem::create(
        "tiers",
        Shape {
            flow_bps: (a.flow.flow_mbit * 1e6) as u64,
            aggregate_bps: (4.0 * healthy) as u64,
        },
    )?;
    let mut s = settings(a, payload, a.cadence.cadence_ms, 2);
    s.count = None;
    let mut relays: Vec<RelayProc> = Vec::new();
    let r = (|| -> anyhow::Result<Vec<TierRow>> {
        let relay_ns = netem.relay_ns.clone();
        let ns = Some((relay_ns.as_str(), RELAY_ADDR));
        for (name, bps) in [("a", healthy), ("b", healthy / a.degrade)] {
            let relay = c.relay_in(ns, &dir.join(name), &s, &s.synthetic_source(), &[])?;
            netem.cap_source_port(relay.addr.port(), bps as u64)?;
            relays.push(relay);
        }
        let mut rows = Vec::new();
        for (name, addrs, hedged) in [
            ("A", relays[0].addr.to_string(), false),
            ("B", relays[1].addr.to_string(), false),
            (
                "hedged",
                format!("{},{}", relays[0].addr, relays[1].addr),
                true,
            ),
        ] {
            let mut spec = SubSpec::new(
                "sub-0",
                "tip",
                Some(total),
                a.stream.lanes.lanes,
                &dir,
                name,
            );
            if hedged {
                spec.extra.push("--hedge".into());
            }
            let limit =
                Duration::from_secs_f64(a.cadence.cadence_ms / 1e3 * f64::from(total) * 3.0 + 60.0);
            let (recs, _) = (c.run_subscriber(Some(&netem.sub_ns), &addrs, &spec, limit))
                .with_context(|| format!("the {name} subscriber"))?;
            let seqs: Vec<u32> = recs.iter().map(|r| r.seq).collect();
            if seqs.len() != total as usize || seqs.windows(2).any(|w| w[1] != w[0] + 1) {
                bail!(
                    "the {name} subscriber wrote {seqs:?}, not {} consecutive ledgers",
                    total
                );
            }
            let measured: Vec<Record> = recs.into_iter().skip(a.series.warmup as usize).collect();
            let mut r = row(Part::Hedge, name, payload, 1, a.cadence.cadence_ms);
            r.ledgers = a.series.count.ledgers;
            r.wire_mb = wire_mb(std::slice::from_ref(&measured));
            r.delivery = Delivery::of(measured.iter().map(|r| (r.seq, r.delivery_ms)).collect());
            rows.push(r);
        }
        Ok(rows)
    })();
    for relay in relays {
        relay.stop();
    }
    drop(netem);
    r
}
