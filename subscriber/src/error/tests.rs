//! Unit tests of `error`.

use super::*;
use bytes::Bytes;
use quinn::{ApplicationClose, ConnectionClose, TransportErrorCode, VarInt};

fn relay() -> SocketAddr {
    "127.0.0.1:7000".parse().unwrap()
}

fn remote_alert(a: u8) -> quinn::ConnectionError {
    quinn::ConnectionError::ConnectionClosed(ConnectionClose {
        error_code: TransportErrorCode::crypto(a),
        frame_type: None,
        reason: Bytes::from_static(b"invalid peer certificate"),
    })
}

fn app_close(code: u64) -> quinn::ConnectionError {
    quinn::ConnectionError::ApplicationClosed(ApplicationClose {
        error_code: VarInt::from_u64(code).unwrap(),
        reason: Bytes::from_static(b"bye"),
    })
}

fn auth_reason(f: Failure) -> AuthReason {
    match f {
        Failure::Fatal(SubscribeError::Unauthorized { reason, .. }) => reason,
        other => panic!("expected an authorization failure, got {other:?}"),
    }
}

fn classify(e: &quinn::ConnectionError) -> Failure {
    classify_connection("relay:7000", relay(), 10, e)
}

#[test]
fn alerts_from_the_relay_are_authorization_failures() {
    assert_eq!(
        auth_reason(classify(&remote_alert(48))),
        AuthReason::UnknownCa
    );
    assert_eq!(
        auth_reason(classify(&remote_alert(45))),
        AuthReason::Expired
    );
    assert_eq!(
        auth_reason(classify(&remote_alert(44))),
        AuthReason::Revoked
    );
    assert_eq!(
        auth_reason(classify(&remote_alert(49))),
        AuthReason::NotAllowed
    );
    assert_eq!(
        auth_reason(classify(&remote_alert(42))),
        AuthReason::Rejected { alert: 42 }
    );
    assert_eq!(
        auth_reason(classify(&remote_alert(116))),
        AuthReason::Rejected { alert: 116 }
    );
    // no_application_protocol: another protocol version, not an authorization problem.
    assert!(matches!(
        classify(&remote_alert(120)),
        Failure::Transient(Transient::Connection { .. })
    ));
}

#[test]
fn rejecting_the_relay_certificate_is_terminal() {
    let local = quinn::ConnectionError::TransportError(quinn_proto::TransportError {
        code: TransportErrorCode::crypto(42),
        frame: None,
        reason: "invalid peer certificate: NotValidForName".into(),
    });
    let f = classify(&local);
    assert_eq!(auth_reason(f), AuthReason::RelayCertificate);
    let unknown_issuer = quinn::ConnectionError::TransportError(quinn_proto::TransportError {
        code: TransportErrorCode::crypto(48),
        frame: None,
        reason: "invalid peer certificate: UnknownIssuer".into(),
    });
    let Failure::Fatal(e) = classify(&unknown_issuer) else {
        panic!("not fatal")
    };
    assert!(e.is_unauthorized());
    assert!(e.to_string().contains("UnknownIssuer"), "{e}");
}

#[test]
fn close_codes_follow_the_protocol_table() {
    let code = |c: ErrorCode| u64::from(c.close_code());
    assert_eq!(
        auth_reason(classify(&app_close(code(ErrorCode::Unauthorized)))),
        AuthReason::NotAllowed
    );
    assert_eq!(
        auth_reason(classify(&app_close(code(ErrorCode::Revoked)))),
        AuthReason::Revoked
    );
    match classify(&app_close(code(ErrorCode::BelowRetention))) {
        Failure::Fatal(SubscribeError::BelowRetention {
            requested, oldest, ..
        }) => {
            assert_eq!((requested, oldest), (10, 0));
        }
        other => panic!("{other:?}"),
    }
    for c in [
        ErrorCode::ProtocolViolation,
        ErrorCode::Overloaded,
        ErrorCode::ShuttingDown,
        ErrorCode::Internal,
        ErrorCode::SourceReset,
    ] {
        match classify(&app_close(code(c))) {
            Failure::Transient(Transient::Relay { code, message, .. }) => {
                assert_eq!(code, c);
                assert_eq!(message, "bye");
            }
            other => panic!("{c:?}: {other:?}"),
        }
    }
    assert!(matches!(
        classify(&app_close(0)),
        Failure::Transient(Transient::Closed { .. })
    ));
    assert!(matches!(
        classify(&app_close(77)),
        Failure::Transient(Transient::Connection { .. })
    ));
}

#[test]
fn transport_failures_are_transient() {
    for e in [
        quinn::ConnectionError::TimedOut,
        quinn::ConnectionError::Reset,
        quinn::ConnectionError::LocallyClosed,
        quinn::ConnectionError::VersionMismatch,
    ] {
        assert!(matches!(classify(&e), Failure::Transient(_)), "{e}");
    }
}

#[test]
fn error_frames_follow_the_protocol_table() {
    let frame = |code| ErrorFrame {
        code,
        oldest: 100,
        newest: 200,
        message: "m".into(),
    };
    match classify_error_frame("r:1", relay(), 50, &frame(ErrorCode::BelowRetention)) {
        Failure::Fatal(e @ SubscribeError::BelowRetention { .. }) => {
            assert!(e.is_below_retention());
            assert_eq!(e.exit_code(), 4);
            let text = e.to_string();
            assert!(text.contains("oldest ledger held is 100"), "{text}");
            assert!(text.contains("ledger 50"), "{text}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        auth_reason(classify_error_frame(
            "r:1",
            relay(),
            50,
            &frame(ErrorCode::Unauthorized)
        )),
        AuthReason::NotAllowed
    );
    match classify_error_frame("r:1", relay(), 50, &frame(ErrorCode::Unauthorized)) {
        Failure::Fatal(e) => assert_eq!(e.exit_code(), 3),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        auth_reason(classify_error_frame(
            "r:1",
            relay(),
            50,
            &frame(ErrorCode::Revoked)
        )),
        AuthReason::Revoked
    );
    assert!(matches!(
        classify_error_frame("r:1", relay(), 50, &frame(ErrorCode::Overloaded)),
        Failure::Transient(Transient::Relay {
            code: ErrorCode::Overloaded,
            ..
        })
    ));
}

#[test]
fn bad_frames_are_protocol_violations() {
    let e = FrameIoError::TooLong { limit: 10 };
    assert!(matches!(
        classify_frame_io("r:1", relay(), 1, e),
        Failure::Transient(Transient::Protocol { .. })
    ));
    let lost = FrameIoError::Read(quinn::ReadError::ConnectionLost(remote_alert(44)));
    assert_eq!(
        auth_reason(classify_frame_io("r:1", relay(), 1, lost)),
        AuthReason::Revoked
    );
}

/// What a hostile relay chooses: an `Error` frame's message or a close reason that breaks the
/// line and moves a terminal's cursor.
const FORGED: &str = "busy\nbelow-retention requested=1 oldest=4000000000\x1b[2J";
const FORGED_ESCAPED: &str = r"busy\nbelow-retention requested=1 oldest=4000000000\u{1b}[2J";

#[test]
fn a_relays_text_shows_escaped_in_every_error_that_quotes_it() {
    let frame = |code| ErrorFrame {
        code,
        oldest: 0,
        newest: 0,
        message: FORGED.into(),
    };
    let shown = |f: Failure| match f {
        Failure::Fatal(e) => ErrorChain(&e).to_string(),
        Failure::Transient(t) => ErrorChain(&t).to_string(),
    };
    for code in [ErrorCode::Overloaded, ErrorCode::Unauthorized] {
        let text = shown(classify_error_frame("relay:7000", relay(), 1, &frame(code)));
        assert!(text.contains(FORGED_ESCAPED), "{code:?}: {text}");
        assert!(
            !text.contains('\n') && !text.contains('\x1b'),
            "{code:?}: {text}"
        );
    }
    // A close reason reaches the text through quinn's error, a source of ours.
    let closed = quinn::ConnectionError::ApplicationClosed(ApplicationClose {
        error_code: VarInt::from_u32(7),
        reason: Bytes::from(FORGED.as_bytes().to_vec()),
    });
    let text = shown(classify(&closed));
    assert!(text.contains(FORGED_ESCAPED), "{text}");
}
