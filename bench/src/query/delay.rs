//! A UDP forwarder that holds every datagram for a fixed time in each direction: the emulated
//! network's round trip where the kernel has no `netem` qdisc (this one has HTB and TBF only,
//! see [`crate::netem`]). `ledger-bench query` puts it in the relay's namespace, in front of the
//! relay's port: everything the RPC side sends the relay, and every answer, waits `delay`
//! there, so a round trip across the link gains twice `delay`.
//!
//! Each client address gets its own upstream socket (as a NAT would), so a client's lanes and
//! its request connection stay separate flows. One thread holds the datagrams of both
//! directions in arrival order and sends each when due (a constant delay keeps that order).
//! What it costs beyond `delay` (thread wake-ups, copies) shows in the round trip QUIC measures
//! across it, which `ledger-bench query` reports. Its threads run until the process ends.

use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::netem::in_ns;

/// Largest datagram forwarded (QUIC's own limit).
const MAX_DATAGRAM: usize = 65_535;

/// One datagram waiting for its time.
struct Held {
    due: Instant,
    data: Vec<u8>,
    socket: Arc<UdpSocket>,
    to: SocketAddr,
}

/// Binds `listen` in namespace `ns` (this host's network when `None`) and forwards datagrams
/// between its clients and `to`, each held `delay`; returns the address bound.
pub fn start(
    ns: Option<&str>,
    listen: SocketAddr,
    to: SocketAddr,
    delay: Duration,
) -> anyhow::Result<SocketAddr> {
    let ns = ns.map(str::to_owned);
    // A socket stays in the namespace it was created in, whichever thread uses it.
    let bind =
        move |addr: SocketAddr| in_ns(ns.as_deref(), move || Ok(Arc::new(UdpSocket::bind(addr)?)));
    let front = bind(listen)?;
    let bound = front.local_addr()?;
    let any = SocketAddr::new(
        if to.is_ipv4() {
            [0u8; 4].into()
        } else {
            [0u16; 8].into()
        },
        0,
    );
    let (line, held) = channel::<Held>();
    std::thread::spawn(move || send_when_due(held));
    std::thread::spawn(move || {
        let mut upstream: HashMap<SocketAddr, Arc<UdpSocket>> = HashMap::new();
        let mut buf = vec![0u8; MAX_DATAGRAM];
        while let Ok((n, from)) = front.recv_from(&mut buf) {
            let socket = match upstream.get(&from) {
                Some(s) => s.clone(),
                None => {
                    let Ok(s) = bind(any) else { continue };
                    let back = (s.clone(), front.clone(), line.clone());
                    std::thread::spawn(move || answers(back.0, back.1, from, back.2, delay));
                    upstream.entry(from).or_insert(s).clone()
                }
            };
            let data = buf[..n].to_vec();
            let due = Instant::now() + delay;
            if line
                .send(Held {
                    due,
                    data,
                    socket,
                    to,
                })
                .is_err()
            {
                return;
            }
        }
    });
    Ok(bound)
}

/// What `to` answers on `up`, held and sent back to `client` through `front`.
fn answers(
    up: Arc<UdpSocket>,
    front: Arc<UdpSocket>,
    client: SocketAddr,
    line: Sender<Held>,
    delay: Duration,
) {
    let mut buf = vec![0u8; MAX_DATAGRAM];
    while let Ok((n, _)) = up.recv_from(&mut buf) {
        let (data, socket) = (buf[..n].to_vec(), front.clone());
        let due = Instant::now() + delay;
        if line
            .send(Held {
                due,
                data,
                socket,
                to: client,
            })
            .is_err()
        {
            return;
        }
    }
}

fn send_when_due(held: Receiver<Held>) {
    // Sleeps may end up to the timer slack late (50 µs by default): 1 µs keeps the added delay
    // what was asked.
    if let Err(e) = nix::sys::prctl::set_timerslack(1_000) {
        eprintln!("udp delay: cannot lower the timer slack ({e}); delays may run 50 µs long");
    }
    while let Ok(h) = held.recv() {
        std::thread::sleep(h.due.saturating_duration_since(Instant::now()));
        // A datagram the kernel refuses is lost, as on a real link.
        let _ = h.socket.send_to(&h.data, h.to);
    }
}
