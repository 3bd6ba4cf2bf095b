//! A lake on a store double that answers some puts the way a store coming back does: a
//! conditional put refused as present with nothing to read yet, or no bucket yet. A writer
//! must take either for a failure worth another try, never for a verdict.

use std::collections::VecDeque;
use std::sync::Mutex;

use futures::stream::BoxStream;
use object_store::memory::InMemory;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta,
    PutMultipartOptions, PutResult,
};

use super::*;

/// An answer the double gives a put instead of storing it.
#[derive(Debug, Clone, Copy)]
enum Refusal {
    /// `412 Precondition Failed`: the store says an object is there.
    Precondition,
    /// `404`: no such bucket.
    NoBucket,
}

/// [`InMemory`], except that the next puts of the keys queued in `refuse` get the queued
/// answer (once each) and store nothing.
#[derive(Debug, Default)]
struct ComingBack {
    inner: InMemory,
    refuse: Mutex<VecDeque<(String, Refusal)>>,
}

impl std::fmt::Display for ComingBack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ComingBack")
    }
}

impl ComingBack {
    fn refusing(refusals: &[(&str, Refusal)]) -> Arc<ComingBack> {
        let store = ComingBack::default();
        *store.refuse.lock().unwrap() = refusals.iter().map(|(k, r)| (k.to_string(), *r)).collect();
        Arc::new(store)
    }

    fn refusal_for(&self, location: &Path) -> Option<object_store::Error> {
        let mut queue = self.refuse.lock().unwrap();
        if queue.front()?.0 != location.as_ref() {
            return None;
        }
        let (path, refusal) = queue.pop_front()?;
        Some(match refusal {
            Refusal::Precondition => object_store::Error::Precondition {
                path,
                source: "the object exists".into(),
            },
            Refusal::NoBucket => object_store::Error::NotFound {
                path,
                source: "NoSuchBucket".into(),
            },
        })
    }
}

#[async_trait::async_trait]
impl ObjectStore for ComingBack {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        match self.refusal_for(location) {
            Some(e) => Err(e),
            None => self.inner.put_opts(location, payload, opts).await,
        }
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.inner.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

const NETWORK: &str = "Test SDF Network ; September 2015";

async fn open(store: &Arc<ComingBack>) -> Result<Lake, LakeError> {
    let url: LakeUrl = "s3://coming-back/testnet".parse().unwrap();
    let store: Arc<dyn ObjectStore> = store.clone();
    let stats = Arc::new(LakeStats::default());
    Lake::open_store_for_writing(
        &url,
        &LakeOptions::default(),
        store,
        NETWORK,
        Layout::default(),
        stats,
    )
    .await
}

/// The first testnet ledger, as the exporter offers it.
fn ledger() -> lake::BatchLedger {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../testdata/testnet/testnet-1410048-1410367.lcm-v0.framed.xdr"
    );
    let file = std::fs::File::open(path).unwrap();
    let raw = ledger_relay_wire::record::Records::new(file, 256 << 20)
        .next()
        .unwrap()
        .unwrap();
    let raw = Bytes::from(raw);
    let info = ledger_relay_wire::header::peek_header(&raw)
        .unwrap()
        .unwrap();
    lake::BatchLedger { info, raw }
}

#[tokio::test]
async fn a_manifest_put_refused_as_present_with_none_to_read_is_tried_again() {
    let store = ComingBack::refusing(&[(MANIFEST_KEY, Refusal::Precondition)]);
    let e = open(&store).await.unwrap_err();
    assert!(e.is_transient(), "{e}");
    let lake = open(&store).await.unwrap();
    assert_eq!(lake.manifest().network_passphrase, NETWORK);
    let again = open(&store).await.unwrap();
    assert_eq!(again.manifest(), lake.manifest(), "one manifest, read back");
}

#[tokio::test]
async fn a_manifest_put_to_a_bucket_not_there_yet_is_tried_again() {
    let store = ComingBack::refusing(&[(MANIFEST_KEY, Refusal::NoBucket)]);
    let e = open(&store).await.unwrap_err();
    assert!(e.is_transient(), "{e}");
    assert_eq!(
        open(&store).await.unwrap().manifest().network_passphrase,
        NETWORK
    );
}

#[tokio::test]
async fn a_batch_put_refused_by_a_store_coming_back_is_tried_again() {
    let l = ledger();
    let store = ComingBack::refusing(&[]);
    let lake = open(&store).await.unwrap();
    let key = lake.key(l.info.ledger_seq);
    for refusal in [Refusal::NoBucket, Refusal::Precondition] {
        store
            .refuse
            .lock()
            .unwrap()
            .push_back((key.clone(), refusal));
        let e = lake
            .put_batch(std::slice::from_ref(&l), 1)
            .await
            .unwrap_err();
        assert!(e.is_transient(), "{refusal:?}: {e}");
    }
    assert!(matches!(
        lake.put_batch(std::slice::from_ref(&l), 1).await,
        Ok(PutOutcome::Written { .. })
    ));
    // Refused as present once it is: the same ledgers, so nothing to write.
    store
        .refuse
        .lock()
        .unwrap()
        .push_back((key, Refusal::Precondition));
    assert_eq!(
        lake.put_batch(&[l], 1).await,
        Ok(PutOutcome::AlreadyPresent)
    );
}
