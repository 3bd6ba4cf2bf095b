//! `ledger-certs` end to end in a temporary directory.

use std::fs;
use std::path::Path;

use ledger_relay_certs::CertDir;

use crate::util::{cert_der, hex, ledger_certs, ok, parse};

/// The rows of `list`, split on whitespace, without the header.
fn list_rows(dir: &Path) -> Vec<Vec<String>> {
    let run = ok(["list".as_ref(), dir.as_os_str()]);
    let mut lines = run.stdout.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["NAME", "ROLE", "SERIAL", "NOT_AFTER", "REVOKED", "NOTE"]
    );
    lines
        .map(|l| l.split_whitespace().map(str::to_owned).collect())
        .collect()
}

#[test]
fn init_issue_list_revoke() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("pki");
    let d = dir.to_str().unwrap();

    let run = ok(["init", d]);
    assert!(run.stdout.starts_with("created CA in "), "{}", run.stdout);
    for file in ["ca.pem", "ca.key", "crl.pem", "index.toml"] {
        assert!(dir.join(file).is_file(), "{file} missing");
    }

    let run = ok([
        "issue-server",
        d,
        "--name",
        "relay",
        "--san",
        "localhost",
        "--san",
        "127.0.0.1",
    ]);
    assert!(
        run.stdout.starts_with("issued server certificate relay"),
        "{}",
        run.stdout
    );
    let run = ok(["issue-client", d, "--name", "rpc-1", "--days", "30"]);
    assert!(
        run.stdout.starts_with("issued client certificate rpc-1"),
        "{}",
        run.stdout
    );
    for file in ["relay.pem", "relay.key", "rpc-1.pem", "rpc-1.key"] {
        assert!(dir.join(file).is_file(), "{file} missing");
    }

    let rows = list_rows(&dir);
    assert_eq!(rows.len(), 3, "{rows:?}");
    let names: Vec<(&str, &str)> = rows
        .iter()
        .map(|r| (r[0].as_str(), r[1].as_str()))
        .collect();
    assert_eq!(
        names,
        [("ca", "ca"), ("relay", "server"), ("rpc-1", "client")]
    );
    for (row, file) in rows.iter().zip(["ca.pem", "relay.pem", "rpc-1.pem"]) {
        let der = cert_der(&dir.join(file));
        let cert = parse(&der);
        assert_eq!(row[2], hex(cert.raw_serial()), "serial of {file}");
        let not_after =
            time::OffsetDateTime::parse(&row[3], &time::format_description::well_known::Rfc3339)
                .unwrap();
        assert_eq!(not_after, cert.validity().not_after.to_datetime(), "{file}");
        assert_eq!(row[4], "no");
    }

    let crl_before = fs::read(dir.join("crl.pem")).unwrap();
    let run = ok(["revoke", d, "--name", "rpc-1"]);
    assert!(run.stdout.starts_with("revoked rpc-1"), "{}", run.stdout);
    assert!(run.stdout.contains("CRL number 2"), "{}", run.stdout);
    assert_ne!(fs::read(dir.join("crl.pem")).unwrap(), crl_before);
    let rows = list_rows(&dir);
    let revoked: Vec<(&str, &str)> = rows
        .iter()
        .map(|r| (r[0].as_str(), r[4].as_str()))
        .collect();
    assert_eq!(revoked, [("ca", "no"), ("relay", "no"), ("rpc-1", "yes")]);

    let run = ok(["refresh-crl", d]);
    assert!(run.stdout.contains("CRL number 3"), "{}", run.stdout);
}

#[test]
fn reissue_after_revoke_keeps_the_old_files() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().to_str().unwrap();
    ok(["init", d]);
    ok(["issue-client", d, "--name", "rpc-1"]);
    let old = cert_der(&tmp.path().join("rpc-1.pem"));
    let old_serial = hex(parse(&old).raw_serial());

    // Not while the first one is valid.
    let run = ledger_certs(["issue-client", d, "--name", "rpc-1"]);
    assert_eq!(run.code, 2, "{}", run.stderr);

    ok(["revoke", d, "--name", "rpc-1"]);
    ok(["issue-client", d, "--name", "rpc-1"]);
    let new = cert_der(&tmp.path().join("rpc-1.pem"));
    assert_ne!(old, new);
    let archived = tmp
        .path()
        .join("revoked")
        .join(format!("rpc-1.{old_serial}.pem"));
    assert_eq!(cert_der(&archived), old);
    assert!(tmp
        .path()
        .join("revoked")
        .join(format!("rpc-1.{old_serial}.key"))
        .is_file());

    let rows = list_rows(tmp.path());
    let rpc: Vec<(&str, &str)> = rows
        .iter()
        .filter(|r| r[0] == "rpc-1")
        .map(|r| (r[2].as_str(), r[4].as_str()))
        .collect();
    assert_eq!(
        rpc,
        [
            (old_serial.as_str(), "yes"),
            (hex(parse(&new).raw_serial()).as_str(), "no")
        ]
    );
}

#[test]
fn list_marks_certificates_expiring_within_30_days() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().to_str().unwrap();
    ok(["init", d]);
    ok([
        "issue-server",
        d,
        "--name",
        "relay",
        "--san",
        "127.0.0.1",
        "--days",
        "10",
    ]);
    ok(["issue-client", d, "--name", "rpc-1", "--days", "30"]);
    ok(["issue-client", d, "--name", "rpc-2", "--days", "31"]);
    ok(["issue-client", d, "--name", "rpc-3", "--days", "20"]);
    ok(["revoke", d, "--name", "rpc-3"]);
    let notes: Vec<(String, String)> = list_rows(tmp.path())
        .into_iter()
        .map(|r| (r[0].clone(), r[5].clone()))
        .collect();
    let want = [
        ("ca", "-"),
        // Issued a moment ago: just under the days asked for are left.
        ("relay", "expires-in-9d"),
        ("rpc-1", "expires-in-29d"),
        ("rpc-2", "-"),
        ("rpc-3", "-"),
    ];
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    assert_eq!(notes, want);
}

#[test]
fn renew_issues_a_fresh_certificate_and_keeps_the_old_one_valid() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().to_str().unwrap();
    ok(["init", d]);
    ok([
        "issue-server",
        d,
        "--name",
        "relay",
        "--san",
        "relay.example",
        "--san",
        "127.0.0.1",
        "--days",
        "5",
    ]);
    ok(["issue-client", d, "--name", "rpc-1", "--days", "5"]);
    let old = cert_der(&tmp.path().join("relay.pem"));
    let old_key = fs::read(tmp.path().join("relay.key")).unwrap();
    let old_serial = hex(parse(&old).raw_serial());

    let run = ok(["renew", d, "--name", "relay", "--days", "90"]);
    assert!(
        run.stdout.starts_with("issued server certificate relay"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains("stays valid until it expires"),
        "{}",
        run.stdout
    );
    let new = cert_der(&tmp.path().join("relay.pem"));
    assert_ne!(new, old);
    assert_ne!(
        fs::read(tmp.path().join("relay.key")).unwrap(),
        old_key,
        "a new key"
    );
    let (old_cert, new_cert) = (parse(&old), parse(&new));
    let new_serial = hex(new_cert.raw_serial());
    assert_ne!(new_serial, old_serial);
    // Same subject, issuer and names; a later expiry.
    assert_eq!(new_cert.subject(), old_cert.subject());
    assert_eq!(new_cert.issuer(), old_cert.issuer());
    let sans = |c: &x509_parser::certificate::X509Certificate<'_>| {
        format!("{:?}", c.subject_alternative_name().unwrap().unwrap().value)
    };
    assert_eq!(sans(&new_cert), sans(&old_cert));
    let days = (new_cert.validity().not_after.to_datetime()
        - new_cert.validity().not_before.to_datetime())
    .whole_days();
    assert_eq!(days, 90);
    // The old pair is archived, not deleted.
    let archived = tmp
        .path()
        .join("renewed")
        .join(format!("relay.{old_serial}.pem"));
    assert_eq!(cert_der(&archived), old);
    let archived_key = tmp
        .path()
        .join("renewed")
        .join(format!("relay.{old_serial}.key"));
    assert_eq!(fs::read(archived_key).unwrap(), old_key);

    // Both listed, neither revoked; the old one marked renewed, the new one not expiring.
    let rows: Vec<Vec<String>> = list_rows(tmp.path())
        .into_iter()
        .filter(|r| r[0] == "relay")
        .collect();
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(
        (
            rows[0][2].as_str(),
            rows[0][4].as_str(),
            rows[0][5].as_str()
        ),
        (old_serial.as_str(), "no", "renewed")
    );
    assert_eq!(
        (
            rows[1][2].as_str(),
            rows[1][4].as_str(),
            rows[1][5].as_str()
        ),
        (new_serial.as_str(), "no", "-")
    );

    // A client renews the same way, and again.
    ok(["renew", d, "--name", "rpc-1"]);
    ok(["renew", d, "--name", "rpc-1"]);
    assert_eq!(fs::read_dir(tmp.path().join("renewed")).unwrap().count(), 6);
    assert_eq!(
        ledger_relay_certs::client_identity(&cert_der(&tmp.path().join("rpc-1.pem"))).unwrap(),
        "rpc-1"
    );

    // Revoking the name revokes the renewed certificate too: no valid one is left behind.
    ok(["revoke", d, "--name", "relay"]);
    let revoked: Vec<String> = list_rows(tmp.path())
        .into_iter()
        .filter(|r| r[0] == "relay")
        .map(|r| r[4].clone())
        .collect();
    assert_eq!(revoked, ["yes", "yes"]);
    let run = ledger_certs(["renew", d, "--name", "relay"]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("already revoked"), "{}", run.stderr);
}

#[test]
fn man_pages_and_completions_cover_every_command() {
    let tmp = tempfile::tempdir().unwrap();
    let run = ok(["man".as_ref(), tmp.path().as_os_str()]);
    assert_eq!(run.stdout.lines().count(), 10, "{}", run.stdout);
    let renew = fs::read_to_string(tmp.path().join("ledger-certs-renew.1")).unwrap();
    assert!(renew.contains(".TH"), "{renew}");
    let run = ok(["completions", "bash"]);
    for command in ["issue-server", "renew", "refresh-crl", "list"] {
        assert!(run.stdout.contains(command), "{command}");
    }
}

#[test]
fn every_mistake_is_one_line_and_exit_2() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("pki");
    let d = d.to_str().unwrap();
    let empty = tmp.path().join("empty");
    fs::create_dir(&empty).unwrap();
    let empty = empty.to_str().unwrap();
    ok(["init", d]);
    ok(["issue-client", d, "--name", "rpc-1"]);
    ok(["issue-client", d, "--name", "gone"]);
    ok(["revoke", d, "--name", "gone"]);
    fs::write(tmp.path().join("pki").join("stray.pem"), "not mine").unwrap();
    let new = tmp.path().join("new");
    let new = new.to_str().unwrap();

    let cases: &[(&[&str], &str)] = &[
        // clap's own parse errors, folded into one line.
        (&[], "a command is required"),
        (&["inti", d], "unrecognized subcommand"),
        (&["list"], "required"),
        (&["issue-client", d], "--name"),
        (
            &["issue-client", d, "--name", "a", "--days", "abc"],
            "invalid value",
        ),
        (
            &["issue-client", d, "--name", "a", "--bogus"],
            "unexpected argument",
        ),
        // The library's errors.
        (&["init", d], "already exists"),
        (&["list", empty], "no certificate authority"),
        (
            &["list", "/nonexistent/ledger-certs-test"],
            "no certificate authority",
        ),
        (
            &["issue-client", empty, "--name", "a"],
            "no certificate authority",
        ),
        (&["issue-client", d, "--name", "rpc-1"], "already issued"),
        (&["issue-client", d, "--name", "stray"], "already exists"),
        (
            &["issue-client", d, "--name", "bad/name"],
            "invalid certificate name",
        ),
        (&["issue-client", d, "--name", "ca"], "reserved"),
        (&["issue-client", d, "--name", "crl"], "reserved"),
        (
            &["issue-client", d, "--name", &"x".repeat(65)],
            "longer than 64",
        ),
        (
            &["issue-client", d, "--name", "a", "--days", "0"],
            "invalid validity",
        ),
        (
            &["issue-client", d, "--name", "a", "--days", "99999"],
            "invalid validity",
        ),
        (
            &["issue-client", d, "--name", "a", "--days", "36500"],
            "after the certificate authority",
        ),
        (&["init", new, "--days", "0"], "invalid validity"),
        (
            &["issue-server", d, "--name", "relay"],
            "at least one subject alternative name",
        ),
        (
            &["issue-server", d, "--name", "relay", "--san", "bad host"],
            "invalid subject alternative name",
        ),
        (
            &["issue-server", d, "--name", "relay", "--san", "999.1.1.1"],
            "invalid subject alternative name",
        ),
        (
            &["revoke", d, "--name", "nobody"],
            "no certificate named nobody",
        ),
        (&["revoke", d, "--name", "gone"], "already revoked"),
        (&["revoke", d, "--name", "ca"], "reserved"),
        (
            &["renew", d, "--name", "nobody"],
            "no certificate named nobody",
        ),
        (&["renew", d, "--name", "gone"], "already revoked"),
        (&["renew", d, "--name", "ca"], "reserved"),
        (
            &["renew", d, "--name", "rpc-1", "--days", "0"],
            "invalid validity",
        ),
        (
            &["revoke", empty, "--name", "rpc-1"],
            "no certificate authority",
        ),
    ];
    for (args, expected) in cases {
        let run = ledger_certs(*args);
        assert_eq!(run.code, 2, "{args:?}: stderr {:?}", run.stderr);
        assert!(run.stdout.is_empty(), "{args:?}: stdout {:?}", run.stdout);
        assert_eq!(
            run.stderr.lines().count(),
            1,
            "{args:?}: stderr {:?}",
            run.stderr
        );
        assert!(
            run.stderr.starts_with("error: "),
            "{args:?}: stderr {:?}",
            run.stderr
        );
        assert!(
            run.stderr.contains(expected),
            "{args:?}: stderr {:?}, expected {expected:?}",
            run.stderr
        );
    }
    // Nothing above created a file or an entry.
    assert!(!tmp.path().join("new").exists());
    assert_eq!(
        fs::read_to_string(tmp.path().join("pki").join("stray.pem")).unwrap(),
        "not mine"
    );
    let names: Vec<String> = CertDir::open(&tmp.path().join("pki"))
        .unwrap()
        .list()
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, ["ca", "rpc-1", "gone"]);
}

#[test]
fn help_and_version_exit_0() {
    for args in [
        &["--help"][..],
        &["-h"],
        &["--version"],
        &["help"],
        &["init", "--help"],
        &["issue-server", "--help"],
        &["issue-client", "--help"],
        &["revoke", "--help"],
        &["refresh-crl", "--help"],
        &["list", "--help"],
    ] {
        let run = ledger_certs(args);
        assert_eq!(run.code, 0, "{args:?}: {}", run.stderr);
        assert!(!run.stdout.is_empty(), "{args:?}");
    }
    let run = ledger_certs(["--help"]);
    for command in ["init", "issue-server", "issue-client", "revoke", "list"] {
        assert!(
            run.stdout.contains(command),
            "{command} missing from --help"
        );
    }
}

#[test]
fn init_refuses_to_overwrite() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().to_str().unwrap();
    ok(["init", d]);
    let files = ["ca.pem", "ca.key", "crl.pem", "index.toml"];
    let before: Vec<Vec<u8>> = files
        .iter()
        .map(|f| fs::read(tmp.path().join(f)).unwrap())
        .collect();
    let run = ledger_certs(["init", d]);
    assert_eq!(run.code, 2);
    assert!(
        run.stderr.contains("refusing to overwrite"),
        "{}",
        run.stderr
    );
    // Each file alone is enough to refuse.
    for (i, file) in files.iter().enumerate() {
        let other = tempfile::tempdir().unwrap();
        fs::write(other.path().join(file), &before[i]).unwrap();
        let run = ledger_certs(["init", other.path().to_str().unwrap()]);
        assert_eq!(run.code, 2, "{file}: {}", run.stderr);
        assert!(run.stderr.contains(file), "{file}: {}", run.stderr);
        assert_eq!(fs::read_dir(other.path()).unwrap().count(), 1, "{file}");
    }
    let after: Vec<Vec<u8>> = files
        .iter()
        .map(|f| fs::read(tmp.path().join(f)).unwrap())
        .collect();
    assert_eq!(before, after);
}

#[cfg(unix)]
#[test]
fn keys_are_mode_0600() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().to_str().unwrap();
    ok(["init", d]);
    ok(["issue-server", d, "--name", "relay", "--san", "localhost"]);
    ok(["issue-client", d, "--name", "rpc-1"]);
    let mode = |f: &str| {
        fs::metadata(tmp.path().join(f))
            .unwrap()
            .permissions()
            .mode()
            & 0o777
    };
    for key in ["ca.key", "relay.key", "rpc-1.key"] {
        assert_eq!(mode(key), 0o600, "{key}");
    }
    for public in ["ca.pem", "relay.pem", "rpc-1.pem", "crl.pem", "index.toml"] {
        assert_eq!(mode(public) & 0o022, 0, "{public} is writable by others");
        assert_eq!(mode(public) & 0o400, 0o400, "{public} is unreadable");
    }
    // No temporary file survives.
    for entry in fs::read_dir(tmp.path()).unwrap() {
        let name = entry.unwrap().file_name();
        assert!(
            !name.to_string_lossy().starts_with('.'),
            "{name:?} left behind"
        );
    }
}
