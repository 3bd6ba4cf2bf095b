//! One lake: its store, its manifest and layout, and the operations on whole objects (read a
//! batch, find the range it holds, put a batch once).

use std::sync::Arc;

use bytes::Bytes;
use futures::TryStreamExt;
use ledger_relay_wire::lake::{
    self, Batch, BatchLimits, Extension, Manifest, ObjectName, Schema, MANIFEST_KEY,
};
use ledger_relay_wire::Hex;
use object_store::path::Path;
use object_store::{
    Attribute, AttributeValue, Attributes, ObjectStore, ObjectStoreExt, PutMode, PutOptions,
    PutPayload,
};
use tracing::{info, warn};

use crate::error::{LakeError, LakeStats};
use crate::url::{ClientSettings, LakeUrl};

/// How a lake is opened.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LakeOptions {
    /// The store client's timeouts and retries.
    pub client: ClientSettings,
    /// Bounds on the objects read.
    pub limits: BatchLimits,
    /// `object_store` configuration keys set on top of the environment (see
    /// [`LakeUrl::open`]).
    pub store_config: Vec<(String, String)>,
}

/// The layout a writer asks for. A value left `None` takes the lake's, or Galexie's default
/// (1 ledger per batch, 64000 batches per partition) for a new lake; a value given must match
/// an existing lake's manifest.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Layout {
    /// `--export-ledgers-per-file`.
    pub ledgers_per_batch: Option<u32>,
    /// `--export-files-per-partition`.
    pub batches_per_partition: Option<u32>,
}

/// Galexie's default layout.
pub const DEFAULT_LEDGERS_PER_BATCH: u32 = 1;
/// Galexie's default layout.
pub const DEFAULT_BATCHES_PER_PARTITION: u32 = 64000;

/// What became of a batch put into the lake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutOutcome {
    /// The object was written, `bytes` long.
    Written {
        /// The object's length.
        bytes: u64,
    },
    /// An identical batch was already there (a restart after the upload but before the relay
    /// noted it); nothing was written.
    AlreadyPresent,
}

/// An open lake.
#[derive(Debug)]
pub struct Lake {
    url: LakeUrl,
    store: Arc<dyn ObjectStore>,
    manifest: Manifest,
    schema: Schema,
    limits: BatchLimits,
    stats: Arc<LakeStats>,
}

impl Lake {
    /// Opens an existing lake to read: its manifest must be there and, when `network` is
    /// given, name that network.
    pub async fn open(
        url: &LakeUrl,
        opts: &LakeOptions,
        network: Option<&str>,
        stats: Arc<LakeStats>,
    ) -> Result<Lake, LakeError> {
        let store = url
            .open(&opts.client, &opts.store_config)
            .inspect_err(|e| stats.count(e))?;
        let r = async {
            let manifest = read_manifest(&store)
                .await?
                .ok_or_else(|| LakeError::NoManifest {
                    key: MANIFEST_KEY.into(),
                })?;
            let schema = checked_schema(&manifest, network)?;
            Ok::<_, LakeError>((manifest, schema))
        }
        .await;
        let (manifest, schema) = r.inspect_err(|e| stats.count(e))?;
        Lake::finish_open(url, opts, store, manifest, schema, stats).await
    }

    /// Opens a lake to write on `network` (a passphrase), publishing the manifest if the lake
    /// has none (put-if-absent, so two writers starting at once agree on one).
    ///
    /// A store that answers as it comes back (the put refused because a manifest exists, then
    /// none to read; a bucket not there yet) fails with a transient error
    /// ([`LakeError::is_transient`]): trying again later opens it.
    pub async fn open_for_writing(
        url: &LakeUrl,
        opts: &LakeOptions,
        network: &str,
        layout: Layout,
        stats: Arc<LakeStats>,
    ) -> Result<Lake, LakeError> {
        let store = url
            .open(&opts.client, &opts.store_config)
            .inspect_err(|e| stats.count(e))?;
        Lake::open_store_for_writing(url, opts, store, network, layout, stats).await
    }

    /// [`Lake::open_for_writing`] on a store already opened.
    async fn open_store_for_writing(
        url: &LakeUrl,
        opts: &LakeOptions,
        store: Arc<dyn ObjectStore>,
        network: &str,
        layout: Layout,
        stats: Arc<LakeStats>,
    ) -> Result<Lake, LakeError> {
        let r = async {
            let manifest = match read_manifest(&store).await? {
                Some(m) => m,
                None => publish_manifest(&store, url, network, layout).await?,
            };
            let schema = checked_schema(&manifest, Some(network))?;
            check_layout(&schema, layout)?;
            Ok((manifest, schema))
        }
        .await;
        let (manifest, schema) = r.inspect_err(|e| stats.count(e))?;
        Lake::finish_open(url, opts, store, manifest, schema, stats).await
    }

    /// The lake once its manifest is read (or published): names its objects as the existing
    /// ones are named.
    async fn finish_open(
        url: &LakeUrl,
        opts: &LakeOptions,
        store: Arc<dyn ObjectStore>,
        manifest: Manifest,
        schema: Schema,
        stats: Arc<LakeStats>,
    ) -> Result<Lake, LakeError> {
        let mut lake = Lake {
            url: url.clone(),
            store,
            manifest,
            schema,
            limits: opts.limits.clone(),
            stats,
        };
        lake.detect_extension().await?;
        Ok(lake)
    }

    /// Names objects as the lake's existing ones are named: a lake written by Galexie before
    /// version 23 uses `.xdr.zstd`, and its readers look for one extension only.
    async fn detect_extension(&mut self) -> Result<(), LakeError> {
        if let Some(n) = self.extreme(true).await? {
            if n.extension != self.schema.extension() {
                info!(lake = %self.url, extension = n.extension.as_str(), "the lake names its objects with an older extension; using it");
            }
            self.schema = self.schema.with_extension(n.extension);
        }
        Ok(())
    }

    /// The lake's URL.
    pub fn url(&self) -> &LakeUrl {
        &self.url
    }

    /// The lake's layout.
    pub fn schema(&self) -> Schema {
        self.schema
    }

    /// The lake's manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The bounds objects are read under.
    pub fn limits(&self) -> &BatchLimits {
        &self.limits
    }

    /// The lake's counters.
    pub fn stats(&self) -> &Arc<LakeStats> {
        &self.stats
    }

    /// The key of the object holding `seq`.
    pub fn key(&self, seq: u32) -> String {
        self.schema.object_key(seq)
    }

    /// Counts `e` and passes it on.
    fn counted<T>(&self, r: Result<T, LakeError>) -> Result<T, LakeError> {
        if let Err(e) = &r {
            self.stats.count(e);
        }
        r
    }

    /// Reads an object whole, refusing one larger than the limits before reading its body.
    async fn get_object(&self, key: &str) -> Result<Bytes, LakeError> {
        let got = self
            .store
            .get(&Path::from(key))
            .await
            .map_err(|e| LakeError::from_store(key, e))?;
        if got.meta.size > self.limits.max_object {
            return Err(LakeError::Corrupt {
                key: key.to_owned(),
                reason: format!(
                    "object of {} bytes exceeds the limit of {}",
                    got.meta.size, self.limits.max_object
                ),
            });
        }
        let bytes = got
            .bytes()
            .await
            .map_err(|e| LakeError::from_store(key, e))?;
        LakeStats::add(&self.stats.objects_read, 1);
        LakeStats::add(&self.stats.bytes_read, bytes.len() as u64);
        Ok(bytes)
    }

    /// Reads, decompresses, decodes and checks the batch holding `seq` (see
    /// [`lake::read_object`]). Decoding runs on a blocking thread.
    pub async fn read_batch(&self, seq: u32) -> Result<Batch, LakeError> {
        let key = self.key(seq);
        let r = async {
            let object = self.get_object(&key).await?;
            let (first, last) = self.schema.batch_range(seq);
            let limits = self.limits.clone();
            let k = key.clone();
            tokio::task::spawn_blocking(move || {
                lake::read_object(&object, first, last, &limits)
                    .map_err(|e| LakeError::from_batch(&k, e))
            })
            .await
            .map_err(|e| LakeError::Store {
                key: key.clone(),
                reason: format!("decoding task failed: {e}"),
            })?
        }
        .await;
        self.counted(r)
    }

    /// Whether the object holding `seq` exists (one HEAD request): how a reader following a
    /// lake polls for the next batch without listing.
    pub async fn holds(&self, seq: u32) -> Result<bool, LakeError> {
        let key = self.key(seq);
        let r = match self.store.head(&Path::from(key.as_str())).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(LakeError::from_store(&key, e)),
        };
        self.counted(r)
    }

    /// The oldest and newest ledger the lake holds, from a listing (and, for the oldest, the
    /// header of its object: a batch may start after its key's first sequence). `None` for an
    /// empty lake. Gaps in between are not looked for.
    pub async fn range(&self) -> Result<Option<(u32, u32)>, LakeError> {
        let r = async {
            let (Some(oldest), Some(newest)) =
                (self.extreme(false).await?, self.extreme(true).await?)
            else {
                return Ok(None);
            };
            let key = self.key(oldest.first);
            let object = self.get_object(&key).await?;
            let (start, _, _) =
                lake::peek_object_range(&object).map_err(|e| LakeError::from_batch(&key, e))?;
            Ok(Some((start.max(oldest.first), newest.last)))
        }
        .await;
        self.counted(r)
    }

    /// The newest ledger the lake holds and its hash (from its object), or `None` for an empty
    /// lake: where a writer resumes.
    pub async fn newest(&self) -> Result<Option<(u32, [u8; 32])>, LakeError> {
        let Some(n) = self.counted(self.extreme(true).await)? else {
            return Ok(None);
        };
        let batch = self.read_batch(n.last).await?;
        let last = batch.ledgers.last().ok_or_else(|| LakeError::Corrupt {
            key: self.key(n.last),
            reason: "empty batch".into(),
        })?;
        Ok(Some((last.info.ledger_seq, last.info.hash)))
    }

    /// The newest (or oldest) batch name in the lake. Listings are not assumed sorted (a local
    /// filesystem's are not), so each level is read whole; a partition holds at most
    /// `batchesPerPartition` objects.
    async fn extreme(&self, newest: bool) -> Result<Option<ObjectName>, LakeError> {
        let pick = |names: Vec<ObjectName>| {
            if newest {
                names.into_iter().max_by_key(|n| n.first)
            } else {
                names.into_iter().min_by_key(|n| n.first)
            }
        };
        if self.schema.batches_per_partition() <= 1 {
            let names = self.list_names(None).await?;
            return Ok(pick(names));
        }
        let top = self
            .store
            .list_with_delimiter(None)
            .await
            .map_err(|e| LakeError::from_store("", e))?;
        let mut parts: Vec<(u32, Path)> = top
            .common_prefixes
            .into_iter()
            .filter_map(|p| {
                let name = p.filename()?.to_owned();
                lake::parse_partition_name(&name).map(|(first, _)| (first, p))
            })
            .collect();
        parts.sort_by_key(|(first, _)| *first);
        if newest {
            parts.reverse();
        }
        for (_, dir) in parts {
            let names = self.list_names(Some(&dir)).await?;
            if let Some(n) = pick(names) {
                return Ok(Some(n));
            }
        }
        Ok(None)
    }

    async fn list_names(&self, dir: Option<&Path>) -> Result<Vec<ObjectName>, LakeError> {
        let key = dir.map_or(String::new(), |d| d.to_string());
        let metas: Vec<object_store::ObjectMeta> = self
            .store
            .list(dir)
            .try_collect()
            .await
            .map_err(|e| LakeError::from_store(&key, e))?;
        Ok(metas
            .into_iter()
            .filter_map(|m| m.location.filename().and_then(lake::parse_batch_name))
            .filter(|n| {
                let ok = n.first == self.schema.batch_range(n.first).0
                    && n.last == self.schema.batch_range(n.first).1;
                if !ok {
                    warn!(
                        first = n.first,
                        last = n.last,
                        "an object name that does not fit the lake's layout: ignored"
                    );
                }
                ok
            })
            .collect())
    }

    /// Puts the batch `start..=end` of `ledgers` (their XDR, in order) at its key, once: if
    /// the key already holds an object, it is read back and must hold the same ledgers
    /// ([`PutOutcome::AlreadyPresent`]), else [`LakeError::Conflict`]. Compression (zstd at
    /// `level`) runs on a blocking thread.
    pub async fn put_batch(
        &self,
        ledgers: &[ledger_relay_wire::lake::BatchLedger],
        level: i32,
    ) -> Result<PutOutcome, LakeError> {
        let (Some(first), Some(last)) = (ledgers.first(), ledgers.last()) else {
            return Ok(PutOutcome::AlreadyPresent);
        };
        let (start, end) = (first.info.ledger_seq, last.info.ledger_seq);
        let key = self.key(start);
        let r = async {
            let raws: Vec<Bytes> = ledgers.iter().map(|l| l.raw.clone()).collect();
            let k = key.clone();
            let object = tokio::task::spawn_blocking(move || {
                lake::compress_object(&lake::encode_batch(start, end, &raws), level)
            })
            .await
            .map_err(|e| LakeError::Store {
                key: key.clone(),
                reason: format!("compression task failed: {e}"),
            })?
            .map_err(|e| LakeError::Store {
                key: k,
                reason: format!("compressing: {e}"),
            })?;
            let len = object.len() as u64;
            let mut opts = PutOptions::from(PutMode::Create);
            if self.url.supports_metadata() {
                opts.attributes = self.metadata(first, last);
            }
            let path = Path::from(key.as_str());
            let payload = PutPayload::from(object);
            let res = match self.store.put_opts(&path, payload.clone(), opts).await {
                Err(object_store::Error::NotImplemented { .. }) => {
                    // A store without conditional puts: look first (racy against another
                    // writer, which a lake should not have).
                    match self.store.head(&path).await {
                        Ok(_) => Err(object_store::Error::AlreadyExists {
                            path: key.clone(),
                            source: "present".into(),
                        }),
                        Err(object_store::Error::NotFound { .. }) => {
                            self.store.put(&path, payload).await
                        }
                        Err(e) => Err(e),
                    }
                }
                other => other,
            };
            match res {
                Ok(_) => {
                    LakeStats::add(&self.stats.objects_written, 1);
                    LakeStats::add(&self.stats.bytes_written, len);
                    Ok(PutOutcome::Written { bytes: len })
                }
                Err(object_store::Error::AlreadyExists { .. })
                | Err(object_store::Error::Precondition { .. }) => {
                    self.check_present(&key, ledgers).await
                }
                Err(e) => Err(LakeError::from_put(&key, e)),
            }
        }
        .await;
        self.counted(r)
    }

    /// After a put refused because `key` holds an object: [`PutOutcome::AlreadyPresent`] if it
    /// holds `ledgers`, [`LakeError::Conflict`] if it holds others. An object the store cannot
    /// read now, or that it said was there and then did not find (a store coming back), is a
    /// transient failure: the put is tried again later.
    async fn check_present(
        &self,
        key: &str,
        ledgers: &[ledger_relay_wire::lake::BatchLedger],
    ) -> Result<PutOutcome, LakeError> {
        let (first, start, end) = match (ledgers.first(), ledgers.last()) {
            (Some(f), Some(l)) => (f, f.info.ledger_seq, l.info.ledger_seq),
            _ => return Ok(PutOutcome::AlreadyPresent),
        };
        let held = self.read_batch(start).await.map_err(|e| match e {
            e if e.is_transient() => e,
            LakeError::Missing { .. } => LakeError::Store {
                key: key.to_owned(),
                reason: "the store refused the put as present, then had no object to read (a \
                         store coming back, or not yet consistent)"
                    .into(),
            },
            e => LakeError::Conflict {
                key: key.to_owned(),
                reason: format!("an object is there but cannot be read: {e}"),
            },
        })?;
        let same = held.ledgers.len() == ledgers.len()
            && held
                .ledgers
                .iter()
                .zip(ledgers)
                .all(|(a, b)| a.raw == b.raw);
        if same {
            LakeStats::add(&self.stats.objects_present, 1);
            return Ok(PutOutcome::AlreadyPresent);
        }
        Err(LakeError::Conflict {
            key: key.to_owned(),
            reason: format!(
                "the lake holds {}-{} (first hash {}), this relay has {start}-{end} (first hash {})",
                held.start,
                held.end,
                held.ledgers
                    .first()
                    .map_or(String::new(), |l| Hex(&l.info.hash).to_string()),
                Hex(&first.info.hash),
            ),
        })
    }

    /// Galexie's object metadata (`x-lexie-*`), for tools that read it.
    fn metadata(
        &self,
        first: &ledger_relay_wire::lake::BatchLedger,
        last: &ledger_relay_wire::lake::BatchLedger,
    ) -> Attributes {
        let m = |k: &'static str, v: String| {
            (
                Attribute::Metadata(std::borrow::Cow::Borrowed(k)),
                AttributeValue::from(v),
            )
        };
        Attributes::from_iter([
            m("x-lexie-start-ledger", first.info.ledger_seq.to_string()),
            m("x-lexie-end-ledger", last.info.ledger_seq.to_string()),
            m(
                "x-lexie-start-ledger-close-time",
                first.info.close_time.to_string(),
            ),
            m(
                "x-lexie-end-ledger-close-time",
                last.info.close_time.to_string(),
            ),
            m(
                "x-lexie-protocol-version",
                last.info.protocol_version.to_string(),
            ),
            m("x-lexie-network", self.manifest.network_passphrase.clone()),
            m(
                "x-lexie-compression-type",
                Extension::Zst.as_str().to_owned(),
            ),
            m(
                "x-lexie-version",
                concat!("ledger-relay-", env!("CARGO_PKG_VERSION")).to_owned(),
            ),
        ])
    }
}

/// Publishes a manifest for `network` with `layout` (Galexie's defaults where `None`),
/// put-if-absent; if another writer published one first, theirs.
async fn publish_manifest(
    store: &Arc<dyn ObjectStore>,
    url: &LakeUrl,
    network: &str,
    layout: Layout,
) -> Result<Manifest, LakeError> {
    let schema = Schema::new(
        layout
            .ledgers_per_batch
            .unwrap_or(DEFAULT_LEDGERS_PER_BATCH),
        layout
            .batches_per_partition
            .unwrap_or(DEFAULT_BATCHES_PER_PARTITION),
    )
    .map_err(|e| LakeError::Manifest {
        key: MANIFEST_KEY.into(),
        reason: e.to_string(),
    })?;
    let mine = Manifest::new(network, &schema);
    let mut opts = PutOptions::from(PutMode::Create);
    if url.supports_metadata() {
        opts.attributes = Attributes::from_iter([(
            Attribute::ContentType,
            AttributeValue::from("application/json"),
        )]);
    }
    match store
        .put_opts(&Path::from(MANIFEST_KEY), mine.to_json().into(), opts)
        .await
    {
        Ok(_) => {
            info!(lake = %url, "published the lake's manifest");
            Ok(mine)
        }
        // Another writer published one first: use theirs. A store that has just come back may
        // say so and then have none to read yet: that is worth another try, not a verdict.
        Err(object_store::Error::AlreadyExists { .. })
        | Err(object_store::Error::Precondition { .. }) => {
            read_manifest(store).await?.ok_or_else(|| LakeError::Store {
                key: MANIFEST_KEY.into(),
                reason: "the store refused to create the manifest as present, then had none to \
                         read (a store coming back, or not yet consistent)"
                    .into(),
            })
        }
        Err(e) => Err(LakeError::from_put(MANIFEST_KEY, e)),
    }
}

/// Checks that the layout a writer asked for (where it asked) is the lake's.
fn check_layout(schema: &Schema, layout: Layout) -> Result<(), LakeError> {
    let mut diffs = Vec::new();
    if let Some(n) = layout.ledgers_per_batch {
        if n != schema.ledgers_per_batch() {
            diffs.push(format!(
                "ledgers per file: asked {n}, the lake has {}",
                schema.ledgers_per_batch()
            ));
        }
    }
    if let Some(n) = layout.batches_per_partition {
        if n != schema.batches_per_partition() {
            diffs.push(format!(
                "files per partition: asked {n}, the lake has {}",
                schema.batches_per_partition()
            ));
        }
    }
    if diffs.is_empty() {
        return Ok(());
    }
    Err(LakeError::Manifest {
        key: MANIFEST_KEY.into(),
        reason: format!(
            "the lake's layout differs ({}); drop the flags to use the lake's",
            diffs.join("; ")
        ),
    })
}

async fn read_manifest(store: &Arc<dyn ObjectStore>) -> Result<Option<Manifest>, LakeError> {
    let got = match store.get(&Path::from(MANIFEST_KEY)).await {
        Ok(got) => got,
        Err(object_store::Error::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(LakeError::from_store(MANIFEST_KEY, e)),
    };
    if got.meta.size > lake::MAX_MANIFEST_LEN as u64 {
        return Err(LakeError::Manifest {
            key: MANIFEST_KEY.into(),
            reason: format!("{} bytes is too long for a manifest", got.meta.size),
        });
    }
    let bytes = got
        .bytes()
        .await
        .map_err(|e| LakeError::from_store(MANIFEST_KEY, e))?;
    Manifest::parse(&bytes)
        .map(Some)
        .map_err(|e| LakeError::Manifest {
            key: MANIFEST_KEY.into(),
            reason: e.to_string(),
        })
}

/// The manifest's layout, once it names `network` (when one is given).
fn checked_schema(manifest: &Manifest, network: Option<&str>) -> Result<Schema, LakeError> {
    check_network(manifest, network)?;
    manifest.schema().map_err(|e| LakeError::Manifest {
        key: MANIFEST_KEY.into(),
        reason: e.to_string(),
    })
}

fn check_network(manifest: &Manifest, network: Option<&str>) -> Result<(), LakeError> {
    match network {
        Some(want)
            if !manifest.network_passphrase.is_empty() && manifest.network_passphrase != want =>
        {
            Err(LakeError::WrongNetwork {
                key: MANIFEST_KEY.into(),
                expected: want.to_owned(),
                got: manifest.network_passphrase.clone(),
            })
        }
        Some(_) if manifest.network_passphrase.is_empty() => {
            warn!("the lake's manifest names no network: it cannot be checked");
            Ok(())
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests;
