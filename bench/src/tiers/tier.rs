//! The tier part of `ledger-bench tiers`: root -> edge -> subscriber against root ->
//! subscriber, store-and-forward and cut-through edges in the same run, on loopback or across an
//! emulated zone link.

use std::path::Path;
use std::time::Duration;

use super::{
    collect, cpu_of, edge_with, root_in, row, settings, span, subscriber, wait_all, wire_mb,
    Delivery, Part, Procs, TierRow, TiersArgs,
};
use crate::fanout::Payload;
use crate::netem::{Netem, RELAY_ADDR};

/// The tier part for `payload`: rows `direct`, `edge` and `edge-ct`. On loopback, or with
/// `zone` on the emulated network: the root in the relay namespace behind a link whose share
/// for the root's port is capped at `zone.1` bit/s (what crosses it: the direct subscriber's and
/// both edges' upstream lanes), the edges and every subscriber in the subscriber namespace.
pub(super) fn tier(
    a: &TiersArgs,
    work: &Path,
    payload: Payload,
    mut zone: Option<(&mut Netem, u64)>,
) -> anyhow::Result<Vec<TierRow>> {
    let part = if zone.is_some() {
        Part::TierZone
    } else {
        Part::Tier
    };
    let root_ns = zone.as_ref().map(|z| (z.0.relay_ns.clone(), RELAY_ADDR));
    let sub_ns = zone.as_ref().map(|z| z.0.sub_ns.clone());
    // The edges listen on the subscriber namespace's loopback: their subscribers are local to
    // them, as in a zone (and the relay certificate names 127.0.0.1).
    let edge_ns = sub_ns.as_deref().map(|n| (n, "127.0.0.1"));
    let c = crate::cluster::Cluster::local(&work.join("certs"), Default::default())?;
    let dir = work.join(format!("{part:?}-{payload:?}").to_lowercase());
    let sp = span(a, a.cadence.cadence_ms, 5.0);
    let s = settings(a, payload, a.cadence.cadence_ms, sp.last);
    let mut p = Procs::default();
    let root_ns = root_ns.as_ref().map(|(n, ip)| (n.as_str(), *ip));
    p.relays
        .push(root_in(root_ns, &c, &dir.join("root"), &s, "120s")?);
    if let Some((netem, bps)) = zone.as_mut() {
        netem.cap_source_port(p.relays[0].addr.port(), *bps)?;
    }
    // Two edges on the root: one store-and-forward, one cut-through (`--cut-through`).
    for (name, cert, cut_through) in [("edge", "sub-15", false), ("edge-ct", "sub-14", true)] {
        let e = edge_with(
            edge_ns,
            &c,
            &dir.join(name),
            &s,
            &p.relays[0],
            cert,
            a.stream.lanes.lanes,
            cut_through,
        )?;
        p.relays.push(e);
    }
    let mut stats = Vec::new();
    for i in 0..3 {
        let name = format!("sub-{i}");
        let (c, st) = subscriber(
            sub_ns.as_deref(),
            &c,
            &p.relays[i],
            &dir,
            &name,
            a.stream.lanes.lanes,
            sp,
        )?;
        p.subs.push(c);
        stats.push(st);
    }
    let limit = Duration::from_secs_f64(a.cadence.cadence_ms / 1e3 * f64::from(sp.last) + 60.0);
    wait_all(&stats, &mut p.subs, sp.measured - 1, limit)?;
    let cpus = |p: &Procs| -> anyhow::Result<Vec<f64>> {
        (0..3).map(|i| cpu_of(&p.relays[i..=i])).collect()
    };
    let before = cpus(&p)?;
    wait_all(&stats, &mut p.subs, sp.last, limit)?;
    let after = cpus(&p)?;
    let recs = collect(&stats, sp)?;
    let per = |i: usize| (after[i] - before[i]) * 1e3 / f64::from(a.series.count.ledgers);
    let d =
        |i: usize| -> Vec<(u32, f64)> { recs[i].iter().map(|r| (r.seq, r.delivery_ms)).collect() };
    let mut rows = Vec::new();
    for (i, name) in ["direct", "edge", "edge-ct"].into_iter().enumerate() {
        let mut r = row(part, name, payload, 1, a.cadence.cadence_ms);
        r.delivery = Delivery::of(d(i));
        if i > 0 {
            r.added = Some(Delivery::of(
                d(i).iter()
                    .zip(d(0))
                    .map(|(t, d)| (t.0, t.1 - d.1))
                    .collect(),
            ));
            r.edge_cpu_ms = Some(per(i));
        }
        r.ledgers = a.series.count.ledgers;
        r.wire_mb = wire_mb(&recs[i..=i]);
        r.root_cpu_ms = Some(per(0));
        rows.push(r);
    }
    Ok(rows)
}
