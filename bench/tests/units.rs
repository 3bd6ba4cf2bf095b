//! Unit tests of the bench's pieces, through its public API: records and summaries, tables,
//! rows, the pipe, `/proc`, metrics, the CPU bench's parsing, and the yardstick's messages and
//! addresses.

mod stats {
    use ledger_relay_bench::stats::*;

    #[test]
    fn parses_and_summarizes() {
        let text = "seq,raw_bytes,wire_bytes,delivery_ms,inter_arrival_ms,received_unix_ms\n\
                    2,1000,500,9.000,,1\n3,1000,500,1.000,600.000,601\n4,1000,250,3.000,600.000,1201\n";
        let r = parse_csv(text).unwrap();
        assert_eq!((r.len(), r[0].inter_arrival_ms), (3, None));
        let s = summarize(&[r], 1, 0.0);
        assert_eq!(
            (s.ledgers, s.p50_ms, s.max_ms, s.wire_bytes),
            (2, 1.0, 3.0, 375.0)
        );
        // One ledger after the first kept one: 1000 bytes in 600 ms.
        let want = 1000.0 / f64::from(1 << 20) / 0.6;
        assert!((s.throughput_mib_s - want).abs() < 1e-12);
        assert!((s.transfer_mib_s - want).abs() < 1e-12);
        // Uneven arrivals: throughput takes the median gap, transfer goodput the whole span.
        let uneven = "2,1000,1000,1,,0\n3,1000,1000,1,100,100\n4,1000,1000,1,100,200\n5,1000,1000,1,400,600\n";
        let s = summarize(&[parse_csv(uneven).unwrap()], 0, 0.0);
        let mib = 1000.0 / f64::from(1 << 20);
        assert!((s.throughput_mib_s - mib / 0.1).abs() < 1e-9);
        assert!((s.transfer_mib_s - 3.0 * mib / 0.6).abs() < 1e-9);
        assert!(parse_csv("seq\n1,2\n").is_err());
    }

    #[test]
    fn quantiles_spread_and_slope() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!((quantile(&v, 0.99), quantile(&v, 0.5)), (99.0, 50.0));
        assert!(quantile(&[], 0.5).is_nan());
        let rec = |seq, d| Record {
            seq,
            raw_bytes: 1,
            wire_bytes: 1,
            delivery_ms: d,
            inter_arrival_ms: None,
            received_unix_ms: 0.0,
        };
        // Subscriber 1 is last on ledgers 5 and 6, subscriber 0 on 7; 8 is not everyone's.
        let subs = vec![
            vec![rec(5, 10.0), rec(6, 20.0), rec(7, 90.0), rec(8, 1.0)],
            vec![rec(5, 30.0), rec(6, 25.0), rec(7, 40.0)],
        ];
        let s = spread(&subs);
        assert_eq!((s.first_p50_ms, s.first_p99_ms), (20.0, 40.0));
        assert_eq!((s.last_p50_ms, s.last_p99_ms), (30.0, 90.0));
        assert!((s.last_share - 2.0 / 3.0).abs() < 1e-9);
        let pts: Vec<(f64, f64)> = (0..10)
            .map(|i| (f64::from(i), 3.0 + 2.0 * f64::from(i)))
            .collect();
        assert!((crate::soak::slope(&pts).unwrap() - 2.0).abs() < 1e-9);
        assert_eq!(crate::soak::slope(&[(1.0, 1.0), (1.0, 2.0)]), None);
    }
}

mod report {
    use ledger_relay_bench::report::*;

    #[test]
    fn columns_pad_their_cells_and_a_failed_row_keeps_its_lead() {
        let cols: [Col<(u32, Option<&str>)>; 3] = [
            Col::l("name", 6, |r| format!("r{}", r.0)),
            Col::r("n", 4, |r| r.0.to_string()),
            Col::r("x", 3, |r| format!("{:>2}/", r.0)),
        ];
        let t = table_of(&cols, &[(7, None), (8, Some("boom"))], 1, |r| r.1);
        assert_eq!(t, "name      n   x\nr7        7  7/\nr8     FAILED: boom\n");
        assert_eq!(opt(Some(1.234), 1), "1.2");
        assert_eq!(opt(Some(f64::NAN), 1), "-");
        assert_eq!(opt(None, 1), "-");
    }
}

mod row {
    use ledger_relay_bench::row::*;
    use ledger_relay_bench::scenario::Scenario;
    use ledger_relay_bench::stats::Record;

    fn rec(seq: u32, d: f64) -> Record {
        Record {
            seq,
            raw_bytes: 1000,
            wire_bytes: 500,
            delivery_ms: d,
            inter_arrival_ms: Some(600.0),
            received_unix_ms: 1e6 + f64::from(seq) * 600.0,
        }
    }

    #[test]
    fn a_row_summarizes_after_the_warmup_and_compares_edges_with_the_root() {
        let sc = Scenario {
            name: "t".into(),
            warmup: 1,
            ..Scenario::default()
        };
        let taken = Taken {
            records: vec![
                vec![rec(5, 90.0), rec(6, 10.0), rec(7, 30.0)],
                vec![rec(5, 1.0), rec(6, 20.0), rec(7, 20.0)],
            ],
            reference: Some(vec![rec(5, 0.0), rec(6, 5.0), rec(7, 5.0)]),
            lanes: vec![
                Lane {
                    lane: 0,
                    delivered_bytes: 30.0,
                    ..Lane::default()
                },
                Lane {
                    lane: 1,
                    delivered_bytes: 10.0,
                    ..Lane::default()
                },
            ],
            ..Taken::default()
        };
        let row = Row::finish(&sc, Ok(taken), 0.0);
        assert_eq!(row.delivery_ms, [10.0, 20.0, 20.0, 30.0]);
        assert_eq!(row.delivery.as_ref().unwrap().ledgers, 4);
        // Per ledger, the later subscriber less the root's: 20 - 5 and 30 - 5.
        assert_eq!(row.added_ms, Some([15.0, 25.0, 25.0]));
        assert_eq!(row.spread.as_ref().unwrap().last_p99_ms, 30.0);
        // 30 and 10 of 40 against 20 each.
        assert_eq!(row.imbalance(), Some(0.5));
        assert!((row.span_s - (1.2 + 0.09)).abs() < 1e-9, "{}", row.span_s);
        let failed = Row::finish(&sc, Err(anyhow::anyhow!("no relay")), 0.0);
        assert!(table(&[row, failed.clone()]).contains("FAILED: no relay"));
        let csv = ledger_relay_bench::report::csv(&[failed], &["delivery_ms"]);
        assert_eq!(csv.lines().count(), 2);
        // 1 MB over 8 Mbit/s (97% usable) less a 10 ms emit window.
        let b = model_bound_ms(1e6, 1e4, 8e6, 8e6, 10.0);
        assert!((b - (1e6 / (8e6 * 0.97 / 8.0) * 1e3 - 10.0)).abs() < 1e-9);
    }
}

mod pipe {
    #[test]
    fn the_pipe_delivers_every_ledger() {
        let r = ledger_relay_bench::pipe::run(300_000, 5, 5.0, 1.0).unwrap();
        assert_eq!(r.iter().map(|x| x.seq).collect::<Vec<_>>(), [0, 1, 2, 3, 4]);
        assert!(r
            .iter()
            .all(|x| x.raw_bytes == 300_000 && x.delivery_ms < 1000.0));
    }
}

mod procs {
    use ledger_relay_bench::procs::*;
    use std::time::Duration;

    #[test]
    fn reads_own_cpu_and_memory() {
        let me = std::process::id();
        assert!(cpu_seconds(me).is_some_and(|c| c >= 0.0));
        assert!(!thread_cpu_seconds(me).is_empty());
        assert!(status_kib(me, "VmRSS").is_some_and(|k| k > 0));
        assert!(status_kib(me, "VmNope").is_none());
        let s = RssSampler::start(me, Duration::from_millis(10), 1000);
        std::thread::sleep(Duration::from_millis(60));
        let v = s.finish();
        assert!(
            v.len() >= 2 && v.windows(2).all(|w| w[0].t_s <= w[1].t_s),
            "{v:?}"
        );
        // A name with a space and a parenthesis: fields are counted after the last ')'.
        let stat = "7 (a) b) S 1 1 1 0 -1 0 0 0 0 0 250 150 0 0 20 0 1 0";
        let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
            .ok()
            .flatten();
        assert_eq!(
            stat_cpu_seconds(stat),
            Some(400.0 / hz.unwrap_or(100) as f64)
        );
    }
}

mod children {
    use ledger_relay_bench::procs::{peek_exit, wait_with_cpu};
    use std::time::{Duration, Instant};

    /// A child seen exiting is not reaped by the look, so its CPU can still be read when it is
    /// reaped: a subscriber that finished before the others still has its CPU counted.
    #[test]
    fn a_look_at_a_child_leaves_it_to_be_reaped() {
        let mut child = std::process::Command::new("sh")
            .args(["-c", "exit 3"])
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let code = loop {
            if let Some(code) = peek_exit(&child).unwrap() {
                break code;
            }
            assert!(Instant::now() < deadline, "sh did not exit");
            std::thread::sleep(Duration::from_millis(5));
        };
        assert_eq!((code, peek_exit(&child).unwrap()), (3, Some(3)));
        let (status, cpu) = wait_with_cpu(&mut child, Instant::now()).unwrap().unwrap();
        assert_eq!(status.code(), Some(3));
        assert!(cpu.is_finite() && cpu >= 0.0, "{cpu}");
    }
}

mod cluster {
    use ledger_relay_bench::cluster::*;

    #[test]
    fn parses_the_relays_metrics() {
        let text = "# HELP ledger_relay_lagged_total Times.\nledger_relay_lagged_total 2\n\
                    ledger_relay_subscriber_lanes{session=\"3\",identity=\"sub-\\\"8\"} 4\n\
                    ledger_relay_lane_rtt_seconds{lane=\"1\"} 0.002\ngarbage line\n";
        let m = Scrape::parse(text);
        assert_eq!((m.get("lagged_total"), m.get("absent")), (2.0, 0.0));
        let lanes: Vec<_> = m.labelled("subscriber_lanes").collect();
        assert_eq!(lanes, [("session=\"3\",identity=\"sub-\\\"8\"", 4.0)]);
        assert_eq!(
            crate::soak::label(lanes[0].0, "identity").as_deref(),
            Some("sub-\"8")
        );
        assert_eq!(
            crate::soak::label(lanes[0].0, "session").as_deref(),
            Some("3")
        );
        let rtt: Vec<_> = m.labelled("lane_rtt_seconds").collect();
        assert_eq!(rtt, [("lane=\"1\"", 0.002)]);
        let s = RelaySettings {
            count: Some(5),
            ..RelaySettings::endless(1024, 1.0, 100.0)
        };
        let want = "synthetic:size=1024,ratio=1,count=5,start=2,chunk=262144";
        assert_eq!(s.synthetic_source(), want);
    }

    #[test]
    fn an_http_request_carries_its_form_and_returns_any_status_and_the_body() {
        use std::io::{Read, Write};
        let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = server.local_addr().unwrap();
        let serve = std::thread::spawn(move || {
            let (mut s, _) = server.accept().unwrap();
            let mut got = vec![0u8; 4096];
            let n = s.read(&mut got).unwrap();
            s.write_all(
                b"HTTP/1.1 404 Not Found\r\nContent-Type: text/html\r\n\r\nLedger not found\n",
            )
            .unwrap();
            String::from_utf8_lossy(&got[..n]).into_owned()
        });
        let (status, body) = http(addr, "POST /getledgerentry", "key=AAAA").unwrap();
        assert_eq!((status, &body[..]), (404, &b"Ledger not found\n"[..]));
        let request = serve.join().unwrap();
        assert!(
            request.starts_with("POST /getledgerentry HTTP/1.1\r\n"),
            "{request}"
        );
        assert!(request.contains("Content-Length: 8\r\n"), "{request}");
        assert!(request.ends_with("\r\n\r\nkey=AAAA"), "{request}");
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let gone = closed.local_addr().unwrap();
        drop(closed);
        assert!(http(gone, "GET /metrics", "").is_err());
    }
}

mod cpu {
    use ledger_relay_bench::cpu::*;
    use std::collections::BTreeMap;

    const DEMO: &str = "\n28 ledgers after 2 warm-up, 4 lanes, codec none: delivery p50 1.0 ms\n\
cpu (relay and subscriber together, this process): 195.9 ms per ledger\n  of which, ms per \
ledger: pipeline 7.2, relay 41.2, ring 86.9, source 0.0, subscriber 51.4, exited threads 9.2\n";

    #[test]
    fn the_demos_cpu_lines_are_read() {
        let m = parse_demo(DEMO, 28, 15_204_352).unwrap();
        assert_eq!(m.cpu_ms_per_ledger, 195.9);
        assert_eq!(m.split_ms["ring"], 86.9);
        assert_eq!(m.split_ms["exited threads"], 9.2);
        assert_eq!(m.split_ms.len(), 6);
        assert!(parse_demo("nothing", 1, 1).is_err());
    }

    #[test]
    fn mb_per_cpu_second() {
        let m = Measured {
            row: CpuRow::Quinn,
            ledgers: 20,
            size: 15_204_352,
            cpu_ms_per_ledger: 20.0,
            split_ms: BTreeMap::new(),
        };
        // 15.2 MB in 20 ms.
        assert_eq!(m.mb_per_cpu_s().round(), 760.0);
        assert!(table(&[m]).contains("quinn"));
    }
}

mod message {
    use ledger_relay_bench::yardstick::message::*;
    use ledger_relay_wire::record::RecordError;

    fn replies() -> Vec<u8> {
        let mut out = clock_reply(1, 2, 3).to_vec();
        out.extend_from_slice(&ledger_head(7, 10, 20, 5).unwrap());
        out.extend_from_slice(b"hello");
        out.extend(error_message("bye"));
        out
    }

    fn read(bytes: &[u8], max_len: u32) -> Result<Reply, MessageError> {
        read_reply(&mut std::io::Cursor::new(bytes), max_len)
    }

    #[test]
    fn replies_are_read_in_turn_and_a_message_cut_short_is_an_error() {
        let bytes = replies();
        let want = vec![
            Reply::Clock(ClockSample {
                t0_ns: 1,
                t1_ns: 2,
                t2_ns: 3,
                t3_ns: 0,
            }),
            Reply::Ledger {
                seq: 7,
                first_byte_ns: 10,
                last_byte_ns: 20,
                body: b"hello".to_vec(),
            },
            Reply::Error("bye".into()),
        ];
        let mut r = std::io::Cursor::new(&bytes[..]);
        let got: Vec<Reply> = (0..3)
            .map(|_| read_reply(&mut r, 1 << 20).unwrap())
            .collect();
        assert_eq!(got, want);
        let eof = MessageError::Io(std::io::ErrorKind::UnexpectedEof);
        assert_eq!(read_reply(&mut r, 1 << 20), Err(eof.clone()));
        // Every cut inside the ledger's message (bytes 25..55) leaves it unread.
        for n in 26..55 {
            assert_eq!(read(&bytes[25..n], 1 << 20), Err(eof.clone()), "cut at {n}");
        }
    }

    #[test]
    fn bad_replies_are_typed_errors_and_arbitrary_bytes_never_panic() {
        let mut head = ledger_head(9, 0, 0, 100).unwrap();
        let too_long = MessageError::Record {
            seq: 9,
            source: RecordError::TooLong { len: 100, max: 99 },
        };
        assert_eq!(read(&head, 99), Err(too_long));
        head[21] &= 0x7f;
        assert!(matches!(
            read(&head, 1 << 20),
            Err(MessageError::Record {
                source: RecordError::NotLastFragment { .. },
                ..
            })
        ));
        assert_eq!(
            read(&[0x83, 0xff, 0xff], 1 << 20),
            Err(MessageError::ErrorTooLong { len: 65535 })
        );
        assert!(ledger_head(1, 0, 0, 0).is_err(), "no empty record");
        let long = error_message(&"é".repeat(MAX_ERROR_LEN));
        assert!(matches!(read(&long, 1), Ok(Reply::Error(m)) if m.len() == MAX_ERROR_LEN));
        // Whatever arrives, the reader answers with a message or an error, never a panic.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..2000 {
            let bytes: Vec<u8> = (0..64)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    [0x81, 0x82, 0x83, x as u8][(x >> 40) as usize % 4]
                })
                .collect();
            let mut r = std::io::Cursor::new(&bytes[..]);
            while read_reply(&mut r, 4096).is_ok() {}
        }
    }

    #[test]
    fn requests_round_trip_and_the_offset_is_the_servers_clock_minus_ours() {
        for r in [
            Request::Clock {
                t0_ns: u64::MAX - 7,
            },
            Request::Stream { from: 0, count: 3 },
            Request::Stream {
                from: 12,
                count: u32::MAX,
            },
        ] {
            assert_eq!(Request::decode(&r.encode()), Ok(r));
        }
        assert_eq!(
            Request::decode(&[0x82; REQUEST_LEN]),
            Err(MessageError::UnknownType(0x82))
        );
        // The server's clock is 5 s ahead; 2 ms each way; 1 ms between reading and answering.
        let ms = 1_000_000u64;
        let s = ClockSample {
            t0_ns: 1000 * ms,
            t1_ns: 6002 * ms,
            t2_ns: 6003 * ms,
            t3_ns: 1005 * ms,
        };
        assert_eq!(
            (s.offset_ns(), s.rtt_ns()),
            (5000 * i128::from(ms), 4 * i128::from(ms))
        );
        // Asymmetric delays: off by half the difference, within half the round trip.
        let skewed = ClockSample {
            t3_ns: 1011 * ms,
            ..s
        };
        assert_eq!(
            (skewed.rtt_ns(), skewed.offset_ns()),
            (10 * i128::from(ms), 4997 * i128::from(ms))
        );
        assert_eq!(best_sample(&[skewed, s]), Some(s));
        assert_eq!(best_sample(&[]), None);
    }
}

mod query {
    use std::net::UdpSocket;
    use std::time::{Duration, Instant};

    use ledger_relay_bench::query::*;

    #[test]
    fn bodies_take_keys_in_turn_and_pin_a_ledger_when_asked() {
        let keys: Vec<String> = (0..5).map(|i| format!("K{i}")).collect();
        assert_eq!(
            bodies(&keys, 2, 3, Some(7)),
            [
                "key=K0&key=K1&ledgerSeq=7",
                "key=K2&key=K3&ledgerSeq=7",
                "key=K4&key=K0&ledgerSeq=7"
            ]
        );
        assert_eq!(bodies(&keys, 1, 1, None), ["key=K0"]);
    }

    #[test]
    fn the_smallest_round_trip_of_a_lane_stats_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("l.csv");
        let text = "unix_ms,lane,rtt_ms,min_rtt_ms\n1,0,1.5,1.2\n2,1,1.4,0\n3,1,1.3,1.1\n";
        std::fs::write(&p, text).unwrap();
        assert_eq!(min_rtt(&p), Some(1.1));
        assert_eq!(min_rtt(&dir.path().join("none")), None);
    }

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
        let any = "127.0.0.1:0".parse().unwrap();
        let listen = delay::start(None, any, echo_addr, Duration::from_millis(20)).unwrap();
        let client = UdpSocket::bind("127.0.0.1:0").unwrap();
        client
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        for _ in 0..2 {
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
}

mod client {
    #[test]
    fn hosts_of_addresses() {
        use ledger_relay_bench::yardstick::client::host_of;
        assert_eq!(host_of("198.18.0.1:7400").unwrap(), "198.18.0.1");
        assert_eq!(host_of("[::1]:7400").unwrap(), "::1");
        assert_eq!(host_of("relay-a.example:7400").unwrap(), "relay-a.example");
        assert!(host_of("relay-a.example").is_err() && host_of(":7400").is_err());
    }
}
