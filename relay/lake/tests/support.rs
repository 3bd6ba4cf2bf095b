//! Shared set-up: the 320 real testnet ledgers, lakes on a temporary directory or on a bucket
//! of a loopback S3 server, and writing ledgers the way the relay's exporter does.

use std::fs::File;
use std::sync::Arc;

use bytes::Bytes;
use ledger_relay_lake::testing::{unique_bucket, S3Server};
use ledger_relay_lake::{
    BatchAssembler, BatchLedger, Lake, LakeError, LakeOptions, LakeStats, LakeUrl, Layout, Offer,
    PutOutcome, TESTNET_PASSPHRASE,
};
use ledger_relay_wire::header::peek_header;
use ledger_relay_wire::record::{open_stream, Records, DEFAULT_MAX_RECORD_LEN};

pub const FIRST: u32 = 1_410_048;
pub const LAST: u32 = 1_410_367;

/// The testnet ledgers 1410048..=1410367 (a verified hash chain), with their headers.
pub fn testnet() -> Vec<BatchLedger> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../testdata/testnet/testnet-1410048-1410367.lcm-v0.framed.xdr"
    );
    let stream = open_stream(File::open(path).unwrap()).unwrap();
    Records::new(stream, DEFAULT_MAX_RECORD_LEN)
        .map(|r| {
            let raw = Bytes::from(r.unwrap());
            let info = peek_header(&raw).unwrap().unwrap();
            BatchLedger { info, raw }
        })
        .collect()
}

/// Where a test's lake lives.
pub enum Place {
    /// A temporary directory.
    File(tempfile::TempDir),
    /// A fresh bucket of the shared loopback S3 server.
    S3(Arc<S3Server>, String),
}

impl Place {
    pub fn file() -> Place {
        Place::File(tempfile::tempdir().unwrap())
    }

    pub fn s3(tag: &str) -> Place {
        let server = S3Server::shared().expect("a loopback S3 server (moto_server)");
        let bucket = unique_bucket(tag);
        server.create_bucket(&bucket).unwrap();
        Place::S3(server, bucket)
    }

    pub fn url(&self) -> LakeUrl {
        match self {
            Place::File(dir) => format!("file://{}/lake", dir.path().display())
                .parse()
                .unwrap(),
            Place::S3(_, bucket) => format!("s3://{bucket}/stellar/testnet").parse().unwrap(),
        }
    }

    pub fn opts(&self) -> LakeOptions {
        let mut o = LakeOptions::default();
        if let Place::S3(server, _) = self {
            o.store_config = server.store_config();
        }
        o
    }

    /// Both kinds, for tests that run on each.
    pub fn both(tag: &str) -> Vec<Place> {
        vec![Place::file(), Place::s3(tag)]
    }
}

/// Opens the lake at `place` for writing with `layout`.
pub async fn writer(place: &Place, layout: Layout) -> Result<Arc<Lake>, LakeError> {
    Lake::open_for_writing(
        &place.url(),
        &place.opts(),
        TESTNET_PASSPHRASE,
        layout,
        Arc::new(LakeStats::default()),
    )
    .await
    .map(Arc::new)
}

/// Opens the lake at `place` to read.
pub async fn reader(place: &Place) -> Result<Arc<Lake>, LakeError> {
    Lake::open(
        &place.url(),
        &place.opts(),
        Some(TESTNET_PASSPHRASE),
        Arc::new(LakeStats::default()),
    )
    .await
    .map(Arc::new)
}

/// What writing a run of ledgers did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Written {
    pub objects: usize,
    pub present: usize,
    pub skipped: usize,
}

/// Writes `ledgers` after the lake's newest, as the exporter does.
pub async fn export(lake: &Lake, ledgers: &[BatchLedger]) -> Written {
    let tail = lake.newest().await.unwrap();
    let mut asm = BatchAssembler::new(lake.schema(), tail);
    let mut w = Written::default();
    for l in ledgers {
        match asm.offer(l.clone()).unwrap() {
            Offer::AlreadyHeld => w.skipped += 1,
            Offer::Taken => {}
            other => panic!("{other:?}"),
        }
        if let Some(batch) = asm.take_ready() {
            match lake.put_batch(&batch, 3).await.unwrap() {
                PutOutcome::Written { .. } => w.objects += 1,
                PutOutcome::AlreadyPresent => w.present += 1,
            }
        }
    }
    w
}
