//! Per-lane figures of a row's subscribers, from their `ledger-subscribe --lane-stats` files:
//! each lane's bytes and packets received, round trip, congestion window, path MTU and losses,
//! as the file's last rows give them (counters cumulative over the run).

use std::path::Path;

use anyhow::{bail, Context};

use crate::report::Col;
use crate::scenario::Row;

/// One lane at the end of a run.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct LaneFig {
    /// Lane number.
    pub lane: u8,
    /// UDP payload bytes received on the lane.
    pub rx_bytes: u64,
    /// UDP datagrams received.
    pub rx_packets: u64,
    /// Packets the subscriber sent on the lane that were declared lost (acknowledgement path).
    pub lost_packets: u64,
    /// Smoothed round trip, ms.
    pub rtt_ms: f64,
    /// Congestion window of the subscriber's sending side, bytes.
    pub cwnd_bytes: u64,
    /// Path MTU, bytes.
    pub mtu_bytes: u64,
    /// QUIC connections the lane had (1 plus rejoins).
    pub connections: u64,
}

/// The last row of each lane in a `--lane-stats` file, by lane number.
pub fn parse_lane_file(text: &str) -> anyhow::Result<Vec<LaneFig>> {
    let mut lines = text.lines();
    let header: Vec<&str> = lines
        .next()
        .context("empty lane file")?
        .split(',')
        .collect();
    let col = |name: &str| {
        header
            .iter()
            .position(|h| *h == name)
            .with_context(|| format!("no {name} column"))
    };
    let cols = [
        col("lane")?,
        col("rx_bytes")?,
        col("rx_packets")?,
        col("lost_packets")?,
        col("rtt_ms")?,
        col("cwnd_bytes")?,
        col("mtu_bytes")?,
        col("connections")?,
    ];
    let mut out: Vec<LaneFig> = Vec::new();
    for (i, line) in lines.enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let f: Vec<&str> = line.split(',').collect();
        if f.len() != header.len() {
            bail!(
                "line {}: {} fields, the header has {}",
                i + 2,
                f.len(),
                header.len()
            );
        }
        let n = |k: usize| -> anyhow::Result<f64> {
            f[cols[k]]
                .parse::<f64>()
                .with_context(|| format!("line {}: {}", i + 2, header[cols[k]]))
        };
        let fig = LaneFig {
            lane: n(0)? as u8,
            rx_bytes: n(1)? as u64,
            rx_packets: n(2)? as u64,
            lost_packets: n(3)? as u64,
            rtt_ms: n(4)?,
            cwnd_bytes: n(5)? as u64,
            mtu_bytes: n(6)? as u64,
            connections: n(7)? as u64,
        };
        match out.iter_mut().find(|l| l.lane == fig.lane) {
            Some(l) => *l = fig,
            None => out.push(fig),
        }
    }
    out.sort_by_key(|l| l.lane);
    Ok(out)
}

/// Reads a `--lane-stats` file.
pub fn read_lane_file(path: &Path) -> anyhow::Result<Vec<LaneFig>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    parse_lane_file(&text).with_context(|| format!("parsing {}", path.display()))
}

/// Each lane's share of the bytes received, %.
pub fn shares(lanes: &[LaneFig]) -> Vec<f64> {
    let total: u64 = lanes.iter().map(|l| l.rx_bytes).sum();
    lanes
        .iter()
        .map(|l| l.rx_bytes as f64 * 100.0 / total.max(1) as f64)
        .collect()
}

/// The per-lane table: one line per lane of each row's first subscriber.
pub fn table(rows: &[Row]) -> String {
    let lanes: Vec<(&Row, &LaneFig, f64)> = rows
        .iter()
        .flat_map(|r| {
            let shares = shares(&r.per_lane);
            r.per_lane.iter().zip(shares).map(move |(l, sh)| (r, l, sh))
        })
        .collect();
    if lanes.is_empty() {
        return String::new();
    }
    let cols: [Col<(&Row, &LaneFig, f64)>; 11] = [
        Col::l("per lane (sub 0)", 22, |x| x.0.scenario.name.clone()),
        Col::r("net", 6, |x| x.0.scenario.network().into()),
        Col::r("lane", 4, |x| x.1.lane.to_string()),
        Col::r("rx MB", 10, |x| format!("{:.2}", x.1.rx_bytes as f64 / 1e6)),
        Col::r("share", 6, |x| format!("{:.1}", x.2)),
        Col::r("rx pkts", 9, |x| x.1.rx_packets.to_string()),
        Col::r("rtt ms", 8, |x| format!("{:.3}", x.1.rtt_ms)),
        Col::r("cwnd KiB", 9, |x| {
            format!("{:.1}", x.1.cwnd_bytes as f64 / 1024.0)
        }),
        Col::r("mtu", 5, |x| x.1.mtu_bytes.to_string()),
        Col::r("lost*", 6, |x| x.1.lost_packets.to_string()),
        Col::r("conns", 5, |x| x.1.connections.to_string()),
    ];
    crate::report::table_of(&cols, &lanes, (0, ""), |_| None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_row_of_each_lane_counts() {
        let text = "unix_ms,relay,lane,up,connections,rx_bytes,rx_packets,tx_bytes,tx_packets,\
lost_packets,congestion_events,black_holes,rtt_ms,min_rtt_ms,cwnd_bytes,mtu_bytes\n\
1.0,127.0.0.1:7000,1,1,1,100,2,0,0,0,0,0,0.500,0.400,12000,1452\n\
1.0,127.0.0.1:7000,0,1,1,300,5,0,0,0,0,0,0.600,0.400,12000,1452\n\
2.0,127.0.0.1:7000,1,1,2,900,9,0,0,3,0,0,0.700,0.400,14000,1452\n";
        let lanes = parse_lane_file(text).unwrap();
        assert_eq!(lanes.len(), 2);
        assert_eq!(lanes[0].lane, 0);
        assert_eq!(lanes[0].rx_bytes, 300);
        assert_eq!(
            lanes[1],
            LaneFig {
                lane: 1,
                rx_bytes: 900,
                rx_packets: 9,
                lost_packets: 3,
                rtt_ms: 0.7,
                cwnd_bytes: 14000,
                mtu_bytes: 1452,
                connections: 2,
            }
        );
        assert_eq!(shares(&lanes), vec![25.0, 75.0]);
        assert!(parse_lane_file("lane,rx_bytes\n0,1\n").is_err());
        assert!(parse_lane_file(&format!("{text}1,2\n")).is_err());
    }
}
