//! The byte-level half of the fast walk's JSON reader ([`super::json`]): finding the next quote,
//! backslash or control character in a string ([`find_special`], a window's bit mask
//! [`special_bits`]), copying the pieces between escapes and unescaping each escape. The scanner's
//! string reading (`Scanner::unescape`) drives these; nothing here knows about JSON values.

use serde::de;
use std::fmt;

/// The scanner gave up: the caller reads the body with serde_json instead (no message: serde_json's is
/// the one reported).
#[derive(Debug)]
pub(super) struct Bail;

impl fmt::Display for Bail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("fast walk gave up")
    }
}

impl std::error::Error for Bail {}

impl de::Error for Bail {
    #[cold]
    fn custom<T: fmt::Display>(_msg: T) -> Bail {
        Bail
    }
}

pub(super) type Res<T> = Result<T, Bail>;

/// Copies the bytes `rel..k` of the window `w` (`rel` ≤ `k` ≤ 64, `rel` < 64) to `tmp` at `o`
/// (< [`HELD`]) as a block of 16 bytes or, if longer, of 64; the index after them in `tmp`.
#[inline(always)]
pub(super) fn piece(
    w: &[u8; 2 * WINDOW],
    rel: usize,
    k: usize,
    tmp: &mut [u8; TMP],
    o: usize,
) -> usize {
    let len = k - rel;
    let from = rel & (WINDOW - 1);
    let to = o & (HELD - 1);
    if len <= PIECE {
        if let (Some(src), Some(dst)) = (w.get(from..from + PIECE), tmp.get_mut(to..to + PIECE)) {
            dst.copy_from_slice(src);
        }
    } else if let (Some(src), Some(dst)) =
        (w.get(from..from + WINDOW), tmp.get_mut(to..to + WINDOW))
    {
        dst.copy_from_slice(src);
    }
    o + len
}

/// [`piece`], then the byte `simple` (an escape's) after the piece's bytes: the index after it in
/// `tmp`. A piece of up to 16 bytes (most) and its byte are written from one masked index.
#[inline(always)]
pub(super) fn piece_then(
    w: &[u8; 2 * WINDOW],
    rel: usize,
    k: usize,
    tmp: &mut [u8; TMP],
    o: usize,
    simple: u8,
) -> usize {
    let len = k - rel;
    let to = o & (HELD - 1);
    if len <= PIECE {
        // Read from `rel` unmasked: where the caller bounds it (≤ 66), the bound check goes.
        if let (Some(src), Some(dst)) = (w.get(rel..rel + PIECE), tmp.get_mut(to..=to + PIECE)) {
            if let Some(block) = dst.first_chunk_mut::<PIECE>() {
                block.copy_from_slice(src);
            }
            if let Some(slot) = dst.get_mut(len) {
                *slot = simple;
            }
        }
    } else {
        let from = rel & (WINDOW - 1);
        if let (Some(src), Some(dst)) = (w.get(from..from + WINDOW), tmp.get_mut(to..to + WINDOW)) {
            dst.copy_from_slice(src);
        }
        if let Some(slot) = tmp.get_mut((o + len) & (HELD - 1)) {
            *slot = simple;
        }
    }
    o + len + 1
}

/// Bytes [`Scanner::unescape`] looks at in one step.
pub(super) const WINDOW: usize = 64;

/// Bytes [`copy`] copies at once.
pub(super) const PIECE: usize = 16;

/// Bytes the stack array that [`Scanner::unescape`] writes to in windows holds at most before it is
/// flushed (a power of two: its index is masked by `HELD - 1`).
pub(super) const HELD: usize = 2 * WINDOW;

/// Size of that array: a window's block past what it holds.
pub(super) const TMP: usize = HELD + WINDOW;

/// Appends `tmp[..o]` to `out` (`o` ≤ [`HELD`]); `o` back to 0. Where `out` has room for that
/// many bytes, all are copied (a copy of a fixed size, without a call), then cut back.
#[inline(always)]
pub(super) fn flush(tmp: &[u8; TMP], o: &mut usize, out: &mut Vec<u8>) {
    let end = out.len() + *o;
    if out.capacity() - out.len() >= HELD && *o <= HELD {
        out.extend_from_slice(tmp.get(..HELD).unwrap_or_default());
        out.truncate(end);
    } else {
        out.extend_from_slice(tmp.get(..*o).unwrap_or_default());
    }
    *o = 0;
}

/// Bit `k` set when byte `k` of the window is a quote, a backslash or below 0x20: where the target
/// has vector instructions from the bytes compared one by one (compilers turn that into 16-byte
/// compares), else eight at a time in words.
#[inline(always)]
pub(super) fn special_bits(window: &[u8; WINDOW]) -> u64 {
    if VECTOR_SCAN {
        special_bits_bytes(window)
    } else {
        special_bits_words(window)
    }
}

/// [`special_bits`] from byte compares (each special byte all ones, compilers turn that into 16-byte
/// compares), byte `8b + j` of the window then as bit `b` of byte `j` of one word (a mask and an OR
/// a word of eight bytes), whose 8 × 8 bits are transposed ([`transposed`]): fewer instructions
/// than a multiplication that gathers each word's eight marks.
#[inline(always)]
pub(super) fn special_bits_bytes(window: &[u8; WINDOW]) -> u64 {
    let mut marked = [0u8; WINDOW];
    for (m, &b) in marked.iter_mut().zip(window) {
        *m = 0u8.wrapping_sub(u8::from((b == b'"') | (b == b'\\') | (b < 0x20)));
    }
    // Byte `j` of word `b` (the window's byte `8b + j`) as bit `b` of byte `j`.
    let mut bits = 0u64;
    for (b, chunk) in marked.chunks_exact(8).enumerate() {
        bits |= word(chunk) & (ONES << b);
    }
    transposed(bits)
}

/// The 8 × 8 bit matrix of `x` (byte `j` a row, bit `b` of it a column) transposed: bit `b` of byte
/// `j` becomes bit `j` of byte `b` (three rounds of swapped blocks, Hacker's Delight's `transpose8`).
#[inline(always)]
fn transposed(mut x: u64) -> u64 {
    let t = (x ^ (x >> 7)) & 0x00AA_00AA_00AA_00AA;
    x ^= t ^ (t << 7);
    let t = (x ^ (x >> 14)) & 0x0000_CCCC_0000_CCCC;
    x ^= t ^ (t << 14);
    let t = (x ^ (x >> 28)) & 0x0000_0000_F0F0_F0F0;
    x ^ t ^ (t << 28)
}

/// [`special_bits`] from words of eight bytes ([`special_exact`]).
#[inline(always)]
pub(super) fn special_bits_words(window: &[u8; WINDOW]) -> u64 {
    let mut bits = 0u64;
    for (k, chunk) in window.chunks_exact(8).enumerate() {
        bits |= gathered(special_exact(word(chunk))) << (8 * k);
    }
    bits
}

/// The high bit of each byte of `high` (the only bits set) as the eight low bits, byte `j`'s as bit
/// `j`: gathered into the top byte by one multiplication (each bit lands on its own position, so
/// nothing carries).
#[inline(always)]
fn gathered(high: u64) -> u64 {
    high.wrapping_mul(0x0002_0408_1020_4081) >> 56
}

/// Of the special bytes at the bits of `special` (none escaped by a backslash before the first bit),
/// those where an escape would begin if each were a backslash: in a run of them, every second one
/// from the run's first. Found for all runs at once by one subtraction whose borrow runs through
/// each run (simdjson's test for odd runs of backslashes).
#[inline(always)]
pub(super) fn escapes(special: u64) -> u64 {
    const ODD: u64 = 0xAAAA_AAAA_AAAA_AAAA;
    (((special << 1) | ODD).wrapping_sub(special) ^ ODD) & special
}

/// High bit set in exactly the bytes of `x` that are a quote, a backslash or below 0x20.
#[inline(always)]
fn special_exact(x: u64) -> u64 {
    const LOW7: u64 = ONES * 0x7F;
    // The low seven bits of each byte: sums of them and 0x7F or 0x60 stay within the byte. The
    // high bit of `(t ^ c) + LOW7` is set iff `t` ≠ `c`; that of `t + 0x60` iff `t` ≥ 0x20.
    let t = x & LOW7;
    let quote = (t ^ (ONES * u64::from(b'"'))) + LOW7;
    let backslash = (t ^ (ONES * u64::from(b'\\'))) + LOW7;
    let at_least_space = t + ONES * 0x60;
    // A byte with its high bit set is none of them.
    !((quote & backslash & at_least_space) | x) & HI
}

/// Appends `bytes[r..at]` to `out`.
#[inline(always)]
pub(super) fn copy(bytes: &[u8], r: usize, at: usize, out: &mut Vec<u8>) -> Res<()> {
    let len = at - r;
    match bytes.get(r..r + PIECE) {
        // A short piece (most, in code and JSON): one fixed-size copy, cut back.
        Some(src) if len <= PIECE => {
            let end = out.len() + len;
            out.extend_from_slice(src);
            out.truncate(end);
        }
        _ => match bytes.get(r..r + LONG_PIECE) {
            // Up to 128 bytes (a line of prose between line breaks): one fixed-size copy too,
            // without a `memcpy` call. `out` has the room: [`Scanner::unescape`] reserves the rest of
            // the body from the string's start and 16 bytes more, and this reads no further.
            Some(src) if len <= LONG_PIECE => {
                let end = out.len() + len;
                out.extend_from_slice(src);
                out.truncate(end);
            }
            _ => out.extend_from_slice(bytes.get(r..at).ok_or(Bail)?),
        },
    }
    Ok(())
}

/// Bytes [`copy`] copies at once when a piece is longer than [`PIECE`].
const LONG_PIECE: usize = 8 * PIECE;

/// The escape at `r` (a backslash) unescaped onto `out`; the index after it.
#[inline(always)]
pub(super) fn unescape_one(bytes: &[u8], r: usize, out: &mut Vec<u8>) -> Res<usize> {
    let code = *bytes.get(r + 1).ok_or(Bail)?;
    let simple = ESCAPES.get(usize::from(code)).copied().unwrap_or(0);
    if simple != 0 {
        out.push(simple);
        Ok(r + 2)
    } else if code == b'u' {
        let (c, len) = unicode_escape(bytes, r)?;
        out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
        Ok(r + len)
    } else {
        Err(Bail)
    }
}

/// Unescaped byte of each simple escape (`\"`, `\\`, `\/`, `\b`, `\f`, `\n`, `\r`, `\t`); 0 for the rest.
#[allow(clippy::indexing_slicing)] // compile time: out of range fails the build
pub(super) static ESCAPES: [u8; 256] = {
    let mut t = [0u8; 256];
    t[b'"' as usize] = b'"';
    t[b'\\' as usize] = b'\\';
    t[b'/' as usize] = b'/';
    t[b'b' as usize] = 0x08;
    t[b'f' as usize] = 0x0C;
    t[b'n' as usize] = b'\n';
    t[b'r' as usize] = b'\r';
    t[b't' as usize] = b'\t';
    t
};

/// The four hex digits at `at` as a number (the body rewriter's reading).
#[inline(always)]
fn hex4(bytes: &[u8], at: usize) -> Res<u32> {
    crate::rewrite::hex4(bytes, at).ok_or(Bail)
}

/// The `\uXXXX` escape at `at` (or a surrogate pair of two): its character and length in bytes. A
/// lone surrogate fails (serde_json rejects it in a checked string; in a raw one it would not be UTF-8).
fn unicode_escape(bytes: &[u8], at: usize) -> Res<(char, usize)> {
    let hi = hex4(bytes, at + 2)?;
    let (cp, len) = match hi {
        0xD800..=0xDBFF => {
            if bytes.get(at + 6..at + 8) != Some(b"\\u") {
                return Err(Bail);
            }
            let lo = hex4(bytes, at + 8)?;
            if !(0xDC00..=0xDFFF).contains(&lo) {
                return Err(Bail);
            }
            (0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00), 12)
        }
        _ => (hi, 6),
    };
    // None for a lone trailing surrogate.
    Ok((char::from_u32(cp).ok_or(Bail)?, len))
}

const ONES: u64 = 0x0101_0101_0101_0101;
pub(super) const HI: u64 = 0x8080_8080_8080_8080;

/// Eight bytes as a little-endian word.
#[inline(always)]
fn word(chunk: &[u8]) -> u64 {
    <[u8; 8]>::try_from(chunk).map_or(0, u64::from_le_bytes)
}

/// High bit set in the lowest byte of `w` that is a quote, a backslash or below 0x20 (and perhaps in
/// higher bytes: only the lowest set bit is exact); 0 if there is none.
#[inline(always)]
pub(super) fn special_mask(w: u64) -> u64 {
    let zero = |x: u64| x.wrapping_sub(ONES) & !x;
    (zero(w ^ (ONES * u64::from(b'"')))
        | zero(w ^ (ONES * u64::from(b'\\')))
        | (w.wrapping_sub(ONES * 0x20) & !w))
        & HI
}

/// Index of the first quote, backslash or control character from `at` (`bytes.len()` if none).
#[inline(always)]
pub(super) fn find_special(bytes: &[u8], at: usize) -> usize {
    let rest = bytes.get(at..).unwrap_or_default();
    // Most strings (keys, tags, roles) end within eight bytes.
    if let Some(first) = rest.first_chunk::<8>() {
        let m = special_mask(u64::from_le_bytes(*first));
        if m != 0 {
            return at + (m.trailing_zeros() / 8) as usize;
        }
    }
    let mut i = at;
    // Long strings: 64 bytes at a time by a test that compilers turn into a few vector instructions
    // where the target has them (SSE2 and NEON are part of x86_64 and aarch64). On other targets (wasm32
    // without simd128) it would be a loop over bytes, so there the words below do all the work.
    // Written as an OR of byte comparisons, the block's answer is one `pmovmskb` (x86_64) rather
    // than a minimum reduced across the vector.
    let mut blocks = rest.chunks_exact(if VECTOR_SCAN { 64 } else { usize::MAX });
    for block in &mut blocks {
        if block.iter().fold(false, |any, &b| {
            any | (b == b'"') | (b == b'\\') | (b < 0x20)
        }) {
            break;
        }
        i += 64;
    }
    let mut chunks = rest.get(i - at..).unwrap_or_default().chunks_exact(8);
    for chunk in &mut chunks {
        let m = special_mask(word(chunk));
        if m != 0 {
            return i + (m.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    for &b in chunks.remainder() {
        if b == b'"' || b == b'\\' || b < 0x20 {
            return i;
        }
        i += 1;
    }
    i
}

/// Whether [`find_special`] first tests blocks of 64 bytes (see there).
const VECTOR_SCAN: bool = cfg!(any(target_arch = "x86_64", target_arch = "aarch64"));
