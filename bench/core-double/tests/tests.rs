//! Tests of the core double against hand-checked expectations: its state (from the testnet
//! ledgers and from small synthetic Soroban ledgers), its answers on both ports in core's
//! formats, its HTTP servers, and the `ledger-core-double` binary as a `pipe:` source.

mod answers;
mod binary;
mod command;
mod servers;
mod state;
mod support;
