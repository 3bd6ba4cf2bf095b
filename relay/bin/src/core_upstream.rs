//! A tier relay's requests for stellar-core: with a `relay:` source and neither `--core-http`
//! nor `--core-query`, the requests this relay's clients send for core's HTTP ports go on to
//! its upstream relays, over one request connection of the subscriber library's
//! [`CoreClient`], with the client certificate `--upstream-name` (as the ledgers come), failing
//! over along the same list. The relay library makes its decision (endpoint, allow-lists,
//! size, concurrency) first; what passes is sent as it came, and the upstream's answer, core's
//! or a relay's own, comes back as it is.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use futures::future::BoxFuture;
use ledger_relay::config::UpstreamConfig;
use ledger_relay::core_http::{CoreBackend, CoreRequest, CoreResponse};
use ledger_relay_subscriber::core_http::{CoreClient, CoreClientConfig};
use ledger_relay_subscriber::{Credentials, RelayAddr, SubscribeConfig};
use tokio::time::Instant;

/// Requests for stellar-core, forwarded to the upstream relays.
#[derive(Debug)]
struct Upstream {
    client: CoreClient,
}

impl CoreBackend for Upstream {
    fn forward<'a>(
        &'a self,
        mut request: CoreRequest,
        _identity: &'a str,
        deadline: Instant,
    ) -> BoxFuture<'a, CoreResponse> {
        Box::pin(async move {
            // The upstream gets the time this relay has left, so it answers (504 at worst)
            // before this relay gives up.
            let left = deadline.saturating_duration_since(Instant::now());
            request.timeout_ms = u32::try_from(left.as_millis()).unwrap_or(u32::MAX).max(1);
            match self.client.request(request).await {
                Ok(response) => response,
                Err(e) => e.to_response(),
            }
        })
    }
}

/// The backend of a tier relay whose certificates are in `certs`: its `upstreams` (the
/// `relay:` source's addresses), as client `upstream.name`.
pub fn backend(
    certs: &Path,
    upstream: &UpstreamConfig,
    upstreams: &[String],
) -> anyhow::Result<Arc<dyn CoreBackend>> {
    let relays = upstreams
        .iter()
        .map(|a| a.parse::<RelayAddr>())
        .collect::<Result<Vec<_>, _>>()
        .context("upstream relay address")?;
    let credentials = Credentials::from_cert_dir(certs, &upstream.name)
        .with_context(|| format!("upstream certificate {}", upstream.name))?;
    let subscription = SubscribeConfig::new(relays, credentials);
    let client = CoreClient::new(CoreClientConfig::from_subscription(&subscription))
        .context("the client of the upstream relays' request connection")?;
    Ok(Arc::new(Upstream { client }))
}
