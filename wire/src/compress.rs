//! Chunk codecs: none, lz4 (lz4_flex block format) and zstd.
//!
//! Compression happens once per chunk at the relay; every subscriber receives the same bytes.
//! A chunk that does not shrink is sent raw, so a payload is never longer than its raw length.
//! Decompression writes into a buffer of exactly the declared raw length and fails if the payload
//! would produce more or fewer bytes: a decompression bomb costs at most `Limits::max_chunk_raw`.

use std::fmt;

use bytes::Bytes;

use crate::limits::Limits;

/// How a chunk's payload is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Codec {
    /// The payload is the raw bytes.
    None = 0,
    /// lz4 block format (`lz4_flex::block`), without a length prefix.
    Lz4 = 1,
    /// One zstd frame.
    Zstd = 2,
}

impl Codec {
    /// Every codec, in wire order.
    pub const ALL: [Codec; 3] = [Codec::None, Codec::Lz4, Codec::Zstd];

    /// The codec for a wire byte, if known.
    pub fn from_u8(b: u8) -> Option<Codec> {
        match b {
            0 => Some(Codec::None),
            1 => Some(Codec::Lz4),
            2 => Some(Codec::Zstd),
            _ => None,
        }
    }

    /// This codec's bit in a `SessionOpen` accepted-codecs mask.
    pub fn bit(self) -> u8 {
        1 << (self as u8)
    }

    /// The codec's name as used in configuration (`none`, `lz4`, `zstd`).
    pub fn name(self) -> &'static str {
        match self {
            Codec::None => "none",
            Codec::Lz4 => "lz4",
            Codec::Zstd => "zstd",
        }
    }

    /// Parses a configuration name.
    pub fn from_name(s: &str) -> Option<Codec> {
        Codec::ALL.into_iter().find(|c| c.name() == s)
    }
}

impl fmt::Display for Codec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A compressor with reusable state, one per worker thread.
pub struct Compressor {
    codec: Codec,
    zstd: Option<zstd::bulk::Compressor<'static>>,
    scratch: Vec<u8>,
}

impl fmt::Debug for Compressor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Compressor")
            .field("codec", &self.codec)
            .finish()
    }
}

impl Compressor {
    /// A compressor for `codec`; `level` is zstd's level (1 is the default: about 0.5 GB/s per
    /// core and 5-7x on real ledger meta) and is ignored by the other codecs.
    pub fn new(codec: Codec, level: i32) -> Compressor {
        let zstd = match codec {
            // zstd's context creation fails only on allocation failure; fall back to raw then.
            Codec::Zstd => zstd::bulk::Compressor::new(level).ok(),
            _ => None,
        };
        Compressor {
            codec,
            zstd,
            scratch: Vec::new(),
        }
    }

    /// The configured codec.
    pub fn codec(&self) -> Codec {
        self.codec
    }

    /// Compresses `raw`. Returns the codec actually used and the payload: `Codec::None` and the
    /// same `Bytes` (no copy) when compression is off or the result would not be shorter.
    pub fn compress(&mut self, raw: &Bytes) -> (Codec, Bytes) {
        if raw.is_empty() {
            return (Codec::None, raw.clone());
        }
        // The output must be strictly shorter than the input to be worth sending. zstd fails
        // when the output buffer is too small, which is exactly the "does not shrink" case;
        // lz4_flex insists on a buffer of its worst-case size, and the length is checked below.
        let cap = match self.codec {
            Codec::Lz4 => lz4_flex::block::get_maximum_output_size(raw.len()),
            _ => raw.len() - 1,
        };
        self.scratch.clear();
        self.scratch.resize(cap, 0);
        let written = match self.codec {
            Codec::None => None,
            Codec::Lz4 => lz4_flex::block::compress_into(raw, &mut self.scratch).ok(),
            Codec::Zstd => match self.zstd.as_mut() {
                Some(z) => z.compress_to_buffer(&raw[..], &mut self.scratch[..]).ok(),
                None => None,
            },
        };
        match written {
            Some(n) if n < raw.len() => (self.codec, Bytes::copy_from_slice(&self.scratch[..n])),
            _ => (Codec::None, raw.clone()),
        }
    }
}

/// Decompresses `payload` into exactly `raw_len` bytes.
pub fn decompress(
    codec: Codec,
    payload: &[u8],
    raw_len: u32,
    limits: &Limits,
) -> Result<Vec<u8>, CodecError> {
    if raw_len > limits.max_chunk_raw {
        return Err(CodecError::TooLong {
            raw_len,
            max: limits.max_chunk_raw,
        });
    }
    let mut out = vec![0u8; raw_len as usize];
    decompress_into(codec, payload, &mut out)?;
    Ok(out)
}

/// Decompresses `payload` into `out`, which must be filled exactly.
pub fn decompress_into(codec: Codec, payload: &[u8], out: &mut [u8]) -> Result<(), CodecError> {
    let declared = out.len() as u32;
    let mismatch = |got: usize, exceeded: bool| CodecError::LengthMismatch {
        codec,
        declared,
        got: got as u64,
        exceeded,
    };
    match codec {
        Codec::None => {
            if payload.len() != out.len() {
                return Err(mismatch(payload.len(), payload.len() > out.len()));
            }
            out.copy_from_slice(payload);
            Ok(())
        }
        Codec::Lz4 => match lz4_flex::block::decompress_into(payload, out) {
            Ok(n) if n == out.len() => Ok(()),
            Ok(n) => Err(mismatch(n, false)),
            Err(lz4_flex::block::DecompressError::OutputTooSmall { actual, .. }) => {
                Err(mismatch(actual.max(out.len() + 1), true))
            }
            Err(e) => Err(CodecError::Corrupt {
                codec,
                detail: e.to_string(),
            }),
        },
        Codec::Zstd => {
            // A frame that declares a content size larger than the buffer is refused by zstd
            // before decoding; one that does not declare it stops when the buffer is full.
            if let Ok(Some(size)) = zstd::zstd_safe::get_frame_content_size(payload) {
                if size != out.len() as u64 {
                    return Err(CodecError::LengthMismatch {
                        codec,
                        declared,
                        got: size,
                        exceeded: size > out.len() as u64,
                    });
                }
            }
            match zstd::bulk::decompress_to_buffer(payload, out) {
                Ok(n) if n == out.len() => Ok(()),
                Ok(n) => Err(mismatch(n, false)),
                Err(e) => {
                    let detail = e.to_string();
                    if detail.contains("Destination buffer is too small") {
                        Err(mismatch(out.len() + 1, true))
                    } else {
                        Err(CodecError::Corrupt { codec, detail })
                    }
                }
            }
        }
    }
}

/// A chunk payload could not be decompressed into its declared raw length.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    /// The payload is not valid data for its codec.
    #[error("corrupt {codec} payload: {detail}")]
    Corrupt {
        /// Codec of the payload.
        codec: Codec,
        /// What the decoder reported.
        detail: String,
    },
    /// The payload decompresses to another length than declared. Decompression stops at the
    /// declared length, so a decompression bomb ends here without allocating more.
    #[error("{codec} payload decodes to {got} bytes, declared {declared}{}", if *.exceeded { " or more" } else { "" })]
    LengthMismatch {
        /// Codec of the payload.
        codec: Codec,
        /// The declared raw length.
        declared: u32,
        /// Bytes produced before stopping.
        got: u64,
        /// True when decoding stopped because the output would have exceeded `declared`.
        exceeded: bool,
    },
    /// The declared raw length exceeds `Limits::max_chunk_raw`.
    #[error("declared raw length {raw_len} exceeds the limit of {max}")]
    TooLong {
        /// Declared raw length.
        raw_len: u32,
        /// Largest accepted.
        max: u32,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(n: usize) -> Bytes {
        // XDR-like: repeating structure with some variation.
        let mut v = Vec::with_capacity(n);
        let mut x: u32 = 7;
        while v.len() < n {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            v.extend_from_slice(&[0, 0, 0, (x >> 28) as u8, 0, 0, 1, 0]);
        }
        v.truncate(n);
        Bytes::from(v)
    }

    fn noise(n: usize) -> Bytes {
        let mut v = vec![0u8; n];
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for b in v.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        Bytes::from(v)
    }

    #[test]
    fn round_trip_each_codec() {
        let limits = Limits::default();
        let raw = sample(256 << 10);
        for codec in Codec::ALL {
            let mut c = Compressor::new(codec, 1);
            let (used, payload) = c.compress(&raw);
            if codec == Codec::None {
                assert_eq!(used, Codec::None);
            } else {
                assert_eq!(used, codec, "compressible data must compress");
                assert!(payload.len() < raw.len() / 2);
            }
            let back = decompress(used, &payload, raw.len() as u32, &limits).unwrap();
            assert_eq!(back, raw);
        }
    }

    #[test]
    fn incompressible_goes_raw_without_copy() {
        let raw = noise(64 << 10);
        for codec in Codec::ALL {
            let (used, payload) = Compressor::new(codec, 1).compress(&raw);
            assert_eq!(used, Codec::None);
            assert_eq!(
                payload.as_ptr(),
                raw.as_ptr(),
                "raw fallback shares the bytes"
            );
        }
    }

    #[test]
    fn empty_chunk_is_raw() {
        let (used, payload) = Compressor::new(Codec::Zstd, 1).compress(&Bytes::new());
        assert_eq!(used, Codec::None);
        assert!(payload.is_empty());
    }

    #[test]
    fn bombs_and_short_outputs_are_refused() {
        let limits = Limits::default();
        let raw = Bytes::from(vec![0u8; 1 << 20]);
        for codec in [Codec::Lz4, Codec::Zstd] {
            let (used, payload) = Compressor::new(codec, 1).compress(&raw);
            assert_eq!(used, codec);
            // Declared shorter than the real content: a bomb. Must stop at the declared length.
            let err = decompress(codec, &payload, 1000, &limits).unwrap_err();
            assert!(
                matches!(err, CodecError::LengthMismatch { exceeded: true, .. }),
                "{codec}: {err}"
            );
            // Declared longer than the real content.
            let err = decompress(codec, &payload, (1 << 20) + 10, &limits).unwrap_err();
            assert!(
                matches!(
                    err,
                    CodecError::LengthMismatch {
                        exceeded: false,
                        ..
                    }
                ),
                "{codec}: {err}"
            );
        }
        let err = decompress(Codec::None, &[1, 2, 3], 2, &limits).unwrap_err();
        assert!(matches!(err, CodecError::LengthMismatch { .. }));
        let err = decompress(Codec::Zstd, &[], limits.max_chunk_raw + 1, &limits).unwrap_err();
        assert!(matches!(err, CodecError::TooLong { .. }));
    }

    #[test]
    fn zstd_bomb_without_content_size_stops_at_buffer() {
        // A streaming-encoded frame does not declare its content size.
        let big = vec![0u8; 8 << 20];
        let mut enc = zstd::stream::Encoder::new(Vec::new(), 1).unwrap();
        enc.include_contentsize(false).unwrap();
        std::io::Write::write_all(&mut enc, &big).unwrap();
        let payload = enc.finish().unwrap();
        let err = decompress(Codec::Zstd, &payload, 4096, &Limits::default()).unwrap_err();
        assert!(
            matches!(err, CodecError::LengthMismatch { exceeded: true, .. }),
            "{err}"
        );
    }

    #[test]
    fn garbage_is_a_typed_error() {
        let limits = Limits::default();
        for codec in [Codec::Lz4, Codec::Zstd] {
            for junk in [&b"\xff\xff\xff\xff\xff"[..], b"", b"\x28\xb5\x2f\xfd\x00"] {
                assert!(decompress(codec, junk, 100, &limits).is_err());
            }
        }
    }

    #[test]
    fn codec_names_and_bits() {
        for c in Codec::ALL {
            assert_eq!(Codec::from_name(c.name()), Some(c));
            assert_eq!(Codec::from_u8(c as u8), Some(c));
        }
        assert_eq!(Codec::from_u8(3), None);
        assert_eq!(Codec::Zstd.bit(), 4);
    }
}
