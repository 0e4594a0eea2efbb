//! Byte-level pieces every text counter shares ([`super::text`]'s driver and the ASCII, Latin, other
//! script and whole-word counters): the feature counters of a text and how to bump them, the word-length
//! features, ASCII byte classes, and the SWAR masks and runs over ASCII letters. A leaf: it imports
//! only the character classes and the feature indices.

use super::classes::{classify, decode, Cls};
use super::weights::{feature, NUM_FEATURES};

/// Feature counters of one text: the [`NUM_FEATURES`] features.
pub(super) type Counts = [u64; NUM_FEATURES];

#[inline(always)]
pub(super) fn bump(f: &mut Counts, idx: usize, n: u64) {
    if let Some(slot) = f.get_mut(idx) {
        // Every feature grows by at most the number of bytes it consumed (≤ isize::MAX in total for
        // one `&str`), so the counts cannot wrap.
        *slot = slot.wrapping_add(n);
    }
}

/// Feature of a plain ASCII word by its length (index: length, capped at 11 = "11 or more").
pub(super) const WORD_FEATURE: [usize; 12] = [
    feature::WORD_1, // not used: a word has at least one letter
    feature::WORD_1,
    feature::WORD_1 + 1,
    feature::WORD_1 + 2,
    feature::WORD_1 + 3,
    feature::WORD_1 + 4,
    feature::WORD_1 + 5,
    feature::WORD_1 + 6,
    feature::WORD_1 + 7,
    feature::WORD_9_10,
    feature::WORD_9_10,
    feature::WORD_LONG,
];

/// Counts one word of `len` letters (the word-length features).
#[inline(always)]
pub(super) fn count_word(f: &mut Counts, len: usize) {
    if len >= 11 {
        bump(f, feature::WORD_LONG_CHARS, len as u64);
        if len as u64 > EXCESS_FROM {
            // A mark for `derive`, which counts the letters.
            bump(f, feature::WORD_EXCESS_LETTERS, 1);
        }
    }
    bump(
        f,
        WORD_FEATURE
            .get(len.min(11))
            .copied()
            .unwrap_or(feature::WORD_LONG),
        1,
    );
}

/// Number of bytes from `i` on that satisfy `pred` (a tight loop without bounds checks).
#[inline(always)]
pub(super) fn count_while(bytes: &[u8], i: usize, pred: impl Fn(u8) -> bool) -> usize {
    let mut n = 0;
    // `i + n` ≤ `bytes.len()` throughout, so the sum cannot overflow.
    while let Some(&b) = bytes.get(i + n) {
        if !pred(b) {
            break;
        }
        n += 1;
    }
    n
}

/// High bit set in each byte of `w` that is not an ASCII lower-case letter (SWAR, no branches).
#[inline(always)]
pub(super) fn not_lower_mask(w: u64) -> u64 {
    const HI: u64 = 0x8080_8080_8080_8080;
    // Clearing the high bits first means the additions below never carry from one byte into the next.
    let x = w & !HI;
    let at_least_a = x.wrapping_add(0x1F1F_1F1F_1F1F_1F1F); // high bit set iff byte >= b'a'
    let past_z = x.wrapping_add(0x0505_0505_0505_0505); // high bit set iff byte >= b'z' + 1
    let lower = at_least_a & !past_z & !w & HI;
    !lower & HI
}

/// High bit set in each byte of `w` that is an ASCII letter, either case (SWAR).
#[inline(always)]
pub(super) fn letter_mask(w: u64) -> u64 {
    // Setting the case bit makes every capital lower-case (and no other byte a letter).
    !not_lower_mask(w | 0x2020_2020_2020_2020) & 0x8080_8080_8080_8080
}

/// Length of the run of ASCII lower-case letters at `i`, eight bytes at a time.
#[inline(always)]
pub(super) fn lower_run(bytes: &[u8], i: usize) -> usize {
    let mut n = 0usize;
    // `i + n` ≤ `bytes.len()` throughout, so the sums cannot overflow.
    while let Some(chunk) = bytes.get(i + n..i + n + 8) {
        let w = u64::from_le_bytes(<[u8; 8]>::try_from(chunk).unwrap_or([0; 8]));
        let m = not_lower_mask(w);
        if m != 0 {
            // Little-endian: the lowest set bit marks the first byte that is not a letter.
            return n + (m.trailing_zeros() / 8) as usize;
        }
        n += 8;
    }
    n + count_while(bytes, i + n, |b| b.is_ascii_lowercase())
}

/// Byte classes for the ASCII dispatch of [`count_features`] (one bit each, from [`BYTE_CLASS`]).
pub(super) const B_LOWER: u8 = 1;

pub(super) const B_UPPER: u8 = 2;

pub(super) const B_DIGIT: u8 = 4;

/// Space or tab.
pub(super) const B_SPACE: u8 = 8;

/// `\n` or `\r`.
pub(super) const B_NEWLINE: u8 = 16;

/// ASCII punctuation.
pub(super) const B_PUNCT: u8 = 32;

/// Any other ASCII control character (and DEL).
pub(super) const B_CONTROL: u8 = 64;

/// A byte of a non-ASCII character.
pub(super) const B_HIGH: u8 = 128;

pub(super) static BYTE_CLASS: [u8; 256] = {
    let mut t = [B_HIGH; 256];
    let mut b = 0;
    while b < 0x80 {
        let c = b as u8;
        let class = if c.is_ascii_lowercase() {
            B_LOWER
        } else if c.is_ascii_uppercase() {
            B_UPPER
        } else if c.is_ascii_digit() {
            B_DIGIT
        } else if c == b' ' || c == b'\t' {
            B_SPACE
        } else if c == b'\n' || c == b'\r' {
            B_NEWLINE
        } else if c.is_ascii_punctuation() {
            B_PUNCT
        } else {
            B_CONTROL
        };
        #[allow(clippy::indexing_slicing)] // compile time: out of range fails the build
        {
            t[b] = class;
        }
        b += 1;
    }
    t
};

#[inline(always)]
pub(super) fn byte_class(b: u8) -> u8 {
    // A `u8` index into 256 entries: always in range.
    BYTE_CLASS.get(usize::from(b)).copied().unwrap_or(B_HIGH)
}

/// Whether the character before `i` is punctuation or a symbol (ASCII or not): line breaks right
/// after one belong to its piece in o200k's pre-tokenizer (`[^\s\p{L}\p{N}]+[\r\n/]*`).
#[inline(always)]
pub(super) fn punct_before(bytes: &[u8], i: usize) -> bool {
    match bytes.get(i.wrapping_sub(1)) {
        Some(&b) if b < 0x80 => byte_class(b) & B_PUNCT != 0,
        Some(_) => wide_punct_before(bytes, i),
        None => false,
    }
}

/// [`punct_before`] of a character of two to four bytes ending at `i` (text before `i` is valid
/// UTF-8: the one character that ends there starts at the first byte before `i` that is not a
/// continuation byte).
#[inline(never)]
fn wide_punct_before(bytes: &[u8], i: usize) -> bool {
    let cont = |k: usize| {
        i.checked_sub(k)
            .and_then(|at| bytes.get(at))
            .is_some_and(|&b| b & 0xC0 == 0x80)
    };
    // The byte at `i - 1` is not ASCII; a character of `len` bytes has `len - 1` continuation bytes.
    let len = if !cont(2) {
        2
    } else if !cont(3) {
        3
    } else {
        4
    };
    i.checked_sub(len)
        .and_then(|start| decode(bytes, start))
        .is_some_and(|(cp, n)| {
            n == len
                && matches!(
                    classify(cp),
                    Cls::Punct | Cls::WidePunct | Cls::Symbol | Cls::Emoji | Cls::Other
                )
        })
}

/// Letters of an ASCII word from which each costs [`feature::WORD_EXCESS_LETTERS`].
pub(super) const EXCESS_FROM: u64 = 20;
