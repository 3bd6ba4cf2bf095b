//! A subscriber with a valid certificate that reads nothing and
//! floods `Resend` frames for every ledger in the ring. The relay honours resends only for
//! ledgers it sent and the subscriber has not acknowledged, once per chunk while a copy is on
//! its way, and reads its ring for them at a limited rate; so what the attack can make it hold
//! is bounded by its settings. The relay runs as a process of its own and its resident memory
//! is sampled throughout, against a bound computed from those settings.
//!
//! The figures it prints are recorded in `bench/RESULTS.md` ("Resend flood"):
//! `cargo test -p ledger-relay-bin --test tests flood:: -- --nocapture`.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ledger_relay_wire::frame::{Frame, Resend, Start};
use tokio_util::sync::CancellationToken;

use crate::process::{metric, scrape, status_kib, RelayProcess};
use crate::support::{control, raw_connect_to, session_open, tls_client, TestDir};

/// Ledgers the source writes: all of them are in the ring before the attack starts.
const LEDGERS: u32 = 120;
/// Raw size of each ledger, bytes (a chunk that does not shrink goes raw, so no ledger is
/// larger than this on the wire).
const LEDGER_BYTES: u64 = 1 << 20;
/// How long the subscriber floods.
const FLOOD: Duration = Duration::from_secs(8);
/// Allocator slack on every data term, as the bench's memory bound counts it.
const SLACK: f64 = 0.25;
/// Runtime allowance: tasks for the streams in flight, blocking threads for ring reads.
const RUNTIME_MIB: f64 = 16.0;
/// quinn's state per connection (a lane), as the bench's memory bound counts it.
const PER_LANE: u64 = 256 << 10;

/// What one session can make the relay hold, from its settings, in MiB. A resend is honoured
/// only for the `window` ledgers sent and not acknowledged, and only for chunks of which no
/// copy is queued or in flight: so one copy of each unit of the window at most (queued, or on
/// the lane, where quinn's send buffer shares its bytes). Besides: a ring read in progress
/// for each of those ledgers at most, their pages in the ring's cache (twice, as the bench
/// counts sled), quinn's state per lane, with allocator slack and a runtime allowance.
fn bound_mib(lanes: u64, window: u64) -> f64 {
    let mib = |b: u64| b as f64 / f64::from(1 << 20);
    let units = window * LEDGER_BYTES;
    let loading = window * LEDGER_BYTES;
    let ring_cache = 2 * window * LEDGER_BYTES;
    mib(units + loading + ring_cache + lanes * PER_LANE) * (1.0 + SLACK) + RUNTIME_MIB
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "process tier (real relays killed, failed over or flooded): .ci/run runs it"]
async fn a_resend_flood_keeps_the_relays_memory_within_its_bound() {
    let dir = TestDir::new();
    let (relay, port, metrics_addr) = RelayProcess::synthetic_mib(&dir, 2, LEDGERS).await;
    let pid = relay.child.id().expect("running").to_string();
    let last = LEDGERS + 1;
    let deadline = Instant::now() + Duration::from_secs(60);
    let (oldest, newest) = loop {
        let m = scrape(metrics_addr).await;
        let (oldest, newest) = (
            metric(&m, "ledger_relay_ring_oldest"),
            metric(&m, "ledger_relay_ring_newest"),
        );
        if newest == Some(u64::from(last)) {
            break (oldest.unwrap() as u32, last);
        }
        assert!(
            Instant::now() < deadline,
            "the ring holds {newest:?} of {last}\n{}",
            relay.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // The source is done and the ring holds everything: what the relay holds now is its base.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let base_kib = status_kib(&pid, "VmRSS").expect("relay alive");

    let raw = raw_connect_to(
        SocketAddr::from(([127, 0, 0, 1], port)),
        tls_client(dir.certs.path(), "rpc-1"),
    )
    .await;
    let mut io = control(&raw.conn).await;
    io.writer
        .write(&session_open(Start::Seq(oldest), 1))
        .await
        .unwrap();
    match io.reader.next().await {
        Ok(Some(Frame::SessionAccept(_))) => {}
        other => panic!("expected SessionAccept, got {other:?}"),
    }
    let window = u64::from(ledger_relay::config::DEFAULT_WINDOW);
    let bound = bound_mib(1, window);
    // Never accept a data stream, never acknowledge; ask for every ledger of the ring again
    // and again, and sample the relay's memory meanwhile. A relay that grows past twice the
    // bound has failed already: the flood stops there rather than take the machine's memory.
    let broken = CancellationToken::new();
    let sampler = {
        let pid = pid.clone();
        let broken = broken.clone();
        let stop_kib = base_kib + (2.0 * bound * 1024.0) as u64;
        tokio::spawn(async move {
            let mut peak = 0;
            let until = Instant::now() + FLOOD + Duration::from_secs(2);
            while Instant::now() < until {
                match status_kib(&pid, "VmRSS") {
                    Some(kib) => peak = peak.max(kib),
                    None => break,
                }
                if peak > stop_kib {
                    broken.cancel();
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            peak
        })
    };
    let started = Instant::now();
    let mut frames = 0u64;
    let mut seq = oldest;
    while started.elapsed() < FLOOD && !broken.is_cancelled() {
        let resend = Frame::Resend(Resend {
            seq,
            whole: true,
            indices: vec![],
        });
        if io.writer.write(&resend).await.is_err() {
            break;
        }
        frames += 1;
        seq = if seq == newest { oldest } else { seq + 1 };
    }
    let flooded = started.elapsed();
    let peak_kib = sampler.await.unwrap();
    let session_alive = raw.conn.close_reason().is_none();
    let m = scrape(metrics_addr).await;
    let ring_reads = metric(&m, "ledger_relay_ring_reads_total").unwrap_or(0);

    let growth_mib = peak_kib.saturating_sub(base_kib) as f64 / 1024.0;
    println!(
        "\nresend flood: {frames} Resend frames in {:.1} s over ledgers {oldest}..={newest} \
         (1 MiB raw each), one lane, window {window}; ring reads {ring_reads}; relay VmRSS base \
         {:.1} MiB, peak {:.1} MiB, growth {growth_mib:.1} MiB; bound {bound:.1} MiB \
         (({window} units + {window} loading + 2 x {window} ring cache) x 1 MiB + lane state, \
         x{:.2}, + {RUNTIME_MIB} runtime); session alive: {session_alive}",
        flooded.as_secs_f64(),
        base_kib as f64 / 1024.0,
        peak_kib as f64 / 1024.0,
        1.0 + SLACK,
    );
    assert!(
        growth_mib <= bound,
        "the relay grew by {growth_mib:.1} MiB under the flood (bound {bound:.1} MiB)"
    );
    assert!(frames > 10_000, "the flood sent only {frames} frames");
    assert!(
        session_alive,
        "the session goes on (a resend of an unacknowledged ledger is legal)\n{}",
        relay.log()
    );
    drop(raw);
    drop(relay);
}
