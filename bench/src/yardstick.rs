//! The TCP yardstick: the same ledgers as the lanes carry, over one TLS-over-TCP flow, with the
//! NTP-style clock probes that put two hosts on one clock. The bench's own (the relay ships no
//! benchmark server): `ledger-bench yardstick` serves it ([`serve`]); `remote --tcp` and the
//! `tcp` rows read it ([`client`]). Not a way to subscribe: no acks, resends or verification.

pub mod client;
pub mod message;
pub mod serve;
