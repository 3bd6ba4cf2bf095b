//! `fuzz/run.sh` fails loudly: the paths that need no fuzzer installed (a target that does not
//! exist, a bad duration, cargo-fuzz missing) exit non-zero with a one-line reason, instead of
//! passing a fuzz step that fuzzed nothing.

use std::path::PathBuf;
use std::process::{Command, Output};

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/run.sh")
}

fn run(args: &[&str], path: Option<&str>) -> Output {
    let mut cmd = Command::new("bash");
    cmd.arg(script()).args(args);
    if let Some(p) = path {
        cmd.env("PATH", p);
    }
    cmd.output().expect("bash runs")
}

fn assert_fails(out: &Output, reason: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "exit {:?}, stderr: {stderr}",
        out.status
    );
    assert!(stderr.contains(reason), "stderr lacks {reason:?}: {stderr}");
    assert_eq!(
        stderr
            .lines()
            .filter(|l| l.starts_with("fuzz: error:"))
            .count(),
        1,
        "one reason line: {stderr}"
    );
}

#[test]
fn a_missing_target_fails_and_names_the_real_ones() {
    let out = run(&["1", "no-such-target"], None);
    assert_fails(&out, "no fuzz target 'no-such-target'");
    assert!(String::from_utf8_lossy(&out.stderr).contains("frames"));
}

#[test]
fn a_bad_duration_fails() {
    assert_fails(&run(&["soon"], None), "SECONDS must be a whole number");
    assert_fails(&run(&["0"], None), "at least 1");
}

#[test]
fn a_missing_fuzzer_fails() {
    // A PATH with the shell's tools but without cargo or cargo-fuzz.
    let out = run(&["1", "frames"], Some("/usr/bin:/bin"));
    assert_fails(&out, "cargo-fuzz is not installed");
}
