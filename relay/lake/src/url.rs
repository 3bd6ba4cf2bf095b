//! Lake URLs and the stores they open.
//!
//! `file:///PATH`, `s3://BUCKET/PREFIX`, `gs://BUCKET/PREFIX` and `az://CONTAINER/PREFIX`.
//! Credentials, regions and endpoints come from the environment exactly as `object_store`'s
//! builders read it (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`,
//! `AWS_ENDPOINT_URL`, `AWS_ALLOW_HTTP`, `GOOGLE_APPLICATION_CREDENTIALS`,
//! `AZURE_STORAGE_ACCOUNT_NAME`, ...); nothing here reads a credential itself.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
use object_store::local::LocalFileSystem;
use object_store::prefix::PrefixStore;
use object_store::{ClientConfigKey, ObjectStore, RetryConfig};

use crate::error::LakeError;

/// Where a lake lives.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LakeUrl {
    /// A directory on a local (or mounted) filesystem.
    File {
        /// The lake's root, absolute.
        path: PathBuf,
    },
    /// Amazon S3 or an S3-compatible store.
    S3 {
        /// The bucket.
        bucket: String,
        /// The lake's root inside it (may be empty).
        prefix: String,
    },
    /// Google Cloud Storage.
    Gcs {
        /// The bucket.
        bucket: String,
        /// The lake's root inside it.
        prefix: String,
    },
    /// Azure Blob Storage.
    Azure {
        /// The container.
        container: String,
        /// The lake's root inside it.
        prefix: String,
    },
}

impl FromStr for LakeUrl {
    type Err = LakeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |reason: &str| LakeError::BadUrl {
            url: s.to_owned(),
            reason: reason.to_owned(),
        };
        let (scheme, rest) = s.split_once("://").ok_or_else(|| {
            bad("expected file:///PATH, s3://BUCKET/PREFIX, gs://BUCKET/PREFIX or az://CONTAINER/PREFIX")
        })?;
        if scheme == "file" {
            if !rest.starts_with('/') {
                return Err(bad("a file url needs an absolute path: file:///PATH"));
            }
            let path = rest.trim_end_matches('/');
            let path = if path.is_empty() { "/" } else { path };
            return Ok(LakeUrl::File { path: path.into() });
        }
        let (name, prefix) = match rest.split_once('/') {
            Some((name, prefix)) => (name, prefix.trim_matches('/')),
            None => (rest, ""),
        };
        if name.is_empty() {
            return Err(bad("the bucket or container name is empty"));
        }
        if prefix.split('/').any(|seg| seg == "." || seg == "..") || prefix.contains("//") {
            return Err(bad("the prefix must not hold empty, `.` or `..` segments"));
        }
        let (name, prefix) = (name.to_owned(), prefix.to_owned());
        match scheme {
            "s3" => Ok(LakeUrl::S3 {
                bucket: name,
                prefix,
            }),
            "gs" => Ok(LakeUrl::Gcs {
                bucket: name,
                prefix,
            }),
            "az" => Ok(LakeUrl::Azure {
                container: name,
                prefix,
            }),
            _ => Err(bad(&format!(
                "unknown scheme {scheme:?}: expected file, s3, gs or az"
            ))),
        }
    }
}

impl fmt::Display for LakeUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (scheme, name, prefix) = match self {
            LakeUrl::File { path } => return write!(f, "file://{}", path.display()),
            LakeUrl::S3 { bucket, prefix } => ("s3", bucket, prefix),
            LakeUrl::Gcs { bucket, prefix } => ("gs", bucket, prefix),
            LakeUrl::Azure { container, prefix } => ("az", container, prefix),
        };
        if prefix.is_empty() {
            write!(f, "{scheme}://{name}")
        } else {
            write!(f, "{scheme}://{name}/{prefix}")
        }
    }
}

/// How patient the store client is. The defaults suit a lake in the same region; tests shorten
/// them so that an unreachable store fails in a second.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientSettings {
    /// Longest a request may take.
    pub timeout: Duration,
    /// Longest a connection may take to open.
    pub connect_timeout: Duration,
    /// Retries of a failed request inside the client (on top of which writers retry forever
    /// with their own backoff).
    pub retries: usize,
    /// Longest the client keeps retrying one request.
    pub retry_timeout: Duration,
}

impl Default for ClientSettings {
    fn default() -> Self {
        ClientSettings {
            timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            retries: 3,
            retry_timeout: Duration::from_secs(20),
        }
    }
}

impl LakeUrl {
    /// Opens the store at this URL, rooted at its prefix. A `file://` lake's directory is
    /// created if missing. `config` holds `object_store` configuration keys set on top of the
    /// environment (such as `aws_endpoint`, `aws_allow_http`), for tests and benches that must
    /// not change their own process's environment.
    pub fn open(
        &self,
        client: &ClientSettings,
        config: &[(String, String)],
    ) -> Result<Arc<dyn ObjectStore>, LakeError> {
        let bad = |e: &dyn fmt::Display| LakeError::BadUrl {
            url: self.to_string(),
            reason: e.to_string(),
        };
        let retry = RetryConfig {
            max_retries: client.retries,
            retry_timeout: client.retry_timeout,
            ..RetryConfig::default()
        };
        let timeout = humantime_secs(client.timeout);
        let connect = humantime_secs(client.connect_timeout);
        if !matches!(self, LakeUrl::File { .. }) {
            // reqwest's rustls has no provider of its own (see the workspace manifest): give the
            // process one, ring, unless the relay's own TLS set-up already did.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let (store, prefix): (Arc<dyn ObjectStore>, &str) = match self {
            LakeUrl::File { path } => {
                std::fs::create_dir_all(path).map_err(|e| bad(&e))?;
                let fs = LocalFileSystem::new_with_prefix(path).map_err(|e| bad(&e))?;
                (Arc::new(fs), "")
            }
            LakeUrl::S3 { bucket, prefix } => {
                let mut b = AmazonS3Builder::from_env().with_bucket_name(bucket);
                // A region is needed to sign; S3-compatible stores ignore it.
                if std::env::var_os("AWS_REGION").is_none()
                    && std::env::var_os("AWS_DEFAULT_REGION").is_none()
                {
                    b = b.with_region("us-east-1");
                }
                for (k, v) in config {
                    let key: AmazonS3ConfigKey = k.parse().map_err(|e| bad(&e))?;
                    b = b.with_config(key, v);
                }
                let s3 = b
                    .with_config(
                        AmazonS3ConfigKey::Client(ClientConfigKey::Timeout),
                        timeout.clone(),
                    )
                    .with_config(
                        AmazonS3ConfigKey::Client(ClientConfigKey::ConnectTimeout),
                        connect.clone(),
                    )
                    .with_retry(retry)
                    .build()
                    .map_err(|e| bad(&e))?;
                (Arc::new(s3), prefix.as_str())
            }
            LakeUrl::Gcs { bucket, prefix } => {
                let mut b = GoogleCloudStorageBuilder::from_env();
                for (k, v) in config {
                    let key: GoogleConfigKey = k.parse().map_err(|e| bad(&e))?;
                    b = b.with_config(key, v);
                }
                let gcs = b
                    .with_bucket_name(bucket)
                    .with_config(
                        GoogleConfigKey::Client(ClientConfigKey::Timeout),
                        timeout.clone(),
                    )
                    .with_config(
                        GoogleConfigKey::Client(ClientConfigKey::ConnectTimeout),
                        connect.clone(),
                    )
                    .with_retry(retry)
                    .build()
                    .map_err(|e| bad(&e))?;
                (Arc::new(gcs), prefix.as_str())
            }
            LakeUrl::Azure { container, prefix } => {
                let mut b = MicrosoftAzureBuilder::from_env();
                for (k, v) in config {
                    let key: AzureConfigKey = k.parse().map_err(|e| bad(&e))?;
                    b = b.with_config(key, v);
                }
                let az = b
                    .with_container_name(container)
                    .with_config(AzureConfigKey::Client(ClientConfigKey::Timeout), timeout)
                    .with_config(
                        AzureConfigKey::Client(ClientConfigKey::ConnectTimeout),
                        connect,
                    )
                    .with_retry(retry)
                    .build()
                    .map_err(|e| bad(&e))?;
                (Arc::new(az), prefix.as_str())
            }
        };
        if prefix.is_empty() {
            Ok(store)
        } else {
            Ok(Arc::new(PrefixStore::new(store, prefix)))
        }
    }

    /// Whether objects may carry user metadata (Galexie's `x-lexie-*`): the cloud stores,
    /// not the local filesystem.
    pub fn supports_metadata(&self) -> bool {
        !matches!(self, LakeUrl::File { .. })
    }
}

fn humantime_secs(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_form_and_displays_it_back() {
        for (s, want) in [
            (
                "file:///var/lake",
                LakeUrl::File {
                    path: "/var/lake".into(),
                },
            ),
            (
                "s3://aws-public-blockchain/v1.1/stellar/ledgers/pubnet",
                LakeUrl::S3 {
                    bucket: "aws-public-blockchain".into(),
                    prefix: "v1.1/stellar/ledgers/pubnet".into(),
                },
            ),
            (
                "gs://bucket",
                LakeUrl::Gcs {
                    bucket: "bucket".into(),
                    prefix: "".into(),
                },
            ),
            (
                "az://container/a/b",
                LakeUrl::Azure {
                    container: "container".into(),
                    prefix: "a/b".into(),
                },
            ),
        ] {
            let got: LakeUrl = s.parse().unwrap();
            assert_eq!(got, want, "{s}");
            assert_eq!(got.to_string(), s);
        }
        // A trailing slash is the same lake.
        assert_eq!(
            "s3://b/p/".parse::<LakeUrl>().unwrap().to_string(),
            "s3://b/p"
        );
    }

    #[test]
    fn bad_urls_are_one_line_errors() {
        for (s, want) in [
            ("/var/lake", "expected file:///PATH"),
            ("file://relative/path", "absolute path"),
            ("s3://", "bucket or container name is empty"),
            ("s3:///prefix", "bucket or container name is empty"),
            ("http://x/y", "unknown scheme \"http\""),
            ("s3://b/a/../c", "must not hold"),
            ("s3://b/a//c", "must not hold"),
        ] {
            let e = s.parse::<LakeUrl>().unwrap_err();
            assert!(matches!(e, LakeError::BadUrl { .. }));
            let e = e.to_string();
            assert!(e.contains(want), "{s}: {e}");
            assert!(!e.contains('\n'));
        }
    }
}
