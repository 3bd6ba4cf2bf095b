//! Certificate names and subject alternative names.

use std::net::IpAddr;

use rustls::pki_types::DnsName;

use crate::CertError;

/// The longest accepted certificate name.
pub const MAX_NAME_LEN: usize = 64;

/// Names that would collide with the CA's own files (`ca.pem`, `ca.key`, `crl.pem`).
const RESERVED: &[&str] = &["ca", "crl"];

/// Checks that `name` can serve both as a client identity and as a file stem in the
/// certificate directory: 1 to 64 characters from `[A-Za-z0-9._-]`, starting with a letter or
/// a digit (so neither a hidden file, `..`, nor something that reads as a command-line flag),
/// and not `ca` or `crl` in any case.
pub fn validate_name(name: &str) -> Result<(), CertError> {
    let invalid = |reason| {
        Err(CertError::InvalidName {
            name: name.to_owned(),
            reason,
        })
    };
    if name.is_empty() {
        return invalid("it is empty");
    }
    if name.len() > MAX_NAME_LEN {
        return invalid("it is longer than 64 characters");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return invalid("only letters, digits, '.', '_' and '-' are allowed");
    }
    if !name.as_bytes()[0].is_ascii_alphanumeric() {
        return invalid("it must start with a letter or a digit");
    }
    if RESERVED.iter().any(|r| r.eq_ignore_ascii_case(name)) {
        return invalid("it is reserved for the certificate authority's own files");
    }
    Ok(())
}

/// One subject alternative name of a server certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum San {
    Dns(String),
    Ip(IpAddr),
}

/// Parses `--san` values: an IP address becomes an IP SAN, anything else must be a valid DNS
/// name (as rustls would accept it as a server name). Duplicates are dropped; at least one is
/// required.
pub(crate) fn parse_sans(cert_name: &str, sans: &[String]) -> Result<Vec<San>, CertError> {
    let mut out: Vec<San> = Vec::with_capacity(sans.len());
    for raw in sans {
        let san = parse_san(raw)?;
        if !out.contains(&san) {
            out.push(san);
        }
    }
    if out.is_empty() {
        return Err(CertError::MissingSan {
            name: cert_name.to_owned(),
        });
    }
    Ok(out)
}

fn parse_san(raw: &str) -> Result<San, CertError> {
    let invalid = |reason| CertError::InvalidSan {
        san: raw.to_owned(),
        reason,
    };
    if raw.is_empty() {
        return Err(invalid("it is empty"));
    }
    // "[::1]" is how addresses appear in URLs; accept it as the address it names.
    let unbracketed = raw
        .strip_prefix('[')
        .and_then(|s| s.strip_suffix(']'))
        .unwrap_or(raw);
    if let Ok(ip) = unbracketed.parse::<IpAddr>() {
        return Ok(San::Ip(ip));
    }
    if raw.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        // Without this, "300.1.1.1" would pass as a DNS name and never match anything.
        return Err(invalid(
            "it looks like an IP address but is not a valid one",
        ));
    }
    DnsName::try_from(raw)
        .map_err(|_| invalid("it is neither an IP address nor a valid DNS name"))?;
    Ok(San::Dns(raw.to_ascii_lowercase()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_names() {
        for name in [
            "relay",
            "rpc-1",
            "a",
            "A.b_c-9",
            "9",
            &"x".repeat(64),
            "cax",
            "crl2",
        ] {
            validate_name(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }

    #[test]
    fn invalid_names() {
        for name in [
            "",
            &"x".repeat(65),
            "ca",
            "CA",
            "crl",
            "Crl",
            ".hidden",
            "..",
            "-flag",
            "_x",
            "a/b",
            "a b",
            "é",
            "a\n",
        ] {
            assert!(
                matches!(validate_name(name), Err(CertError::InvalidName { .. })),
                "{name:?} accepted"
            );
        }
    }

    #[test]
    fn sans_are_classified() {
        let sans: Vec<String> = [
            "localhost",
            "127.0.0.1",
            "::1",
            "[fe80::1]",
            "Relay.Example.COM",
            "localhost",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let parsed = parse_sans("relay", &sans).unwrap();
        assert_eq!(
            parsed,
            vec![
                San::Dns("localhost".into()),
                San::Ip("127.0.0.1".parse().unwrap()),
                San::Ip("::1".parse().unwrap()),
                San::Ip("fe80::1".parse().unwrap()),
                San::Dns("relay.example.com".into()),
            ]
        );
    }

    #[test]
    fn bad_sans_are_rejected() {
        for san in [
            "",
            "300.1.1.1",
            "1.2.3",
            "bad name",
            "a..b",
            "-x.example",
            "x_y!",
        ] {
            assert!(
                matches!(
                    parse_sans("relay", &[san.to_string()]),
                    Err(CertError::InvalidSan { .. })
                ),
                "{san:?} accepted"
            );
        }
        assert!(matches!(
            parse_sans("relay", &[]),
            Err(CertError::MissingSan { .. })
        ));
    }
}
