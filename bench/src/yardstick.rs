//! The TCP yardstick: the same ledgers as the lanes carry over one TLS-over-TCP flow, with
//! NTP-style clock probes; [`serve`] serves it, [`client`] reads it. No acks, resends or checks.

pub mod client;
pub mod message;
pub mod serve;
