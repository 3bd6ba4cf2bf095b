//! Golden vectors, round trips and truncation sweeps for every frame.

use proptest::prelude::*;

use super::*;
use crate::core_http::{CorePort, HttpMethod, Origin};

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn samples() -> Vec<Frame> {
    vec![
        Frame::SessionOpen(SessionOpen {
            version: 1,
            start: Start::Tip,
            lanes: 4,
            codecs: 0b111,
            window: 8,
        }),
        Frame::SessionOpen(SessionOpen {
            version: 1,
            start: Start::Seq(1_410_048),
            lanes: 1,
            codecs: 1,
            window: 2,
        }),
        Frame::SessionAccept(SessionAccept {
            version: 1,
            session_id: 0x0102_0304_0506_0708,
            token: [0xAA; TOKEN_LEN],
            lanes: 4,
            first_seq: 100,
            oldest: 90,
            newest: 99,
            chunk_size: 256 << 10,
            window: 8,
            heartbeat_ms: 500,
            max_chunk_raw: 4 << 20,
            max_ledger_raw: 256 << 20,
        }),
        Frame::LaneJoin(LaneJoin {
            version: 1,
            session_id: 7,
            token: [0x55; TOKEN_LEN],
            lane: 3,
        }),
        Frame::LaneAccept(3),
        Frame::Chunk(Chunk {
            header: ChunkHeader {
                seq: 5,
                index: 2,
                raw_offset: 512,
                raw_len: 4,
                codec: Codec::None,
            },
            payload: Bytes::from_static(b"abcd"),
        }),
        Frame::LedgerEnd(LedgerEnd {
            seq: 5,
            chunk_count: 3,
            raw_len: 516,
            checksum: 0xDEAD_BEEF_0000_0001,
            header_hash: [1; 32],
            previous_hash: [2; 32],
            first_byte_ns: 10,
            last_byte_ns: 20,
        }),
        Frame::Ack(5),
        Frame::Resend(Resend {
            seq: 6,
            whole: false,
            indices: vec![1, 4],
        }),
        Frame::Resend(Resend {
            seq: 6,
            whole: true,
            indices: vec![],
        }),
        Frame::Heartbeat(Heartbeat {
            newest: 99,
            oldest: 90,
            time_ns: 1,
        }),
        Frame::Error(ErrorFrame {
            code: ErrorCode::BelowRetention,
            oldest: 90,
            newest: 99,
            message: "start 5 is below retention".into(),
        }),
        Frame::CoreRequest(CoreRequest {
            version: 1,
            port: CorePort::Query,
            method: HttpMethod::Post,
            timeout_ms: 2000,
            target: "/getledgerentry".into(),
            content_type: "x/y".into(),
            body: Bytes::from_static(b"key=AA"),
        }),
        Frame::CoreResponse(CoreResponse {
            status: 404,
            origin: Origin::Core,
            content_type: "text/html".into(),
            body: Bytes::from_static(b"Ledger not found\n"),
        }),
    ]
}

#[test]
fn golden_vectors() {
    let limits = Limits::default();
    let cases: Vec<(Frame, &str)> = vec![
        (
            samples()[0].clone(),
            "01 0000000b 0001 00 00000000 04 07 0008",
        ),
        (
            samples()[1].clone(),
            "01 0000000b 0001 01 00158400 01 01 0002",
        ),
        (
            samples()[2].clone(),
            "02 0000003d 0001 0102030405060708 aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa 04 \
             00000064 0000005a 00000063 00040000 0008 000001f4 00400000 0000000010000000",
        ),
        (
            samples()[3].clone(),
            "03 0000001b 0001 0000000000000007 55555555555555555555555555555555 03",
        ),
        (samples()[4].clone(), "04 00000001 03"),
        (
            samples()[5].clone(),
            "10 00000019 00000005 00000002 0000000000000200 00000004 00 61626364",
        ),
        (
            samples()[6].clone(),
            "11 00000068 00000005 00000003 0000000000000204 deadbeef00000001 \
             0101010101010101010101010101010101010101010101010101010101010101 \
             0202020202020202020202020202020202020202020202020202020202020202 \
             000000000000000a 0000000000000014",
        ),
        (samples()[7].clone(), "20 00000004 00000005"),
        (
            samples()[8].clone(),
            "21 00000011 00000006 00 00000002 00000001 00000004",
        ),
        (samples()[9].clone(), "21 00000009 00000006 01 00000000"),
        (
            samples()[10].clone(),
            "22 00000010 00000063 0000005a 0000000000000001",
        ),
        (
            samples()[11].clone(),
            "30 00000026 0001 0000005a 00000063 001a \
             7374617274203520697320626 56c6f7720726574656e74696f6e",
        ),
        (
            samples()[12].clone(),
            "40 00000025 0001 02 02 000007d0 0000000f 03 \
             2f6765746c6564676572656e747279 782f79 6b65793d4141",
        ),
        (
            samples()[13].clone(),
            "41 0000001e 0194 00 09 746578742f68746d6c \
             4c6564676572206e6f7420666f756e640a",
        ),
    ];
    for (frame, golden) in cases {
        let want = hex(golden);
        assert_eq!(frame.to_vec(), want, "encoding of {frame:?}");
        let (back, used) = decode(&want, &limits).unwrap().unwrap();
        assert_eq!(used, want.len());
        assert_eq!(back, frame);
        assert_eq!(decode_exact(Bytes::from(want), &limits).unwrap(), frame);
    }
}

#[test]
fn every_prefix_asks_for_more_or_fails_cleanly() {
    let limits = Limits::default();
    for frame in samples() {
        let bytes = frame.to_vec();
        for cut in 0..bytes.len() {
            assert_eq!(
                decode(&bytes[..cut], &limits).unwrap(),
                None,
                "{frame:?} cut {cut}"
            );
            assert!(matches!(
                decode_exact(Bytes::copy_from_slice(&bytes[..cut]), &limits),
                Err(FrameError::Truncated { .. })
            ));
            let mut d = FrameDecoder::new(limits.clone());
            d.feed(&bytes[..cut]).unwrap();
            assert_eq!(d.poll().unwrap(), None);
            if cut > 0 {
                assert!(d.finish().is_err());
            }
        }
    }
}

#[test]
fn decoder_takes_frames_fed_byte_by_byte() {
    let limits = Limits::default();
    let mut stream = Vec::new();
    for f in samples() {
        f.encode(&mut stream);
    }
    let mut d = FrameDecoder::new(limits);
    let mut out = Vec::new();
    for b in &stream {
        d.feed(std::slice::from_ref(b)).unwrap();
        while let Some(f) = d.poll().unwrap() {
            out.push(f);
        }
    }
    d.finish().unwrap();
    assert_eq!(out, samples());
    assert_eq!(d.buffered(), 0);
}

#[test]
fn headers_are_refused_before_the_body() {
    let limits = Limits::default();
    let mut d = FrameDecoder::new(limits.clone());
    // Unknown type.
    assert_eq!(
        d.feed(&[0x7f, 0, 0, 0, 0]),
        Err(FrameError::UnknownType { ty: 0x7f })
    );
    // Oversize chunk: refused with only the header present.
    let mut d = FrameDecoder::new(limits.clone());
    let err = d.feed(&[0x10, 0xff, 0xff, 0xff, 0xff]).unwrap_err();
    assert!(matches!(err, FrameError::TooLong { .. }), "{err}");
    // Fixed-size frame with another length.
    let err = decode(&[0x20, 0, 0, 0, 5, 0, 0, 0, 0, 0], &limits).unwrap_err();
    assert!(matches!(err, FrameError::BadLength { .. }), "{err}");
    // Control frame over the control limit.
    let big = (limits.max_control_body + 1).to_be_bytes();
    let err = decode(&[0x30, big[0], big[1], big[2], big[3]], &limits).unwrap_err();
    assert!(matches!(err, FrameError::TooLong { .. }), "{err}");
}

#[test]
fn bad_fields_are_typed_errors() {
    let limits = Limits::default();
    let mut chunk = samples()[5].to_vec();
    chunk[25] = 9; // codec byte
    assert_eq!(
        decode(&chunk, &limits).unwrap_err(),
        FrameError::UnknownCodec { codec: 9 }
    );
    // Raw chunk whose payload is shorter than its raw length.
    let mut chunk = samples()[5].to_vec();
    chunk[24] = 5; // raw_len low byte: 4 -> 5
    assert!(matches!(
        decode(&chunk, &limits).unwrap_err(),
        FrameError::PayloadLength { .. }
    ));
    // Compressed chunk not shorter than raw.
    let mut chunk = samples()[5].to_vec();
    chunk[25] = 1;
    assert!(matches!(
        decode(&chunk, &limits).unwrap_err(),
        FrameError::PayloadLength { .. }
    ));
    // Chunk raw length over the limit.
    let c = Frame::Chunk(Chunk {
        header: ChunkHeader {
            seq: 1,
            index: 0,
            raw_offset: 0,
            raw_len: limits.max_chunk_raw + 1,
            codec: Codec::Zstd,
        },
        payload: Bytes::from_static(b"x"),
    });
    assert!(matches!(
        decode(&c.to_vec(), &limits).unwrap_err(),
        FrameError::ChunkTooLong { .. }
    ));
    // Zero lanes, unknown start kind, unknown error code, non-UTF-8 message.
    let mut open = samples()[0].to_vec();
    open[12] = 0;
    assert!(matches!(
        decode(&open, &limits).unwrap_err(),
        FrameError::Malformed { .. }
    ));
    let mut open = samples()[0].to_vec();
    open[7] = 2;
    assert!(matches!(
        decode(&open, &limits).unwrap_err(),
        FrameError::Malformed { .. }
    ));
    let mut err = samples()[11].to_vec();
    err[6] = 0x63;
    assert!(matches!(
        decode(&err, &limits).unwrap_err(),
        FrameError::Malformed { .. }
    ));
    let mut err = samples()[11].to_vec();
    let n = err.len();
    err[n - 1] = 0xff;
    assert!(matches!(
        decode(&err, &limits).unwrap_err(),
        FrameError::Malformed { .. }
    ));
    // Resend whose count disagrees with its length.
    let mut r = samples()[8].to_vec();
    r[13] = 3;
    assert!(matches!(
        decode(&r, &limits).unwrap_err(),
        FrameError::Malformed { .. }
    ));
    // Trailing bytes after a single-frame stream.
    let mut two = samples()[7].to_vec();
    two.push(0);
    assert!(matches!(
        decode_exact(Bytes::from(two), &limits).unwrap_err(),
        FrameError::TrailingBytes { .. }
    ));
}

#[test]
fn chunk_payload_is_shared_not_copied() {
    let limits = Limits::default();
    let bytes = Bytes::from(samples()[5].to_vec());
    let base = bytes.as_ptr() as usize;
    let Frame::Chunk(c) = decode_exact(bytes.clone(), &limits).unwrap() else {
        panic!("not a chunk")
    };
    assert_eq!(
        c.payload.as_ptr() as usize,
        base + FRAME_HEADER_LEN + CHUNK_FIXED_LEN
    );
}

fn chunk_frame(raw_len: u32, codec: Codec, payload_len: usize) -> Vec<u8> {
    Frame::Chunk(Chunk {
        header: ChunkHeader {
            seq: 7,
            index: 0,
            raw_offset: 0,
            raw_len,
            codec,
        },
        payload: Bytes::from(vec![1u8; payload_len]),
    })
    .to_vec()
}

#[test]
fn a_data_streams_head_tells_what_its_frame_will_hold() {
    let limits = Limits::default();
    let raw = chunk_frame(4000, Codec::None, 4000);
    let zstd = chunk_frame(4 << 20, Codec::Zstd, 100);
    let end = samples()
        .into_iter()
        .find(|f| matches!(f, Frame::LedgerEnd(_)))
        .unwrap()
        .to_vec();
    let cases = [
        (&raw, DATA_HEAD_LEN, raw.len() as u64),
        (&zstd, DATA_HEAD_LEN, zstd.len() as u64 + (4 << 20)),
        (&end, FRAME_HEADER_LEN, end.len() as u64),
    ];
    for (bytes, need, held) in cases {
        for short in 0..need {
            assert_eq!(
                data_head(&bytes[..short], &limits),
                Ok(None),
                "{short} bytes"
            );
        }
        let want = Some(DataHead {
            frame_type: FrameType::from_u8(bytes[0]).unwrap(),
            frame_len: bytes.len(),
            held,
        });
        assert_eq!(data_head(&bytes[..need], &limits), Ok(want));
        assert_eq!(data_head(bytes, &limits), Ok(want));
    }
}

#[test]
fn a_data_streams_head_is_checked_before_anything_is_held() {
    let limits = Limits::default();
    // A chunk longer than the limit is refused from its 5-byte header.
    let mut long = chunk_frame(10, Codec::None, 10);
    long[1..5].copy_from_slice(&(limits.max_chunk_body() + 1).to_be_bytes());
    assert!(matches!(
        data_head(&long[..FRAME_HEADER_LEN], &limits),
        Err(FrameError::TooLong { .. })
    ));
    assert!(data_head(&[0xee, 0, 0, 0, 0], &limits).is_err());
    // A core response is longer than any frame a data stream may carry: refused from its header,
    // so a data stream never holds more than `max_frame_len`.
    let mut core = vec![FrameType::CoreResponse as u8];
    let body = (limits.max_frame_len() - FRAME_HEADER_LEN + 1) as u32;
    core.extend_from_slice(&body.to_be_bytes());
    assert!(matches!(
        data_head(&core, &limits),
        Err(FrameError::TooLong { .. })
    ));
    // A compressed chunk claiming more than the largest raw chunk costs only its frame: it is
    // refused before it is decompressed.
    let big = chunk_frame(limits.max_chunk_raw + 1, Codec::Lz4, 100);
    let head = data_head(&big, &limits).unwrap().unwrap();
    assert_eq!(head.held, big.len() as u64);
}

#[test]
fn long_messages_are_cut_at_a_char_boundary() {
    let s = "é".repeat(40_000);
    let cut = truncate_utf8(&s, u16::MAX as usize);
    assert!(cut.len() <= u16::MAX as usize && cut.len() % 2 == 0);
}

fn arb_codec() -> impl Strategy<Value = Codec> {
    prop_oneof![Just(Codec::None), Just(Codec::Lz4), Just(Codec::Zstd)]
}

fn arb_frame() -> impl Strategy<Value = Frame> {
    prop_oneof![
        (
            any::<u16>(),
            prop::option::of(1u32..),
            1u8..=64,
            0u8..8,
            1u16..
        )
            .prop_map(|(version, s, lanes, codecs, window)| Frame::SessionOpen(
                SessionOpen {
                    version,
                    start: s.map_or(Start::Tip, Start::Seq),
                    lanes,
                    codecs,
                    window,
                }
            )),
        (
            any::<u64>(),
            any::<[u8; 16]>(),
            1u8..=64,
            any::<[u32; 3]>(),
            1u32..4096,
            1u16..,
            any::<u64>()
        )
            .prop_map(
                |(session_id, token, lanes, s, chunk_size, window, max_ledger_raw)| {
                    Frame::SessionAccept(SessionAccept {
                        version: 1,
                        session_id,
                        token,
                        lanes,
                        first_seq: s[0],
                        oldest: s[1],
                        newest: s[2],
                        chunk_size,
                        window,
                        heartbeat_ms: 250,
                        max_chunk_raw: 4096,
                        max_ledger_raw,
                    })
                }
            ),
        (any::<u64>(), any::<[u8; 16]>(), 1u8..64).prop_map(|(session_id, token, lane)| {
            Frame::LaneJoin(LaneJoin {
                version: 1,
                session_id,
                token,
                lane,
            })
        }),
        any::<u8>().prop_map(Frame::LaneAccept),
        (
            any::<u32>(),
            any::<u32>(),
            any::<u64>(),
            arb_codec(),
            prop::collection::vec(any::<u8>(), 0..300),
            1u32..100
        )
            .prop_map(|(seq, index, raw_offset, codec, payload, extra)| {
                let raw_len = payload.len() as u32 + if codec == Codec::None { 0 } else { extra };
                Frame::Chunk(Chunk {
                    header: ChunkHeader {
                        seq,
                        index,
                        raw_offset,
                        raw_len,
                        codec,
                    },
                    payload: Bytes::from(payload),
                })
            }),
        (
            any::<[u32; 2]>(),
            any::<[u64; 4]>(),
            any::<[u8; 32]>(),
            any::<[u8; 32]>()
        )
            .prop_map(
                |(a, b, header_hash, previous_hash)| Frame::LedgerEnd(LedgerEnd {
                    seq: a[0],
                    chunk_count: a[1],
                    raw_len: b[0],
                    checksum: b[1],
                    header_hash,
                    previous_hash,
                    first_byte_ns: b[2],
                    last_byte_ns: b[3],
                })
            ),
        any::<u32>().prop_map(Frame::Ack),
        (any::<u32>(), prop::collection::vec(any::<u32>(), 0..200)).prop_map(|(seq, indices)| {
            Frame::Resend(Resend {
                seq,
                whole: indices.is_empty(),
                indices,
            })
        }),
        (any::<u32>(), any::<u32>(), any::<u64>()).prop_map(|(newest, oldest, time_ns)| {
            Frame::Heartbeat(Heartbeat {
                newest,
                oldest,
                time_ns,
            })
        }),
        (1u16..=8, any::<u32>(), any::<u32>(), "\\PC{0,200}").prop_map(
            |(c, oldest, newest, message)| {
                Frame::Error(ErrorFrame {
                    code: ErrorCode::from_u16(c).unwrap(),
                    oldest,
                    newest,
                    message,
                })
            }
        ),
        (
            any::<bool>(),
            any::<u32>(),
            "/[!-~]{0,100}",
            "[ -~]{0,40}",
            prop::collection::vec(any::<u8>(), 0..300)
        )
            .prop_map(|(query, timeout_ms, target, content_type, body)| {
                let (port, method) = if query {
                    (CorePort::Query, HttpMethod::Post)
                } else {
                    (CorePort::Command, HttpMethod::Get)
                };
                Frame::CoreRequest(CoreRequest {
                    version: 1,
                    port,
                    method,
                    timeout_ms,
                    target,
                    content_type,
                    body: Bytes::from(body),
                })
            }),
        (
            100u16..=599,
            any::<bool>(),
            "[ -~]{0,40}",
            prop::collection::vec(any::<u8>(), 0..300)
        )
            .prop_map(|(status, relay, content_type, body)| {
                Frame::CoreResponse(CoreResponse {
                    status,
                    origin: if relay { Origin::Relay } else { Origin::Core },
                    content_type,
                    body: Bytes::from(body),
                })
            }),
    ]
}

proptest! {
    #[test]
    fn round_trip(frames in prop::collection::vec(arb_frame(), 1..8), split in any::<prop::sample::Index>()) {
        let limits = Limits::default();
        let mut stream = Vec::new();
        for f in &frames {
            f.encode(&mut stream);
        }
        // Through the incremental decoder, split at an arbitrary point.
        let at = split.index(stream.len() + 1);
        let mut d = FrameDecoder::new(limits.clone());
        let mut out = Vec::new();
        for piece in [&stream[..at], &stream[at..]] {
            d.feed(piece).unwrap();
            while let Some(f) = d.poll().unwrap() {
                out.push(f);
            }
        }
        d.finish().unwrap();
        prop_assert_eq!(&out, &frames);
        // Through the slice decoder.
        let mut rest = &stream[..];
        let mut out = Vec::new();
        while let Some((f, used)) = decode(rest, &limits).unwrap() {
            out.push(f);
            rest = &rest[used..];
        }
        prop_assert!(rest.is_empty());
        prop_assert_eq!(out, frames);
    }

    #[test]
    fn arbitrary_bytes_never_panic(data in prop::collection::vec(any::<u8>(), 0..512)) {
        crate::fuzzing::frames(&data);
    }
}
