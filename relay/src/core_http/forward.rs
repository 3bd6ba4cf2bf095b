//! The one place that decides on, forwards, counts and logs every request for stellar-core.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ledger_relay_wire::Limits;
use tokio::time::Instant;
use tracing::{debug, info};

use super::http::HttpBackend;
use super::{
    budget, decide, CoreBackend, CorePort, CoreRequest, CoreResponse, CoreSettings, Outcome,
    PortRule, Refusal, Rules,
};
use crate::metrics::Metrics;

/// Where requests for each port go, and the relay's rules for them.
#[derive(Debug)]
pub(crate) struct Forwarder {
    rules: Rules,
    timeout: Duration,
    command: Option<Arc<dyn CoreBackend>>,
    query: Option<Arc<dyn CoreBackend>>,
    /// Requests forwarded and not answered yet, by client identity (absent: none).
    in_flight: Mutex<HashMap<String, u32>>,
    metrics: Arc<Metrics>,
}

/// A request counted in its client's requests in flight until dropped.
struct InFlight<'a> {
    forwarder: &'a Forwarder,
    identity: &'a str,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut map = self.forwarder.lock();
        if let Some(n) = map.get_mut(self.identity) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                map.remove(self.identity);
            }
        }
    }
}

impl Forwarder {
    /// The forwarder of `settings`: core's ports where they are configured; otherwise, when
    /// this relay names neither, `upstream` (a tier relay's upstream relays) for both.
    pub(crate) fn new(
        settings: &CoreSettings,
        upstream: Option<Arc<dyn CoreBackend>>,
        limits: &Limits,
        metrics: Arc<Metrics>,
    ) -> Result<Forwarder, String> {
        let own =
            |url: &Option<super::CoreUrl>, port| -> Result<_, String> {
                Ok(match url {
                    Some(url) => Some(Arc::new(HttpBackend::new(url.clone(), port, limits)?)
                        as Arc<dyn CoreBackend>),
                    None => None,
                })
            };
        let (command, query) = if settings.has_own_core() {
            (
                own(&settings.http, CorePort::Command)?,
                own(&settings.query, CorePort::Query)?,
            )
        } else {
            (upstream.clone(), upstream)
        };
        let rule = |backend: &Option<Arc<dyn CoreBackend>>, allow: &Option<Vec<String>>| PortRule {
            backend: backend.is_some(),
            allow: allow
                .as_ref()
                .map(|a| a.iter().cloned().collect::<BTreeSet<_>>()),
        };
        Ok(Forwarder {
            rules: Rules {
                command: rule(&command, &settings.http_allow),
                query: rule(&query, &settings.query_allow),
                max_request: settings.max_request,
                concurrency: settings.concurrency,
            },
            timeout: settings.timeout,
            command,
            query,
            in_flight: Mutex::new(HashMap::new()),
            metrics,
        })
    }

    /// Requests one client may have in flight at once.
    pub(crate) fn concurrency(&self) -> u32 {
        self.rules.concurrency
    }

    /// The time a request that names no timeout of its own is given.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, u32>> {
        self.in_flight.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// [`decide`] on `request` and, when it passes, counts it in flight: under one lock, so
    /// concurrent requests of one client cannot all pass the concurrency check.
    fn admit<'a>(
        &'a self,
        request: &CoreRequest,
        identity: &'a str,
    ) -> Result<InFlight<'a>, Refusal> {
        let mut map = self.lock();
        let in_flight = map.get(identity).copied().unwrap_or(0);
        decide(&self.rules, request, identity, in_flight)?;
        *map.entry(identity.to_owned()).or_insert(0) += 1;
        Ok(InFlight {
            forwarder: self,
            identity,
        })
    }

    /// Answers `request` from client `identity`: the relay's refusal, or the answer of the
    /// port's backend within [`budget`] (504 when there is none in time). Counts and logs it.
    pub(crate) async fn serve(&self, request: CoreRequest, identity: &str) -> CoreResponse {
        let port = request.port;
        let target = request.target.clone();
        let held = match self.admit(&request, identity) {
            Ok(held) => held,
            Err(refusal) => {
                let response = refusal.response();
                self.record(identity, port, &target, &response, None);
                return response;
            }
        };
        let backend = match port {
            CorePort::Command => self.command.as_ref(),
            CorePort::Query => self.query.as_ref(),
        };
        // `decide` refuses a port without a backend.
        let Some(backend) = backend else {
            return Refusal::NoCore { port }.response();
        };
        let start = Instant::now();
        let time = budget(self.timeout, request.timeout_ms);
        let deadline = start + time;
        let forwarded = backend.forward(request, identity, deadline);
        let response = match tokio::time::timeout_at(deadline, forwarded).await {
            Ok(response) => response,
            Err(_) => {
                CoreResponse::from_relay(504, &format!("no answer within {} ms", time.as_millis()))
            }
        };
        drop(held);
        self.record(identity, port, &target, &response, Some(start.elapsed()));
        response
    }

    /// Counts and logs a request's end; `took` is the time a forwarded request took.
    fn record(
        &self,
        identity: &str,
        port: CorePort,
        target: &str,
        response: &CoreResponse,
        took: Option<Duration>,
    ) {
        let outcome = Outcome::of(response);
        self.metrics.core.count(port, outcome);
        if let Some(took) = took {
            self.metrics.core.observe(port, took);
        }
        // Only the path: a query string can be a whole transaction.
        let path = target.split_once('?').map_or(target, |(p, _)| p);
        let path = ledger_relay_wire::frame::truncate_utf8(path, 64);
        let status = response.status;
        let ms = took.map(|t| t.as_secs_f64() * 1e3);
        if outcome == Outcome::Answered || response.status == 429 {
            debug!(client = %identity, port = port.name(), path, status, ?ms, "core request");
        } else {
            // An upstream relay's answer is a peer's text: quoted and cut.
            let body = String::from_utf8_lossy(&response.body);
            let reason = ledger_relay_wire::frame::truncate_utf8(&body, 300);
            info!(client = %identity, port = port.name(), path, status, outcome = outcome.name(), ?ms, ?reason, "core request not answered by core");
        }
    }
}
