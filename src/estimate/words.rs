//! Words that are one o200k_base token: a membership filter over words of the vocabulary.
//!
//! Per-character and word-length rates cannot tell a frequent long word (` information`, one o200k
//! token) from a rare one of the same length (` informatics`, two), nor a common Russian or
//! Vietnamese word from a rare one; o200k can, because it has the frequent ones as tokens. The
//! estimator asks this filter, for each word it reads (ASCII words of [`MIN_ASCII`] letters or more,
//! words with accented Latin letters and runs of the alphabetic scripts of two letters or more, at
//! most [`MAX_WORD`] bytes), whether the word with its leading space — or without one, when no space
//! comes before it — is a token of o200k; a known word counts as one (the `*_known*` features)
//! instead of by its length and letters.
//!
//! The filter is an 8-bit xor filter (Graf and Lemire, "Xor Filters: Faster and Smaller Than Bloom
//! and Cuckoo Filters", 2020): [`FINGERPRINTS`] holds three blocks of [`BLOCK`] bytes; a word's 64-bit
//! hash picks one byte in each block, and the word is known iff the three bytes xor to the hash's
//! fingerprint byte. Each word in the set is found (no false negatives); a word that is not is found
//! with probability 1/256 (a multi-token word then counts as one). It costs about 1.23 bytes per
//! word, and a lookup is one hash of at most four 8-byte loads and three independent byte reads.
//!
//! The words, their hash seed and the table are written by `examples/gen-word-table.rs` from
//! tiktoken-rs' o200k_base (which words it takes, by script and rank, is documented there and in
//! `docs/estimator.md`); the tests check the table against the vocabulary.
//!
//! A word of five ASCII letters or more that the table does not know is also read for its rare
//! letter pairs ([`rare_pairs`]: pairs that few o200k tokens hold, from a generated bitmap), where
//! o200k splits random letter strings into short pieces.
//!
//! The Greek words of the table are also in a small Bloom filter ([`greek_maybe`]) whose hash is
//! built one letter at a time ([`greek_step`]), so that every prefix and suffix of an unknown Greek
//! word is asked for in one pass each (see `greek_pieces` in `scripts.rs`).

use super::words_table::{BLOCK, FINGERPRINTS, GREEK_PIECE_BITS, RARE_PAIR, SEED, SHORT_WORD_BITS};

/// Longest word looked up, in bytes (longer words are never known).
pub const MAX_WORD: usize = 32;
/// Fewest letters of a word of plain ASCII letters that is looked up (shorter words are nearly all
/// one token; their length features say so).
pub const MIN_ASCII: usize = 5;

const K0: u64 = 0x9E37_79B9_7F4A_7C15;
const K1: u64 = 0xBF58_476D_1CE4_E5B9;
const K2: u64 = 0x94D0_49BB_1331_11EB;

/// The eight bytes of `bytes` at `at` as a little-endian word, zeros past the end.
#[inline(always)]
pub(super) fn load(bytes: &[u8], at: usize) -> u64 {
    match bytes.get(at..at.saturating_add(8)) {
        Some(c) => u64::from_le_bytes(<[u8; 8]>::try_from(c).unwrap_or([0; 8])),
        None => load_tail(bytes, at),
    }
}

/// [`load`] within eight bytes of the end.
#[cold]
#[inline(never)]
fn load_tail(bytes: &[u8], at: usize) -> u64 {
    let mut buf = [0u8; 8];
    for (d, s) in buf.iter_mut().zip(bytes.get(at..).unwrap_or(&[])) {
        *d = *s;
    }
    u64::from_le_bytes(buf)
}

/// One 8-byte chunk into the hash state.
#[inline(always)]
fn mix(h: u64, chunk: u64) -> u64 {
    let h = (h ^ chunk).wrapping_mul(K1);
    h ^ (h >> 29)
}

/// The end of the hash (a finalizer in the manner of MurmurHash3's).
#[inline(always)]
fn finish(h: u64) -> u64 {
    let h = (h ^ (h >> 32)).wrapping_mul(K2);
    h ^ (h >> 29)
}

/// The hash state before the chunks of a word of `len` bytes (`space`: with a leading space).
#[inline(always)]
const fn start(seed: u64, len: usize, space: bool) -> u64 {
    seed ^ (((len as u64) << 1) | space as u64).wrapping_mul(K0)
}

/// Hash of the word `bytes[from..to]` (1..=[`MAX_WORD`] bytes), with a leading space or not, under
/// `seed`: a word of up to eight bytes as one chunk masked to the word; a longer one as its eight-byte
/// chunks from the start, the last chunk ending where the word ends (overlapping the one before it).
#[doc(hidden)]
#[inline(always)]
pub fn word_hash(bytes: &[u8], from: usize, to: usize, space: bool, seed: u64) -> u64 {
    let len = to.saturating_sub(from);
    let h = start(seed, len, space);
    let h = if len <= 8 {
        mix(h, load(bytes, from) & mask(len))
    } else {
        // `from + 16 < to` and `to - 8 >= from` where used: the loads are within the word.
        let mut h = mix(h, load(bytes, from));
        if len > 16 {
            h = mix(h, load(bytes, from + 8));
        }
        if len > 24 {
            h = mix(h, load(bytes, from + 16));
        }
        mix(h, load(bytes, to - 8))
    };
    finish(h)
}

/// The low `len` bytes of a word set (1..=8; 0 is taken as 1).
#[inline(always)]
fn mask(len: usize) -> u64 {
    u64::MAX >> (64 - 8 * len.clamp(1, 8))
}

/// [`start`] under [`SEED`] of the words of 0..=[`MAX_WORD`] bytes, at `len << 1 | space` (one
/// load instead of a multiplication).
static START: [u64; 2 * MAX_WORD + 2] = {
    let mut t = [0u64; 2 * MAX_WORD + 2];
    let mut k = 0;
    while k < t.len() {
        #[allow(clippy::indexing_slicing)] // compile time: out of range fails the build
        {
            t[k] = start(SEED, k >> 1, k & 1 != 0);
        }
        k += 1;
    }
    t
};

/// [`word_hash`] under [`SEED`] of the word of `len` (1..=8) bytes that are the low ones of `w`
/// (the bytes above them need not be zero): the same hash, its start and mask from tables
/// ([`START`], [`SHORT_MASK`]).
#[inline(always)]
fn short_hash_masked(w: u64, len: usize, space: bool) -> u64 {
    let at = len << 1 | usize::from(space);
    let h = START.get(at).copied().unwrap_or(0);
    let word = w & SHORT_MASK.get(len).copied().unwrap_or(0);
    finish(mix(h, word))
}

/// The low `len` bytes set, at `len` (0..=8).
static SHORT_MASK: [u64; 9] = {
    let mut t = [0u64; 9];
    let mut k = 1;
    while k < 9 {
        #[allow(clippy::indexing_slicing)] // compile time: out of range fails the build
        {
            t[k] = u64::MAX >> (64 - 8 * k);
        }
        k += 1;
    }
    t
};

/// The three bytes of a filter with blocks of `block` bytes that hash `h` picks, and its
/// fingerprint.
#[doc(hidden)]
#[inline(always)]
pub fn word_slots(h: u64, block: usize) -> ([usize; 3], u8) {
    let reduce = |x: u64| (((x & 0xFFFF_FFFF) * block as u64) >> 32) as usize;
    (
        [
            reduce(h),
            block + reduce(h.rotate_left(21)),
            2 * block + reduce(h.rotate_left(42)),
        ],
        (h ^ (h >> 32)) as u8,
    )
}

/// Whether hash `h` is in the filter.
#[inline(always)]
fn has(h: u64) -> bool {
    let ([a, b, c], fp) = word_slots(h, BLOCK);
    let at = |i: usize| FINGERPRINTS.get(i).copied().unwrap_or(0);
    at(a) ^ at(b) ^ at(c) == fp
}

/// Whether the word `bytes[from..to]`, after a space if `space`, is one o200k token (see the module
/// documentation); false for an empty word or one longer than [`MAX_WORD`] bytes.
#[inline(always)]
pub(super) fn known(bytes: &[u8], from: usize, to: usize, space: bool) -> bool {
    let len = to.wrapping_sub(from);
    (1..=MAX_WORD).contains(&len) && has(word_hash(bytes, from, to, space, SEED))
}

/// [`known`] with the hash's start from a table and no bounds checks left on a long word's chunks
/// ([`known_hash`]), for `scan_alpha` (`scripts.rs`). The other callers keep [`known`]: with this
/// one in its place `scan_cjk`'s lookup went inline and Japanese took 12 % more instructions (Thai
/// and the ASCII words 2 to 10 % fewer).
#[inline(always)]
pub(super) fn known_run(bytes: &[u8], from: usize, to: usize, space: bool) -> bool {
    match bytes.get(from..to) {
        Some(word) if (1..=MAX_WORD).contains(&word.len()) => {
            has(known_hash(bytes, from, word, space))
        }
        _ => false,
    }
}

/// [`word_hash`] under [`SEED`] of `word` (1..=[`MAX_WORD`] bytes, `bytes[from..]`): the same hash,
/// its start from [`START`], a short word's mask from [`SHORT_MASK`], a longer one's chunks from
/// the word itself (no bounds checks left: its length is known).
#[inline(always)]
fn known_hash(bytes: &[u8], from: usize, word: &[u8], space: bool) -> u64 {
    let len = word.len();
    let h = START
        .get(len << 1 | usize::from(space))
        .copied()
        .unwrap_or(0);
    let chunk = |at: usize| {
        word.get(at..)
            .and_then(<[u8]>::first_chunk::<8>)
            .map_or(0, |c| u64::from_le_bytes(*c))
    };
    let h = if len <= 8 {
        let mask = SHORT_MASK.get(len).copied().unwrap_or(0);
        mix(h, load(bytes, from) & mask)
    } else {
        let mut h = mix(h, chunk(0));
        if len > 16 {
            h = mix(h, chunk(8));
        }
        if len > 24 {
            h = mix(h, chunk(16));
        }
        let last = word.last_chunk::<8>().map_or(0, |c| u64::from_le_bytes(*c));
        mix(h, last)
    };
    finish(h)
}

/// [`known`] for a word of 1..=8 bytes that are the low bytes of `w` (whatever comes after them).
#[inline(always)]
pub(super) fn known_low(w: u64, len: usize, space: bool) -> bool {
    has(short_hash_masked(w, len, space))
}

/// The bit of [`SHORT_WORD_BITS`] of a word of three or four lower-case ASCII letters, `x` its
/// bytes (little-endian, zeros above them): (word of 64 bits, bit in it).
#[doc(hidden)]
#[inline(always)]
pub fn short_slot(x: u64) -> (usize, u64) {
    let h = x.wrapping_mul(K1) >> (64 - SHORT_BITS_LOG);
    ((h >> 6) as usize, 1u64 << (h & 63))
}

/// log2 of the bits of [`SHORT_WORD_BITS`].
#[doc(hidden)]
pub const SHORT_BITS_LOG: u32 = 17;

/// Whether the word of `len` (3 or 4) lower-case ASCII letters at the low bytes of `w` may be one
/// o200k token after a space (` the`, ` json`): [`SHORT_WORD_BITS`] holds the 11,086 such tokens
/// in 131,072 bits (8 % of the other words of three or four letters are taken for one). A word it
/// does not hold is two tokens or more (random words of three letters are 1.8 on average, of four
/// 2.2), which the word's length alone would cost one.
#[inline(always)]
pub(super) fn short_known(w: u64, len: usize) -> bool {
    // The low three or four bytes (a mask by shift, no table).
    let x = w & (0xFFFF_FFFF >> (8 * (4usize.saturating_sub(len) & 3)));
    let h = (x.wrapping_mul(K1) >> (64 - SHORT_BITS_LOG)) as usize;
    SHORT_WORD_BITS
        .get((h >> 6) & (SHORT_WORD_BITS.len() - 1))
        .is_some_and(|b| (b >> (h & 63)) & 1 != 0)
}

/// [`RARE_PAIR`]'s row of every byte (row `b & 31` at `b`): a byte's row without the `& 31`, and
/// an index the compiler knows to be in bounds.
static RARE_ROW: [u32; 256] = {
    let mut rows = [0u32; 256];
    let mut b = 0;
    while b < 256 {
        #[allow(clippy::indexing_slicing)] // compile time: out of range fails the build
        {
            rows[b] = RARE_PAIR[b & 31];
        }
        b += 1;
    }
    rows
};

/// The rare letter pairs in the ASCII letters `bytes[from..to]` (see `RARE_PAIR` in
/// `words_table.rs`): where o200k seldom joins two letters of a word it does not know (random letter
/// strings have about one pair in three rare, a word of real text one pair in a hundred).
#[inline(always)]
pub(super) fn rare_pairs(bytes: &[u8], from: usize, to: usize) -> u64 {
    let word = bytes.get(from..to).unwrap_or(&[]);
    let Some((&first, rest)) = word.split_first() else {
        return 0;
    };
    let (mut n, mut prev) = (0u32, first);
    for &b in rest {
        // `& 31` folds case: `A`/`a` is 1, …, `Z`/`z` 26 (and is within the 32 bits).
        let row = RARE_ROW.get(usize::from(prev)).copied().unwrap_or(0);
        n += (row >> (b & 31)) & 1;
        prev = b;
    }
    u64::from(n)
}

/// Start of the hash of a Greek piece read forwards that comes after a space (see [`greek_step`]).
#[doc(hidden)]
pub const GREEK_SPACED: u64 = 0x243F_6A88_85A3_08D3;
/// Start of the hash of a Greek piece read forwards that no space comes before.
#[doc(hidden)]
pub const GREEK_BARE: u64 = 0x1319_8A2E_0370_7344;
/// Start of the hash of a Greek piece without a space, read backwards (from its last letter).
#[doc(hidden)]
pub const GREEK_BACK: u64 = 0xA409_3822_299F_31D0;

/// One Greek letter (`code`: its code point − U+0370 + 1, 1..=144) into the hash of a piece: a hash
/// of all the prefixes (or suffixes) of a word in one pass, one step a letter.
#[doc(hidden)]
#[inline(always)]
pub fn greek_step(h: u64, code: u64) -> u64 {
    (h ^ code).wrapping_mul(K1)
}

/// The word of [`GREEK_PIECE_BITS`](super::words_table) (0..1024) that a piece's hash picks, and
/// the two bits of it (a blocked Bloom filter: one load a piece).
#[doc(hidden)]
#[inline(always)]
pub fn greek_slot(h: u64) -> (usize, u64) {
    (
        (h >> 54) as usize,
        (1u64 << ((h >> 32) & 63)) | (1u64 << ((h >> 38) & 63)),
    )
}

/// Whether the Greek piece of hash `h` ([`greek_step`] from [`GREEK_SPACED`], [`GREEK_BARE`] or
/// [`GREEK_BACK`]) is an o200k token of the table: a blocked Bloom filter of the Greek words of the
/// table (1,024 words of 64 bits, two bits of one word a piece, about 4,200 set: another piece
/// passes with probability about 1 in 250).
#[inline(always)]
pub(super) fn greek_maybe(h: u64) -> bool {
    greek_bit(h) & 1 != 0
}

/// [`greek_maybe`] as bit 0 of a word whose other bits are of no meaning.
#[inline(always)]
pub(super) fn greek_bit(h: u64) -> u64 {
    // Both bits of `greek_slot(h)` set, as two shifts (the same answer).
    let w = GREEK_PIECE_BITS
        .get((h >> 54) as usize)
        .copied()
        .unwrap_or(0);
    let at = h >> 32;
    (w >> (at & 63)) & (w >> ((at >> 6) & 63))
}

/// The table's hash seed and block length (for the generator's checks).
#[doc(hidden)]
pub const WORD_TABLE: (u64, usize) = (SEED, BLOCK);

#[cfg(test)]
#[allow(clippy::indexing_slicing)]
mod tests {
    use super::*;

    #[test]
    fn the_lookups_hash_as_word_hash_does() {
        // Every length 1..=32 at every offset of a text of pseudo-random bytes, the word near the
        // text's end among them (the short words' load past the end), with a space and without.
        let mut x = 0x1234_5678_9ABC_DEF0u64;
        let text: Vec<u8> = (0..80)
            .map(|_| {
                x = x.wrapping_mul(K1).wrapping_add(K0);
                (x >> 56) as u8
            })
            .collect();
        let mut found = 0;
        for from in 0..text.len() {
            for len in 1..=MAX_WORD.min(text.len() - from) {
                let to = from + len;
                for space in [false, true] {
                    let h = word_hash(&text, from, to, space, SEED);
                    assert_eq!(known_hash(&text, from, &text[from..to], space), h);
                    assert_eq!(known(&text, from, to, space), has(h));
                    assert_eq!(known_run(&text, from, to, space), has(h));
                    if len <= 8 {
                        assert_eq!(short_hash_masked(load(&text, from), len, space), h);
                    }
                    found += usize::from(has(h));
                }
            }
        }
        // About one in 256 passes the filter by chance: the comparison is not all misses.
        assert!(found > 0);
        assert!(!known(&text, 3, 3, true));
        assert!(!known(&text, 0, MAX_WORD + 1, true));
        assert!(!known(&text, 70, 81, true));
        for (from, to) in [(3, 3), (0, MAX_WORD + 1), (70, 81), (5, 4)] {
            assert!(!known_run(&text, from, to, true));
        }
    }
}
