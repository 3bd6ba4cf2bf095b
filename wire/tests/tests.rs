//! The wire crate's integration tests, one binary (as ripgrep does): the lane simulator and the
//! real Stellar samples from `shared/testdata`.

mod sim;
mod testdata;
