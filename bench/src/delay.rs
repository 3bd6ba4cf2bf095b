//! A UDP forwarder that holds every datagram for a fixed time in each direction: the emulated
//! network's round trip where the kernel has no `netem` qdisc (this one has HTB and TBF only,
//! see [`crate::netem`]). `ledger-bench query` runs it inside the relay's namespace, in front
//! of the relay's port: everything the RPC side sends the relay, and every answer, waits
//! `delay` there, so a round trip across the link gains twice `delay`.
//!
//! Each client address gets its own upstream socket (as a NAT would), so a client's lanes and
//! its request connection stay separate flows. One thread holds the datagrams of both
//! directions in arrival order and sends each when due (a constant delay keeps that order).
//! What it costs beyond `delay` (thread wake-ups, copies) shows in the round trip QUIC measures
//! across it, which `ledger-bench query` reports.

use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;

/// Largest datagram forwarded (QUIC's own limit).
const MAX_DATAGRAM: usize = 65_535;

/// `ledger-bench udp-delay` arguments (a hidden helper).
#[derive(Debug, Clone, clap::Args)]
pub struct DelayArgs {
    /// Address to listen on.
    #[arg(long)]
    pub listen: SocketAddr,
    /// Address to forward to.
    #[arg(long)]
    pub to: SocketAddr,
    /// How long each datagram is held.
    #[arg(long, value_parser = crate::query::duration)]
    pub delay: Duration,
}

/// One datagram waiting for its time.
struct Held {
    due: Instant,
    data: Vec<u8>,
    socket: Arc<UdpSocket>,
    to: SocketAddr,
}

/// Forwards datagrams between clients of `listen` and `to`, each held `delay`; runs until the
/// process is stopped.
pub fn run(listen: SocketAddr, to: SocketAddr, delay: Duration) -> anyhow::Result<()> {
    // Sleeps may end up to the timer slack late (50 µs by default): 1 µs here, inherited by
    // the threads started below, keeps the added delay what was asked.
    if let Err(e) = nix::sys::prctl::set_timerslack(1_000) {
        eprintln!("udp-delay: cannot lower the timer slack ({e}); delays may run 50 µs long");
    }
    let front = Arc::new(UdpSocket::bind(listen).with_context(|| format!("binding {listen}"))?);
    let (line, held) = channel::<Held>();
    std::thread::spawn(move || send_when_due(held));
    let mut upstream: HashMap<SocketAddr, Arc<UdpSocket>> = HashMap::new();
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        let (n, from) = front.recv_from(&mut buf).context("receiving")?;
        let up = match upstream.get(&from) {
            Some(s) => s.clone(),
            None => {
                let s = open_upstream(to, front.clone(), from, line.clone(), delay)?;
                upstream.insert(from, s.clone());
                s
            }
        };
        let held = Held {
            due: Instant::now() + delay,
            data: buf[..n].to_vec(),
            socket: up,
            to,
        };
        if line.send(held).is_err() {
            anyhow::bail!("the delay line stopped");
        }
    }
}

/// A socket towards `to` for client `client`, whose answers go back through `front`, held.
fn open_upstream(
    to: SocketAddr,
    front: Arc<UdpSocket>,
    client: SocketAddr,
    line: Sender<Held>,
    delay: Duration,
) -> anyhow::Result<Arc<UdpSocket>> {
    let any: SocketAddr = if to.is_ipv4() {
        "0.0.0.0:0".parse()?
    } else {
        "[::]:0".parse()?
    };
    let up = Arc::new(UdpSocket::bind(any).context("binding an upstream socket")?);
    let recv = up.clone();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; MAX_DATAGRAM];
        while let Ok((n, _)) = recv.recv_from(&mut buf) {
            let held = Held {
                due: Instant::now() + delay,
                data: buf[..n].to_vec(),
                socket: front.clone(),
                to: client,
            };
            if line.send(held).is_err() {
                return;
            }
        }
    });
    Ok(up)
}

fn send_when_due(held: Receiver<Held>) {
    while let Ok(h) = held.recv() {
        if let Some(wait) = h.due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        // A datagram the kernel refuses is lost, as on a real link.
        let _ = h.socket.send_to(&h.data, h.to);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datagrams_come_back_after_twice_the_delay() {
        let echo = UdpSocket::bind("127.0.0.1:0").unwrap();
        let echo_addr = echo.local_addr().unwrap();
        std::thread::spawn(move || {
            let mut b = [0u8; 64];
            while let Ok((n, from)) = echo.recv_from(&mut b) {
                let _ = echo.send_to(&b[..n], from);
            }
        });
        let listen = UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        std::thread::spawn(move || run(listen, echo_addr, Duration::from_millis(20)));
        std::thread::sleep(Duration::from_millis(50));
        let client = UdpSocket::bind("127.0.0.1:0").unwrap();
        client
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        let t = Instant::now();
        client.send_to(b"ping", listen).unwrap();
        let mut b = [0u8; 16];
        let (n, from) = client.recv_from(&mut b).unwrap();
        assert_eq!((&b[..n], from), (&b"ping"[..], listen));
        let rtt = t.elapsed();
        assert!(rtt >= Duration::from_millis(40), "{rtt:?}");
        assert!(rtt < Duration::from_millis(500), "{rtt:?}");
    }
}
