//! What the subscriber tells a relay when a lane or a session ends: the one place that picks
//! the `Error` frame's code and the QUIC close code (`docs/protocol.md` section 2, Closing).
//!
//! The relay is told only what is its own doing: a protocol violation or data that fails
//! verification. A failure that is the relay's message to us (it closed, it sent an `Error`,
//! it refused a certificate), the network's, or our own stop closes with code 0.

use super::*;

/// Why a lane or a session is ending, as far as the relay's close code is concerned.
pub(super) enum Cause<'a> {
    /// The consumer or the caller stopped the session.
    Stopped,
    /// A failure met while talking to the relay.
    Failure(&'a Failure),
    /// The relay's data did not verify (a terminal integrity error).
    Integrity(&'a SubscribeError),
}

/// The `Error` frame to send (code and message) for `cause`, or `None` when the relay is not
/// to blame and the connection closes with code 0.
pub(super) fn verdict(cause: Cause<'_>) -> Option<(ErrorCode, String)> {
    match cause {
        Cause::Failure(Failure::Transient(Transient::Protocol { detail, .. })) => {
            Some((ErrorCode::ProtocolViolation, detail.clone()))
        }
        Cause::Integrity(e) => Some((ErrorCode::ProtocolViolation, ErrorChain(e).to_string())),
        Cause::Failure(_) | Cause::Stopped => None,
    }
}

/// The QUIC application close code for a verdict: the error code's, or 0.
pub(super) fn close_code(verdict: Option<&(ErrorCode, String)>) -> VarInt {
    VarInt::from_u32(verdict.map_or(0, |(code, _)| code.close_code()))
}

/// Closes `conn` for `failure` with the code [`verdict`] picks and a short `reason`.
pub(super) fn close_for(conn: &quinn::Connection, failure: &Failure, reason: &'static [u8]) {
    conn.close(
        close_code(verdict(Cause::Failure(failure)).as_ref()),
        reason,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn protocol() -> Failure {
        Transient::Protocol {
            relay: "198.18.0.1:7000".parse().unwrap(),
            detail: "a LaneAccept for lane 9".into(),
        }
        .into()
    }

    #[test]
    fn only_the_relays_own_doing_is_blamed_on_it() {
        let p = protocol();
        let (code, message) = verdict(Cause::Failure(&p)).expect("a violation is told");
        assert_eq!(code, ErrorCode::ProtocolViolation);
        assert_eq!(message, "a LaneAccept for lane 9");
        assert_eq!(
            close_code(Some(&(code, message))).into_inner(),
            u64::from(ErrorCode::ProtocolViolation.close_code())
        );

        let closed: Failure = Transient::Closed {
            relay: "198.18.0.1:7000".parse().unwrap(),
        }
        .into();
        assert!(verdict(Cause::Failure(&closed)).is_none());
        assert!(verdict(Cause::Stopped).is_none());
        assert_eq!(close_code(None).into_inner(), 0);
    }
}
