//! Whether a session may open or a lane may join, decided from the frames and the session
//! alone: the rules the relay applies before it spends anything on a session or a lane, kept
//! here beside the close reasons they answer with, so that they are tested without sockets.
//!
//! What needs the relay's state (the connection and session caps, the CRL) stays in the relay;
//! these are the checks of what the subscriber asked for.

use crate::compress::Codec;
use crate::frame::{LaneJoin, SessionOpen, TOKEN_LEN};
use crate::PROTOCOL_VERSION;

use super::{CloseReason, Violation};

/// The session a lane asks to join, as the relay holds it.
#[derive(Debug, Clone, Copy)]
pub struct JoinTarget<'a> {
    /// The session's token, given to its lane 0 in `SessionAccept`.
    pub token: &'a [u8; TOKEN_LEN],
    /// The identity (certificate name) that opened the session.
    pub identity: &'a str,
    /// Lanes granted to the session.
    pub lanes: u8,
}

/// Checks a `SessionOpen` from a client against a relay that sends `relay_codec` chunks: the
/// protocol version is this one, and the client accepts the relay's codec.
pub fn check_open(open: &SessionOpen, relay_codec: Codec) -> Result<(), CloseReason> {
    if open.version != PROTOCOL_VERSION {
        let msg = format!("protocol version {} not supported", open.version);
        return Err(bad_request(msg));
    }
    if relay_codec != Codec::None && open.codecs & relay_codec.bit() == 0 {
        return Err(bad_request(format!(
            "this relay sends {relay_codec} chunks"
        )));
    }
    Ok(())
}

/// Checks a `LaneJoin` from a client whose certificate names `identity`: the session exists
/// (`session`), the token is its token (compared without an early exit), the identity is the
/// session's, the lane is one of those granted and the protocol version is this one.
pub fn check_join(
    join: &LaneJoin,
    session: Option<JoinTarget<'_>>,
    identity: &str,
) -> Result<(), CloseReason> {
    let unauthorized = |detail: String| CloseReason::Unauthorized { detail };
    let Some(s) = session else {
        return Err(unauthorized("no such session".into()));
    };
    if !tokens_equal(s.token, &join.token) {
        return Err(unauthorized("wrong session token".into()));
    }
    if s.identity != identity {
        return Err(unauthorized(format!(
            "lane identity {identity} differs from the session's {}",
            s.identity
        )));
    }
    if join.lane >= s.lanes {
        let msg = format!("lane {} beyond the {} granted", join.lane, s.lanes);
        return Err(bad_request(msg));
    }
    if join.version != PROTOCOL_VERSION {
        let msg = format!("protocol version {} not supported", join.version);
        return Err(bad_request(msg));
    }
    Ok(())
}

fn bad_request(detail: String) -> CloseReason {
    Violation::BadRequest { detail }.into()
}

/// Compares tokens without an early exit, so timing does not reveal a prefix.
fn tokens_equal(a: &[u8; TOKEN_LEN], b: &[u8; TOKEN_LEN]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests;
