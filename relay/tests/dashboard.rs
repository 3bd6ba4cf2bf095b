//! The Grafana dashboard (`packaging/grafana/ledger-relay.json`) queries only what a running
//! relay exports: every metric named in its PromQL, every label its selectors, `by (...)`
//! clauses and legends use, checked against `/metrics` of a relay with a session streaming on
//! two lanes (so the per-session and per-lane series exist).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use ledger_relay_wire::frame::Start;

use crate::support::*;

const DASHBOARD: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../packaging/grafana/ledger-relay.json"
);

/// Labels Prometheus adds to every series it scrapes.
const TARGET_LABELS: [&str; 2] = ["instance", "job"];

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Every `ledger_relay_*` name in `expr`, with the label names of the selector right after it.
fn metrics_in(expr: &str) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("ledger_relay_") {
        let from = &rest[at..];
        let len = from.find(|c| !is_name_char(c)).unwrap_or(from.len());
        let name = from[..len].to_owned();
        let after = &from[len..];
        let labels = match after.strip_prefix('{') {
            Some(sel) => {
                let body = &sel[..sel.find('}').expect("selector closed")];
                body.split(',')
                    .filter_map(|m| {
                        let l = m.trim();
                        let end = l.find(|c| !is_name_char(c))?;
                        (end > 0).then(|| l[..end].to_owned())
                    })
                    .collect()
            }
            None => Vec::new(),
        };
        out.push((name, labels));
        rest = after;
    }
    out
}

/// The label names of every `by (...)` clause in `expr`.
fn by_labels(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("by (") {
        let body = &rest[at + 4..];
        let end = body.find(')').expect("by clause closed");
        out.extend(body[..end].split(',').map(|l| l.trim().to_owned()));
        rest = &body[end..];
    }
    out
}

/// The `{{label}}` names of a legend format.
fn legend_labels(legend: &str) -> Vec<String> {
    legend
        .split("{{")
        .skip(1)
        .filter_map(|s| s.split_once("}}").map(|(l, _)| l.trim().to_owned()))
        .collect()
}

/// Every (expr, legend) pair in the dashboard: panel targets and template variable queries.
fn queries(v: &serde_json::Value, out: &mut Vec<(String, String)>) {
    match v {
        serde_json::Value::Object(map) => {
            if let Some(expr) = map.get("expr").and_then(|e| e.as_str()) {
                let legend = map.get("legendFormat").and_then(|l| l.as_str());
                out.push((expr.to_owned(), legend.unwrap_or("").to_owned()));
            }
            if let Some(def) = map.get("definition").and_then(|d| d.as_str()) {
                out.push((def.to_owned(), String::new()));
            }
            map.values().for_each(|v| queries(v, out));
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| queries(v, out)),
        _ => {}
    }
}

/// The exposition's series names with the label names each carries.
fn exported(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let end = line.find(|c| !is_name_char(c)).unwrap_or(line.len());
        let labels = out.entry(line[..end].to_owned()).or_default();
        if let Some(sel) = line[end..].strip_prefix('{') {
            let body = &sel[..sel.find('}').unwrap_or(sel.len())];
            for pair in body.split("\",") {
                if let Some((name, _)) = pair.split_once('=') {
                    labels.insert(name.trim().to_owned());
                }
            }
        }
    }
    out
}

#[test]
fn the_dashboard_parses_and_its_queries_use_only_the_relays_names() {
    let dash: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(DASHBOARD).unwrap()).unwrap();
    assert_eq!(dash["uid"], "ledger-relay");
    assert!(dash["schemaVersion"].as_u64().unwrap() >= 36, "Grafana 10+");
    let vars: Vec<&str> = dash["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert!(vars.contains(&"datasource"), "{vars:?}");
    let panels = dash["panels"].as_array().unwrap();
    let titles: Vec<&str> = panels
        .iter()
        .filter(|p| p["type"] == "row")
        .map(|p| p["title"].as_str().unwrap())
        .collect();
    for want in [
        "Health",
        "Delivery",
        "Lag",
        "Ring",
        "Sessions",
        "Lanes",
        "Errors",
        "Lake export",
        "Certificates",
    ] {
        assert!(titles.contains(&want), "no {want} row in {titles:?}");
    }
    // Every query panel reads the datasource variable, so the dashboard imports anywhere.
    for p in panels.iter().filter(|p| p["type"] != "row") {
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{}", p["title"]);
    }
    let ids: BTreeSet<u64> = panels.iter().map(|p| p["id"].as_u64().unwrap()).collect();
    assert_eq!(ids.len(), panels.len(), "panel ids are unique");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_queries_is_exported_by_a_running_relay() {
    let dash: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(DASHBOARD).unwrap()).unwrap();
    let mut qs = Vec::new();
    queries(&dash, &mut qs);
    assert!(qs.len() > 40, "{} queries", qs.len());

    let dir = TestDir::new();
    let mut config = dir.relay_config(SYNTHETIC);
    config.source_options.cadence = Duration::from_millis(20);
    config.metrics = Some("127.0.0.1:0".parse().unwrap());
    let relay = Running::start(config).await;
    relay.wait_for(3).await;
    let sub = Collector::start(dir.sub(&relay, "rpc-1", 2, Start::Tip), u32::MAX);
    sub.wait_for(10, 30).await;
    let addr = relay.relay.metrics_addr.unwrap();
    // The lane series appear once a session has reported its lanes (every 50 ms).
    let mut text = String::new();
    within(10, "lane series", async {
        loop {
            text = http_get(addr, "/metrics").await;
            if text.contains("ledger_relay_lane_rtt_seconds{lane=\"1\"}") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let series = exported(&text);

    let mut checked = BTreeSet::new();
    let mut missing = Vec::new();
    for (expr, legend) in &qs {
        let metrics = metrics_in(expr);
        if metrics.is_empty() {
            missing.push(format!("{expr:?} queries no ledger_relay_ metric"));
        }
        let mut labels: BTreeSet<String> = TARGET_LABELS.iter().map(|l| l.to_string()).collect();
        for (name, selector) in &metrics {
            checked.insert(name.clone());
            let Some(have) = series.get(name) else {
                missing.push(format!("{name} (in {expr:?}) is not exported"));
                continue;
            };
            for l in selector {
                if !have.contains(l) && !TARGET_LABELS.contains(&l.as_str()) {
                    missing.push(format!("{name} has no label {l} (in {expr:?})"));
                }
            }
            labels.extend(have.iter().cloned());
        }
        for l in by_labels(expr).into_iter().chain(legend_labels(legend)) {
            if !labels.contains(&l) {
                missing.push(format!("label {l} is on no series of {expr:?}"));
            }
        }
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
    eprintln!(
        "{} metrics of the dashboard, all exported: {checked:?}",
        checked.len()
    );
    let outcome = sub.halt().await;
    assert!(outcome.error.is_none(), "{:?}", outcome.error);
    relay.stop().await;
}

#[test]
fn the_parsers_find_names_labels_and_legends() {
    let m = metrics_in(
        "sum by (lane) (rate(ledger_relay_lane_bytes_sent_total{instance=~\"$i\",lake=\"x\"}[5m])) / ledger_relay_x",
    );
    assert_eq!(
        m,
        vec![
            (
                "ledger_relay_lane_bytes_sent_total".to_owned(),
                vec!["instance".to_owned(), "lake".to_owned()]
            ),
            ("ledger_relay_x".to_owned(), vec![]),
        ]
    );
    assert_eq!(by_labels("sum by (lake, kind) (x)"), ["lake", "kind"]);
    assert_eq!(
        legend_labels("{{identity}} ({{session}})"),
        ["identity", "session"]
    );
    let e = exported("# HELP a b\na_total 1\nb{lane=\"0\",kind=\"x,y\"} 2\n");
    assert!(e["a_total"].is_empty());
    assert_eq!(
        e["b"],
        ["kind", "lane"].iter().map(|s| s.to_string()).collect()
    );
}
