//! Forwarded endpoints, core's form rules, and hostile request and response bodies.

use bytes::Bytes;

use super::*;
use crate::frame::{decode_exact, Frame, FrameDecoder};
use crate::limits::Limits;

fn request(target: &str, body: &[u8]) -> CoreRequest {
    CoreRequest {
        version: 1,
        port: CorePort::Query,
        method: HttpMethod::Post,
        timeout_ms: 0,
        target: target.into(),
        content_type: String::new(),
        body: Bytes::copy_from_slice(body),
    }
}

#[test]
fn only_the_listed_endpoints_are_forwarded() {
    use CorePort::*;
    use HttpMethod::*;
    let ok = [
        (Command, Get, "/tx?blob=AAAA%2B%3D", Endpoint::Tx),
        (Command, Get, "/info", Endpoint::Info),
        (Command, Get, "/info?compact=false", Endpoint::Info),
        (Query, Post, "/getledgerentry", Endpoint::GetLedgerEntry),
        (
            Query,
            Post,
            "/getledgerentryraw",
            Endpoint::GetLedgerEntryRaw,
        ),
    ];
    for (port, method, target, want) in ok {
        assert_eq!(
            Endpoint::classify(port, method, target),
            Ok(want),
            "{target}"
        );
    }
    let refused = [
        (Command, Get, "/upgrades?mode=set&protocolversion=99"),
        (Command, Get, "/manualclose"),
        (Command, Get, "/ll?level=debug"),
        (Command, Get, "/tx/"),
        (Command, Get, "/getledgerentry"),
        (Query, Post, "/tx"),
        (Query, Get, "/getledgerentry"),
        (Command, Post, "/tx?blob=AA"),
    ];
    for (port, method, target) in refused {
        assert!(
            Endpoint::classify(port, method, target).is_err(),
            "{target} must not be forwarded"
        );
    }
}

#[test]
fn a_refusal_names_what_was_asked_without_echoing_much_of_it() {
    let long = format!("/{}", "x".repeat(10_000));
    let err = Endpoint::classify(CorePort::Command, HttpMethod::Get, &long).unwrap_err();
    assert!(err.to_string().len() < 200, "{err}");
    let err = Endpoint::classify(CorePort::Query, HttpMethod::Get, "/getledgerentry").unwrap_err();
    assert_eq!(
        err.to_string(),
        "GET /getledgerentry is not forwarded (only POST)"
    );
}

#[test]
fn ledger_seq_is_read_as_core_reads_it() {
    use LedgerSeqParam::*;
    let cases: [(&[u8], LedgerSeqParam); 10] = [
        (b"key=AAAA&ledgerSeq=1410100", Seq(1_410_100)),
        (b"ledgerSeq=7&key=AAAA", Seq(7)),
        (b"key=AAAA%3D%3D", Absent),
        (b"key=AAAA&ledgerSeq=", Absent),
        (b"key=AAAA&ledger%53eq=9", Seq(9)),
        (b"key=AAAA&ledgerSeq=1&ledgerSeq=2", Invalid),
        (b"key=AAAA&ledgerSeq=x1", Invalid),
        (b"key=AAAA&ledgerSeq=4294967296", Invalid),
        (b"key=AAAA&ledgerSeq=%zz", Invalid),
        (b"", Absent),
    ];
    for (body, want) in cases {
        assert_eq!(
            form_ledger_seq(body),
            want,
            "{}",
            String::from_utf8_lossy(body)
        );
    }
}

#[test]
fn form_params_follow_cores_split() {
    let decoded = url_decode(b"key=AB%2BC%3D%3D&key=DD&=x&y=&ledgerSeq=5=6").unwrap();
    let params = form_params(&decoded);
    let got: Vec<(&[u8], &[u8])> = params.iter().map(|(n, v)| (*n, v.as_slice())).collect();
    assert_eq!(
        got,
        vec![
            (&b"key"[..], &b"AB+C"[..]),
            (b"key", b"DD"),
            (b"ledgerSeq", b"56"),
        ]
    );
}

#[test]
fn pinning_appends_one_ledger_seq() {
    assert_eq!(pin_ledger_seq(b"key=AA", 9), b"key=AA&ledgerSeq=9");
    assert_eq!(pin_ledger_seq(b"key=AA&", 9), b"key=AA&ledgerSeq=9");
    assert_eq!(pin_ledger_seq(b"", 9), b"ledgerSeq=9");
    assert_eq!(
        form_ledger_seq(&pin_ledger_seq(b"key=AA", 12)),
        LedgerSeqParam::Seq(12)
    );
}

#[test]
fn a_relay_error_is_json_shaped_like_cores() {
    let r = CoreResponse::from_relay(503, "stellar-core at \"x\" is unreachable");
    assert_eq!(r.origin, Origin::Relay);
    assert_eq!(r.content_type, "application/json");
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(
        v["exception"],
        "ledger-relay: stellar-core at \"x\" is unreachable"
    );
}

#[test]
fn hostile_request_fields_are_typed_errors() {
    let limits = Limits::default();
    let good = Frame::CoreRequest(request("/getledgerentry", b"key=AA")).to_vec();
    let mutate = |at: usize, b: u8| {
        let mut v = good.clone();
        v[at] = b;
        decode_exact(Bytes::from(v), &limits)
    };
    // Header 5 bytes, then version 2, port at 7, method at 8, timeout 9..13, target length
    // 13..17, content-type length at 17, target from 18.
    assert!(mutate(7, 9).is_err(), "unknown port");
    assert!(mutate(8, 0).is_err(), "unknown method");
    assert!(mutate(16, 0xff).is_err(), "target runs past the body");
    assert!(mutate(17, 0xff).is_err(), "content type runs past the body");
    assert!(mutate(18, b'x').is_err(), "target without a leading slash");
    assert!(mutate(19, b'\n').is_err(), "control byte in the target");
    assert!(mutate(19, 0xc3).is_err(), "non-ASCII byte in the target");
}

#[test]
fn hostile_response_fields_are_typed_errors() {
    let limits = Limits::default();
    let good = Frame::CoreResponse(CoreResponse {
        status: 200,
        origin: Origin::Core,
        content_type: "application/json".into(),
        body: Bytes::from_static(b"{}"),
    })
    .to_vec();
    let mutate = |at: usize, b: u8| {
        let mut v = good.clone();
        v[at] = b;
        decode_exact(Bytes::from(v), &limits)
    };
    assert!(mutate(5, 0x03).is_err(), "status 968");
    assert!(mutate(6, 0x00).is_err(), "status 0");
    assert!(mutate(7, 2).is_err(), "unknown origin");
    assert!(mutate(8, 0xff).is_err(), "content type runs past the body");
    assert!(
        mutate(9, b'\r').is_err(),
        "header injection in the content type"
    );
}

#[test]
fn a_control_stream_never_buffers_a_large_core_frame() {
    let limits = Limits::default();
    let mut header = vec![0x41];
    header.extend_from_slice(&(16u32 << 20).to_be_bytes());
    // A request stream reads it whole (decode_exact checks the header against its own bound)...
    assert!(matches!(
        decode_exact(Bytes::from(header.clone()), &limits),
        Err(crate::FrameError::Truncated { .. })
    ));
    // ...but a control stream refuses it at the header, before buffering a byte of it.
    let mut d = FrameDecoder::new(limits.clone());
    assert!(matches!(
        d.feed(&header),
        Err(crate::FrameError::TooLong { .. })
    ));
    let mut over = vec![0x40];
    over.extend_from_slice(&(limits.max_core_request + 1).to_be_bytes());
    assert!(matches!(
        decode_exact(Bytes::from(over), &limits),
        Err(crate::FrameError::TooLong { .. })
    ));
}

#[test]
fn every_endpoint_has_one_path_on_one_port() {
    for e in Endpoint::ALL {
        assert_eq!(
            Endpoint::classify(e.port(), e.method(), e.path()),
            Ok(e),
            "{e:?}"
        );
    }
}
