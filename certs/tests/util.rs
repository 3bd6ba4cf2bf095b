//! Helpers shared by the test modules.

use std::path::Path;
use std::process::{Command, Output};

use x509_parser::prelude::{FromDer, X509Certificate};

/// What a run of `ledger-certs` did.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Runs the real binary with `args`, no stdin.
pub fn ledger_certs<I, S>(args: I) -> Run
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let Output {
        status,
        stdout,
        stderr,
    } = Command::new(env!("CARGO_BIN_EXE_ledger-certs"))
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run ledger-certs");
    Run {
        code: status.code().expect("ledger-certs was killed by a signal"),
        stdout: String::from_utf8(stdout).expect("stdout is UTF-8"),
        stderr: String::from_utf8(stderr).expect("stderr is UTF-8"),
    }
}

/// Runs `ledger-certs` and asserts that it succeeded.
pub fn ok<I, S>(args: I) -> Run
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let run = ledger_certs(args);
    assert_eq!(run.code, 0, "stderr: {}", run.stderr);
    assert!(run.stderr.is_empty(), "stderr: {}", run.stderr);
    run
}

/// Reads the single certificate in a PEM file as DER.
pub fn cert_der(path: &Path) -> Vec<u8> {
    let mut certs = ledger_relay_certs::load_certs(path).unwrap();
    assert_eq!(certs.len(), 1, "{}", path.display());
    certs.remove(0).to_vec()
}

/// Parses DER that the test keeps alive.
pub fn parse(der: &[u8]) -> X509Certificate<'_> {
    let (rest, cert) = X509Certificate::from_der(der).unwrap();
    assert!(rest.is_empty());
    cert
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
