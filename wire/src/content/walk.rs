//! The bounded XDR cursor the generated skippers in [`super::schema`] run on.
//!
//! Every read is checked against the bytes that remain, every count against its schema bound
//! and against what the remaining bytes could hold, and recursion against [`MAX_DEPTH`]; it
//! never allocates. Errors are built out of line (`#[cold]`): the walker's hot path is
//! reading lengths and discriminants and skipping the bytes between them.

use crate::header::Malformation;

/// Nesting depth of recursive types (SCVal inside SCVal, ClaimPredicate, authorization trees,
/// quorum sets) beyond which a ledger is refused; each level of such a type counts one.
///
/// 200: Soroban reads and writes XDR with a depth limit of 500, counted the way `stellar-xdr`
/// counts, one per type read: an SCVal inside a vector costs it 4 (SCVal, the optional, SCVec,
/// the array), inside a map 5, so nothing core wrote nests values more than 125 levels (100 in
/// maps, which count 2 here), and core refuses quorum sets nested more than 4 deep. And the
/// bound keeps the stack small: a level takes about 200 bytes in a release build, about 4 KiB
/// in a debug build, where 200 levels fit a 2 MiB thread stack with room to spare.
pub const MAX_DEPTH: u32 = 200;

/// Why the walk stopped: the XDR type being read, where, and what was wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stop {
    pub(crate) ty: &'static str,
    pub(crate) offset: usize,
    /// `None`: the input ended inside the type.
    pub(crate) problem: Option<Malformation>,
}

/// What every skipper returns.
pub(crate) type Step = Result<(), Stop>;

/// A position in a `LedgerCloseMeta`.
pub(crate) struct Walker<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Walker<'a> {
    pub(crate) fn new(buf: &'a [u8], pos: usize) -> Walker<'a> {
        Walker { buf, pos }
    }

    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    #[cold]
    #[inline(never)]
    fn truncated(&self, ty: &'static str) -> Stop {
        Stop {
            ty,
            offset: self.pos,
            problem: None,
        }
    }

    #[cold]
    #[inline(never)]
    fn bad(&self, ty: &'static str, offset: usize, problem: Malformation) -> Stop {
        Stop {
            ty,
            offset,
            problem: Some(problem),
        }
    }

    /// Skips `n` bytes of fixed-size fields of `ty`.
    #[inline]
    pub(crate) fn skip(&mut self, n: usize, ty: &'static str) -> Step {
        if n > self.remaining() {
            return Err(self.truncated(ty));
        }
        self.pos += n;
        Ok(())
    }

    /// Reads a 4-byte big-endian word.
    #[inline]
    pub(crate) fn word(&mut self, ty: &'static str) -> Result<u32, Stop> {
        match self.buf.get(self.pos..self.pos + 4) {
            Some(b) => {
                self.pos += 4;
                Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
            }
            None => Err(self.truncated(ty)),
        }
    }

    /// Reads a union discriminant (an XDR int).
    #[inline]
    pub(crate) fn tag(&mut self, ty: &'static str) -> Result<i32, Stop> {
        self.word(ty).map(|w| w as i32)
    }

    /// The error for the discriminant just read.
    #[cold]
    #[inline(never)]
    pub(crate) fn unknown_tag(&self, ty: &'static str, tag: i32) -> Stop {
        self.bad(
            ty,
            self.pos - 4,
            Malformation::UnknownDiscriminant { tag: tag as u32 },
        )
    }

    /// Reads an enum value and checks it is a member.
    #[inline]
    pub(crate) fn enumeration(&mut self, ty: &'static str, member: fn(i32) -> bool) -> Step {
        let v = self.tag(ty)?;
        if member(v) {
            Ok(())
        } else {
            Err(self.unknown_tag(ty, v))
        }
    }

    /// Reads an XDR bool: 0 or 1, as a decoder insists.
    #[inline]
    pub(crate) fn boolean(&mut self, ty: &'static str) -> Result<bool, Stop> {
        match self.word(ty)? {
            0 => Ok(false),
            1 => Ok(true),
            value => Err(self.bad(ty, self.pos - 4, Malformation::InvalidBool { value })),
        }
    }

    /// Reads an optional's presence flag.
    #[inline]
    pub(crate) fn present(&mut self, ty: &'static str) -> Result<bool, Stop> {
        self.boolean(ty)
    }

    /// Reads a length of at most `max` that the remaining input can hold `unit` bytes at a
    /// time, and returns it.
    #[inline]
    fn length(&mut self, max: u32, unit: usize, ty: &'static str) -> Result<usize, Stop> {
        let offset = self.pos;
        let len = self.word(ty)?;
        if len > max {
            return Err(self.bad(ty, offset, Malformation::TooLong { len, max }));
        }
        // u32 fits usize on every target this builds for (32 and 64 bits).
        let len = len as usize;
        if len > self.remaining() / unit.max(1) {
            return Err(self.truncated(ty));
        }
        Ok(len)
    }

    /// Reads the count of a variable-length array whose elements take at least `min` bytes.
    #[inline]
    pub(crate) fn count(&mut self, max: u32, min: usize, ty: &'static str) -> Result<u32, Stop> {
        // `length` bounds it by `max`, a u32.
        self.length(max, min, ty).map(|n| n as u32)
    }

    /// Skips a variable-length array of fixed-size elements that need no check.
    #[inline]
    pub(crate) fn plain_array(&mut self, max: u32, size: usize, ty: &'static str) -> Step {
        let n = self.length(max, size, ty)?;
        // `length` checked n * size <= remaining.
        self.pos += n * size;
        Ok(())
    }

    /// Skips variable-length opaque data or a string of at most `max` bytes, and checks that
    /// its padding is zero.
    #[inline]
    pub(crate) fn opaque(&mut self, max: u32, ty: &'static str) -> Step {
        let len = self.length(max, 1, ty)?;
        self.pos += len;
        self.padding(len, ty)
    }

    #[inline]
    fn padding(&mut self, len: usize, ty: &'static str) -> Step {
        let pad = (4 - len % 4) % 4;
        if pad == 0 {
            return Ok(());
        }
        let offset = self.pos;
        match self.buf.get(offset..offset + pad) {
            Some(p) if p.iter().all(|&b| b == 0) => {
                self.pos += pad;
                Ok(())
            }
            Some(_) => Err(self.bad(ty, offset, Malformation::NonZeroPadding)),
            None => Err(self.truncated(ty)),
        }
    }

    /// One level deeper into a recursive type: refused past [`MAX_DEPTH`].
    #[inline]
    pub(crate) fn deeper(&self, depth: u32, ty: &'static str) -> Result<u32, Stop> {
        if depth >= MAX_DEPTH {
            return Err(self.bad(ty, self.pos, Malformation::TooDeep { max: MAX_DEPTH }));
        }
        Ok(depth + 1)
    }
}
