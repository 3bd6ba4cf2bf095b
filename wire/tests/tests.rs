//! The wire crate's integration tests, one binary (as ripgrep does): the lane simulator, the
//! real Stellar samples from `shared/testdata`, the SEP-54 batch codec on them, and the fuzz
//! script's failure paths.

mod fuzz_script;
mod lake;
mod sim;
mod testdata;
