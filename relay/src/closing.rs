//! Closing a subscriber's connection for a typed reason. What the subscriber is told (the
//! `Error` frame, the QUIC close code and message) is decided by `wire`'s
//! [`CloseReason`] alone; this only puts it on the connection, so that no caller writes a code
//! or a message of its own.

use std::time::Duration;

use ledger_relay_transport::close_with_error;
use ledger_relay_wire::sender::CloseReason;
use quinn::{Connection, SendStream};

/// How long an ending session waits for its `Error` frame to be acknowledged.
pub const CLOSE_LINGER: Duration = Duration::from_millis(500);

/// Closes `conn` for `reason` without an `Error` frame (a lane other than lane 0, whose control
/// stream carries the frame, or a connection with no control stream): the reason's close code
/// and message.
pub(crate) fn close_plain(conn: &Connection, reason: &CloseReason) {
    conn.close(reason.close_code().into(), reason.to_string().as_bytes());
}

/// Closes `conn` for `reason`: the reason's `Error` frame on the control stream `control` first
/// (waiting up to [`CLOSE_LINGER`] for the peer to read it) when it has one, else a plain close.
pub(crate) async fn close_for(conn: &Connection, control: &mut SendStream, reason: &CloseReason) {
    match reason.error_frame() {
        Some(frame) => close_with_error(conn, control, &frame, CLOSE_LINGER).await,
        None => close_plain(conn, reason),
    }
}
