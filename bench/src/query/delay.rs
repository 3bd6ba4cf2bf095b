//! A UDP forwarder that holds every datagram `delay` in each direction: the emulated network's
//! round trip where the kernel has no `netem` qdisc (only HTB and TBF, see [`crate::netem`]).
//! Each client address gets its own upstream socket (as a NAT would), so its flows stay apart;
//! one thread sends every held datagram when due. Its threads run until the process ends.

use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::netem::in_ns;

/// Largest datagram forwarded (QUIC's own limit).
const MAX_DATAGRAM: usize = 65_535;

/// One datagram waiting for its time: when it is due, its bytes, the socket it leaves by and
/// where to.
struct Held(Instant, Vec<u8>, Arc<UdpSocket>, SocketAddr);

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
    let any: SocketAddr = if to.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }.parse()?;
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
            if !hold(&line, &buf[..n], socket, to, delay) {
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
        if !hold(&line, &buf[..n], front.clone(), client, delay) {
            return;
        }
    }
}

/// Queues `data` for `to` through `socket`, due in `delay`; false once the sender has ended.
fn hold(
    line: &Sender<Held>,
    data: &[u8],
    socket: Arc<UdpSocket>,
    to: SocketAddr,
    delay: Duration,
) -> bool {
    let held = Held(Instant::now() + delay, data.to_vec(), socket, to);
    line.send(held).is_ok()
}

fn send_when_due(held: Receiver<Held>) {
    // Sleeps may end up to the timer slack (50 µs) late: 1 µs keeps the delay what was asked.
    if let Err(e) = nix::sys::prctl::set_timerslack(1_000) {
        eprintln!("udp delay: cannot lower the timer slack ({e}); delays may run 50 µs long");
    }
    while let Ok(h) = held.recv() {
        std::thread::sleep(h.0.saturating_duration_since(Instant::now()));
        // A datagram the kernel refuses is lost, as on a real link.
        let _ = h.2.send_to(&h.1, h.3);
    }
}
