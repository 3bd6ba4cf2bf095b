//! The wire crate's integration tests, one binary (as ripgrep does): the reassembler's fault
//! simulator (`sim`), the sender against the reassembler over virtual lanes (`sender_sim`), the
//! real Stellar samples from `testdata/`, the SEP-54 batch codec on them, and the fuzz
//! script's failure paths.

mod content;
mod fuzz_script;
mod lake;
mod sender_sim;
mod sim;
mod testdata;
