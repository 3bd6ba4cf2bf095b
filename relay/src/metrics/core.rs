//! What the metrics show of requests to stellar-core: requests by port and [`Outcome`], the
//! time forwarded requests took (a Prometheus histogram), and the request connections open.
//! Every series is rendered from the start (two ports, five outcomes), so a dashboard finds
//! them on any relay.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ledger_relay_wire::core_http::{CorePort, CoreResponse, Origin};

/// How a request ended, as the metrics count it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// stellar-core answered (any status: its own errors are answers too).
    Answered,
    /// A relay refused it (403, 413, 429): this one, or one upstream.
    Refused,
    /// No answer in time (504).
    TimedOut,
    /// Core, or the upstream relay, could not be reached (503).
    Unavailable,
    /// Core's answer could not be carried, or the forwarding failed otherwise (502, 500).
    Failed,
}

impl Outcome {
    /// Every outcome, in the order the metrics list them.
    pub const ALL: [Outcome; 5] = [
        Outcome::Answered,
        Outcome::Refused,
        Outcome::TimedOut,
        Outcome::Unavailable,
        Outcome::Failed,
    ];

    /// The `outcome` label.
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Answered => "answered",
            Outcome::Refused => "refused",
            Outcome::TimedOut => "timed_out",
            Outcome::Unavailable => "unavailable",
            Outcome::Failed => "failed",
        }
    }

    /// The outcome an answer stands for: core's answers are answered, whatever their status;
    /// a relay's own (this relay's, or an upstream's passed through) by their status.
    pub fn of(response: &CoreResponse) -> Outcome {
        match (response.origin, response.status) {
            (Origin::Core, _) => Outcome::Answered,
            (Origin::Relay, 403 | 413 | 429) => Outcome::Refused,
            (Origin::Relay, 504) => Outcome::TimedOut,
            (Origin::Relay, 503) => Outcome::Unavailable,
            (Origin::Relay, _) => Outcome::Failed,
        }
    }
}

/// Upper bounds of the latency histogram's buckets, seconds: from well under a loopback
/// round trip through core's own work to the longest `--core-timeout` in use.
const BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

const PORTS: [CorePort; 2] = [CorePort::Command, CorePort::Query];

/// One port's latency histogram.
#[derive(Debug, Default)]
struct Latency {
    /// Requests at or under each bound (not cumulative here; summed when rendered).
    buckets: [AtomicU64; BUCKETS.len()],
    sum_us: AtomicU64,
    count: AtomicU64,
}

/// Counters of requests to stellar-core (part of [`crate::metrics::Metrics`]).
#[derive(Debug, Default)]
pub struct CoreMetrics {
    /// Requests by port (command, query) and outcome (in [`Outcome::ALL`] order).
    requests: [[AtomicU64; 5]; 2],
    /// Time of forwarded requests, by port.
    latency: [Latency; 2],
    /// Request connections open.
    pub connections_open: AtomicU64,
}

fn port_index(port: CorePort) -> usize {
    match port {
        CorePort::Command => 0,
        CorePort::Query => 1,
    }
}

fn outcome_index(outcome: Outcome) -> usize {
    Outcome::ALL
        .iter()
        .position(|o| *o == outcome)
        .unwrap_or_default()
}

impl CoreMetrics {
    /// Counts a request that ended with `outcome`.
    pub fn count(&self, port: CorePort, outcome: Outcome) {
        self.requests[port_index(port)][outcome_index(outcome)].fetch_add(1, Ordering::Relaxed);
    }

    /// Requests to `port` that ended with `outcome` so far.
    pub fn requests(&self, port: CorePort, outcome: Outcome) -> u64 {
        self.requests[port_index(port)][outcome_index(outcome)].load(Ordering::Relaxed)
    }

    /// Records the time a forwarded request took, from its decision to its answer.
    pub fn observe(&self, port: CorePort, took: Duration) {
        let l = &self.latency[port_index(port)];
        let secs = took.as_secs_f64();
        if let Some(i) = BUCKETS.iter().position(|b| secs <= *b) {
            l.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        l.sum_us.fetch_add(
            u64::try_from(took.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        l.count.fetch_add(1, Ordering::Relaxed);
    }

    /// The Prometheus text of these series.
    pub fn render(&self, out: &mut String) {
        let _ = writeln!(out, "# HELP ledger_relay_core_requests_total Requests for stellar-core's HTTP ports, by port (http: command, query: query server) and outcome (answered by core, refused by a relay, timed_out, unavailable: core or the upstream relay unreachable, failed: an answer that could not be passed on).");
        let _ = writeln!(out, "# TYPE ledger_relay_core_requests_total counter");
        for port in PORTS {
            for outcome in Outcome::ALL {
                let _ = writeln!(
                    out,
                    "ledger_relay_core_requests_total{{port=\"{}\",outcome=\"{}\"}} {}",
                    port.name(),
                    outcome.name(),
                    self.requests(port, outcome)
                );
            }
        }
        self.render_latency(out);
        let _ = writeln!(out, "# HELP ledger_relay_core_connections_open Request connections open (stand-ins and tier relays sending requests for stellar-core).");
        let _ = writeln!(out, "# TYPE ledger_relay_core_connections_open gauge");
        let open = self.connections_open.load(Ordering::Relaxed);
        let _ = writeln!(out, "ledger_relay_core_connections_open {open}");
    }

    fn render_latency(&self, out: &mut String) {
        let name = "ledger_relay_core_request_duration_seconds";
        let _ = writeln!(out, "# HELP {name} Time from the relay's decision to forward a request for stellar-core to its answer, by port.");
        let _ = writeln!(out, "# TYPE {name} histogram");
        for port in PORTS {
            let l = &self.latency[port_index(port)];
            let port = port.name();
            let mut cumulative = 0;
            for (bound, n) in BUCKETS.iter().zip(&l.buckets) {
                cumulative += n.load(Ordering::Relaxed);
                let _ = writeln!(
                    out,
                    "{name}_bucket{{port=\"{port}\",le=\"{bound}\"}} {cumulative}"
                );
            }
            let count = l.count.load(Ordering::Relaxed);
            let sum = l.sum_us.load(Ordering::Relaxed) as f64 / 1e6;
            let _ = writeln!(out, "{name}_bucket{{port=\"{port}\",le=\"+Inf\"}} {count}");
            let _ = writeln!(out, "{name}_sum{{port=\"{port}\"}} {sum}");
            let _ = writeln!(out, "{name}_count{{port=\"{port}\"}} {count}");
        }
    }
}
