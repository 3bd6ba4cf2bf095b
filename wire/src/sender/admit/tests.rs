use super::*;
use crate::frame::Start;

fn open(version: u16, codecs: u8) -> SessionOpen {
    SessionOpen {
        version,
        start: Start::Tip,
        lanes: 4,
        codecs,
        window: 8,
    }
}

fn join(token: [u8; TOKEN_LEN], lane: u8, version: u16) -> LaneJoin {
    LaneJoin {
        version,
        session_id: 7,
        token,
        lane,
    }
}

fn refused_as(r: Result<(), CloseReason>) -> String {
    match r {
        Ok(()) => "admitted".into(),
        Err(CloseReason::Unauthorized { detail }) => format!("unauthorized: {detail}"),
        Err(CloseReason::Violation(v)) => format!("violation: {v}"),
        Err(other) => format!("other: {other:?}"),
    }
}

#[test]
fn a_session_needs_this_version_and_a_codec_the_relay_sends() {
    let all = Codec::None.bit() | Codec::Lz4.bit() | Codec::Zstd.bit();
    assert_eq!(
        refused_as(check_open(&open(1, all), Codec::Zstd)),
        "admitted"
    );
    assert_eq!(
        refused_as(check_open(&open(2, all), Codec::Zstd)),
        "violation: protocol version 2 not supported"
    );
    assert_eq!(
        refused_as(check_open(&open(1, Codec::Lz4.bit()), Codec::Zstd)),
        "violation: this relay sends zstd chunks"
    );
    // Raw chunks every subscriber reads, whatever it lists.
    assert_eq!(refused_as(check_open(&open(1, 0), Codec::None)), "admitted");
}

#[test]
fn a_lane_joins_only_its_own_identitys_session_with_its_token() {
    let token = [9u8; TOKEN_LEN];
    let target = JoinTarget {
        token: &token,
        identity: "rpc-1",
        lanes: 4,
    };
    let ok = join(token, 3, 1);
    assert_eq!(
        refused_as(check_join(&ok, Some(target), "rpc-1")),
        "admitted"
    );
    assert_eq!(
        refused_as(check_join(&ok, None, "rpc-1")),
        "unauthorized: no such session"
    );
    let mut wrong = token;
    wrong[TOKEN_LEN - 1] ^= 1;
    assert_eq!(
        refused_as(check_join(&join(wrong, 3, 1), Some(target), "rpc-1")),
        "unauthorized: wrong session token"
    );
    assert_eq!(
        refused_as(check_join(&ok, Some(target), "rpc-2")),
        "unauthorized: lane identity rpc-2 differs from the session's rpc-1"
    );
    assert_eq!(
        refused_as(check_join(&join(token, 4, 1), Some(target), "rpc-1")),
        "violation: lane 4 beyond the 4 granted"
    );
    assert_eq!(
        refused_as(check_join(&join(token, 1, 3), Some(target), "rpc-1")),
        "violation: protocol version 3 not supported"
    );
}
