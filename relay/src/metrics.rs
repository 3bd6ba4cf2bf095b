//! Prometheus text metrics and `/healthz`, served over plain HTTP on `--metrics ADDR`.
//!
//! Counters are atomics updated on the hot paths; the exposition is rendered on request, and
//! `/healthz` from [`crate::health`] (clocks and a short list of conditions: no ring read, no
//! lock across IO). Both are served on a thread of their own ([`spawn`]), so a busy relay
//! still answers probes at once. The HTTP side is deliberately minimal (GET only, one
//! response per connection): it serves a scraper on a management network, not browsers.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub mod core;
pub mod lake;

use crate::exposition::family;
use crate::health::Health;

macro_rules! counters {
    ($($name:ident: $help:literal),* $(,)?) => {
        /// Every counter and gauge of the relay.
        #[derive(Debug, Default)]
        pub struct Metrics {
            $(#[doc = $help] pub $name: AtomicU64,)*
            /// The ring failed to write and is not keeping ledgers (disk read-only or full).
            pub ring_degraded: AtomicBool,
            /// Data lakes: export, backfill and a `datalake:` source.
            pub lake: lake::LakeMetrics,
            /// Requests for stellar-core's HTTP ports.
            pub core: core::CoreMetrics,
            /// Per-session state, by session id.
            pub sessions: Mutex<BTreeMap<u64, SessionInfo>>,
            /// Per lane number, over every session: what the lanes carried and their paths.
            pub lanes: Mutex<BTreeMap<u8, LaneMetrics>>,
            /// Ledger ages and the reasons `/healthz` lists.
            pub health: Health,
        }

        impl Metrics {
            fn render_counters(&self, out: &mut String) {
                $(
                    family(out, stringify!($name), $help);
                    let _ = writeln!(out, "ledger_relay_{} {}", stringify!($name), self.$name.load(Ordering::Relaxed));
                )*
            }
        }
    };
}

counters! {
    ledgers_in_total: "Ledgers read from the source and published.",
    bytes_in_total: "Raw ledger bytes read from the source.",
    chunks_total: "Chunks cut.",
    wire_bytes_total: "Payload bytes of published chunks (after compression).",
    raw_fallback_total: "Chunks sent raw because they did not shrink.",
    pool_saturated_total: "Chunks sent raw because the compression pool was saturated.",
    duplicates_dropped_total: "Ledgers the source emitted again with the same hash, dropped.",
    source_restarts_total: "Times the source process was restarted.",
    source_aborts_total: "Ledgers cut off by their source mid-record and discarded.",
    source_errors_total: "Source errors that stopped the source (garbage, gap, conflicting hash).",
    source_newest: "Newest ledger sequence read from the source.",
    upstream_newest: "relay: source: the newest ledger the upstream relay announced (0: no relay: source, or not heard from yet).",
    upstream_lag_ledgers: "relay: source: ledgers the upstream relay holds that this relay has not read yet.",
    upstream_connected: "relay: source: 1 while a session with an upstream relay is up, else 0.",
    upstream_sessions_total: "relay: source: sessions opened with upstream relays (the first, then one per reconnect or failover).",
    upstream_cut_through_bytes_total: "relay: source with --cut-through: bytes passed on before their ledger was complete and verified.",
    upstream_taken_back_total: "relay: source with --cut-through: ledgers passed on in part and then taken back (verification failed, or the upstream session ended first).",
    upstream_set_aside_total: "relay: source: times an upstream was set aside (left out of the subscription for a while) because bytes it sent failed a check.",
    ring_oldest: "Oldest ledger in the retention ring.",
    ring_newest: "Newest ledger in the retention ring.",
    ring_ledgers: "Ledgers in the retention ring.",
    ring_bytes: "Live bytes in the retention ring.",
    ring_disk_bytes: "Bytes the retention ring occupies on disk.",
    ring_write_errors_total: "Failed ring writes.",
    ring_resets_total: "Times the ring was emptied because the source went back or changed chain.",
    ring_gaps_total: "Times the ring started a new run after a gap, keeping the older runs.",
    ring_runs: "Runs in the retention ring: 1 while it is consecutive, one more per gap it holds.",
    ring_corrupt_total: "Stored ledgers that failed verification and were not served.",
    ring_repaired_total: "Damaged stored ledgers written again (emitted again by the source, or from the backfill lake).",
    ring_scrubbed_total: "Stored ledgers the ring's scrub read back and verified (--scrub-rate).",
    ring_scrub_passes_total: "Passes of the ring's scrub over every stored ledger completed.",
    ring_queue_ledgers: "Complete ledgers waiting for the ring writer (in memory, served from there meanwhile).",
    ring_queue_bytes: "Payload bytes of the ledgers waiting for the ring writer.",
    ring_given_up_total: "Ledgers given up for the ring because its queue was full (the ring then starts a new run after the gap, keeping the older ones).",
    sessions_open: "Open sessions.",
    lanes_open: "Open lanes over all sessions.",
    connections_open: "Open QUIC connections whose handshake completed with a verified client certificate (what the connection caps count).",
    sessions_total: "Sessions opened.",
    sessions_refused_total: "Sessions or lanes refused (authorization, limits, protocol).",
    ledgers_out_total: "Ledgers sent to subscribers (counted per subscriber).",
    chunks_out_total: "Chunk streams sent to subscribers.",
    bytes_out_total: "Payload bytes sent to subscribers.",
    resent_chunks_total: "Chunks sent again (resend requests and lane loss).",
    ring_reads_total: "Ledgers read from the ring for replays and slow subscribers.",
    lagged_total: "Times a session fell behind the live stream and switched to ring reading.",
    revoked_sessions_total: "Sessions and request connections closed because their certificate was revoked.",
    crl_reloads_total: "Times the CRL was reloaded.",
    crl_errors_total: "CRL reloads that failed (the previous CRL stays in force).",
    certificate_reloads_total: "Times a new certificate and key of this relay were put in force for new handshakes.",
    certificate_errors_total: "Changed certificate or key files of this relay that could not be used (the pair in force stays).",
    protocol_errors_total: "Connections closed for protocol violations.",
    handshakes_failed_total: "QUIC/TLS handshakes that failed (no client certificate, another CA, expired, revoked at the handshake, or a broken handshake).",
    handshakes_timed_out_total: "QUIC/TLS handshakes not finished within the handshake timeout (--handshake-timeout), dropped from the pending pool.",
    handshakes_pending: "Handshakes in the pending pool: begun, no verified client certificate yet (--handshake-pool).",
    handshakes_unvalidated: "Of the pending handshakes, those from addresses not validated yet (no Retry token).",
    handshakes_refused_total: "Connection attempts refused because the pending pool had no place for them (their source held its share, or the pool was full and no source held more).",
    handshakes_evicted_total: "Pending handshakes ended to make room for an attempt from a source holding fewer (the pool's fairness).",
    retries_total: "Connection attempts answered with a QUIC Retry (address validation under load).",
    certificate_not_after_timestamp_seconds: "Unix time at which the certificate this relay serves expires (0: unreadable).",
    crl_next_update_timestamp_seconds: "Unix time of the next update DIR/crl.pem promises, as last read (0: no CRL, or none stated).",
    sizing_live_capacity_items: "Sizing (set at start): items (chunks and end records) the live broadcast channel holds; a session further behind reads the ring.",
    sizing_recent_ledgers: "Sizing (set at start): complete ledgers the hub keeps in memory for sessions joining or resending.",
    sizing_window_ledgers: "Sizing (set at start): ledgers a session may hold unacknowledged (--window).",
    sizing_compress_queue_chunks: "Sizing (set at start): chunks queued for the compression pool at most.",
    sizing_ring_cache_bytes: "Sizing (set at start): the ring's sled page cache capacity.",
    sizing_ring_segment_bytes: "Sizing (set at start): the ring's sled segment size (sled keeps a few IO buffers of this size).",
    sizing_source_ahead_ledgers: "Sizing (set at start): synthetic source: ledgers generated ahead of the one being emitted (0 for other sources).",
    sizing_source_pool_ledgers: "Sizing (set at start): synthetic source: distinct filler bodies kept (0 for other sources).",
    sizing_source_upfront_bytes: "Sizing (set at start): synthetic source: a run whose ledgers fit in this many bytes is built up front (0 for other sources).",
}

/// What the metrics show of one lane number, over every session: counters add up what every
/// session's lane of that number did; the path gauges are the latest any of them reported.
/// Labelled by lane number only, so the series stay bounded (at most `--max-lanes`) whatever
/// the number of sessions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LaneMetrics {
    /// UDP payload bytes sent.
    pub bytes_sent: u64,
    /// UDP datagrams sent.
    pub packets_sent: u64,
    /// Packets declared lost.
    pub lost_packets: u64,
    /// Stream bytes the subscriber acknowledged (the sender's accounting).
    pub delivered_bytes: u64,
    /// Time the lane had bytes outstanding, microseconds.
    pub busy_us: u64,
    /// Latest smoothed round trip, microseconds.
    pub rtt_us: u64,
    /// Latest congestion window, bytes.
    pub cwnd_bytes: u64,
    /// Latest path MTU, bytes.
    pub mtu_bytes: u64,
}

/// What the metrics show of one session.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionInfo {
    /// Client identity from its certificate.
    pub identity: String,
    /// Lanes up.
    pub lanes: u32,
    /// Newest ledger acknowledged by the subscriber.
    pub acked: u32,
    /// Reading from the ring (behind the live stream) rather than live.
    pub catching_up: bool,
}

impl Metrics {
    /// A shared, zeroed metrics set, with the default health limit.
    pub fn new() -> Arc<Metrics> {
        Arc::new(Metrics::default())
    }

    /// A shared, zeroed metrics set whose health counts from now with `health`'s limit.
    pub fn with_health(health: Health) -> Arc<Metrics> {
        Arc::new(Metrics {
            health,
            ..Metrics::default()
        })
    }

    /// Adds to a counter.
    pub fn add(counter: &AtomicU64, n: u64) {
        // Sessions add their counters on every turn of their loop, mostly nothing: no write
        // to a line every session shares.
        if n != 0 {
            counter.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Sets a gauge.
    pub fn set(gauge: &AtomicU64, v: u64) {
        gauge.store(v, Ordering::Relaxed);
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        self.render_counters(&mut out);
        self.health.report().render_prometheus(&mut out);
        let degraded = u8::from(self.ring_degraded.load(Ordering::Relaxed));
        let _ = writeln!(out, "# HELP ledger_relay_ring_degraded 1 when the ring cannot write (disk read-only or full).");
        let _ = writeln!(out, "# TYPE ledger_relay_ring_degraded gauge");
        let _ = writeln!(out, "ledger_relay_ring_degraded {degraded}");
        let newest = self.source_newest.load(Ordering::Relaxed);
        self.lake.render(&mut out, newest);
        self.core.render(&mut out);
        let sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        let _ = writeln!(out, "# HELP ledger_relay_subscriber_lag_ledgers Ledgers between the source's newest and the subscriber's last acknowledged.");
        let _ = writeln!(out, "# TYPE ledger_relay_subscriber_lag_ledgers gauge");
        for (id, s) in sessions.iter() {
            let lag = newest.saturating_sub(u64::from(s.acked));
            let _ = writeln!(
                out,
                "ledger_relay_subscriber_lag_ledgers{{session=\"{id}\",identity=\"{}\"}} {lag}",
                escape(&s.identity)
            );
        }
        drop(sessions);
        self.render_lanes(&mut out);
        let sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        let _ = writeln!(
            out,
            "# HELP ledger_relay_subscriber_lanes Lanes up per session."
        );
        let _ = writeln!(out, "# TYPE ledger_relay_subscriber_lanes gauge");
        for (id, s) in sessions.iter() {
            let _ = writeln!(
                out,
                "ledger_relay_subscriber_lanes{{session=\"{id}\",identity=\"{}\",catching_up=\"{}\"}} {}",
                escape(&s.identity),
                s.catching_up,
                s.lanes
            );
        }
        out
    }

    fn render_lanes(&self, out: &mut String) {
        let lanes = self.lanes.lock().unwrap_or_else(|e| e.into_inner());
        type Field = fn(&LaneMetrics) -> f64;
        let series: [(&str, &str, Field); 8] = [
            ("lane_bytes_sent_total", "UDP payload bytes sent, by lane number over all sessions.", |l| l.bytes_sent as f64),
            ("lane_packets_sent_total", "UDP datagrams sent, by lane number over all sessions.", |l| l.packets_sent as f64),
            ("lane_lost_packets_total", "Packets declared lost, by lane number over all sessions.", |l| l.lost_packets as f64),
            ("lane_delivered_bytes_total", "Stream bytes acknowledged by subscribers, by lane number.", |l| l.delivered_bytes as f64),
            ("lane_busy_seconds_total", "Time lanes had bytes outstanding, by lane number (busy fraction: its rate over wall time).", |l| l.busy_us as f64 / 1e6),
            ("lane_rtt_seconds", "Latest smoothed round trip reported on a lane of this number.", |l| l.rtt_us as f64 / 1e6),
            ("lane_cwnd_bytes", "Latest congestion window on a lane of this number.", |l| l.cwnd_bytes as f64),
            ("lane_mtu_bytes", "Latest path MTU on a lane of this number.", |l| l.mtu_bytes as f64),
        ];
        for (name, help, field) in series {
            family(out, name, help);
            for (lane, l) in lanes.iter() {
                let _ = writeln!(out, "ledger_relay_{name}{{lane=\"{lane}\"}} {}", field(l));
            }
        }
    }

    /// The `/healthz` answer: status code and body (see [`crate::health::HealthReport::render_json`]).
    pub fn health(&self) -> (u16, String) {
        let degraded = self.ring_degraded.load(Ordering::Relaxed);
        let n = |c: &AtomicU64| serde_json::Value::from(c.load(Ordering::Relaxed));
        let mut details = serde_json::Map::new();
        details.insert(
            "ring".into(),
            (if degraded { "degraded" } else { "ok" }).into(),
        );
        details.insert("lake_export".into(), self.lake.export_health().into());
        details.insert("source_newest".into(), n(&self.source_newest));
        details.insert("ledgers_in".into(), n(&self.ledgers_in_total));
        details.insert("source_restarts".into(), n(&self.source_restarts_total));
        details.insert("ring_oldest".into(), n(&self.ring_oldest));
        details.insert("ring_newest".into(), n(&self.ring_newest));
        details.insert("ring_corrupt".into(), n(&self.ring_corrupt_total));
        details.insert("ring_queue".into(), n(&self.ring_queue_ledgers));
        details.insert("sessions".into(), n(&self.sessions_open));
        self.health.report().render_json(details)
    }
}

/// A label value: the identity a client's certificate names, which its holder chose, escaped
/// as peer text (no line break or terminal control reaches whoever reads the scrape), then as
/// Prometheus quotes it.
fn escape(s: &str) -> String {
    ledger_relay_wire::text::escape(s)
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
}

/// Serves `/metrics` and `/healthz` until `shutdown`.
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    loop {
        let (mut sock, _) = tokio::select! {
            r = listener.accept() => match r {
                Ok(conn) => conn,
                Err(e) => {
                    // Out of file descriptors or a connection reset while queued: a scraper
                    // problem, not a reason to stop serving metrics.
                    tracing::warn!(error = %e, "metrics accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = shutdown.cancelled() => return Ok(()),
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            // Read up to the end of the request head: a request may arrive in several
            // segments, and answering after the first one would reset the connection.
            let mut buf = [0u8; 2048];
            let mut n = 0;
            let read_head = async {
                while n < buf.len() && !buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                    match sock.read(&mut buf[n..]).await {
                        Ok(0) | Err(_) => break,
                        Ok(k) => n += k,
                    }
                }
            };
            if tokio::time::timeout(std::time::Duration::from_secs(5), read_head)
                .await
                .is_err()
            {
                return;
            }
            let req = String::from_utf8_lossy(&buf[..n]);
            let path = req.split_whitespace().nth(1).unwrap_or("/");
            let (code, ctype, body) = match path {
                "/metrics" => (200, "text/plain; version=0.0.4", metrics.render()),
                "/healthz" => {
                    let (code, body) = metrics.health();
                    (code, "application/json", body)
                }
                _ => (404, "text/plain", "not found\n".to_string()),
            };
            let head = format!(
                "HTTP/1.1 {code} {}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                match code {
                    200 => "OK",
                    503 => "Service Unavailable",
                    _ => "Not Found",
                },
                body.len()
            );
            let _ = sock.write_all(head.as_bytes()).await;
            let _ = sock.write_all(body.as_bytes()).await;
        });
    }
}

/// Binds `addr` and serves `/metrics` and `/healthz` on a thread of their own (with a
/// single-threaded runtime) until `shutdown`; returns the bound address.
///
/// Not on the relay's runtime: its workers carry every session's QUIC work, and a probe must
/// get its answer within milliseconds while they are busy (on the shared runtime, the loaded
/// relay of the `/healthz` load test missed its 10 ms bound).
pub fn spawn(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) -> std::io::Result<SocketAddr> {
    let listener = std::net::TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    let bound = listener.local_addr()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            runtime.block_on(async move {
                match TcpListener::from_std(listener) {
                    Ok(listener) => {
                        let _ = serve(listener, metrics, shutdown).await;
                    }
                    Err(e) => tracing::error!(error = %e, "metrics: cannot serve"),
                }
            });
        })?;
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::ReasonKind;

    #[test]
    fn a_label_holds_no_line_break_or_terminal_control() {
        assert_eq!(escape("rpc-1"), "rpc-1");
        assert_eq!(escape("a\"b\\c"), "a\\\"b\\\\c");
        let v = escape("x\n\x1b[2Jy");
        assert!(!v.chars().any(char::is_control), "{v}");
        assert_eq!(v, "x\\\\n\\\\u{1b}[2Jy");
    }

    #[test]
    fn renders_counters_and_sessions() {
        let m = Metrics::new();
        Metrics::add(&m.ledgers_in_total, 3);
        Metrics::set(&m.source_newest, 10);
        m.sessions.lock().unwrap().insert(
            7,
            SessionInfo {
                identity: "rpc-\"1".into(),
                lanes: 4,
                acked: 8,
                catching_up: false,
            },
        );
        let text = m.render();
        assert!(text.contains("ledger_relay_ledgers_in_total 3\n"));
        assert!(text.contains("# TYPE ledger_relay_ledgers_in_total counter"));
        assert!(text.contains("# TYPE ledger_relay_sessions_open gauge"));
        assert!(text.contains(
            "ledger_relay_subscriber_lag_ledgers{session=\"7\",identity=\"rpc-\\\"1\"} 2"
        ));
        m.ring_degraded.store(true, Ordering::Relaxed);
        let (code, body) = m.health();
        assert_eq!(code, 503, "no ledger yet: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["ring"], "degraded");
        assert_eq!(v["source_newest"], 10);
        assert_eq!(v["ledgers_in"], 3);
        assert!(text.contains("ledger_relay_source_last_ledger_age_seconds "));
        assert!(text.contains("ledger_relay_health_reason{reason=\"no_ledger\"} 1\n"));
    }

    #[test]
    fn a_failing_export_lake_shows_in_health_and_metrics() {
        let m = Metrics::new();
        let health =
            |m: &Metrics| -> serde_json::Value { serde_json::from_str(&m.health().1).unwrap() };
        assert_eq!(health(&m)["lake_export"], "off");
        m.lake.export_enabled.store(true, Ordering::Relaxed);
        assert_eq!(health(&m)["lake_export"], "ok");
        crate::lake::export::set_degraded(&m, Some("put: connection refused".into()));
        let v = health(&m);
        assert_eq!(v["lake_export"], "degraded");
        assert!(
            v["reasons"]
                .as_array()
                .unwrap()
                .contains(&"lake export failing: put: connection refused".into()),
            "{v}"
        );
        assert!(v["reason_codes"]
            .as_array()
            .unwrap()
            .contains(&"lake_export".into()));
        assert!(m
            .render()
            .contains("ledger_relay_health_reason{reason=\"lake_export\"} 1\n"));
        // A lake that fails alone does not stop delivery: no 503 for it.
        assert!(!ReasonKind::LakeExport.stops_delivery());
        crate::lake::export::set_degraded(&m, None);
        assert!(!health(&m)["reason_codes"]
            .as_array()
            .unwrap()
            .contains(&"lake_export".into()));
        crate::lake::export::set_degraded(&m, Some("again".into()));
        m.lake
            .export
            .count(&ledger_relay_lake::LakeError::Unreachable {
                key: ".config.json".into(),
                reason: "connection refused".into(),
            });
        Metrics::set(&m.source_newest, 100);
        Metrics::set(&m.lake.export_newest, 90);
        let text = m.render();
        assert!(text.contains("ledger_relay_lake_export_degraded 1\n"));
        assert!(text.contains("ledger_relay_lake_export_lag_ledgers 10\n"));
        assert!(text
            .contains("ledger_relay_lake_errors_total{lake=\"export\",kind=\"unreachable\"} 1\n"));
        assert!(text.contains(
            "ledger_relay_lake_errors_total{lake=\"backfill\",kind=\"unreachable\"} 0\n"
        ));
    }
}
