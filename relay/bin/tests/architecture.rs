//! `docs/architecture.md` against the code: its crate diagram must draw exactly the workspace's
//! normal dependencies as `cargo metadata` reports them, and every file it names must exist.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn architecture() -> String {
    std::fs::read_to_string(root().join("docs/architecture.md")).expect("docs/architecture.md")
}

type Edges = BTreeSet<(String, String)>;

/// The diagram's arrows as (package, package): nodes are `id["dir/ (package)"]`, arrows
/// `a --> b`. Panics on an arrow to an undeclared node or a second diagram.
fn drawn(doc: &str) -> (BTreeSet<String>, Edges) {
    let mut blocks = doc.split("```mermaid\n").skip(1);
    let block = blocks.next().expect("a ```mermaid diagram");
    assert!(blocks.next().is_none(), "one crate diagram, not several");
    let block = &block[..block.find("```").expect("the diagram's closing fence")];
    let mut nodes = BTreeMap::new();
    let mut arrows = Vec::new();
    for line in block.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if let Some((from, to)) = line.split_once("-->") {
            arrows.push((from.trim().to_owned(), to.trim().to_owned()));
        } else if let Some((id, label)) = line.split_once("[\"") {
            let package = label
                .rsplit_once('(')
                .and_then(|(_, p)| p.split_once(')'))
                .map(|(p, _)| p.to_owned())
                .unwrap_or_else(|| panic!("node {id} names no (package): {line}"));
            nodes.insert(id.trim().to_owned(), package);
        } else {
            assert!(line.starts_with("graph "), "unparsed diagram line: {line}");
        }
    }
    let package = |id: &str| {
        nodes
            .get(id)
            .unwrap_or_else(|| panic!("arrow from or to undeclared node {id}"))
            .clone()
    };
    let edges = arrows
        .iter()
        .map(|(a, b)| (package(a), package(b)))
        .collect();
    (nodes.values().cloned().collect(), edges)
}

/// The workspace's packages and their normal and build dependencies on each other.
fn actual() -> (BTreeSet<String>, Edges) {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(root())
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let packages = meta["packages"].as_array().unwrap();
    let names: BTreeSet<String> = packages
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_owned())
        .collect();
    let mut edges = Edges::new();
    for p in packages {
        for d in p["dependencies"].as_array().unwrap() {
            let name = d["name"].as_str().unwrap();
            if names.contains(name) && d["kind"].as_str() != Some("dev") {
                edges.insert((p["name"].as_str().unwrap().to_owned(), name.to_owned()));
            }
        }
    }
    (names, edges)
}

/// What differs between the drawn and the actual arrows, one line each.
fn differences(drawn: &Edges, actual: &Edges) -> Vec<String> {
    let missing = actual
        .difference(drawn)
        .map(|(a, b)| format!("missing arrow {a} --> {b}"));
    let extra = drawn
        .difference(actual)
        .map(|(a, b)| format!("arrow {a} --> {b} drawn, but {a} does not depend on {b}"));
    missing.chain(extra).collect()
}

#[test]
fn the_crate_diagram_is_the_workspaces_dependency_graph() {
    let (drawn_nodes, drawn_edges) = drawn(&architecture());
    let (packages, edges) = actual();
    assert_eq!(drawn_nodes, packages, "the diagram's crates");
    let diff = differences(&drawn_edges, &edges);
    assert!(diff.is_empty(), "docs/architecture.md: {}", diff.join("; "));
}

#[test]
fn a_wrong_arrow_is_caught() {
    let doc = architecture();
    let (_, edges) = actual();
    // The arrow the old diagram had wrong: the bench does not link the subscriber.
    let wrong = doc.replace(
        "    bench --> lake\n",
        "    bench --> lake\n    bench --> subscriber\n",
    );
    let (_, drawn_edges) = drawn(&wrong);
    assert_eq!(
        differences(&drawn_edges, &edges),
        ["arrow ledger-relay-bench --> ledger-relay-subscriber drawn, but ledger-relay-bench does not depend on ledger-relay-subscriber"]
    );
    let reversed = doc.replace("    lake --> wire\n", "    wire --> lake\n");
    let (_, drawn_edges) = drawn(&reversed);
    assert_eq!(
        differences(&drawn_edges, &edges).len(),
        2,
        "a reversed arrow"
    );
}

#[test]
fn every_file_the_architecture_names_exists() {
    let doc = architecture();
    let mut missing = Vec::new();
    for quoted in doc.split('`').skip(1).step_by(2) {
        let path = quoted.trim_end_matches(':');
        let is_path = path.contains('/')
            && !path.contains(' ')
            && (path.ends_with(".rs") || path.ends_with(".md") || path.ends_with('/'))
            && !path.starts_with("http");
        if is_path && !root().join(path).exists() {
            missing.push(path.to_owned());
        }
    }
    assert!(
        missing.is_empty(),
        "docs/architecture.md names files that do not exist: {missing:?}"
    );
}
