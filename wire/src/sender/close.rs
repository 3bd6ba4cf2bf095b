//! Why a session ends, typed, and the one function that turns a reason into the `Error` frame
//! (and QUIC close code) the relay sends.
//!
//! Every place in the relay that ends a session or refuses a lane says *why* with a
//! [`CloseReason`]; [`CloseReason::error_frame`] alone decides the [`ErrorCode`], the bounds a
//! `BelowRetention` carries and the message. Nothing matches on message text.

use std::fmt;

use crate::frame::{truncate_utf8, ErrorCode, ErrorFrame};

/// How the subscriber broke the protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Violation {
    /// An `Ack` for a ledger the relay has not sent yet.
    AckNotSent {
        /// The acknowledged sequence.
        seq: u32,
        /// The next ledger the relay would send.
        next: u32,
    },
    /// A `Resend` for a ledger the subscriber already acknowledged: it holds that ledger, so
    /// asking again can only be an attempt to make the relay read its ring for nothing.
    ResendOfAcked {
        /// The ledger asked for.
        seq: u32,
        /// The newest ledger acknowledged.
        acked: u32,
    },
    /// A frame that has no business on the stream it came on.
    UnexpectedFrame {
        /// The frame's name (`FrameType::name`).
        frame: &'static str,
        /// Where it came (for example "the control stream").
        place: &'static str,
    },
    /// Bytes that do not decode as a frame, or a stream that ended inside one.
    BadFrame {
        /// The decoder's message.
        detail: String,
    },
    /// A lane or session request the relay cannot honour as asked (protocol version, codecs,
    /// lane number).
    BadRequest {
        /// What was wrong.
        detail: String,
    },
    /// A connection that opened no control stream within the handshake timeout.
    NoControlStream,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::AckNotSent { seq, next } => {
                write!(
                    f,
                    "ack of ledger {seq}, which was not sent (next is {next})"
                )
            }
            Violation::ResendOfAcked { seq, acked } => write!(
                f,
                "resend of ledger {seq}, which was already acknowledged (acked up to {acked})"
            ),
            Violation::UnexpectedFrame { frame, place } => {
                write!(f, "unexpected {frame} frame on {place}")
            }
            Violation::BadFrame { detail } => write!(f, "invalid frame: {detail}"),
            Violation::BadRequest { detail } => f.write_str(detail),
            Violation::NoControlStream => f.write_str("no control stream"),
        }
    }
}

/// Why a session (or a lane, or a session attempt) ends.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CloseReason {
    /// Ledger `seq` is not held any more (or never was): the subscriber must find it elsewhere.
    BelowRetention {
        /// The ledger that could not be served.
        seq: u32,
        /// Oldest ledger held now (0: none).
        oldest: u32,
        /// Newest ledger held now (0: none).
        newest: u32,
        /// The oldest and newest ledger of the relay's backfill lake (`--backfill`), when it
        /// has one and the lake holds any: `oldest` and `newest` are then the ring's, and the
        /// `Error` frame's bounds take the lake in.
        lake: Option<(u32, u32)>,
    },
    /// The source cut off ledger `seq` after this session was given some of its chunks.
    SourceReset {
        /// The ledger cut off.
        seq: u32,
    },
    /// The subscriber broke the protocol.
    Violation(Violation),
    /// A certificate of the session is revoked.
    Revoked {
        /// The certificate's identity.
        identity: String,
    },
    /// The certificate is not allowed, or a lane's identity or token does not match.
    Unauthorized {
        /// Why.
        detail: String,
    },
    /// A configured limit is reached, or the relay cannot start the session yet.
    Overloaded {
        /// Which limit.
        detail: String,
    },
    /// The session asked to start at ledger `seq`, beyond the ledger after the newest the
    /// relay holds, and the relay did not reach it within its start wait: the subscriber
    /// tries again later, or another relay that is further along.
    StartAhead {
        /// The start asked for.
        seq: u32,
        /// The newest ledger the relay held when it gave up (0: none).
        newest: u32,
    },
    /// The relay is stopping.
    ShuttingDown,
    /// A lane came to join a session that has ended meanwhile.
    SessionEnded,
    /// A lane's old connection, superseded by the lane joining again.
    LaneReplaced,
    /// A stored ledger failed its verification and is not served.
    Corrupt {
        /// The ledger.
        seq: u32,
        /// What failed.
        detail: String,
    },
    /// The relay failed.
    Internal {
        /// What failed.
        detail: String,
    },
    /// The subscriber's side is gone (lane 0 closed, its control stream ended or failed):
    /// there is no one to tell.
    PeerGone {
        /// What was observed.
        detail: String,
    },
}

impl From<Violation> for CloseReason {
    fn from(v: Violation) -> Self {
        CloseReason::Violation(v)
    }
}

impl fmt::Display for CloseReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CloseReason::BelowRetention {
                seq,
                oldest,
                newest,
                lake: Some((lo, hi)),
            } => {
                write!(
                    f,
                    "ledger {seq} is not held: the backfill lake holds {lo} to {hi}, "
                )?;
                if *oldest == 0 {
                    f.write_str("the ring none")
                } else {
                    write!(f, "the ring {oldest} to {newest}")
                }
            }
            CloseReason::BelowRetention {
                seq,
                oldest,
                newest,
                lake: None,
            } => {
                if *oldest == 0 && *newest == 0 {
                    write!(f, "ledger {seq} is not held; the relay holds no ledger")
                } else {
                    write!(
                        f,
                        "ledger {seq} is not held (oldest {oldest}, newest {newest})"
                    )
                }
            }
            CloseReason::SourceReset { seq } => {
                write!(f, "source cut off ledger {seq} after some of it was sent")
            }
            CloseReason::Violation(v) => write!(f, "protocol violation: {v}"),
            CloseReason::Revoked { identity } => write!(f, "certificate of {identity} revoked"),
            CloseReason::Unauthorized { detail }
            | CloseReason::Overloaded { detail }
            | CloseReason::Internal { detail }
            | CloseReason::PeerGone { detail } => f.write_str(detail),
            CloseReason::StartAhead { seq, newest } => write!(
                f,
                "ledger {seq} is ahead of this relay (newest {newest}) and was not reached in time"
            ),
            CloseReason::ShuttingDown => f.write_str("relay shutting down"),
            CloseReason::SessionEnded => f.write_str("session ended"),
            CloseReason::LaneReplaced => f.write_str("replaced by a rejoin"),
            CloseReason::Corrupt { seq, detail } => {
                write!(f, "stored ledger {seq} is corrupt: {detail}")
            }
        }
    }
}

/// Longest message an `Error` frame carries (the protocol allows 1 KiB).
const MESSAGE_MAX: usize = 512;

impl CloseReason {
    /// The code the subscriber is told, or `None` when there is no one to tell (or, for a
    /// replaced lane, nothing: its subscriber is already on the new connection).
    pub fn code(&self) -> Option<ErrorCode> {
        Some(match self {
            CloseReason::BelowRetention { .. } => ErrorCode::BelowRetention,
            CloseReason::SourceReset { .. } => ErrorCode::SourceReset,
            CloseReason::Violation(_) => ErrorCode::ProtocolViolation,
            CloseReason::Revoked { .. } => ErrorCode::Revoked,
            CloseReason::Unauthorized { .. } => ErrorCode::Unauthorized,
            // Retryable, as a limit is: the relay may get there, another relay may be there.
            CloseReason::Overloaded { .. } | CloseReason::StartAhead { .. } => {
                ErrorCode::Overloaded
            }
            // A session ending under a joining lane is, for the subscriber, the relay going
            // away: it reconnects the session.
            CloseReason::ShuttingDown | CloseReason::SessionEnded => ErrorCode::ShuttingDown,
            // A corrupt stored ledger is the relay's failure: the subscriber retries, and with
            // several relays configured, fails over.
            CloseReason::Corrupt { .. } | CloseReason::Internal { .. } => ErrorCode::Internal,
            CloseReason::PeerGone { .. } | CloseReason::LaneReplaced => return None,
        })
    }

    /// Whether the peer broke the protocol (counted apart in the relay's metrics).
    pub fn is_violation(&self) -> bool {
        matches!(self, CloseReason::Violation(_))
    }

    /// The `Error` frame the relay sends for this reason: the code, the retention bounds for
    /// `BelowRetention` (0 otherwise) and the message. `None` when there is no one to tell.
    ///
    /// With a backfill lake the bounds are what the relay can serve at all: the lake's oldest
    /// ledger (where a subscriber may start again) unless the ring's is older, and the newer
    /// of the two newest; the message names both ranges.
    pub fn error_frame(&self) -> Option<ErrorFrame> {
        let code = self.code()?;
        let (oldest, newest) = match self {
            CloseReason::BelowRetention {
                oldest,
                newest,
                lake: Some((lo, hi)),
                ..
            } => (
                if *oldest == 0 {
                    *lo
                } else {
                    (*lo).min(*oldest)
                },
                (*hi).max(*newest),
            ),
            CloseReason::BelowRetention { oldest, newest, .. } => (*oldest, *newest),
            _ => (0, 0),
        };
        let message = self.to_string();
        Some(ErrorFrame {
            code,
            oldest,
            newest,
            message: truncate_utf8(&message, MESSAGE_MAX).to_owned(),
        })
    }

    /// The QUIC application close code for this reason (`0x100 + code`, or 0 with no code).
    pub fn close_code(&self) -> u32 {
        self.code().map_or(0, ErrorCode::close_code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_has_one_code_and_a_message() {
        let cases = [
            (
                CloseReason::BelowRetention {
                    seq: 5,
                    oldest: 10,
                    newest: 20,
                    lake: None,
                },
                Some(ErrorCode::BelowRetention),
                "ledger 5 is not held (oldest 10, newest 20)",
            ),
            (
                CloseReason::BelowRetention {
                    seq: 5,
                    oldest: 300,
                    newest: 320,
                    lake: Some((10, 200)),
                },
                Some(ErrorCode::BelowRetention),
                "ledger 5 is not held: the backfill lake holds 10 to 200, the ring 300 to 320",
            ),
            (
                CloseReason::SourceReset { seq: 9 },
                Some(ErrorCode::SourceReset),
                "source cut off ledger 9 after some of it was sent",
            ),
            (
                Violation::ResendOfAcked { seq: 3, acked: 4 }.into(),
                Some(ErrorCode::ProtocolViolation),
                "protocol violation: resend of ledger 3, which was already acknowledged (acked up to 4)",
            ),
            (
                CloseReason::Revoked {
                    identity: "rpc-1".into(),
                },
                Some(ErrorCode::Revoked),
                "certificate of rpc-1 revoked",
            ),
            (
                CloseReason::ShuttingDown,
                Some(ErrorCode::ShuttingDown),
                "relay shutting down",
            ),
            (
                CloseReason::StartAhead {
                    seq: 900,
                    newest: 40,
                },
                Some(ErrorCode::Overloaded),
                "ledger 900 is ahead of this relay (newest 40) and was not reached in time",
            ),
            (
                CloseReason::Corrupt {
                    seq: 7,
                    detail: "part 3 fails its checksum".into(),
                },
                Some(ErrorCode::Internal),
                "stored ledger 7 is corrupt: part 3 fails its checksum",
            ),
            (
                CloseReason::PeerGone {
                    detail: "lane 0 closed".into(),
                },
                None,
                "lane 0 closed",
            ),
            (
                Violation::NoControlStream.into(),
                Some(ErrorCode::ProtocolViolation),
                "protocol violation: no control stream",
            ),
            (
                CloseReason::SessionEnded,
                Some(ErrorCode::ShuttingDown),
                "session ended",
            ),
            (CloseReason::LaneReplaced, None, "replaced by a rejoin"),
        ];
        for (reason, code, message) in cases {
            assert_eq!(reason.code(), code, "{reason:?}");
            assert_eq!(reason.close_code(), code.map_or(0, ErrorCode::close_code));
            assert_eq!(reason.to_string(), message);
            match reason.error_frame() {
                Some(f) => {
                    assert_eq!(Some(f.code), code);
                    assert_eq!(f.message, message);
                }
                None => assert!(code.is_none()),
            }
        }
    }

    #[test]
    fn only_below_retention_carries_bounds() {
        let f = CloseReason::BelowRetention {
            seq: 1,
            oldest: 2,
            newest: 3,
            lake: None,
        }
        .error_frame()
        .unwrap();
        assert_eq!((f.oldest, f.newest), (2, 3));
        // With a lake: from the lake's oldest to the newest of either.
        let below = |oldest, newest, lake| {
            let f = CloseReason::BelowRetention {
                seq: 1,
                oldest,
                newest,
                lake: Some(lake),
            }
            .error_frame()
            .unwrap();
            (f.oldest, f.newest)
        };
        assert_eq!(below(300, 320, (10, 200)), (10, 320));
        assert_eq!(below(0, 0, (10, 200)), (10, 200));
        assert_eq!(below(0, 320, (10, 200)), (10, 320));
        assert_eq!(below(5, 320, (10, 400)), (5, 400));
        let f = CloseReason::Internal { detail: "x".into() }
            .error_frame()
            .unwrap();
        assert_eq!((f.oldest, f.newest), (0, 0));
    }

    #[test]
    fn long_messages_are_cut_at_a_character_boundary() {
        let f = CloseReason::Internal {
            detail: "é".repeat(1000),
        }
        .error_frame()
        .unwrap();
        assert!(f.message.len() <= MESSAGE_MAX);
        assert!(f.message.chars().all(|c| c == 'é'));
    }
}
