//! The TCP yardstick: the same ledgers as the relay's lanes carry, over one TLS-over-TCP flow,
//! so that a single flow can be put beside the lanes on the same network. It belongs to the
//! bench (the relay ships no benchmark server): `ledger-bench yardstick` serves it on the
//! relay's host ([`serve`]), `ledger-bench remote --tcp` and the `tcp` rows read it
//! ([`client`]), and it carries the NTP-style clock probes that put two hosts' delivery on one
//! clock ([`message`]). A yardstick, not a way to subscribe: no acknowledgements, resends,
//! failover or verification.

pub mod client;
pub mod message;
pub mod serve;
