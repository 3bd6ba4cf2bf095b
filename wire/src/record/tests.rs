use super::*;
use proptest::prelude::*;

/// Decodes `pieces` with a fresh decoder into whole records, checking the event grammar.
fn decode_all(pieces: &[&[u8]], max_len: u32) -> (Vec<Vec<u8>>, Result<(), RecordError>) {
    let mut decoder = RecordDecoder::new(max_len);
    let mut records = Vec::new();
    let mut current: Option<(u32, Vec<u8>)> = None;
    for piece in pieces {
        let mut piece = *piece;
        loop {
            let (used, event) = match decoder.decode(piece) {
                Ok(x) => x,
                Err(e) => return (records, Err(e)),
            };
            assert!(used <= piece.len());
            piece = &piece[used..];
            match event {
                None => {
                    assert!(piece.is_empty(), "None with input left");
                    break;
                }
                Some(RecordEvent::Begin { len }) => {
                    assert!(current.is_none(), "Begin inside a record");
                    assert!(decoder.in_record());
                    current = Some((len, Vec::new()));
                }
                Some(RecordEvent::Data(data)) => {
                    assert!(!data.is_empty());
                    assert_eq!(used, data.len());
                    let (len, body) = current.as_mut().expect("Data outside a record");
                    body.extend_from_slice(data);
                    assert!(body.len() <= *len as usize);
                }
                Some(RecordEvent::End) => {
                    assert_eq!(used, 0);
                    let (len, body) = current.take().expect("End outside a record");
                    assert_eq!(body.len(), len as usize);
                    assert!(!decoder.in_record());
                    records.push(body);
                }
            }
        }
    }
    (records, decoder.finish())
}

fn stream_of(bodies: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for body in bodies {
        write_record(&mut out, body).unwrap();
    }
    out
}

#[test]
fn golden_headers() {
    assert_eq!(record_header(1).unwrap(), [0x80, 0, 0, 1]);
    assert_eq!(record_header(0x103c).unwrap(), [0x80, 0, 0x10, 0x3c]);
    assert_eq!(
        record_header(0x7FFF_FFFF).unwrap(),
        [0xFF, 0xFF, 0xFF, 0xFF]
    );
    assert_eq!(
        record_header(0x8000_0000),
        Err(RecordError::Unencodable { len: 0x8000_0000 })
    );
    assert_eq!(record_header(0), Err(RecordError::Empty));

    let mut out = vec![0xAA];
    write_record(&mut out, b"xdr!").unwrap();
    assert_eq!(out, [0xAA, 0x80, 0, 0, 4, b'x', b'd', b'r', b'!']);
    assert_eq!(write_record(&mut out, b""), Err(RecordError::Empty));
    assert_eq!(out.len(), 9, "failed write leaves the buffer unchanged");

    let mut w = Vec::new();
    write_record_to(&mut w, b"xdr!").unwrap();
    assert_eq!(w, out[1..]);
    let e = write_record_to(&mut w, b"").unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    assert_eq!(w.len(), 8);
}

#[test]
fn golden_stream_decodes() {
    // Two records, "ab" and "c", as core would write them.
    let stream = [0x80, 0, 0, 2, b'a', b'b', 0x80, 0, 0, 1, b'c'];
    let mut d = RecordDecoder::new(16);
    assert_eq!(
        d.decode(&stream).unwrap(),
        (4, Some(RecordEvent::Begin { len: 2 }))
    );
    assert_eq!(
        d.decode(&stream[4..]).unwrap(),
        (2, Some(RecordEvent::Data(b"ab")))
    );
    assert!(d.in_record());
    assert_eq!(d.finish(), Ok(()), "a complete body is a boundary");
    assert_eq!(d.decode(&stream[6..]).unwrap(), (0, Some(RecordEvent::End)));
    assert!(!d.in_record());
    assert_eq!(d.decode(&stream[6..9]).unwrap(), (3, None));
    assert!(d.in_record());
    assert_eq!(
        d.finish(),
        Err(RecordError::Truncated {
            expected: 4,
            have: 3
        })
    );
    assert_eq!(
        d.decode(&stream[9..]).unwrap(),
        (1, Some(RecordEvent::Begin { len: 1 }))
    );
    assert_eq!(
        d.finish(),
        Err(RecordError::Truncated {
            expected: 5,
            have: 4
        })
    );
    assert_eq!(d.decode(&[]).unwrap(), (0, None));
    assert_eq!(
        d.decode(&stream[10..]).unwrap(),
        (1, Some(RecordEvent::Data(b"c")))
    );
    assert_eq!(d.decode(&[]).unwrap(), (0, Some(RecordEvent::End)));
    assert_eq!(d.decode(&[]).unwrap(), (0, None));
    assert_eq!(d.finish(), Ok(()));
}

#[test]
fn rejects_bad_marks() {
    // No last-fragment bit: rejected before the length is looked at, even a huge one.
    for header in [0x0000_0004u32, 0x7FFF_FFFF, 0] {
        let mut d = RecordDecoder::new(DEFAULT_MAX_RECORD_LEN);
        assert_eq!(
            d.decode(&header.to_be_bytes()),
            Err(RecordError::NotLastFragment { header })
        );
    }
    let mut d = RecordDecoder::new(100);
    assert_eq!(
        d.decode(&[0x80, 0, 0, 101, 0]),
        Err(RecordError::TooLong { len: 101, max: 100 })
    );
    // Sticky until reset.
    assert_eq!(
        d.decode(&[0x80, 0, 0, 1]),
        Err(RecordError::TooLong { len: 101, max: 100 })
    );
    assert_eq!(d.finish(), Err(RecordError::TooLong { len: 101, max: 100 }));
    d.reset();
    assert_eq!(
        d.decode(&[0x80, 0, 0, 100]).unwrap(),
        (4, Some(RecordEvent::Begin { len: 100 }))
    );

    let mut d = RecordDecoder::new(100);
    assert_eq!(d.decode(&[0x80, 0, 0, 0]), Err(RecordError::Empty));

    // The largest mark against the default limit: rejected with nothing allocated.
    let mut r = RecordReader::new(DEFAULT_MAX_RECORD_LEN);
    assert_eq!(
        r.feed(&[0xFF, 0xFF, 0xFF, 0xFF]),
        Err(RecordError::TooLong {
            len: 0x7FFF_FFFF,
            max: DEFAULT_MAX_RECORD_LEN
        })
    );
    assert_eq!(r.current.capacity(), 0);
}

#[test]
fn reader_does_not_reserve_from_the_mark() {
    let mut r = RecordReader::new(DEFAULT_MAX_RECORD_LEN);
    r.feed(&record_header(DEFAULT_MAX_RECORD_LEN as usize).unwrap())
        .unwrap();
    r.feed(&[1, 2, 3]).unwrap();
    assert!(r.current.capacity() < 1024, "{}", r.current.capacity());
    assert_eq!(r.next_record(), None);
}

#[test]
fn reset_discards_a_partial_record() {
    let mut r = RecordReader::new(16);
    r.feed(&[0x80, 0, 0, 4, b'x', b'y']).unwrap();
    assert!(r.finish().is_err());
    r.decoder.reset();
    assert!(!r.decoder.in_record());
    r.feed(&[0x80, 0, 0, 1, b'z']).unwrap();
    assert_eq!(r.next_record(), Some(b"z".to_vec()));
    assert_eq!(r.next_record(), None);
    assert_eq!(r.finish(), Ok(()));
}

#[test]
fn reader_keeps_records_before_an_error() {
    let mut stream = stream_of(&[b"one".to_vec(), b"two".to_vec()]);
    stream.extend_from_slice(&[0, 0, 0, 1, b'!']);
    let mut r = RecordReader::new(16);
    assert_eq!(
        r.feed(&stream),
        Err(RecordError::NotLastFragment { header: 1 })
    );
    assert_eq!(r.next_record(), Some(b"one".to_vec()));
    assert_eq!(r.next_record(), Some(b"two".to_vec()));
    assert_eq!(r.next_record(), None);

    let mut it = Records::new(&stream[..], 16);
    assert_eq!(it.next().unwrap().unwrap(), b"one");
    assert_eq!(it.next().unwrap().unwrap(), b"two");
    assert!(matches!(
        it.next(),
        Some(Err(ReadError::Record(RecordError::NotLastFragment {
            header: 1
        })))
    ));
    assert!(it.next().is_none());
    assert!(it.next().is_none());
}

/// Every prefix of a valid stream is either a clean boundary holding exactly the records
/// it contains whole, or fails `finish()` with `Truncated`; never a short record.
#[test]
fn truncation_sweep() {
    let bodies: Vec<Vec<u8>> = vec![vec![7; 5], vec![1], (0..=255).collect(), vec![9; 3]];
    let stream = stream_of(&bodies);
    let mut boundaries = vec![0];
    for body in &bodies {
        boundaries.push(boundaries.last().unwrap() + 4 + body.len());
    }
    for cut in 0..=stream.len() {
        let prefix = &stream[..cut];
        let whole = boundaries.iter().filter(|&&b| b <= cut).count() - 1;
        for pieces in [
            vec![prefix],
            prefix.chunks(1).collect(),
            prefix.chunks(3).collect(),
        ] {
            let (records, finished) = decode_all(&pieces, 1024);
            assert_eq!(records, bodies[..whole], "cut {cut}");
            if boundaries.contains(&cut) {
                assert_eq!(finished, Ok(()), "cut {cut}");
            } else {
                assert!(
                    matches!(finished, Err(RecordError::Truncated { expected, have })
                        if have < expected),
                    "cut {cut}: {finished:?}"
                );
            }
        }

        let read: Vec<_> = Records::new(prefix, 1024).collect();
        let (ok, err): (Vec<_>, Vec<_>) = read.into_iter().partition(|r| r.is_ok());
        let ok: Vec<Vec<u8>> = ok.into_iter().map(Result::unwrap).collect();
        assert_eq!(ok, bodies[..whole], "cut {cut}");
        if boundaries.contains(&cut) {
            assert!(err.is_empty(), "cut {cut}");
        } else {
            assert_eq!(err.len(), 1, "cut {cut}");
            assert!(matches!(
                err[0],
                Err(ReadError::Record(RecordError::Truncated { .. }))
            ));
        }
    }
}

#[test]
fn records_retries_interrupted_and_reports_io_errors() {
    struct Flaky<'a> {
        data: &'a [u8],
        calls: usize,
    }
    impl Read for Flaky<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.calls += 1;
            if self.calls % 2 == 1 {
                return Err(io::ErrorKind::Interrupted.into());
            }
            if self.data.is_empty() {
                return Err(io::Error::other("disk on fire"));
            }
            let n = buf.len().min(self.data.len()).min(3);
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }
    let stream = stream_of(&[b"hello".to_vec(), b"world".to_vec()]);
    let mut it = Records::new(
        Flaky {
            data: &stream,
            calls: 0,
        },
        16,
    );
    assert_eq!(it.next().unwrap().unwrap(), b"hello");
    assert_eq!(it.next().unwrap().unwrap(), b"world");
    assert!(matches!(it.next(), Some(Err(ReadError::Io(_)))));
    assert!(it.next().is_none());
}

#[test]
fn open_stream_sniffs_zstd() {
    let stream = stream_of(&[b"ledger one".to_vec(), vec![0x28; 1000]]);
    let plain = {
        let mut out = Vec::new();
        open_stream(io::Cursor::new(stream.clone()))
            .unwrap()
            .read_to_end(&mut out)
            .unwrap();
        out
    };
    assert_eq!(plain, stream);

    // Two concatenated zstd frames decode as one stream.
    let half = stream.len() / 2;
    let mut compressed = zstd::encode_all(&stream[..half], 3).unwrap();
    compressed.extend(zstd::encode_all(&stream[half..], 3).unwrap());
    let mut out = Vec::new();
    open_stream(io::Cursor::new(compressed))
        .unwrap()
        .read_to_end(&mut out)
        .unwrap();
    assert_eq!(out, stream);

    // Short and empty inputs pass through; a partial magic is not zstd.
    for short in [
        &[][..],
        &[0x28],
        &[0x28, 0xB5, 0x2F],
        &[0x28, 0xB5, 0x2F, 0xFE, 1],
    ] {
        let mut out = Vec::new();
        open_stream(io::Cursor::new(short.to_vec()))
            .unwrap()
            .read_to_end(&mut out)
            .unwrap();
        assert_eq!(out, short);
    }
}

#[test]
fn error_messages() {
    assert_eq!(
        RecordError::NotLastFragment { header: 4 }.to_string(),
        "record mark 0x00000004 lacks the last-fragment bit"
    );
    assert_eq!(
        RecordError::Truncated {
            expected: 10,
            have: 7
        }
        .to_string(),
        "stream ended inside a record: expected 10 bytes, have 7"
    );
}

proptest! {
    #[test]
    fn round_trip_any_split(
        bodies in prop::collection::vec(prop::collection::vec(any::<u8>(), 1..300), 0..8),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..12),
    ) {
        let stream = stream_of(&bodies);
        let mut points: Vec<usize> = cuts.iter().map(|i| i.index(stream.len() + 1)).collect();
        points.push(0);
        points.push(stream.len());
        points.sort_unstable();
        let pieces: Vec<&[u8]> = points.windows(2).map(|w| &stream[w[0]..w[1]]).collect();

        let (records, finished) = decode_all(&pieces, 300);
        prop_assert_eq!(&records, &bodies);
        prop_assert_eq!(finished, Ok(()));

        let mut reader = RecordReader::new(300);
        let mut got = Vec::new();
        for piece in &pieces {
            reader.feed(piece).unwrap();
            while let Some(record) = reader.next_record() {
                got.push(record);
            }
        }
        prop_assert_eq!(reader.finish(), Ok(()));
        prop_assert_eq!(&got, &bodies);

        let read: Result<Vec<_>, _> = Records::new(&stream[..], 300).collect();
        prop_assert_eq!(&read.unwrap(), &bodies);
    }

    /// Arbitrary bytes never panic, and whatever decodes obeys the event grammar.
    #[test]
    fn arbitrary_input_is_safe(
        data in prop::collection::vec(any::<u8>(), 0..200),
        split in 1usize..17,
    ) {
        let pieces: Vec<&[u8]> = data.chunks(split).collect();
        let _ = decode_all(&pieces, 64);
    }
}
