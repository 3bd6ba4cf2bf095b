//! Unit tests of `session`.

use super::peer::check_accept;
use super::*;
use ledger_relay_wire::frame::TOKEN_LEN;

fn accept() -> SessionAccept {
    SessionAccept {
        version: PROTOCOL_VERSION,
        session_id: 1,
        token: [0; TOKEN_LEN],
        lanes: 2,
        first_seq: 100,
        oldest: 50,
        newest: 120,
        chunk_size: 256 << 10,
        window: 8,
        heartbeat_ms: 500,
        max_chunk_raw: 4 << 20,
        max_ledger_raw: 256 << 20,
    }
}

#[test]
fn accepts_are_checked_against_what_was_asked() {
    let limits = Limits::default();
    check_accept(&accept(), 4, Start::Seq(100), &limits).unwrap();
    check_accept(&accept(), 4, Start::Tip, &limits).unwrap();
    let bad = |f: &dyn Fn(&mut SessionAccept), lanes, start| {
        let mut a = accept();
        f(&mut a);
        check_accept(&a, lanes, start, &limits).unwrap_err()
    };
    assert!(bad(&|_| {}, 4, Start::Seq(99)).contains("instead of 99"));
    assert!(bad(&|_| {}, 1, Start::Tip).contains("lanes"));
    assert!(bad(&|a| a.version = 2, 4, Start::Tip).contains("version"));
    assert!(bad(&|a| a.first_seq = 0, 4, Start::Tip).contains("ledger 0"));
    assert!(bad(&|a| a.window = 9, 4, Start::Tip).contains("window"));
    assert!(bad(&|a| a.chunk_size = 8 << 20, 4, Start::Tip).contains("chunk size"));
    assert!(bad(&|a| a.max_chunk_raw = 1024, 4, Start::Tip).contains("chunk size"));
    assert!(bad(&|a| a.max_ledger_raw = 0, 4, Start::Tip).contains("largest ledger"));
}
