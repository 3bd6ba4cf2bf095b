//! The wire crate's integration tests, one binary (as ripgrep does): the lane simulator, the
//! real Stellar samples from `shared/testdata`, and the fuzz script's failure paths.

mod content;
mod fuzz_script;
mod sim;
mod testdata;
